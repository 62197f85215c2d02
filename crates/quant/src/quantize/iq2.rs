//! IQ2_XXS, IQ2_XS and IQ2_S quantizers for one 256-value super-block: ggml-quants.c's
//! `quantize_row_iq2_xxs_impl`, `quantize_row_iq2_xs_impl` and `quantize_row_iq2_s_impl`
//! (what `quantize_iq2_*` run per row), bit-exact with ggml.
//!
//! Every value is coded as a sign and a magnitude; groups of eight magnitudes are one point
//! of a codebook ([`IQ2XXS_GRID`] 256 points, [`IQ2XS_GRID`] 512, [`IQ2S_GRID`] 1024) whose
//! coordinates take three levels `l = 0, 1, 2`, standing for the odd values `2l + 1`.
//! Per sub-block (32 values for IQ2_XXS, 16 for the others):
//!
//! 1. weights `w = qw · sqrt(σ² + x²)` (`σ²` the super-block's mean square, doubled for
//!    IQ2_S; without an importance matrix IQ2_S uses `σ²/4 + x²`);
//! 2. signs are split off; IQ2_XXS and IQ2_XS store seven sign bits per group of eight and
//!    need an even number of negatives, so for an odd count the value of least `w x²` keeps
//!    its sign in the magnitude instead (the magnitude turns negative);
//! 3. a scale search: for each trial scale every magnitude is rounded to the nearest level
//!    (clamped to `0..=2`), and a group that is not a codebook point is replaced by the
//!    point of least `sqrt(w)`-weighted error among its precomputed neighbours
//!    ([`Grid`], ggml's `iq2xs_init_impl`); the trial of best weighted least-squares fit
//!    wins. IQ2_XXS starts from `make_qp_quants`' scale and tries 13 scales, the others
//!    from `max / 5` and try 19;
//! 4. groups are snapped again for the winning scale (IQ2_XXS: all; the others: those that
//!    were off the codebook), and the scale refit.
//!
//! The sub-block scales are then coded in 4 bits against `d = max_scale / 31` (IQ2_S stores
//! `d · 0.9875`). Every operation is ggml's, in `f32` and its order, without fused
//! multiply-adds.
//!
//! Layouts (ggml-common.h, byte offsets in a block): IQ2_XXS (66) `d` @0, then per 32
//! values two `u32`: four 8-bit grid indices, and four 7-bit sign indices with the 4-bit
//! scale in bits 28..32; IQ2_XS (74) `d` @0, `qs: [u16; 32]` @2 (9-bit grid index, 7-bit
//! sign index above it), `scales[8]` @66 (low nibble first); IQ2_S (82) `d` @0, `qs[32]`
//! @2 (low 8 bits of each 10-bit grid index), `signs[32]` @34 (8 bits per group), `qh[8]`
//! @66 (the high 2 bits, four groups per byte), `scales[8]` @74.

use std::sync::OnceLock;

use super::kquants::{GROUP_MAX_EPS, QK_K};
use super::weighted::make_qp_quants;
use super::{c_max, put_f16, sum_squares};
use crate::dot::quantize::nearest_int;
use crate::grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

/// ggml's `kMaxQ` for these types: the levels of a coordinate are `0..MAX_Q - 1`, and the
/// odd value of the top level (`2 · 2 + 1`) is `2 · MAX_Q - 1`.
const MAX_Q: i32 = 3;

/// ggml-quants.c `GROUP_MAX_EPS_IQ2_S`: an IQ2_S sub-block below it is all zero.
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;

/// Where a group of eight levels (packed two bits each, coordinate `i` at bits `2i`) lies
/// relative to a codebook.
#[derive(Clone, Copy)]
enum Cell {
    /// On the codebook, at this index.
    On(u16),
    /// Off it: its neighbours are `Grid::neighbours[start..end]`.
    Off(u32, u32),
}

/// A codebook in level space with ggml-quants.c `iq2xs_init_impl`'s lookup structures: the
/// map from every packed group of levels to its codebook index, and for points off the
/// codebook the list of nearest codebook points.
struct Grid {
    /// Each codebook entry's eight levels (ggml's `kgrid_2bit_*` unpacked; its grid holds
    /// the odd values `2l + 1`).
    levels: Vec<[u8; 8]>,
    /// Indexed by the packed levels (16 bits).
    map: Vec<Cell>,
    /// The neighbour lists of all off-codebook points, back to back.
    neighbours: Vec<u16>,
}

