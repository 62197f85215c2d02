//! NEON dot kernels (aarch64). Each computes exactly the integers the scalar twin defines
//! (`super::scalar`), by widening i8 x i8 products to i16 (`vmull_s8`, exact even for
//! -128 x -128) and pairwise-adding into i32 lanes, and then runs the same floating-point
//! tail (`super::Lanes` and the `block_*` formulas) one block at a time, so results match
//! the scalar kernels bit for bit. Only baseline NEON is used (no `dotprod`).
//!
//! Status: compile-checked for `aarch64-unknown-linux-gnu`; not yet executed (no aarch64
//! machine or emulator here), so the bit-equality tests in tests/dot.rs have not run on it.
//!
//! Safety: every `#[target_feature]` function here is reached only through
//! [`neon_kernel`], which `super::kernel` calls only after `Isa::Neon.is_available()`.
//! Every memory load reads a `&[u8; 16]` obtained by bounds-checked slicing.

use std::arch::aarch64::*;

use super::{
    block_k, block_k_min, block_min, block_sym, bsum_dot, f16_at, f32_at, k4_min_sum,
    k4_scales_mins, q3k_scales, Lanes, RowFn,
};
use crate::GgmlType;

/// The NEON kernel for `ty`, if there is one. Callers must have checked
/// `Isa::Neon.is_available()`.
pub(super) fn neon_kernel(ty: GgmlType) -> Option<RowFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q4_0(w, a) }
        },
        T::Q4_1 => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q4_1(w, a) }
        },
        T::Q5_0 => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q5_0(w, a) }
        },
        T::Q5_1 => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q5_1(w, a) }
        },
        T::Q8_0 => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q8_0(w, a) }
        },
        T::Q2_K => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q2_k(w, a) }
        },
        T::Q3_K => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q3_k(w, a) }
        },
        T::Q4_K => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q4_k(w, a) }
        },
        T::Q5_K => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q5_k(w, a) }
        },
        T::Q6_K => |w, a| {
            // SAFETY: handed out only after NEON detection (module doc).
            unsafe { q6_k(w, a) }
        },
        _ => return None,
    })
}

/// 16 bytes of `s` from `at`, loaded (bounds-checked slice, then an unaligned load).
#[target_feature(enable = "neon")]
#[inline]
fn ld(s: &[u8], at: usize) -> uint8x16_t {
    let b: &[u8; 16] = s[at..at + 16].try_into().expect("16 bytes");
    // SAFETY: `b` is 16 readable bytes; vld1q_u8 has no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// 16 signed activation quants at byte `at`.
#[target_feature(enable = "neon")]
#[inline]
fn lds(s: &[u8], at: usize) -> int8x16_t {
    vreinterpretq_s8_u8(ld(s, at))
}

/// `sum x * y` over 16 signed bytes, exact, in four i32 lanes.
#[target_feature(enable = "neon")]
#[inline]
fn dot16(x: int8x16_t, y: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
    let hi = vmull_high_s8(x, y);
    vpadalq_s16(vpaddlq_s16(lo), hi)
}

/// `sum u * y` for unsigned `u < 128` as one i32.
#[target_feature(enable = "neon")]
#[inline]
fn dotu(u: uint8x16_t, y: int8x16_t) -> i32 {
    vaddvq_s32(dot16(vreinterpretq_s8_u8(u), y))
}

/// Each byte shifted right by the run-time count `n`.
#[target_feature(enable = "neon")]
#[inline]
fn shr(v: uint8x16_t, n: usize) -> uint8x16_t {
    vshlq_u8(v, vdupq_n_s8(-(n as i8)))
}

/// 0x10 in byte `i` where bit `i` (of 16) of `bits` is set.
#[target_feature(enable = "neon")]
#[inline]
fn bits16(bits: u16) -> uint8x16_t {
    let [b0, b1] = bits.to_le_bytes();
    let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    let sel: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `sel` is 16 readable bytes.
    let sel = unsafe { vld1q_u8(sel.as_ptr()) };
    vandq_u8(vtstq_u8(v, sel), vdupq_n_u8(0x10))
}

/// The legacy-format driver: the exact integer sums of each block, then the shared tail.
/// `isum(w, a) -> (isum, ysum)`; `$min` selects the `block_min` formula.
macro_rules! legacy_kernel {
    ($name:ident, $wb:expr, $min:expr, |$w:ident, $a:ident| $isum:expr) => {
        #[target_feature(enable = "neon")]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            let isum = |$w: &[u8], $a: &[u8]| -> i32 { $isum };
            let mut lanes = Lanes::default();
            for (b, (w, a)) in w.chunks_exact($wb).zip(a.chunks_exact(34)).enumerate() {
                let s = isum(w, a);
                let v = if $min {
                    let ys = i32::from(vaddlvq_s8(lds(a, 2))) + i32::from(vaddlvq_s8(lds(a, 18)));
                    block_min(f16_at(w, 0), f16_at(a, 0), s, f16_at(w, 2), ys)
                } else {
                    block_sym(f16_at(w, 0), f16_at(a, 0), s)
                };
                lanes.add(b, v);
            }
            lanes.finish()
        }
    };
}

