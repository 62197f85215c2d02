//! AVX2 dot kernels (x86-64). Each computes exactly the integers the scalar twin defines
//! (`super::scalar`) and then the same floating-point tail, so results match bit for bit.
//!
//! Techniques follow ggml-cpu/arch/x86/quants.c (`bytes_from_nibbles_32`,
//! `bytes_from_bits_32`, `_mm256_maddubs_epi16` of unsigned weights by signed
//! activations), with two differences for exactness and batch invariance: the offset of
//! Q4_0/Q5_0 is subtracted as a second `maddubs` by the constant instead of ggml's sign
//! trick (which mis-handles a `-128` activation), Q8_0 · Q8_0 widens to i16 before
//! multiplying, and block values are formed in `f32` only after the whole block's integer
//! sum is known.
//!
//! Safety: every `#[target_feature]` function here is reached only through
//! [`avx2_kernel`], which `super::kernel` calls only after `Isa::Avx2.is_available()`
//! (AVX2 and F16C detected at run time). Every memory load reads a fixed-size array
//! reference (`&[u8; 32]` or `&[u8; 16]`), obtained by bounds-checked slicing.

use std::arch::x86_64::*;

use super::{
    block_k, block_k_min, block_min, block_sym, bsum_dot, f16_at, f32_at, k4_min_sum,
    k4_scales_mins, q3k_scales, Lanes, RowFn, RowsFn, TileFn,
};
use crate::GgmlType;

/// The AVX2 kernel for `ty`, if there is one. Callers must have checked
/// `Isa::Avx2.is_available()`.
pub(super) fn avx2_kernel(ty: GgmlType) -> Option<RowFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_0(w, a) }
        },
        T::Q4_1 => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_1(w, a) }
        },
        T::Q5_0 => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_0(w, a) }
        },
        T::Q5_1 => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_1(w, a) }
        },
        T::Q8_0 => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q8_0(w, a) }
        },
        T::Q2_K => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q2_k(w, a) }
        },
        T::Q3_K => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q3_k(w, a) }
        },
        T::Q4_K => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_k(w, a) }
        },
        T::Q5_K => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_k(w, a) }
        },
        T::Q6_K => |w, a| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q6_k(w, a) }
        },
        _ => return None,
    })
}

/// The AVX2 multi-row kernel for `ty` (one weight row against several activation rows),
/// if there is one. Callers must have checked `Isa::Avx2.is_available()`.
pub(super) fn avx2_rows_kernel(ty: GgmlType) -> Option<RowsFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_0_rows(w, a, ab, out) }
        },
        T::Q4_1 => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_1_rows(w, a, ab, out) }
        },
        T::Q5_0 => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_0_rows(w, a, ab, out) }
        },
        T::Q5_1 => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_1_rows(w, a, ab, out) }
        },
        T::Q8_0 => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q8_0_rows(w, a, ab, out) }
        },
        T::Q2_K => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q2_k_rows(w, a, ab, out) }
        },
        T::Q3_K => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q3_k_rows(w, a, ab, out) }
        },
        T::Q4_K => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_k_rows(w, a, ab, out) }
        },
        T::Q5_K => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_k_rows(w, a, ab, out) }
        },
        T::Q6_K => |w, a, ab, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q6_k_rows(w, a, ab, out) }
        },
        _ => return None,
    })
}

/// The AVX2 tile kernel for `ty` (several weight rows against several activation rows),
/// if there is one. Callers must have checked `Isa::Avx2.is_available()`.
pub(super) fn avx2_tile_kernel(ty: GgmlType) -> Option<TileFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => |w, nw, a, na, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_0_tile(w, nw, a, na, out) }
        },
        T::Q4_1 => |w, nw, a, na, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q4_1_tile(w, nw, a, na, out) }
        },
        T::Q5_0 => |w, nw, a, na, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_0_tile(w, nw, a, na, out) }
        },
        T::Q5_1 => |w, nw, a, na, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q5_1_tile(w, nw, a, na, out) }
        },
        T::Q8_0 => |w, nw, a, na, out| {
            // SAFETY: handed out only after AVX2+F16C detection (module doc).
            unsafe { q8_0_tile(w, nw, a, na, out) }
        },
        _ => return None,
    })
}

