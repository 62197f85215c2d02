//! Activation quantizers, bit-exact with ggml's reference quantizers.
//!
//! | output | bytes per block | layout | ggml source (ggml/src/ggml-quants.c) |
//! |---|---|---|---|
//! | Q8_0 | 34 per 32 values | `d: f16` @0, `qs: [i8; 32]` @2 | `quantize_row_q8_0_ref` |
//! | Q8_1 | 36 per 32 values | `d: f16` @0, `s: f16` @2, `qs: [i8; 32]` @4 | `quantize_row_q8_1_ref` |
//! | Q8_K | 292 per 256 values | `d: f32` @0, `qs: [i8; 256]` @4, `bsums: [i16; 16]` @260 | `quantize_row_q8_K_ref` |
//!
//! The rules, with every operation in `f32` in ggml's order:
//! - Q8_0 / Q8_1: `amax = max |x|` over the block, `d = amax / 127`, `id = d != 0 ? 1 / d : 0`
//!   (from the *unrounded* `d`), `qs = roundf(x * id)` (round half away from zero: Rust's
//!   `f32::round`), stored `d` is `d` rounded to f16 (round to nearest even). Q8_1 also
//!   stores `s = f16(d * sum(qs))`.
//! - Q8_K: `max` is the signed value of largest magnitude (the first one on ties); an
//!   all-zero block stores `d = 0` and zero quants; otherwise `iscale = -127 / max`,
//!   `qs = min(127, nearest_int(iscale * x))` where `nearest_int` rounds half to even
//!   (ggml's `+ 12582912.f` trick), `bsums[j] = sum(qs[16 j..16 j + 16])`, `d = 1 / iscale`.
//!
//! ggml's own run-time x86 quantizer (ggml-cpu/arch/x86/quants.c `quantize_row_q8_0`,
//! AVX2 path) is not the reference one: it multiplies by `127 / amax` and rounds ties to
//! even (`_mm256_round_ps(.., _MM_ROUND_NEAREST)`), so llama.cpp's activations can differ
//! from these (and from `_ref`) in the last quant on rare ties.
//!
//! Inputs are expected to be finite; NaN or infinite activations give unspecified (but
//! memory-safe) quants, as in ggml.

use half::f16;

use super::DotError;
use crate::{GgmlType, QK_K};

/// ggml's `nearest_int` (ggml-quants.c): round to nearest, ties to even, for
/// `|v| <= 4194303`; computed with the same float trick so the bits agree.
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `roundf(v)` (round half away from zero) as an integer, for `|v| < 2^31`, without a
/// libm call: truncate, then step away from zero when the exact remainder is at least
/// one half (the remainder `v - trunc(v)` is exact for every f32 in range).
#[inline(always)]
fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let r = v - t as f32;
    t + i32::from(r >= 0.5) - i32::from(r <= -0.5)
}

/// `max |x|`, as ggml's sequential `amax = MAX(amax, fabsf(v))` from 0 gives it for
/// finite inputs (the maximum of a set does not depend on the order, so eight
/// independent running maxima, which the compiler vectorizes, give the same value).
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    let mut m = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in m.iter_mut().zip(c) {
            let a = v.abs();
            *m = if *m > a { *m } else { a };
        }
    }
    for (m, &v) in m.iter_mut().zip(rest) {
        let a = v.abs();
        *m = if *m > a { *m } else { a };
    }
    m.into_iter()
        .fold(0.0, |acc, v| if acc > v { acc } else { v })
}

/// The scale `d`, its reciprocal `id` and the 32 quants of one Q8_0/Q8_1 block.
#[inline(always)]
fn q8_block(x: &[f32]) -> (f32, [i8; 32]) {
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_away(v * id) as i8;
    }
    (d, qs)
}

fn check(x: &[f32], out: &[u8], ty: GgmlType) -> Result<usize, DotError> {
    let (n, bytes) = (ty.block_size(), ty.type_size());
    if !x.len().is_multiple_of(n) || out.len() != x.len() / n * bytes {
        return Err(DotError::Quantize {
            ty,
            x_len: x.len(),
            out_len: out.len(),
        });
    }
    Ok(x.len() / n)
}