legacy_kernel!(q4_0, 18, false, |w, a| {
    let q = ld(w, 2);
    let eight = vdupq_n_s8(8);
    let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight);
    let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), eight);
    vaddvq_s32(vaddq_s32(dot16(lo, lds(a, 2)), dot16(hi, lds(a, 18))))
});

legacy_kernel!(q4_1, 20, true, |w, a| {
    let q = ld(w, 4);
    dotu(vandq_u8(q, vdupq_n_u8(0x0F)), lds(a, 2)) + dotu(vshrq_n_u8::<4>(q), lds(a, 18))
});

legacy_kernel!(q5_0, 22, false, |w, a| {
    let qh = u32::from_le_bytes(w[2..6].try_into().expect("4 bytes"));
    let q = ld(w, 6);
    let lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), bits16(qh as u16));
    let hi = vorrq_u8(vshrq_n_u8::<4>(q), bits16((qh >> 16) as u16));
    let sixteen = vdupq_n_s8(16);
    let lo = vsubq_s8(vreinterpretq_s8_u8(lo), sixteen);
    let hi = vsubq_s8(vreinterpretq_s8_u8(hi), sixteen);
    vaddvq_s32(vaddq_s32(dot16(lo, lds(a, 2)), dot16(hi, lds(a, 18))))
});

legacy_kernel!(q5_1, 24, true, |w, a| {
    let qh = u32::from_le_bytes(w[4..8].try_into().expect("4 bytes"));
    let q = ld(w, 8);
    let lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), bits16(qh as u16));
    let hi = vorrq_u8(vshrq_n_u8::<4>(q), bits16((qh >> 16) as u16));
    dotu(lo, lds(a, 2)) + dotu(hi, lds(a, 18))
});

legacy_kernel!(q8_0, 34, false, |w, a| {
    vaddvq_s32(vaddq_s32(
        dot16(lds(w, 2), lds(a, 2)),
        dot16(lds(w, 18), lds(a, 18)),
    ))
});

/// The super-block driver of the K-quants.
#[inline(always)]
fn k_blocks(w: &[u8], wb: usize, a: &[u8], f: impl Fn(&[u8], &[u8]) -> f32) -> f32 {
    let mut lanes = Lanes::default();
    for (b, (w, a)) in w.chunks_exact(wb).zip(a.chunks_exact(292)).enumerate() {
        lanes.add(b, f(w, a));
    }
    lanes.finish()
}

#[target_feature(enable = "neon")]
fn q4_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 144, a, |w, a| {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut s0, mut s1) = (0, 0);
            for h in 0..2 {
                let q = ld(w, 16 + 32 * j + 16 * h);
                s0 += dotu(vandq_u8(q, vdupq_n_u8(0x0F)), lds(a, 4 + 64 * j + 16 * h));
                s1 += dotu(vshrq_n_u8::<4>(q), lds(a, 36 + 64 * j + 16 * h));
            }
            sumi += i32::from(sc[2 * j]) * s0 + i32::from(sc[2 * j + 1]) * s1;
        }
        let summ = k4_min_sum(&m, a);
        block_k_min(f32_at(a, 0), f16_at(w, 0), f16_at(w, 2), sumi, summ)
    })
}

