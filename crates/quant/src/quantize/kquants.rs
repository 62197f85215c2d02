//! K-quant and IQ4_XS quantizers for one 256-value super-block, without an importance
//! matrix: ggml-quants.c's `quantize_row_q{2,3,4,5,6}_K_ref` and `quantize_iq4_xs`
//! (`quantize_row_iq4_nl_impl` over a super-block), what `llama-quantize` writes with no
//! `--imatrix`. Each first fits every sub-block a scale (and for Q2_K, Q4_K and Q5_K a
//! minimum) by ggml's searches (`make_qkx2_quants`, `make_q3_quants`, `make_qx_quants`),
//! quantizes those to 4, 6 or 8 bits against the super-block's f16 scales, and then takes
//! each value's quant against the scale as stored. The searches' floating-point operations
//! are ggml's, in its order and without fused multiply-adds, so the bytes are its own.
//!
//! Layouts (ggml-common.h; byte offsets in a block): Q2_K `scales[16]` @0 (scale low
//! nibble, min high), `qs[64]` @16, `d` @80, `dmin` @82; Q3_K `hmask[32]` @0, `qs[64]`
//! @32, `scales[12]` @96, `d` @108; Q4_K `d` @0, `dmin` @2, `scales[12]` @4, `qs[128]`
//! @16; Q5_K as Q4_K with `qh[32]` @16 and `qs` @48; Q6_K `ql[128]` @0, `qh[64]` @128,
//! `scales: [i8; 16]` @192, `d` @208; IQ4_XS `d` @0, `scales_h: u16` @2, `scales_l[4]` @4,
//! `qs[128]` @8.

use half::f16;

use super::{inverse, iq4_search, put_f16, signed_max};
use crate::dot::quantize::nearest_int;

/// Values per super-block.
pub(super) const QK_K: usize = 256;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below it is all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// `v` rounded to f16 and back (`GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))`).
pub(super) fn f16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// ggml's `make_qkx2_quants`: the scale and minimum of `x` (`N` values, quants
/// `0..=nmax`) of least weighted error (squared, or absolute with `MAD`) over the
/// first guess and `nstep + 1` scales around it, each refit by weighted least squares.
/// Returns the scale; `l` gets the quants, `the_min` minus the minimum. (Sizes and the
/// error kind are constants so the loops carry no bounds checks or branches: Q4_K's file
/// quantization spends most of its time here.)
///
/// With `V3` it is ggml's `make_qkx3_quants` (the importance-weighted quantizers'): the
/// same except that a search step's quant is `nearest_int(min(v, nmax))` for `v > 0` and 0
/// otherwise, `v = iscale · (x - min)` (no integer rounding of an infinite or huge `v`).
pub(super) fn make_qkx2_quants<const N: usize, const MAD: bool, const V3: bool>(
    nmax: i32,
    x: &[f32; N],
    w: &[f32; N],
    l: &mut [u8; N],
    the_min: &mut f32,
    (rmin, rdelta, nstep): (f32, f32, i32),
) -> f32 {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        *the_min = -min;
        return 0.0;
    }
    let err = |d: f32| if MAD { d.abs() } else { d * d };
    let quant = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let step_quant = |iscale: f32, min: f32, v: f32| {
        if V3 {
            let v = iscale * (v - min);
            if v > 0.0 {
                nearest_int(v.min(nmax as f32))
            } else {
                0
            }
        } else {
            quant(iscale, min, v)
        }
    };
    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..N {
        l[i] = quant(iscale, min, x[i]) as u8;
        best_error += w[i] * err(scale * f32::from(l[i]) + min - x[i]);
    }
    if nstep < 1 {
        *the_min = -min;
        return scale;
    }
    // Step `is`'s error and step `is + 1`'s sums are independent chains of adds: one
    // loop runs both (the sums with the minimum as it stands, done again in the rare case
    // that step `is` is taken and moves it), so each waits less on its own adds. Every
    // value is still computed in ggml's order, from the same inputs.
    let iscale_at = |is: i32, min: f32| (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
    // `(Σ w l, Σ w l², Σ w l x)` grows by element `i`'s quant `q`, which it returns.
    let accumulate = |s: &mut (f32, f32, f32), i: usize, q: i32| {
        let qf = q as f32;
        s.0 += w[i] * qf;
        s.1 += w[i] * qf * qf;
        s.2 += w[i] * qf * x[i];
        q as u8
    };
    let sums_of = |iscale: f32, min: f32, aux: &mut [u8; N]| {
        let mut s = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..N {
            aux[i] = accumulate(&mut s, i, step_quant(iscale, min, x[i]));
        }
        s
    };
    let (mut aux, mut next) = ([0u8; N], [0u8; N]);
    let mut sums = sums_of(iscale_at(0, min), min, &mut aux);
    for is in 0..=nstep {
        let (sum_l, sum_l2, sum_xl) = sums;
        let more = is < nstep;
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det <= 0.0 {
            if more {
                sums = sums_of(iscale_at(is + 1, min), min, &mut next);
            }
            std::mem::swap(&mut aux, &mut next);
            continue;
        }
        let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if this_min > 0.0 {
            this_min = 0.0;
            this_scale = sum_xl / sum_l2;
        }
        let mut cur_error = 0.0f32;
        let next_iscale = iscale_at(is + 1, min);
        let mut s = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..N {
            cur_error += w[i] * err(this_scale * f32::from(aux[i]) + this_min - x[i]);
            if more {
                next[i] = accumulate(&mut s, i, step_quant(next_iscale, min, x[i]));
            }
        }
        sums = s;
        if cur_error < best_error {
            *l = aux;
            best_error = cur_error;
            scale = this_scale;
            if this_min.to_bits() != min.to_bits() && more {
                sums = sums_of(iscale_at(is + 1, this_min), this_min, &mut next);
            }
            min = this_min;
        }
        std::mem::swap(&mut aux, &mut next);
    }
    *the_min = -min;
    scale
}