/// `N` bytes of `s` from `at`, as an array reference (bounds-checked).
#[inline(always)]
fn arr<const N: usize>(s: &[u8], at: usize) -> &[u8; N] {
    s[at..at + N].try_into().expect("length N")
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn load32(b: &[u8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; loadu has no alignment requirement; AVX2 detected.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[target_feature(enable = "avx2,f16c")]
#[inline]
fn load16(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The 32 4-bit values of a legacy block (low nibbles = elements 0..16 in the low lane,
/// high nibbles = elements 16..32 in the high lane), as bytes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn nibbles32(qs: &[u8; 16]) -> __m256i {
    let t = load16(qs);
    let v = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// Byte `i` is 0xFF where bit `i` of `qh` is set, else 0 (ggml's `bytes_from_bits_32`).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn bits32(qh: u32) -> __m256i {
    let x = _mm256_set1_epi32(qh as i32);
    let shuf = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let x = _mm256_shuffle_epi8(x, shuf);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(x, others), _mm256_set1_epi64x(-1))
}

/// `sum u * y` of unsigned bytes `u` (each < 64) by signed bytes `y`, in eight i32 lanes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn dot_u8i8(u: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
}

/// `sum (u - c) * y` in eight i32 lanes, `u < 32`, `c` in 8 or 16: both `maddubs` pair
/// sums stay far inside i16, so their difference is exact.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn dot_u8i8_off(u: __m256i, c: i8, y: __m256i) -> __m256i {
    let p = _mm256_sub_epi16(
        _mm256_maddubs_epi16(u, y),
        _mm256_maddubs_epi16(_mm256_set1_epi8(c), y),
    );
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// The sum of the eight i32 lanes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Lane `i` of the result is the sum of the eight lanes of `v[i]` (exact in i32).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn hsum8x8(v: &[__m256i; 8]) -> __m256i {
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s45 = _mm256_hadd_epi32(v[4], v[5]);
    let s67 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit half: [v0, v1, v2, v3] partial sums (low half: elements 0..4 of each,
    // high half: elements 4..8).
    let s0123 = _mm256_hadd_epi32(s01, s23);
    let s4567 = _mm256_hadd_epi32(s45, s67);
    let lo = _mm256_permute2x128_si256::<0x20>(s0123, s4567);
    let hi = _mm256_permute2x128_si256::<0x31>(s0123, s4567);
    _mm256_add_epi32(lo, hi)
}

/// Eight f16 values at byte `at` of eight consecutive `stride`-byte blocks from `s`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16x8(s: &[u8], stride: usize, at: usize) -> __m256 {
    let h = |i: usize| i16::from_le_bytes([s[i * stride + at], s[i * stride + at + 1]]);
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

/// The legacy-format driver, for one weight row and up to four activation rows at a time
/// (`acts` holds `out.len()` rows of `ab` bytes back to back). Groups of eight blocks are
/// decoded once (`$decode`: the 32 weight values as bytes), multiplied with each row
/// (`$prod`: the block's integer sum in eight i32 lanes) and reduced to one vector of
/// eight block sums and one vector of eight lanes per row; the remaining blocks go
/// through the scalar tail. `$min` formats also sum the activation quants for the
/// `block_min` formula (weight min at byte 2). The single-row kernel is the one-row case.
macro_rules! legacy_kernel {
    ($name:ident, $rows:ident, $tile:ident, $wb:expr, $min:expr,
     decode |$w:ident| $decode:expr, prod |$u:ident, $y:ident| $prod:expr) => {
        /// The tile kernel: `n_w` weight rows (`ws`) by `n_a` activation rows (`acts`),
        /// `out[r * n_w + i]`. The activation-only parts of the block values (the
        /// widened scales, and for `$min` the block sums of the quants) are computed once
        /// per activation row instead of once per pair; the values are the same.
        #[target_feature(enable = "avx2,f16c")]
        fn $tile(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
            let decode = |$w: &[u8]| -> __m256i { $decode };
            let prod = |$u: __m256i, $y: __m256i| -> __m256i { $prod };
            let ysum = |y: __m256i| dot_u8i8(_mm256_set1_epi8(1), y);
            let (wrb, ab) = (ws.len() / n_w.max(1), acts.len() / n_a.max(1));
            let nb = (wrb / $wb).min(ab / 34);
            let groups = nb / 8;
            let tail = nb - 8 * groups;
            // Per activation row: per group the eight scales and (for `$min`) the eight
            // block sums as f32; per tail block the block sum.
            let mut dxs = Vec::with_capacity(n_a * groups);
            let mut yss = Vec::with_capacity(if $min { n_a * groups } else { 0 });
            let mut ys_tail = Vec::with_capacity(if $min { n_a * tail } else { 0 });
            for a in acts.chunks_exact(ab.max(1)).take(n_a) {
                for g in 0..groups {
                    let a = &a[g * 8 * 34..][..8 * 34];
                    dxs.push(f16x8(a, 34, 0));
                    if $min {
                        let ys: [__m256i; 8] =
                            std::array::from_fn(|i| ysum(load32(arr(a, i * 34 + 2))));
                        yss.push(_mm256_cvtepi32_ps(hsum8x8(&ys)));
                    }
                }
                if $min {
                    for b in groups * 8..nb {
                        ys_tail.push(hsum(ysum(load32(arr(a, b * 34 + 2)))));
                    }
                }
            }
            for r0 in (0..n_a).step_by(8) {
                let nr = (n_a - r0).min(8);
                for i in 0..n_w {
                    let w = &ws[i * wrb..][..wrb];
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for g in 0..groups {
                        let wg = &w[g * 8 * $wb..][..8 * $wb];
                        let u: [__m256i; 8] =
                            std::array::from_fn(|k| decode(&wg[k * $wb..][..$wb]));
                        let dw = f16x8(wg, $wb, 0);
                        let mw = if $min { f16x8(wg, $wb, 2) } else { dw };
                        for (j, acc) in acc.iter_mut().enumerate().take(nr) {
                            let r = r0 + j;
                            let a = &acts[r * ab + g * 8 * 34..][..8 * 34];
                            let v: [__m256i; 8] =
                                std::array::from_fn(|k| prod(u[k], load32(arr(a, k * 34 + 2))));
                            let isum = _mm256_cvtepi32_ps(hsum8x8(&v));
                            let dx = dxs[r * groups + g];
                            let mut val = _mm256_mul_ps(_mm256_mul_ps(dw, dx), isum);
                            if $min {
                                let m = _mm256_mul_ps(_mm256_mul_ps(mw, dx), yss[r * groups + g]);
                                val = _mm256_add_ps(val, m);
                            }
                            *acc = _mm256_add_ps(*acc, val);
                        }
                    }
                    for (j, acc) in acc.iter().enumerate().take(nr) {
                        let r = r0 + j;
                        let mut lanes = Lanes::default();
                        // SAFETY: `lanes.0` is 8 f32s; storeu has no alignment requirement.
                        unsafe { _mm256_storeu_ps(lanes.0.as_mut_ptr(), *acc) };
                        for (t, b) in (groups * 8..nb).enumerate() {
                            let (wb, a) = (&w[b * $wb..][..$wb], &acts[r * ab + b * 34..][..34]);
                            let isum = hsum(prod(decode(wb), load32(arr(a, 2))));
                            let v = if $min {
                                let ys = ys_tail[r * tail + t];
                                block_min(f16_at(wb, 0), f16_at(a, 0), isum, f16_at(wb, 2), ys)
                            } else {
                                block_sym(f16_at(wb, 0), f16_at(a, 0), isum)
                            };
                            lanes.add(b, v);
                        }
                        out[r * n_w + i] = lanes.finish();
                    }
                }
            }
        }

        #[target_feature(enable = "avx2,f16c")]
        fn $rows(w: &[u8], acts: &[u8], ab: usize, out: &mut [f32]) {
            let decode = |$w: &[u8]| -> __m256i { $decode };
            let prod = |$u: __m256i, $y: __m256i| -> __m256i { $prod };
            let ysum = |y: __m256i| dot_u8i8(_mm256_set1_epi8(1), y);
            let nb = (w.len() / $wb).min(ab / 34);
            let groups = nb / 8;
            for (acts, out) in acts.chunks(4 * ab).zip(out.chunks_mut(4)) {
                let nr = out.len().min(acts.len() / ab.max(1));
                let mut acc = [_mm256_setzero_ps(); 4];
                for g in 0..groups {
                    let wg = &w[g * 8 * $wb..][..8 * $wb];
                    let u: [__m256i; 8] = std::array::from_fn(|i| decode(&wg[i * $wb..][..$wb]));
                    let dw = f16x8(wg, $wb, 0);
                    for (r, acc) in acc.iter_mut().enumerate().take(nr) {
                        let a = &acts[r * ab + g * 8 * 34..][..8 * 34];
                        let v: [__m256i; 8] =
                            std::array::from_fn(|i| prod(u[i], load32(arr(a, i * 34 + 2))));
                        let isum = _mm256_cvtepi32_ps(hsum8x8(&v));
                        let dx = f16x8(a, 34, 0);
                        let mut val = _mm256_mul_ps(_mm256_mul_ps(dw, dx), isum);
                        if $min {
                            let ys: [__m256i; 8] =
                                std::array::from_fn(|i| ysum(load32(arr(a, i * 34 + 2))));
                            let ys = _mm256_cvtepi32_ps(hsum8x8(&ys));
                            let m = _mm256_mul_ps(_mm256_mul_ps(f16x8(wg, $wb, 2), dx), ys);
                            val = _mm256_add_ps(val, m);
                        }
                        *acc = _mm256_add_ps(*acc, val);
                    }
                }
                for (r, out) in out.iter_mut().enumerate().take(nr) {
                    let mut lanes = Lanes::default();
                    // SAFETY: `lanes.0` is 8 f32s; storeu has no alignment requirement.
                    unsafe { _mm256_storeu_ps(lanes.0.as_mut_ptr(), acc[r]) };
                    for b in groups * 8..nb {
                        let (w, a) = (&w[b * $wb..][..$wb], &acts[r * ab + b * 34..][..34]);
                        let y = load32(arr(a, 2));
                        let isum = hsum(prod(decode(w), y));
                        let v = if $min {
                            let ys = hsum(ysum(y));
                            block_min(f16_at(w, 0), f16_at(a, 0), isum, f16_at(w, 2), ys)
                        } else {
                            block_sym(f16_at(w, 0), f16_at(a, 0), isum)
                        };
                        lanes.add(b, v);
                    }
                    *out = lanes.finish();
                }
            }
        }

        #[target_feature(enable = "avx2,f16c")]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            let mut out = [0f32];
            $rows(w, a, a.len(), &mut out);
            out[0]
        }
    };
}

legacy_kernel!(
    q4_0,
    q4_0_rows,
    q4_0_tile,
    18,
    false,
    decode | w | nibbles32(arr(w, 2)),
    prod | u,
    y | dot_u8i8_off(u, 8, y)
);

legacy_kernel!(
    q4_1,
    q4_1_rows,
    q4_1_tile,
    20,
    true,
    decode | w | nibbles32(arr(w, 4)),
    prod | u,
    y | dot_u8i8(u, y)
);

legacy_kernel!(
    q5_0,
    q5_0_rows,
    q5_0_tile,
    22,
    false,
    decode | w | {
        let qh = u32::from_le_bytes(*arr(w, 2));
        let high = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(arr(w, 6)), high)
    },
    prod | u,
    y | dot_u8i8_off(u, 16, y)
);

