//! The ternary types' and MXFP4's quantizers (ggml-quants.c `quantize_row_tq1_0_ref`,
//! `quantize_row_tq2_0_ref`, `quantize_row_mxfp4_ref`), which llama-quantize uses with or
//! without an importance matrix (they ignore it).

use super::put_f16;
use crate::grids::KVALUES_MXFP4;

/// Each value of a ternary block as a trit 0, 1 or 2 (`lroundf(x / amax) + 1`), and the
/// block's scale `amax`.
fn trits(x: &[f32]) -> (f32, [u8; 256]) {
    let mut amax = 0.0f32;
    for &v in x {
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    (
        amax,
        std::array::from_fn(|i| ((x[i] * id).round() as i32 + 1) as u8),
    )
}

/// Trits `t` as one base-3 fraction byte: the first the most significant, scaled to
/// 256/243 by ceiling division (ggml's packing, which `dequantize_row_tq1_0` inverts).
fn pack_trits(t: impl Iterator<Item = u8>) -> u8 {
    let q = t.fold(0u8, |q, t| q * 3 + t);
    (u16::from(q) * 256).div_ceil(243) as u8
}

/// TQ1_0 (54 bytes: `qs[48]` 5 trits a byte, `qh[4]` 4 trits a byte, `d` @52).
pub(super) fn tq1_0(x: &[f32], b: &mut [u8]) {
    let (d, t) = trits(x);
    for m in 0..32 {
        b[m] = pack_trits((0..5).map(|n| t[m + 32 * n]));
    }
    for m in 0..16 {
        b[32 + m] = pack_trits((0..5).map(|n| t[160 + m + 16 * n]));
    }
    for j in 0..4 {
        // Four trits, then a zero trit: the first lands in the most significant place.
        b[48 + j] = pack_trits((0..4).map(|m| t[240 + j + 4 * m]).chain([0]));
    }
    put_f16(b, 52, d);
}

/// TQ2_0 (66 bytes: `qs[64]` four 2-bit values a byte, `d` @64).
pub(super) fn tq2_0(x: &[f32], b: &mut [u8]) {
    let (d, t) = trits(x);
    for h in 0..2 {
        for m in 0..32 {
            b[32 * h + m] = (0..4).fold(0u8, |q, n| q | (t[128 * h + m + 32 * n] & 3) << (2 * n));
        }
    }
    put_f16(b, 64, d);
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`: half of `2^(e - 127)`.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// MXFP4 (17 bytes: the shared exponent `e` @0, nibbles @1): `e = floor(log2 amax) + 125`,
/// each value the FP4 level nearest it at scale `e8m0_half(e)` (the first on ties).
/// (ggml's conversion of an exponent below 0 to `uint8_t` is undefined; it needs
/// `amax < 2^-125`, where this stores 0.)
pub(super) fn mxfp4(x: &[f32], b: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_half(e);
    let best = |v: f32| {
        let mut best = (0usize, (f32::from(KVALUES_MXFP4[0]) * d - v).abs());
        for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
            let err = (f32::from(k) * d - v).abs();
            if err < best.1 {
                best = (i, err);
            }
        }
        best.0 as u8
    };
    b[0] = e;
    for j in 0..16 {
        b[1 + j] = best(x[j]) | best(x[16 + j]) << 4;
    }
}
