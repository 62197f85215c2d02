//! The architecture table: what each supported GGUF architecture needs, as data.
//!
//! One row per `general.architecture`. At load the row, the metadata and the tensors
//! present compile into a [`crate::plan::Plan`], one entry per layer, which the forward
//! pass in [`crate::forward`] walks, each block in [`crate::blocks`]. Sources for each row:
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
    /// gpt-oss's clamped SwiGLU: `(clamp(up, ±7) + 1) · g · sigmoid(1.702 · g)` with
    /// `g = min(gate, 7)` (llama.cpp `ggml_swiglu_oai(gate, up, 1.702, 7)`; transformers
    /// `GptOssExperts`).
    SwigluOai,
    /// GELU, exact (`0.5 · x · (1 + erf(x / √2))`): transformers `gelu` (BERT's
    /// `hidden_act`). llama.cpp's bert.cpp uses its tanh approximation (`LLM_FFN_GELU`);
    /// the reference here is transformers.
    GeluErf,
}

/// Which layers use sliding-window attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaPattern {
    /// No sliding window; a nonzero `sliding_window` key in the file is refused.
    None,
    /// Every layer `il` with `il % period < period - 1` is windowed, the others global;
    /// the window comes from `{arch}.attention.sliding_window` (llama.cpp
    /// `hparams.set_swa_pattern(period)`; gemma3 uses 6, gemma2 2).
    LastOfPeriodGlobal(usize),
    /// Every layer is windowed when the file gives `{arch}.attention.sliding_window`
    /// (mistral).
    All,
    /// Every layer `il` with `il % period != 0` is windowed, the first of each period
    /// global; the period from `{arch}.attention.sliding_window_pattern` (or one bool per
    /// layer there), else the row's (llama.cpp `load_swa_pattern(ml, 3, true)`,
    /// `set_swa_pattern` with `dense_first`: ModernBERT's `global_attn_every_n_layers`).
    FirstOfPeriodGlobal(usize),
    /// Chunked attention (llama.cpp `LLAMA_SWA_TYPE_CHUNKED`; transformers
    /// `attention_chunk_size`): every layer `il` with `il % period < period - 1` sees only
    /// the keys of its query's chunk (positions `⌊p / chunk⌋ · chunk ..= p`), the others
    /// every earlier key. The chunk comes from `{arch}.attention.sliding_window` where the
    /// file has it (0: no chunks), else `default_chunk`; the period from
    /// `{arch}.attention.sliding_window_pattern`, else `period` (llama.cpp
    /// `src/models/llama4.cpp`, `load_arch_hparams`).
    Chunked { period: usize, default_chunk: usize },
    /// The layers `{arch}.attention.sliding_window_pattern` marks true (one bool per
    /// layer) are windowed, the others global (llama.cpp gemma4.cpp: `get_key_or_arr`
    /// into `is_swa`).
    LayerArray,
}

/// How the attention logits are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnScale {
    /// `1/sqrt(head_dim_k)`, or `{arch}.attention.scale` when the file gives it (granite's
    /// `attention_multiplier`).
    InvSqrtHeadDim,
    /// gemma2/gemma3: `1/sqrt(n_embd / n_head)` for the 27B model, recognised (as
    /// llama.cpp's `LLM_TYPE_27B` is) by its layer count `layers_27b`, `1/sqrt(head_dim_k)`
    /// otherwise (llama.cpp `src/llama-model.cpp`, `f_attention_scale`; the GGUF has no key
    /// for it).
    Gemma { layers_27b: usize },
    /// 1: no scaling (Gemma 4's `self.scaling = 1.0`; its Q/K norms bound the scores;
    /// llama.cpp gemma4.cpp `f_attention_scale = 1`).
    One,
}

/// Which layers apply `rope_freqs.weight` (per-pair RoPE frequency divisors) when the file
/// has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFreqs {
    /// None: the tensor is refused as unused.
    Refused,
    /// Every layer that rotates (Llama 3.1's "llama3" scaling: llama.cpp
    /// `src/models/llama.cpp`, `granite.cpp`, `llama4.cpp`).
    All,
    /// The global (unwindowed) layers only: Gemma 4's proportional partial RoPE, whose
    /// factor 1e30 leaves the unrotated pairs as they are (llama.cpp gemma4.cpp).
    Global,
}

