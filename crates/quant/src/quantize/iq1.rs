//! IQ1_S and IQ1_M quantizers for one 256-value super-block: ggml-quants.c's
//! `quantize_row_iq1_s_impl` and `quantize_row_iq1_m_impl` (what `quantize_iq1_s` and
//! `quantize_iq1_m` run per row), byte-identical with ggml.
//!
//! Both split each sub-block (32 values for IQ1_S, 16 for IQ1_M) into three levels
//! `-1, 0, 1` (stored here as levels `0, 1, 2`), shifted by `±delta`
//! ([`IQ1S_DELTA`], [`IQ1M_DELTA`]): the values are sorted and every pair of split
//! points is scored by weighted least squares. A group of 8 levels not on the 2048-point
//! codebook ([`IQ1S_GRID`]) is replaced by the nearest of its precomputed neighbours
//! (ggml's `iq2xs_init_impl` and `iq1_find_best_neighbour2`; `iq1_find_best_neighbour`
//! is not used by these quantizers), and the sub-block scales are then quantized to 3 bits
//! against the super-block scale.
//!
//! Floating point follows ggml: every operation in `f32`, in its order, no fused
//! multiply-add. The sort is ggml's `qsort` with `iq1_sort_helper` (by value only); the
//! reference glibc (2.36) sorts these small arrays with a merge sort, which is stable, so
//! equal values (constant blocks, `0.0` and `-0.0`) keep their position order; Rust's
//! stable [`slice::sort_by`] gives the same permutation (checked with that glibc on
//! random arrays full of ties; the reference data's constant blocks need this order).
//!
//! Layouts (ggml-common.h; byte offsets in a block): IQ1_S `d: f16` @0, `qs[32]` @2,
//! `qh: [u16; 8]` @34 (per 32 values: 3 high index bits per group of 8, the 3-bit scale at
//! bits 12..14, the delta sign at bit 15); IQ1_M `qs[32]` @0, `qh[16]` @32 (per 16
//! values: a nibble per group of 8, 3 high index bits and the delta sign), `scales: [u16;
//! 4]` @48 (four 3-bit scales each in bits 0..11, the f16 super-scale `iq1m_scale_t` in
//! the top nibbles).

use std::cmp::Ordering;
use std::sync::OnceLock;

use half::f16;

use super::kquants::QK_K;
use super::{c_max, importance, put_f16};
use crate::dot::quantize::nearest_int;
use crate::grids::{IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID};

/// Codebook points (ggml's `NGRID_IQ1S`).
const NGRID: usize = 2048;

/// Points of `{0, 1, 2}^8`: every group of 8 levels.
const POINTS: usize = 6561;

/// Distinct distances whose points form a neighbour list (ggml's `nwant` for IQ1).
const NWANT: usize = 3;

/// IQ1_S sub-block length (ggml's `IQ1S_BLOCK_SIZE`).
const S_BLOCK: usize = 32;

/// IQ1_M sub-block length (ggml's `IQ1M_BLOCK_SIZE`).
const M_BLOCK: usize = 16;

/// A sub-block whose largest magnitude is below this is empty in IQ1_S
/// (ggml's `GROUP_MAX_EPS_IQ1_S`).
const S_EPS: f32 = 1e-12;

/// A sub-block whose largest magnitude is below this is empty in IQ1_M
/// (ggml's `GROUP_MAX_EPS_IQ1_M`).
const M_EPS: f32 = 1e-7;

/// The three shifted levels with a positive delta (ggml's `x_p`).
const fn plus(delta: f32) -> [f32; 3] {
    [-1.0 + delta, delta, 1.0 + delta]
}

/// The three shifted levels with a negative delta (ggml's `x_m`).
const fn minus(delta: f32) -> [f32; 3] {
    [-1.0 - delta, -delta, 1.0 - delta]
}

/// Where a group of 8 levels lies relative to the codebook.
#[derive(Clone, Copy)]
enum Slot {
    /// On the codebook, at this index.
    OnGrid(u16),
    /// Off it: its neighbours are `neighbours[start..end]` of [`Grid`].
    Near { start: u32, end: u32 },
}

