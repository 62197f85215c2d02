//! The architecture table: what each supported GGUF architecture needs, as data.
//!
//! One row per `general.architecture`. The forward pass in [`crate::forward`] is a single
//! body parameterised by these rows; an architecture whose topology really differs gets
//! its own small graph function there, built from the same blocks. Sources for each row:
//! llama.cpp `src/models/<arch>.cpp` (graph) and `src/llama-model.cpp` (hyperparameters
//! and tensors), transformers `modeling_<arch>.py`.

/// How RoPE pairs the dimensions of a head (llama.cpp `LLAMA_ROPE_TYPE_NORM` / `_NEOX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(2i, 2i+1)`: llama (the converter permutes Q/K rows to match).
    Normal,
    /// Halves `(i, i + n_rot/2)`: qwen2, gemma, and most others.
    Neox,
}

/// The gated FFN's activation: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU): transformers `gelu_pytorch_tanh`.
    GeluTanh,
}

/// Which layers use sliding-window attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaPattern {
    /// No sliding window; a `sliding_window` key in the file is refused.
    None,
    /// Every layer `il` with `il % period < period - 1` is windowed, the others global;
    /// the window comes from `{arch}.attention.sliding_window` (llama.cpp
    /// `hparams.set_swa_pattern(period)`; gemma3 uses 6).
    LastOfPeriodGlobal(usize),
}

/// How the attention logits are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnScale {
    /// `1/sqrt(head_dim_k)`.
    InvSqrtHeadDim,
    /// gemma2/gemma3: `1/sqrt(n_embd / n_head)` for the 27B models (62 layers for
    /// gemma3), `1/sqrt(head_dim_k)` otherwise (llama.cpp `src/llama-model.cpp`,
    /// `f_attention_scale`; the GGUF has no key for it).
    Gemma,
}

/// One row of the architecture table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchSpec {
    /// `general.architecture` as written in GGUF.
    pub name: &'static str,
    pub rope: RopeLayout,
    /// Q, K and V projections carry biases (`attn_{q,k,v}.bias`): qwen2.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`): gemma3.
    pub qk_norm: bool,
    /// Sandwich norms: RMSNorm of the attention and FFN outputs before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`): gemma2/gemma3.
    pub post_norms: bool,
    pub activation: Activation,
    /// Token embeddings are multiplied by `sqrt(n_embd)`: gemma family.
    pub embed_scale: bool,
    pub swa: SwaPattern,
    pub attn_scale: AttnScale,
    /// Default RoPE base of the sliding-window layers when `rope.freq_base_swa` is absent
    /// (gemma3: 10000, hard-coded by llama.cpp).
    pub rope_base_swa_default: Option<f32>,
}

/// The supported architectures.
pub const ARCHS: &[ArchSpec] = &[
    // llama.cpp src/models/llama.cpp; transformers LlamaForCausalLM.
    ArchSpec {
        name: "llama",
        rope: RopeLayout::Normal,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        activation: Activation::Silu,
        embed_scale: false,
        swa: SwaPattern::None,
        attn_scale: AttnScale::InvSqrtHeadDim,
        rope_base_swa_default: None,
    },
    // llama.cpp src/models/qwen2.cpp; transformers Qwen2ForCausalLM (q/k/v biases).
    ArchSpec {
        name: "qwen2",
        rope: RopeLayout::Neox,
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
        activation: Activation::Silu,
        embed_scale: false,
        swa: SwaPattern::None,
        attn_scale: AttnScale::InvSqrtHeadDim,
        rope_base_swa_default: None,
    },
    // llama.cpp src/models/gemma3.cpp; transformers Gemma3ForCausalLM.
    ArchSpec {
        name: "gemma3",
        rope: RopeLayout::Neox,
        qkv_bias: false,
        qk_norm: true,
        post_norms: true,
        activation: Activation::GeluTanh,
        embed_scale: true,
        swa: SwaPattern::LastOfPeriodGlobal(6),
        attn_scale: AttnScale::Gemma,
        rope_base_swa_default: Some(10000.0),
    },
];

/// The table row for `name`, if supported.
pub fn arch_spec(name: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().find(|a| a.name == name)
}
