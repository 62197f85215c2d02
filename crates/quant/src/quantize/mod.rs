//! Quantizers: `f32` rows into ggml block formats, the inverse of [`crate::dequantize`],
//! bit-exact with ggml's reference quantizers (ggml/src/ggml-quants.c) when no importance
//! matrix is given.
//!
//! | type | rule (every operation in `f32`, in ggml's order, no fused multiply-add) | ggml source |
//! |---|---|---|
//! | Q4_0 | `max` = the value of largest magnitude (first on ties), `d = max / -8`, `q = min(15, trunc(x / d + 8.5))` | `quantize_row_q4_0_ref` |
//! | Q4_1 | `d = (max - min) / 15`, `m = min`, `q = min(15, trunc((x - min) / d + 0.5))` | `quantize_row_q4_1_ref` |
//! | Q5_0 | `d = max / -16`, `q = min(31, trunc(x / d + 16.5))`, fifth bits in `qh` | `quantize_row_q5_0_ref` |
//! | Q5_1 | `d = (max - min) / 31`, `m = min`, `q = trunc((x - min) / d + 0.5)` | `quantize_row_q5_1_ref` |
//! | Q8_0 | `d = amax / 127`, `q = round(x / d)` | `quantize_row_q8_0_ref` ([`crate::dot::quantize_row_q8_0`]) |
//! | IQ4_NL | a scale search over the 16 levels of [`crate::grids::KVALUES_IQ4NL`], weighted by `x²` | `quantize_iq4_nl` / `quantize_row_iq4_nl_ref` |
//! | Q2_K … Q6_K, IQ4_XS | per 256-value super-block: sub-block scales (and minimums) by ggml's searches, quantized against f16 super-block scales ([`kquants`]) | `quantize_row_q*_K_ref`, `quantize_iq4_xs` |
//! | TQ1_0, TQ2_0 | `d = amax`, each value the trit `round(x / d)` (half away from zero), packed base 3 or 2 bits ([`fp4_ternary`]) | `quantize_row_tq{1,2}_0_ref` |
//! | MXFP4 | exponent `floor(log2 amax) - 2`, each value the nearest FP4 level | `quantize_row_mxfp4_ref` |
//! | F16 | round to nearest even | `ggml_fp32_to_fp16_row` |
//! | BF16 | round to nearest even, NaN kept quiet | `ggml_fp32_to_bf16_row_ref` |
//!
//! "`x / d`" is `x · id` with `id = 1 / d` (0 when `d` is 0), computed once per block, as
//! ggml does. A float-to-integer conversion truncates toward zero, as C's cast does.
//!
//! ggml has two IQ4_NL quantizers: `llama-quantize` searches 15 scales around the first
//! guess ([`quantize`], `ntry = 7`); the CPU backend's row conversion (`from_float` in
//! ggml-cpu.c, which writes llama.cpp's quantized KV cache) keeps the first guess, refined
//! once. frink's KV cache refines the reference rounding further ([`quantize_for_cache`]).
//! A block whose largest magnitude is below `1e-15` gets `d = 0` and level 8: every value
//! decodes to 0.
//!
//! Inputs are expected to be finite, as in ggml: NaN or infinite values give unspecified
//! (but memory-safe) quants.

use half::f16;

use crate::grids::KVALUES_IQ4NL;
use crate::{GgmlType, QuantError};

mod cache;
mod fp4_ternary;
mod iq1;
mod iq2;
mod iq3;
mod kquants;
mod lanes;
mod weighted;

pub use weighted::{quantize_weighted, WEIGHTED};

/// Values per block of every type quantized here (`QK4_0` … `QK4_NL`).
pub(super) const QK: usize = 32;

/// Types [`quantize`] and [`quantize_for_cache`] write.
pub const QUANTIZABLE: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// The grid types (IQ1, IQ2, IQ3): codebook searches, slow without SIMD and coarse
/// without an importance matrix.
pub const GRID_TYPES: &[GgmlType] = &[
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// Types quantized only with an importance matrix (ggml.c
/// `ggml_quantize_requires_imatrix`): [`quantize`] refuses them with
/// [`QuantError::NeedsImatrix`]; [`quantize_weighted`] writes them.
pub const NEED_IMATRIX: &[GgmlType] = &[GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_S];

/// Quantizes `x` (a whole number of blocks) to `ty` in `out` as `llama-quantize` does
/// without an importance matrix (`ggml_quantize_chunk` with `imatrix = NULL`).
///
/// # Errors
/// [`QuantError::Unsupported`] unless `ty` is in [`QUANTIZABLE`];
/// [`QuantError::LengthMismatch`] unless `x` is whole blocks and `out` exactly their bytes.
pub fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    quantize_with(ty, x, out, 7)
}

