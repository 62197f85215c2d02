//! Scalar reference dot products: the integer definition of every block sum, written for
//! clarity, and the shared floating-point tail of `super`. The SIMD kernels must produce
//! the same integers (and then run the same tail), so they match these bit for bit.
//!
//! Block layouts are documented in `crate::legacy`, `crate::kquants` and
//! `super::quantize`. Integer rules (ggml-cpu/quants.c `ggml_vec_dot_*_generic` compute
//! the same sums, in another order):
//! - Q4_0 / Q5_0: `sum (q - 8) * y` / `sum (q - 16) * y`; Q8_0: `sum w * y`.
//! - Q4_1 / Q5_1: `isum = sum q * y` and `ysum = sum y` (for the min term).
//! - Q4_K / Q5_K: `sumi = sum_s scale_s * sum q * y` over the eight 32-value sub-blocks,
//!   `summ = sum_s min_s * (bsums[2s] + bsums[2s+1])`.
//! - Q2_K: `sumi = sum_i (sc_i & 15) * sum q * y` over sixteen 16-value groups,
//!   `summ = sum_i (sc_i >> 4) * bsums[i]`.
//! - Q3_K: `sumi = sum_i (sc_i - 32) * sum u * y - 4 * sum_i (sc_i - 32) * bsums[i]`, with
//!   `u = low2 + 4 * hbit` (so `u - 4` is the stored value).
//! - Q6_K: `sumi = sum_i sc_i * sum u * y - 32 * sum_i sc_i * bsums[i]`, with `u` the
//!   unsigned 6-bit value.

use super::{
    block_k, block_k_min, block_min, block_sym, bsum_dot, f16_at, f32_at, k4_min_sum,
    k4_scales_mins, q3k_scales, Lanes, RowFn,
};
use crate::GgmlType;

/// The scalar kernel for `ty`, if it has one.
pub(super) fn kernel(ty: GgmlType) -> Option<RowFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => q4_0,
        T::Q4_1 => q4_1,
        T::Q5_0 => q5_0,
        T::Q5_1 => q5_1,
        T::Q8_0 => q8_0,
        T::Q2_K => q2_k,
        T::Q3_K => q3_k,
        T::Q4_K => q4_k,
        T::Q5_K => q5_k,
        T::Q6_K => q6_k,
        _ => return None,
    })
}

/// The i8 activation quant at byte `at`.
#[inline(always)]
fn i8_at(a: &[u8], at: usize) -> i32 {
    i32::from(a[at] as i8)
}

/// Runs `f(w_block, a_block) -> f32` over matching blocks into the eight lanes.
#[inline(always)]
fn blocks(w: &[u8], wb: usize, a: &[u8], ab: usize, f: impl Fn(&[u8], &[u8]) -> f32) -> f32 {
    let mut lanes = Lanes::default();
    for (b, (w, a)) in w.chunks_exact(wb).zip(a.chunks_exact(ab)).enumerate() {
        lanes.add(b, f(w, a));
    }
    lanes.finish()
}

/// The 32 4-bit values of a legacy block from its 16 nibble bytes, in element order.
#[inline(always)]
fn nib(qs: &[u8], j: usize) -> i32 {
    i32::from(if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    })
}

/// Bit `j` of the little-endian u32 at `b[at..]`, as 16 or 0.
#[inline(always)]
fn hbit16(b: &[u8], at: usize, j: usize) -> i32 {
    let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    (((qh >> j) & 1) << 4) as i32
}

pub(super) fn q4_0(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 18, a, 34, |w, a| {
        let isum: i32 = (0..32)
            .map(|j| (nib(&w[2..], j) - 8) * i8_at(a, 2 + j))
            .sum();
        block_sym(f16_at(w, 0), f16_at(a, 0), isum)
    })
}

/// The sum of the 32 quants of a Q8_0 block.
#[inline(always)]
fn ysum(a: &[u8]) -> i32 {
    (0..32).map(|j| i8_at(a, 2 + j)).sum()
}

pub(super) fn q4_1(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 20, a, 34, |w, a| {
        let isum: i32 = (0..32).map(|j| nib(&w[4..], j) * i8_at(a, 2 + j)).sum();
        block_min(f16_at(w, 0), f16_at(a, 0), isum, f16_at(w, 2), ysum(a))
    })
}

pub(super) fn q5_0(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 22, a, 34, |w, a| {
        let isum: i32 = (0..32)
            .map(|j| (nib(&w[6..], j) + hbit16(w, 2, j) - 16) * i8_at(a, 2 + j))
            .sum();
        block_sym(f16_at(w, 0), f16_at(a, 0), isum)
    })
}

