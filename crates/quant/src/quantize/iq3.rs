//! IQ3_XXS and IQ3_S quantizers for one 256-value super-block: ggml-quants.c's
//! `quantize_row_iq3_xxs_impl` (grid of 256 points) and `quantize_row_iq3_s_impl` (grid
//! of 512 points, 32-value sub-blocks as `quantize_iq3_s` calls it), with or without an
//! importance matrix.
//!
//! Each 32-value sub-block is quantized as magnitudes with separate signs. The magnitudes
//! go in groups of four onto a grid of level quadruples (levels `0..=7`, values `2l + 1`):
//! a search over scales around `max / 15` rounds every group to levels, replaces a
//! quadruple that is not a grid point by its best neighbour on the grid, and keeps the
//! scale of least weighted error (refit by least squares); groups still off the grid are
//! then re-rounded at that scale. The sub-block scales are finally stored as 4-bit
//! multiples of an f16 super-block scale. Every floating-point operation is ggml's, in its
//! order and without fused multiply-adds, so the bytes are its own.
//!
//! Layouts (ggml-common.h; byte offsets in a block): IQ3_XXS `d` @0, 64 grid indices @2,
//! then per sub-block a `u32` @66 of four 7-bit sign patterns (bits `7k..7k + 7`) and the
//! 4-bit scale (bits 28..32); IQ3_S `d` @0, `qs[64]` @2 (low index bytes), `qh[8]` @66
//! (ninth index bits, one byte per sub-block), `signs[32]` @74, `scales[4]` @106 (two
//! nibbles each).

use std::sync::OnceLock;

use super::kquants::QK_K;
use super::{c_max, importance, put_f16};
use crate::dot::quantize::nearest_int;
use crate::grids::{IQ3S_GRID, IQ3XXS_GRID};

/// Values per sub-block (one scale each).
const SUB: usize = 32;

/// Sub-blocks per super-block.
const SUBS: usize = QK_K / SUB;

/// Four-value groups per sub-block (one grid index each).
const GROUPS: usize = SUB / 4;

/// Largest level (ggml's `kMaxQ - 1`): a level `l` stands for the value `2l + 1`.
const MAX_LEVEL: i32 = 7;

/// Number of level quadruples (`8⁴`): a quadruple's key is `Σ lᵢ << 3i`.
const KEYS: usize = 4096;

/// ggml-quants.c `GROUP_MAX_EPS_IQ3_XXS`: an IQ3_XXS sub-block whose largest magnitude is
/// below it is stored as zero.
const IQ3_XXS_EPS: f32 = 1e-8;

/// Where a level quadruple lies relative to the grid.
#[derive(Clone, Copy)]
enum Slot {
    /// The quadruple is grid point `.0`.
    On(u16),
    /// Not a grid point: its neighbours are `neighbours[start..start + len]`.
    Off {
        /// First neighbour's position in [`Grid::neighbours`].
        start: u32,
        /// Number of neighbours.
        len: u32,
    },
}

/// A quantization grid with its lookup structures (ggml-quants.c `iq3xs_init_impl`).
struct Grid {
    /// Each grid point's four levels.
    levels: Vec<[u8; 4]>,
    /// Every level quadruple, by key: its grid point or its neighbour list.
    slots: Vec<Slot>,
    /// The neighbour lists of the quadruples off the grid, one after another: the grid
    /// points at the `nearest` smallest distinct squared distances, by distance, then index.
    neighbours: Vec<u16>,
}

/// The key of a level quadruple: level `i` in bits `3i..3i + 3`.
fn key(l: &[u8]) -> usize {
    l.iter()
        .enumerate()
        .fold(0, |k, (i, &l)| k | usize::from(l) << (3 * i))
}

/// The value `2l + 1` that level `l` stands for.
fn level_value(l: u8) -> i32 {
    2 * i32::from(l) + 1
}