impl Grid {
    /// Builds the tables of `codebook` (magnitude bytes as in [`crate::grids`]), keeping as
    /// neighbours of an off-codebook point every entry at one of the `nwant` smallest
    /// distinct squared distances (in odd-value space), nearest first, then by index.
    ///
    /// The levels of an entry's bytes are their ranks among the distinct byte values of
    /// the codebook (`0x08, 0x19, 0x2b` → 0, 1, 2), which reproduces ggml's
    /// `kgrid_2bit_256`, `kgrid_2bit_512` and `kgrid_2bit_1024` (checked in the tests).
    fn new(codebook: &[u64], nwant: usize) -> Self {
        let mut bytes: Vec<u8> = codebook.iter().flat_map(|e| e.to_le_bytes()).collect();
        bytes.sort_unstable();
        bytes.dedup();
        let levels: Vec<[u8; 8]> = codebook
            .iter()
            .map(|e| {
                let b = e.to_le_bytes();
                std::array::from_fn(|i| bytes.iter().position(|&v| v == b[i]).unwrap_or(0) as u8)
            })
            .collect();
        let mut map = vec![Cell::Off(0, 0); 1 << 16];
        for (j, l) in levels.iter().enumerate() {
            map[pack(l)] = Cell::On(j as u16);
        }
        let mut neighbours = Vec::new();
        for (u, cell) in map.iter_mut().enumerate() {
            let point: [u8; 8] = std::array::from_fn(|i| (u >> (2 * i) & 3) as u8);
            // Quantized groups only ever have levels 0..=2.
            if matches!(cell, Cell::On(_)) || point.iter().any(|&l| l >= MAX_Q as u8) {
                continue;
            }
            let start = neighbours.len() as u32;
            nearest(&levels, &point, nwant, &mut neighbours);
            *cell = Cell::Off(start, neighbours.len() as u32);
        }
        Self {
            levels,
            map,
            neighbours,
        }
    }

    /// Rounds the eight magnitudes `xval` times `id` to levels in `l`; a group off the
    /// codebook becomes its best neighbour for `scale` ([`Grid::best_neighbour`]). Returns
    /// whether the rounded group was on the codebook.
    fn snap(&self, xval: &[f32], waux: &[f32], id: f32, scale: f32, l: &mut [u8]) -> bool {
        let mut u = 0;
        for i in 0..8 {
            let q = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, MAX_Q - 1);
            l[i] = q as u8;
            u |= (q as usize) << (2 * i);
        }
        match self.map[u] {
            Cell::On(_) => true,
            Cell::Off(start, end) => {
                let list = &self.neighbours[start as usize..end as usize];
                self.best_neighbour(list, xval, waux, scale, l);
                false
            }
        }
    }

    /// ggml-quants.c `iq2_find_best_neighbour`: the entry of `list` whose odd values times
    /// `scale` are nearest `xval` by `weight`ed squared error (the first on ties); its levels
    /// go to `l`. (For inputs that are not finite, where ggml asserts, the first entry.)
    fn best_neighbour(&self, list: &[u16], xval: &[f32], weight: &[f32], scale: f32, l: &mut [u8]) {
        let mut best_d2 = f32::MAX;
        let mut best = list[0];
        for &j in list {
            let mut d2 = 0.0f32;
            for (i, &level) in self.levels[usize::from(j)].iter().enumerate() {
                let diff = scale * odd(level) - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                best = j;
            }
        }
        l[..8].copy_from_slice(&self.levels[usize::from(best)]);
    }

    /// The codebook index of the eight levels `l` (which always come from the codebook;
    /// ggml aborts otherwise, this gives 0).
    fn index(&self, l: &[u8]) -> u16 {
        match self.map[pack(l)] {
            Cell::On(j) => j,
            Cell::Off(..) => 0,
        }
    }
}

