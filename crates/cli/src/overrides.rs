//! `--override-kv` and llama.cpp's RoPE flags, shared by every command that runs a model
//! (CONTRACT.md: "every command that runs a model"); the rule itself is
//! `frink_models::overrides`.

use clap::Args;
use frink_models::overrides::{MetaOverride, RopeOverrides, RopeScaling};

/// Metadata the command line sets in place of the file's, validated as if the file held it.
#[derive(Args, Clone, Debug, Default)]
pub struct OverrideArgs {
    /// Set a metadata key before the model is read: `KEY=TYPE:VALUE` with TYPE `int`,
    /// `float`, `bool` or `str` (llama.cpp's form); repeatable.
    #[arg(long = "override-kv")]
    pub override_kv: Vec<MetaOverride>,
    /// RoPE scaling in place of the file's: none, linear or yarn.
    #[arg(long = "rope-scaling")]
    pub rope_scaling: Option<RopeScaling>,
    /// RoPE context scaling factor: the context is stretched N times (linear or YaRN).
    #[arg(long = "rope-scale", value_name = "N", allow_negative_numbers = true)]
    pub rope_scale: Option<f32>,
    /// RoPE base frequency in place of the file's.
    #[arg(
        long = "rope-freq-base",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub rope_freq_base: Option<f32>,
    /// RoPE frequency scale: positions multiplied by F (the inverse of `--rope-scale`).
    #[arg(
        long = "rope-freq-scale",
        value_name = "F",
        allow_negative_numbers = true
    )]
    pub rope_freq_scale: Option<f32>,
    /// YaRN: the context the model was trained with.
    #[arg(long = "yarn-orig-ctx", value_name = "N")]
    pub yarn_orig_ctx: Option<u32>,
    /// YaRN extrapolation mix factor (0: full interpolation).
    #[arg(
        long = "yarn-ext-factor",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub yarn_ext_factor: Option<f32>,
    /// YaRN attention magnitude scale.
    #[arg(
        long = "yarn-attn-factor",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub yarn_attn_factor: Option<f32>,
    /// YaRN low correction dimension (beta fast).
    #[arg(
        long = "yarn-beta-fast",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub yarn_beta_fast: Option<f32>,
    /// YaRN high correction dimension (beta slow).
    #[arg(
        long = "yarn-beta-slow",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub yarn_beta_slow: Option<f32>,
}

impl OverrideArgs {
    /// The RoPE flags as one value.
    pub fn rope(&self) -> RopeOverrides {
        RopeOverrides {
            scaling: self.rope_scaling,
            scale: self.rope_scale,
            freq_base: self.rope_freq_base,
            freq_scale: self.rope_freq_scale,
            yarn_orig_ctx: self.yarn_orig_ctx,
            yarn_ext_factor: self.yarn_ext_factor,
            yarn_attn_factor: self.yarn_attn_factor,
            yarn_beta_fast: self.yarn_beta_fast,
            yarn_beta_slow: self.yarn_beta_slow,
        }
    }

    /// Whether any override is given.
    pub fn any(&self) -> bool {
        !self.override_kv.is_empty() || self.rope().any()
    }

    /// Every override for a file of architecture `arch`: `--override-kv` in order, then
    /// the RoPE flags' keys, which win over a key set both ways (llama.cpp's RoPE flags
    /// are context parameters that override the metadata, `--override-kv` included).
    pub fn for_arch(&self, arch: &str) -> anyhow::Result<Vec<MetaOverride>> {
        let mut all = self.override_kv.clone();
        all.extend(self.rope().to_overrides(arch).map_err(anyhow::Error::msg)?);
        Ok(all)
    }
}