legacy_kernel!(
    q5_1,
    q5_1_rows,
    q5_1_tile,
    24,
    true,
    decode | w | {
        let qh = u32::from_le_bytes(*arr(w, 4));
        let high = _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(arr(w, 8)), high)
    },
    prod | u,
    y | dot_u8i8(u, y)
);

legacy_kernel!(
    q8_0,
    q8_0_rows,
    q8_0_tile,
    34,
    false,
    decode | w | load32(arr(w, 2)),
    prod | x,
    y | {
        let xl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
        let xh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(x));
        let yl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(y));
        let yh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(y));
        _mm256_add_epi32(_mm256_madd_epi16(xl, yl), _mm256_madd_epi16(xh, yh))
    }
);

/// Shift each 16-bit lane right by `n` (a run-time count).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn srl16(v: __m256i, n: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}

/// `(u · y) * scale` where the low 16 bytes (values `l < 16`) use `s_lo`, the high use
/// `s_hi`; i16 pair sums times i16 scales are exact in i32.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn scaled2(u: __m256i, y: __m256i, s_lo: i32, s_hi: i32) -> __m256i {
    let sc = _mm256_set_m128i(_mm_set1_epi16(s_hi as i16), _mm_set1_epi16(s_lo as i16));
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), sc)
}

/// A decoded K-quant super-block: eight 32-value chunks as unsigned bytes `u`, an i16
/// scale vector per chunk (`sc`: low half for values 0..16, high half for 16..32), the
/// i16 coefficients `corr` of the 16 activation bsums (the mins, or the offset times the
/// scale), and the two f16 scales widened.
struct KBlock {
    u: [__m256i; 8],
    sc: [__m256i; 8],
    corr: __m256i,
    d: f32,
    dmin: f32,
}

