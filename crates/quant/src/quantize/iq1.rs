//! IQ1_S and IQ1_M quantizers.
//!
//! (Being written: ggml/src/ggml-quants.c's `quantize_row_*_impl` for these types.)

/// One 256-value IQ1_S super-block `x` into `b` (50 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq1_s(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}

/// One 256-value IQ1_M super-block `x` into `b` (56 bytes), with importance weights `qw`
/// (one per value) or without (`None`).
pub(super) fn iq1_m(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let _ = (x, qw);
    b.fill(0);
}
