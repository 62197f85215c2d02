//! The ternary types: values in {-1, 0, 1} times one f16 scale per 256.
//!
//! Layouts (`block_tq1_0`, `block_tq2_0` in ggml/src/ggml-common.h):
//!
//! | type | bytes | fields |
//! |---|---|---|
//! | TQ1_0 | 54 | `qs: [u8; 48]` @0 (5 trits per byte), `qh: [u8; 4]` @48 (4 trits per byte), `d: f16` @52 |
//! | TQ2_0 | 66 | `qs: [u8; 64]` @0 (4 two-bit values per byte), `d: f16` @64 |
//!
//! TQ1_0 stores trits as a base-3 fixed-point fraction: the `n`-th trit of byte `x` is the
//! top "digit" of `x * 3^n` (wrapping in 8 bits), i.e. `((x * 3^n mod 256) * 3) >> 8`.

use crate::{f16_at, QK_K};

/// Trit `n` (0..5) of a TQ1_0 byte, as 0, 1 or 2.
#[inline(always)]
fn trit(x: u8, n: u32) -> i32 {
    let shifted = x.wrapping_mul(3u8.pow(n));
    i32::from((u16::from(shifted) * 3) >> 8)
}

/// TQ1_0: `y = (t - 1) * d` (ggml-quants.c `dequantize_row_tq1_0`).
///
/// Output order: bytes 0..32 of `qs` give 5 runs of 32 (trit 0 of every byte, then
/// trit 1, ...), bytes 32..48 give 5 runs of 16, and `qh` gives 4 runs of 4.
pub(crate) fn tq1_0(b: &[u8; 54], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 52);
    let groups: [(&[u8], u32); 3] = [(&b[0..32], 5), (&b[32..48], 5), (&b[48..52], 4)];
    let mut out = y.iter_mut();
    for (bytes, n_trits) in groups {
        for n in 0..n_trits {
            for (&x, y) in bytes.iter().zip(&mut out) {
                *y = (trit(x, n) - 1) as f32 * d;
            }
        }
    }
}

/// TQ2_0: `y = (q - 1) * d` with 2-bit `q` (ggml-quants.c `dequantize_row_tq2_0`).
///
/// Each 32-byte half of `qs` gives 4 runs of 32: bits 0-1 of every byte, then bits 2-3, ...
pub(crate) fn tq2_0(b: &[u8; 66], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 64);
    for (e, y) in y.iter_mut().enumerate() {
        let (half, shift, lane) = (e / 128, (e % 128) / 32, e % 32);
        let q = (b[32 * half + lane] >> (2 * shift)) & 3;
        *y = (i32::from(q) - 1) as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trits_round_trip() {
        // ggml packs 5 trits t0..t4 as ceil((sum t_i 3^(4-i)) * 256 / 243).
        for v in 0..243u16 {
            let digits: Vec<i32> = (0..5)
                .map(|i| i32::from((v / 3u16.pow(4 - i)) % 3))
                .collect();
            let x = ((v * 256).div_ceil(243)) as u8;
            let got: Vec<i32> = (0..5).map(|n| trit(x, n)).collect();
            assert_eq!(got, digits, "v = {v}");
        }
    }
}
