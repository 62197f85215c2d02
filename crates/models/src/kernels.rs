//! The compute blocks of the forward pass: matrix products over stored (quantized)
//! weights, RMSNorm, RoPE, activations and softmax.
//!
//! Every output element is produced by one fixed sequence of operations that does not
//! depend on how many rows share the call or on the thread count, so a row's result is the
//! same whether it is computed in a prefill chunk or as a single decode step.

use frink_gguf::GgmlType;
use rayon::prelude::*;

use crate::error::Result;

/// A weight matrix as stored in the file: `rows` output features × `cols` input features,
/// each row `row_bytes` bytes of `ty` blocks (GGUF shape `[cols, rows]`, ne0 first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Index of the tensor in the file's tensor table.
    pub tensor: usize,
}

/// Dot product of two equal-length f32 slices in a fixed order: 8 interleaved partial
/// sums (lane `l` takes elements `l, l+8, …`), combined pairwise, then the tail.
/// The compiler vectorises the lanes; the order never depends on the caller.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n8 = a.len() / 8 * 8;
    let mut acc = [0f32; 8];
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Weight rows handled by one task of [`matmul`]: enough to amortise scheduling, few
/// enough to split a 576-row matrix over 2 threads.
const ROWS_PER_TASK: usize = 16;

/// `out[i][j] = Σ_c x[i][c] · W[j][c]`: `x` is `n × w.cols`, `out` is `n × w.rows`, both
/// row-major; `wdata` is the matrix's stored bytes.
///
/// Formats with an integer dot kernel (frink-quant `dot`: Q4_0..Q8_0, Q2_K..Q6_K) quantize
/// each input row once to the kernel's activation type (Q8_0 or Q8_K, as ggml pairs them)
/// and dot it with the stored blocks; the other formats (F32, F16, BF16, IQ*) dequantize
/// each weight row once per call (bit-exact with ggml) and use an f32 [`dot`]. Either way
/// each weight row is read once per call, so prefill reads each weight once per chunk,
/// and an output element depends only on its weight row and its input row: the same bits
/// whatever `n` is and however the work is split over the current rayon pool.
///
/// Errors: the weight type has no dequantization ([`frink_quant::QuantError`]).
pub fn matmul(w: &Matrix, wdata: &[u8], x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
    assert_eq!(x.len(), n * w.cols, "matmul input shape");
    assert_eq!(out.len(), n * w.rows, "matmul output shape");
    assert_eq!(wdata.len(), w.rows * w.row_bytes, "matmul weight bytes");
    // Results land transposed (weight row major) so each task owns a contiguous slice.
    let mut out_t = vec![0f32; n * w.rows];
    let kernel = if frink_quant::dot::has_dot(w.ty) {
        frink_quant::dot::best_kernel(w.ty).ok()
    } else {
        None
    };
    if let Some(k) = kernel {
        let act = k.act_type();
        let ab = act
            .row_bytes(w.cols as u64)
            .ok_or_else(|| crate::ModelError::Tensor {
                name: format!("tensor #{}", w.tensor),
                detail: format!("{} columns are not whole {act} blocks", w.cols),
            })? as usize;
        let mut acts = vec![0u8; n * ab];
        for (xi, ai) in x.chunks_exact(w.cols).zip(acts.chunks_exact_mut(ab)) {
            frink_quant::dot::quantize_activation(act, xi, ai).map_err(|e| {
                crate::ModelError::Unsupported(format!("activation quantization: {e}"))
            })?;
        }
        out_t
            .par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each_init(Vec::new, |tile, (task, chunk)| {
                let j0 = task * ROWS_PER_TASK;
                let n_w = chunk.len() / n;
                if n == 1 {
                    for (jj, dst) in chunk.chunks_mut(1).enumerate() {
                        let j = j0 + jj;
                        k.dot_rows(&wdata[j * w.row_bytes..(j + 1) * w.row_bytes], &acts, dst);
                    }
                    return;
                }
                // A tile of n_w weight rows × n input rows; every element has the bits of
                // the single dot (frink-quant's DotKernel::dot_tile contract).
                tile.resize(n * n_w, 0f32);
                let ws = &wdata[j0 * w.row_bytes..(j0 + n_w) * w.row_bytes];
                k.dot_tile(ws, n_w, &acts, n, tile);
                for (jj, dst) in chunk.chunks_mut(n).enumerate() {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = tile[i * n_w + jj];
                    }
                }
            });
    } else {
        out_t
            .par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .try_for_each_init(
                || vec![0f32; w.cols],
                |row, (task, chunk)| -> Result<()> {
                    let j0 = task * ROWS_PER_TASK;
                    for (jj, dst) in chunk.chunks_mut(n).enumerate() {
                        let j = j0 + jj;
                        let bytes = &wdata[j * w.row_bytes..(j + 1) * w.row_bytes];
                        frink_quant::dequantize(w.ty, bytes, row)?;
                        for (i, d) in dst.iter_mut().enumerate() {
                            *d = dot(&x[i * w.cols..(i + 1) * w.cols], row);
                        }
                    }
                    Ok(())
                },
            )?;
    }
    if n == 1 {
        out.copy_from_slice(&out_t);
    } else {
        for j in 0..w.rows {
            for i in 0..n {
                out[i * w.rows + j] = out_t[j * n + i];
            }
        }
    }
    Ok(())
}

/// Row `r` of a stored matrix dequantized into `out` (`w.cols` values): embedding lookup.
pub fn matrix_row(w: &Matrix, wdata: &[u8], r: usize, out: &mut [f32]) -> Result<()> {
    frink_quant::dequantize(w.ty, &wdata[r * w.row_bytes..(r + 1) * w.row_bytes], out)?;
    Ok(())
}

/// RMSNorm of each `dim`-sized row of `x` in place, times `weight`:
/// `x · w / sqrt(mean(x²) + eps)`, the sum of squares accumulated in f64 as ggml does
/// (`ggml_compute_forward_rms_norm_f32`).
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for row in x.chunks_exact_mut(dim) {
        let sum: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = (*v * scale) * w;
        }
    }
}

/// Adds `bias` to each `bias.len()`-sized row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Rotary position embedding of one head vector in place (llama.cpp
/// `ggml_compute_forward_rope_f32` without YaRN): the first `n_rot` dimensions are rotated
/// in pairs by `θ_i = freq_scale · pos · base^(-2i/n_rot)`, the angle built by repeated
/// multiplication in f32 as ggml does. `neox` pairs `(i, i + n_rot/2)`, otherwise
/// `(2i, 2i+1)`.
pub fn rope(
    head: &mut [f32],
    pos: usize,
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    neox: bool,
) {
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    let half = n_rot / 2;
    for i in 0..half {
        let angle = freq_scale * theta;
        let (sin, cos) = angle.sin_cos();
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
        theta *= theta_scale;
    }
}

/// SiLU: `x / (1 + e^-x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (transformers
/// `gelu_pytorch_tanh`; ggml evaluates the same formula through an fp16 table).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// Softmax of `x` in place: max subtracted, exponentials summed in f64.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