#[target_feature(enable = "neon")]
fn q5_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 176, a, |w, a| {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let one = vdupq_n_u8(1);
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut s0, mut s1) = (0, 0);
            for h in 0..2 {
                let qh = ld(w, 16 + 16 * h);
                let q = ld(w, 48 + 32 * j + 16 * h);
                let hb0 = vshlq_n_u8::<4>(vandq_u8(shr(qh, 2 * j), one));
                let hb1 = vshlq_n_u8::<4>(vandq_u8(shr(qh, 2 * j + 1), one));
                let lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), hb0);
                let hi = vorrq_u8(vshrq_n_u8::<4>(q), hb1);
                s0 += dotu(lo, lds(a, 4 + 64 * j + 16 * h));
                s1 += dotu(hi, lds(a, 36 + 64 * j + 16 * h));
            }
            sumi += i32::from(sc[2 * j]) * s0 + i32::from(sc[2 * j + 1]) * s1;
        }
        let summ = k4_min_sum(&m, a);
        block_k_min(f32_at(a, 0), f16_at(w, 0), f16_at(w, 2), sumi, summ)
    })
}

#[target_feature(enable = "neon")]
fn q6_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 210, a, |w, a| {
        let sc: [i32; 16] = std::array::from_fn(|i| i32::from(w[192 + i] as i8));
        let mut sumi = 0i32;
        for n in 0..2 {
            for k in 0..4 {
                for h in 0..2 {
                    let src = ld(w, 64 * n + 32 * (k % 2) + 16 * h);
                    let low = vandq_u8(shr(src, 4 * (k / 2)), vdupq_n_u8(0x0F));
                    let qh = ld(w, 128 + 32 * n + 16 * h);
                    let high = vshlq_n_u8::<4>(vandq_u8(shr(qh, 2 * k), vdupq_n_u8(3)));
                    let y = lds(a, 4 + 128 * n + 32 * k + 16 * h);
                    sumi += sc[8 * n + 2 * k + h] * dotu(vorrq_u8(low, high), y);
                }
            }
        }
        let sumi = sumi - 32 * bsum_dot(&sc, a);
        block_k(f32_at(a, 0), f16_at(w, 208), sumi)
    })
}

#[target_feature(enable = "neon")]
fn q2_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 84, a, |w, a| {
        let scales = &w[0..16];
        let mut sumi = 0i32;
        for n in 0..2 {
            for k in 0..4 {
                for h in 0..2 {
                    let q = ld(w, 16 + 32 * n + 16 * h);
                    let u = vandq_u8(shr(q, 2 * k), vdupq_n_u8(3));
                    let y = lds(a, 4 + 128 * n + 32 * k + 16 * h);
                    sumi += i32::from(scales[8 * n + 2 * k + h] & 15) * dotu(u, y);
                }
            }
        }
        let mins: [i32; 16] = std::array::from_fn(|i| i32::from(scales[i] >> 4));
        let summ = bsum_dot(&mins, a);
        block_k_min(f32_at(a, 0), f16_at(w, 80), f16_at(w, 82), sumi, summ)
    })
}

#[target_feature(enable = "neon")]
fn q3_k(w: &[u8], a: &[u8]) -> f32 {
    k_blocks(w, 110, a, |w, a| {
        let s = q3k_scales(&w[96..108]);
        let mut sumi = 0i32;
        for n in 0..2 {
            for k in 0..4 {
                for h in 0..2 {
                    let q = ld(w, 32 + 32 * n + 16 * h);
                    let hm = ld(w, 16 * h);
                    let low = vandq_u8(shr(q, 2 * k), vdupq_n_u8(3));
                    let hb = vshlq_n_u8::<2>(vandq_u8(shr(hm, 4 * n + k), vdupq_n_u8(1)));
                    let y = lds(a, 4 + 128 * n + 32 * k + 16 * h);
                    sumi += s[8 * n + 2 * k + h] * dotu(vorrq_u8(low, hb), y);
                }
            }
        }
        let sumi = sumi - 4 * bsum_dot(&s, a);
        block_k(f32_at(a, 0), f16_at(w, 108), sumi)
    })
}