/// The IQ1 codebook in level space with its lookup structures, ggml-quants.c
/// `iq2xs_init_impl` for IQ1_S/IQ1_M (`kgrid_1bit_2048`, `kmap_q2xs`, `kneighbors_q2xs`).
struct Grid {
    /// Each point's 8 levels (`0, 1, 2` for `-1, 0, 1`: ggml's `(pg - 1) / 2`).
    levels: Vec<[u8; 8]>,
    /// Every group of 8 levels by [`key`]: its index or its neighbour list.
    slots: Vec<Slot>,
    /// The neighbour lists, concatenated.
    neighbours: Vec<u16>,
}

/// A group of levels as a base-3 number, first level least significant (ggml's map key
/// packs the same levels at 2 bits each).
fn key(levels: &[u8]) -> usize {
    levels.iter().rev().fold(0, |k, &l| 3 * k + usize::from(l))
}

/// The codebook's levels from [`IQ1S_GRID`] (bytes `-1, 0, 1` → `0, 1, 2`). Packed at
/// two bits per level they are ggml-quants.c's `kgrid_1bit_2048`, entry for entry
/// (checked against that table).
fn grid_levels() -> Vec<[u8; 8]> {
    IQ1S_GRID
        .iter()
        .map(|&e| std::array::from_fn(|i| ((e >> (8 * i)) as u8 as i8 + 1) as u8))
        .collect()
}

/// The neighbours of the off-codebook group `p`: every point at one of the [`NWANT`]
/// smallest squared distances, by distance, then index. This is ggml's list, which sorts
/// all points by `(distance, index)` (a total order, so no `qsort` ties); its distances
/// are those here times 4 (coordinates `2 l + 1`), which orders them alike.
fn neighbours_of(levels: &[[u8; 8]], p: &[u8; 8], out: &mut Vec<u16>) {
    let dist: Vec<u8> = levels
        .iter()
        .map(|g| {
            g.iter()
                .zip(p)
                .map(|(&a, &b)| (i32::from(a) - i32::from(b)).pow(2) as u8)
                .sum()
        })
        .collect();
    let mut present = [false; 33];
    for &d in &dist {
        present[usize::from(d)] = true;
    }
    let wanted = (0..33u8).filter(|&d| present[usize::from(d)]).take(NWANT);
    for d in wanted {
        out.extend((0..NGRID as u16).filter(|&j| dist[usize::from(j)] == d));
    }
}

/// Builds the [`Grid`] (once, through [`grid`]).
fn build_grid() -> Grid {
    let levels = grid_levels();
    let mut slots = vec![Slot::Near { start: 0, end: 0 }; POINTS];
    for (i, l) in levels.iter().enumerate() {
        slots[key(l)] = Slot::OnGrid(i as u16);
    }
    let mut neighbours = Vec::new();
    for (k, slot) in slots.iter_mut().enumerate() {
        if let Slot::OnGrid(_) = slot {
            continue;
        }
        let p: [u8; 8] = std::array::from_fn(|i| (k / 3usize.pow(i as u32) % 3) as u8);
        let start = neighbours.len() as u32;
        neighbours_of(&levels, &p, &mut neighbours);
        *slot = Slot::Near {
            start,
            end: neighbours.len() as u32,
        };
    }
    Grid {
        levels,
        slots,
        neighbours,
    }
}

/// The shared [`Grid`], built on first use.
fn grid() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(build_grid)
}

impl Grid {
    /// Weighted squared error of point `j` at `scale` with shifted levels `xx` against
    /// `x` (the sum of `w · diff · diff` in ggml's order).
    fn error(&self, j: usize, x: &[f32], w: &[f32], scale: f32, xx: &[f32; 3]) -> f32 {
        let mut d2 = 0.0f32;
        for ((&l, &x), &w) in self.levels[j].iter().zip(x).zip(w) {
            let q = xx[usize::from(l)];
            let diff = scale * q - x;
            d2 += w * diff * diff;
        }
        d2
    }

    /// The first point of least error among `candidates` (ggml's `d2 < best_score` from
    /// `FLT_MAX`).
    fn least_error(
        &self,
        candidates: impl Iterator<Item = usize>,
        x: &[f32],
        w: &[f32],
        scale: f32,
        xx: &[f32; 3],
    ) -> Option<usize> {
        let mut best = f32::MAX;
        let mut found = None;
        for j in candidates {
            let d2 = self.error(j, x, w, scale, xx);
            if d2 < best {
                best = d2;
                found = Some(j);
            }
        }
        found
    }