/// Quantizes `x` (a whole number of blocks) to `ty` for a KV cache. The blocks are ggml's
/// (any ggml reader dequantizes them); Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL start from
/// ggml's reference rounding, which llama.cpp's CPU backend stores (`from_float` in
/// ggml-cpu.c: the block's largest value sets the scale), and are refined by least
/// squares ([`cache`]): on smollm2-135m that cache's KL divergence from the f16 cache
/// is 9–21% lower (docs/usage.md, "KV cache types"). Other types as [`quantize`] (Q8_0's
/// rounding is ggml's).
///
/// # Errors
/// As [`quantize`].
pub fn quantize_for_cache(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    if !cache::REFINED.contains(&ty) {
        return quantize(ty, x, out);
    }
    check_lengths(ty, x, out)?;
    for (x, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(ty.type_size())) {
        cache::quantize_block(ty, x, b);
    }
    Ok(())
}

/// ggml's reference rounding of one block of Q4_0, Q4_1, Q5_0, Q5_1 (`quantize_row_*_ref`)
/// or IQ4_NL (the CPU backend's row conversion, `quantize_row_iq4_nl_ref`: the first
/// scale, refined once): what llama.cpp stores in a quantized KV cache.
#[cfg(test)]
pub(super) fn quantize_reference_block(ty: GgmlType, x: &[f32], b: &mut [u8]) {
    match ty {
        GgmlType::Q4_0 => q4_0(x, b),
        GgmlType::Q4_1 => q4_1(x, b),
        GgmlType::Q5_0 => q5_0(x, b),
        GgmlType::Q5_1 => q5_1(x, b),
        GgmlType::IQ4_NL => iq4_nl(x, b, -1),
        _ => unreachable!("{ty} has no reference rounding here"),
    }
}

/// [`QuantError::LengthMismatch`] unless `x` is whole blocks of `ty` and `out` exactly
/// their bytes.
fn check_lengths(ty: GgmlType, x: &[f32], out: &[u8]) -> Result<(), QuantError> {
    let (n, bytes) = (ty.block_size(), ty.type_size());
    if !x.len().is_multiple_of(n) || out.len() != x.len() / n * bytes {
        return Err(QuantError::LengthMismatch {
            ty,
            data_len: out.len(),
            out_len: x.len(),
            block_bytes: bytes,
            block_len: n,
        });
    }
    Ok(())
}

/// [`quantize`] with IQ4_NL's search width `ntry`.
fn quantize_with(ty: GgmlType, x: &[f32], out: &mut [u8], ntry: i32) -> Result<(), QuantError> {
    use GgmlType as T;
    let block: fn(&[f32], &mut [u8], i32) = match ty {
        T::F32 => |x, b, _| b.copy_from_slice(&x[0].to_le_bytes()),
        T::F16 => |x, b, _| b.copy_from_slice(&f16::from_f32(x[0]).to_le_bytes()),
        T::BF16 => |x, b, _| b.copy_from_slice(&bf16_bits(x[0]).to_le_bytes()),
        T::Q4_0 => |x, b, _| q4_0(x, b),
        T::Q4_1 => |x, b, _| q4_1(x, b),
        T::Q5_0 => |x, b, _| q5_0(x, b),
        T::Q5_1 => |x, b, _| q5_1(x, b),
        T::Q8_0 => |x, b, _| {
            crate::dot::quantize_row_q8_0(x, b).expect("one whole block");
        },
        T::IQ4_NL => iq4_nl,
        T::Q2_K => kquants::q2_k,
        T::Q3_K => kquants::q3_k,
        T::Q4_K => kquants::q4_k,
        T::Q5_K => kquants::q5_k,
        T::Q6_K => kquants::q6_k,
        // ggml's CPU row conversion searches as llama-quantize does here.
        T::IQ4_XS => |x, b, _| kquants::iq4_xs(x, b, 7),
        T::TQ1_0 => |x, b, _| fp4_ternary::tq1_0(x, b),
        T::TQ2_0 => |x, b, _| fp4_ternary::tq2_0(x, b),
        T::MXFP4 => |x, b, _| fp4_ternary::mxfp4(x, b),
        T::IQ2_S => |x, b, _| iq2::iq2_s(x, None, b),
        T::IQ3_XXS => |x, b, _| iq3::iq3_xxs(x, None, b),
        T::IQ3_S => |x, b, _| iq3::iq3_s(x, None, b),
        T::IQ1_M => |x, b, _| iq1::iq1_m(x, None, b),
        T::IQ2_XXS | T::IQ2_XS | T::IQ1_S => return Err(QuantError::NeedsImatrix(ty)),
        _ => return Err(QuantError::Unsupported(ty)),
    };
    check_lengths(ty, x, out)?;
    let (n, bytes) = (ty.block_size(), ty.type_size());
    for (x, b) in x.chunks_exact(n).zip(out.chunks_exact_mut(bytes)) {
        block(x, b, ntry);
    }
    Ok(())
}

