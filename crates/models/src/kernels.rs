//! The compute blocks of the forward pass: matrix products over stored (quantized)
//! weights, RMSNorm, RoPE, activations and softmax.
//!
//! Every output element is produced by one fixed sequence of operations that does not
//! depend on how many rows share the call or on the thread count, so a row's result is the
//! same whether it is computed in a prefill chunk or as a single decode step.

mod attn;
pub(crate) mod gemm;
mod kv_rows;
mod math;

pub use attn::{
    dot_multi_keys, dot_multi_keys_portable, softmax_with_sink, softmax_with_sink_portable,
    weighted_sum_multi, weighted_sum_multi_portable,
};
pub use kv_rows::{KvData, KvRows};
pub use math::{
    fast_exp, gelu_erf_fast, gelu_erf_in_place, gelu_erf_in_place_portable, hadamard_rotate, silu,
    silu_in_place, silu_in_place_portable, ssm_step, ssm_step_portable, Decay,
};

use crate::error::Result;
use crate::pool::Disjoint;
use frink_gguf::GgmlType;

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
    /// Byte offset of the matrix in the tensor's data (nonzero for one expert of a
    /// stacked experts tensor).
    pub offset: usize,
}

impl Matrix {
    /// Its place in its tensor: the offset in whole matrices of its size (expert `e` of a
    /// stacked experts tensor is at place `e`; a whole tensor at 0).
    pub fn place(&self) -> usize {
        self.offset / (self.rows * self.row_bytes).max(1)
    }
}

/// Dot product of two equal-length f32 slices in a fixed order: 8 interleaved partial
/// sums (lane `l` takes elements `l, l+8, …`, each a product then a sum, never fused),
/// combined pairwise, then the tail. On x86-64 with AVX2 the same operations run on one
/// 256-bit register instead of two 128-bit ones: the same bits ([`dot_portable`] is the
/// twin the tests compare with).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above); the function only needs it.
        #[allow(unsafe_code)]
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_rows_avx2(a, [b])[0]
}

/// [`dot`] compiled for the baseline ISA.
#[inline(always)]
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    dot_rows_portable(a, [b])[0]
}

/// [`dot`] of `x` with each of `R` rows at once: each result has [`dot`]'s bits (the same
/// lanes, products, sums and tail per row); the rows' independent add chains run side by
/// side, where one row's chain of `len / 8` dependent adds left the core mostly waiting
/// (OLMoE's f32 routers: 64 rows of 2048).
#[inline]
pub fn dot_rows<const R: usize>(x: &[f32], rows: [&[f32]; R]) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above); the function only needs it.
        #[allow(unsafe_code)]
        return unsafe { dot_rows_avx2(x, rows) };
    }
    dot_rows_portable(x, rows)
}

/// [`dot_rows`] with AVX2: one 256-bit accumulator per row (lane `l` takes elements
/// `l, l+8, …`, a multiply then an add), the lanes combined in `dot`'s tree, then the
/// tail.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_rows_avx2<const R: usize>(x: &[f32], rows: [&[f32]; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    for row in &rows {
        assert!(row.len() >= x.len(), "dot_rows: a row shorter than x");
    }
    let n8 = x.len() / 8 * 8;
    let mut acc = [_mm256_setzero_ps(); R];
    for c in (0..n8).step_by(8) {
        // SAFETY: c + 8 <= n8 <= x.len() <= every row's length (asserted above).
        #[allow(unsafe_code)]
        unsafe {
            let xc = _mm256_loadu_ps(x.as_ptr().add(c));
            for (a, row) in acc.iter_mut().zip(&rows) {
                let wc = _mm256_loadu_ps(row.as_ptr().add(c));
                *a = _mm256_add_ps(*a, _mm256_mul_ps(xc, wc));
            }
        }
    }
    std::array::from_fn(|r| {
        let mut s = sum_lanes_avx2(acc[r]);
        for i in n8..x.len() {
            s += x[i] * rows[r][i];
        }
        s
    })
}

/// The eight lanes of `v` summed in [`dot`]'s tree, `((l0 + l4) + (l1 + l5)) + ((l2 + l6)
/// + (l3 + l7))`: the one combination of every AVX2 kernel that keeps [`dot`]'s lanes
/// ([`dot_rows`], the attention scores, softmax's sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn sum_lanes_avx2(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    // [l0+l4, l1+l5, l2+l6, l3+l7], then (s0+s1) + (s2+s3).
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_hadd_ps(s4, s4);
    _mm_cvtss_f32(h) + _mm_cvtss_f32(_mm_movehdup_ps(h))
}

/// [`dot_rows`] compiled for the baseline ISA.
#[inline(always)]
pub fn dot_rows_portable<const R: usize>(x: &[f32], rows: [&[f32]; R]) -> [f32; R] {
    let n8 = x.len() / 8 * 8;
    let mut acc = [[0f32; 8]; R];
    for (c, cx) in x[..n8].chunks_exact(8).enumerate() {
        for (a, row) in acc.iter_mut().zip(&rows) {
            let cw = &row[c * 8..c * 8 + 8];
            for l in 0..8 {
                a[l] += cx[l] * cw[l];
            }
        }
    }
    std::array::from_fn(|r| {
        let a = &acc[r];
        let mut s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        for i in n8..x.len() {
            s += x[i] * rows[r][i];
        }
        s
    })
}

