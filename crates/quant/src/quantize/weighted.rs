//! Quantizers with an importance matrix: ggml-quants.c's `quantize_row_*_impl` with
//! `quant_weights` (what `llama-quantize --imatrix` writes through `ggml_quantize_chunk`).
//! Each value's weight in the scale searches is its column's importance `qw` (the mean
//! squared activation entering that column, [`crate::imatrix`]) times
//! `sqrt(σ² + x²)`, `σ²` the row's or super-block's mean square (doubled for most types),
//! except Q6_K, which weighs by `qw` alone. The searches are ggml's, in its order and
//! without fused multiply-adds:
//!
//! | type | σ² over | search |
//! |---|---|---|
//! | Q4_0, Q5_0 | the row, `Σx²/n` | `make_qx_quants` (`nmax` 8, 16) |
//! | Q4_1, Q5_1 | the row, `Σx²/n` | `make_qkx3_quants` (15, 31) |
//! | Q2_K | the super-block, `Σx²/256` | `make_qkx3_quants`, scales and mins by `make_qp_quants` |
//! | Q3_K | the super-block, `2Σx²/256` | `make_qx_quants` for values and scales |
//! | Q4_K, Q5_K | the super-block, `2Σx²/256` | `make_qkx3_quants`, scales and mins by `make_qp_quants` |
//! | Q6_K | — | `make_qx_quants` weighted by `qw` |
//! | IQ4_NL, IQ4_XS | the block (32) or super-block (256), `2Σx²/n` | IQ4_NL's scale search |
//!
//! F32, F16, BF16 and Q8_0 ignore the weights, as ggml does.

use super::kquants::{self, make_qkx2_quants, make_qx_quants, GROUP_MAX_EPS, QK_K};
use super::{five_bit_quants, four_bit_quants, inverse, iq4_search, nearest_level, put_f16, QK};
use crate::dot::quantize::nearest_int;
use crate::{GgmlType, QuantError};

/// Types whose quantizer reads the weights (the rest quantize as without them).
pub const WEIGHTED: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// Quantizes the rows of `x` (each `qw.len()` values) to `ty` in `out` with the
/// importance weights `qw` (one per column), as `ggml_quantize_chunk` does with an
/// imatrix. Types not in [`WEIGHTED`] quantize as [`super::quantize`] does.
///
/// # Errors
/// As [`super::quantize`]; also [`QuantError::LengthMismatch`] when `x` is not whole rows
/// of `qw.len()` values.
pub fn quantize_weighted(
    ty: GgmlType,
    x: &[f32],
    qw: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    if !WEIGHTED.contains(&ty) {
        return super::quantize(ty, x, out);
    }
    let (n, bytes) = (ty.block_size(), ty.type_size());
    let cols = qw.len();
    let mismatch = || QuantError::LengthMismatch {
        ty,
        data_len: out.len(),
        out_len: x.len(),
        block_bytes: bytes,
        block_len: n,
    };
    if cols == 0 || !cols.is_multiple_of(n) || !x.len().is_multiple_of(cols) {
        return Err(mismatch());
    }
    let row_bytes = cols / n * bytes;
    if out.len() != x.len() / cols * row_bytes {
        return Err(mismatch());
    }
    for (x, b) in x.chunks_exact(cols).zip(out.chunks_exact_mut(row_bytes)) {
        row(ty, x, qw, b);
    }
    Ok(())
}