/// ggml's `make_qx_quants` with `rmse_type` 1: a symmetric scale for quants
/// `-nmax..nmax-1` (stored `+ nmax`), the least-squares refit (weights `w`) of the first
/// guess and of 18 scales around it, keeping the best. Without an importance matrix ggml
/// weighs by `x²` (Q6_K's reference quantizer); with one, by the weights given.
pub(super) fn make_qx_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    w: &[f32; N],
    l: &mut [u8; N],
) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (&v, &w) in x.iter().zip(w) {
            let q = quant(iscale, v) as f32;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (l, &v) in l.iter_mut().zip(x) {
        *l = (quant(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l, &v) in l.iter_mut().zip(x) {
                *l = (quant(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `x²` of each value: the weights ggml's searches use without an importance matrix.
pub(super) fn squares<const N: usize>(x: &[f32; N]) -> [f32; N] {
    std::array::from_fn(|i| x[i] * x[i])
}

/// ggml's `make_q3_quants` with `do_rmse` (Q3_K's): a symmetric scale for quants `-4..3`
/// (stored `+ 4`), then up to five passes that move single quants while that lowers the
/// weighted (`x²`) error of the least-squares scale.
fn make_q3_quants(x: &[f32], l: &mut [u8]) -> f32 {
    const NMAX: i32 = 4;
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(NMAX as f32) / max;
    let mut q = [0i32; 16];
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        q[i] = nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
        let w = v * v;
        sumlx += w * v * q[i] as f32;
        suml2 += w * q[i] as f32 * q[i] as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * q[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * q[i] as f32 * q[i] as f32;
                let new = nearest_int(v * sl2 / slx).clamp(-NMAX, NMAX - 1);
                if new != q[i] {
                    slx += w * v * new as f32;
                    sl2 += w * new as f32 * new as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        q[i] = new;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (l, q) in l.iter_mut().zip(q) {
        *l = (q + NMAX) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 256 2-bit quants four to a byte: byte `32 g + j` of each 128-value half holds
/// values `j`, `j + 32`, `j + 64`, `j + 96` of it, from the low bits up.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for (h, qs) in qs.chunks_exact_mut(32).enumerate() {
        let l = &l[128 * h..];
        for j in 0..32 {
            qs[j] = l[j] | l[j + 32] << 2 | l[j + 64] << 4 | l[j + 96] << 6;
        }
    }
}

/// Q2_K: 16 sub-blocks of 16 with a 4-bit scale and minimum each (`make_qkx2_quants`,
/// weights `|x|`, absolute error).
pub(super) fn q2_k(x: &[f32], b: &mut [u8], _: i32) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().expect("16 values");
        let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().expect("16 quants");
        let search = (-0.5, 0.1, 15);
        scales[j] = make_qkx2_quants::<16, true, false>(3, xs, &w, lj, &mut mins[j], search);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let sc = &mut [0u8; 16];
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
    }
    let d = if max_scale > 0.0 {
        max_scale / 15.0
    } else {
        0.0
    };
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
    }
    let dmin = if max_min > 0.0 { max_min / 15.0 } else { 0.0 };
    q2_tail(x, b, &mut l, sc, d, dmin);
}

/// Q2_K's end, shared with the importance-weighted quantizer: each value's quant against
/// its sub-block's stored scale and minimum (`sc`: scale low nibble, minimum high; `d`,
/// `dmin` rounded to f16), then the block written. A sub-block whose stored scale is 0
/// keeps the search's quants `l`, as ggml's do.
pub(super) fn q2_tail(
    x: &[f32],
    b: &mut [u8],
    l: &mut [u8; QK_K],
    sc: &[u8; 16],
    d: f32,
    dmin: f32,
) {
    for j in 0..16 {
        let d = f16_round(d) * f32::from(sc[j] & 0xF);
        if d == 0.0 {
            continue;
        }
        let dm = f16_round(dmin) * f32::from(sc[j] >> 4);
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    b[..16].copy_from_slice(sc);
    pack_2bit(l, &mut b[16..80]);
    put_f16(b, 80, d);
    put_f16(b, 82, dmin);
}

/// Q3_K: 16 sub-blocks of 16 with a 6-bit signed scale each (`make_q3_quants`), the third
/// bit of each quant in `hmask`.
pub(super) fn q3_k(x: &[f32], b: &mut [u8], _: i32) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut amax, mut max_scale) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let mut sc = [0u8; 12];
    let mut d = 0.0;
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) as i32 + 32;
            match j < 8 {
                true => sc[j] = (q & 0xF) as u8,
                false => sc[j - 8] |= ((q & 0xF) << 4) as u8,
            }
            sc[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
        }
        d = 1.0 / iscale;
    }
    q3_tail(x, b, &mut l, &sc, d);
}

/// Q3_K's end, shared with the importance-weighted quantizer: each value's quant against
/// its sub-block's stored 6-bit scale (`sc`, packed) times `d` (rounded to f16), the third
/// bits into `hmask`, the block written. A sub-block whose scale is 0 keeps `l`.
pub(super) fn q3_tail(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K], sc: &[u8; 12], d: f32) {
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = i32::from(low | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
        let dj = f16_round(d) * s as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dj).clamp(-4, 3) + 4) as u8;
        }
    }
    let hmask = &mut b[..32];
    hmask.fill(0);
    for (j, q) in l.iter_mut().enumerate() {
        if *q > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *q -= 4;
        }
    }
    pack_2bit(l, &mut b[32..96]);
    b[96..108].copy_from_slice(sc);
    put_f16(b, 108, d);
}

