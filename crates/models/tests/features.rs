//! Each architecture feature changes the output (so none can be silently skipped), and the
//! two ways of computing a sequence (one batch, or one token at a time through the KV
//! cache) give the same logits and leave the same cache.

mod common;

use std::path::PathBuf;

use common::attn_plans;
use frink_models::arch::Activation;
use frink_models::plan::{Channel, Residual};
use frink_models::{AttentionWeights, FfnWeights, KvType, Logits, Model, SeqState};

/// A loaded model and its fixture's input ids.
type Fixture = (Model, Vec<u32>);

fn fixture(name: &str) -> Option<Fixture> {
    let dir: PathBuf = frink_testdata::require(&format!("fixtures/tiny/{name}"), name)?;
    let ids = frink_testdata::fixture_input_ids(&dir);
    Some((Model::load(dir.join("model.gguf")).unwrap(), ids))
}

fn batch_logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut cache = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut cache, ids, Logits::All).unwrap()
}

use frink_testdata::rel_max_diff;

/// Relative change when a feature is removed must be far above the 1e-6 level at which the
/// full model matches transformers (tests/fixtures.rs). The smallest change measured here
/// is gemma3 with SiLU instead of GELU at 0.14 (qwen2 without biases: 0.71, as the
/// fixture's own ablation records); the bound 1e-2 sits between.
const MIN_EFFECT: f32 = 1e-2;

fn ablate(name: &str, what: &str, change: impl FnOnce(&mut Model)) {
    let Some((mut model, ids)) = fixture(name) else {
        return;
    };
    let full = batch_logits(&model, &ids);
    change(&mut model);
    let ablated = batch_logits(&model, &ids);
    let effect = rel_max_diff(&ablated, &full);
    eprintln!("{name}: removing {what} changes the logits by {effect:.3} relative");
    assert!(
        effect > MIN_EFFECT,
        "{name}: {what} has no effect ({effect})"
    );
}

/// The attention weights of every attention layer.
fn attn(m: &mut Model) -> impl Iterator<Item = &mut AttentionWeights> {
    m.weights
        .layers
        .iter_mut()
        .filter_map(|l| l.attention_mut())
}

/// Turns every attention layer's sliding window off (the plan's window 0).
fn no_window(m: &mut Model) {
    attn_plans(m).for_each(|a| a.window = 0);
}

/// Every FFN (dense or experts) with activation `act` instead.
fn set_activation(m: &mut Model, act: Activation) {
    for l in &mut m.config.plan.layers {
        l.channel = match l.channel {
            Channel::Dense(kind, _) => Channel::Dense(kind, act),
            Channel::Moe(_) => Channel::Moe(act),
            Channel::None => Channel::None,
        };
    }
}

#[test]
fn qkv_bias_matters() {
    ablate("qwen2", "the Q/K/V biases", |m| {
        for l in attn(m) {
            (l.bq, l.bk, l.bv) = (None, None, None);
        }
    });
}

#[test]
fn embedding_scale_matters() {
    ablate("gemma3", "the sqrt(n_embd) embedding scale", |m| {
        m.config.embed_scale = 1.0
    });
}

#[test]
fn qk_norm_matters() {
    ablate("gemma3", "the per-head Q/K norms", |m| {
        for l in attn(m) {
            (l.q_norm, l.k_norm) = (None, None);
        }
    });
}

#[test]
fn sandwich_norms_matter() {
    ablate("gemma3", "the post-attention norm", |m| {
        m.weights
            .layers
            .iter_mut()
            .for_each(|l| l.post_attn_norm = None)
    });
    ablate("gemma3", "the post-FFN norm", |m| {
        m.weights
            .layers
            .iter_mut()
            .for_each(|l| l.post_ffn_norm = None)
    });
}

#[test]
fn sliding_window_matters() {
    ablate("gemma3", "the sliding window", no_window);
    ablate("gemma3", "the local layers' RoPE base", |m| {
        // The global layers' (unwindowed) RoPE on every layer.
        let global = attn_plans(m).find(|a| a.window == 0).unwrap().rope;
        attn_plans(m).for_each(|a| a.rope = global)
    });
}

