//! The state-space and convolution families (mamba, mamba2, lfm2) beyond the logits of
//! tests/fixtures.rs: each recorded feature ablation of the fixtures (fixtures README, the
//! `feature_ablations` of each meta.json) measured on frink's forward pass, a 512-token
//! prefill against token-by-token decode, and what a recurrent state allows (kept whole
//! or cleared, never cut).

use std::path::Path;
use std::time::Instant;

use frink_gguf::GgufFile;
use frink_models::{KvType, LayerState, Logits, Model, SeqState};
use frink_testdata::{fixture_input_ids, read_meta, rel_max_diff};

/// The fixture's GGUF with `edit` applied to the f32 values of every tensor whose name
/// ends with `suffix` (all the fixtures' tensors are F32; the shape is ne0 first).
fn edited(dir: &Path, suffix: &str, edit: impl Fn(&mut [f32], &[u64])) -> Model {
    let mut bytes = std::fs::read(dir.join("model.gguf")).unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let mut hit = 0;
    for t in f.tensor_infos() {
        if !t.name.ends_with(suffix) {
            continue;
        }
        hit += 1;
        let at = (f.data_offset() + t.offset) as usize;
        let raw = &mut bytes[at..at + t.n_bytes as usize];
        let mut v: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        edit(&mut v, &t.shape);
        for (b, x) in raw.chunks_exact_mut(4).zip(&v) {
            b.copy_from_slice(&x.to_le_bytes());
        }
    }
    assert!(hit > 0, "no tensor ends with {suffix}");
    Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

fn logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut s = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut s, ids, Logits::All).unwrap()
}

/// Zeroes every tap but the newest of each channel (`[taps, channels]`, ne0 = taps):
/// transformers' `weight[..., :-1] = 0`.
fn only_current_tap(v: &mut [f32], shape: &[u64]) {
    let taps = shape[0] as usize;
    for ch in v.chunks_exact_mut(taps) {
        ch[..taps - 1].fill(0.0);
    }
}

/// The fixture's recorded change for the ablation whose name starts with `what`.
fn recorded(dir: &Path, what: &str) -> f32 {
    let meta = read_meta(dir);
    meta["feature_ablations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["feature_disabled"].as_str().unwrap().starts_with(what))
        .unwrap_or_else(|| panic!("no ablation {what}"))["rel_change_of_logits"]
        .as_f64()
        .unwrap() as f32
}

/// Runs one ablation: frink's relative change of the logits must be transformers' own
/// (measured: within 1e-4 of it on every ablation below, e.g. mamba's D skip 0.7073 vs
/// 0.7073; a block that ignored the ablated weights would show 0, one that misread them
/// a different value), so the bound is 2% of the recorded change.
fn ablation(name: &str, what: &str, suffix: &str, edit: impl Fn(&mut [f32], &[u64])) {
    let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{name}"), name) else {
        return;
    };
    let ids = fixture_input_ids(&dir);
    let full = logits(&Model::load(dir.join("model.gguf")).unwrap(), &ids);
    let ablated = logits(&edited(&dir, suffix, edit), &ids);
    let ours = rel_max_diff(&ablated, &full);
    let theirs = recorded(&dir, what);
    eprintln!("{name}: {what}: frink {ours:.4}, transformers {theirs:.4}");
    assert!(
        (ours - theirs).abs() <= 0.02 * theirs,
        "{name}: {what}: {ours} vs transformers' {theirs}"
    );
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

/// A 512-token prompt evaluated in one batch gives exactly the logits of evaluating it
/// token by token (measured max |Δ| = 0 on all three: the convolution and the scan run
/// position by position in both, and every projection's row is computed alone), and the
/// batch is faster: the figures are printed, not bounded (timings stay out of pass/fail).
#[test]
fn prefill_of_512_tokens_equals_decode() {
    for name in ["mamba", "mamba2", "lfm2"] {
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
    assert_eq!(s.n_past, 0);
    for l in &s.layers {
        if let LayerState::Recurrent(r) = l {
            assert!(r.conv.iter().chain(&r.ssm).all(|&v| v == 0.0));
        }
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