    /// ggml-quants.c `iq1_find_best_neighbour2`: the codebook index for the 8 values `x`
    /// (weights `w`) whose levels `levels` are off the codebook: the neighbour of least
    /// weighted error at `scale`. When no neighbour's error is below `f32::MAX` (an
    /// overflow, only for enormous inputs) ggml scans the whole codebook, reading `x` out
    /// of bounds, and then asserts; here the scan reads `x` as intended and the first
    /// neighbour is the last resort.
    fn nearest(&self, levels: &[u8], x: &[f32], w: &[f32], scale: f32, xx: &[f32; 3]) -> u16 {
        match self.slots[key(levels)] {
            Slot::OnGrid(i) => i,
            Slot::Near { start, end } => {
                let near = &self.neighbours[start as usize..end as usize];
                let by_near = near.iter().map(|&j| usize::from(j));
                self.least_error(by_near, x, w, scale, xx)
                    .or_else(|| self.least_error(0..NGRID, x, w, scale, xx))
                    .map_or(near[0], |j| j as u16)
            }
        }
    }
}

/// ggml's `iq1_sort_helper` order: by value, equal values (including `±0`) tied.
fn by_value(l: f32, r: f32) -> Ordering {
    if l < r {
        Ordering::Less
    } else if l > r {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// Positions of `xb` in ascending order of value, ties in position order (ggml's `qsort`
/// of `(value, position)` pairs: stable in the reference glibc, see the module docs).
fn sorted_positions<const N: usize>(xb: &[f32]) -> [usize; N] {
    let mut order: [usize; N] = std::array::from_fn(|j| j);
    order.sort_by(|&a, &b| by_value(xb[a], xb[b]));
    order
}

/// The levels of a split of the sorted positions `order`: the first `i1` get level 0,
/// up to `i2` level 1, the rest level 2.
fn split_levels<const N: usize>(order: &[usize; N], i1: usize, i2: usize) -> [u8; N] {
    let mut levels = [0u8; N];
    for (j, &i) in order.iter().enumerate() {
        levels[i] = u8::from(j >= i1) + u8::from(j >= i2);
    }
    levels
}

/// The largest magnitude of `xb`, as ggml's loop `MAX(max, fabsf(x))` from `|xb[0]|`.
fn max_abs(xb: &[f32]) -> f32 {
    xb[1..].iter().fold(xb[0].abs(), |m, &v| c_max(m, v.abs()))
}

/// A sub-block's result: codebook indices of its groups of 8, its scale and its shift
/// choice (IQ1_S: `1` or `-1`; IQ1_M: 0..=3, bit 1 the first group's sign, bit 0 the
/// second's).
struct Fit<const G: usize> {
    /// Codebook index of each group of 8.
    index: [u16; G],
    /// The sub-block scale (non-negative).
    scale: f32,
    /// The delta signs chosen.
    shift: i8,
}

/// The common end of ggml's sub-block fits: flips the split to a positive scale
/// (`flip` maps the shift choice), looks each group of 8 up in the codebook (or takes its
/// best neighbour, `xx(shift, k)` the shifted levels of group `k`), and refits the scale
/// by weighted least squares when a group had to move.
fn fit_groups<const N: usize, const G: usize>(
    xb: &[f32],
    w: &[f32],
    mut levels: [u8; N],
    (mut scale, mut shift): (f32, i8),
    flip: fn(i8) -> i8,
    xx: fn(i8, usize) -> [f32; 3],
) -> Fit<G> {
    if scale < 0.0 {
        for l in &mut levels {
            *l = 2 - *l;
        }
        scale = -scale;
        shift = flip(shift);
    }
    let g = grid();
    let mut all_on_grid = true;
    let index: [u16; G] = std::array::from_fn(|k| {
        let r = 8 * k..8 * k + 8;
        if let Slot::Near { .. } = g.slots[key(&levels[r.clone()])] {
            all_on_grid = false;
        }
        g.nearest(
            &levels[r.clone()],
            &xb[r.clone()],
            &w[r],
            scale,
            &xx(shift, k),
        )
    });
    if !all_on_grid {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for (k, &i) in index.iter().enumerate() {
            let xs = xx(shift, k);
            for (j, &l) in g.levels[usize::from(i)].iter().enumerate() {
                let (w, q) = (w[8 * k + j], xs[usize::from(l)]);
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
        if sumqx > 0.0 && sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    Fit {
        index,
        scale,
        shift,
    }
}

/// IQ1_S's shifted levels: the same delta sign for all four groups.
fn s_levels(shift: i8, _group: usize) -> [f32; 3] {
    if shift == 1 {
        plus(IQ1S_DELTA)
    } else {
        minus(IQ1S_DELTA)
    }
}

/// The split search of `quantize_row_iq1_s_impl` for one 32-value sub-block: prefix
/// sums of `w · x` and `w` in sorted order, then every split `(i1, i2)` with either delta
/// sign. Returns the best split's levels, scale and shift, or `None` when no split has a
/// positive weighted norm.
fn s_split(xb: &[f32], w: &[f32]) -> Option<([u8; S_BLOCK], (f32, i8))> {
    let order = sorted_positions::<S_BLOCK>(xb);
    let (mut sumx, mut sumw) = ([0.0f32; S_BLOCK + 1], [0.0f32; S_BLOCK + 1]);
    for (j, &i) in order.iter().enumerate() {
        sumx[j + 1] = sumx[j] + w[i] * xb[i];
        sumw[j + 1] = sumw[j] + w[i];
    }
    let n = S_BLOCK;
    let mut best_score = -f32::MAX;
    let mut best = None;
    for i1 in 0..=n {
        for i2 in i1..=n {
            for (shift, v) in [(1i8, plus(IQ1S_DELTA)), (-1, minus(IQ1S_DELTA))] {
                let sumqx = (sumx[i1] - sumx[0]) * v[0]
                    + (sumx[i2] - sumx[i1]) * v[1]
                    + (sumx[n] - sumx[i2]) * v[2];
                let sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0]
                    + (sumw[i2] - sumw[i1]) * v[1] * v[1]
                    + (sumw[n] - sumw[i2]) * v[2] * v[2];
                if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                    let scale = sumqx / sumq2;
                    best_score = scale * sumqx;
                    best = Some((i1, i2, scale, shift));
                }
            }
        }
    }
    best.map(|(i1, i2, scale, shift)| (split_levels(&order, i1, i2), (scale, shift)))
}

/// One 256-value IQ1_S super-block `x` into `b` (50 bytes), with importance weights `qw`
/// (one per value): ggml-quants.c `quantize_row_iq1_s_impl`. Callers always pass weights
/// (ggml asserts them; [`super::quantize`] refuses IQ1_S).
pub(super) fn iq1_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let qw = qw.expect("IQ1_S needs importance weights");
    b.fill(0);
    let weights = importance(x, Some(qw), 2.0);
    let mut scales = [0.0f32; QK_K / S_BLOCK];
    let mut shifts = [1i8; QK_K / S_BLOCK];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / S_BLOCK {
        let r = S_BLOCK * ib..S_BLOCK * ib + S_BLOCK;
        let (xb, w) = (&x[r.clone()], &weights[r]);
        if max_abs(xb) < S_EPS {
            continue;
        }
        let Some((levels, split)) = s_split(xb, w) else {
            continue;
        };
        let fit: Fit<4> = fit_groups(xb, w, levels, split, |s| -s, s_levels);
        let mut h = 0u16;
        for (k, &i) in fit.index.iter().enumerate() {
            b[2 + 4 * ib + k] = (i & 255) as u8;
            h |= (i >> 8) << (3 * k);
        }
        b[34 + 2 * ib..36 + 2 * ib].copy_from_slice(&h.to_le_bytes());
        scales[ib] = fit.scale;
        shifts[ib] = fit.shift;
        max_scale = c_max(max_scale, fit.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 15.0;
    put_f16(b, 0, d * 1.125);
    let id = 1.0 / d;
    for (ib, (&scale, &shift)) in scales.iter().zip(&shifts).enumerate() {
        let mut l = nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 7) as u16;
        if shift == -1 {
            l |= 8;
        }
        let at = 34 + 2 * ib;
        let h = u16::from_le_bytes([b[at], b[at + 1]]) | l << 12;
        b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    }
}

/// IQ1_M's shifted levels of group `k` for shift choice `shift` (0: both groups `+`,
/// 1: `+ -`, 2: `- +`, 3: `- -`).
fn m_levels(shift: i8, group: usize) -> [f32; 3] {
    let positive = if group == 0 {
        shift < 2
    } else {
        shift % 2 == 0
    };
    if positive {
        plus(IQ1M_DELTA)
    } else {
        minus(IQ1M_DELTA)
    }
}

/// Prefix sums of `w · x` (`px`) and `w` (`pw`) in sorted order, kept apart for the two
/// halves of a 16-value sub-block (as ggml's `quantize_row_iq1_m_impl`).
type HalfSums = ([[f32; M_BLOCK + 1]; 2], [[f32; M_BLOCK + 1]; 2]);

/// [`HalfSums`] of the sub-block `xb` (weights `w`) in the order `order`.
fn half_sums(xb: &[f32], w: &[f32], order: &[usize; M_BLOCK]) -> HalfSums {
    let (mut px, mut pw) = ([[0.0f32; M_BLOCK + 1]; 2], [[0.0f32; M_BLOCK + 1]; 2]);
    for (j, &i) in order.iter().enumerate() {
        let h = usize::from(i >= M_BLOCK / 2);
        px[h][j + 1] = px[h][j] + w[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + w[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    (px, pw)
}

/// The split search of `quantize_row_iq1_m_impl` for one 16-value sub-block: every split
/// `(i1, i2)` with the four choices of delta signs for its two halves, each half's sums
/// in ggml's collapsed form (`T · v₂ - px[i1] - px[i2]`, `W · v₂² + pw[i1] · c₁ + pw[i2] ·
/// c₂`). Returns the best split's levels, scale and choice, or `None`.
fn m_split(xb: &[f32], w: &[f32]) -> Option<([u8; M_BLOCK], (f32, i8))> {
    let order = sorted_positions::<M_BLOCK>(xb);
    let (px, pw) = half_sums(xb, w, &order);
    let n = M_BLOCK;
    let (xp, xm) = (plus(IQ1M_DELTA), minus(IQ1M_DELTA));
    let txs = [px[0][n], px[1][n]];
    let tws = [pw[0][n], pw[1][n]];
    let (p2, m2) = (xp[2], xm[2]);
    let cp1 = xp[0] * xp[0] - xp[1] * xp[1];
    let cp2 = xp[1] * xp[1] - xp[2] * xp[2];
    let cm1 = xm[0] * xm[0] - xm[1] * xm[1];
    let cm2 = xm[1] * xm[1] - xm[2] * xm[2];
    let mut best_score = -f32::MAX;
    let mut best = None;
    for i1 in 0..=n {
        for i2 in i1..=n {
            let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                ([0.0f32; 2], [0.0f32; 2], [0.0; 2], [0.0; 2]);
            for h in 0..2 {
                let sx = px[h][i1] + px[h][i2];
                qx_p[h] = txs[h] * p2 - sx;
                qx_m[h] = txs[h] * m2 - sx;
                q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            let sumqx = [
                qx_p[0] + qx_p[1],
                qx_p[0] + qx_m[1],
                qx_m[0] + qx_p[1],
                qx_m[0] + qx_m[1],
            ];
            let sumq2 = [
                q2_p[0] + q2_p[1],
                q2_p[0] + q2_m[1],
                q2_m[0] + q2_p[1],
                q2_m[0] + q2_m[1],
            ];
            for k in 0..4 {
                if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                    let scale = sumqx[k] / sumq2[k];
                    best_score = scale * sumqx[k];
                    best = Some((i1, i2, scale, k as i8));
                }
            }
        }
    }
    best.map(|(i1, i2, scale, k)| (split_levels(&order, i1, i2), (scale, k)))
}

/// The delta-sign bits of IQ1_M's `qh` for each shift choice (ggml's `masks`).
const M_MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];

/// One 256-value IQ1_M super-block `x` into `b` (56 bytes), with importance weights `qw`
/// (one per value) or without (`None`: weights `x²`): ggml-quants.c
/// `quantize_row_iq1_m_impl`.
pub(super) fn iq1_m(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    b.fill(0);
    let weights = importance(x, qw, 2.0);
    let mut scales = [0.0f32; QK_K / M_BLOCK];
    let mut shifts = [0i8; QK_K / M_BLOCK];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / M_BLOCK {
        let r = M_BLOCK * ib..M_BLOCK * ib + M_BLOCK;
        let (xb, w) = (&x[r.clone()], &weights[r]);
        if max_abs(xb) < M_EPS {
            continue;
        }
        let Some((levels, split)) = m_split(xb, w) else {
            continue;
        };
        let fit: Fit<2> = fit_groups(xb, w, levels, split, |k| 3 - k, m_levels);
        b[2 * ib] = (fit.index[0] & 255) as u8;
        b[2 * ib + 1] = (fit.index[1] & 255) as u8;
        b[32 + ib] = ((fit.index[0] >> 8) | (fit.index[1] >> 8) << 4) as u8;
        scales[ib] = fit.scale;
        shifts[ib] = fit.shift;
        max_scale = c_max(max_scale, fit.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    m_scales(x, &weights, &scales, &shifts, max_scale, b);
}

/// The end of `quantize_row_iq1_m_impl`: each sub-block's 3-bit scale against
/// `max_scale / 15` and its delta-sign bits, then the super-block scale refit by weighted
/// least squares over the whole block as stored (codebook points read back from `b`, an
/// empty sub-block's point 0 included, as ggml does), stored as f16 (times the fudge
/// factor 1.1125) in the top nibbles of the four scale words.
fn m_scales(
    x: &[f32],
    weights: &[f32],
    scales: &[f32],
    shifts: &[i8],
    max_scale: f32,
    b: &mut [u8],
) {
    let g = grid();
    let mut sc = [0u16; 4];
    let mut d = max_scale / 15.0;
    let id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (ib, (&scale, &shift)) in scales.iter().zip(shifts).enumerate() {
        let l = nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
        b[32 + ib] |= M_MASKS[shift as usize];
        let qh = usize::from(b[32 + ib]);
        let mult = (2 * l + 1) as f32;
        for k in 0..2 {
            let xs = m_levels(shift, k);
            let i = usize::from(b[2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700);
            for (j, &lv) in g.levels[i].iter().enumerate() {
                let at = M_BLOCK * ib + 8 * k + j;
                let (w, q) = (weights[at], xs[usize::from(lv)] * mult);
                sumqx += w * q * x[at];
                sumq2 += w * q * q;
            }
        }
    }
    if sumq2 > 0.0 {
        d = sumqx / sumq2;
    }
    let s = f16::from_f32(d * 1.1125).to_bits();
    sc[0] |= (s & 0x000f) << 12;
    sc[1] |= (s & 0x00f0) << 8;
    sc[2] |= (s & 0x0f00) << 4;
    sc[3] |= s & 0xf000;
    for (k, v) in sc.iter().enumerate() {
        b[48 + 2 * k..50 + 2 * k].copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first and last rows of ggml-quants.c's `kgrid_1bit_2048` (in `iq2xs_init_impl`),
    /// against the levels derived from [`IQ1S_GRID`] (the whole table was compared when
    /// this was written).
    #[test]
    fn grid_is_ggmls_kgrid_1bit_2048() {
        let packed: Vec<u16> = grid_levels()
            .iter()
            .map(|l| {
                l.iter()
                    .enumerate()
                    .map(|(i, &v)| u16::from(v) << (2 * i))
                    .sum()
            })
            .collect();
        assert_eq!(packed[..8], [0, 2, 5, 8, 10, 17, 21, 32]);
        assert_eq!(
            packed[NGRID - 8..],
            [43650, 43656, 43658, 43669, 43680, 43682, 43688, 43690]
        );
    }

    /// Every off-codebook group has neighbours, and on-codebook groups map to themselves.
    #[test]
    fn every_group_has_a_slot() {
        let g = grid();
        for (i, l) in g.levels.iter().enumerate() {
            assert!(matches!(g.slots[key(l)], Slot::OnGrid(j) if usize::from(j) == i));
        }
        let off = g
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Near { start, end } if end > start));
        assert_eq!(off.count(), POINTS - NGRID);
    }
}