/// A recurrent token mixer: its state folds every position into one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recurrent {
    /// Mamba-1's selective scan (llama.cpp `build_mamba_layer`; transformers `MambaMixer`).
    Mamba,
    /// Mamba-2's SSD scan (llama.cpp `build_mamba2_layer`; transformers `Mamba2Mixer`).
    Mamba2,
    /// LFM2's gated short convolution (llama.cpp `src/models/lfm2.cpp`; transformers
    /// `Lfm2ShortConv`).
    ShortConv,
    /// Qwen3-Next's gated DeltaNet (llama.cpp `src/models/qwen3next.cpp`; transformers
    /// `Qwen3NextGatedDeltaNet`).
    GatedDeltaNet,
}

/// Which layers of a hybrid are recurrent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridLayers {
    /// Those whose `attention.head_count_kv[il]` is 0 (lfm2, granitehybrid).
    ZeroKvHeads,
    /// `attention.recurrent_layers[il]`, else every layer but each
    /// `full_attention_interval`-th (qwen3next; llama.cpp's default interval 4).
    RecurrentLayersKey,
}

/// What mixes information across positions in the layers of an architecture (the token
/// mixer of [`crate::plan::LayerPlan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// Attention in every layer; multi-head latent attention where the row allows it
    /// ([`ArchSpec::mla`]) and the file gives `attention.kv_lora_rank`.
    Attention,
    /// The recurrent mixer in every layer, no attention (mamba, mamba2).
    Recurrent(Recurrent),
    /// Attention in some layers, the recurrent mixer in the others.
    Hybrid(Recurrent, HybridLayers),
    /// Attention and the recurrent mixer side by side in every layer, on the same normed
    /// input, their outputs added (falcon-h1).
    Parallel(Recurrent),
}

impl MixerKind {
    /// The recurrent mixer of the architecture, if any.
    pub fn recurrent(self) -> Option<Recurrent> {
        match self {
            MixerKind::Attention => None,
            MixerKind::Recurrent(r) | MixerKind::Hybrid(r, _) | MixerKind::Parallel(r) => Some(r),
        }
    }
}

/// The normalisation used everywhere in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// RMSNorm, `{arch}.attention.layer_norm_rms_epsilon`.
    Rms,
    /// LayerNorm (mean and variance, optional bias), `{arch}.attention.layer_norm_epsilon`.
    Layer,
}

/// Where a layer's norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before the token mixer and before the FFN (`attn_norm`, [`ArchSpec::ffn_norm_name`]).
    Pre,
    /// Before and after each: `attn_norm`, `post_attention_norm`, `ffn_norm`,
    /// `post_ffw_norm` (gemma2/3's sandwich).
    Sandwich,
    /// Only after attention and after the FFN, before the residual adds (olmo2).
    PostOnly,
    /// After each residual add (BERT's post-LN): `x = norm(x + attn(x))` with
    /// `attn_output_norm`, then `x = norm(x + ffn(x))` with `layer_output_norm` (llama.cpp
    /// bert.cpp; transformers `BertSelfOutput`, `BertOutput`).
    PostResidual,
}

/// Per-head or whole-vector RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head's `head_dim_k` values: qwen3, gemma3.
    PerHead,
    /// Over the whole projection (`n_head · head_dim_k` for Q): olmo2.
    Whole,
    /// Each head of Q and K scaled to unit RMS with no weight (eps: the norm epsilon),
    /// **after** RoPE, on the layers that rotate: Llama 4's `Llama4TextL2Norm` (llama.cpp
    /// `src/models/llama4.cpp`: `ggml_rms_norm` of Qcur/Kcur when `use_kq_norm`, which
    /// it turns off for the 128-expert model).
    L2,
}

/// The feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// `down(act(gate(x)) · up(x))` with separate `ffn_gate` and `ffn_up`.
    Gated,
    /// The same with gate and up stored as one `ffn_up` of `2 · n_ff` rows, gate first
    /// (phi3's `gate_up_proj`).
    GatedFused,
    /// `down(act(up(x)))`: starcoder2, falcon, bloom.
    Plain,
}