/// ggml's `GGML_FP32_TO_BF16` (ggml-impl.h `ggml_compute_fp32_to_bf16`): round to nearest
/// even; a NaN keeps its upper bits with the quiet bit set.
pub fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// C's `(int)v` for a float in range: truncation toward zero (Rust's `as` saturates
/// instead outside the range, where C's result is unspecified anyway).
#[inline(always)]
fn trunc(v: f32) -> i32 {
    v as i32
}

/// The value of largest magnitude (the first on ties) and that magnitude (ggml's loops,
/// written `amax < fabsf(v)` in some quantizers and `ax > amax` in others: the same).
#[inline(always)]
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// The smallest and largest value, from `+∞`/`-∞` as ggml's `FLT_MAX` start gives them for
/// finite inputs.
#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// ggml's `MAX(a, b)`: `a > b ? a : b` (so `b` when either is NaN).
#[inline(always)]
pub(super) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `Σ x²`, summed in order.
pub(super) fn sum_squares(x: &[f32]) -> f32 {
    let mut sum = 0.0f32;
    for &v in x {
        sum += v * v;
    }
    sum
}

/// The search weights of a 256-value super-block: with importance weights,
/// `qw · sqrt(σ² + x²)` with `σ² = factor · Σx² / 256` (ggml's `quantize_row_*_impl`:
/// `factor` 1 or 2 by type); without, `x²`.
pub(super) fn importance(x: &[f32], qw: Option<&[f32]>, factor: f32) -> [f32; kquants::QK_K] {
    match qw {
        Some(qw) => {
            let sigma2 = factor * sum_squares(&x[..kquants::QK_K]) / kquants::QK_K as f32;
            std::array::from_fn(|i| qw[i] * (sigma2 + x[i] * x[i]).sqrt())
        }
        None => std::array::from_fn(|i| x[i] * x[i]),
    }
}

/// Stores `v` rounded to f16 (`GGML_FP32_TO_FP16`) at byte `at` of `b`.
#[inline(always)]
pub(super) fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// `1 / d`, or 0 for `d = 0`.
#[inline(always)]
pub(super) fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Q4_0 (18 bytes: `d` @0, nibbles @2).
fn q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_max(x).0 / -8.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for j in 0..QK / 2 {
        let lo = trunc(x[j] * id + 8.5).min(15) as u8;
        let hi = trunc(x[j + QK / 2] * id + 8.5).min(15) as u8;
        b[2 + j] = lo | hi << 4;
    }
}

/// Q4_1 (20 bytes: `d` @0, `m` @2, nibbles @4).
fn q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..QK / 2 {
        let lo = trunc((x[j] - min) * id + 0.5).min(15) as u8;
        let hi = trunc((x[j + QK / 2] - min) * id + 0.5).min(15) as u8;
        b[4 + j] = lo | hi << 4;
    }
}

/// Stores 32 4-bit quants as ggml's 32-value blocks do: quant `j` in the low nibble of
/// byte `j` of `qs`, quant `j + 16` in its high nibble.
pub(super) fn four_bit_quants(q: &[u8; QK], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = q[j] | q[j + QK / 2] << 4;
    }
}