/// An i16 scale vector: `lo` for the low 16 values of a chunk, `hi` for the high 16.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn scale2(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// Sixteen i32 coefficients as an i16 vector (every caller's values fit in i16).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn coeffs(c: &[i32; 16]) -> __m256i {
    let c: [i16; 16] = c.map(|v| v as i16);
    // SAFETY: `c` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
}

/// The K-quant driver, for one weight row and up to eight activation rows at a time
/// (`acts` holds `out.len()` rows of `ab` bytes back to back). Each super-block is
/// decoded once (`$decode` gives a [`KBlock`]); for each row, `sumi` = the scaled
/// integer sum over the eight chunks and `c` = `sum_i corr_i * bsums_i` (both exact),
/// and the block value is `block_k_min(dx, d, dmin, sumi, c)` for the formats with mins
/// (`$min`), else `block_k(dx, d, sumi - c)`: the scalar twin's integers and formula.
/// The single-row kernels below fuse decoding and multiplying instead (faster for one
/// row) but compute the same integers and formula.
macro_rules! k_kernel {
    ($rows:ident, $wb:expr, $min:expr, decode |$w:ident| $decode:expr) => {
        #[target_feature(enable = "avx2,f16c")]
        fn $rows(w: &[u8], acts: &[u8], ab: usize, out: &mut [f32]) {
            let decode = |$w: &[u8]| -> KBlock { $decode };
            let nb = (w.len() / $wb).min(ab / 292);
            for (acts, out) in acts.chunks(8 * ab).zip(out.chunks_mut(8)) {
                let nr = out.len().min(acts.len() / ab.max(1));
                let mut lanes = [Lanes::default(); 8];
                for b in 0..nb {
                    let k = decode(&w[b * $wb..][..$wb]);
                    for (r, lanes) in lanes.iter_mut().enumerate().take(nr) {
                        let a = &acts[r * ab + b * 292..][..292];
                        let mut acc = _mm256_setzero_si256();
                        for c in 0..8 {
                            let y = load32(arr(a, 4 + 32 * c));
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(k.u[c], y), k.sc[c]);
                            acc = _mm256_add_epi32(acc, p);
                        }
                        let sumi = hsum(acc);
                        let c = hsum(_mm256_madd_epi16(load32(arr(a, 260)), k.corr));
                        let v = if $min {
                            block_k_min(f32_at(a, 0), k.d, k.dmin, sumi, c)
                        } else {
                            block_k(f32_at(a, 0), k.d, sumi - c)
                        };
                        lanes.add(b, v);
                    }
                }
                for (o, l) in out.iter_mut().zip(&lanes).take(nr) {
                    *o = l.finish();
                }
            }
        }
    };
}