/// How positions enter attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Rotary embedding of Q and K.
    Rope(RopeLayout),
    /// ALiBi: head `h` adds `slope_h · t` to the score of key position `t` (bloom; ggml
    /// `soft_max_ext` with `max_bias` 8).
    Alibi,
    /// None (state-space models: order comes from the recurrence).
    None,
    /// Learned absolute positions: row `p` of `position_embd` is added to the embedding
    /// of the token at position `p`, and attention sees no positions (BERT; llama.cpp
    /// bert.cpp `ggml_get_rows(pos_embd, inp_pos)`; transformers `BertEmbeddings`). The
    /// table's rows (`context_length`) bound the input.
    Learned,
}

/// Mixture-of-experts routing of an architecture (llama.cpp `build_moe_ffn` arguments in
/// `src/models/<arch>.cpp`; transformers `<Arch>SparseMoeBlock.forward`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    /// The selected experts' weights are renormalised to sum to 1 (`norm_topk_prob`;
    /// mixtral's softmax over the top-k logits is the same thing), unless the file says
    /// otherwise (`{arch}.expert_weights_norm`).
    pub norm_topk: bool,
    /// How router logits become scores when the file has no `{arch}.expert_gating_func`.
    pub gating: Gating,
    /// Each selected expert's weight multiplies its input rather than its output
    /// (llama.cpp `build_moe_ffn`'s `weight_before_ffn`, set for llama4; transformers
    /// `Llama4TextMoe.forward`: `routed_in = hidden_states * router_scores`). The two
    /// differ through the activation.
    pub weight_input: bool,
    /// Only every `{arch}.interleave_moe_layer_step`-th layer (`(il + 1) % step == 0`)
    /// has experts, the others a dense FFN of `feed_forward_length` (llama.cpp
    /// `src/models/llama4.cpp`, `is_moe_layer`).
    pub interleaved: bool,
}

/// The MoE row most architectures use: softmax scores, weights on the expert outputs,
/// experts in every layer past the leading dense ones.
const MOE: MoeSpec = MoeSpec {
    norm_topk: true,
    gating: Gating::Softmax,
    weight_input: false,
    interleaved: false,
};

/// Llama 4's interleaved RoPE ("iRoPE"): while chunked attention is on, every
/// `nope_step`-th layer (`(il + 1) % nope_step == 0`) attends over all earlier keys
/// with no positions (NoPE) and scales its queries by [`AttnTemperature`] (llama.cpp
/// `src/models/llama4.cpp`: `n_no_rope_layer_step`, which no GGUF key sets, and the
/// temperature constants it hard-codes; transformers `Llama4TextAttention`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Irope {
    pub nope_step: usize,
    pub temperature: AttnTemperature,
}

/// Attention temperature tuning of NoPE layers: the queries at position `p` are
/// multiplied by `ln(⌊(p + offset) / floor_scale⌋ + 1) · scale + 1` (llama.cpp
/// `build_inp_attn_scale`; transformers `Llama4TextAttention.forward`:
/// `log1p(floor((cache_position + 1) / floor_scale)) * attn_scale + 1`). It is exactly 1
/// below position `floor_scale - offset`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnTemperature {
    pub floor_scale: f32,
    pub scale: f32,
    pub offset: f32,
}

impl AttnTemperature {
    /// The factor on the queries at position `pos`.
    pub fn factor(&self, pos: usize) -> f32 {
        ((pos as f32 + self.offset) / self.floor_scale)
            .floor()
            .ln_1p()
            * self.scale
            + 1.0
    }
}

