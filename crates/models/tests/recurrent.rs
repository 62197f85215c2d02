//! The recurrent and hybrid families (mamba, mamba2, lfm2, falcon-h1, granitehybrid,
//! qwen3next) beyond the logits of
//! tests/fixtures.rs: each recorded feature ablation of the fixtures (fixtures README, the
//! `feature_ablations` of each meta.json) measured on frink's forward pass, a 512-token
//! prefill against token-by-token decode, and what a recurrent state allows (kept whole
//! or cleared, never cut).

mod common;

use std::time::Instant;

use common::{ablation, logits, metadata_ablation};
use frink_gguf::GgufFile;
use frink_models::{KvType, Logits, Model, SeqState};
use frink_testdata::fixture_input_ids;

/// Zeroes every tap but the newest of each channel (`[taps, channels]`, ne0 = taps):
/// transformers' `weight[..., :-1] = 0`.
fn only_current_tap(v: &mut [f32], shape: &[u64]) {
    let taps = shape[0] as usize;
    for ch in v.chunks_exact_mut(taps) {
        ch[..taps - 1].fill(0.0);
    }
}

#[test]
fn mamba_ablations_match_transformers() {
    ablation("mamba", "D skip", ".ssm_d", |v, _| v.fill(0.0));
}

#[test]
fn mamba2_ablations_match_transformers() {
    ablation("mamba2", "D skip", ".ssm_d", |v, _| v.fill(0.0));
    ablation(
        "mamba2",
        "conv history",
        ".ssm_conv1d.weight",
        only_current_tap,
    );
    // A_log = -30: the file stores A = -exp(A_log).
    ablation("mamba2", "state decay", ".ssm_a", |v, _| {
        v.fill(-(-30f32).exp())
    });
}

#[test]
fn lfm2_ablations_match_transformers() {
    ablation(
        "lfm2",
        "short-conv history",
        ".shortconv.conv.weight",
        only_current_tap,
    );
    ablation("lfm2", "attention layers", ".attn_output.weight", |v, _| {
        v.fill(0.0)
    });
    ablation("lfm2", "q/k layernorm", "_norm.weight", |v, shape| {
        // attn_q_norm / attn_k_norm only (16 values: one head); the other norms are 64.
        if shape == [16] {
            v.fill(1.0)
        }
    });
}

#[test]
fn falcon_h1_ablations_match_transformers() {
    ablation(
        "falcon_h1",
        "attention branch",
        ".attn_output.weight",
        |v, _| v.fill(0.0),
    );
    ablation("falcon_h1", "Mamba-2 branch", ".ssm_out.weight", |v, _| {
        v.fill(0.0)
    });
    ablation("falcon_h1", "D skip", ".ssm_d", |v, _| v.fill(0.0));
    // The fixture's fourth ablation, the muP multipliers, has no GGUF switch: the
    // converter folds them into the weights (fixtures README).
}

#[test]
fn granitehybrid_ablations_match_transformers() {
    let g = "granitemoehybrid";
    ablation(g, "shared MLP", ".ffn_down_shexp.weight", |v, _| {
        v.fill(0.0)
    });
    ablation(g, "routed experts", ".ffn_down_exps.weight", |v, _| {
        v.fill(0.0)
    });
    ablation(g, "attention layer", ".attn_output.weight", |v, _| {
        v.fill(0.0)
    });
    ablation(g, "Mamba-2 D skip", ".ssm_d", |v, _| v.fill(0.0));
    use frink_gguf::MetaValue::F32;
    metadata_ablation(
        g,
        "residual and embedding multipliers",
        &[("residual_scale", F32(1.0)), ("embedding_scale", F32(1.0))],
    );
}

#[test]
fn qwen3next_ablations_match_transformers() {
    let q = "qwen3_next";
    ablation(q, "shared expert", ".ffn_down_shexp.weight", |v, _| {
        v.fill(0.0)
    });
    // A zero gate weight: sigmoid(0) = 0.5 on the shared expert.
    ablation(
        q,
        "shared expert sigmoid gate",
        ".ffn_gate_inp_shexp.weight",
        |v, _| v.fill(0.0),
    );
    ablation(
        q,
        "DeltaNet short-conv history",
        ".ssm_conv1d.weight",
        only_current_tap,
    );
    // A_log = -30: the file stores A = -exp(A_log), so g = 0 (no forgetting).
    ablation(q, "DeltaNet decay", ".ssm_a", |v, _| {
        v.fill(-(-30f32).exp())
    });
    metadata_ablation(
        q,
        "top-k renormalisation",
        &[("expert_weights_norm", frink_gguf::MetaValue::Bool(false))],
    );
}