/// One row of [`quantize_weighted`] (`ty` in [`WEIGHTED`]).
fn row(ty: GgmlType, x: &[f32], qw: &[f32], b: &mut [u8]) {
    use GgmlType as T;
    let (n, bytes) = (ty.block_size(), ty.type_size());
    let blocks = x
        .chunks_exact(n)
        .zip(qw.chunks_exact(n))
        .zip(b.chunks_exact_mut(bytes));
    match ty {
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 => {
            let mut sum_x2 = 0.0f32;
            for &v in x {
                sum_x2 += v * v;
            }
            let sigma2 = sum_x2 / x.len() as f32;
            for ((x, qw), b) in blocks {
                let x: &[f32; QK] = x.try_into().expect("one block");
                let w: [f32; QK] = std::array::from_fn(|j| qw[j] * (sigma2 + x[j] * x[j]).sqrt());
                legacy(ty, x, &w, b);
            }
        }
        T::IQ4_NL => {
            for ((x, qw), b) in blocks {
                let w: [f32; QK] = importance(x, qw, 2.0 / QK as f32);
                let (d, _) = iq4_search(x, &w, 7);
                put_f16(b, 0, d);
                let id = inverse(d);
                for j in 0..QK / 2 {
                    let lo = nearest_level(id * x[j]) as u8;
                    let hi = nearest_level(id * x[j + QK / 2]) as u8;
                    b[2 + j] = lo | hi << 4;
                }
            }
        }
        _ => {
            for ((x, qw), b) in blocks {
                let x: &[f32; QK_K] = x.try_into().expect("one super-block");
                let qw: &[f32; QK_K] = qw.try_into().expect("one super-block");
                match ty {
                    T::Q2_K => q2_k(x, qw, b),
                    T::Q3_K => q3_k(x, qw, b),
                    T::Q4_K => k4(x, qw, b, 15),
                    T::Q5_K => k4(x, qw, b, 31),
                    T::Q6_K => q6_k(x, qw, b),
                    T::IQ2_XXS => super::iq2::iq2_xxs(x, Some(qw), b),
                    T::IQ2_XS => super::iq2::iq2_xs(x, Some(qw), b),
                    T::IQ2_S => super::iq2::iq2_s(x, Some(qw), b),
                    T::IQ3_XXS => super::iq3::iq3_xxs(x, Some(qw), b),
                    T::IQ3_S => super::iq3::iq3_s(x, Some(qw), b),
                    T::IQ1_S => super::iq1::iq1_s(x, Some(qw), b),
                    T::IQ1_M => super::iq1::iq1_m(x, Some(qw), b),
                    _ => kquants::iq4_xs_weighted(x, &importance(x, qw, 2.0 / 256.0), b, 7),
                }
            }
        }
    }
}

/// `qw · sqrt(σ² + x²)` for each value, `σ² = (Σ x²) · scale` over `x` (ggml's
/// `sigma2 *= 2.f/super_block_size` in `quantize_row_iq4_nl_impl`; `scale` is a power of
/// two, so the same bits as its `2 Σ x² / n` elsewhere).
fn importance<const N: usize>(x: &[f32], qw: &[f32], scale: f32) -> [f32; N] {
    let mut sigma2 = 0.0f32;
    for &v in &x[..N] {
        sigma2 += v * v;
    }
    sigma2 *= scale;
    std::array::from_fn(|j| qw[j] * (sigma2 + x[j] * x[j]).sqrt())
}

/// A 32-value Q4_0, Q4_1, Q5_0 or Q5_1 block with weights `w`.
fn legacy(ty: GgmlType, x: &[f32; QK], w: &[f32; QK], b: &mut [u8]) {
    let mut l = [0u8; QK];
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let nmax = if ty == GgmlType::Q4_0 { 8 } else { 16 };
            let d = make_qx_quants(nmax, x, w, &mut l);
            put_f16(b, 0, d);
            if ty == GgmlType::Q4_0 {
                four_bit_quants(&l, &mut b[2..]);
            } else {
                let (qh, qs) = b[2..].split_at_mut(4);
                five_bit_quants(&l, qh, qs);
            }
        }
        _ => {
            let nmax = if ty == GgmlType::Q4_1 { 15 } else { 31 };
            let mut min = 0.0;
            let d = make_qkx3(nmax, x, w, &mut l, &mut min);
            put_f16(b, 0, d);
            put_f16(b, 2, -min);
            if ty == GgmlType::Q4_1 {
                four_bit_quants(&l, &mut b[4..]);
            } else {
                let (qh, qs) = b[4..].split_at_mut(4);
                five_bit_quants(&l, qh, qs);
            }
        }
    }
}