#[test]
fn activation_matters() {
    ablate("gemma3", "GELU (SiLU instead)", |m| {
        set_activation(m, Activation::Silu)
    });
    ablate("llama", "SiLU (GELU instead)", |m| {
        set_activation(m, Activation::GeluTanh)
    });
}

#[test]
fn llama3_rope_freq_factors_matter() {
    // The fixture records 0.69 for plain RoPE instead of llama3 scaling.
    ablate(
        "llama3_rope",
        "rope_freqs.weight (plain RoPE instead)",
        |m| {
            assert!(
                m.weights.rope_freqs.is_some(),
                "the fixture carries rope_freqs"
            );
            m.weights.rope_freqs = None
        },
    );
}

#[test]
fn rope_layout_matters() {
    ablate("llama", "normal RoPE (NeoX instead)", |m| {
        attn_plans(m).for_each(|a| {
            a.position = frink_models::arch::Position::Rope(frink_models::arch::RopeLayout::Neox)
        })
    });
}

// The features of the other dense architectures, each removed in turn (the fixtures'
// `feature_ablations` record transformers' own changes: mistral window 0.84, gemma2 window
// 0.71 / attention softcap 0.90 / final softcap 0.89, granite multipliers 1.22 / 0.68 /
// 0.32 / 1.0, phi3 partial RoPE 1.06, stablelm partial RoPE 0.89 / q/k/v bias 0.32,
// starcoder2 biases 0.40, olmo2 Q/K norm weights 0.22).

#[test]
fn mistral_sliding_window_matters() {
    ablate("mistral", "the sliding window on every layer", |m| {
        no_window(m)
    });
}

#[test]
fn gemma2_features_matter() {
    ablate("gemma2", "the sliding window", no_window);
    ablate("gemma2", "attention soft-capping", |m| {
        attn_plans(m).for_each(|a| a.softcap = None)
    });
    ablate("gemma2", "final logit soft-capping", |m| {
        m.config.final_softcap = None
    });
    ablate("gemma2", "the post-FFN norm", |m| {
        m.weights
            .layers
            .iter_mut()
            .for_each(|l| l.post_ffn_norm = None)
    });
}

#[test]
fn granite_multipliers_matter() {
    ablate("granite", "the embedding multiplier", |m| {
        m.config.embed_scale = 1.0
    });
    ablate("granite", "the residual multiplier", |m| {
        m.config.residual_scale = 1.0
    });
    ablate("granite", "the attention multiplier", |m| {
        m.config.attn_scale = 1.0 / (m.config.head_dim_k as f32).sqrt()
    });
    ablate("granite", "the logit scale", |m| m.config.logit_scale = 1.0);
}

#[test]
fn partial_rope_matters() {
    for name in ["phi3", "stablelm"] {
        ablate(name, "partial RoPE (all dimensions rotated)", |m| {
            attn_plans(m).for_each(|a| a.geometry.n_rot = a.geometry.head_dim_k)
        });
    }
}

#[test]
fn biases_matter() {
    ablate("stablelm", "the Q/K/V biases", |m| {
        for l in attn(m) {
            (l.bq, l.bk, l.bv) = (None, None, None);
        }
    });
    ablate("stablelm", "the LayerNorm biases", |m| {
        for l in &mut m.weights.layers {
            l.attn_norm.as_mut().unwrap().bias = None;
            l.ffn_norm.as_mut().unwrap().bias = None;
        }
    });
    ablate("starcoder2", "the projection biases", |m| {
        for l in &mut m.weights.layers {
            let a = l.attention_mut().unwrap();
            (a.bq, a.bk, a.bv, a.bo) = (None, None, None, None);
            let FfnWeights::Dense(f) = &mut l.ffn else {
                unreachable!()
            };
            (f.b_up, f.b_down) = (None, None);
        }
    });
    ablate("bloom", "the fused Q/K/V bias", |m| {
        attn(m).for_each(|l| l.bqkv = None)
    });
}