/// [`dot_rows`] for two inputs at once: `[dot_rows(x0, rows), dot_rows(x1, rows)]`, with
/// their bits; each weight load serves both inputs (a block of 2 × `R` accumulators), for
/// the float matrix path of a batch ([`matmul_many`]).
#[inline]
pub fn dot_rows2<const R: usize>(x: [&[f32]; 2], rows: [&[f32]; R]) -> [[f32; R]; 2] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above); the function only needs it.
        #[allow(unsafe_code)]
        return unsafe { dot_rows2_avx2(x, rows) };
    }
    [dot_rows_portable(x[0], rows), dot_rows_portable(x[1], rows)]
}

/// [`dot_rows2`] with AVX2: each (input, row) pair's accumulator is [`dot_rows_avx2`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_rows2_avx2<const R: usize>(x: [&[f32]; 2], rows: [&[f32]; R]) -> [[f32; R]; 2] {
    use std::arch::x86_64::*;
    assert_eq!(x[0].len(), x[1].len(), "dot_rows2: inputs of one length");
    for row in &rows {
        assert!(row.len() >= x[0].len(), "dot_rows2: a row shorter than x");
    }
    let len = x[0].len();
    let n8 = len / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); R]; 2];
    for c in (0..n8).step_by(8) {
        // SAFETY: c + 8 <= n8 <= both inputs' length <= every row's length (asserted
        // above).
        #[allow(unsafe_code)]
        unsafe {
            let x0 = _mm256_loadu_ps(x[0].as_ptr().add(c));
            let x1 = _mm256_loadu_ps(x[1].as_ptr().add(c));
            for r in 0..R {
                let wc = _mm256_loadu_ps(rows[r].as_ptr().add(c));
                acc[0][r] = _mm256_add_ps(acc[0][r], _mm256_mul_ps(x0, wc));
                acc[1][r] = _mm256_add_ps(acc[1][r], _mm256_mul_ps(x1, wc));
            }
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|r| {
            let mut s = sum_lanes_avx2(acc[i][r]);
            for k in n8..len {
                s += x[i][k] * rows[r][k];
            }
            s
        })
    })
}

/// `y[i] += a · x[i]` (a product then a sum per element, never fused); AVX2 where
/// available, the same bits as [`axpy_portable`].
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above); the function only needs it.
        #[allow(unsafe_code)]
        return unsafe { axpy_avx2(y, a, x) };
    }
    axpy_portable(y, a, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
    axpy_portable(y, a, x)
}

/// [`axpy`] compiled for the baseline ISA.
#[inline(always)]
pub fn axpy_portable(y: &mut [f32], a: f32, x: &[f32]) {
    for (v, b) in y.iter_mut().zip(x) {
        *v += a * b;
    }
}

/// Weight rows of the next task of a decode step (up to [`SMALL_BATCH`] input rows) when
/// `left` rows of the step's projections have no task yet, on `threads` threads, in
/// multiples of `unit`: guided self-scheduling. Tasks are claimed in order, so the first
/// ones are long contiguous runs of weight rows (which stream from memory much faster:
/// measured qwen2.5-0.5b tg 31 t/s with 32-row tasks, 42 with 512-row tasks, 2 threads)
/// and the last ones short, so that the threads finish a step together (with equal
/// quarters per thread, up to a quarter of a thread's share was left to one thread: 7% of
/// a Qwen2.5-1.5B decode step was spent waiting, perf, AMD Zen 5).
fn decode_task_rows(left: usize, threads: usize, unit: usize) -> usize {
    left.div_ceil(DECODE_SHARE * threads)
        .next_multiple_of(unit)
        .max(DECODE_MIN_ROWS.next_multiple_of(unit))
}

/// A decode task takes this fraction (`1 / DECODE_SHARE`) of one thread's share of the
/// rows still without a task.
const DECODE_SHARE: usize = 2;

/// The fewest weight rows of a decode task (the last of a step).
const DECODE_MIN_ROWS: usize = 32;

/// Weight rows per task (one tile) when several input rows share the call: the tile's
/// weights stay in L1/L2 while every input row passes over them, and the tile kernel's
/// per-call preparation of the input rows is shared by more weight rows. Measured pp512
/// t/s (qwen2.5-0.5b / gemma3-270m / smollm2-135m, 2 threads): 16 rows 324 / 933 / 616,
/// 32 rows 396 / 1029 / 782, 64 rows 420 / 1064 / 822, 128 rows 417 / 1066 / 826.
const ROWS_PER_TASK_BATCH: usize = 64;

/// Input rows up to which [`matmul_many`] treats a call as a decode step (of one or of
/// several sequences): a few long contiguous runs of weight rows per thread, which stream
/// from memory much faster than many short tiles (measured, 8 sequences: smollm2 10.96 ->
/// 10.13 ms per step, qwen2.5-0.5b 34.4 -> 29.7 ms; 2 sequences: qwen2.5 19.5 -> 13.9 ms;
/// from 16 to 32 rows smollm2 gained 4-5%, gemma3 and qwen2.5 lost up to 2.5%).
const SMALL_BATCH: usize = 8;

/// Input rows quantized per task of [`matmul_many`]'s activation quantization (at most;
/// fewer rows are split evenly over the threads).
const ROWS_PER_QUANTIZE_TASK: usize = 16;

