//! The K-quants: super-blocks of `QK_K` = 256 values split into sub-blocks that each
//! carry a small quantized scale (and, for Q2_K/Q4_K/Q5_K, a min).
//!
//! Layouts (`block_q*_K` in ggml/src/ggml-common.h; byte offsets, little-endian):
//!
//! | type | bytes | fields |
//! |---|---|---|
//! | Q2_K | 84 | `scales: [u8; 16]` @0 (low nibble scale, high nibble min), `qs: [u8; 64]` @16, `d: f16` @80, `dmin: f16` @82 |
//! | Q3_K | 110 | `hmask: [u8; 32]` @0, `qs: [u8; 64]` @32, `scales: [u8; 12]` @96 (16 packed 6-bit scales), `d: f16` @108 |
//! | Q4_K | 144 | `d: f16` @0, `dmin: f16` @2, `scales: [u8; 12]` @4 (8 packed 6-bit scale/min pairs), `qs: [u8; 128]` @16 |
//! | Q5_K | 176 | `d: f16` @0, `dmin: f16` @2, `scales: [u8; 12]` @4, `qh: [u8; 32]` @16, `qs: [u8; 128]` @48 |
//! | Q6_K | 210 | `ql: [u8; 128]` @0, `qh: [u8; 64]` @128, `scales: [i8; 16]` @192, `d: f16` @208 |
//! | Q8_K | 292 | `d: f32` @0, `qs: [i8; 256]` @4, `bsums: [i16; 16]` @260 (unused here) |
//!
//! Bit placement, with `e` the element index in the super-block:
//! - Q2_K/Q3_K low two bits: byte `qs[32 * (e / 128) + e % 32]`, shifted right by
//!   `2 * ((e % 128) / 32)` ([`low2`]); Q3_K's third bit is bit `e / 32` of `hmask[e % 32]`,
//!   and a clear bit subtracts 4. Sub-block (scale) index: `e / 16`.
//! - Q4_K/Q5_K: sub-block `s = e / 32`; its 4-bit values are the low (even `s`) or high
//!   (odd `s`) nibbles of `qs[32 * (s / 2)..][..32]`; Q5_K's fifth bit is bit `s` of
//!   `qh[e % 32]`. Scales and mins come from [`scale_min_k4`].
//! - Q6_K: in each half `n = e / 128`, quarter `k = (e % 128) / 32`, lane `l = e % 32`:
//!   low nibble source `ql[64 n + 32 (k % 2) + l]` (low nibble for `k < 2`, high after),
//!   high two bits `(qh[32 n + l] >> 2k) & 3`; scale index `e / 16`; value minus 32.

use crate::{f16_at, QK_K};

/// The 6-bit scale and 6-bit min of sub-block `j` (0..8) from the 12 packed bytes
/// shared by Q4_K and Q5_K (ggml-quants.c `get_scale_min_k4`).
///
/// Sub-blocks 0..4 keep their scale and min in the low six bits of bytes `j` and `j + 4`;
/// sub-blocks 4..8 take a low nibble from byte `j + 4` and their top two bits from the
/// spare high bits of bytes `j - 4` (scale) and `j` (min).
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The low two bits of element `e` in the Q2_K/Q3_K `qs` plane.
#[inline(always)]
fn low2(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

/// Q2_K: `y = d * scale * q - dmin * min` per 16-element sub-block
/// (ggml-quants.c `dequantize_row_q2_K`).
pub(crate) fn q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let sc = scales[g];
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        for (i, y) in y.iter_mut().enumerate() {
            *y = dl * f32::from(low2(qs, 16 * g + i)) - ml;
        }
    }
}

/// The 16 6-bit scales of Q3_K, unpacked: scale `i` has its low nibble in byte `i`
/// (low nibble, `i < 8`) or byte `i - 8` (high nibble), and its top two bits at bit
/// `2 * (i / 4)` of byte `8 + i % 4` (ggml-quants.c `dequantize_row_q3_K`).
pub(crate) fn q3_k_scales(s: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, out) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *out = low | (high << 4);
    }
    out
}