/// The scales and minimums of Q4_K and Q5_K: 8 sub-blocks of 32 fitted by
/// `make_qkx2_quants` (weights `rms(x) + |x|`, squared error) with quants `0..=nmax`,
/// quantized to 6 bits against `d = max scale / 63` and `dmin = max min / 63` and packed
/// as `get_scale_min_k4` reads them; then each value's quant against the stored ones.
/// Writes `d`, `dmin` and the 12 scale bytes at 0..16; returns the quants.
fn k4_scales(x: &[f32], b: &mut [u8], nmax: i32, search: (f32, f32, i32)) -> [u8; QK_K] {
    let xt = super::lanes::transpose(x);
    let mut sum_x2 = [0f32; 8];
    for row in &xt {
        for k in 0..8 {
            sum_x2[k] += row[k] * row[k];
        }
    }
    let av_x: [f32; 8] = std::array::from_fn(|k| (sum_x2[k] / 32.0).sqrt());
    let wt: [[f32; 8]; 32] =
        std::array::from_fn(|i| std::array::from_fn(|k| av_x[k] + xt[i][k].abs()));
    let (mut l, scales, mins) = k4_search::<false>(&xt, &wt, nmax, search);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    k4_tail(
        x,
        b,
        &mut l,
        nmax,
        (ls, lm),
        (max_scale / 63.0, max_min / 63.0),
    );
    l
}