#[test]
fn olmo2_whole_vector_qk_norm_matters() {
    ablate("olmo2", "the Q/K norm weights (set to 1)", |m| {
        for l in attn(m) {
            l.q_norm.as_mut().unwrap().iter_mut().for_each(|w| *w = 1.0);
            l.k_norm.as_mut().unwrap().iter_mut().for_each(|w| *w = 1.0);
        }
    });
}

#[test]
fn bloom_alibi_and_embedding_norm_matter() {
    ablate("bloom", "ALiBi", |m| {
        m.config.alibi_slopes.iter_mut().for_each(|s| *s = 0.0)
    });
    ablate("bloom", "the embedding LayerNorm", |m| {
        m.weights.token_embd_norm = None
    });
}

#[test]
fn falcon_parallel_block_matters() {
    // Sequential instead of parallel: the FFN reads the residual after attention, normed
    // by the same attn_norm weights.
    ablate("falcon", "the parallel attention + MLP block", |m| {
        for l in &mut m.config.plan.layers {
            l.residual = Residual::Sequential;
        }
        for l in &mut m.weights.layers {
            l.ffn_norm = l.attn_norm.clone();
        }
    });
}

/// The MoE layers of a model, for ablations.
fn moe_layers(m: &mut Model) -> impl Iterator<Item = &mut frink_models::MoeFfn> {
    m.weights
        .layers
        .iter_mut()
        .filter_map(|l| match &mut l.ffn {
            FfnWeights::Moe(e) => Some(&mut **e),
            FfnWeights::Dense(_) | FfnWeights::None => None,
        })
}

// Mixture of experts (the fixtures' ablations: qwen2_moe shared expert / its gate,
// qwen3_moe top-k renormalisation, olmoe Q/K norm weights).

#[test]
fn qwen2moe_shared_expert_and_its_gate_matter() {
    ablate("qwen2_moe", "the shared expert", |m| {
        moe_layers(m).for_each(|e| e.shared = None)
    });
    ablate("qwen2_moe", "the shared expert's sigmoid gate", |m| {
        moe_layers(m).for_each(|e| e.shared_gate = None)
    });
}

#[test]
fn topk_renormalisation_matters() {
    ablate("qwen3_moe", "top-k renormalisation", |m| {
        m.config.moe.as_mut().unwrap().norm_topk = false
    });
    ablate("mixtral", "softmax over the top-k (renormalisation)", |m| {
        m.config.moe.as_mut().unwrap().norm_topk = false
    });
}

#[test]
fn routing_matters() {
    // Two experts instead of the router's choice: the second-best expert only.
    ablate("qwen2_moe", "top-2 routing (top-1 instead)", |m| {
        m.config.moe.as_mut().unwrap().n_used = 1
    });
    ablate("olmoe", "the Q/K norm weights (set to 1)", |m| {
        for l in attn(m) {
            l.q_norm.as_mut().unwrap().iter_mut().for_each(|w| *w = 1.0);
            l.k_norm.as_mut().unwrap().iter_mut().for_each(|w| *w = 1.0);
        }
    });
}

#[test]
fn deepseek_routing_features_matter() {
    for name in ["deepseek_v2", "deepseek_v3"] {
        ablate(name, "the routed scaling factor", |m| {
            m.config.moe.as_mut().unwrap().weights_scale = 1.0
        });
        ablate(name, "the shared expert", |m| {
            moe_layers(m).for_each(|e| e.shared = None)
        });
    }
    ablate("deepseek_v3", "the expert selection bias", |m| {
        moe_layers(m).for_each(|e| e.selection_bias = None)
    });
    ablate("deepseek_v3", "group-limited routing", |m| {
        m.config.moe.as_mut().unwrap().n_group = 0
    });
}

#[test]
fn gpt_oss_features_matter() {
    ablate("gpt_oss", "the sliding window", no_window);
    ablate("gpt_oss", "attention sinks", |m| {
        attn(m).for_each(|l| l.attn_sinks = None)
    });
    ablate("gpt_oss", "the router bias", |m| {
        moe_layers(m).for_each(|e| e.router_bias = None)
    });
    ablate("gpt_oss", "the expert biases", |m| {
        moe_layers(m)
            .for_each(|e| (e.gate_exps_bias, e.up_exps_bias, e.down_exps_bias) = (None, None, None))
    });
    ablate("gpt_oss", "YaRN (plain linear scaling instead)", |m| {
        attn_plans(m).for_each(|a| a.rope.yarn = None)
    });
    ablate(
        "gpt_oss",
        "the clamped SwiGLU (plain SwiGLU instead)",
        |m| set_activation(m, Activation::Silu),
    );
}