/// One row of the architecture table.
///
/// Biases (`attn_q/k/v/qkv/output.bias`, `ffn_up/down.bias`, LayerNorm biases) and fused
/// Q/K/V (`attn_qkv`) are taken from the file wherever present: a tensor that is present is
/// used, never ignored, so they need no row field. Scalars that only some files carry
/// (granite's multipliers, gemma2's soft-capping) come from metadata the same way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchSpec {
    /// `general.architecture` as written in GGUF.
    pub name: &'static str,
    pub position: Position,
    pub norm: Norm,
    pub norm_placement: NormPlacement,
    pub qk_norm: QkNorm,
    pub ffn: Ffn,
    pub activation: Activation,
    /// Attention and FFN read the same normed input and both add to the residual (falcon).
    pub parallel_residual: bool,
    /// Token embeddings are multiplied by `sqrt(n_embd)`: gemma family.
    pub embed_scale: bool,
    pub swa: SwaPattern,
    pub attn_scale: AttnScale,
    /// Default RoPE base of the sliding-window layers when `rope.freq_base_swa` is absent
    /// (gemma3: 10000, hard-coded by llama.cpp).
    pub rope_base_swa_default: Option<f32>,
    /// Routing when the file has experts (`{arch}.expert_count`); `None`: experts refused.
    pub moe: Option<MoeSpec>,
    /// The weight tensor of the norm before the FFN: `ffn_norm.weight`, gpt-oss's and
    /// qwen3next's `post_attention_norm.weight`, falcon-h1's bare `ffn_norm`.
    pub ffn_norm_name: &'static str,
    /// Where `rope_freqs.weight` is applied when the file has it: the architectures whose
    /// llama.cpp graph passes it to `ggml_rope_ext`; elsewhere the tensor is refused.
    pub rope_freqs: RopeFreqs,
    /// Multi-head latent attention when the file gives `attention.kv_lora_rank` (deepseek2);
    /// elsewhere the key is refused.
    pub mla: bool,
    /// The token mixer of the layers.
    pub mixer: MixerKind,
    /// The tensor of the norm after the last layer: `output_norm`, or LFM2's
    /// `token_embd_norm` (its `embedding_norm`, applied at the end: llama.cpp
    /// `src/llama-model.cpp` loads it as `output_norm`); `None` where there is none (BERT,
    /// whose layers end in a norm).
    pub output_norm_name: Option<&'static str>,
    /// The layers have a feed-forward block (Mamba's have none).
    pub has_ffn: bool,
    /// A norm right after the embedding lookup, `token_embd_norm` (bloom).
    pub embd_norm: bool,
    /// Attention uses RoPE only when the file says `rope.scaling.finetuned = true`, else
    /// no positions (Granite 4.0-H's NoPE; llama.cpp `src/models/granite-hybrid.cpp`).
    pub rope_if_finetuned: bool,
    /// The Q projection yields a per-head output gate too (`attn_q` of `2 · n_head ·
    /// head_dim` rows, each head's query then its gate): the attention output is multiplied
    /// by `sigmoid(gate)` before `attn_output` (qwen3next).
    pub attn_output_gate: bool,
    /// Llama 4's NoPE layers and their query temperature, while chunked attention is on.
    pub irope: Option<Irope>,
    /// Each head of V is scaled to unit RMS (no weight) before it is cached (Gemma 4's
    /// `v_norm`; llama.cpp gemma4.cpp `ggml_rms_norm(Vcur)`).
    pub v_norm: bool,
    /// Windowed layers have heads and rotations of their own sizes:
    /// `{arch}.attention.key_length_swa`, `value_length_swa`, `rope.dimension_count_swa`
    /// (Gemma 4: 256-wide sliding heads beside 512-wide global ones).
    pub swa_geometry: bool,
    /// The last `{arch}.attention.shared_kv_layers` layers compute no keys or values and
    /// attend over the cache of the last earlier layer of their own kind (windowed or
    /// global): Gemma 4's KV sharing (transformers `Gemma4TextAttention`,
    /// `kv_shared_layer_index`; llama.cpp gemma4.cpp `has_kv`).
    pub kv_sharing: bool,
    /// Per-layer embeddings where the file gives `{arch}.embedding_length_per_layer_input`
    /// (Gemma 4's PLE, [`crate::blocks::ple`]).
    pub ple: bool,
    /// Multimodal RoPE: `{arch}.rope.dimension_sections` splits each head's rotated pairs
    /// between a position's time, height and width components ([`crate::Sequence::rope_shift`],
    /// [`crate::EmbdRows::grid`]); elsewhere the key is refused.
    pub mrope: bool,
    /// An encoder (BERT family): attention sees the whole input both ways, so an input is
    /// evaluated in one call from an empty state; no LM head, the output is each row's
    /// hidden state (pooled into an embedding, or scored by the classifier head `cls`,
    /// `cls.output`); token-type rows (`token_types`) are added to the embeddings. The
    /// file's `{arch}.attention.causal` must say false where present (llama.cpp
    /// `build_attn_inp_no_cache`; transformers `BertModel`).
    pub encoder: bool,
    /// An encoder's classifier head (`cls` + tanh, `cls.output`) is read where the file
    /// has it (bert, nomic-bert); elsewhere its tensors are refused.
    pub rank_head: bool,
    /// The first layer may have no `attn_norm` (identity): ModernBERT's
    /// (llama.cpp modern-bert.cpp `TENSOR_NOT_REQUIRED` for layer 0).
    pub first_attn_norm_optional: bool,
}

