//! RoPE parameters of a class of layers: the base, the position scale and YaRN's blend.
//! Leaf types read by the config (`config`), the layer plan (`plan`) and the kernels.

/// RoPE parameters of one class of layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// `rope.freq_base`: θ base.
    pub freq_base: f32,
    /// Position multiplier: 1 / `rope.scaling.factor` for linear and YaRN scaling, else 1.
    pub freq_scale: f32,
    /// YaRN's blend of interpolated and extrapolated frequencies, when scaled by YaRN.
    pub yarn: Option<YarnParams>,
}

/// YaRN RoPE scaling (llama.cpp `ggml_rope_yarn_corr_dims` and `rope_yarn` in
/// ggml-cpu; transformers `_compute_yarn_parameters` with `truncate=True`): pair `i`'s
/// angle mixes the interpolated angle (`freq_scale · θ`) and the original one with a ramp
/// that is 1 below `corr_dims[0]` and 0 above `corr_dims[1]` (× `ext_factor`), and cos/sin
/// are scaled by `attn_factor · (1 + 0.1 ln(1 / freq_scale))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnParams {
    pub corr_dims: [f32; 2],
    pub ext_factor: f32,
    pub attn_factor: f32,
}

impl YarnParams {
    /// The correction range for `n_rot` rotated dimensions of a model trained on
    /// `n_ctx_orig` positions with base `freq_base` (dimensions whose wavelength fits
    /// `beta_fast` or `beta_slow` times in the original context; floor and ceil).
    pub fn new(
        n_rot: usize,
        n_ctx_orig: usize,
        freq_base: f32,
        beta_fast: f32,
        beta_slow: f32,
        ext_factor: f32,
        attn_factor: f32,
    ) -> YarnParams {
        let dim = |beta: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        YarnParams {
            corr_dims: [
                dim(beta_fast).floor().max(0.0),
                dim(beta_slow).ceil().min(n_rot as f32 - 1.0),
            ],
            ext_factor,
            attn_factor,
        }
    }
}