/// Appends to `out` the indices of the `levels` entries at the `nwant` smallest distinct
/// squared distances from `point` (in odd-value space), by distance, then index: the
/// order of ggml's sort of `(distance, index)` pairs.
fn nearest(levels: &[[u8; 8]], point: &[u8; 8], nwant: usize, out: &mut Vec<u16>) {
    let dist: Vec<u32> = levels
        .iter()
        .map(|g| {
            g.iter()
                .zip(point)
                .map(|(&a, &b)| {
                    let d = 2 * (i32::from(a) - i32::from(b));
                    (d * d) as u32
                })
                .sum()
        })
        .collect();
    // Distances are at most 8 · 6² (levels 0..=3: odd values at most 6 apart).
    let mut present = [false; 8 * 36 + 1];
    for &d in &dist {
        present[d as usize] = true;
    }
    let distinct = (0..present.len() as u32).filter(|&d| present[d as usize]);
    for d in distinct.take(nwant) {
        out.extend(
            (0..levels.len())
                .filter(|&j| dist[j] == d)
                .map(|j| j as u16),
        );
    }
}

/// Eight levels packed two bits each, coordinate `i` at bits `2i` (ggml's map key).
fn pack(l: &[u8]) -> usize {
    l[..8]
        .iter()
        .enumerate()
        .fold(0, |u, (i, &v)| u | usize::from(v & 3) << (2 * i))
}

/// The odd value `2l + 1` of level `l` (ggml computes it as an integer, then converts).
#[inline(always)]
fn odd(l: u8) -> f32 {
    f32::from(2 * l + 1)
}

/// IQ2_XXS's tables (ggml `iq2_data[0]`: 256 entries, two neighbour distances).
fn xxs_grid() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| Grid::new(&IQ2XXS_GRID, 2))
}

/// IQ2_XS's tables (ggml `iq2_data[1]`: 512 entries, two neighbour distances).
fn xs_grid() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| Grid::new(&IQ2XS_GRID, 2))
}

/// IQ2_S's tables (ggml `iq2_data[3]`: 1024 entries, one neighbour distance).
fn s_grid() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| Grid::new(&IQ2S_GRID, 1))
}

/// One sub-block's inputs to the search: magnitudes (signs folded out), weights and their
/// square roots (the neighbour search's weights), and each group of eight's sign bits.
struct Sub<const N: usize> {
    /// `|x|`, except one value per odd-parity group in the 7-bit-sign types.
    xval: [f32; N],
    /// The least-squares weights.
    weight: [f32; N],
    /// `sqrt(weight)`.
    waux: [f32; N],
    /// Bit `i` of `signs[k]` set: value `8k + i` is negated (the first `N / 8` used).
    signs: [u8; 4],
}

impl<const N: usize> Sub<N> {
    /// Splits the signs off `xb` with weights `weight`; with `even` (IQ2_XXS, IQ2_XS) a
    /// group with an odd number of negatives keeps the sign of its value of least `w x²`
    /// (the first on ties) in the magnitude, and the sign bits are the low seven.
    fn new(xb: &[f32], weight: [f32; N], even: bool) -> Self {
        let waux = std::array::from_fn(|i| weight[i].sqrt());
        let mut xval = [0.0f32; N];
        let mut signs = [0u8; 4];
        for k in 0..N / 8 {
            let (x, w) = (&xb[8 * k..8 * k + 8], &weight[8 * k..8 * k + 8]);
            let mut s = 0u8;
            for i in 0..8 {
                if x[i] >= 0.0 {
                    xval[8 * k + i] = x[i];
                } else {
                    xval[8 * k + i] = -x[i];
                    s |= 1 << i;
                }
            }
            if even && s.count_ones() % 2 == 1 {
                let mut imin = 0;
                let mut min = w[0] * x[0] * x[0];
                for i in 1..8 {
                    let ax = w[i] * x[i] * x[i];
                    if ax < min {
                        min = ax;
                        imin = i;
                    }
                }
                xval[8 * k + imin] = -xval[8 * k + imin];
                s ^= 1 << imin;
            }
            signs[k] = if even { s & 127 } else { s };
        }
        Self {
            xval,
            weight,
            waux,
            signs,
        }
    }

    /// The largest magnitude (ggml's `MAX` fold from the first).
    fn max(&self) -> f32 {
        self.xval[1..]
            .iter()
            .fold(self.xval[0], |m, &v| if m > v { m } else { v })
    }

