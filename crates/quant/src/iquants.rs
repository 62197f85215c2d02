//! The I-quants: groups of 4 or 8 values looked up in a codebook ([`crate::grids`]),
//! with separate sign bits, and the non-linear 4-bit IQ4 types.
//!
//! Layouts (`block_iq*` in ggml/src/ggml-common.h; byte offsets, little-endian):
//!
//! | type | bytes | fields |
//! |---|---|---|
//! | IQ2_XXS | 66 | `d: f16` @0, `qs: [u16; 32]` @2: per 32 values two u32 words, the first = four 8-bit grid indices, the second = four 7-bit sign indices (bits 0..28) and a 4-bit scale (bits 28..32) |
//! | IQ2_XS | 74 | `d: f16` @0, `qs: [u16; 32]` @2 (9-bit grid index, 7-bit sign index), `scales: [u8; 8]` @66 (two 4-bit scales per 32) |
//! | IQ2_S | 82 | `d: f16` @0, `qs: [u8; 64]` @2 (32 low index bytes, then 32 sign bytes), `qh: [u8; 8]` @66 (2 high index bits per group of 8), `scales: [u8; 8]` @74 |
//! | IQ3_XXS | 98 | `d: f16` @0, `qs: [u8; 96]` @2: 64 grid indices (4 values each), then per 32 values a u32 of four 7-bit sign indices and a 4-bit scale |
//! | IQ3_S | 110 | `d: f16` @0, `qs: [u8; 64]` @2, `qh: [u8; 8]` @66 (ninth index bits), `signs: [u8; 32]` @74, `scales: [u8; 4]` @106 (one nibble per 32) |
//! | IQ1_S | 50 | `d: f16` @0, `qs: [u8; 32]` @2 (low 8 index bits), `qh: [u16; 8]` @34 (per 32: 4 x 3 high index bits, 3-bit scale at bits 12..15, delta sign at bit 15) |
//! | IQ1_M | 56 | `qs: [u8; 32]` @0, `qh: [u8; 16]` @32 (per 8 values: 3 high index bits and a delta sign bit), `scales: [u8; 8]` @48 (3-bit scales; the f16 super-scale is spread over the top nibbles of the four u16s) |
//! | IQ4_NL | 18 | `d: f16` @0, `qs: [u8; 16]` @2 (nibbles index [`KVALUES_IQ4NL`], low nibble = element `j`, high = `j + 16`) |
//! | IQ4_XS | 136 | `d: f16` @0, `scales_h: u16` @2, `scales_l: [u8; 4]` @4, `qs: [u8; 128]` @8 |
//!
//! The sign tables: a 7-bit sign index selects `KSIGNS_IQ2XS[idx]`, whose bit `j` negates
//! value `j` of the group of 8 (the eighth sign is implied by even parity).

use crate::grids::{
    IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
    KSIGNS_IQ2XS, KVALUES_IQ4NL,
};
use crate::{f16_at, u16_at, u32_at, QK_K};

/// Byte `j` of a little-endian packed codebook entry.
#[inline(always)]
fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// Writes `db * grid[j]`, negated where bit `j` of `signs` is set, for the 8 values of
/// one codebook entry (the inner loop shared by IQ2_XXS, IQ2_XS and IQ2_S). ggml
/// multiplies by `-1.f` or `1.f`, which is exactly a conditional negation.
#[inline(always)]
fn signed_grid8(y: &mut [f32], db: f32, entry: u64, signs: u8) {
    for (j, y) in y[..8].iter_mut().enumerate() {
        let v = db * f32::from(grid_byte(entry, j));
        *y = if signs & (1 << j) != 0 { -v } else { v };
    }
}

/// The same for two 4-value entries (IQ3_XXS, IQ3_S): `lo` gives values 0..4 and `hi`
/// values 4..8 of the group, signed by bits 0..8 of `signs`.
#[inline(always)]
fn signed_grid4x2(y: &mut [f32], db: f32, lo: u32, hi: u32, signs: u8) {
    let entry = u64::from(lo) | (u64::from(hi) << 32);
    signed_grid8(y, db, entry, signs);
}

/// The scale of a group of 32 in IQ2_XXS/IQ2_XS/IQ2_S: `d * (0.5 + s) * 0.25`, evaluated
/// left to right in f32 as ggml does.
#[inline(always)]
fn iq2_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// IQ2_XXS (ggml-quants.c `dequantize_row_iq2_xxs`).
pub(crate) fn iq2_xxs(b: &[u8; 66], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let at = 2 + 8 * ib;
        let meta = u32_at(b, at + 4);
        let db = iq2_scale(d, meta >> 28);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let entry = IQ2XXS_GRID[usize::from(b[at + l])];
            let signs = KSIGNS_IQ2XS[((meta >> (7 * l)) & 127) as usize];
            signed_grid8(y, db, entry, signs);
        }
    }
}

/// IQ2_XS (ggml-quants.c `dequantize_row_iq2_xs`): groups 0-1 of each 32 use the low
/// scale nibble, groups 2-3 the high one.
pub(crate) fn iq2_xs(b: &[u8; 74], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = b[66 + ib];
        let db = [
            iq2_scale(d, u32::from(sc & 0x0F)),
            iq2_scale(d, u32::from(sc >> 4)),
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let entry = IQ2XS_GRID[usize::from(q & 511)];
            let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
            signed_grid8(y, db[l / 2], entry, signs);
        }
    }
}

