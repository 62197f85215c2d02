//! [`ModelConfig`]: hyperparameters read once from GGUF metadata.
//!
//! Keys, defaults and derivations follow llama.cpp `src/llama-model.cpp`
//! (`llama_model::load_hparams`) and `src/llama-hparams.{h,cpp}`.

mod keys;
mod read;

pub use crate::arch::Gating;
pub use crate::rope::{RopeParams, YarnParams};

use crate::arch::{ArchSpec, Recurrent};

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
    /// Multimodal RoPE's sections (`{arch}.rope.dimension_sections`: rotated pairs taking
    /// a position's time, height, width and fourth component, in turn, repeating;
    /// llama.cpp `ggml_rope_multi`): `None` for plain RoPE.
    pub rope_sections: Option<[usize; 4]>,
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
    /// `tokenizer.ggml.token_type_count` of an encoder: the rows of `token_types` (segment
    /// embeddings; 0 where the file has none).
    pub n_token_types: usize,
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

impl ModelConfig {
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
