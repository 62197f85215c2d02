//! [`ModelConfig`]: hyperparameters read once from GGUF metadata.
//!
//! Keys, defaults and derivations follow llama.cpp `src/llama-model.cpp`
//! (`llama_model::load_hparams`) and `src/llama-hparams.{h,cpp}`.

use frink_gguf::{GgufFile, MetaValue};

use crate::arch::{
    arch_spec, ArchSpec, AttnScale, HybridLayers, MixerKind, Norm, Position, QkNorm, Recurrent,
    RopeFreqs, SwaPattern, ARCHS,
};
use crate::error::{ModelError, Result};

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

/// How a sequence's hidden states become one embedding (llama.cpp's
/// `enum llama_pooling_type`, include/llama.h: the values of `{arch}.pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// One embedding per token (0).
    None,
    /// The mean over the sequence's tokens (1).
    Mean,
    /// The first token's (2).
    Cls,
    /// The last token's (3: decoder embedding models such as Qwen3-Embedding).
    Last,
    /// A reranker's score (4).
    Rank,
}

impl Pooling {
    /// The pooling of GGUF value `t`, if known.
    pub fn from_gguf(t: usize) -> Option<Pooling> {
        Some(match t {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => Pooling::Rank,
            _ => return None,
        })
    }

    /// Its name as llama.cpp's `--pooling` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// The pooling `--pooling NAME` names.
    pub fn from_name(name: &str) -> Option<Pooling> {
        [
            Pooling::None,
            Pooling::Mean,
            Pooling::Cls,
            Pooling::Last,
            Pooling::Rank,
        ]
        .into_iter()
        .find(|p| p.name() == name)
    }
}

/// Hyperparameters of a decoder model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The architecture's table row.
    pub arch: &'static ArchSpec,
    /// `{arch}.block_count`.
    pub n_layer: usize,
    /// `{arch}.embedding_length` (hidden size).
    pub n_embd: usize,
    /// `{arch}.feed_forward_length`.
    pub n_ff: usize,
    /// `{arch}.attention.head_count`.
    pub n_head: usize,
    /// `{arch}.attention.head_count_kv` (default: `n_head`).
    pub n_head_kv: usize,
    /// `{arch}.attention.key_length` (default: `n_embd / n_head`).
    pub head_dim_k: usize,
    /// `{arch}.attention.value_length` (default: `head_dim_k`).
    pub head_dim_v: usize,
    /// Rows of `token_embd.weight`.
    pub n_vocab: usize,
    /// `{arch}.context_length`: the context the model was trained for.
    pub n_ctx_train: usize,
    /// The norms' epsilon: `{arch}.attention.layer_norm_rms_epsilon` for RMSNorm,
    /// `{arch}.attention.layer_norm_epsilon` for LayerNorm.
    pub norm_eps: f32,
    /// `{arch}.rope.dimension_count` (default: `head_dim_k`): dimensions rotated per head.
    pub n_rot: usize,
    /// `{arch}.attention.sliding_window` (0 when the architecture has none).
    pub n_swa: usize,
    /// Factor applied to Q·K (llama.cpp `kq_scale` / `f_attention_scale`).
    pub attn_scale: f32,
    /// Factor applied to token embeddings (`sqrt(n_embd)` for gemma, `{arch}.embedding_scale`
    /// for granite, else 1).
    pub embed_scale: f32,
    /// Factor applied to the attention and FFN outputs before each residual add
    /// (`{arch}.residual_scale`: granite; else 1).
    pub residual_scale: f32,
    /// The logits are divided by this (`{arch}.logit_scale`: granite; else 1).
    pub logit_scale: f32,
    /// How the file says its hidden states pool into one embedding
    /// (`{arch}.pooling_type`; `None`: the key is absent, a generative model).
    pub pooling: Option<Pooling>,
    /// Logits become `c · tanh(l / c)` (`{arch}.final_logit_softcapping`: gemma2).
    pub final_softcap: Option<f32>,
    /// ALiBi slope per query head (empty unless the architecture uses ALiBi).
    pub alibi_slopes: Vec<f32>,
    /// Mixture of experts, when the file has experts.
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention, when the file gives `attention.kv_lora_rank`.
    pub mla: Option<MlaConfig>,
    /// The state-space mixer's sizes (`{arch}.ssm.*`: mamba, mamba2).
    pub ssm: Option<SsmConfig>,
    /// Taps of LFM2's short convolution (`{arch}.shortconv.l_cache`).
    pub short_conv_taps: usize,
    /// Width of each layer's per-layer embedding (`{arch}.embedding_length_per_layer_input`:
    /// Gemma 4's PLE; 0: none).
    pub n_embd_per_layer: usize,
    /// Each layer's dense FFN width: `{arch}.feed_forward_length`, one value for every
    /// layer or a per-layer array (llama.cpp `n_ff_arr`; Gemma 4's wider FFN on its
    /// KV-sharing layers).
    pub n_ff_layers: Vec<usize>,
    /// What each layer computes, compiled from the row, this metadata and the tensors
    /// present ([`crate::plan::Plan::compile`]).
    pub plan: crate::plan::Plan,
    /// Where the sizes the tensors must have come from (the keys a shape error names).
    pub sizes: SizeSources,
}

/// The metadata behind the sizes a file's tensors must have, so that a tensor that
/// contradicts them is refused naming the keys (hostile-metadata rule: an error names the
/// key, the value and what it contradicts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SizeSources {
    /// Each count read and each size derived from counts: (value, the keys it comes from,
    /// e.g. `llama.attention.head_count_kv × llama.attention.key_length`).
    pub sizes: Vec<(usize, String)>,
    /// The keys that decide which tensors a layer has, as `key = value`
    /// (`deepseek2.leading_dense_block_count = 1`).
    pub layout: Vec<String>,
}

/// Keys whose values decide which tensors a layer has (not only their sizes).
const LAYOUT_KEYS: [&str; 9] = [
    "expert_count",
    "leading_dense_block_count",
    "expert_shared_count",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "full_attention_interval",
    "interleave_moe_layer_step",
    "attention.shared_kv_layers",
    "embedding_length_per_layer_input",
];