/// IQ2_S (ggml-quants.c `dequantize_row_iq2_s`): 10-bit grid index = `qs` byte plus two
/// bits of `qh`; 8 explicit sign bits per group.
pub(crate) fn iq2_s(b: &[u8; 82], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = scales[ib];
        let db = [
            iq2_scale(d, u32::from(sc & 0x0F)),
            iq2_scale(d, u32::from(sc >> 4)),
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let high = (usize::from(qh[ib]) >> (2 * l)) & 3;
            let entry = IQ2S_GRID[usize::from(qs[4 * ib + l]) | (high << 8)];
            signed_grid8(y, db[l / 2], entry, signs[4 * ib + l]);
        }
    }
}

/// IQ3_XXS (ggml-quants.c `dequantize_row_iq3_xxs`): scale `d * (0.5 + s) * 0.5`.
pub(crate) fn iq3_xxs(b: &[u8; 98], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let meta = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (meta >> 28) as f32) * 0.5;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((meta >> (7 * l)) & 127) as usize];
            let lo = IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l])];
            let hi = IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l + 1])];
            signed_grid4x2(y, db, lo, hi, signs);
        }
    }
}

/// IQ3_S (ggml-quants.c `dequantize_row_iq3_s`): 9-bit grid indices (ninth bit from
/// `qh`), 8 explicit sign bits per group, scale `d * (1 + 2 * s)`.
pub(crate) fn iq3_s(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let s = (scales[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let db = d * (1 + 2 * i32::from(s)) as f32;
        let high = usize::from(qh[ib]);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let lo = IQ3S_GRID[usize::from(qs[8 * ib + 2 * l]) | (((high >> (2 * l)) & 1) << 8)];
            let hi =
                IQ3S_GRID[usize::from(qs[8 * ib + 2 * l + 1]) | (((high >> (2 * l + 1)) & 1) << 8)];
            signed_grid4x2(y, db, lo, hi, signs[4 * ib + l]);
        }
    }
}

/// Writes `dl * (grid[j] + delta)` for the 8 signed values of an IQ1 codebook entry.
#[inline(always)]
fn iq1_grid8(y: &mut [f32], dl: f32, entry: u64, delta: f32) {
    for (j, y) in y[..8].iter_mut().enumerate() {
        *y = dl * (f32::from(grid_byte(entry, j) as i8) + delta);
    }
}

/// IQ1_S (ggml-quants.c `dequantize_row_iq1_s`): per 32 values, scale
/// `d * (2 * s + 1)` and one shared delta of ±[`IQ1S_DELTA`].
pub(crate) fn iq1_s(b: &[u8; 50], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let h = u16_at(b, 34 + 2 * ib);
        let dl = d * (2 * i32::from((h >> 12) & 7) + 1) as f32;
        let delta = if h & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let idx = usize::from(qs[4 * ib + l]) | (usize::from((h >> (3 * l)) & 7) << 8);
            iq1_grid8(y, dl, IQ1S_GRID[idx], delta);
        }
    }
}

/// IQ1_M (ggml-quants.c `dequantize_row_iq1_m`): per 16 values a 3-bit scale
/// `d * (2 * s + 1)`, per 8 values a delta sign; the f16 super-scale `d` is assembled
/// from the top nibbles of the four little-endian u16 scale words.
pub(crate) fn iq1_m(b: &[u8; 56], y: &mut [f32; QK_K]) {
    let qs = &b[0..32];
    let qh = &b[32..48];
    let sc: [u16; 4] = std::array::from_fn(|k| u16_at(b, 48 + 2 * k));
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    let d = half::f16::from_bits(d_bits).to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let word = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [
            d * (2 * i32::from(word & 7) + 1) as f32,
            d * (2 * i32::from((word >> 3) & 7) + 1) as f32,
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            // Group l takes its high bits from nibble l % 2 of qh[2 * ib + l / 2].
            let nib = (qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0x0F;
            let idx = usize::from(qs[4 * ib + l]) | (usize::from(nib & 7) << 8);
            let delta = if nib & 8 != 0 {
                -IQ1M_DELTA
            } else {
                IQ1M_DELTA
            };
            iq1_grid8(y, dl[l / 2], IQ1S_GRID[idx], delta);
        }
    }
}

/// IQ4_NL: `y = d * kvalues_iq4nl[q]` (ggml-quants.c `dequantize_row_iq4_nl`).
pub(crate) fn iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    iq4_group(&b[2..18], d, y);
}

/// One group of 32 IQ4 values: nibble `j` low -> element `j`, high -> element `j + 16`.
#[inline(always)]
fn iq4_group(qs: &[u8], dl: f32, y: &mut [f32]) {
    for j in 0..16 {
        y[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)]);
        y[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
    }
}

/// IQ4_XS: per 32 values a 6-bit scale `ls` (low nibble from `scales_l`, top two bits
/// from `scales_h`), `y = d * (ls - 32) * kvalues_iq4nl[q]` evaluated as
/// `(d * (ls - 32)) * kvalue` (ggml-quants.c `dequantize_row_iq4_xs`).
pub(crate) fn iq4_xs(b: &[u8; 136], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let ls = i32::from(low | (high << 4));
        let dl = d * (ls - 32) as f32;
        iq4_group(&b[8 + 16 * ib..][..16], dl, y);
    }
}
