//! Gemma 4 beyond the logits of tests/fixtures.rs: each feature ablation the `gemma4`
//! fixture records, measured on frink's forward pass; the memory KV sharing saves; and
//! the refusal of its mixture-of-experts variant.

mod common;

use common::{ablation, ablation_of, attn_plans, metadata_ablation};
use frink_gguf::{GgufFile, MetaValue};
use frink_models::blocks::attention::QkvWeights;
use frink_models::plan::Mixer;
use frink_models::{KvPool, KvType, Model, ModelError, SeqState};

fn load(dir: &std::path::Path) -> Model {
    Model::load(dir.join("model.gguf")).unwrap()
}

/// Each recorded ablation within 2% of transformers' change (`common::ablation_of`).
/// Measured, frink / transformers: PLE path 1.6755 / 1.6755, PLE token table 1.6207 /
/// 1.6207, KV sharing 1.5700 / 1.5700, sliding window 1.4515 / 1.4515, proportional RoPE
/// 0.4826 / 0.4826, V-norm 1.6586 / 1.6586, layer output scale 1.5316 / 1.5316, final
/// softcap 0.3937 / 0.3937.
#[test]
fn gemma4_ablations_match_transformers() {
    let g = "gemma4";
    let zero = |v: &mut [f32], _: &[u64]| v.fill(0.0);
    let one = |v: &mut [f32], _: &[u64]| v.fill(1.0);
    // transformers `per_layer_projection` is each block's `proj` (ple → n_embd).
    ablation(g, "per-layer embeddings", ".proj.weight", zero);
    ablation(g, "PLE token table", "per_layer_token_embd.weight", zero);
    // Layers 4-5 compute their own keys and values with their source layer's projections
    // and K norm (transformers' `gemma4_no_kv_sharing` hook): as a plan and weights edit.
    ablation_of(g, "KV sharing", |dir| {
        let mut m = load(dir);
        for il in 4..6 {
            let Mixer::Attention(a) = &mut m.config.plan.layers[il].mixer else {
                panic!("layer {il} is attention")
            };
            let src = a.geometry.kv_source.take().expect("a sharing layer");
            let s = m.weights.layers[src].attention_mut().unwrap().clone();
            let QkvWeights::Separate { wk, wv, .. } = s.qkv else {
                panic!("separate projections")
            };
            let d = m.weights.layers[il].attention_mut().unwrap();
            let QkvWeights::QueryOnly(wq) = d.qkv else {
                panic!("layer {il} projects queries only")
            };
            d.qkv = QkvWeights::Separate { wq, wk, wv };
            d.k_norm = s.k_norm;
        }
        m
    });
    metadata_ablation(
        g,
        "sliding window",
        &[("attention.sliding_window", MetaValue::U32(4096))],
    );
    // `partial_rotary_factor` 1: every global pair rotates at the frequency over the full
    // head, i.e. factors of 1.
    ablation(g, "proportional partial RoPE", "rope_freqs.weight", one);
    ablation_of(g, "V-norm", |dir| {
        let mut m = load(dir);
        attn_plans(&mut m).for_each(|a| a.v_norm = false);
        m
    });
    ablation(g, "layer output scale", "layer_output_scale.weight", one);
    metadata_ablation(
        g,
        "final logit softcap",
        &[("final_logit_softcapping", MetaValue::F32(0.0))],
    );
}