impl SizeSources {
    /// Why a tensor dimension should be `want`: the sources with that value, joined by
    /// "or"; without one, every count read (the size is derived in a way this ledger does
    /// not spell out, and one of them contradicts the tensor).
    pub fn explain(&self, want: usize) -> String {
        let named: Vec<&str> = self
            .sizes
            .iter()
            .filter(|(v, _)| *v == want)
            .map(|(_, from)| from.as_str())
            .collect();
        if !named.is_empty() {
            return format!("{want} from {}", named.join(" or "));
        }
        let all: Vec<String> = self
            .sizes
            .iter()
            .filter(|(_, from)| !from.contains(' '))
            .map(|(v, from)| format!("{from} = {v}"))
            .collect();
        format!("{want} from the metadata ({})", all.join(", "))
    }
}

/// Sizes of a Mamba-1 or Mamba-2 mixer (llama.cpp `hparams.ssm_*`, keys `{arch}.ssm.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct SsmConfig {
    /// `ssm.conv_kernel`: taps of the causal depthwise convolution.
    pub d_conv: usize,
    /// `ssm.inner_size`: channels of the scan (`expand · n_embd`).
    pub d_inner: usize,
    /// `ssm.state_size`: state values per channel (Mamba-1) or per head dimension (Mamba-2);
    /// DeltaNet's key and value head width.
    pub d_state: usize,
    /// `ssm.time_step_rank`: Mamba-1's rank of the Δ projection; Mamba-2's head count;
    /// DeltaNet's value heads.
    pub dt_rank: usize,
    /// `ssm.group_count` (1 when absent): Mamba-2's groups sharing B and C; DeltaNet's key
    /// heads.
    pub n_group: usize,
}

impl SsmConfig {
    /// Channels the convolution runs over: `d_inner` (Mamba-1), `x | B | C` (Mamba-2) or
    /// `q | k | v` (DeltaNet), both `d_inner + 2 · n_group · d_state`.
    pub fn conv_channels(&self, kind: Recurrent) -> usize {
        match kind {
            Recurrent::Mamba => self.d_inner,
            _ => self.d_inner + 2 * self.n_group * self.d_state,
        }
    }
}

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts.
    Softmax,
    /// An independent sigmoid per expert (deepseek v3).
    Sigmoid,
}

/// Multi-head latent attention (deepseek2, llama.cpp `src/models/deepseek2.cpp`): keys and
/// values come from a compressed latent of `kv_lora_rank` values per token, shared by all
/// heads; each head's query is projected into that latent (`attn_k_b`), so the cache holds
/// one `kv_lora_rank + n_rot` key row and one `kv_lora_rank` value row per token, and each
/// head's output is projected back out of it (`attn_v_b`).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// `attention.q_lora_rank` (0: a plain `attn_q`).
    pub q_lora_rank: usize,
    /// `attention.kv_lora_rank`.
    pub kv_lora_rank: usize,
    /// Per-head query/key width before absorption: `attention.key_length_mla`
    /// (= no-RoPE part + `n_rot`).
    pub qk_head_dim: usize,
    /// Per-head value width: `attention.value_length_mla`.
    pub v_head_dim: usize,
}

/// Mixture-of-experts hyperparameters (`{arch}.expert_*`).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// `expert_gating_func`.
    pub gating: Gating,
    /// `expert_group_count` (0: no group-limited routing) and `expert_group_used_count`.
    pub n_group: usize,
    pub n_group_used: usize,
    /// `leading_dense_block_count`: the first layers have a dense FFN.
    pub n_leading_dense: usize,
    /// `expert_count`: routed experts per layer.
    pub n_expert: usize,
    /// `expert_used_count`: experts selected per token (top-k).
    pub n_used: usize,
    /// `expert_feed_forward_length` (default: `feed_forward_length`).
    pub n_ff_exp: usize,
    /// `expert_shared_feed_forward_length` (0 or absent: see `n_shared`).
    pub n_ff_shexp: usize,
    /// `expert_shared_count`: with no shared width key, the shared expert is this many
    /// experts wide (`n_shared · n_ff_exp`, llama.cpp deepseek2's `n_ff_shexp`); absent,
    /// the file's shared-expert tensors decide.
    pub n_shared: Option<usize>,
    /// Renormalise the selected weights to sum to 1 (the architecture's rule).
    pub norm_topk: bool,
    /// `expert_weights_scale`: factor on the selected weights (routed scaling).
    pub weights_scale: f32,
    /// The selected weights multiply the experts' inputs, not their outputs
    /// ([`crate::arch::MoeSpec::weight_input`]).
    pub weight_input: bool,
    /// `interleave_moe_layer_step` where the architecture reads it
    /// ([`crate::arch::MoeSpec::interleaved`]): layer `il` (past the leading dense ones)
    /// has experts when `(il + 1) % step == 0`; 1 elsewhere.
    pub layer_step: usize,
}

impl MoeConfig {
    /// Whether layer `il` has experts (else a dense FFN): past the leading dense layers,
    /// every `layer_step`-th.
    pub fn is_moe_layer(&self, il: usize) -> bool {
        il >= self.n_leading_dense && (il + 1).is_multiple_of(self.layer_step)
    }
}

/// ALiBi slopes of `n_head` heads with ggml's `max_bias` (llama.cpp `ggml_soft_max_ext`;
/// the formula of Press et al., extended to head counts that are not powers of two):
/// with `n = 2^floor(log2 n_head)`, heads `h < n` get `m0^(h+1)`, the others
/// `m1^(2(h-n)+1)`, where `m0 = 2^(-max_bias/n)` and `m1 = 2^(-max_bias/2n)`.
pub fn alibi_slopes(n_head: usize, max_bias: f32) -> Vec<f32> {
    let n = 1usize << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f32.powf(-max_bias / n as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n as f32);
    (0..n_head)
        .map(|h| {
            if h < n {
                m0.powi(h as i32 + 1)
            } else {
                m1.powi(2 * (h - n) as i32 + 1)
            }
        })
        .collect()
}

/// Typed access to `{arch}.*` keys with the error naming the key.
struct Keys<'a> {
    f: &'a GgufFile,
    arch: &'a str,
    /// Every count read so far (full key, value): what tensor shapes are checked against.
    counts: std::cell::RefCell<Vec<(String, usize)>>,
}