impl Grid {
    /// The grid of the dequantization table `table` (ggml's `kgrid_256` / `kgrid_512` are
    /// its entries' bytes replaced by their rank among the table's distinct byte values),
    /// each off-grid quadruple given the grid points at its `nearest` smallest squared
    /// distances (ggml's `nwant`: 2 for 256 points, 3 for 512).
    fn new(table: &[u32], nearest: usize) -> Self {
        let bytes = |e: u32| e.to_le_bytes();
        let mut distinct: Vec<u8> = table.iter().flat_map(|&e| bytes(e)).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let rank = |v: u8| distinct.iter().position(|&d| d == v).expect("a table byte") as u8;
        let levels: Vec<[u8; 4]> = table.iter().map(|&e| bytes(e).map(rank)).collect();

        let mut slots = vec![Slot::Off { start: 0, len: 0 }; KEYS];
        for (i, l) in levels.iter().enumerate() {
            slots[key(l)] = Slot::On(i as u16);
        }
        let mut neighbours = Vec::new();
        for (k, slot) in slots.iter_mut().enumerate() {
            if let Slot::Off { start, len } = slot {
                let found = Self::nearest_points(&levels, k, nearest);
                *start = neighbours.len() as u32;
                *len = found.len() as u32;
                neighbours.extend(found);
            }
        }
        Grid {
            levels,
            slots,
            neighbours,
        }
    }

    /// The grid points whose squared distance to quadruple `k` is one of the `nearest`
    /// smallest distinct ones, ordered by distance, then by index.
    fn nearest_points(levels: &[[u8; 4]], k: usize, nearest: usize) -> Vec<u16> {
        let point: [i32; 4] = std::array::from_fn(|i| 2 * ((k >> (3 * i)) & 7) as i32 + 1);
        let mut by_distance: Vec<(i32, u16)> = levels
            .iter()
            .enumerate()
            .map(|(j, l)| {
                let d2 = (0..4).map(|i| (level_value(l[i]) - point[i]).pow(2)).sum();
                (d2, j as u16)
            })
            .collect();
        by_distance.sort_unstable();
        let mut distances = 0;
        let mut last = None;
        let mut found = Vec::new();
        for (d2, j) in by_distance {
            if last != Some(d2) {
                if distances == nearest {
                    break;
                }
                distances += 1;
                last = Some(d2);
            }
            found.push(j);
        }
        found
    }

    /// The neighbour in `neighbours[start..start + len]` (an off-grid list) that best fits
    /// `x` at `scale`: least `Σ w (scale·q - x)²` (`w` the square roots of the weights),
    /// the first on ties (ggml-quants.c `iq3_find_best_neighbour`). Where every error is
    /// NaN or infinite ggml aborts; this takes the first neighbour.
    fn best_neighbour(&self, start: u32, len: u32, x: &[f32], w: &[f32], scale: f32) -> u16 {
        let list = &self.neighbours[start as usize..(start + len) as usize];
        let mut best_d2 = f32::MAX;
        let mut best = list[0];
        for &j in list {
            let l = &self.levels[usize::from(j)];
            let mut d2 = 0.0f32;
            for i in 0..4 {
                let q = level_value(l[i]) as f32;
                let diff = scale * q - x[i];
                d2 += w[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                best = j;
            }
        }
        best
    }

    /// The grid point of a quadruple on the grid.
    fn index_of(&self, l: &[u8]) -> u16 {
        match self.slots[key(l)] {
            Slot::On(i) => i,
            Slot::Off { .. } => unreachable!("levels are always taken from grid points"),
        }
    }
}

/// The 256-point IQ3_XXS grid, built once.
fn grid_256() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| Grid::new(&IQ3XXS_GRID, 2))
}

/// The 512-point IQ3_S grid, built once.
fn grid_512() -> &'static Grid {
    static GRID: OnceLock<Grid> = OnceLock::new();
    GRID.get_or_init(|| Grid::new(&IQ3S_GRID, 3))
}