/// A 512-token prompt evaluated in one batch gives exactly the logits of evaluating it
/// token by token (measured max |Δ| = 0 on all three: the convolution and the scan run
/// position by position in both, and every projection's row is computed alone), and the
/// batch is faster: the figures are printed, not bounded (timings stay out of pass/fail).
#[test]
fn prefill_of_512_tokens_equals_decode() {
    for name in frink_testdata::RECURRENT_FIXTURES {
        let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{name}"), name) else {
            return;
        };
        let model = Model::load(dir.join("model.gguf")).unwrap();
        let v = model.config.n_vocab as u32;
        let ids: Vec<u32> = (0..512u32).map(|i| (i * 7919 + 13) % v).collect();
        let mut batch_state = SeqState::new(&model.config, 512, KvType::F32);
        let t = Instant::now();
        let batch = model.forward(&mut batch_state, &ids, Logits::All).unwrap();
        let t_batch = t.elapsed().as_secs_f64();
        let mut step_state = SeqState::new(&model.config, 512, KvType::F32);
        let mut steps = Vec::with_capacity(batch.len());
        let t = Instant::now();
        for &id in &ids {
            steps.extend(model.forward(&mut step_state, &[id], Logits::All).unwrap());
        }
        let t_steps = t.elapsed().as_secs_f64();
        let max_diff = batch
            .iter()
            .zip(&steps)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{name}: 512-token prefill vs decode max |Δ| = {max_diff:e}; prefill {:.1} ms, decode {:.1} ms ({:.1}x)",
            t_batch * 1e3,
            t_steps * 1e3,
            t_steps / t_batch
        );
        assert!(batch == steps, "{name}: prefill and decode differ");
        assert_eq!(batch_state, step_state, "{name}: the states differ");
    }
}

/// A recurrent state is kept whole or cleared: cut back to an earlier position it starts
/// over (and evaluating from there gives the fresh logits), copied only whole; an
/// attention-only state cuts anywhere.
#[test]
fn a_recurrent_state_is_never_cut() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/lfm2", "recurrent state") else {
        return;
    };
    let model = Model::load(dir.join("model.gguf")).unwrap();
    let ids = fixture_input_ids(&dir);
    let fresh = logits(&model, &ids);
    let mut s = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut s, &ids[..16], Logits::None).unwrap();
    assert!(s.is_recurrent());
    assert_eq!(s.reusable(20), 16, "the whole state, when asked for more");
    assert_eq!(s.reusable(16), 16);
    assert_eq!(s.reusable(10), 0, "never a part");
    // Cut at 10: cleared, so the caller evaluates from 0 and gets the fresh logits.
    assert_eq!(s.truncate(10), 0);
    // (Keys and values past n_past stay as they were: they are never read.)
    assert_eq!(s.n_past(), 0);
    for r in s.layers.iter().filter_map(|l| l.recurrent.as_ref()) {
        assert!(r.conv.iter().chain(&r.ssm).all(|&v| v == 0.0));
    }
    let again = model.forward(&mut s, &ids, Logits::All).unwrap();
    assert!(again == fresh);
    // A whole copy continues exactly as the original.
    let mut src = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut src, &ids[..16], Logits::None).unwrap();
    let mut dst = SeqState::new(&model.config, 64, KvType::F32);
    dst.copy_prefix(&src, 16);
    let tail = model.forward(&mut dst, &ids[16..], Logits::All).unwrap();
    assert!(tail == fresh[16 * model.config.n_vocab..]);

    // Attention only: any prefix.
    let dir = frink_testdata::require("fixtures/tiny/llama", "recurrent state").unwrap();
    let llama = Model::load(dir.join("model.gguf")).unwrap();
    let mut s = SeqState::new(&llama.config, 64, KvType::F32);
    llama.forward(&mut s, &ids[..16], Logits::None).unwrap();
    assert!(!s.is_recurrent());
    assert_eq!((s.reusable(10), s.truncate(10)), (10, 10));
}

/// Qwen3-Next's gated Q projection takes no bias: a file with `attn_q.bias` there is
/// refused (naming the tensor), not read and ignored.
#[test]
fn a_bias_on_a_gated_q_projection_is_refused() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/qwen3_next", "gated q bias") else {
        return;
    };
    let f = GgufFile::open(dir.join("model.gguf")).unwrap();
    let mut w = frink_gguf::GgufWriter::from_file(&f).unwrap();
    let q_dim = 4 * 32;
    w.add_tensor(
        "blk.3.attn_q.bias",
        frink_gguf::GgmlType::F32,
        &[q_dim],
        vec![0; 4 * q_dim as usize],
    )
    .unwrap();
    let e = Model::from_gguf(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()).unwrap_err();
    assert!(e.to_string().contains("blk.3.attn_q.bias"), "{e}");
}