k_kernel!(
    q4_k_rows,
    144,
    true,
    decode | w | {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let mut u = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let q = load32(arr(w, 16 + 32 * j));
            u[2 * j] = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
            u[2 * j + 1] = _mm256_and_si256(srl16(q, 4), _mm256_set1_epi8(0x0F));
        }
        KBlock {
            u,
            sc: std::array::from_fn(|c| scale2(i32::from(sc[c]), i32::from(sc[c]))),
            corr: coeffs(&std::array::from_fn(|i| i32::from(m[i / 2]))),
            d: f16_at(w, 0),
            dmin: f16_at(w, 2),
        }
    }
);

k_kernel!(
    q5_k_rows,
    176,
    true,
    decode | w | {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let qh = load32(arr(w, 16));
        let one = _mm256_set1_epi8(1);
        let mut u = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let q = load32(arr(w, 48 + 32 * j));
            let hb0 = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(qh, 2 * j), one));
            let hb1 = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(qh, 2 * j + 1), one));
            u[2 * j] = _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi8(0x0F)), hb0);
            u[2 * j + 1] =
                _mm256_or_si256(_mm256_and_si256(srl16(q, 4), _mm256_set1_epi8(0x0F)), hb1);
        }
        KBlock {
            u,
            sc: std::array::from_fn(|c| scale2(i32::from(sc[c]), i32::from(sc[c]))),
            corr: coeffs(&std::array::from_fn(|i| i32::from(m[i / 2]))),
            d: f16_at(w, 0),
            dmin: f16_at(w, 2),
        }
    }
);