/// How the two quantizers' sub-block searches differ.
struct Search {
    /// The grid.
    grid: &'static Grid,
    /// Scales tried: `id = (15 + 0.2 · s) / max` for `s` in `-steps..=steps`.
    steps: i32,
    /// Whether the second pass re-rounds every group (IQ3_S) rather than only those the
    /// best scale left off the grid (IQ3_XXS). IQ3_S also starts with every group counted
    /// off the grid, so it always re-rounds; IQ3_XXS starts with them all on.
    redo_all: bool,
}

/// The best scale and levels found for one sub-block.
struct Fit {
    /// The sub-block scale.
    scale: f32,
    /// Each value's level.
    levels: [u8; SUB],
}

/// The weighted sums `(Σ w x q, Σ w q²)` of `x` against levels `l`.
fn sums(w: &[f32; SUB], x: &[f32; SUB], l: &[u8; SUB]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for i in 0..SUB {
        let q = level_value(l[i]) as f32;
        sumqx += w[i] * x[i] * q;
        sumq2 += w[i] * q * q;
    }
    (sumqx, sumq2)
}

/// The levels nearest `id · x` for four values: `nearest_int((id·x - 1) / 2)` within
/// `0..=7`.
fn round_group(x: &[f32], id: f32) -> [u8; 4] {
    std::array::from_fn(|i| nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, MAX_LEVEL) as u8)
}

impl Search {
    /// Group `k` of `x` at `id = 1 / scale` onto the grid: its rounded levels if they are
    /// a grid point, else those of the best neighbour at `scale`. Returns the grid point
    /// and whether the rounded levels were one.
    fn place(
        &self,
        x: &[f32; SUB],
        waux: &[f32; SUB],
        k: usize,
        id: f32,
        scale: f32,
    ) -> (u16, bool) {
        let group = 4 * k..4 * k + 4;
        let l = round_group(&x[group.clone()], id);
        match self.grid.slots[key(&l)] {
            Slot::On(i) => (i, true),
            Slot::Off { start, len } => {
                let best =
                    self.grid
                        .best_neighbour(start, len, &x[group.clone()], &waux[group], scale);
                (best, false)
            }
        }
    }

    /// The scale search of ggml's `quantize_row_iq3_*_impl` for one sub-block of
    /// magnitudes `x` (largest `max > 0`) with weights `w`.
    fn fit(&self, x: &[f32; SUB], w: &[f32; SUB], max: f32) -> Fit {
        let waux: [f32; SUB] = std::array::from_fn(|i| w[i].sqrt());
        let mut best = 0.0f32;
        let mut fit = Fit {
            scale: max / 15.0,
            levels: [0; SUB],
        };
        let mut on_grid = [!self.redo_all; GROUPS];
        for s in -self.steps..=self.steps {
            let id = (15.0 + s as f32 * 0.2) / max;
            let this_scale = 1.0 / id;
            let mut levels = [0u8; SUB];
            let mut on = [true; GROUPS];
            for k in 0..GROUPS {
                let (i, hit) = self.place(x, &waux, k, id, this_scale);
                on[k] = hit;
                levels[4 * k..4 * k + 4].copy_from_slice(&self.grid.levels[usize::from(i)]);
            }
            let (sumqx, sumq2) = sums(w, x, &levels);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                fit.scale = sumqx / sumq2;
                best = fit.scale * sumqx;
                fit.levels = levels;
                on_grid = on;
            }
        }
        if on_grid.contains(&false) && fit.scale > 0.0 {
            self.refit(x, w, &waux, &on_grid, &mut fit);
        }
        fit
    }

    /// The second pass: groups (those off the grid, or all for IQ3_S) re-rounded at the
    /// best scale, then the scale refit by least squares.
    fn refit(
        &self,
        x: &[f32; SUB],
        w: &[f32; SUB],
        waux: &[f32; SUB],
        on_grid: &[bool; GROUPS],
        fit: &mut Fit,
    ) {
        let id = 1.0 / fit.scale;
        for (k, &on) in on_grid.iter().enumerate() {
            if on && !self.redo_all {
                continue;
            }
            let (i, _) = self.place(x, waux, k, id, fit.scale);
            fit.levels[4 * k..4 * k + 4].copy_from_slice(&self.grid.levels[usize::from(i)]);
        }
        let (sumqx, sumq2) = sums(w, x, &fit.levels);
        if sumq2 > 0.0 {
            fit.scale = sumqx / sumq2;
        }
    }

    /// The grid points of a sub-block's levels.
    fn indices(&self, levels: &[u8; SUB]) -> [u16; GROUPS] {
        std::array::from_fn(|k| self.grid.index_of(&levels[4 * k..4 * k + 4]))
    }
}