/// Quantizes `x` to Q8_0 blocks (34 bytes per 32 values) in `out`, bit-exact with ggml's
/// `quantize_row_q8_0_ref`. AVX2 where available ([`quantize_row_q8_0_scalar`] is the
/// twin).
///
/// # Errors
/// [`DotError::Quantize`] unless `x.len()` is a multiple of 32 and `out.len()` is
/// `x.len() / 32 * 34`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_q8::<false>(x, out, true)
}

/// [`quantize_row_q8_0`] compiled for the baseline ISA.
///
/// # Errors
/// As [`quantize_row_q8_0`].
pub fn quantize_row_q8_0_scalar(x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_q8::<false>(x, out, false)
}

/// Quantizes `x` to Q8_1 blocks (36 bytes per 32 values) in `out`, bit-exact with ggml's
/// `quantize_row_q8_1_ref`. Its `d` and `qs` equal Q8_0's for the same input. AVX2 where
/// available ([`quantize_row_q8_1_scalar`] is the twin).
///
/// # Errors
/// [`DotError::Quantize`] unless `x.len()` is a multiple of 32 and `out.len()` is
/// `x.len() / 32 * 36`.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_q8::<true>(x, out, true)
}

/// [`quantize_row_q8_1`] compiled for the baseline ISA.
///
/// # Errors
/// As [`quantize_row_q8_1`].
pub fn quantize_row_q8_1_scalar(x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_q8::<true>(x, out, false)
}

/// Q8_0 (`SUM` false) or Q8_1 (`SUM` true) after the length check, on AVX2 when `simd`
/// and the CPU has it.
fn quantize_q8<const SUM: bool>(x: &[f32], out: &mut [u8], simd: bool) -> Result<(), DotError> {
    check(x, out, if SUM { GgmlType::Q8_1 } else { GgmlType::Q8_0 })?;
    #[cfg(target_arch = "x86_64")]
    if simd && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above).
        #[allow(unsafe_code)]
        unsafe {
            q8_rows_avx2::<SUM>(x, out)
        };
        return Ok(());
    }
    let _ = simd;
    q8_rows::<SUM>(x, out, q8_block);
    Ok(())
}

/// The Q8_0 (`SUM` false) or Q8_1 (`SUM` true) blocks of `x` into `out` (lengths checked
/// by the caller), each block's `(d, qs)` from `block`.
#[inline(always)]
fn q8_rows<const SUM: bool>(x: &[f32], out: &mut [u8], block: impl Fn(&[f32]) -> (f32, [i8; 32])) {
    let bytes = if SUM { 36 } else { 34 };
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(bytes)) {
        let (d, qs) = block(x);
        b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        if SUM {
            let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
            b[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_le_bytes());
        }
        for (o, q) in b[bytes - 32..].iter_mut().zip(qs) {
            *o = q as u8;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn q8_rows_avx2<const SUM: bool>(x: &[f32], out: &mut [u8]) {
    q8_rows::<SUM>(x, out, |x| {
        // SAFETY: this function runs only with AVX2 (its target feature).
        #[allow(unsafe_code)]
        unsafe {
            q8_block_avx2(x)
        }
    })
}

/// The largest of the eight lanes of `m` (the quantizers' `amax`: a maximum does not
/// depend on the order).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn hmax_avx2(m: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
}

/// [`q8_block`] on AVX2: the same `amax` (a maximum does not depend on the order), `d`,
/// `id`, and per value the same truncate-then-step-away rounding as `round_away`.
///
/// # Safety
/// AVX2 available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
unsafe fn q8_block_avx2(x: &[f32]) -> (f32, [i8; 32]) {
    use std::arch::x86_64::*;
    let x: &[f32; 32] = x.try_into().expect("a block of 32 values");
    // SAFETY: `x` is 32 floats: four loads of eight.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for vi in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
    }
    let amax = hmax_avx2(m);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (idv, half) = (_mm256_set1_ps(id), _mm256_set1_ps(0.5));
    let q: [__m256i; 4] = std::array::from_fn(|i| {
        let s = _mm256_mul_ps(v[i], idv);
        let t = _mm256_cvttps_epi32(s);
        let r = _mm256_sub_ps(s, _mm256_cvtepi32_ps(t));
        // Comparison masks are -1 where true: t + [r >= 0.5] - [r <= -0.5].
        let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(r, half));
        let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(
            r,
            _mm256_sub_ps(_mm256_setzero_ps(), half),
        ));
        _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
    });
    // i32 -> i8 (every quant is within ±127), then the dwords back in order.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut qs = [0i8; 32];
    // SAFETY: `qs` is 32 bytes.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), w) };
    (d, qs)
}