/// The defaults every row starts from: a llama-style decoder.
const BASE: ArchSpec = ArchSpec {
    name: "",
    position: Position::Rope(RopeLayout::Neox),
    norm: Norm::Rms,
    norm_placement: NormPlacement::Pre,
    qk_norm: QkNorm::None,
    ffn: Ffn::Gated,
    activation: Activation::Silu,
    parallel_residual: false,
    embed_scale: false,
    swa: SwaPattern::None,
    attn_scale: AttnScale::InvSqrtHeadDim,
    rope_base_swa_default: None,
    moe: None,
    ffn_norm_name: "ffn_norm.weight",
    rope_freqs: RopeFreqs::Refused,
    mla: false,
    mixer: MixerKind::Attention,
    output_norm_name: Some("output_norm"),
    has_ffn: true,
    embd_norm: false,
    rope_if_finetuned: false,
    attn_output_gate: false,
    irope: None,
    v_norm: false,
    swa_geometry: false,
    kv_sharing: false,
    ple: false,
    mrope: false,
    encoder: false,
    rank_head: false,
    first_attn_norm_optional: false,
};

/// The supported architectures. Sources per row: llama.cpp `src/models/<name>.cpp` and
/// transformers `modeling_<name>.py`.
pub const ARCHS: &[ArchSpec] = &[
    // llama, and mistral converted to `llama` (its window in `llama.attention.sliding_window`
    // applies to every layer, as transformers MistralAttention does; llama.cpp's llama graph
    // ignores the key). transformers LlamaForCausalLM / MistralForCausalLM.
    // With experts: mixtral (llama.cpp llama.cpp's MoE branch, norm_w = true;
    // MixtralSparseMoeBlock: softmax over the top-k logits).
    ArchSpec {
        name: "llama",
        position: Position::Rope(RopeLayout::Normal),
        swa: SwaPattern::All,
        moe: Some(MOE),
        rope_freqs: RopeFreqs::All,
        ..BASE
    },
    // qwen2.cpp; Qwen2ForCausalLM (q/k/v biases, present in the file).
    ArchSpec {
        name: "qwen2",
        ..BASE
    },
    // qwen2vl.cpp; Qwen2-VL's and Qwen2.5-VL's language model (transformers
    // Qwen2_5_VLTextModel): qwen2 with M-RoPE (`ggml_rope_multi`, sections from the file).
    ArchSpec {
        name: "qwen2vl",
        mrope: true,
        ..BASE
    },
    // qwen3.cpp; Qwen3ForCausalLM: per-head Q/K RMSNorm.
    ArchSpec {
        name: "qwen3",
        qk_norm: QkNorm::PerHead,
        ..BASE
    },
    // gemma.cpp; GemmaForCausalLM (the converter stores RMSNorm weights as 1 + w).
    ArchSpec {
        name: "gemma",
        activation: Activation::GeluTanh,
        embed_scale: true,
        ..BASE
    },
    // gemma2.cpp; Gemma2ForCausalLM: sandwich norms, soft-capping (metadata), sliding
    // window on even layers.
    ArchSpec {
        name: "gemma2",
        activation: Activation::GeluTanh,
        embed_scale: true,
        norm_placement: NormPlacement::Sandwich,
        swa: SwaPattern::LastOfPeriodGlobal(2),
        attn_scale: AttnScale::Gemma { layers_27b: 46 },
        ..BASE
    },
    // gemma3.cpp; Gemma3ForCausalLM.
    ArchSpec {
        name: "gemma3",
        qk_norm: QkNorm::PerHead,
        activation: Activation::GeluTanh,
        embed_scale: true,
        norm_placement: NormPlacement::Sandwich,
        swa: SwaPattern::LastOfPeriodGlobal(6),
        attn_scale: AttnScale::Gemma { layers_27b: 62 },
        rope_base_swa_default: Some(10000.0),
        ..BASE
    },
    // qwen2moe.cpp; Qwen2MoeSparseMoeBlock: softmax router, no top-k renormalisation,
    // a shared expert scaled by sigmoid(ffn_gate_inp_shexp · x).
    ArchSpec {
        name: "qwen2moe",
        moe: Some(MoeSpec {
            norm_topk: false,
            ..MOE
        }),
        ..BASE
    },
    // qwen3moe.cpp; Qwen3MoeSparseMoeBlock: per-head Q/K norm, top-k renormalised.
    ArchSpec {
        name: "qwen3moe",
        qk_norm: QkNorm::PerHead,
        moe: Some(MOE),
        ..BASE
    },
    // olmoe.cpp; OlmoeSparseMoeBlock: whole-vector Q/K norm, no renormalisation.
    ArchSpec {
        name: "olmoe",
        position: Position::Rope(RopeLayout::Neox),
        qk_norm: QkNorm::Whole,
        moe: Some(MoeSpec {
            norm_topk: false,
            ..MOE
        }),
        ..BASE
    },
    // deepseek2.cpp; DeepseekV2/V3ForCausalLM: multi-head latent attention (MLA, from
    // `attention.kv_lora_rank`), leading dense layers, routed experts with shared ones,
    // routed scaling; v3's sigmoid gating, selection bias and group-limited routing come
    // from metadata and tensors. RoPE pairs adjacent dimensions of the rope part.
    ArchSpec {
        name: "deepseek2",
        position: Position::Rope(RopeLayout::Normal),
        moe: Some(MoeSpec {
            norm_topk: false,
            ..MOE
        }),
        mla: true,
        ..BASE
    },
    // openai-moe-iswa.cpp (`gpt-oss`); GptOssForCausalLM: attention sinks (attn_sinks),
    // biased projections and router, sliding window on even layers, top-k then softmax
    // over the chosen logits (= renormalised), clamped SwiGLU experts with biases, YaRN
    // RoPE (metadata), the FFN norm stored as post_attention_norm.
    ArchSpec {
        name: "gpt-oss",
        activation: Activation::SwigluOai,
        swa: SwaPattern::LastOfPeriodGlobal(2),
        moe: Some(MOE),
        ffn_norm_name: "post_attention_norm.weight",
        ..BASE
    },
    // phi3.cpp; Phi3ForCausalLM: fused attn_qkv (from the file) and gate|up, partial RoPE
    // (rope.dimension_count).
    ArchSpec {
        name: "phi3",
        ffn: Ffn::GatedFused,
        ..BASE
    },
    // granite.cpp; GraniteForCausalLM: embedding/attention/residual/logit multipliers
    // (metadata).
    ArchSpec {
        name: "granite",
        position: Position::Rope(RopeLayout::Normal),
        rope_freqs: RopeFreqs::All,
        ..BASE
    },
    // olmo2.cpp; Olmo2ForCausalLM: norms after attention and FFN only, whole-vector Q/K
    // norm.
    ArchSpec {
        name: "olmo2",
        norm_placement: NormPlacement::PostOnly,
        qk_norm: QkNorm::Whole,
        ..BASE
    },
    // stablelm.cpp; StableLmForCausalLM: LayerNorm with bias, partial RoPE, q/k/v biases.
    ArchSpec {
        name: "stablelm",
        norm: Norm::Layer,
        ..BASE
    },
    // starcoder2.cpp; Starcoder2ForCausalLM: LayerNorm with bias, biased projections,
    // GELU MLP.
    ArchSpec {
        name: "starcoder2",
        norm: Norm::Layer,
        ffn: Ffn::Plain,
        activation: Activation::GeluTanh,
        ..BASE
    },
    // falcon.cpp; FalconForCausalLM: parallel attention and MLP from one LayerNorm,
    // multi-query fused attn_qkv, GELU MLP.
    ArchSpec {
        name: "falcon",
        norm: Norm::Layer,
        ffn: Ffn::Plain,
        activation: Activation::GeluTanh,
        parallel_residual: true,
        ..BASE
    },
    // bloom.cpp; BloomForCausalLM: ALiBi, LayerNorm after the embedding, fused biased
    // attn_qkv, GELU MLP.
    ArchSpec {
        name: "bloom",
        position: Position::Alibi,
        embd_norm: true,
        norm: Norm::Layer,
        ffn: Ffn::Plain,
        activation: Activation::GeluTanh,
        ..BASE
    },
    // mamba.cpp (build_mamba_layer); MambaForCausalLM: RMSNorm, a selective-scan mixer,
    // no FFN, no positions.
    ArchSpec {
        name: "mamba",
        position: Position::None,
        mixer: MixerKind::Recurrent(Recurrent::Mamba),
        has_ffn: false,
        ..BASE
    },
    // mamba2.cpp (build_mamba2_layer); Mamba2ForCausalLM: the SSD mixer with a gated
    // grouped RMSNorm, no FFN, no positions.
    ArchSpec {
        name: "mamba2",
        position: Position::None,
        mixer: MixerKind::Recurrent(Recurrent::Mamba2),
        has_ffn: false,
        ..BASE
    },
    // lfm2.cpp; Lfm2ForCausalLM: short-convolution and attention layers (per-head Q/K
    // RMSNorm, NEOX RoPE), SwiGLU FFN, the final norm stored as token_embd_norm.
    ArchSpec {
        name: "lfm2",
        qk_norm: QkNorm::PerHead,
        mixer: MixerKind::Hybrid(Recurrent::ShortConv, HybridLayers::ZeroKvHeads),
        output_norm_name: Some("token_embd_norm"),
        ..BASE
    },
    // falcon-h1.cpp; FalconH1ForCausalLM: attention and Mamba-2 side by side on one
    // RMSNorm, outputs added; SwiGLU; the muP multipliers folded into the weights by the
    // converter; the FFN norm stored as a bare `ffn_norm`.
    ArchSpec {
        name: "falcon-h1",
        mixer: MixerKind::Parallel(Recurrent::Mamba2),
        ffn_norm_name: "ffn_norm",
        ..BASE
    },
    // granite-hybrid.cpp; GraniteMoeHybridForCausalLM (Granite 4.0-H): Mamba-2 layers and
    // attention layers (NoPE unless rope.scaling.finetuned), experts with a shared MLP in
    // every layer (softmax over the top-k), granite's multipliers (metadata).
    ArchSpec {
        name: "granitehybrid",
        position: Position::Rope(RopeLayout::Normal),
        mixer: MixerKind::Hybrid(Recurrent::Mamba2, HybridLayers::ZeroKvHeads),
        moe: Some(MOE),
        rope_if_finetuned: true,
        ..BASE
    },
    // qwen3next.cpp; Qwen3NextForCausalLM: gated DeltaNet layers and gated full attention
    // (per-head Q/K norm, partial NEOX RoPE, sigmoid output gate from attn_q), experts
    // with a sigmoid-gated shared expert, the FFN norm stored as post_attention_norm (the
    // converter stores the (1 + w) norm weights with the 1 added).
    ArchSpec {
        name: "qwen3next",
        qk_norm: QkNorm::PerHead,
        mixer: MixerKind::Hybrid(Recurrent::GatedDeltaNet, HybridLayers::RecurrentLayersKey),
        moe: Some(MOE),
        ffn_norm_name: "post_attention_norm.weight",
        attn_output_gate: true,
        ..BASE
    },
    // llama4.cpp (text); Llama4ForCausalLM: chunked attention on three layers of four
    // (the chunk from attention.sliding_window, else 8192 as llama.cpp hard-codes), NoPE
    // with query temperature on the fourth, RoPE on adjacent pairs with Llama 3.1's
    // frequency factors where the file has them, the unweighted L2 Q/K norm after RoPE,
    // experts on every interleave_moe_layer_step-th layer (top-k of the logits, sigmoid
    // weights on the expert inputs, no renormalisation) beside an ungated shared expert.
    ArchSpec {
        name: "llama4",
        position: Position::Rope(RopeLayout::Normal),
        qk_norm: QkNorm::L2,
        swa: SwaPattern::Chunked {
            period: 4,
            default_chunk: 8192,
        },
        rope_freqs: RopeFreqs::All,
        moe: Some(MoeSpec {
            norm_topk: false,
            gating: Gating::Sigmoid,
            weight_input: true,
            interleaved: true,
        }),
        irope: Some(Irope {
            nope_step: 4,
            temperature: AttnTemperature {
                floor_scale: 8192.0,
                scale: 0.1,
                offset: 1.0,
            },
        }),
        ..BASE
    },
    // gemma4.cpp (dense; its experts are refused); Gemma4ForCausalLM: sandwich norms with
    // plain weights, per-head Q/K norm, V-norm, attention scale 1, the window on the layers
    // attention.sliding_window_pattern marks, windowed and global layers of their own head
    // and rotation sizes (proportional partial RoPE on the global ones through
    // rope_freqs.weight), the last layers sharing an earlier layer's keys and values,
    // per-layer embeddings, a per-layer output scale (layer_output_scale, read where
    // present as biases are), GeGLU, final soft-capping (metadata).
    ArchSpec {
        name: "gemma4",
        qk_norm: QkNorm::PerHead,
        activation: Activation::GeluTanh,
        embed_scale: true,
        norm_placement: NormPlacement::Sandwich,
        swa: SwaPattern::LayerArray,
        attn_scale: AttnScale::One,
        rope_freqs: RopeFreqs::Global,
        v_norm: true,
        swa_geometry: true,
        kv_sharing: true,
        ple: true,
        ..BASE
    },
    // bert.cpp; BertModel, XLMRobertaModel (converted as `bert`, its position table cut
    // past the padding offset), BertForSequenceClassification /
    // XLMRobertaForSequenceClassification (the `cls` head, rank pooling): learned positions
    // and token types, LayerNorm after the embeddings and after each residual add,
    // biased projections, a plain GELU (erf) FFN, bidirectional attention, no output norm.
    ArchSpec {
        name: "bert",
        position: Position::Learned,
        norm: Norm::Layer,
        norm_placement: NormPlacement::PostResidual,
        ffn: Ffn::Plain,
        activation: Activation::GeluErf,
        embd_norm: true,
        output_norm_name: None,
        encoder: true,
        rank_head: true,
        ..BASE
    },
    // nomic-bert.cpp with bert.cpp's graph; nomic-embed-text v1/v1.5 (NomicBertModel,
    // the authors' remote code): BERT's post-residual LayerNorms and token types, rotary
    // positions (NEOX pairs, `rope.freq_base`) instead of a position table, fused or
    // separate unbiased Q/K/V, a SwiGLU FFN.
    ArchSpec {
        name: "nomic-bert",
        position: Position::Rope(RopeLayout::Neox),
        norm: Norm::Layer,
        norm_placement: NormPlacement::PostResidual,
        embd_norm: true,
        output_norm_name: None,
        encoder: true,
        rank_head: true,
        ..BASE
    },
    // modern-bert.cpp; ModernBertModel: pre-norm LayerNorms without biases (none before the
    // first layer's attention), a norm after the embeddings and after the last layer,
    // fused unbiased Q/K/V, RoPE (NEOX pairs) with its own base on the windowed layers,
    // symmetric sliding windows (±window/2) on all but every
    // `sliding_window_pattern`-th layer, a fused GeGLU FFN (erf GELU: transformers'
    // `hidden_activation` "gelu"). Its classifier head (cls_norm, GELU) is not read.
    ArchSpec {
        name: "modern-bert",
        position: Position::Rope(RopeLayout::Neox),
        norm: Norm::Layer,
        ffn: Ffn::GatedFused,
        activation: Activation::GeluErf,
        swa: SwaPattern::FirstOfPeriodGlobal(3),
        embd_norm: true,
        encoder: true,
        first_attn_norm_optional: true,
        ..BASE
    },
];

/// The table row for `name`, if supported.
pub fn arch_spec(name: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().find(|a| a.name == name)
}

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts.
    Softmax,
    /// An independent sigmoid per expert (deepseek v3).
    Sigmoid,
}