/// Q3_K: `y = d * (scale - 32) * (q - 4 * !hbit)` per 16-element sub-block
/// (ggml-quants.c `dequantize_row_q3_K`).
pub(crate) fn q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * (i32::from(scales[g]) - 32) as f32;
        for (i, y) in y.iter_mut().enumerate() {
            let e = 16 * g + i;
            let high_set = hmask[e % 32] & (1 << (e / 32)) != 0;
            let q = i32::from(low2(qs, e)) - if high_set { 0 } else { 4 };
            *y = dl * q as f32;
        }
    }
}

/// Q4_K: `y = d * scale * q - dmin * min` per 32-element sub-block
/// (ggml-quants.c `dequantize_row_q4_K`).
pub(crate) fn q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (s, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        let shift = 4 * (s % 2);
        let q = &qs[32 * (s / 2)..][..32];
        for (y, &q) in y.iter_mut().zip(q) {
            *y = d1 * f32::from((q >> shift) & 0x0F) - m1;
        }
    }
}

/// Q5_K: `y = d * scale * (q + 16 * hbit) - dmin * min` per 32-element sub-block
/// (ggml-quants.c `dequantize_row_q5_K`).
pub(crate) fn q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (s, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        let shift = 4 * (s % 2);
        let q = &qs[32 * (s / 2)..][..32];
        for (l, y) in y.iter_mut().enumerate() {
            let high = if qh[l] & (1 << s) != 0 { 16 } else { 0 };
            *y = d1 * f32::from(((q[l] >> shift) & 0x0F) + high) - m1;
        }
    }
}

/// Q6_K: `y = d * scale * (q - 32)`, evaluated as `(d * scale) * (q - 32)`, per
/// 16-element sub-block (ggml-quants.c `dequantize_row_q6_K`).
pub(crate) fn q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for (e, y) in y.iter_mut().enumerate() {
        let (n, k, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = (ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
        let high = (qh[32 * n + l] >> (2 * k)) & 3;
        let q = i32::from(low | (high << 4)) - 32;
        let sc = scales[e / 16] as i8;
        *y = d * f32::from(sc) * q as f32;
    }
}

/// Q8_K: `y = d * q` with an f32 `d` (ggml-quants.c `dequantize_row_q8_K`; ggml lists no
/// `to_float` for this activation format, but defines this routine).
pub(crate) fn q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..260]) {
        *y = d * f32::from(q as i8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_k4_unpacks_all_bits() {
        // Pack 8 known (scale, min) pairs the way the format defines, then unpack them.
        let pairs: [(u8, u8); 8] = [
            (1, 62),
            (63, 0),
            (17, 33),
            (40, 5),
            (63, 63),
            (0, 1),
            (45, 18),
            (2, 60),
        ];
        let mut s = [0u8; 12];
        for (j, &(sc, m)) in pairs.iter().enumerate() {
            if j < 4 {
                s[j] |= sc;
                s[j + 4] |= m;
            } else {
                s[j + 4] = (sc & 0x0F) | ((m & 0x0F) << 4);
                s[j - 4] |= (sc >> 4) << 6;
                s[j] |= (m >> 4) << 6;
            }
        }
        for (j, &pair) in pairs.iter().enumerate() {
            assert_eq!(scale_min_k4(j, &s), pair, "sub-block {j}");
        }
    }

    #[test]
    fn q3_k_scales_unpack_all_bits() {
        let want: [u8; 16] = [0, 63, 7, 56, 32, 31, 1, 62, 9, 18, 27, 36, 45, 54, 3, 48];
        let mut s = [0u8; 12];
        for (i, &v) in want.iter().enumerate() {
            if i < 8 {
                s[i] |= v & 0x0F;
            } else {
                s[i - 8] |= (v & 0x0F) << 4;
            }
            s[8 + i % 4] |= (v >> 4) << (2 * (i / 4));
        }
        assert_eq!(q3_k_scales(&s), want);
    }
}