k_kernel!(
    q6_k_rows,
    210,
    false,
    decode | w | {
        let sc: [i32; 16] = std::array::from_fn(|i| i32::from(w[192 + i] as i8));
        let mut u = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let qh = load32(arr(w, 128 + 32 * n));
            let ql0 = load32(arr(w, 64 * n));
            let ql1 = load32(arr(w, 64 * n + 32));
            for k in 0..4 {
                let src = if k % 2 == 0 { ql0 } else { ql1 };
                let low = _mm256_and_si256(srl16(src, 4 * (k / 2)), _mm256_set1_epi8(0x0F));
                let high =
                    _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(qh, 2 * k), _mm256_set1_epi8(3)));
                u[4 * n + k] = _mm256_or_si256(low, high);
            }
        }
        KBlock {
            u,
            sc: std::array::from_fn(|c| scale2(sc[2 * c], sc[2 * c + 1])),
            corr: coeffs(&sc.map(|s| 32 * s)),
            d: f16_at(w, 208),
            dmin: 0.0,
        }
    }
);

k_kernel!(
    q2_k_rows,
    84,
    true,
    decode | w | {
        let scales = &w[0..16];
        let mut u = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let q = load32(arr(w, 16 + 32 * n));
            for k in 0..4 {
                u[4 * n + k] = _mm256_and_si256(srl16(q, 2 * k), _mm256_set1_epi8(3));
            }
        }
        let sc = |g: usize| i32::from(scales[g] & 15);
        KBlock {
            u,
            sc: std::array::from_fn(|c| scale2(sc(2 * c), sc(2 * c + 1))),
            corr: coeffs(&std::array::from_fn(|i| i32::from(scales[i] >> 4))),
            d: f16_at(w, 80),
            dmin: f16_at(w, 82),
        }
    }
);

k_kernel!(
    q3_k_rows,
    110,
    false,
    decode | w | {
        let s = q3k_scales(&w[96..108]);
        let hm = load32(arr(w, 0));
        let mut u = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let q = load32(arr(w, 32 + 32 * n));
            for k in 0..4 {
                let low = _mm256_and_si256(srl16(q, 2 * k), _mm256_set1_epi8(3));
                let hb = _mm256_slli_epi16::<2>(_mm256_and_si256(
                    srl16(hm, 4 * n + k),
                    _mm256_set1_epi8(1),
                ));
                u[4 * n + k] = _mm256_or_si256(low, hb);
            }
        }
        KBlock {
            u,
            sc: std::array::from_fn(|c| scale2(s[2 * c], s[2 * c + 1])),
            corr: coeffs(&s.map(|s| 4 * s)),
            d: f16_at(w, 108),
            dmin: 0.0,
        }
    }
);

/// The super-block driver of the K-quants: `f` returns the block's value from its
/// weight and activation bytes.
#[inline(always)]
fn k_blocks(w: &[u8], wb: usize, a: &[u8], f: impl Fn(&[u8], &[u8]) -> f32) -> f32 {
    let mut lanes = Lanes::default();
    for (b, (w, a)) in w.chunks_exact(wb).zip(a.chunks_exact(292)).enumerate() {
        lanes.add(b, f(w, a));
    }
    lanes.finish()
}

#[target_feature(enable = "avx2,f16c")]
fn q4_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 144, a, |w, a| {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let q = load32(arr(w, 16 + 32 * j));
            let lo = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
            let hi = _mm256_and_si256(srl16(q, 4), _mm256_set1_epi8(0x0F));
            let (s0, s1) = (i32::from(sc[2 * j]), i32::from(sc[2 * j + 1]));
            acc = _mm256_add_epi32(acc, scaled2(lo, load32(arr(a, 4 + 64 * j)), s0, s0));
            acc = _mm256_add_epi32(acc, scaled2(hi, load32(arr(a, 36 + 64 * j)), s1, s1));
        }
        let summ = k4_min_sum(&m, a);
        block_k_min(f32_at(a, 0), f16_at(w, 0), f16_at(w, 2), hsum(acc), summ)
    })
}