    /// `(Σ w x q, Σ w q²)` for the odd values `q` of the levels `l`.
    fn fit(&self, l: &[u8; N]) -> (f32, f32) {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for ((&w, &x), &l) in self.weight.iter().zip(&self.xval).zip(l) {
            let q = odd(l);
            sumqx += w * x * q;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    }

    /// Snaps group `k` for the inverse scale `id` (neighbours judged at `scale`) into `l`.
    fn snap(&self, grid: &Grid, k: usize, id: f32, scale: f32, l: &mut [u8; N]) -> bool {
        let r = 8 * k..8 * k + 8;
        grid.snap(
            &self.xval[r.clone()],
            &self.waux[r.clone()],
            id,
            scale,
            &mut l[r],
        )
    }

    /// The scale search of the `quantize_row_iq2_*_impl`: the inverse scales
    /// `(5 + 0.1 is) / max` for `is` in `-steps..=steps`, each snapped, refit and kept when
    /// its `(Σ w x q)² / Σ w q²` beats the best so far (strictly; from 0). The winner's
    /// scale goes to `scale` and its levels to `l` (both untouched if none wins). Returns a
    /// mask of the winner's groups that were off the codebook.
    fn search(&self, grid: &Grid, max: f32, steps: i32, scale: &mut f32, l: &mut [u8; N]) -> u8 {
        let mut best = 0.0f32;
        let mut off = 0u8;
        let mut trial = [0u8; N];
        for is in -steps..=steps {
            let id = ((2 * MAX_Q - 1) as f32 + is as f32 * 0.1) / max;
            let this_scale = 1.0 / id;
            let mut trial_off = 0u8;
            for k in 0..N / 8 {
                if !self.snap(grid, k, id, this_scale, &mut trial) {
                    trial_off |= 1 << k;
                }
            }
            let (sumqx, sumq2) = self.fit(&trial);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                *scale = sumqx / sumq2;
                best = *scale * sumqx;
                *l = trial;
                off = trial_off;
            }
        }
        off
    }

    /// Snaps the groups in mask `groups` again for `scale` (when positive) and refits it
    /// by least squares (when `Σ w q² > 0`).
    fn refine(&self, grid: &Grid, groups: u8, scale: &mut f32, l: &mut [u8; N]) {
        if groups == 0 || *scale <= 0.0 || scale.is_nan() {
            return;
        }
        let id = 1.0 / *scale;
        for k in 0..N / 8 {
            if groups & 1 << k != 0 {
                self.snap(grid, k, id, *scale, l);
            }
        }
        let (sumqx, sumq2) = self.fit(l);
        if sumq2 > 0.0 {
            *scale = sumqx / sumq2;
        }
    }

    /// Makes a negative scale positive by flipping every sign bit (within `mask`), and
    /// returns the scale, the groups' codebook indices and their sign bits.
    fn finish(mut self, grid: &Grid, mut scale: f32, l: &[u8; N], mask: u8) -> Coded {
        if scale < 0.0 {
            scale = -scale;
            for s in &mut self.signs {
                *s = !*s & mask;
            }
        }
        let mut index = [0u16; 4];
        for (k, index) in index.iter_mut().enumerate().take(N / 8) {
            *index = grid.index(&l[8 * k..8 * k + 8]);
        }
        Coded {
            scale,
            index,
            signs: self.signs,
        }
    }
}

/// A coded sub-block: its (non-negative) scale, and per group of eight the codebook index
/// and sign bits (the first `N / 8` used).
struct Coded {
    /// The sub-block scale.
    scale: f32,
    /// Codebook indices.
    index: [u16; 4],
    /// Sign bits.
    signs: [u8; 4],
}

/// `qw · sqrt(σ² + x²)` for the `N` values from `at`.
fn weights<const N: usize>(x: &[f32], qw: &[f32], sigma2: f32, at: usize) -> [f32; N] {
    std::array::from_fn(|i| qw[at + i] * (sigma2 + x[at + i] * x[at + i]).sqrt())
}

/// The super-block scale `d = max_scale / 31` and each sub-block scale coded in 4 bits as
/// `nearest_int((scale / d - 1) / 2)` clamped to `0..=15` (ggml computes `1 / d` once).
fn scale_codes<const M: usize>(scales: &[f32; M], max_scale: f32) -> (f32, [u8; M]) {
    let d = max_scale / 31.0;
    let id = 1.0 / d;
    let codes =
        std::array::from_fn(|ib| nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8);
    (d, codes)
}

