//! Shared by the test files that measure the fixtures' recorded feature ablations
//! (fixtures README, the `feature_ablations` of each meta.json) on frink's forward pass.
#![allow(dead_code)] // each test file uses its own part

use std::path::Path;

use frink_gguf::GgufFile;
use frink_models::plan::{AttentionPlan, Mixer};
use frink_models::{KvType, Logits, Model, SeqState};
use frink_testdata::{fixture_input_ids, read_meta, rel_max_diff};

/// The fixture's GGUF with `edit` applied to the f32 values of every tensor whose name
/// ends with `suffix` (all the fixtures' tensors are F32; the shape is ne0 first).
pub fn edited(dir: &Path, suffix: &str, edit: impl Fn(&mut [f32], &[u64])) -> Model {
    Model::from_gguf(edited_file(dir, suffix, edit)).unwrap()
}

/// [`edited`]'s file, before loading.
pub fn edited_file(dir: &Path, suffix: &str, edit: impl Fn(&mut [f32], &[u64])) -> GgufFile {
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
    assert!(hit > 0 || suffix.is_empty(), "no tensor ends with {suffix}");
    GgufFile::from_bytes(bytes).unwrap()
}

pub fn logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut s = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut s, ids, Logits::All).unwrap()
}

/// The fixture's recorded change for the ablation named `what`, or else the one whose
/// name starts with it.
pub fn recorded(dir: &Path, what: &str) -> f32 {
    let meta = read_meta(dir);
    let all = meta["feature_ablations"].as_array().unwrap();
    let name = |a: &serde_json::Value| a["feature_disabled"].as_str().unwrap().to_string();
    all.iter()
        .find(|a| name(a) == what)
        .or_else(|| all.iter().find(|a| name(a).starts_with(what)))
        .unwrap_or_else(|| panic!("no ablation {what}"))["rel_change_of_logits"]
        .as_f64()
        .unwrap() as f32
}

/// Runs one ablation: frink's relative change of the logits must be transformers' own
/// (measured: within 1e-4 of it on every ablation below, e.g. mamba's D skip 0.7073 vs
/// 0.7073; a block that ignored the ablated weights would show 0, one that misread them
/// a different value), so the bound is 2% of the recorded change.
pub fn ablation(name: &str, what: &str, suffix: &str, edit: impl Fn(&mut [f32], &[u64])) {
    ablation_of(name, what, |dir| edited(dir, suffix, &edit));
}

/// [`ablation`] of a metadata switch: `key` (after the architecture's prefix) set to
/// `value`.
pub fn metadata_ablation(name: &str, what: &str, keys: &[(&str, frink_gguf::MetaValue)]) {
    ablation_of(name, what, |dir| {
        let mut f = edited_file(dir, "", |_, _| {});
        let arch = f.architecture().unwrap().to_string();
        for (key, value) in keys {
            f.set_metadata(&format!("{arch}.{key}"), value.clone());
        }
        Model::from_gguf(f).unwrap()
    });
}

pub fn ablation_of(name: &str, what: &str, ablated: impl FnOnce(&Path) -> Model) {
    let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{name}"), name) else {
        return;
    };
    let ids = fixture_input_ids(&dir);
    let full = logits(&Model::load(dir.join("model.gguf")).unwrap(), &ids);
    let ablated = logits(&ablated(&dir), &ids);
    let ours = rel_max_diff(&ablated, &full);
    let theirs = recorded(&dir, what);
    eprintln!("{name}: {what}: frink {ours:.4}, transformers {theirs:.4}");
    assert!(
        (ours - theirs).abs() <= 0.02 * theirs,
        "{name}: {what}: {ours} vs transformers' {theirs}"
    );
}

/// The plans of every attention layer.
pub fn attn_plans(m: &mut Model) -> impl Iterator<Item = &mut AttentionPlan> {
    m.config
        .plan
        .layers
        .iter_mut()
        .filter_map(|l| match &mut l.mixer {
            Mixer::Attention(a) => Some(a),
            _ => None,
        })
}
