//! The legacy 32-element block formats and MXFP4.
//!
//! Layouts (`block_*` in ggml/src/ggml-common.h; byte offsets within a block, all
//! multi-byte fields little-endian, `f16` = IEEE half):
//!
//! | type | bytes | fields |
//! |---|---|---|
//! | Q4_0 | 18 | `d: f16` @0, `qs: [u8; 16]` @2 |
//! | Q4_1 | 20 | `d: f16` @0, `m: f16` @2, `qs: [u8; 16]` @4 |
//! | Q5_0 | 22 | `d: f16` @0, `qh: u32` @2, `qs: [u8; 16]` @6 |
//! | Q5_1 | 24 | `d: f16` @0, `m: f16` @2, `qh: u32` @4, `qs: [u8; 16]` @8 |
//! | Q8_0 | 34 | `d: f16` @0, `qs: [i8; 32]` @2 |
//! | MXFP4 | 17 | `e: u8` (E8M0 exponent) @0, `qs: [u8; 16]` @1 |
//!
//! In the 4-bit formats byte `j` of `qs` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble; Q5's fifth bits are bit `i` of `qh` for element `i`.

use crate::grids::KVALUES_MXFP4;
use crate::{f16_at, u32_at};

/// Splits the 16 nibble bytes at `qs` into the 32 4-bit values of a block, in element order.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
    q
}

/// Q4_0: `y = (q - 8) * d` (ggml-quants.c `dequantize_row_q4_0`).
pub(crate) fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (y, q) in y.iter_mut().zip(nibbles(&b[2..18])) {
        *y = (i32::from(q) - 8) as f32 * d;
    }
}

/// Q4_1: `y = q * d + m` (ggml-quants.c `dequantize_row_q4_1`).
pub(crate) fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (y, q) in y.iter_mut().zip(nibbles(&b[4..20])) {
        *y = f32::from(q) * d + m;
    }
}

/// The 32 5-bit values of a Q5 block: low nibbles from `qs`, fifth bit `i` of `qh`.
#[inline(always)]
fn five_bits(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = nibbles(qs);
    for (i, q) in q.iter_mut().enumerate() {
        *q |= (((qh >> i) & 1) as u8) << 4;
    }
    q
}

/// Q5_0: `y = (q - 16) * d` (ggml-quants.c `dequantize_row_q5_0`).
pub(crate) fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (y, q) in y.iter_mut().zip(five_bits(u32_at(b, 2), &b[6..22])) {
        *y = (i32::from(q) - 16) as f32 * d;
    }
}

/// Q5_1: `y = q * d + m` (ggml-quants.c `dequantize_row_q5_1`).
pub(crate) fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (y, q) in y.iter_mut().zip(five_bits(u32_at(b, 4), &b[8..24])) {
        *y = f32::from(q) * d + m;
    }
}

/// Q8_0: `y = q * d` (ggml-quants.c `dequantize_row_q8_0`).
pub(crate) fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = f32::from(q as i8) * d;
    }
}

/// The scale of an MXFP4 block, halved because the FP4 table holds doubled values:
/// `2^(e - 128)` as an f32 bit pattern, subnormal for `e < 2`
/// (ggml-impl.h `ggml_e8m0_to_fp32_half`; `e = 255` is not treated as NaN there either).
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// MXFP4: `y = kvalues_mxfp4[q] * d` with `d` from [`e8m0_half`]
/// (ggml-quants.c `dequantize_row_mxfp4`).
pub(crate) fn mxfp4(b: &[u8; 17], y: &mut [f32; 32]) {
    let d = e8m0_half(b[0]);
    for (y, q) in y.iter_mut().zip(nibbles(&b[1..17])) {
        *y = f32::from(KVALUES_MXFP4[usize::from(q)]) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let want = 2f64.powi(i32::from(e) - 128) as f32;
            assert_eq!(e8m0_half(e).to_bits(), want.to_bits(), "e = {e}");
        }
    }

    #[test]
    fn q4_0_hand_made_block() {
        // d = 0.5, byte j = (j % 16) | ((15 - j % 16) << 4)
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; 32];
        q4_0(&b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    #[test]
    fn q5_fifth_bit_goes_to_element_i() {
        let mut b = [0u8; 22];
        b[..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
        b[2..6].copy_from_slice(&(1u32 << 3 | 1 << 20).to_le_bytes());
        let mut y = [0.0; 32];
        q5_0(&b, &mut y);
        for (i, v) in y.iter().enumerate() {
            let want = if i == 3 || i == 20 { 0.0 } else { -16.0 };
            assert_eq!(*v, want, "element {i}");
        }
    }
}