/// Quantizes `x` to Q8_K blocks (292 bytes per 256 values) in `out`, bit-exact with
/// ggml's `quantize_row_q8_K_ref` (including `bsums`; an all-zero block gets zero bsums,
/// which ggml leaves unwritten). AVX2 where available ([`quantize_row_q8_k_scalar`] is the
/// twin).
///
/// # Errors
/// [`DotError::Quantize`] unless `x.len()` is a multiple of 256 and `out.len()` is
/// `x.len() / 256 * 292`.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_q8_k(x, out, true)
}

/// [`quantize_row_q8_k`] compiled for the baseline ISA.
///
/// # Errors
/// As [`quantize_row_q8_k`].
pub fn quantize_row_q8_k_scalar(x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_q8_k(x, out, false)
}

/// Q8_K after the length check, on AVX2 when `simd` and the CPU has it.
fn quantize_q8_k(x: &[f32], out: &mut [u8], simd: bool) -> Result<(), DotError> {
    check(x, out, GgmlType::Q8_K)?;
    #[cfg(target_arch = "x86_64")]
    if simd && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above).
        #[allow(unsafe_code)]
        unsafe {
            q8_k_rows_avx2(x, out)
        };
        return Ok(());
    }
    let _ = simd;
    q8_k_rows(x, out, q8_k_block);
    Ok(())
}