/// A matrix's weights as the kernels read them: its stored bytes (in the file's mapping,
/// or an expert cache), or the copy repacked at load in eight-row groups
/// ([`frink_quant::dot::pack`], [`crate::Model::set_repack`]). Both give every output
/// element the same bits.
#[derive(Clone, Copy, Debug)]
pub enum WeightData<'a> {
    /// `rows × row_bytes` bytes as stored.
    Stored(&'a [u8]),
    /// The packed copy.
    Packed(&'a frink_quant::dot::pack::Packed),
    /// Float weights as `rows × cols` f32 values (F32 read in place, F16 and BF16 widened
    /// once at load), multiplied by the blocked product of [`gemm::gemm_nt`] (each
    /// element's products summed in order): an encoder's, whose inputs are always
    /// evaluated whole, so its elements need not have a decoder row's dot bits; they are
    /// the same whatever the batch.
    Gemm(&'a [f32]),
}

/// One projection of [`matmul_many`]: `out = x · Wᵀ` for the matrix `w` whose weights
/// are `data`; `out` is `n × w.rows`, row-major.
pub struct Projection<'a> {
    pub w: &'a Matrix,
    pub data: WeightData<'a>,
    pub out: &'a mut [f32],
}

/// `out[i][j] = Σ_c x[i][c] · W[j][c]`: `x` is `n × w.cols`, `out` is `n × w.rows`, both
/// row-major; `wdata` is the matrix's weights. See [`matmul_many`].
///
/// Errors: as [`matmul_many`].
pub fn matmul(
    w: &Matrix,
    wdata: WeightData<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    matmul_many(
        &mut [Projection {
            w,
            data: wdata,
            out,
        }],
        x,
        n,
    )
}

/// Several matrix products of the same input `x` (`n × cols`, row-major) in one parallel
/// step: the Q/K/V projections, or gate and up. Each input row is quantized once per
/// activation type and shared by every projection that reads it.
///
/// Formats with an integer dot kernel (frink-quant `dot`: Q4_0..Q8_0, Q2_K..Q6_K) quantize
/// each input row once to the kernel's activation type (Q8_0 or Q8_K, as ggml pairs them)
/// and take tiles of weight rows × all input rows ([`frink_quant::dot::DotKernel::dot_tile`]);
/// the other formats (F32, F16, BF16, IQ*) dequantize each weight row once per call
/// (bit-exact with ggml) and use an f32 [`dot`]. Either way each weight row is read once
/// per call, so prefill reads each weight once per chunk, and an output element depends
/// only on its weight row and its input row: the same bits whatever `n` is and however
/// the tasks are spread over the compute threads ([`crate::pool`]).
///
/// Errors: the weight type has no dequantization ([`frink_quant::QuantError`]), or its
/// columns are not whole activation blocks.
pub fn matmul_many<'a>(projs: &mut [Projection<'a>], x: &[f32], n: usize) -> Result<()> {
    matmul_inputs(projs, &[x], n)
}

/// [`matmul_many`] with one input of its own per projection (`xs[i]`, `n` rows of
/// projection `i`'s columns): the experts of a decode step, each on its own hidden row,
/// in one parallel step instead of one per expert. Each output element has the bits
/// [`matmul_many`] gives it alone.
///
/// Errors: as [`matmul_many`].
pub fn matmul_each<'a>(projs: &mut [Projection<'a>], xs: &[&[f32]], n: usize) -> Result<()> {
    assert_eq!(
        xs.len(),
        projs.len(),
        "matmul_each: one input per projection"
    );
    matmul_inputs(projs, xs, n)
}

/// One input's rows quantized for one activation type: (input index, type, bytes per row,
/// the rows).
type QuantizedInput = (usize, frink_gguf::GgmlType, usize, Vec<u8>);

/// Each kernel's input for [`matmul_inputs`]: the input rows quantized once per input and
/// activation type (and, for a prefill, prepared once for the tile kernels that want it),
/// and per projection its kernel and the index of its quantized input (`None`: no integer
/// kernel, the rows are read as floats).
///
/// Errors: columns that are not whole activation blocks, a failed quantization.
#[allow(clippy::type_complexity)]
fn quantize_inputs(
    projs: &[Projection<'_>],
    xs: &[&[f32]],
    n: usize,
) -> Result<(
    Vec<QuantizedInput>,
    Vec<frink_quant::dot::ActPrep>,
    Vec<Option<(frink_quant::dot::DotKernel, usize)>>,
)> {
    use frink_quant::dot::{best_kernel, has_dot, quantize_activation, DotKernel};
    let shared = xs.len() == 1;
    let input = |pi: usize| if shared { 0 } else { pi };
    let mut acts: Vec<QuantizedInput> = Vec::new();
    let mut preps: Vec<frink_quant::dot::ActPrep> = Vec::new();
    let mut kernels: Vec<Option<(DotKernel, usize)>> = Vec::with_capacity(projs.len());
    for (pi, p) in projs.iter().enumerate() {
        let (xi, x, cols) = (input(pi), xs[input(pi)], p.w.cols);
        let k = if has_dot(p.w.ty) || matches!(p.data, WeightData::Packed(_)) {
            best_kernel(p.w.ty).ok()
        } else {
            None
        };
        let Some(k) = k else {
            kernels.push(None);
            continue;
        };
        let act = k.act_type();
        let slot = match acts.iter().position(|a| a.0 == xi && a.1 == act) {
            Some(i) => i,
            None => {
                let ab = act
                    .row_bytes(cols as u64)
                    .ok_or_else(|| crate::ModelError::Tensor {
                        name: format!("tensor #{}", p.w.tensor),
                        detail: format!("{cols} columns are not whole {act} blocks"),
                    })? as usize;
                let mut q = vec![0u8; n * ab];
                let failed = std::sync::Mutex::new(None);
                let quantize = |rows: &[f32], part: &mut [u8]| {
                    for (xr, ar) in rows.chunks_exact(cols).zip(part.chunks_exact_mut(ab)) {
                        if let Err(e) = quantize_activation(act, xr, ar) {
                            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        }
                    }
                };
                if shared {
                    // A decode step's few rows are spread over the threads too.
                    let per = n
                        .div_ceil(crate::pool::threads())
                        .clamp(1, ROWS_PER_QUANTIZE_TASK);
                    crate::pool::for_each_chunk(&mut q, per * ab, &|i, part| {
                        quantize(&x[i * per * cols..], part)
                    });
                } else {
                    // One input per projection (a decode step's experts): on this thread,
                    // no dispatch per input.
                    quantize(x, &mut q);
                }
                if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    return Err(crate::ModelError::Unsupported(format!(
                        "activation quantization: {e}"
                    )));
                }
                acts.push((xi, act, ab, q));
                preps.push(frink_quant::dot::ActPrep::default());
                acts.len() - 1
            }
        };
        // Packed groups read the same prepared rows (`Packed::dot_groups`).
        if n > SMALL_BATCH && k.wants_prep() && preps[slot].is_empty() {
            preps[slot] = k.prepare(&acts[slot].3, n);
        }
        kernels.push(Some((k, slot)));
    }
    Ok((acts, preps, kernels))
}