/// One IQ2_XXS sub-block of 32 (from value `at`): the scale from `make_qp_quants`, 13
/// trial scales around it, every group snapped again for the winner. `None` for a
/// sub-block below [`GROUP_MAX_EPS`] or whose first scale is not positive.
fn xxs_sub(grid: &Grid, x: &[f32], qw: &[f32], sigma2: f32, at: usize) -> Option<Coded> {
    let sub = Sub::<32>::new(&x[at..at + 32], weights(x, qw, sigma2, at), true);
    if sub.max() < GROUP_MAX_EPS {
        return None;
    }
    let mut scale = make_qp_quants(MAX_Q + 1, &sub.xval, &mut [0u8; 32], &sub.weight);
    let eff_max = scale * MAX_Q as f32;
    if eff_max <= 0.0 {
        return None;
    }
    // The search always overwrites these levels before they are read when the scale
    // stays positive, and keeps a winner's otherwise.
    let mut l = [0u8; 32];
    sub.search(grid, eff_max, 6, &mut scale, &mut l);
    sub.refine(grid, 0b1111, &mut scale, &mut l);
    Some(sub.finish(grid, scale, &l, 127))
}

/// One IQ2_XS or IQ2_S sub-block of 16 with weights `weight`: 19 trial scales around
/// `max / 5`, then the groups that were off the codebook snapped again for the winner.
/// `None` for a sub-block whose largest magnitude is below `eps`.
fn sub16(grid: &Grid, xb: &[f32], weight: [f32; 16], even: bool, eps: f32) -> Option<Coded> {
    let sub = Sub::<16>::new(xb, weight, even);
    let max = sub.max();
    if max < eps {
        return None;
    }
    let mut scale = max / (2 * MAX_Q - 1) as f32;
    let mut l = [0u8; 16];
    let off = sub.search(grid, max, 9, &mut scale, &mut l);
    sub.refine(grid, off, &mut scale, &mut l);
    Some(sub.finish(grid, scale, &l, if even { 127 } else { 255 }))
}

/// One 256-value IQ2_XXS super-block `x` into `b` (66 bytes) with importance weights `qw`
/// (ggml-quants.c `quantize_row_iq2_xxs_impl`).
///
/// # Panics
/// Without weights (ggml asserts them; [`super::quantize`] refuses the type).
pub(super) fn iq2_xxs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let qw = qw.expect("IQ2_XXS needs importance weights");
    let grid = xxs_grid();
    let sigma2 = sum_squares(&x[..QK_K]) / QK_K as f32;
    let mut words = [[0u32; 2]; QK_K / 32];
    let mut scales = [0.0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 32 {
        let Some(c) = xxs_sub(grid, x, qw, sigma2, 32 * ib) else {
            continue;
        };
        for k in 0..4 {
            words[ib][0] |= u32::from(c.index[k]) << (8 * k);
            words[ib][1] |= u32::from(c.signs[k]) << (7 * k);
        }
        scales[ib] = c.scale;
        max_scale = c_max(max_scale, c.scale);
    }
    b.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let (d, codes) = scale_codes(&scales, max_scale);
    put_f16(b, 0, d);
    for (ib, w) in words.iter().enumerate() {
        let at = 2 + 8 * ib;
        b[at..at + 4].copy_from_slice(&w[0].to_le_bytes());
        let meta = w[1] | u32::from(codes[ib]) << 28;
        b[at + 4..at + 8].copy_from_slice(&meta.to_le_bytes());
    }
}

/// One 256-value IQ2_XS super-block `x` into `b` (74 bytes) with importance weights `qw`
/// (ggml-quants.c `quantize_row_iq2_xs_impl`).
///
/// # Panics
/// Without weights (ggml asserts them; [`super::quantize`] refuses the type).
pub(super) fn iq2_xs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let qw = qw.expect("IQ2_XS needs importance weights");
    let grid = xs_grid();
    let sigma2 = sum_squares(&x[..QK_K]) / QK_K as f32;
    let mut q2 = [0u16; QK_K / 8];
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let weight = weights(x, qw, sigma2, 16 * ib);
        let Some(c) = sub16(grid, &x[16 * ib..16 * ib + 16], weight, true, GROUP_MAX_EPS) else {
            continue;
        };
        for k in 0..2 {
            q2[2 * ib + k] = c.index[k] | u16::from(c.signs[k]) << 9;
        }
        scales[ib] = c.scale;
        max_scale = c_max(max_scale, c.scale);
    }
    b.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let (d, codes) = scale_codes(&scales, max_scale);
    put_f16(b, 0, d);
    for (j, q) in q2.iter().enumerate() {
        b[2 + 2 * j..4 + 2 * j].copy_from_slice(&q.to_le_bytes());
    }
    for (j, pair) in codes.chunks_exact(2).enumerate() {
        b[66 + j] = pair[0] | pair[1] << 4;
    }
}

