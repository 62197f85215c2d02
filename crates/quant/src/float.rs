//! Plain floating-point types: one value per "block".
//!
//! | type | bytes | rule (source) |
//! |---|---|---|
//! | F32 | 4, IEEE binary32 LE | copied |
//! | F16 | 2, IEEE binary16 LE | exact widening (`ggml_fp16_to_fp32_row`, ggml/src/ggml.c; `GGML_FP16_TO_FP32`, ggml-impl.h) |
//! | BF16 | 2, bfloat16 LE | the 16 bits become the top half of an f32 (`ggml_bf16_to_fp32_row`, ggml.c; `ggml_compute_bf16_to_fp32`, ggml-impl.h) |

/// F32: the stored bits, unchanged.
pub(crate) fn f32_le(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = f32::from_le_bytes(*b);
}

/// F16: exact widening via the `half` crate. NaNs come out quiet, as from ggml (whose
/// hardware and software paths both quieten them).
pub(crate) fn f16_le(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = half::f16::from_le_bytes(*b).to_f32();
}

/// BF16: ggml shifts the 16 bits into the top of an f32 and keeps every NaN payload as
/// it is. `half::bf16::to_f32` does the same except that it quietens signalling NaNs, so
/// the shift is written out here to stay bit-exact for those too.
pub(crate) fn bf16_le(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_agrees_with_half_except_signalling_nan() {
        for bits in 0..=u16::MAX {
            let mut y = [0.0];
            bf16_le(&bits.to_le_bytes(), &mut y);
            let h = half::bf16::from_bits(bits).to_f32();
            if h.is_nan() {
                assert!(y[0].is_nan());
                assert_eq!(y[0].to_bits(), u32::from(bits) << 16);
            } else {
                assert_eq!(y[0].to_bits(), h.to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn f16_known_values() {
        let cases: [(u16, f32); 6] = [
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x0001, 5.960_464_5e-8), // smallest subnormal, 2^-24
            (0x7bff, 65504.0),
            (0x7c00, f32::INFINITY),
            (0x8000, -0.0),
        ];
        for (bits, want) in cases {
            let mut y = [0.0];
            f16_le(&bits.to_le_bytes(), &mut y);
            assert_eq!(y[0].to_bits(), want.to_bits(), "{bits:#06x}");
        }
    }
}
