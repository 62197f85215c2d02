//! IQ2_XXS, IQ2_XS and IQ2_S quantizers.
//!
//! (Being written: ggml/src/ggml-quants.c's `quantize_row_*_impl` for these types.)

/// One 256-value IQ2_XXS super-block `x` into `b` (66 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq2_xxs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}

/// One 256-value IQ2_XS super-block `x` into `b` (74 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq2_xs(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}

/// One 256-value IQ2_S super-block `x` into `b` (82 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq2_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}