/// ggml's `make_qkx3_quants(n, nmax, x, w, L, &min, Laux, -0.9f, 0.05f, 36, false)`, the
/// search every weighted quantizer with a minimum uses.
fn make_qkx3<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    w: &[f32; N],
    l: &mut [u8; N],
    the_min: &mut f32,
) -> f32 {
    make_qkx2_quants::<N, false, true>(nmax, x, w, l, the_min, (-0.9, 0.05, 36))
}

/// ggml's `make_qp_quants`: a non-negative scale for the non-negative `x` (sub-block
/// scales or minimums) with quants `0..=nmax`: the best of 9 scales around `max / nmax`
/// by weighted (`w`) squared error, then up to five passes moving single quants while
/// that raises `(Σ w x l)² / Σ w l²`. Returns the least-squares scale; `l` gets the
/// quants. (A negative `x` stores its quant modulo 256, as ggml's `uint8_t` does.)
pub(super) fn make_qp_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    l: &mut [u8; N],
    w: &[f32; N],
) -> f32 {
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (l, &v) in l.iter_mut().zip(x) {
        *l = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..N {
        let diff = x[i] - scale * f32::from(l[i]);
        best_mse += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..N {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..N {
        let q = nearest_int(iscale * x[i]).min(nmax);
        l[i] = q as u8;
        let q = q as f32;
        sumlx += w[i] * x[i] * q;
        suml2 += w[i] * q * q;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..N {
            let li = f32::from(l[i]);
            let mut slx = sumlx - w[i] * x[i] * li;
            let mut sl2 = suml2 - w[i] * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new != i32::from(l[i]) {
                    slx += w[i] * x[i] * new as f32;
                    sl2 += w[i] * new as f32 * new as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The sub-block weights of a super-block: `qw · sqrt(σ² + x²)` with
/// `σ² = Σx² · factor / 256`, and each `B`-value sub-block's weight sum.
fn super_block_weights<const B: usize, const S: usize>(
    x: &[f32; QK_K],
    qw: &[f32; QK_K],
    factor: f32,
) -> ([f32; QK_K], [f32; S]) {
    let w = super::importance(x, Some(qw), factor);
    let sw = std::array::from_fn(|j| {
        let mut s = 0.0f32;
        for &v in &w[B * j..B * j + B] {
            s += v;
        }
        s
    });
    (w, sw)
}

/// A `B`-value piece `j` of a super-block's array, as a fixed-size array reference.
fn piece<const B: usize, T>(a: &[T; QK_K], j: usize) -> &[T; B] {
    a[B * j..B * j + B].try_into().expect("a whole piece")
}

/// Q2_K with importance weights (`quantize_row_q2_K_impl`).
fn q2_k(x: &[f32; QK_K], qw: &[f32; QK_K], b: &mut [u8]) {
    let (w, sw) = super_block_weights::<16, 16>(x, qw, 1.0);
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().expect("16");
        scales[j] = make_qkx3(3, piece(x, j), piece(&w, j), lj, &mut mins[j]);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = make_qp_quants(15, &scales, &mut ls, &sw);
    let mm = make_qp_quants(15, &mins, &mut lm, &sw);
    let sc: [u8; 16] = std::array::from_fn(|j| ls[j] | lm[j] << 4);
    kquants::q2_tail(x, b, &mut l, &sc, dm, mm);
}

/// Q3_K with importance weights (`quantize_row_q3_K_impl`).
fn q3_k(x: &[f32; QK_K], qw: &[f32; QK_K], b: &mut [u8]) {
    let (w, sw) = super_block_weights::<16, 16>(x, qw, 2.0);
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    for j in 0..16 {
        let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().expect("16");
        scales[j] = make_qx_quants(4, piece(x, j), piece(&w, j), lj);
    }
    let mut ls = [0u8; 16];
    let d = make_qx_quants(32, &scales, &sw, &mut ls);
    let mut sc = [0u8; 12];
    for (j, &q) in ls.iter().enumerate() {
        if j < 8 {
            sc[j] = q & 0xF;
        } else {
            sc[j - 8] |= (q & 0xF) << 4;
        }
        sc[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
    }
    kquants::q3_tail(x, b, &mut l, &sc, d);
}

/// Q4_K (`nmax` 15) or Q5_K (31) with importance weights (`quantize_row_q{4,5}_K_impl`;
/// Q5_K caps the 6-bit scales at 63, Q4_K stores them as they come).
fn k4(x: &[f32; QK_K], qw: &[f32; QK_K], b: &mut [u8], nmax: i32) {
    let (w, sw) = super_block_weights::<32, 8>(x, qw, 2.0);
    let (xt, wt) = (super::lanes::transpose(x), super::lanes::transpose(&w));
    let (mut l, scales, mins) = kquants::k4_search::<true>(&xt, &wt, nmax, (-0.9, 0.05, 36));
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d = make_qp_quants(63, &scales, &mut ls, &sw);
    let dmin = make_qp_quants(63, &mins, &mut lm, &sw);
    if nmax == 31 {
        ls = ls.map(|v| v.min(63));
        lm = lm.map(|v| v.min(63));
    }
    kquants::k4_tail(x, b, &mut l, nmax, (ls, lm), (d, dmin));
    if nmax == 15 {
        kquants::q4_pack(&l, b);
    } else {
        kquants::q5_pack(&l, b);
    }
}

/// Q6_K with importance weights (`quantize_row_q6_K_impl`): each sub-block's search
/// weighted by `qw` itself.
fn q6_k(x: &[f32; QK_K], qw: &[f32; QK_K], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    for j in 0..16 {
        let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().expect("16");
        scales[j] = make_qx_quants(32, piece(x, j), piece(qw, j), lj);
    }
    kquants::q6_tail(x, b, &mut l, &scales);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights change the quants (a test that cannot pass if they were ignored), equal
    /// weights on a row of the reference path's kind give valid blocks that decode near
    /// the input, and the types that ignore weights give the unweighted bytes.
    #[test]
    fn weights_change_quants_and_blocks_decode() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0 + (i % 7) as f32 * 0.013)
            .collect();
        let skewed: Vec<f32> = (0..256)
            .map(|i| if i % 5 == 0 { 50.0 } else { 0.01 })
            .collect();
        let flat = vec![1.0f32; 256];
        // (The grid types are checked against ggml's bytes in tests/ggml_reference.rs.)
        for &ty in WEIGHTED
            .iter()
            .filter(|t| !super::super::GRID_TYPES.contains(t))
        {
            let bytes = x.len() / ty.block_size() * ty.type_size();
            let (mut a, mut b) = (vec![0u8; bytes], vec![0u8; bytes]);
            quantize_weighted(ty, &x, &flat, &mut a).unwrap();
            quantize_weighted(ty, &x, &skewed, &mut b).unwrap();
            assert_ne!(a, b, "{ty}: the weights change nothing");
            let mut y = vec![0f32; x.len()];
            crate::dequantize(ty, &a, &mut y).unwrap();
            let err = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 2.5, "{ty}: max error {err}");
        }
        let mut a = vec![0u8; 512 / 32 * 34];
        let mut b = a.clone();
        quantize_weighted(GgmlType::Q8_0, &x, &flat, &mut a).unwrap();
        super::super::quantize(GgmlType::Q8_0, &x, &mut b).unwrap();
        assert_eq!(a, b);
        assert!(quantize_weighted(GgmlType::Q4_K, &x[..300], &flat, &mut a).is_err());
    }
}