/// The Q8_K blocks of `x` into `out` (lengths checked by the caller), each by `block`.
#[inline(always)]
fn q8_k_rows(x: &[f32], out: &mut [u8], block: impl Fn(&[f32; QK_K], &mut [u8; 292])) {
    for (x, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(292)) {
        block(
            x.try_into().expect("a block of 256 values"),
            b.try_into().expect("a block of 292 bytes"),
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn q8_k_rows_avx2(x: &[f32], out: &mut [u8]) {
    q8_k_rows(x, out, |x, b| {
        // SAFETY: this function runs only with AVX2 (its target feature).
        #[allow(unsafe_code)]
        unsafe {
            q8_k_block_avx2(x, b)
        }
    })
}

/// One Q8_K block: ggml's `quantize_row_q8_K_ref` for 256 values.
#[inline(always)]
fn q8_k_block(x: &[f32; QK_K], b: &mut [u8; 292]) {
    // ggml keeps the first value of the largest magnitude (`if (ax > amax)`).
    let amax = abs_max(x);
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    b.fill(0);
    if amax == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    for (o, &v) in b[4..260].iter_mut().zip(x) {
        *o = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let s: i32 = b[4 + 16 * j..][..16]
            .iter()
            .map(|&q| i32::from(q as i8))
            .sum();
        b[260 + 2 * j..][..2].copy_from_slice(&(s as i16).to_le_bytes());
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// [`q8_k_block`] on AVX2: the same `amax` (a maximum does not depend on the order), the
/// same first value of that magnitude, `iscale`, and per value the same `nearest_int`
/// float trick and clamp; each `bsum` is a sum of small integers (exact in any order).
///
/// # Safety
/// AVX2 available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unsafe_code)]
unsafe fn q8_k_block_avx2(x: &[f32; QK_K], b: &mut [u8; 292]) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY (every load below): `x` is 256 floats; vector i covers 8 i .. 8 i + 8.
    let load = |i: usize| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) };
    let mut m = [_mm256_setzero_ps(); 4];
    for i in 0..QK_K / 8 {
        m[i % 4] = _mm256_max_ps(m[i % 4], _mm256_andnot_ps(sign, load(i)));
    }
    let amax = hmax_avx2(_mm256_max_ps(
        _mm256_max_ps(m[0], m[1]),
        _mm256_max_ps(m[2], m[3]),
    ));
    if amax == 0.0 {
        b.fill(0);
        return;
    }
    // The first value whose magnitude is `amax`.
    let am = _mm256_set1_ps(amax);
    let mut max = 0.0;
    for i in 0..QK_K / 8 {
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_andnot_ps(sign, load(i)),
            am,
        ));
        if hit != 0 {
            max = x[8 * i + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0 / max;
    let (isv, magic) = (_mm256_set1_ps(iscale), _mm256_set1_ps(12_582_912.0));
    let (mantissa, bias, top) = (
        _mm256_set1_epi32(0x007f_ffff),
        _mm256_set1_epi32(0x0040_0000),
        _mm256_set1_epi32(127),
    );
    let (flip, zero) = (_mm256_set1_epi8(-128), _mm256_setzero_si256());
    let mut sums = [0u64; 4];
    // 32 values at a time: two groups of 16 (two bsums).
    for c in 0..QK_K / 32 {
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            let t = _mm256_add_ps(_mm256_mul_ps(load(4 * c + k), isv), magic);
            let n = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mantissa), bias);
            _mm256_min_epi32(n, top)
        });
        // i32 -> i8 (every quant is within -128..=127 after the clamp), then the dwords
        // back in order.
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: bytes 4 + 32 c .. 4 + 32 c + 32 are within the 292-byte block.
        unsafe { _mm256_storeu_si256(b.as_mut_ptr().add(4 + 32 * c).cast(), w) };
        // Sums of eight bytes each, as unsigned (q + 128), less 8 · 128.
        // SAFETY: `sums` is four u64.
        unsafe {
            _mm256_storeu_si256(
                sums.as_mut_ptr().cast(),
                _mm256_sad_epu8(_mm256_xor_si256(w, flip), zero),
            )
        };
        for g in 0..2 {
            let s = (sums[2 * g] + sums[2 * g + 1]) as i32 - 16 * 128;
            b[260 + 2 * (2 * c + g)..][..2].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// Quantizes `x` into `out` as activation type `act` (Q8_0, Q8_1 or Q8_K): the type
/// [`super::vec_dot_type`] names for a weight type.
///
/// # Errors
/// [`DotError::NoDot`] for any other `act`; otherwise as the quantizer for `act`.
pub fn quantize_activation(act: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    match act {
        GgmlType::Q8_0 => quantize_row_q8_0(x, out),
        GgmlType::Q8_1 => quantize_row_q8_1(x, out),
        GgmlType::Q8_K => quantize_row_q8_k(x, out),
        _ => Err(DotError::NoDot(act)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform values in [-1, 1) from an xorshift generator seeded with `seed`.
    fn xorshift(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    /// `n` values of `rnd` at each of four magnitudes (1e-3, 1, 37, 1e4), in that order.
    fn magnitudes(rnd: &mut impl FnMut() -> f32, n: usize) -> Vec<f32> {
        [1e-3f32, 1.0, 37.0, 1e4]
            .into_iter()
            .flat_map(|scale| (0..n).map(|_| rnd() * scale).collect::<Vec<_>>())
            .collect()
    }

    /// The AVX2 Q8_0 / Q8_1 quantizers give the scalar twins' bytes: random blocks of
    /// several magnitudes, all-zero blocks, and blocks whose scaled values land exactly on
    /// halves (amax 127 makes `id` 1: 2.5 → 3, -3.5 → -4, 0.5 → 1).
    #[test]
    fn q8_simd_matches_scalar() {
        let mut rnd = xorshift(0x1234_5678_9abc_def1);
        let mut x = magnitudes(&mut rnd, 32 * 16);
        x.extend([0.0f32; 32]);
        let mut ties = [0.0f32; 32];
        ties[0] = 127.0;
        for (i, t) in ties.iter_mut().enumerate().skip(1) {
            *t = (i as f32 - 16.0) + 0.5;
        }
        x.extend(ties);
        let n = x.len() / 32;
        for (ty, simd, scalar) in [
            (
                34,
                quantize_row_q8_0 as fn(&[f32], &mut [u8]) -> _,
                quantize_row_q8_0_scalar as fn(&[f32], &mut [u8]) -> _,
            ),
            (36, quantize_row_q8_1, quantize_row_q8_1_scalar),
        ] {
            let (mut a, mut b) = (vec![0u8; n * ty], vec![0u8; n * ty]);
            simd(&x, &mut a).unwrap();
            scalar(&x, &mut b).unwrap();
            assert_eq!(a, b, "{ty}-byte blocks");
            // The tie block: 2.5 (ties[18]) rounds away to 3.
            assert_eq!(a[(n - 1) * ty + ty - 32 + 18] as i8, 3);
        }
    }

    /// The AVX2 Q8_K quantizer gives the scalar twin's bytes (scale, quants and bsums):
    /// blocks of several magnitudes, an all-zero block, a block whose largest magnitude
    /// comes first as a positive and later as a negative value (the first one is `max`),
    /// and a block of exact halves under `iscale` 1 (ties to even: 2.5 → 2).
    #[test]
    fn q8_k_simd_matches_scalar() {
        let mut rnd = xorshift(0x0bad_cafe_1234_5679);
        let mut x = magnitudes(&mut rnd, QK_K * 3);
        x.extend([0.0f32; QK_K]);
        let mut signs: Vec<f32> = (0..QK_K).map(|_| rnd()).collect();
        signs[40] = 5.0;
        signs[200] = -5.0;
        x.extend(signs);
        // max -127 → iscale 1: values land on halves.
        let mut ties: Vec<f32> = (0..QK_K).map(|i| (i % 200) as f32 * 0.5 - 50.0).collect();
        ties[0] = -127.0;
        x.extend(ties);
        let n = x.len() / QK_K;
        let (mut a, mut b) = (vec![0u8; n * 292], vec![0u8; n * 292]);
        quantize_row_q8_k(&x, &mut a).unwrap();
        quantize_row_q8_k_scalar(&x, &mut b).unwrap();
        for (i, (a, b)) in a.chunks_exact(292).zip(b.chunks_exact(292)).enumerate() {
            assert_eq!(a, b, "block {i}");
        }
        // The sign block's scale is -5 / 127 (the positive 5 came first: d = 1 / (-127 / 5)).
        let d = |blk: usize| f32::from_le_bytes(a[blk * 292..][..4].try_into().unwrap());
        assert_eq!(d(n - 2), 1.0 / (-127.0 / 5.0));
        // The tie block: value 2.5 (index 105) times iscale 1 rounds to even, 2.
        assert_eq!(a[(n - 1) * 292 + 4 + 105] as i8, 2);
    }

    /// `round_away` equals `f32::round` (C's `roundf`) on a dense sample of every f32
    /// with magnitude up to 2^20, and on the halfway cases.
    #[test]
    fn round_away_is_roundf() {
        let limit = (1u32 << 20) as f32;
        let mut n = 0;
        for bits in (0..0x7f80_0000u32).step_by(61) {
            for v in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if v.abs() > limit {
                    continue;
                }
                assert_eq!(
                    round_away(v),
                    v.round() as i32,
                    "{v:e} ({:#x})",
                    v.to_bits()
                );
                n += 1;
            }
        }
        assert!(n > 10_000_000);
        for k in -300..300 {
            let v = k as f32 + 0.5;
            assert_eq!(round_away(v), v.round() as i32, "{v}");
            let below = f32::from_bits(v.to_bits() - 1);
            assert_eq!(round_away(below), below.round() as i32, "{below}");
        }
    }

    #[test]
    fn nearest_int_is_round_half_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (126.5, 126),
            (-127.0, -127),
            (0.49999997, 0),
            (3.7, 4),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
            assert_eq!(v.round_ties_even() as i32, want, "{v}");
        }
    }
}