#[test]
fn yarn_correction_dims_follow_llama_cpp() {
    // gpt_oss fixture: 16 rotated dims, trained context 64, base 150000, betas 32 / 1:
    // corr_dim(b) = 16 ln(64 / (2π b)) / (2 ln 150000) = -0.87 and 1.94 → [0, 2].
    let y = frink_models::YarnParams::new(16, 64, 150000.0, 32.0, 1.0, 1.0, 1.0);
    assert_eq!(y.corr_dims, [0.0, 2.0]);
}

#[test]
fn group_limited_routing_and_selection_bias() {
    let mc = frink_models::MoeConfig {
        gating: frink_models::Gating::Sigmoid,
        n_group: 2,
        n_group_used: 1,
        n_leading_dense: 0,
        n_expert: 4,
        n_used: 2,
        n_ff_exp: 1,
        n_ff_shexp: 0,
        n_shared: None,
        norm_topk: true,
        weights_scale: 2.0,
        weight_input: false,
        layer_step: 1,
    };
    // Groups {0,1} and {2,3}. Logits make expert 2 the best single expert, but group 0's
    // two experts sum higher, so only experts 0 and 1 may be chosen.
    let logits = [1.0, 1.0, 1.5, -3.0];
    let r = frink_models::route(&logits, None, &mc);
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
    assert!(
        (r[0].1 - 1.0).abs() < 1e-6,
        "renormalised then scaled: {r:?}"
    );
    // A selection bias moves the choice but not the weights: expert 1 first, and its weight
    // still comes from the unbiased sigmoid scores.
    let r = frink_models::route(&logits, Some(&[0.0, 0.5, 0.0, 0.0]), &mc);
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 0]);
    assert!((r[0].1 - 1.0).abs() < 1e-6);
}

#[test]
fn routing_picks_the_most_probable_experts_in_order() {
    let mc = frink_models::MoeConfig {
        gating: frink_models::Gating::Softmax,
        n_group: 0,
        n_group_used: 0,
        n_leading_dense: 0,
        n_expert: 4,
        n_used: 2,
        n_ff_exp: 1,
        n_ff_shexp: 0,
        n_shared: None,
        norm_topk: false,
        weights_scale: 1.0,
        weight_input: false,
        layer_step: 1,
    };
    // Softmax of [0, ln 3, ln 2, ln 3] = [1, 3, 2, 3] / 9: experts 1 and 3 (a tie, lower
    // index first).
    let logits = [0.0, 3f32.ln(), 2f32.ln(), 3f32.ln()];
    let r = frink_models::route(&logits, None, &mc);
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
    assert!((r[0].1 - 1.0 / 3.0).abs() < 1e-6 && (r[1].1 - 1.0 / 3.0).abs() < 1e-6);
    let norm = frink_models::route(
        &logits,
        None,
        &frink_models::MoeConfig {
            norm_topk: true,
            weights_scale: 1.5,
            ..mc
        },
    );
    assert!((norm[0].1 - 0.75).abs() < 1e-6 && (norm[1].1 - 0.75).abs() < 1e-6);
}

#[test]
fn alibi_slopes_follow_the_standard_formula() {
    // Press et al.: for 8 heads the slopes are 2^-1 .. 2^-8; for 4 heads 2^-2 .. 2^-8.
    let s8 = frink_models::alibi_slopes(8, 8.0);
    let want: Vec<f32> = (1..=8).map(|i| 2f32.powi(-i)).collect();
    assert_eq!(s8, want);
    let s4 = frink_models::alibi_slopes(4, 8.0);
    assert_eq!(s4, vec![0.25, 0.0625, 0.015625, 0.00390625]);
    // 6 heads: the first 4 as for 4 heads, then m1^1 and m1^3 with m1 = 2^-1.
    let s6 = frink_models::alibi_slopes(6, 8.0);
    assert_eq!(&s6[..4], &s4[..]);
    assert_eq!(&s6[4..], &[0.5f32, 0.125]);
}