/// The tasks of [`matmul_inputs`]: (projection, first weight row, rows), in projection
/// order; a decode step's in guided sizes ([`decode_task_rows`]) over all its
/// projections, a batch's in [`ROWS_PER_TASK_BATCH`] rows.
fn matmul_tasks(projs: &[Projection<'_>], n: usize) -> Vec<(usize, usize, usize)> {
    let threads = crate::pool::threads();
    let small = n <= SMALL_BATCH;
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    // Decode steps: guided sizes (see `decode_task_rows`); the rows not yet given to a task,
    // over all projections of the call.
    let mut left: usize = projs.iter().map(|p| p.w.rows).sum();
    for (pi, p) in projs.iter().enumerate() {
        let rows = p.w.rows;
        // The small-batch kernels take weight rows in pairs; packed matrices whole groups
        // of eight.
        let unit = match p.data {
            WeightData::Packed(_) => frink_quant::dot::pack::GROUP,
            WeightData::Stored(_) | WeightData::Gemm(_) => 2,
        };
        let mut j0 = 0;
        while j0 < rows {
            let per = if small {
                decode_task_rows(left, threads, unit)
            } else {
                ROWS_PER_TASK_BATCH
            }
            .min(rows - j0);
            tasks.push((pi, j0, per));
            j0 += per;
            left -= per;
        }
    }
    tasks
}

/// The body of [`matmul_many`] (`xs` = one shared input) and [`matmul_each`] (one per
/// projection).
fn matmul_inputs<'a>(projs: &mut [Projection<'a>], xs: &[&[f32]], n: usize) -> Result<()> {
    let Some(cols) = projs.first().map(|p| p.w.cols) else {
        return Ok(());
    };
    let shared = xs.len() == 1;
    let input = |pi: usize| if shared { 0 } else { pi };
    for (pi, p) in projs.iter().enumerate() {
        assert_eq!(xs[input(pi)].len(), n * p.w.cols, "matmul input shape");
        if shared {
            assert_eq!(p.w.cols, cols, "matmul_many: projections of one input");
        }
        assert_eq!(p.out.len(), n * p.w.rows, "matmul output shape");
        match p.data {
            WeightData::Stored(d) => {
                assert_eq!(d.len(), p.w.rows * p.w.row_bytes, "matmul weight bytes")
            }
            WeightData::Gemm(f) => assert_eq!(f.len(), p.w.rows * p.w.cols, "matmul weights"),
            WeightData::Packed(pk) => assert_eq!(
                (pk.ty(), pk.rows(), pk.cols()),
                (p.w.ty, p.w.rows, p.w.cols),
                "matmul packed weights"
            ),
        }
    }
    if n == 0 {
        return Ok(());
    }
    for (pi, p) in projs.iter().enumerate() {
        crate::imatrix::observe(p.w, xs[input(pi)], n);
    }
    if projs.iter().any(|p| matches!(p.data, WeightData::Gemm(_))) {
        return matmul_gemm_first(projs, xs, n);
    }
    let (acts, preps, kernels) = quantize_inputs(projs, xs, n)?;
    let tasks = matmul_tasks(projs, n);
    let mats: Vec<(&'a Matrix, WeightData<'a>)> = projs.iter().map(|p| (p.w, p.data)).collect();
    let outs: Vec<Disjoint<'_, f32>> = projs
        .iter_mut()
        .map(|p| Disjoint::new(&mut *p.out))
        .collect();
    let failed = std::sync::Mutex::new(None);
    crate::pool::run(tasks.len(), &|t| {
        let (pi, j0, n_w) = tasks[t];
        let (w, data) = mats[pi];
        let (rows, rb) = (w.rows, w.row_bytes);
        let data = match data {
            WeightData::Stored(d) => d,
            // (Taken by `matmul_gemm_first` before any task runs.)
            WeightData::Gemm(_) => return,
            WeightData::Packed(pk) => {
                let (slot, g) = (
                    kernels[pi].map_or(0, |k| k.1),
                    frink_quant::dot::pack::GROUP,
                );
                pk.dot_groups(
                    j0 / g,
                    n_w.div_ceil(g),
                    &acts[slot].3,
                    n,
                    &preps[slot],
                    &mut |i, c, src| {
                        // SAFETY: task (pi, j0) alone writes columns j0..j0+n_w of
                        // projection pi's output (`c + src.len() <= n_w`); tasks have
                        // distinct (pi, j0).
                        #[allow(unsafe_code)]
                        let dst = unsafe { outs[pi].range(i * rows + j0 + c, src.len()) };
                        dst.copy_from_slice(src);
                    },
                );
                return;
            }
        };
        let ws = &data[j0 * rb..(j0 + n_w) * rb];
        SCRATCH.with_borrow_mut(|buf| {
            match kernels[pi] {
                Some((k, slot)) if n == 1 => {
                    // SAFETY: task (pi, j0) alone writes columns j0..j0+n_w of projection
                    // pi's output; tasks have distinct (pi, j0).
                    #[allow(unsafe_code)]
                    let dst = unsafe { outs[pi].range(j0, n_w) };
                    k.dot_tile(ws, n_w, &acts[slot].3, 1, dst);
                }
                Some((k, slot)) => {
                    k.dot_tile_prepared(
                        ws,
                        n_w,
                        &acts[slot].3,
                        n,
                        &preps[slot],
                        &mut |i, c, src| {
                            // SAFETY: as above, row i's columns j0..j0+n_w belong to this task
                            // (c + src.len() <= n_w).
                            #[allow(unsafe_code)]
                            let dst = unsafe { outs[pi].range(i * rows + j0 + c, src.len()) };
                            dst.copy_from_slice(src);
                        },
                    );
                }
                None => {
                    let cols = w.cols;
                    let x = xs[input(pi)];
                    let write = |i: usize, j: usize, vals: &[f32]| {
                        // SAFETY: task (pi, j0) alone writes columns j0..j0+n_w of
                        // projection pi's output (`j + vals.len() <= n_w`); tasks have
                        // distinct (pi, j0).
                        #[allow(unsafe_code)]
                        let dst = unsafe { outs[pi].range(i * rows + j0 + j, vals.len()) };
                        dst.copy_from_slice(vals);
                    };
                    // f32 weights (MoE routers, every matrix of an all-f32 model) are
                    // read in place: the copy into `buf` was most of their time (OLMoE's
                    // routers).
                    if let Some(wf) = f32_in_place(w.ty, ws) {
                        rows_times_inputs(wf, x, cols, 0, &write);
                        return;
                    }
                    // Other formats: DEQUANT_ROWS weight rows widened at a time, then every
                    // input row against them, so the inputs are read once per block of
                    // weight rows rather than once per weight row.
                    for (b, block) in ws.chunks(DEQUANT_ROWS * rb).enumerate() {
                        let nb = block.len() / rb;
                        buf.resize(nb * cols, 0.0);
                        for (wrow, out) in block.chunks_exact(rb).zip(buf.chunks_exact_mut(cols)) {
                            if let Err(e) = frink_quant::dequantize(w.ty, wrow, out) {
                                *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                                return;
                            }
                        }
                        rows_times_inputs(&buf[..nb * cols], x, cols, b * DEQUANT_ROWS, &write);
                    }
                }
            }
        });
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.into());
    }
    Ok(())
}