/// The magnitudes of a sub-block, their largest (`MAX` from the first), and each
/// 8-value group's sign bits (bit `i` set for a negative value).
fn magnitudes(x: &[f32]) -> ([f32; SUB], f32, [u8; SUB / 8]) {
    let mut signs = [0u8; SUB / 8];
    let xval: [f32; SUB] = std::array::from_fn(|i| {
        if x[i] >= 0.0 {
            x[i]
        } else {
            signs[i / 8] |= 1 << (i % 8);
            -x[i]
        }
    });
    let max = xval[1..].iter().fold(xval[0], |m, &v| c_max(m, v));
    (xval, max, signs)
}

/// The 4-bit code of a sub-block scale against `id = 1 / d`: `nearest_int((id·s - 1) / 2)`
/// within `0..=15`.
fn scale_code(id: f32, scale: f32) -> u32 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u32
}

/// IQ3_XXS's sign patterns: each 8-value group's sign bits made even in number by
/// flipping the value of least `w x²` (the first on ties) when they are odd (its
/// magnitude in `xval` negated), the eighth bit then dropped. Returns the four 7-bit
/// patterns.
fn even_signs(x: &[f32], w: &[f32], xval: &mut [f32; SUB], signs: [u8; SUB / 8]) -> [u8; 4] {
    std::array::from_fn(|k| {
        let mut s = signs[k];
        if s.count_ones() % 2 == 1 {
            let g = 8 * k;
            let mut imin = 0;
            let mut min = w[g] * x[g] * x[g];
            for i in 1..8 {
                let ax = w[g + i] * x[g + i] * x[g + i];
                if ax < min {
                    min = ax;
                    imin = i;
                }
            }
            xval[g + imin] = -xval[g + imin];
            s ^= 1 << imin;
        }
        s & 127
    })
}

/// One 256-value IQ3_XXS super-block `x` into `b` (98 bytes), with importance weights `qw`
/// (one per value) or without (`None`): ggml-quants.c `quantize_row_iq3_xxs_impl` with
/// `grid_size = 256`.
pub(super) fn iq3_xxs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let search = Search {
        grid: grid_256(),
        steps: 15,
        redo_all: false,
    };
    let w = importance(x, qw, 2.0);
    let mut indices = [0u8; QK_K / 4];
    let mut meta = [0u32; SUBS];
    let mut scales = [0.0f32; SUBS];
    let mut max_scale = 0.0f32;
    for ib in 0..SUBS {
        let (xs, ws) = (&x[SUB * ib..SUB * (ib + 1)], &w[SUB * ib..SUB * (ib + 1)]);
        let (mut xval, _, signs) = magnitudes(xs);
        let mut signs = even_signs(xs, ws, &mut xval, signs);
        let max = xval[1..].iter().fold(xval[0], |m, &v| c_max(m, v));
        if max < IQ3_XXS_EPS {
            continue;
        }
        let ws: &[f32; SUB] = ws.try_into().expect("a sub-block");
        let mut fit = search.fit(&xval, ws, max);
        if fit.scale < 0.0 {
            fit.scale = -fit.scale;
            signs = signs.map(|s| !s & 127);
        }
        for (k, i) in search.indices(&fit.levels).into_iter().enumerate() {
            indices[GROUPS * ib + k] = i as u8;
        }
        meta[ib] = signs
            .iter()
            .enumerate()
            .fold(0, |m, (k, &s)| m | u32::from(s) << (7 * k));
        scales[ib] = fit.scale;
        max_scale = c_max(max_scale, fit.scale);
    }
    b.fill(0);
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d * 1.0125);
    let id = 1.0 / d;
    b[2..66].copy_from_slice(&indices);
    for ib in 0..SUBS {
        let m = meta[ib] | scale_code(id, scales[ib]) << 28;
        b[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&m.to_le_bytes());
    }
}