pub(super) fn q5_1(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 24, a, 34, |w, a| {
        let isum: i32 = (0..32)
            .map(|j| (nib(&w[8..], j) + hbit16(w, 4, j)) * i8_at(a, 2 + j))
            .sum();
        block_min(f16_at(w, 0), f16_at(a, 0), isum, f16_at(w, 2), ysum(a))
    })
}

pub(super) fn q8_0(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 34, a, 34, |w, a| {
        let isum: i32 = (0..32).map(|j| i8_at(w, 2 + j) * i8_at(a, 2 + j)).sum();
        block_sym(f16_at(w, 0), f16_at(a, 0), isum)
    })
}

/// The low two bits of element `e` of a Q2_K/Q3_K `qs` plane.
#[inline(always)]
fn low2(qs: &[u8], e: usize) -> i32 {
    i32::from((qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3)
}

/// `sum_{e in group g of 16} u(e) * y(e)` for the 16-value group `g` of a Q8_K block.
#[inline(always)]
fn group16(a: &[u8], g: usize, u: impl Fn(usize) -> i32) -> i32 {
    (16 * g..16 * g + 16).map(|e| u(e) * i8_at(a, 4 + e)).sum()
}

pub(super) fn q2_k(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 84, a, 292, |w, a| {
        let (sc, qs) = (&w[0..16], &w[16..80]);
        let mut sumi = 0;
        let mut mins = [0i32; 16];
        for g in 0..16 {
            sumi += i32::from(sc[g] & 15) * group16(a, g, |e| low2(qs, e));
            mins[g] = i32::from(sc[g] >> 4);
        }
        let summ = bsum_dot(&mins, a);
        block_k_min(f32_at(a, 0), f16_at(w, 80), f16_at(w, 82), sumi, summ)
    })
}

pub(super) fn q3_k(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 110, a, 292, |w, a| {
        let (hmask, qs) = (&w[0..32], &w[32..96]);
        let s = q3k_scales(&w[96..108]);
        let mut sumi = 0;
        for (g, &s) in s.iter().enumerate() {
            sumi += s * group16(a, g, |e| {
                low2(qs, e) + 4 * i32::from((hmask[e % 32] >> (e / 32)) & 1)
            });
        }
        sumi -= 4 * bsum_dot(&s, a);
        block_k(f32_at(a, 0), f16_at(w, 108), sumi)
    })
}

/// `sum_s scale_s * sum_{32 values of sub-block s} u * y` for Q4_K/Q5_K.
#[inline(always)]
fn k4_sumi(sc: &[u8; 8], a: &[u8], u: impl Fn(usize, usize) -> i32) -> i32 {
    (0..8)
        .map(|s| {
            let sub: i32 = (0..32).map(|l| u(s, l) * i8_at(a, 4 + 32 * s + l)).sum();
            i32::from(sc[s]) * sub
        })
        .sum()
}

pub(super) fn q4_k(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 144, a, 292, |w, a| {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let qs = &w[16..144];
        let sumi = k4_sumi(&sc, a, |s, l| {
            i32::from((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F)
        });
        let summ = k4_min_sum(&m, a);
        block_k_min(f32_at(a, 0), f16_at(w, 0), f16_at(w, 2), sumi, summ)
    })
}

pub(super) fn q5_k(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 176, a, 292, |w, a| {
        let (sc, m) = k4_scales_mins(&w[4..16]);
        let (qh, qs) = (&w[16..48], &w[48..176]);
        let sumi = k4_sumi(&sc, a, |s, l| {
            i32::from((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F)
                + 16 * i32::from((qh[l] >> s) & 1)
        });
        let summ = k4_min_sum(&m, a);
        block_k_min(f32_at(a, 0), f16_at(w, 0), f16_at(w, 2), sumi, summ)
    })
}

pub(super) fn q6_k(w: &[u8], a: &[u8]) -> f32 {
    blocks(w, 210, a, 292, |w, a| {
        let (ql, qh) = (&w[0..128], &w[128..192]);
        let sc: [i32; 16] = std::array::from_fn(|i| i32::from(w[192 + i] as i8));
        let u = |e: usize| {
            let (n, k, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = (ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
            let high = (qh[32 * n + l] >> (2 * k)) & 3;
            i32::from(low | (high << 4))
        };
        let mut sumi = 0;
        for (g, &s) in sc.iter().enumerate() {
            sumi += s * group16(a, g, u);
        }
        sumi -= 32 * bsum_dot(&sc, a);
        block_k(f32_at(a, 0), f16_at(w, 208), sumi)
    })
}