/// The 8 sub-block searches of a Q4_K/Q5_K super-block (lanes of `x`, weights `w`; `V3`:
/// the importance-weighted `make_qkx3_quants`): the quants in value order, the scales and
/// minus the minimums.
pub(super) fn k4_search<const V3: bool>(
    x: &[[f32; 8]; 32],
    w: &[[f32; 8]; 32],
    nmax: i32,
    search: (f32, f32, i32),
) -> ([u8; QK_K], [f32; 8], [f32; 8]) {
    let (mut lt, mut mins) = ([[0u8; 8]; 32], [0f32; 8]);
    let scales = super::lanes::make_qkx_lanes::<false, V3>(nmax, x, w, &mut lt, &mut mins, search);
    let l = std::array::from_fn(|j| lt[j % 32][j / 32]);
    (l, scales, mins)
}

/// Q4_K's and Q5_K's end, shared with the importance-weighted quantizers: the sub-block
/// scales and minimums `ls`, `lm` packed as `get_scale_min_k4` reads them (bytes 4..16),
/// `d` and `dmin` at 0 and 2, and each value's quant `0..=nmax` against the stored ones
/// into `l` (a sub-block whose scale is 0 keeps its quants).
pub(super) fn k4_tail(
    x: &[f32],
    b: &mut [u8],
    l: &mut [u8; QK_K],
    nmax: i32,
    (ls, lm): ([u8; 8], [u8; 8]),
    (d, dmin): (f32, f32),
) {
    let sc = &mut b[4..16];
    sc.fill(0);
    for j in 0..8 {
        let (ls, lm) = (ls[j], lm[j]);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | (lm & 0xF) << 4;
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(b, 0, d);
    put_f16(b, 2, dmin);
    for j in 0..8 {
        let (s, m) = crate::kquants::scale_min_k4(j, &b[4..16]);
        let dj = f16_round(d) * f32::from(s);
        if dj == 0.0 {
            continue;
        }
        let dm = f16_round(dmin) * f32::from(m);
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
}

/// Q4_K: 4-bit quants, byte `j` of each 32-byte group holding values `j` and `j + 32` of
/// its 64.
pub(super) fn q4_k(x: &[f32], b: &mut [u8], _: i32) {
    let l = k4_scales(x, b, 15, (-1.0, 0.1, 20));
    q4_pack(&l, b);
}

/// Q4_K's quants `l` into bytes 16..144.
pub(super) fn q4_pack(l: &[u8; QK_K], b: &mut [u8]) {
    for (g, qs) in b[16..144].chunks_exact_mut(32).enumerate() {
        for j in 0..32 {
            qs[j] = l[64 * g + j] | l[64 * g + j + 32] << 4;
        }
    }
}

/// Q5_K: as Q4_K with 5-bit quants, the fifth bits of group `g`'s two halves in bits
/// `2g` and `2g + 1` of `qh`.
pub(super) fn q5_k(x: &[f32], b: &mut [u8], _: i32) {
    let l = k4_scales(x, b, 31, (-0.5, 0.1, 15));
    q5_pack(&l, b);
}

/// Q5_K's quants `l` into `qh` (16..48) and `qs` (48..176).
pub(super) fn q5_pack(l: &[u8; QK_K], b: &mut [u8]) {
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for (g, qs) in qs.chunks_exact_mut(32).enumerate() {
        for j in 0..32 {
            let (lo, hi) = (l[64 * g + j], l[64 * g + j + 32]);
            qh[j] |= (lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1);
            qs[j] = (lo & 0xF) | (hi & 0xF) << 4;
        }
    }
}

/// Q6_K: 16 sub-blocks of 16 with an 8-bit signed scale each (`make_qx_quants`), 6-bit
/// quants split into `ql` nibbles and `qh` pairs.
pub(super) fn q6_k(x: &[f32], b: &mut [u8], _: i32) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    for j in 0..16 {
        let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().expect("16 values");
        let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().expect("16 quants");
        scales[j] = make_qx_quants(32, xs, &squares(xs), lj);
    }
    q6_tail(x, b, &mut l, &scales);
}

/// Q6_K's end, shared with the importance-weighted quantizer: the sub-block `scales` as
/// 8-bit multiples of `d = -max / 128` (the scale of largest magnitude), each value's
/// quant against its stored scale into `l` (a sub-block whose scale is 0 keeps its
/// quants), the block written; all zero when every scale is below 1e-15.
pub(super) fn q6_tail(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K], scales: &[f32; 16]) {
    let (mut max_abs, mut max_scale) = (0f32, 0f32);
    for &s in scales {
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    b[..210].fill(0);
    if max_abs < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, 208, 1.0 / iscale);
    for j in 0..16 {
        b[192 + j] = nearest_int(iscale * scales[j]).min(127) as i8 as u8;
    }
    let d = f16_round(1.0 / iscale);
    for j in 0..16 {
        let dj = d * f32::from(b[192 + j] as i8);
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let qh = &mut rest[..64];
    for h in 0..2 {
        let l = &l[128 * h..];
        for j in 0..32 {
            ql[64 * h + j] = (l[j] & 0xF) | (l[j + 64] & 0xF) << 4;
            ql[64 * h + j + 32] = (l[j + 32] & 0xF) | (l[j + 96] & 0xF) << 4;
            qh[32 * h + j] =
                l[j] >> 4 | (l[j + 32] >> 4) << 2 | (l[j + 64] >> 4) << 4 | (l[j + 96] >> 4) << 6;
        }
    }
}

/// IQ4_XS: IQ4_NL's scale search per 32-value block (`ntry`), then the block scales as
/// 6-bit signed multiples of `d = -max / 32` (the block scale of largest magnitude) and
/// each value's level against its block's `d · l`.
pub(super) fn iq4_xs(x: &[f32], b: &mut [u8], ntry: i32) {
    let w: [f32; QK_K] = std::array::from_fn(|i| x[i] * x[i]);
    iq4_xs_weighted(x, &w, b, ntry);
}

/// [`iq4_xs`] with the search's weights `w` (one per value): `x²` without an importance
/// matrix, ggml's imatrix weights with one.
pub(super) fn iq4_xs_weighted(x: &[f32], w: &[f32; QK_K], b: &mut [u8], ntry: i32) {
    let mut scales = [0f32; 8];
    let (mut amax, mut max_scale) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        scales[j] = iq4_search(xs, &w[32 * j..32 * j + 32], ntry).0;
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let d = -max_scale / 32.0;
    put_f16(b, 0, d);
    let id = inverse(d);
    let (mut sh, mut sl) = (0u16, [0u8; 4]);
    let mut l = [0u8; QK_K];
    for j in 0..8 {
        let q = nearest_int(id * scales[j]).clamp(-32, 31);
        let dl = d * q as f32;
        let idl = inverse(dl);
        for i in 0..32 {
            l[32 * j + i] = super::nearest_level(idl * x[32 * j + i]) as u8;
        }
        let q = (q + 32) as u8;
        sl[j / 2] |= (q & 0xF) << (4 * (j % 2));
        sh |= u16::from(q >> 4) << (2 * j);
    }
    b[2..4].copy_from_slice(&sh.to_le_bytes());
    b[4..8].copy_from_slice(&sl);
    for (g, qs) in b[8..136].chunks_exact_mut(16).enumerate() {
        for j in 0..16 {
            qs[j] = l[32 * g + j] | l[32 * g + 16 + j] << 4;
        }
    }
}