/// One 256-value IQ3_S super-block `x` into `b` (110 bytes), with importance weights `qw`
/// (one per value) or without (`None`): ggml-quants.c `quantize_row_iq3_s_impl` with
/// `block_size = 32` (`quantize_iq3_s`).
///
/// As in ggml, an all-zero sub-block writes nothing and does not advance the positions in
/// `qs` and `signs`: the sub-blocks after it are stored one place earlier there (the ninth
/// index bits in `qh` keep their places), and the last place stays zero.
pub(super) fn iq3_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let search = Search {
        grid: grid_512(),
        steps: 9,
        redo_all: true,
    };
    let w = importance(x, qw, 2.0);
    b.fill(0);
    let mut scales = [0.0f32; SUBS];
    let mut max_scale = 0.0f32;
    let mut written = 0;
    for ib in 0..SUBS {
        let (xs, ws) = (&x[SUB * ib..SUB * (ib + 1)], &w[SUB * ib..SUB * (ib + 1)]);
        let (xval, max, mut signs) = magnitudes(xs);
        if max == 0.0 {
            continue;
        }
        let ws: &[f32; SUB] = ws.try_into().expect("a sub-block");
        let mut fit = search.fit(&xval, ws, max);
        if fit.scale < 0.0 {
            fit.scale = -fit.scale;
            signs = signs.map(|s| !s);
        }
        for (k, i) in search.indices(&fit.levels).into_iter().enumerate() {
            b[2 + GROUPS * written + k] = i as u8;
            b[66 + ib] |= ((i >> 8) as u8) << k;
        }
        b[74 + 4 * written..78 + 4 * written].copy_from_slice(&signs);
        written += 1;
        scales[ib] = fit.scale;
        max_scale = c_max(max_scale, fit.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d * 1.033);
    let id = 1.0 / d;
    for (j, pair) in scales.chunks_exact(2).enumerate() {
        b[106 + j] = (scale_code(id, pair[0]) | scale_code(id, pair[1]) << 4) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first entries of ggml-quants.c's `kgrid_256` and `kgrid_512` (`iq3xs_init_impl`):
    /// the level keys derived from the dequantization tables match them.
    #[test]
    fn grid_keys_are_ggmls() {
        let k256 = [0, 2, 4, 9, 11, 15, 16, 18, 25, 34, 59, 61, 65, 67, 72, 74];
        let k512 = [0, 1, 2, 5, 7, 8, 9, 10, 12, 14, 16, 17, 21, 27, 32, 34];
        for (grid, want) in [(grid_256(), k256), (grid_512(), k512)] {
            let got: Vec<usize> = grid.levels[..16].iter().map(|l| key(l)).collect();
            assert_eq!(got, want);
        }
        assert_eq!(key(&grid_256().levels[255]), 3992);
        assert_eq!(key(&grid_512().levels[511]), 4032);
    }

    /// Every grid point maps to itself; every other quadruple has neighbours, nearest first.
    #[test]
    fn every_quadruple_finds_the_grid() {
        for grid in [grid_256(), grid_512()] {
            for (i, l) in grid.levels.iter().enumerate() {
                assert_eq!(usize::from(grid.index_of(l)), i);
            }
            for slot in &grid.slots {
                if let Slot::Off { len, .. } = *slot {
                    assert!(len > 0);
                }
            }
        }
    }
}