impl Keys<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn get(&self, suffix: &str) -> Option<&MetaValue> {
        self.f.get(&self.key(suffix))
    }

    fn err(&self, suffix: &str, detail: impl Into<String>) -> ModelError {
        ModelError::Metadata {
            key: self.key(suffix),
            detail: detail.into(),
        }
    }

    /// A positive count. Per-layer arrays (llama.cpp `get_key_or_arr`) are accepted when
    /// every layer has the same value; differing values are refused, not averaged.
    fn usize_opt(&self, suffix: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(suffix) else {
            return Ok(None);
        };
        if let Some(a) = v.as_array() {
            let vals = a
                .to_i64_vec()
                .ok_or_else(|| self.err(suffix, "array is not of integers"))?;
            return match vals.first() {
                Some(&first) if vals.iter().all(|&x| x == first) && first >= 0 => {
                    self.counts
                        .borrow_mut()
                        .push((self.key(suffix), first as usize));
                    Ok(Some(first as usize))
                }
                _ => Err(ModelError::Unsupported(format!(
                    "{} differs per layer ({vals:?})",
                    self.key(suffix)
                ))),
            };
        }
        let n = v
            .as_u64()
            .ok_or_else(|| self.err(suffix, format!("expected an unsigned integer, found {v}")))?
            as usize;
        self.counts.borrow_mut().push((self.key(suffix), n));
        Ok(Some(n))
    }

    /// An array of one bool per layer, if the file has the key.
    fn bools_per_layer(&self, suffix: &str, n_layer: usize) -> Result<Option<Vec<bool>>> {
        let Some(v) = self.get(suffix) else {
            return Ok(None);
        };
        let a = v
            .as_array()
            .ok_or_else(|| self.err(suffix, "expected an array of bools"))?;
        let flags: Option<Vec<bool>> = (0..a.len()).map(|i| a.get(i)?.as_bool()).collect();
        let flags = flags.ok_or_else(|| self.err(suffix, "expected bools"))?;
        self.per_layer_len(suffix, flags.len(), n_layer)?;
        Ok(Some(flags))
    }

    /// A count per layer: one value for all (a scalar, or an array of equal values) or
    /// an array of one value per layer, each recorded as a size tensors may have.
    fn usize_per_layer(&self, suffix: &str, n_layer: usize) -> Result<Vec<usize>> {
        let v = self
            .get(suffix)
            .ok_or_else(|| self.err(suffix, "missing"))?;
        let Some(a) = v.as_array() else {
            return Ok(vec![self.usize(suffix)?; n_layer]);
        };
        let vals = a
            .to_i64_vec()
            .filter(|v| v.iter().all(|&x| x >= 0))
            .ok_or_else(|| self.err(suffix, "expected counts"))?;
        self.per_layer_len(suffix, vals.len(), n_layer)?;
        let mut counts = self.counts.borrow_mut();
        for &x in &vals {
            if !counts
                .iter()
                .any(|(k, c)| *k == self.key(suffix) && *c == x as usize)
            {
                counts.push((self.key(suffix), x as usize));
            }
        }
        Ok(vals.into_iter().map(|x| x as usize).collect())
    }

    fn usize(&self, suffix: &str) -> Result<usize> {
        self.usize_opt(suffix)?
            .ok_or_else(|| self.err(suffix, "missing"))
    }

    /// A per-layer array `suffix` of `len` values must have one per layer.
    fn per_layer_len(&self, suffix: &str, len: usize, n_layer: usize) -> Result<()> {
        if len == n_layer {
            return Ok(());
        }
        Err(self.err(
            suffix,
            format!(
                "{len} values for {n_layer} layers ({})",
                self.key("block_count")
            ),
        ))
    }

    /// A finite number (no hyperparameter is NaN or infinite).
    fn f32_opt(&self, suffix: &str) -> Result<Option<f32>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => match v.as_f32() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                Some(x) => Err(self.err(suffix, format!("{x} is not a finite number"))),
                None => Err(self.err(suffix, format!("expected a number, found {v}"))),
            },
        }
    }

    /// A finite number greater than zero (an epsilon, a RoPE base, a scale).
    fn f32_pos_opt(&self, suffix: &str) -> Result<Option<f32>> {
        match self.f32_opt(suffix)? {
            Some(x) if x <= 0.0 => Err(self.err(suffix, format!("{x} must be positive"))),
            x => Ok(x),
        }
    }
}

/// The derived sizes [`size_sources`] spells out.
struct SizeInputs<'a> {
    attention: bool,
    n_head: usize,
    n_head_kv: usize,
    head_dim_k: usize,
    head_dim_v: usize,
    /// The windowed layers' head sizes ([`crate::arch::ArchSpec::swa_geometry`]).
    head_dim_k_swa: usize,
    head_dim_v_swa: usize,
    moe: Option<&'a MoeConfig>,
    mla: Option<&'a MlaConfig>,
}