#[target_feature(enable = "avx2,f16c")]
fn q5_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 176, a, |w, a| {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let qh = load32(arr(w, 16));
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let q = load32(arr(w, 48 + 32 * j));
            let hb0 = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(qh, 2 * j), one));
            let hb1 = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(qh, 2 * j + 1), one));
            let lo = _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi8(0x0F)), hb0);
            let hi = _mm256_or_si256(_mm256_and_si256(srl16(q, 4), _mm256_set1_epi8(0x0F)), hb1);
            let (s0, s1) = (i32::from(sc[2 * j]), i32::from(sc[2 * j + 1]));
            acc = _mm256_add_epi32(acc, scaled2(lo, load32(arr(a, 4 + 64 * j)), s0, s0));
            acc = _mm256_add_epi32(acc, scaled2(hi, load32(arr(a, 36 + 64 * j)), s1, s1));
        }
        let summ = k4_min_sum(&m, a);
        block_k_min(f32_at(a, 0), f16_at(w, 0), f16_at(w, 2), hsum(acc), summ)
    })
}

#[target_feature(enable = "avx2,f16c")]
fn q6_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 210, a, |w, a| {
        let sc: [i32; 16] = std::array::from_fn(|i| i32::from(w[192 + i] as i8));
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_si256();
        for n in 0..2 {
            let qh = load32(arr(w, 128 + 32 * n));
            let ql0 = load32(arr(w, 64 * n));
            let ql1 = load32(arr(w, 64 * n + 32));
            for k in 0..4 {
                let src = if k % 2 == 0 { ql0 } else { ql1 };
                let low = _mm256_and_si256(srl16(src, 4 * (k / 2)), m4);
                let high = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(qh, 2 * k), m2));
                let u = _mm256_or_si256(low, high);
                let y = load32(arr(a, 4 + 128 * n + 32 * k));
                let g = 8 * n + 2 * k;
                acc = _mm256_add_epi32(acc, scaled2(u, y, sc[g], sc[g + 1]));
            }
        }
        let sumi = hsum(acc) - 32 * bsum_dot(&sc, a);
        block_k(f32_at(a, 0), f16_at(w, 208), sumi)
    })
}

#[target_feature(enable = "avx2,f16c")]
fn q2_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 84, a, |w, a| {
        let scales = &w[0..16];
        let m2 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_si256();
        for n in 0..2 {
            let q = load32(arr(w, 16 + 32 * n));
            for k in 0..4 {
                let u = _mm256_and_si256(srl16(q, 2 * k), m2);
                let y = load32(arr(a, 4 + 128 * n + 32 * k));
                let g = 8 * n + 2 * k;
                let (s0, s1) = (i32::from(scales[g] & 15), i32::from(scales[g + 1] & 15));
                acc = _mm256_add_epi32(acc, scaled2(u, y, s0, s1));
            }
        }
        let mins: [i32; 16] = std::array::from_fn(|i| i32::from(scales[i] >> 4));
        let summ = bsum_dot(&mins, a);
        block_k_min(f32_at(a, 0), f16_at(w, 80), f16_at(w, 82), hsum(acc), summ)
    })
}

#[target_feature(enable = "avx2,f16c")]
fn q3_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 110, a, |w, a| {
        let s = q3k_scales(&w[96..108]);
        let hm = load32(arr(w, 0));
        let m2 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_si256();
        for n in 0..2 {
            let q = load32(arr(w, 32 + 32 * n));
            for k in 0..4 {
                let low = _mm256_and_si256(srl16(q, 2 * k), m2);
                let hb = _mm256_slli_epi16::<2>(_mm256_and_si256(srl16(hm, 4 * n + k), one));
                let u = _mm256_or_si256(low, hb);
                let y = load32(arr(a, 4 + 128 * n + 32 * k));
                let g = 8 * n + 2 * k;
                acc = _mm256_add_epi32(acc, scaled2(u, y, s[g], s[g + 1]));
            }
        }
        let sumi = hsum(acc) - 4 * bsum_dot(&s, a);
        block_k(f32_at(a, 0), f16_at(w, 108), sumi)
    })
}