/// KV sharing keeps no cache for the sharing layers: per position, the fixture's three
/// windowed layers of 2 × 16-wide heads and one global layer of 2 × 32-wide heads hold
/// (3 · 64 + 128) keys and values, not the (4 · 64 + 2 · 128) of six layers with caches
/// of their own: 320 of 512 elements (62.5%), in a state of its own, in a pool, and in
/// what the memory estimate says.
#[test]
fn kv_sharing_layers_keep_no_cache() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/gemma4", "gemma4 kv sharing") else {
        return;
    };
    let m = load(&dir);
    let n_ctx = 64;
    let per_position = 3 * (32 + 32) + (64 + 64);
    let all = SeqState::kv_bytes_all_positions(&m.config, n_ctx, KvType::F32).unwrap();
    assert_eq!(all, n_ctx * per_position * 4);
    let s = SeqState::new(&m.config, n_ctx, KvType::F32);
    let held: Vec<bool> = s.layers.iter().map(|l| l.kv.is_some()).collect();
    assert_eq!(held, [true, true, true, true, false, false]);
    let bytes: usize = s
        .layers
        .iter()
        .filter_map(|l| l.kv.as_ref())
        .map(|kv| kv.k.bytes() + kv.v.bytes())
        .sum();
    assert_eq!(bytes, all);
    let pool = KvPool::new(&m.config, 4, KvType::F32);
    assert_eq!(pool.bytes(), 4 * 16 * per_position * 4);
    // Without sharing (every layer computing its own keys), the same file would need
    // 512 elements per position: the saving is the two sharing layers' 192.
    let mut unshared = load(&dir);
    attn_plans(&mut unshared).for_each(|a| a.geometry.kv_source = None);
    let no_share = SeqState::kv_bytes_all_positions(&unshared.config, n_ctx, KvType::F32);
    assert_eq!(no_share, Some(n_ctx * 512 * 4));
}

/// Gemma 4's mixture-of-experts variant (26B-A4B) has no fixture yet: a file with
/// experts is refused naming the key, not run as a dense model.
#[test]
fn gemma4_experts_are_refused_by_name() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/gemma4", "gemma4 experts") else {
        return;
    };
    let mut f = GgufFile::open(dir.join("model.gguf")).unwrap();
    f.set_metadata("gemma4.expert_count", MetaValue::U32(4));
    f.set_metadata("gemma4.expert_used_count", MetaValue::U32(2));
    match Model::from_gguf(f) {
        Err(ModelError::Unsupported(e)) => {
            assert!(e.contains("gemma4.expert_count"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

/// `feed_forward_length` may be a per-layer array (Gemma 4 E2B's KV-sharing layers are
/// twice as wide): each layer's FFN is loaded at its own width. The fixture's layers are
/// all 128 wide: the array of its widths gives the same logits, and an array that says
/// layer 5 is 64 wide is refused naming the key against that layer's 128-wide tensor.
#[test]
fn per_layer_ffn_widths_are_read_per_layer() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/gemma4", "gemma4 ffn widths") else {
        return;
    };
    let with = |widths: &[u32]| {
        let mut f = GgufFile::open(dir.join("model.gguf")).unwrap();
        let a = frink_gguf::MetaArray::U32(widths.to_vec());
        f.set_metadata("gemma4.feed_forward_length", MetaValue::Array(a));
        Model::from_gguf(f)
    };
    let ids = frink_testdata::fixture_input_ids(&dir);
    let same = with(&[128; 6]).unwrap();
    assert_eq!(same.config.n_ff_layers, [128; 6]);
    assert!(common::logits(&same, &ids) == common::logits(&load(&dir), &ids));
    let e = with(&[128, 128, 128, 128, 128, 64])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.5.ffn") && e.contains("gemma4.feed_forward_length"),
        "{e}"
    );
}

/// A layer whose keys are also its values (Gemma 4 31B's `attention_k_eq_v`: `attn_k`
/// without `attn_v`) is refused naming the feature, not loaded as a missing tensor or run
/// with some other values.
#[test]
fn keys_as_values_are_refused_by_name() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/gemma4", "gemma4 k_eq_v") else {
        return;
    };
    let f = GgufFile::open(dir.join("model.gguf")).unwrap();
    let mut w = frink_gguf::GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in f.tensors().filter(|t| t.info.name != "blk.1.attn_v.weight") {
        let i = t.info;
        w.add_tensor(i.name.clone(), i.ggml_type, &i.shape, t.data.to_vec())
            .unwrap();
    }
    let e = Model::from_gguf(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()).unwrap_err();
    assert!(
        matches!(&e, ModelError::Unsupported(m) if m.contains("attention_k_eq_v")),
        "{e}"
    );
}