/// The counts `k` read and the projection widths derived from them, each with its keys.
fn size_sources(k: &Keys, d: &SizeInputs) -> SizeSources {
    let counts = k.counts.borrow();
    let value = |suffix: &str| {
        counts
            .iter()
            .find(|(key, _)| *key == k.key(suffix))
            .map(|&(_, v)| v)
    };
    let read = |suffix: &str| value(suffix).is_some();
    let mut sizes: Vec<(usize, String)> = Vec::new();
    // Each (value, key) once: a per-layer array gives one entry per distinct value.
    for (key, v) in counts.iter() {
        if !sizes.iter().any(|(sv, from)| from == key && sv == v) {
            sizes.push((*v, key.clone()));
        }
    }
    // Gemma 4's per-layer embeddings: a width per layer, all layers in one row.
    if let (Some(l), Some(p)) = (
        value("block_count"),
        value("embedding_length_per_layer_input"),
    ) {
        sizes.push((
            l * p,
            format!(
                "{} × {}",
                k.key("block_count"),
                k.key("embedding_length_per_layer_input")
            ),
        ));
    }
    // Fused pairs: gate and up in one matrix (phi3), Mamba's x and z.
    for suffix in ["feed_forward_length", "ssm.inner_size"] {
        if let Some(v) = value(suffix) {
            sizes.push((2 * v, format!("2 × {}", k.key(suffix))));
        }
    }
    let layout = sizes
        .iter()
        .filter(|(_, key)| LAYOUT_KEYS.iter().any(|s| *key == k.key(s)))
        .map(|(v, key)| format!("{key} = {v}"))
        .collect();
    if d.attention {
        let hdk = match read("attention.key_length") {
            true => k.key("attention.key_length"),
            false => format!(
                "{} / {}",
                k.key("embedding_length"),
                k.key("attention.head_count")
            ),
        };
        let hdv = match read("attention.value_length") {
            true => k.key("attention.value_length"),
            false => hdk.clone(),
        };
        let (h, kv) = (
            k.key("attention.head_count"),
            k.key("attention.head_count_kv"),
        );
        sizes.extend([
            (d.head_dim_k, hdk.clone()),
            (d.head_dim_v, hdv.clone()),
            (d.n_head * d.head_dim_k, format!("{h} × {hdk}")),
            (d.n_head_kv * d.head_dim_k, format!("{kv} × {hdk}")),
            (d.n_head_kv * d.head_dim_v, format!("{kv} × {hdv}")),
            (d.n_head * d.head_dim_v, format!("{h} × {hdv}")),
        ]);
        // Gemma 4's windowed layers' own head sizes.
        if read("attention.key_length_swa") || read("attention.value_length_swa") {
            let hdk = k.key("attention.key_length_swa");
            let hdv = match read("attention.value_length_swa") {
                true => k.key("attention.value_length_swa"),
                false => hdk.clone(),
            };
            let (hk, hv) = (d.head_dim_k_swa, d.head_dim_v_swa);
            sizes.extend([
                (d.n_head * hk, format!("{h} × {hdk}")),
                (d.n_head_kv * hk, format!("{kv} × {hdk}")),
                (d.n_head_kv * hv, format!("{kv} × {hdv}")),
                (d.n_head * hv, format!("{h} × {hdv}")),
            ]);
        }
    }
    if let Some(m) = d.moe {
        if let Some(c) = m.n_shared {
            sizes.push((
                c * m.n_ff_exp,
                format!(
                    "{} × {}",
                    k.key("expert_shared_count"),
                    k.key("expert_feed_forward_length")
                ),
            ));
        }
        if value("expert_feed_forward_length").unwrap_or(0) == 0 {
            sizes.push((
                m.n_ff_exp,
                format!(
                    "{} (absent or 0: {})",
                    k.key("expert_feed_forward_length"),
                    k.key("feed_forward_length")
                ),
            ));
        }
    }
    if let Some(m) = d.mla {
        let h = k.key("attention.head_count");
        sizes.extend([
            (
                d.n_head * m.qk_head_dim,
                format!("{h} × {}", k.key("attention.key_length_mla")),
            ),
            (
                d.n_head * m.v_head_dim,
                format!("{h} × {}", k.key("attention.value_length_mla")),
            ),
        ]);
    }
    SizeSources { sizes, layout }
}

/// Whether layer `il` is windowed (or chunked) in a pattern of `period` layers whose last
/// is global (llama.cpp `hparams.set_swa_pattern(period)`).
fn windowed_in_period(il: usize, period: usize) -> bool {
    il % period < period - 1
}

