//! IQ3_XXS and IQ3_S quantizers.
//!
//! (Being written: ggml/src/ggml-quants.c's `quantize_row_*_impl` for these types.)

/// One 256-value IQ3_XXS super-block `x` into `b` (98 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq3_xxs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}

/// One 256-value IQ3_S super-block `x` into `b` (110 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq3_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}