/// One batch of 24 rows vs 24 single-row steps: the per-row computation does not depend on
/// the rows beside it, so the logits and the cache are bit-identical (measured difference:
/// exactly 0 on every architecture and on both matmul paths, f32 and integer dot with
/// quantized activations; any change of reduction order would show here).
#[test]
fn batched_prefill_equals_token_by_token_decode() {
    let quant = |t: &str| -> Option<Fixture> {
        let dir = frink_testdata::require(&format!("fixtures/quant/{t}"), t)?;
        let (_, ids) = fixture("llama_q256")?;
        Some((Model::load(dir.join("llama.gguf")).unwrap(), ids))
    };
    let cases: Vec<(&str, Option<Fixture>)> = vec![
        ("llama", fixture("llama")),
        ("qwen2", fixture("qwen2")),
        ("gemma3", fixture("gemma3")),
        ("mistral", fixture("mistral")),
        ("qwen3", fixture("qwen3")),
        ("gemma", fixture("gemma")),
        ("gemma2", fixture("gemma2")),
        ("phi3", fixture("phi3")),
        ("granite", fixture("granite")),
        ("olmo2", fixture("olmo2")),
        ("stablelm", fixture("stablelm")),
        ("starcoder2", fixture("starcoder2")),
        ("falcon", fixture("falcon")),
        ("bloom", fixture("bloom")),
        ("qwen2_moe", fixture("qwen2_moe")),
        ("qwen3_moe", fixture("qwen3_moe")),
        ("mixtral", fixture("mixtral")),
        ("olmoe", fixture("olmoe")),
        ("deepseek_v2", fixture("deepseek_v2")),
        ("deepseek_v3", fixture("deepseek_v3")),
        ("gpt_oss", fixture("gpt_oss")),
        ("mamba", fixture("mamba")),
        ("mamba2", fixture("mamba2")),
        ("lfm2", fixture("lfm2")),
        ("falcon_h1", fixture("falcon_h1")),
        ("granitemoehybrid", fixture("granitemoehybrid")),
        ("qwen3_next", fixture("qwen3_next")),
        ("llama4", fixture("llama4")),
        ("gemma4", fixture("gemma4")),
        ("Q4_1", quant("Q4_1")),
        ("Q4_K_M", quant("Q4_K_M")),
        ("IQ3_XXS", quant("IQ3_XXS")),
    ];
    for (name, case) in cases {
        let Some((model, ids)) = case else {
            return;
        };
        for kv_type in [KvType::F32, KvType::F16] {
            let mut batch_cache = SeqState::new(&model.config, 64, kv_type);
            let batch = model.forward(&mut batch_cache, &ids, Logits::All).unwrap();
            let mut step_cache = SeqState::new(&model.config, 64, kv_type);
            let mut steps = Vec::new();
            for &id in &ids {
                steps.extend(model.forward(&mut step_cache, &[id], Logits::All).unwrap());
            }
            assert_eq!(batch.len(), steps.len());
            let max_diff = batch
                .iter()
                .zip(&steps)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!("{name} {kv_type:?}: batch vs token-by-token max |Δ| = {max_diff:e}");
            assert_eq!(batch, steps, "{name} {kv_type:?}");
            assert_eq!(batch_cache, step_cache, "{name} {kv_type:?}: caches differ");
        }
    }
}

/// A prompt that would pass the context is refused before anything is written.
#[test]
fn context_overflow_is_refused_without_writing() {
    let Some((model, ids)) = fixture("llama") else {
        return;
    };
    let mut cache = SeqState::new(&model.config, 30, KvType::F32);
    model.forward(&mut cache, &ids[..20], Logits::None).unwrap();
    let before = cache.clone();
    let err = model
        .forward(&mut cache, &ids[..11], Logits::All)
        .unwrap_err();
    assert!(err.to_string().contains("31 positions needed"), "{err}");
    assert_eq!(cache, before);
    let err = model
        .forward(&mut cache, &[100_000], Logits::All)
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(cache, before);
}