/// [`matmul_inputs`] of a call with [`WeightData::Gemm`] projections: those by
/// [`gemm::gemm_nt`], the others as usual.
///
/// Errors: as [`matmul_many`].
fn matmul_gemm_first(projs: &mut [Projection<'_>], xs: &[&[f32]], n: usize) -> Result<()> {
    let input = |pi: usize| if xs.len() == 1 { xs[0] } else { xs[pi] };
    let mut rest = Vec::new();
    let mut rest_xs = Vec::new();
    for (pi, p) in projs.iter_mut().enumerate() {
        let WeightData::Gemm(wf) = p.data else {
            rest_xs.push(input(pi));
            rest.push(Projection {
                w: p.w,
                data: p.data,
                out: &mut *p.out,
            });
            continue;
        };
        gemm::gemm_nt(input(pi), wf, n, p.w.rows, p.w.cols, p.out);
    }
    match rest.is_empty() {
        true => Ok(()),
        false if xs.len() == 1 => matmul_inputs(&mut rest, xs, n),
        false => matmul_inputs(&mut rest, &rest_xs, n),
    }
}

/// Weight rows widened at a time by [`matmul_many`]'s float path (F16, BF16, IQ*): 16 rows
/// of a 4096-wide matrix take 256 KiB of scratch, which stays in cache while every input
/// row is read against them. Not tuned beyond that: an F16 SigLIP of SmolVLM-256M's
/// shapes (1,024 rows a call) spent 75% of its time on the per-weight-row loop this
/// replaced, and now runs on its own products (`vision/gemm.rs`).
const DEQUANT_ROWS: usize = 16;

/// `write(i, j0 + j, …)` for each input row `i` of `x` (`n × cols`) and weight row `j` of
/// `wf` (`rows × cols`, f32): the products [`dot`] gives, four weight rows at a time with
/// [`dot_rows`] (the same bits).
fn rows_times_inputs(
    wf: &[f32],
    x: &[f32],
    cols: usize,
    j0: usize,
    write: &dyn Fn(usize, usize, &[f32]),
) {
    let n_w = wf.len() / cols;
    let mut pairs = x.chunks_exact(2 * cols);
    for (p, pair) in (&mut pairs).enumerate() {
        let (x0, x1) = pair.split_at(cols);
        let mut quads = wf.chunks_exact(4 * cols);
        for (q, quad) in (&mut quads).enumerate() {
            let r = |k: usize| &quad[k * cols..(k + 1) * cols];
            let [a, b] = dot_rows2([x0, x1], [r(0), r(1), r(2), r(3)]);
            write(2 * p, j0 + 4 * q, &a);
            write(2 * p + 1, j0 + 4 * q, &b);
        }
        for (k, wrow) in quads.remainder().chunks_exact(cols).enumerate() {
            let [[a], [b]] = dot_rows2([x0, x1], [wrow]);
            write(2 * p, j0 + n_w / 4 * 4 + k, &[a]);
            write(2 * p + 1, j0 + n_w / 4 * 4 + k, &[b]);
        }
    }
    let i = x.len() / cols / 2 * 2;
    if let Some(xi) = pairs.remainder().get(..cols) {
        let mut quads = wf.chunks_exact(4 * cols);
        for (q, quad) in (&mut quads).enumerate() {
            let r = |k: usize| &quad[k * cols..(k + 1) * cols];
            write(i, j0 + 4 * q, &dot_rows(xi, [r(0), r(1), r(2), r(3)]));
        }
        for (k, wrow) in quads.remainder().chunks_exact(cols).enumerate() {
            write(i, j0 + n_w / 4 * 4 + k, &[dot(xi, wrow)]);
        }
    }
}

/// Stored `F32` weights as f32 values, in place: `Some` where `ty` is `F32`, the bytes are
/// 4-aligned and the machine is little-endian (GGUF stores little-endian), which is what
/// `frink_quant::dequantize` would copy them into.
pub(crate) fn f32_in_place(ty: GgmlType, bytes: &[u8]) -> Option<&[f32]> {
    if ty != GgmlType::F32 || cfg!(target_endian = "big") {
        return None;
    }
    // SAFETY: every bit pattern is a valid f32; `align_to` only reinterprets the aligned
    // middle, whose length it computes.
    #[allow(unsafe_code)]
    let (head, mid, tail) = unsafe { bytes.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

thread_local! {
    /// Per-thread scratch of the matrix tasks (a tile of results, or a dequantized row).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Row `r` of a matrix dequantized into `out` (`w.cols` values): embedding lookup. A
/// packed matrix (a tied LM head) gives the row's stored bytes back first, so the mapped
/// copy is never read again (measured: 512 random lookups in gemma3-1b's 325 MB table
/// brought 237 MB of it back into resident memory through the kernel's fault-around).
pub fn matrix_row(w: &Matrix, wdata: WeightData<'_>, r: usize, out: &mut [f32]) -> Result<()> {
    match wdata {
        WeightData::Gemm(f) => out.copy_from_slice(&f[r * w.cols..(r + 1) * w.cols]),
        WeightData::Stored(d) => {
            frink_quant::dequantize(w.ty, &d[r * w.row_bytes..(r + 1) * w.row_bytes], out)?
        }
        WeightData::Packed(p) => {
            let mut row = vec![0u8; w.row_bytes];
            p.row(r, &mut row);
            frink_quant::dequantize(w.ty, &row, out)?
        }
    }
    Ok(())
}

/// RMSNorm of each `dim`-sized row of `x` in place, times `weight`:
/// `x · w / sqrt(mean(x²) + eps)`, the sum of squares accumulated in f64 as ggml does
/// (`ggml_compute_forward_rms_norm_f32`), over eight lanes ([`sum_squares`]).
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for row in x.chunks_exact_mut(dim) {
        let sum = sum_squares(row);
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = (*v * scale) * w;
        }
    }
}

/// `Σ x²` in f64: element `i` into lane `i % 8`, the lanes summed pairwise at the end.
/// ggml's one running sum (`ggml_compute_forward_rms_norm_f32`) waits a full f64 add per
/// element: the sum of 2048 squares took 1.05 µs that way and 0.28 µs in lanes (hot
/// cache, Zen 5), and an OLMoE decode step has four such norms per layer, on one thread. The lanes
/// differ from the one sum only in f64 rounding (measured 2.7e-15 relative at 2048
/// values), far below the f32 the mean is rounded to. Each square is exact in f64.
pub fn sum_squares(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += (v as f64) * (v as f64);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(rest) {
        *l += (v as f64) * (v as f64);
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// LayerNorm of each `weight.len()`-sized row of `x` in place, times `weight` (the bias, if
/// any, is added by the caller): `(x - mean) / sqrt(var + eps) · w`, mean and variance
/// accumulated in f64 as ggml does (`ggml_compute_forward_norm_f32`).
pub fn layer_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for row in x.chunks_exact_mut(dim) {
        let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64) as f32;
        let mut var = 0f64;
        for v in row.iter_mut() {
            *v -= mean;
            var += (*v as f64) * (*v as f64);
        }
        let scale = 1.0 / ((var / dim as f64) as f32 + eps).sqrt();
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

/// The rotations of rotary position embedding at one position (llama.cpp
/// `ggml_compute_forward_rope_f32` / `rope_yarn`): for each of the `n_rot / 2` pairs, the
/// `(cos, sin)` of `θ_i = freq_scale · pos · base^(-2i/n_rot) / factor_i`, the angle built
/// by repeated multiplication in f32 as ggml does; with YaRN ([`crate::config::YarnParams`])
/// the angle blends the scaled and unscaled ones by pair and cos/sin carry the attention
/// factor. `factors` (`n_rot / 2` values: `rope_freqs.weight`, Llama 3.1's per-pair
/// frequency divisors) divide each pair's unscaled angle before any scaling, as ggml's
/// `ggml_rope_cache_init` does with its `freq_factors` (`theta / ff`). Written to `out`
/// (cleared first). The same for every head, so computed once per position.
///
/// # Panics
/// If `factors` is given with fewer than `n_rot / 2` values (the loader checks the shape).
pub fn rope_angles(
    pos: usize,
    n_rot: usize,
    rp: &crate::config::RopeParams,
    factors: Option<&[f32]>,
    out: &mut Vec<(f32, f32)>,
) {
    let theta_scale = rp.freq_base.powf(-2.0 / n_rot as f32);
    let mut theta_base = pos as f32;
    out.clear();
    for i in 0..n_rot / 2 {
        let theta = match factors {
            Some(f) => theta_base / f[i],
            None => theta_base,
        };
        let interp = rp.freq_scale * theta;
        let (angle, mscale) = match &rp.yarn {
            Some(y) if y.ext_factor != 0.0 => {
                let [low, high] = y.corr_dims;
                let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                let mix = ramp * y.ext_factor;
                let m = y.attn_factor * (1.0 + 0.1 * (1.0 / rp.freq_scale).ln());
                (interp * (1.0 - mix) + theta * mix, m)
            }
            Some(y) => (interp, y.attn_factor),
            None => (interp, 1.0),
        };
        let (sin, cos) = angle.sin_cos();
        out.push(if mscale == 1.0 {
            (cos, sin)
        } else {
            (cos * mscale, sin * mscale)
        });
        theta_base *= theta_scale;
    }
}

/// Rotates the first `2 · angles.len()` dimensions of one head vector in place by
/// [`rope_angles`]' rotations: `neox` pairs `(i, i + n_rot/2)`, otherwise `(2i, 2i+1)`.
pub fn rope_rotate(head: &mut [f32], angles: &[(f32, f32)], neox: bool) {
    let half = angles.len();
    for (i, &(cos, sin)) in angles.iter().enumerate() {
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

/// Rotary position embedding of one head vector in place: [`rope_angles`] then
/// [`rope_rotate`].
pub fn rope(
    head: &mut [f32],
    pos: usize,
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    neox: bool,
) {
    let mut angles = Vec::with_capacity(n_rot / 2);
    let rp = crate::config::RopeParams {
        freq_base,
        freq_scale,
        yarn: None,
    };
    rope_angles(pos, n_rot, &rp, None, &mut angles);
    rope_rotate(head, &angles, neox);
}

/// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (transformers
/// `gelu_pytorch_tanh`), computed through the identity `0.5·(1 + tanh(u)) =
/// 1 / (1 + e^(-2u))`: one `exp` instead of libm's `tanh` (which costs an `expm1` and a
/// division: 24% of gemma3-270m's prefill), with the right limits (0 and `x`) for large
/// `|x|`. Max abs. difference from the f64 formula over [-12, 12]: 5.1e-7 (the `tanh` form:
/// 4.3e-7).
///
/// Measured alternatives on gemma3-270m's golden checks (the models amplify last-bit
/// changes; llama.cpp's own legitimate variants move the top-20 logits by 1.3 to 3.1):
/// `tanh` form top-20 max |Δ| 1.76 / ppl c512 13.851, this form 3.59 / 13.815, ggml's fp16
/// table (what llama.cpp runs) 3.28 / 13.848 but 4e-4 from transformers on the tiny
/// fixtures instead of 1e-6; so the exact formula in its fastest form.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

/// GELU with the error function, `0.5 · x · (1 + erf(x / √2))` (PyTorch `nn.GELU()`:
/// transformers' `gelu`, BERT's FFN and Qwen2.5-VL's merger).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Softmax of `x` in place ([`softmax_with_sink`] without a sink).
pub fn softmax(x: &mut [f32]) {
    softmax_with_sink(x, None)
}

/// gpt-oss's clamped SwiGLU of one gate/up pair: `g = min(gate, 7)`, `u = clamp(up, -7, 7)`,
/// `(u + 1) · g · sigmoid(1.702 · g)` (llama.cpp `ggml_swiglu_oai` with alpha 1.702 and
/// limit 7, the constants of `src/models/openai-moe-iswa.cpp`).
#[inline]
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let g = gate.min(LIMIT);
    let u = up.clamp(-LIMIT, LIMIT);
    (u + 1.0) * (g / (1.0 + (-ALPHA * g).exp()))
}

/// Test inputs: an xorshift generator of values in [-1, 1).
#[cfg(test)]
pub(crate) fn test_rng(mut seed: u64) -> impl FnMut() -> f32 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sum_squares`' eight lanes agree with ggml's one running f64 sum to f64 rounding
    /// (measured 2.7e-15 relative at 2048 values; the bound is n · ε, 2.3e-13),
    /// and the norm built on it gives the one-chain norm's f32 bits on every element of
    /// 300 random rows (measured: 0 of 614,400 differ; a lane dropped or counted twice
    /// moves the sum by whole squares, relative 1e-4 and more).
    #[test]
    fn rms_norm_lanes_match_one_running_sum() {
        let mut rnd = test_rng(0x2545_f491_4f6c_dd1du64);
        for len in [0usize, 1, 7, 8, 9, 63, 2048, 2049] {
            let x: Vec<f32> = (0..len).map(|_| rnd() * 5.0).collect();
            let chain: f64 = x.iter().fold(0.0, |s, &v| s + (v as f64) * (v as f64));
            let lanes = sum_squares(&x);
            assert!(
                (lanes - chain).abs() <= chain * 1e-12,
                "len {len}: {lanes} vs {chain}"
            );
        }
        let (dim, eps) = (2048, 1e-6f32);
        let w: Vec<f32> = (0..dim).map(|_| 1.0 + rnd() * 0.5).collect();
        let mut differ = 0;
        for row in 0..300 {
            let scale = [1e-3f32, 1.0, 30.0][row % 3];
            let x: Vec<f32> = (0..dim).map(|_| rnd() * scale).collect();
            let mut got = x.clone();
            rms_norm(&mut got, &w, eps);
            let chain: f64 = x.iter().fold(0.0, |s, &v| s + (v as f64) * (v as f64));
            let s = 1.0 / ((chain / dim as f64) as f32 + eps).sqrt();
            differ += x
                .iter()
                .zip(&w)
                .zip(&got)
                .filter(|((&v, &w), g)| ((v * s) * w).to_bits() != g.to_bits())
                .count();
        }
        assert_eq!(differ, 0);
    }

    /// The AVX2 builds of `dot`, `dot_rows` and `axpy` give the bits of the portable ones,
    /// and `dot_rows` each row's `dot` (the compiler must not fuse or reorder: a fused
    /// multiply-add would change the last bit of about half the results).
    #[test]
    fn simd_dot_and_axpy_match_portable() {
        let mut rnd = test_rng(0x9e37_79b9_7f4a_7c15u64);
        for len in [0, 1, 7, 8, 9, 64, 100, 256, 257] {
            let a: Vec<f32> = (0..len).map(|_| rnd() * 3.0).collect();
            let b: Vec<f32> = (0..len).map(|_| rnd() * 1e3).collect();
            assert_eq!(
                dot(&a, &b).to_bits(),
                dot_portable(&a, &b).to_bits(),
                "len {len}"
            );
            let c: Vec<f32> = (0..len).map(|_| rnd() * 7.0).collect();
            let want = [
                dot_portable(&a, &b),
                dot_portable(&a, &c),
                dot_portable(&a, &a),
            ];
            for got in [
                dot_rows(&a, [&b, &c, &a]),
                dot_rows_portable(&a, [&b, &c, &a]),
            ] {
                assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "len {len}");
            }
            // Two inputs at once: each its own dot_rows' bits.
            let [p, q] = dot_rows2([&a, &c], [&b, &c, &a]);
            assert_eq!(p.map(f32::to_bits), want.map(f32::to_bits), "len {len}");
            let want_c = [&b, &c, &a].map(|r| dot_portable(&c, r).to_bits());
            assert_eq!(q.map(f32::to_bits), want_c, "len {len}");
            let (mut y1, mut y2) = (b.clone(), b.clone());
            axpy(&mut y1, 0.37, &a);
            axpy_portable(&mut y2, 0.37, &a);
            assert!(y1.iter().zip(&y2).all(|(p, q)| p.to_bits() == q.to_bits()));
        }
    }

    /// f32 weights read in place give the bits of the dequantizing path (weights one
    /// byte off alignment take that path), and both are the plain `dot` of the row.
    #[test]
    fn f32_weights_in_place_match_the_copied_rows() {
        let mut rnd = test_rng(0x51_7cc1_b727_220au64);
        let (rows, cols, n) = (37, 70, 3);
        let w: Vec<f32> = (0..rows * cols).map(|_| rnd()).collect();
        let x: Vec<f32> = (0..n * cols).map(|_| rnd() * 2.0).collect();
        let mut bytes = vec![0u8; 4 + rows * cols * 4 + 1];
        let m = Matrix {
            ty: GgmlType::F32,
            rows,
            cols,
            row_bytes: cols * 4,
            tensor: 0,
            offset: 0,
        };
        let mut got = Vec::new();
        for shift in [0, 1] {
            // The first 4-aligned byte, plus `shift`.
            let at = bytes.as_ptr().align_offset(4) + shift;
            let data = &mut bytes[at..at + rows * cols * 4];
            for (b, v) in data.chunks_exact_mut(4).zip(&w) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            assert_eq!(f32_in_place(m.ty, data).is_some(), shift == 0);
            let mut out = vec![0f32; n * rows];
            matmul(&m, WeightData::Stored(data), &x, n, &mut out).unwrap();
            got.push(out);
        }
        let want: Vec<f32> = x
            .chunks_exact(cols)
            .flat_map(|xi| w.chunks_exact(cols).map(move |wr| dot(xi, wr)))
            .collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[0]), bits(&want));
        assert_eq!(bits(&got[1]), bits(&want));
    }

    /// GELU agrees with the f64 tanh formula to f32 rounding (measured 5.1e-7; a wrong
    /// sign or factor gives > 1e-1), and has the right limits.
    #[test]
    fn gelu_erf_matches_known_values() {
        // torch.nn.functional.gelu(torch.tensor([1.0, -2.0])) = [0.8413447, -0.0455003]
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_erf(-2.0) + 0.045_500_3).abs() < 1e-6);
    }

    #[test]
    fn gelu_matches_the_tanh_formula() {
        let reference = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        let mut max = 0f64;
        for i in -24_000..=24_000 {
            let x = i as f32 / 2000.0;
            max = max.max((gelu_tanh(x) as f64 - reference(x as f64)).abs());
        }
        eprintln!("gelu: max abs difference {max:e}");
        assert!(max < 2e-6, "max abs difference {max}");
        assert_eq!(gelu_tanh(-100.0), 0.0);
        assert_eq!(gelu_tanh(100.0), 100.0);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }
}
