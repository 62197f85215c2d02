//! Llama 4 beyond the logits of tests/fixtures.rs: each feature ablation the `llama4`
//! fixture records, measured on frink's forward pass; the chunk-size rule; and the NoPE
//! layers' query temperature, which only acts from position 8191 on (past the fixture's
//! 24 positions).

mod common;

use common::{ablation, ablation_of, attn_plans, metadata_ablation};
use frink_gguf::{GgufFile, MetaValue};
use frink_models::arch::{Position, QkNorm, RopeLayout};
use frink_models::plan::AttentionPlan;
use frink_models::{KvType, Logits, Model, SeqState};

/// The fixture's model with `edit` applied to its plan.
fn with_plan(dir: &std::path::Path, edit: impl FnOnce(&mut Model)) -> Model {
    let mut m = Model::load(dir.join("model.gguf")).unwrap();
    edit(&mut m);
    m
}

/// Each recorded ablation within 2% of transformers' change (`common::ablation_of`).
/// Measured: chunked attention frink 1.6826 / transformers 1.6826, L2 Q/K norm 0.6822 /
/// 0.6822, NoPE 0.2854 / 0.2854, shared expert 0.6168 / 0.6168.
#[test]
fn llama4_ablations_match_transformers() {
    let l = "llama4";
    // transformers `attention_chunk_size` 8 -> 4096: the file's chunk key.
    metadata_ablation(
        l,
        "chunked attention",
        &[("attention.sliding_window", MetaValue::U32(4096))],
    );
    // `use_qk_norm = false` has no GGUF switch (llama.cpp infers it from 128 experts).
    ablation_of(l, "L2 q/k norm", |dir| {
        with_plan(dir, |m| {
            attn_plans(m).for_each(|a| a.qk_norm = QkNorm::None)
        })
    });
    // `no_rope_layers` all 1: layer 3 rotates and norms as the others (the temperature
    // is 1 at these positions either way).
    ablation_of(l, "NoPE on layer 3", |dir| {
        with_plan(dir, |m| {
            let a = attn_plans(m).nth(3).unwrap();
            assert_eq!(a.position, Position::None);
            a.position = Position::Rope(RopeLayout::Normal);
            a.qk_norm = QkNorm::L2;
            a.temperature = None;
        })
    });
    ablation(l, "shared expert", ".ffn_down_shexp.weight", |v, _| {
        v.fill(0.0)
    });
}

/// The chunk comes from `llama4.attention.sliding_window`; absent, 8192 (llama.cpp's
/// constant); 0 turns chunks, NoPE and the temperature off and every layer rotates with
/// the L2 norm (llama.cpp `src/models/llama4.cpp`, `load_arch_hparams`).
#[test]
fn the_chunk_key_decides_chunks_and_nope() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama4", "llama4 chunks") else {
        return;
    };
    let plans = |f: GgufFile| -> Vec<AttentionPlan> {
        let mut m = Model::from_gguf(f).unwrap();
        attn_plans(&mut m).map(|a| a.clone()).collect()
    };
    let open = || GgufFile::open(dir.join("model.gguf")).unwrap();
    let as_is = plans(open());
    assert_eq!(
        as_is.iter().map(|a| a.chunk).collect::<Vec<_>>(),
        [8, 8, 8, 0]
    );
    assert!(as_is[3].temperature.is_some() && as_is[3].position == Position::None);
    assert!(as_is[..3].iter().all(|a| a.qk_norm == QkNorm::L2));

    let mut f = open();
    f.remove_metadata("llama4.attention.sliding_window");
    let absent = plans(f);
    assert_eq!(
        absent.iter().map(|a| a.chunk).collect::<Vec<_>>(),
        [8192, 8192, 8192, 0]
    );

    let mut f = open();
    f.set_metadata("llama4.attention.sliding_window", MetaValue::U32(0));
    let off = plans(f);
    for a in &off {
        assert_eq!((a.chunk, a.window), (0, 0));
        assert_eq!(a.position, Position::Rope(RopeLayout::Normal));
        assert_eq!(a.qk_norm, QkNorm::L2);
        assert!(a.temperature.is_none());
    }

    // The period of chunked layers from attention.sliding_window_pattern.
    let mut f = open();
    f.set_metadata("llama4.attention.sliding_window_pattern", MetaValue::U32(2));
    assert_eq!(
        plans(f).iter().map(|a| a.chunk).collect::<Vec<_>>(),
        [8, 0, 8, 0]
    );
}

/// The temperature's formula against transformers' `Llama4TextAttention.forward`,
/// `log1p(floor((cache_position + 1) / floor_scale)) * attn_scale + 1` (floor_scale 8192,
/// attn_scale 0.1), computed here in f64.
#[test]
fn attention_temperature_follows_transformers() {
    let t = frink_models::arch::arch_spec("llama4")
        .unwrap()
        .irope
        .unwrap()
        .temperature;
    for pos in [
        0usize, 1, 8190, 8191, 8192, 16382, 16383, 100_000, 1_000_000,
    ] {
        let want = (((pos as f64 + 1.0) / 8192.0).floor()).ln_1p() * 0.1 + 1.0;
        let got = t.factor(pos) as f64;
        assert!((got - want).abs() < 1e-6, "position {pos}: {got} vs {want}");
    }
    assert_eq!(t.factor(8190), 1.0);
    assert!(t.factor(8191) > 1.06);
}

/// On the NoPE layer the temperature leaves positions below 8191 exactly as they are and
/// changes the logits from there on (measured: identical bits over 0..8191, and a change
/// at each position from 8191; a model that ignored it would be identical everywhere).
#[test]
fn the_temperature_acts_from_position_8191() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama4", "llama4 temperature") else {
        return;
    };
    let with = Model::load(dir.join("model.gguf")).unwrap();
    let without = with_plan(&dir, |m| attn_plans(m).for_each(|a| a.temperature = None));
    let n = 8194;
    let ids = frink_testdata::spread_ids(with.config.n_vocab, 0, n);
    let run = |m: &Model| {
        let mut s = SeqState::new(&m.config, n, KvType::F32);
        m.forward(&mut s, &ids, Logits::All).unwrap()
    };
    let (a, b) = (run(&with), run(&without));
    let v = with.config.n_vocab;
    assert!(
        a[..8191 * v] == b[..8191 * v],
        "a change before position 8191"
    );
    for p in 8191..n {
        assert!(
            a[p * v..(p + 1) * v] != b[p * v..(p + 1) * v],
            "no change at position {p}"
        );
    }
}

/// The router's weights go on the experts' inputs (llama.cpp `weight_before_ffn`): put
/// on the outputs instead, as every other architecture does, the logits move by 0.32
/// relative (measured; frink agrees with transformers to 1.2e-6), so the bound 1e-2
/// separates the two.
#[test]
fn router_weights_on_the_expert_inputs_matter() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama4", "llama4 moe input") else {
        return;
    };
    let ids = frink_testdata::fixture_input_ids(&dir);
    let full = common::logits(&Model::load(dir.join("model.gguf")).unwrap(), &ids);
    let outputs = with_plan(&dir, |m| {
        m.config.moe.as_mut().unwrap().weight_input = false
    });
    let change = frink_testdata::rel_max_diff(&common::logits(&outputs, &ids), &full);
    eprintln!("llama4: weights on the expert outputs change the logits by {change:.4}");
    assert!(change > 1e-2, "{change}");
}