/// Stores 32 5-bit quants: low nibbles at `qs`, fifth bits as bit `i` of the `u32` at `qh`.
pub(super) fn five_bit_quants(q: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | (q[j + QK / 2] & 0x0F) << 4;
        h |= u32::from(q[j] >> 4 & 1) << j;
        h |= u32::from(q[j + QK / 2] >> 4 & 1) << (j + QK / 2);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

/// Q5_0 (22 bytes: `d` @0, `qh` @2, nibbles @6).
fn q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_max(x).0 / -16.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    let q = std::array::from_fn(|j| trunc(x[j] * id + 16.5).min(31) as u8);
    let (qh, qs) = b[2..].split_at_mut(4);
    five_bit_quants(&q, qh, qs);
}

/// Q5_1 (24 bytes: `d` @0, `m` @2, `qh` @4, nibbles @8). ggml clamps nothing here: `q`
/// reaches at most 31 for finite inputs.
fn q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let q = std::array::from_fn(|j| trunc((x[j] - min) * id + 0.5) as u8);
    let (qh, qs) = b[4..].split_at_mut(4);
    five_bit_quants(&q, qh, qs);
}

/// ggml's `best_index_int8` over the 16 IQ4_NL levels: the index of the level nearest
/// `x` (the upper one on ties), by bisection.
#[inline(always)]
pub(super) fn nearest_level(x: f32) -> usize {
    let v = |i: usize| f32::from(KVALUES_IQ4NL[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        hi - 1
    } else {
        hi
    }
}

/// `(Σ w q x, Σ w q²)` for the levels nearest `id · x`, each level's index written to `l`.
#[inline(always)]
fn iq4_sums(x: &[f32], w: &[f32], id: f32, l: &mut [u8; QK]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for j in 0..QK {
        let i = nearest_level(id * x[j]);
        l[j] = i as u8;
        let q = f32::from(KVALUES_IQ4NL[i]);
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    (sumqx, sumq2)
}

/// ggml-quants.c `quantize_row_iq4_nl_impl`'s search for one 32-value block of weights
/// `w`: a first scale from the value of largest magnitude, refined by least squares, then
/// (`ntry > 0`) the scales that put that value on level `itry - 127` for `itry` in
/// `-ntry..=ntry`, keeping the one of least weighted error. Returns the scale (0 for a
/// block below 1e-15) and the levels of the first guess.
pub(super) fn iq4_search(x: &[f32], w: &[f32], ntry: i32) -> (f32, [u8; QK]) {
    let (max, amax) = signed_max(x);
    let v0 = f32::from(KVALUES_IQ4NL[0]);
    let mut l = [8u8; QK];
    if amax < 1e-15 {
        return (0.0, l);
    }
    let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
    let (sumqx, sumq2) = iq4_sums(x, w, 1.0 / d, &mut l);
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    let mut scratch = [0u8; QK];
    for itry in -ntry..=ntry {
        let id = (itry + i32::from(KVALUES_IQ4NL[0])) as f32 / max;
        let (sumqx, sumq2) = iq4_sums(x, w, id, &mut scratch);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    (d, l)
}

/// IQ4_NL (18 bytes: `d` @0, nibbles @2) without an importance matrix (weights `x²`): the
/// scale of [`iq4_search`]; with `ntry > 0` the quants are then the levels nearest `x / d`
/// for that scale, else the first guess's.
fn iq4_nl(x: &[f32], b: &mut [u8], ntry: i32) {
    let w: [f32; QK] = std::array::from_fn(|j| x[j] * x[j]);
    let (d, mut l) = iq4_search(x, &w, ntry);
    put_f16(b, 0, d);
    if ntry > 0 {
        let id = inverse(d);
        for (l, &x) in l.iter_mut().zip(x) {
            *l = nearest_level(id * x) as u8;
        }
    }
    four_bit_quants(&l, &mut b[2..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grid types' error bounds on this row: just above the measured error, which is
    /// ggml's own (its quantizers and dequantizers give 3.612, 2.419, 2.317, 2.569, 1.819,
    /// 3.698 and 7.583 on it; IQ1_M without weights is that coarse).
    const GRID_TYPES_BOUND: &[(GgmlType, f32)] = &[
        (GgmlType::IQ2_XXS, 3.7),
        (GgmlType::IQ2_XS, 2.5),
        (GgmlType::IQ2_S, 2.4),
        (GgmlType::IQ3_XXS, 2.6),
        (GgmlType::IQ3_S, 1.9),
        (GgmlType::IQ1_S, 3.75),
        (GgmlType::IQ1_M, 7.6),
    ];

    /// Every type round-trips through [`crate::dequantize`] within its step, and an
    /// all-zero block stays zero.
    #[test]
    fn quantized_rows_decode_near_their_input() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for &ty in QUANTIZABLE {
            let mut q = vec![0u8; x.len() / ty.block_size() * ty.type_size()];
            if NEED_IMATRIX.contains(&ty) {
                quantize_weighted(ty, &x, &[1.0; 256], &mut q).unwrap();
            } else {
                quantize(ty, &x, &mut q).unwrap();
            }
            let mut y = vec![0.0; x.len()];
            crate::dequantize(ty, &q, &mut y).unwrap();
            let err = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let bound = match ty {
                GgmlType::F32 => 0.0,
                GgmlType::F16 | GgmlType::BF16 => 0.03,
                GgmlType::Q8_0 => 0.03,
                GgmlType::Q5_0 => 0.45,
                GgmlType::Q5_1 => 0.25,
                GgmlType::Q2_K => 2.5, // 4 levels over a 16-value sub-block's range
                GgmlType::Q3_K => 1.5,
                // Three levels: half the step of amax = 7.1.
                GgmlType::TQ1_0 | GgmlType::TQ2_0 => 3.6,
                // Levels reach 6 of the exponent's 8: 7.14 becomes 6.
                GgmlType::MXFP4 => 1.2,
                _ if GRID_TYPES_BOUND.iter().any(|(t, _)| *t == ty) => GRID_TYPES_BOUND
                    .iter()
                    .find(|(t, _)| *t == ty)
                    .map_or(0.0, |b| b.1),
                _ => 0.9, // Q4_0 loses the top of the range: 8 levels below, 7 above
            };
            assert!(err <= bound, "{ty}: max error {err} above {bound}");
            let zeros = vec![0.0f32; 256];
            let mut q = vec![0u8; ty.type_size() * 256 / ty.block_size()];
            if NEED_IMATRIX.contains(&ty) {
                quantize_weighted(ty, &zeros, &[1.0; 256], &mut q).unwrap();
            } else {
                quantize_for_cache(ty, &zeros, &mut q).unwrap();
            }
            let mut y = vec![1.0; 256];
            crate::dequantize(ty, &q, &mut y).unwrap();
            assert!(y.iter().all(|&v| v == 0.0), "{ty}: zeros decode to {y:?}");
        }
    }

    /// A KV cache may be handed NaN or infinite values (a model that overflows): the
    /// searched cache quantizers give some block without panicking.
    #[test]
    fn cache_quantizers_survive_non_finite_values() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::IQ4_NL,
            GgmlType::Q8_0,
        ] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX] {
                let mut x: Vec<f32> = (0..64).map(|i| i as f32 - 30.0).collect();
                x[5] = bad;
                x[40] = bad;
                let mut q = vec![0u8; ty.type_size() * 2];
                quantize_for_cache(ty, &x, &mut q).unwrap();
            }
        }
    }

    #[test]
    fn lengths_and_types_are_checked() {
        let mut out = [0u8; 18];
        assert!(matches!(
            quantize(GgmlType::Q4_0, &[0.0; 31], &mut out),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(matches!(
            quantize(GgmlType::Q4_0, &[0.0; 32], &mut out[..17]),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert_eq!(
            quantize(GgmlType::IQ2_XS, &[0.0; 256], &mut [0u8; 74]),
            Err(QuantError::NeedsImatrix(GgmlType::IQ2_XS))
        );
        assert_eq!(
            quantize(GgmlType::Q8_1, &[0.0; 32], &mut [0u8; 36]),
            Err(QuantError::Unsupported(GgmlType::Q8_1))
        );
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80); // tie to even (down)
        assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82); // tie to even (up)
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(bf16_bits(f32::NAN) & 0x7fc0, 0x7fc0);
        assert_eq!(bf16_bits(f32::INFINITY), 0x7f80);
    }
}
