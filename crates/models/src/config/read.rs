//! [`ModelConfig::from_gguf`] in sections: one function per concern (experts, attention
//! layers, head geometry, RoPE and its scaling, windows, per-layer geometry and KV
//! sharing, the attention scale and MLA, scales, state-space blocks), each refusing what
//! it refuses, read in order by `from_gguf`.
//!
//! Keys, defaults and derivations follow llama.cpp `src/llama-model.cpp`
//! (`llama_model::load_hparams`) and `src/llama-hparams.{h,cpp}`.

use frink_gguf::GgufFile;

use super::keys::{layers_in_tensors, size_sources, windowed_in_period, Keys, SizeInputs};
use super::{
    alibi_slopes, Gating, MlaConfig, ModelConfig, MoeConfig, Pooling, RopeParams, SsmConfig,
    YarnParams,
};
use crate::arch::{
    arch_spec, ArchSpec, AttnScale, HybridLayers, MixerKind, Norm, Position, QkNorm, Recurrent,
    RopeFreqs, SwaPattern, ARCHS,
};
use crate::error::{ModelError, Result};

/// The experts of a mixture-of-experts file (`expert_count` > 0), checked: the used
/// count, the groups of group-limited routing, the gating function.
fn experts(k: &Keys, arch: &ArchSpec) -> Result<Option<MoeConfig>> {
    let arch_name = k.arch;
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
        if n_group > 1 && (n_expert % n_group != 0 || n_group_used == 0 || n_group_used > n_group) {
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
    Ok(moe)
}

/// The heads and which layers attend: all (attention models), none (state-space
/// models: their head counts are 0 or absent and unread), or a hybrid's (a zero per-layer
/// KV head count, or `attention.recurrent_layers`, marks the recurrent ones). Returns
/// `(n_head, n_head_kv, attention layers)`.
fn attention_layers(
    k: &Keys,
    arch: &ArchSpec,
    n_layer: usize,
) -> Result<(usize, usize, Vec<bool>)> {
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
    Ok((n_head, n_head_kv, attn_layers))
}

/// Head sizes and rotary dimensions (the windowed layers' own where the architecture has
/// them), and how attention sees positions.
struct Heads {
    head_dim_k: usize,
    head_dim_v: usize,
    n_rot: usize,
    head_dim_k_swa: usize,
    head_dim_v_swa: usize,
    n_rot_swa: usize,
    position: Position,
}

/// The head geometry of `n_head` / `n_head_kv` heads over `n_embd` (checked: no zero
/// count, KV heads dividing the heads, rotary dimensions even and within the head).
fn heads(
    k: &Keys,
    arch: &ArchSpec,
    (n_layer, n_embd, n_head, n_head_kv): (usize, usize, usize, usize),
    attention: bool,
) -> Result<Heads> {
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
    Ok(Heads {
        head_dim_k,
        head_dim_v,
        n_rot,
        head_dim_k_swa,
        head_dim_v_swa,
        n_rot_swa,
        position,
    })
}

/// The norm's epsilon (RMSNorm or LayerNorm key), refusing a parallel residual the
/// architecture does not have.
fn norm_eps(k: &Keys, arch: &ArchSpec) -> Result<f32> {
    let arch_name = k.arch;
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
    Ok(norm_eps)
}

/// The range a RoPE base must lie in: real models use 10,000 to a few times 10^8; far
/// outside it the angles overflow (a base of 1e-45 gave NaN logits).
const BASE: (f32, f32) = (1e-3, 1e15);
/// The range of a RoPE scaling factor (and so of its inverse, the frequency scale).
const FACTOR: (f32, f32) = (1e-3, 1e6);

/// The global layers' RoPE (base, linear or YaRN scaling) and the windowed layers' (their
/// own base unscaled, else the global).
fn rope(k: &Keys, arch: &ArchSpec, n_rot: usize) -> Result<(RopeParams, RopeParams)> {
    let arch_name = k.arch;
    // RoPE scaling: none or linear (llama.cpp LLAMA_ROPE_SCALING_TYPE_LINEAR).
    let mut freq_scale = 1.0f32;
    let mut yarn = None;
    let freq_base = k
        .f32_in("rope.freq_base", BASE.0, BASE.1)?
        .unwrap_or(10000.0);
    match k.get("rope.scaling.type").map(|v| v.as_str()) {
        None | Some(Some("none")) => {}
        Some(Some("linear")) => {
            // Within FACTOR: positive, its inverse finite.
            let factor = k
                .f32_in("rope.scaling.factor", FACTOR.0, FACTOR.1)?
                .unwrap_or(1.0);
            freq_scale = 1.0 / factor;
        }
        // llama.cpp LLAMA_ROPE_SCALING_TYPE_YARN; ext_factor defaults to 1 and
        // attn_factor to 1 as in llama.cpp's context parameters.
        Some(Some("yarn")) => {
            let factor = k
                .f32_in("rope.scaling.factor", FACTOR.0, FACTOR.1)?
                .unwrap_or(1.0);
            if factor > 1.0 {
                freq_scale = 1.0 / factor;
                let n_ctx_orig = k
                    .usize_opt("rope.scaling.original_context_length")?
                    .ok_or_else(|| {
                        k.err(
                            "rope.scaling.original_context_length",
                            "missing for YaRN (--yarn-orig-ctx gives it)",
                        )
                    })?;
                yarn = Some(YarnParams::new(
                    n_rot,
                    n_ctx_orig,
                    freq_base,
                    k.f32_in("rope.scaling.yarn_beta_fast", -1e6, 1e6)?
                        .unwrap_or(32.0),
                    k.f32_in("rope.scaling.yarn_beta_slow", -1e6, 1e6)?
                        .unwrap_or(1.0),
                    k.f32_in("rope.scaling.yarn_ext_factor", -1e3, 1e3)?
                        .unwrap_or(1.0),
                    k.f32_in("rope.scaling.yarn_attn_factor", 1e-3, 1e3)?
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
    if let Some(f) = k.f32_in("rope.scale_linear", FACTOR.0, FACTOR.1)? {
        // Older converters wrote the linear factor under this key.
        freq_scale = 1.0 / f;
    }
    let rope_global = RopeParams {
        freq_base,
        freq_scale,
        yarn,
    };
    // Windowed layers with their own base (gemma3) are unscaled; otherwise they share
    // the global RoPE (gpt-oss's YaRN applies to every layer).
    let rope_swa = match k
        .f32_in("rope.freq_base_swa", BASE.0, BASE.1)?
        .or(arch.rope_base_swa_default)
    {
        Some(freq_base) => RopeParams {
            freq_base,
            freq_scale: 1.0,
            yarn: None,
        },
        None => rope_global,
    };
    Ok((rope_global, rope_swa))
}

/// Multimodal RoPE's four sections (`rope.dimension_sections`), required by an
/// architecture that uses them and refused elsewhere (a file asking for M-RoPE on a
/// plain-RoPE architecture would be rotated wrongly). At least one pair, each section at
/// most 2¹⁶ (llama.cpp `hparams.rope_sections`).
fn rope_sections(k: &Keys, arch: &ArchSpec) -> Result<Option<[usize; 4]>> {
    let key = "rope.dimension_sections";
    let Some(v) = k.get(key) else {
        return match arch.mrope {
            true => Err(k.err(key, "missing (the model's M-RoPE sections)")),
            false => Ok(None),
        };
    };
    if !arch.mrope {
        return Err(ModelError::Unsupported(format!(
            "multimodal RoPE ({}) on architecture {}",
            k.key(key),
            k.arch
        )));
    }
    let vals = v
        .as_array()
        .and_then(|a| a.to_i64_vec())
        .ok_or_else(|| k.err(key, "expected an array of integers"))?;
    let mut s = [0usize; 4];
    if vals.len() > 4 || vals.iter().any(|&x| !(0..=1 << 16).contains(&x)) {
        return Err(k.err(key, format!("{vals:?}: up to four sections of 0..=65536")));
    }
    for (d, &x) in s.iter_mut().zip(&vals) {
        *d = x as usize;
    }
    if s.iter().sum::<usize>() == 0 {
        return Err(k.err(key, "every section is empty"));
    }
    Ok(Some(s))
}

/// The window (or chunk) size and which layers use it, and Llama 4's NoPE layers.
/// Returns `(n_swa, windowed layers, NoPE layers)`.
fn windows(k: &Keys, arch: &ArchSpec, n_layer: usize) -> Result<(usize, Vec<bool>, Vec<bool>)> {
    let arch_name = k.arch;
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
        SwaPattern::FirstOfPeriodGlobal(period) => {
            let key = "attention.sliding_window_pattern";
            let layers = match k.get(key) {
                Some(v) if v.as_array().is_some() => k
                    .bools_per_layer(key, n_layer)?
                    .ok_or_else(|| k.err(key, "missing"))?,
                _ => {
                    let period = match k.usize_opt(key)? {
                        Some(0) => return Err(k.err(key, "0")),
                        Some(p) => p,
                        None => period,
                    };
                    (0..n_layer).map(|il| il % period != 0).collect()
                }
            };
            (n_swa_key, layers)
        }
    };

    // Llama 4's NoPE layers, while chunks are on (llama.cpp sets the no-RoPE step to
    // the layer count when the chunk is 0).
    let nope_layers: Vec<bool> = match arch.irope {
        Some(ir) if n_swa > 0 => (0..n_layer)
            .map(|il| (il + 1).is_multiple_of(ir.nope_step))
            .collect(),
        _ => vec![false; n_layer],
    };
    Ok((n_swa, swa_layers, nope_layers))
}

/// Each layer's attention geometry: head sizes and rotation of its kind (windowed or
/// global), RoPE frequency factors, and the earlier layer whose keys it reads (KV sharing:
/// the last `shared_kv_layers` layers read the last earlier layer of their own kind).
fn layer_geometry(
    k: &Keys,
    arch: &ArchSpec,
    attn_layers: &[bool],
    swa_layers: &[bool],
    h: &Heads,
) -> Result<Vec<crate::plan::AttnGeometry>> {
    let n_layer = attn_layers.len();
    let has_freqs = k.f.tensor("rope_freqs.weight").is_some();
    let Heads {
        head_dim_k,
        head_dim_v,
        n_rot,
        head_dim_k_swa,
        head_dim_v_swa,
        n_rot_swa,
        ..
    } = *h;
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
            // Only where the file has the tensor (`frink inspect --plan` shows it).
            freq_factors: has_freqs
                && match arch.rope_freqs {
                    RopeFreqs::Refused => false,
                    RopeFreqs::All => true,
                    RopeFreqs::Global => !swa,
                },
        });
    }
    Ok(geometry)
}

/// The attention scale (the architecture's rule, or MLA's un-absorbed head size) and the
/// multi-head latent attention config (checked against the head geometry).
fn scale_and_mla(
    k: &Keys,
    arch: &ArchSpec,
    h: &Heads,
    (n_layer, n_embd, n_head, n_head_kv): (usize, usize, usize, usize),
) -> Result<(f32, Option<MlaConfig>)> {
    let arch_name = k.arch;
    let Heads {
        head_dim_k,
        head_dim_v,
        n_rot,
        ..
    } = *h;
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
    Ok((attn_scale, mla))
}

/// The state-space block's sizes (Mamba, Mamba-2, gated DeltaNet), checked; `None` for
/// other mixers.
fn ssm(k: &Keys, arch: &ArchSpec) -> Result<Option<SsmConfig>> {
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
    Ok(ssm)
}

/// `tokenizer.ggml.token_type_count`: the rows of an encoder's `token_types` table (0 when
/// absent; llama.cpp's loader reads the same key as `n_token_types`).
///
/// Errors: [`ModelError::Metadata`] for a value that is not an unsigned integer.
fn token_type_count(f: &GgufFile) -> Result<usize> {
    const KEY: &str = "tokenizer.ggml.token_type_count";
    match f.get(KEY) {
        None => Ok(0),
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| ModelError::Metadata {
                key: KEY.into(),
                detail: format!("expected an unsigned integer, found {v}"),
            }),
    }
}

/// `{arch}.hidden_activation` (ModernBERT's): the row's activation is GELU; a file naming
/// another (IBM Granite Embedding's SwiGLU variant) is refused rather than run with GELU.
///
/// Errors: [`ModelError::Unsupported`] naming the value.
fn hidden_activation(k: &Keys, arch: &ArchSpec) -> Result<()> {
    let Some(v) = k.get("hidden_activation") else {
        return Ok(());
    };
    match v.as_str() {
        Some("gelu") if arch.activation == crate::arch::Activation::GeluErf => Ok(()),
        other => Err(ModelError::Unsupported(format!(
            "{} = {:?} on {} (frink runs its FFN with the erf GELU)",
            k.key("hidden_activation"),
            other.unwrap_or("(not a string)"),
            arch.name
        ))),
    }
}

/// Checks `{arch}.attention.causal` against the row: an encoder's attention is
/// bidirectional (the key, where present, must say false), a decoder's causal (a file
/// asking a decoder architecture for bidirectional attention, as EmbeddingGemma's does, is
/// refused: frink would run it causally).
///
/// Errors: [`ModelError::Metadata`] for a value that is not a bool,
/// [`ModelError::Unsupported`] for one that contradicts the row.
fn causal_attention(k: &Keys, arch: &ArchSpec) -> Result<()> {
    let Some(v) = k.get("attention.causal") else {
        return Ok(());
    };
    let causal = v
        .as_bool()
        .ok_or_else(|| k.err("attention.causal", "expected a bool"))?;
    if causal == arch.encoder {
        let what = match causal {
            true => "causal attention on an encoder architecture",
            false => "bidirectional (non-causal) attention on a decoder architecture",
        };
        return Err(ModelError::Unsupported(format!(
            "{} = {causal}: {what} ({})",
            k.key("attention.causal"),
            arch.name
        )));
    }
    Ok(())
}

/// The short convolution's taps (LFM2), at least 2; 0 for other mixers.
fn short_conv_taps(k: &Keys, arch: &ArchSpec) -> Result<usize> {
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
    Ok(short_conv_taps)
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
        if arch_name == "clip" {
            // A projector file given as the model: say where it goes.
            return Err(ModelError::Unsupported(
                "architecture \"clip\" as a model: this is a vision projector file (mmproj); \
                 give it as --mmproj beside its language model"
                    .into(),
            ));
        }
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

        let moe = experts(&k, arch)?;
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
        let (n_head, n_head_kv, attn_layers) = attention_layers(&k, arch, n_layer)?;
        let attention = attn_layers.iter().any(|&a| a);
        let h = heads(&k, arch, (n_layer, n_embd, n_head, n_head_kv), attention)?;
        let Heads {
            head_dim_k,
            head_dim_v,
            n_rot,
            head_dim_k_swa,
            head_dim_v_swa,
            position,
            ..
        } = h;
        let norm_eps = norm_eps(&k, arch)?;
        // Learned positions: the table's rows are the longest input.
        let n_ctx_train = match position {
            Position::Learned => k.usize("context_length")?,
            _ => k.usize_opt("context_length")?.unwrap_or(2048),
        };
        if arch.encoder && n_ctx_train == 0 {
            return Err(k.err("context_length", "0: an encoder's inputs are bounded by it"));
        }
        causal_attention(&k, arch)?;
        hidden_activation(&k, arch)?;
        let n_token_types = match arch.encoder {
            true => token_type_count(f)?,
            false => 0,
        };
        let (rope_global, rope_swa) = rope(&k, arch, n_rot)?;
        let rope_sections = rope_sections(&k, arch)?;
        let (n_swa, swa_layers, nope_layers) = windows(&k, arch, n_layer)?;
        let geometry = layer_geometry(&k, arch, &attn_layers, &swa_layers, &h)?;
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
        let (attn_scale, mla) = scale_and_mla(&k, arch, &h, (n_layer, n_embd, n_head, n_head_kv))?;
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
            Position::Rope(_) | Position::None | Position::Learned => Vec::new(),
        };
        let ssm = ssm(&k, arch)?;
        let short_conv_taps = short_conv_taps(&k, arch)?;
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
            rope_sections,
            attn_scale,
            embed_scale,
            residual_scale,
            logit_scale,
            pooling,
            n_token_types,
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
}