/// The number of layers the tensors of `f` hold: one more than the largest `N` of a
/// `blk.N.` tensor name (0 without any).
fn layers_in_tensors(f: &GgufFile) -> usize {
    f.tensor_infos()
        .iter()
        .filter_map(|t| {
            t.name
                .strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

impl ModelConfig {
    /// Reads the hyperparameters of `f`.
    ///
    /// Errors: [`ModelError::UnsupportedArchitecture`] naming `general.architecture`;
    /// [`ModelError::Metadata`] naming a missing or mistyped key;
    /// [`ModelError::Unsupported`] for features the metadata asks for that frink does not
    /// implement (RoPE scaling other than linear, a sliding window on an architecture
    /// without one, experts, per-layer head counts that differ).
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig> {
        let arch_name = f
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| ModelError::Metadata {
                key: "general.architecture".into(),
                detail: "missing".into(),
            })?;
        let arch = arch_spec(arch_name).ok_or_else(|| {
            ModelError::UnsupportedArchitecture(
                arch_name.to_string(),
                ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", "),
            )
        })?;
        let k = Keys {
            f,
            arch: arch_name,
            counts: Default::default(),
        };

        let n_expert = k.usize_opt("expert_count")?.unwrap_or(0);
        let moe = if n_expert > 0 {
            let Some(spec) = arch.moe else {
                return Err(ModelError::Unsupported(format!(
                    "mixture of experts on {arch_name} ({arch_name}.expert_count = {n_expert})"
                )));
            };
            let n_used = k.usize("expert_used_count")?;
            if n_used == 0 || n_used > n_expert {
                return Err(k.err(
                    "expert_used_count",
                    format!("{n_used} of {n_expert} experts ({})", k.key("expert_count")),
                ));
            }
            // llama.cpp LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX = 1 (the default), _SIGMOID = 2.
            let gating = match k.usize_opt("expert_gating_func")? {
                None => spec.gating,
                Some(1) => Gating::Softmax,
                Some(2) => Gating::Sigmoid,
                Some(g) => {
                    return Err(ModelError::Unsupported(format!(
                        "expert gating function {g} ({arch_name}.expert_gating_func)"
                    )))
                }
            };
            let n_group = k.usize_opt("expert_group_count")?.unwrap_or(0);
            let n_group_used = k.usize_opt("expert_group_used_count")?.unwrap_or(0);
            if n_group > 1
                && (n_expert % n_group != 0 || n_group_used == 0 || n_group_used > n_group)
            {
                return Err(k.err(
                    "expert_group_count",
                    format!(
                        "{n_expert} experts ({}) in {n_group} groups, {n_group_used} used ({})",
                        k.key("expert_count"),
                        k.key("expert_group_used_count")
                    ),
                ));
            }
            // Group-limited routing picks the experts among the used groups' only.
            if n_group > 1 && n_used > n_expert / n_group * n_group_used {
                return Err(k.err(
                    "expert_used_count",
                    format!(
                        "{n_used}, but {n_group_used} of {n_group} groups ({}, {}) hold {} of the {n_expert} experts",
                        k.key("expert_group_used_count"),
                        k.key("expert_group_count"),
                        n_expert / n_group * n_group_used
                    ),
                ));
            }
            let norm_topk = match k.get("expert_weights_norm") {
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| k.err("expert_weights_norm", "expected a bool"))?,
                None => spec.norm_topk,
            };
            Some(MoeConfig {
                gating,
                n_group: if n_group > 1 { n_group } else { 0 },
                n_group_used,
                n_leading_dense: k.usize_opt("leading_dense_block_count")?.unwrap_or(0),
                n_expert,
                n_used,
                n_ff_exp: match k.usize_opt("expert_feed_forward_length")? {
                    Some(n) if n > 0 => n,
                    _ => k.usize("feed_forward_length")?,
                },
                n_ff_shexp: k
                    .usize_opt("expert_shared_feed_forward_length")?
                    .unwrap_or(0),
                n_shared: k.usize_opt("expert_shared_count")?,
                norm_topk,
                weights_scale: k.f32_pos_opt("expert_weights_scale")?.unwrap_or(1.0),
                weight_input: spec.weight_input,
                layer_step: if spec.interleaved {
                    let key = "interleave_moe_layer_step";
                    match k.usize(key)? {
                        0 => return Err(k.err(key, "0")),
                        step => step,
                    }
                } else {
                    1
                },
            })
        } else {
            None
        };
        let n_layer = k.usize("block_count")?;
        let in_tensors = layers_in_tensors(f);
        if n_layer != in_tensors {
            return Err(k.err(
                "block_count",
                format!(
                    "{n_layer}, but the file's tensors hold {in_tensors} layers (blk.0 … blk.{})",
                    in_tensors.saturating_sub(1)
                ),
            ));
        }
        let n_embd = k.usize("embedding_length")?;
        let n_ff_layers = k.usize_per_layer("feed_forward_length", n_layer)?;
        let n_ff = n_ff_layers.iter().copied().max().unwrap_or(0);
        // Attention layers: all, none (state-space models: their head counts are 0 or
        // absent and unread), or a hybrid's (a zero per-layer KV head count, or
        // `attention.recurrent_layers`, marks the recurrent ones).
        let (n_head, n_head_kv, attn_layers) = match arch.mixer {
            MixerKind::Attention | MixerKind::Parallel(_) => {
                let n_head = k.usize("attention.head_count")?;
                let n_kv = k.usize_opt("attention.head_count_kv")?.unwrap_or(n_head);
                (n_head, n_kv, vec![true; n_layer])
            }
            MixerKind::Recurrent(_) => (0, 0, vec![false; n_layer]),
            MixerKind::Hybrid(_, HybridLayers::ZeroKvHeads) => {
                let per_layer = k.usize_per_layer("attention.head_count_kv", n_layer)?;
                let kv = per_layer
                    .iter()
                    .copied()
                    .filter(|&x| x > 0)
                    .max()
                    .unwrap_or(0);
                if per_layer.iter().any(|&x| x > 0 && x != kv) {
                    return Err(ModelError::Unsupported(format!(
                        "{} differs between attention layers ({per_layer:?})",
                        k.key("attention.head_count_kv")
                    )));
                }
                let n_head = k.usize("attention.head_count")?;
                (n_head, kv, per_layer.iter().map(|&x| x > 0).collect())
            }
            MixerKind::Hybrid(_, HybridLayers::RecurrentLayersKey) => {
                let key = "attention.recurrent_layers";
                let recurrent: Vec<bool> = match k.bools_per_layer(key, n_layer)? {
                    Some(flags) => flags,
                    None => {
                        let every = k.usize_opt("full_attention_interval")?.unwrap_or(4);
                        if every == 0 {
                            return Err(k.err("full_attention_interval", "0"));
                        }
                        (0..n_layer).map(|il| (il + 1) % every != 0).collect()
                    }
                };
                let n_head = k.usize("attention.head_count")?;
                let n_kv = k.usize_opt("attention.head_count_kv")?.unwrap_or(n_head);
                (n_head, n_kv, recurrent.iter().map(|&r| !r).collect())
            }
        };
        let attention = attn_layers.iter().any(|&a| a);
        for (key, v) in [
            ("block_count", n_layer),
            ("embedding_length", n_embd),
            ("attention.head_count", if attention { n_head } else { 1 }),
            (
                "attention.head_count_kv",
                if attention { n_head_kv } else { 1 },
            ),
        ] {
            if v == 0 {
                return Err(k.err(key, "0"));
            }
        }
        if attention && n_head % n_head_kv != 0 {
            return Err(k.err(
                "attention.head_count_kv",
                format!(
                    "{n_head_kv} KV heads do not divide the {n_head} heads ({})",
                    k.key("attention.head_count")
                ),
            ));
        }
        let head_dim_k = match attention {
            true => k
                .usize_opt("attention.key_length")?
                .unwrap_or(n_embd / n_head),
            false => 0,
        };
        let head_dim_v = k.usize_opt("attention.value_length")?.unwrap_or(head_dim_k);
        let n_rot = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim_k);
        // How attention sees positions: the row's, except that Granite 4.0-H's attention
        // has none unless the file says its RoPE was fine-tuned (llama.cpp
        // granite-hybrid.cpp: `use_rope = hparams.rope_finetuned`).
        let position = match k.get("rope.scaling.finetuned").map(|v| v.as_bool()) {
            _ if !arch.rope_if_finetuned => arch.position,
            Some(Some(true)) => arch.position,
            None | Some(Some(false)) => Position::None,
            Some(None) => return Err(k.err("rope.scaling.finetuned", "expected a bool")),
        };
        let rotary = attention && matches!(position, Position::Rope(_));
        if n_rot > head_dim_k || n_rot % 2 != 0 || (rotary && n_rot == 0) {
            return Err(k.err(
                "rope.dimension_count",
                format!(
                    "{n_rot} rotary dimensions with head size {head_dim_k} ({}, else {} / {}): must be even, non-zero and at most the head size",
                    k.key("attention.key_length"),
                    k.key("embedding_length"),
                    k.key("attention.head_count")
                ),
            ));
        }
        // Windowed layers' own head and rotation sizes (Gemma 4), else the model's.
        let (head_dim_k_swa, head_dim_v_swa, n_rot_swa) = if arch.swa_geometry {
            let hk = k
                .usize_opt("attention.key_length_swa")?
                .unwrap_or(head_dim_k);
            let hv = k.usize_opt("attention.value_length_swa")?.unwrap_or(hk);
            let r = k.usize_opt("rope.dimension_count_swa")?.unwrap_or(hk);
            if r > hk || r % 2 != 0 || (rotary && r == 0) || (attention && hk * hv == 0) {
                return Err(k.err(
                    "rope.dimension_count_swa",
                    format!(
                        "{r} rotary dimensions with windowed head size {hk} ({}) and value size {hv} ({}): must be even, non-zero and at most the head size",
                        k.key("attention.key_length_swa"),
                        k.key("attention.value_length_swa")
                    ),
                ));
            }
            (hk, hv, r)
        } else {
            (head_dim_k, head_dim_v, n_rot)
        };
        let eps_key = match arch.norm {
            Norm::Rms => "attention.layer_norm_rms_epsilon",
            Norm::Layer => "attention.layer_norm_epsilon",
        };
        let norm_eps = k
            .f32_pos_opt(eps_key)?
            .ok_or_else(|| k.err(eps_key, "missing"))?;
        if k.get("use_parallel_residual").and_then(|v| v.as_bool()) == Some(true)
            && !arch.parallel_residual
        {
            return Err(ModelError::Unsupported(format!(
                "parallel residual ({arch_name}.use_parallel_residual = true)"
            )));
        }
        let n_ctx_train = k.usize_opt("context_length")?.unwrap_or(2048);

        // RoPE scaling: none or linear (llama.cpp LLAMA_ROPE_SCALING_TYPE_LINEAR).
        let mut freq_scale = 1.0f32;
        let mut yarn = None;
        let freq_base = k.f32_pos_opt("rope.freq_base")?.unwrap_or(10000.0);
        match k.get("rope.scaling.type").map(|v| v.as_str()) {
            None | Some(Some("none")) => {}
            Some(Some("linear")) => {
                let factor = k.f32_pos_opt("rope.scaling.factor")?.unwrap_or(1.0);
                if factor > 0.0 {
                    freq_scale = 1.0 / factor;
                }
            }
            // llama.cpp LLAMA_ROPE_SCALING_TYPE_YARN; ext_factor defaults to 1 and
            // attn_factor to 1 as in llama.cpp's context parameters.
            Some(Some("yarn")) => {
                let factor = k.f32_pos_opt("rope.scaling.factor")?.unwrap_or(1.0);
                if factor > 1.0 {
                    freq_scale = 1.0 / factor;
                    let n_ctx_orig = k
                        .usize_opt("rope.scaling.original_context_length")?
                        .ok_or_else(|| {
                            k.err("rope.scaling.original_context_length", "missing for YaRN")
                        })?;
                    yarn = Some(YarnParams::new(
                        n_rot,
                        n_ctx_orig,
                        freq_base,
                        k.f32_opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                        k.f32_opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                        k.f32_opt("rope.scaling.yarn_ext_factor")?.unwrap_or(1.0),
                        k.f32_pos_opt("rope.scaling.yarn_attn_factor")?
                            .unwrap_or(1.0),
                    ));
                }
            }
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "RoPE scaling {:?} ({}.rope.scaling.type)",
                    other.unwrap_or("(not a string)"),
                    arch_name
                )))
            }
        }
        if let Some(f) = k.f32_opt("rope.scale_linear")? {
            // Older converters wrote the linear factor under this key.
            if f > 0.0 {
                freq_scale = 1.0 / f;
            }
        }
        let rope_global = RopeParams {
            freq_base,
            freq_scale,
            yarn,
        };
        // Windowed layers with their own base (gemma3) are unscaled; otherwise they share
        // the global RoPE (gpt-oss's YaRN applies to every layer).
        let rope_swa = match k
            .f32_pos_opt("rope.freq_base_swa")?
            .or(arch.rope_base_swa_default)
        {
            Some(freq_base) => RopeParams {
                freq_base,
                freq_scale: 1.0,
                yarn: None,
            },
            None => rope_global,
        };

        let n_swa_key = k.usize_opt("attention.sliding_window")?.unwrap_or(0);
        // Per layer: whether it uses the sliding window.
        let (n_swa, swa_layers) = match arch.swa {
            SwaPattern::None => {
                if n_swa_key > 0 {
                    return Err(ModelError::Unsupported(format!(
                        "sliding-window attention ({arch_name}.attention.sliding_window = {n_swa_key}) on architecture {arch_name}"
                    )));
                }
                (0, vec![false; n_layer])
            }
            // A chunk size of 0 turns chunking off (llama.cpp llama4.cpp: no SWA, RoPE on
            // every layer); absent, the architecture's default chunk.
            SwaPattern::Chunked {
                period,
                default_chunk,
            } => {
                let chunk = match k.get("attention.sliding_window") {
                    Some(_) => n_swa_key,
                    None => default_chunk,
                };
                let key = "attention.sliding_window_pattern";
                let period = match k.usize_opt(key)? {
                    Some(0) => return Err(k.err(key, "0")),
                    Some(p) => p,
                    None => period,
                };
                let layers = (0..n_layer)
                    .map(|il| chunk > 0 && windowed_in_period(il, period))
                    .collect();
                (chunk, layers)
            }
            SwaPattern::LayerArray => {
                let key = "attention.sliding_window_pattern";
                let flags = k
                    .bools_per_layer(key, n_layer)?
                    .ok_or_else(|| k.err(key, "missing"))?;
                if n_swa_key == 0 && flags.iter().any(|&w| w) {
                    return Err(k.err(
                        "attention.sliding_window",
                        format!("0 or missing, but {} marks windowed layers", k.key(key)),
                    ));
                }
                (n_swa_key, flags)
            }
            _ if n_swa_key == 0 && k.get("attention.sliding_window").is_some() => {
                return Err(k.err(
                    "attention.sliding_window",
                    format!("0, but {arch_name} has sliding-window layers"),
                ))
            }
            _ if n_swa_key == 0 => (0, vec![false; n_layer]),
            SwaPattern::LastOfPeriodGlobal(period) => {
                let layers = (0..n_layer)
                    .map(|il| windowed_in_period(il, period))
                    .collect();
                (n_swa_key, layers)
            }
            SwaPattern::All => (n_swa_key, vec![true; n_layer]),
        };

        // Llama 4's NoPE layers, while chunks are on (llama.cpp sets the no-RoPE step to
        // the layer count when the chunk is 0).
        let nope_layers: Vec<bool> = match arch.irope {
            Some(ir) if n_swa > 0 => (0..n_layer)
                .map(|il| (il + 1).is_multiple_of(ir.nope_step))
                .collect(),
            _ => vec![false; n_layer],
        };
        // KV sharing: the last `shared_kv_layers` layers read the cache of the last earlier
        // layer of their own kind (transformers Gemma4TextModel: `kv_shared_layer_index`).
        let n_shared_kv = match arch.kv_sharing {
            true => k.usize_opt("attention.shared_kv_layers")?.unwrap_or(0),
            false => 0,
        };
        if n_shared_kv >= n_layer && n_shared_kv > 0 {
            return Err(k.err(
                "attention.shared_kv_layers",
                format!(
                    "{n_shared_kv} of {n_layer} layers ({}): no layer would compute keys",
                    k.key("block_count")
                ),
            ));
        }
        let first_shared = n_layer - n_shared_kv;
        let mut geometry = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let swa = swa_layers[il];
            let kv_source = match il >= first_shared {
                false => None,
                true => Some(
                    (0..first_shared)
                        .rev()
                        .find(|&j| attn_layers[j] && swa_layers[j] == swa)
                        .ok_or_else(|| {
                            k.err(
                                "attention.shared_kv_layers",
                                format!(
                                    "layer {il} shares the keys of an earlier {} layer, and there is none",
                                    if swa { "windowed" } else { "global" }
                                ),
                            )
                        })?,
                ),
            };
            let (head_dim_k, head_dim_v, n_rot) = match swa {
                true => (head_dim_k_swa, head_dim_v_swa, n_rot_swa),
                false => (head_dim_k, head_dim_v, n_rot),
            };
            geometry.push(crate::plan::AttnGeometry {
                head_dim_k,
                head_dim_v,
                n_rot,
                kv_source,
                freq_factors: match arch.rope_freqs {
                    RopeFreqs::Refused => false,
                    RopeFreqs::All => true,
                    RopeFreqs::Global => !swa,
                },
            });
        }
        // Per-layer embeddings (Gemma 4): their width.
        let n_embd_per_layer = match arch.ple {
            true => k
                .usize_opt("embedding_length_per_layer_input")?
                .unwrap_or(0),
            false => 0,
        };
        // llama.cpp llama4.cpp: `use_kq_norm = type != LLM_TYPE_17B_128E`, the type told by
        // its 128 experts (Maverick: transformers `use_qk_norm = false`); GGUF has no key.
        let qk_norm = match arch.qk_norm {
            QkNorm::L2 if moe.as_ref().is_some_and(|m| m.n_expert == 128) => QkNorm::None,
            q => q,
        };
        let attn_scale = match arch.attn_scale {
            AttnScale::InvSqrtHeadDim => k
                .f32_pos_opt("attention.scale")?
                .unwrap_or(1.0 / (head_dim_k as f32).sqrt()),
            AttnScale::One => 1.0,
            AttnScale::Gemma { layers_27b } => {
                // llama.cpp: the 27B gemma models scale by the hidden size per head, the
                // others by the head size.
                if n_layer == layers_27b {
                    1.0 / ((n_embd / n_head) as f32).sqrt()
                } else {
                    1.0 / (head_dim_k as f32).sqrt()
                }
            }
        };
        let mla = match k.usize_opt("attention.kv_lora_rank")?.filter(|&r| r > 0) {
            None => None,
            Some(r) if !arch.mla => {
                return Err(ModelError::Unsupported(format!(
                    "multi-head latent attention on {arch_name} ({} = {r})",
                    k.key("attention.kv_lora_rank")
                )))
            }
            Some(kv_lora_rank) => {
                let m = MlaConfig {
                    q_lora_rank: k.usize_opt("attention.q_lora_rank")?.unwrap_or(0),
                    kv_lora_rank,
                    qk_head_dim: k.usize("attention.key_length_mla")?,
                    v_head_dim: k.usize("attention.value_length_mla")?,
                };
                if n_head_kv != 1
                    || head_dim_k != kv_lora_rank + n_rot
                    || head_dim_v != kv_lora_rank
                    || m.qk_head_dim <= n_rot
                {
                    return Err(k.err(
                        "attention.kv_lora_rank",
                        format!(
                            "an MLA layout this reader does not know: {n_head_kv} KV heads ({}), key {head_dim_k} ({}), value {head_dim_v} ({}), rank {kv_lora_rank}, rope {n_rot} ({}), qk {} ({})",
                            k.key("attention.head_count_kv"),
                            k.key("attention.key_length"),
                            k.key("attention.value_length"),
                            k.key("rope.dimension_count"),
                            m.qk_head_dim,
                            k.key("attention.key_length_mla")
                        ),
                    ));
                }
                Some(m)
            }
        };
        // MLA scores are dot products of the un-absorbed per-head queries and keys.
        let attn_scale = match &mla {
            Some(m) => 1.0 / (m.qk_head_dim as f32).sqrt(),
            None => attn_scale,
        };
        let embed_scale = if arch.embed_scale {
            (n_embd as f32).sqrt()
        } else {
            k.f32_pos_opt("embedding_scale")?.unwrap_or(1.0)
        };
        let residual_scale = k.f32_pos_opt("residual_scale")?.unwrap_or(1.0);
        let logit_scale = k.f32_pos_opt("logit_scale")?.unwrap_or(1.0);
        let pooling = match k.usize_opt("pooling_type")? {
            None => None,
            Some(t) => Some(
                Pooling::from_gguf(t)
                    .ok_or_else(|| k.err("pooling_type", format!("unknown pooling type {t}")))?,
            ),
        };
        // 0 disables a cap (as llama.cpp's `f_attn_logit_softcapping` reads it).
        let softcap = |key: &str| -> Result<Option<f32>> {
            match k.f32_opt(key)? {
                Some(c) if c < 0.0 => Err(k.err(key, format!("{c} must not be negative"))),
                c => Ok(c.filter(|&c| c > 0.0)),
            }
        };
        let attn_softcap = softcap("attn_logit_softcapping")?;
        let final_softcap = softcap("final_logit_softcapping")?;
        let alibi_slopes = match arch.position {
            // llama.cpp src/llama-model.cpp: f_max_alibi_bias = 8 for bloom.
            Position::Alibi => alibi_slopes(n_head, 8.0),
            Position::Rope(_) | Position::None => Vec::new(),
        };
        let ssm = match arch.mixer.recurrent() {
            Some(r @ (Recurrent::Mamba | Recurrent::Mamba2 | Recurrent::GatedDeltaNet)) => {
                let ssm = SsmConfig {
                    d_conv: k.usize("ssm.conv_kernel")?,
                    d_inner: k.usize("ssm.inner_size")?,
                    d_state: k.usize("ssm.state_size")?,
                    dt_rank: k.usize("ssm.time_step_rank")?,
                    n_group: match r {
                        Recurrent::Mamba => 1,
                        _ => k.usize_opt("ssm.group_count")?.unwrap_or(1),
                    },
                };
                for (key, v) in [
                    ("ssm.conv_kernel", ssm.d_conv),
                    ("ssm.inner_size", ssm.d_inner),
                    ("ssm.state_size", ssm.d_state),
                    ("ssm.time_step_rank", ssm.dt_rank),
                    ("ssm.group_count", ssm.n_group),
                ] {
                    if v == 0 {
                        return Err(k.err(key, "0"));
                    }
                }
                // Mamba-2's heads share B and C by groups; DeltaNet's value heads share
                // key heads the same way.
                if r != Recurrent::Mamba
                    && (!ssm.d_inner.is_multiple_of(ssm.dt_rank)
                        || !ssm.dt_rank.is_multiple_of(ssm.n_group))
                {
                    return Err(k.err(
                        "ssm.time_step_rank",
                        format!(
                            "{} heads with {} channels ({}) in {} groups ({}): the heads must divide the channels and the groups the heads",
                            ssm.dt_rank,
                            ssm.d_inner,
                            k.key("ssm.inner_size"),
                            ssm.n_group,
                            k.key("ssm.group_count")
                        ),
                    ));
                }
                // DeltaNet's value heads are d_state wide, as its key heads (llama.cpp
                // qwen3next: head_k_dim = head_v_dim = ssm.state_size).
                if r == Recurrent::GatedDeltaNet && ssm.d_inner != ssm.dt_rank * ssm.d_state {
                    return Err(k.err(
                        "ssm.inner_size",
                        format!(
                            "{}, but {} value heads ({}) of {} ({})",
                            ssm.d_inner,
                            ssm.dt_rank,
                            k.key("ssm.time_step_rank"),
                            ssm.d_state,
                            k.key("ssm.state_size")
                        ),
                    ));
                }
                // FalconMamba's RMSNorm of Δ, B and C (llama.cpp `ssm_dt_b_c_rms`).
                if k.get("ssm.dt_b_c_rms").and_then(|v| v.as_bool()) == Some(true) {
                    return Err(ModelError::Unsupported(format!(
                        "RMSNorm of the SSM's dt, B and C ({} = true)",
                        k.key("ssm.dt_b_c_rms")
                    )));
                }
                Some(ssm)
            }
            _ => None,
        };
        let short_conv_taps = match arch.mixer.recurrent() {
            Some(Recurrent::ShortConv) => {
                let taps = k.usize("shortconv.l_cache")?;
                if taps < 2 {
                    return Err(k.err("shortconv.l_cache", format!("{taps} taps (at least 2)")));
                }
                taps
            }
            _ => 0,
        };
        let n_vocab = f
            .tensor("token_embd.weight")
            .map(|t| t.info.n_rows() as usize)
            .ok_or_else(|| ModelError::Tensor {
                name: "token_embd.weight".into(),
                detail: "missing".into(),
            })?;

        let sizes = size_sources(
            &k,
            &SizeInputs {
                attention,
                n_head,
                n_head_kv,
                head_dim_k,
                head_dim_v,
                head_dim_k_swa,
                head_dim_v_swa,
                moe: moe.as_ref(),
                mla: mla.as_ref(),
            },
        );
        let plan = crate::plan::Plan::compile(
            arch,
            f,
            &crate::plan::PlanInputs {
                attn_layers: &attn_layers,
                swa_layers: &swa_layers,
                n_swa,
                rope_global,
                rope_swa,
                attn_softcap,
                position,
                mla: mla.is_some(),
                moe_layers: &(0..n_layer)
                    .map(|il| moe.as_ref().is_some_and(|m| m.is_moe_layer(il)))
                    .collect::<Vec<_>>(),
                chunked: matches!(arch.swa, SwaPattern::Chunked { .. }),
                nope_layers: &nope_layers,
                qk_norm,
                geometry: &geometry,
                v_norm: arch.v_norm,
                per_layer_embeddings: n_embd_per_layer,
            },
        );
        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_vocab,
            n_ctx_train,
            norm_eps,
            n_rot,
            n_swa,
            attn_scale,
            embed_scale,
            residual_scale,
            logit_scale,
            pooling,
            final_softcap,
            alibi_slopes,
            moe,
            mla,
            ssm,
            short_conv_taps,
            n_embd_per_layer,
            n_ff_layers,
            plan,
            sizes,
        })
    }

    /// Width of the Q projection (`n_head * head_dim_k`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Width of the K projection (`n_head_kv * head_dim_k`).
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    /// Width of the attention output projection's input: `n_head · head_dim_v`, or with MLA
    /// `n_head · value_length_mla`.
    pub fn attn_out_dim(&self) -> usize {
        match &self.mla {
            Some(m) => self.n_head * m.v_head_dim,
            None => self.n_head * self.head_dim_v,
        }
    }

    /// Width of the V projection (`n_head_kv * head_dim_v`).
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }
}