/// One 256-value IQ2_S super-block `x` into `b` (82 bytes), with importance weights `qw`
/// (one per value) or without (`None`: weights `σ²/4 + x²`) (ggml-quants.c
/// `quantize_row_iq2_s_impl`). Unlike the other two, a super-block whose scales are all
/// zero keeps the grid indices and signs of its coded sub-blocks (with `d = 0`).
pub(super) fn iq2_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let grid = s_grid();
    let sigma2 = 2.0 * sum_squares(&x[..QK_K]) / QK_K as f32;
    let mut scales = [0.0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    b.fill(0);
    for ib in 0..QK_K / 16 {
        let xb = &x[16 * ib..16 * ib + 16];
        let weight = match qw {
            Some(qw) => weights(x, qw, sigma2, 16 * ib),
            None => std::array::from_fn(|i| 0.25 * sigma2 + xb[i] * xb[i]),
        };
        let Some(c) = sub16(grid, xb, weight, false, GROUP_MAX_EPS_IQ2_S) else {
            continue;
        };
        for k in 0..2 {
            let i8 = 2 * ib + k;
            b[2 + i8] = c.index[k] as u8;
            b[66 + i8 / 4] |= ((c.index[k] >> 8) as u8) << (2 * (i8 % 4));
            b[2 + QK_K / 8 + i8] = c.signs[k];
        }
        scales[ib] = c.scale;
        max_scale = c_max(max_scale, c.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let (d, codes) = scale_codes(&scales, max_scale);
    put_f16(b, 0, d * 0.9875);
    for (j, pair) in codes.chunks_exact(2).enumerate() {
        b[74 + j] = pair[0] | pair[1] << 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The levels derived from the codebooks are ggml's `kgrid_2bit_*` (first and last
    /// entries of each, from ggml-quants.c `iq2xs_init_impl`).
    #[test]
    fn levels_match_ggmls_index_tables() {
        let packed = |g: &Grid, j: usize| pack(&g.levels[j]) as u16;
        for g in [xxs_grid(), xs_grid(), s_grid()] {
            let head: Vec<u16> = (0..5).map(|j| packed(g, j)).collect();
            assert_eq!(head, [0, 2, 5, 8, 10]);
        }
        assert_eq!(packed(xxs_grid(), 255), 43268);
        assert_eq!(packed(xs_grid(), 511), 43690);
        assert_eq!(packed(s_grid(), 1023), 43690);
        assert_eq!(packed(xxs_grid(), 16), 100);
        assert_eq!(packed(xs_grid(), 31), 257);
        assert_eq!(packed(s_grid(), 31), 160);
    }

    /// Every reachable off-codebook point has neighbours, all on the codebook, nearest
    /// first.
    #[test]
    fn off_grid_points_have_sorted_neighbours() {
        for g in [xxs_grid(), xs_grid(), s_grid()] {
            for (u, cell) in g.map.iter().enumerate() {
                let point: [u8; 8] = std::array::from_fn(|i| (u >> (2 * i) & 3) as u8);
                if point.iter().any(|&l| l > 2) {
                    continue;
                }
                if let Cell::Off(a, b) = *cell {
                    assert!(b > a, "point {u:#x} has no neighbours");
                    let d = |j: u16| -> i32 {
                        g.levels[usize::from(j)]
                            .iter()
                            .zip(&point)
                            .map(|(&x, &y)| (i32::from(x) - i32::from(y)).pow(2))
                            .sum()
                    };
                    let list = &g.neighbours[a as usize..b as usize];
                    assert!(list.windows(2).all(|w| (d(w[0]), w[0]) < (d(w[1]), w[1])));
                }
            }
        }
    }
}
