//! Prints a digest of the exact logits bits of every tiny fixture and catalog model, so a
//! refactor that must change no output bit (a new layer plan, a block moved to its own
//! file) can be checked before and after: run it on both commits and diff the output.
//!
//! Run: `cargo run --release -p frink-models --example logits_digest [> before.txt]`.
//! Per model: one batch over 24 ids with an f32 cache (`Logits::All`), and the same ids
//! token by token with an f16 cache (`Logits::Last` each step): the prefill and the decode
//! paths. Models that do not load print their error instead. `FRINK_REPACK=0|1` runs with
//! the stored or the repacked weights (`Model::set_repack`): the digests must be equal.

use std::path::{Path, PathBuf};

use frink_models::{KvType, Logits, Model, SeqState};

/// FNV-1a over the f32 bits.
fn digest(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        x.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    })
}

fn run(path: &Path, ids: &[u32]) -> String {
    let mut model = match Model::load(path) {
        Ok(m) => m,
        Err(e) => return format!("error: {e}"),
    };
    // `FRINK_REPACK=0|1` forces the stored or the packed weights (the digests must not
    // change).
    if let Ok(v) = std::env::var("FRINK_REPACK") {
        model.set_repack(v == "1");
    }
    let mut cache = SeqState::new(&model.config, 64, KvType::F32);
    let batch = model.forward(&mut cache, ids, Logits::All).expect("batch");
    let mut cache = SeqState::new(&model.config, 64, KvType::F16);
    let mut steps = Vec::new();
    for &t in ids {
        steps.extend(model.forward(&mut cache, &[t], Logits::Last).expect("step"));
    }
    format!(
        "batch {:016x} decode {:016x}",
        digest(&batch),
        digest(&steps)
    )
}

fn main() {
    let shared = frink_testdata::shared_dir().expect("shared test data");
    let tiny = shared.join("fixtures/tiny");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&tiny)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let ids = frink_testdata::fixture_input_ids(&dir);
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        println!("{name}: {}", run(&dir.join("model.gguf"), &ids));
    }
    let models = std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/frink/models"));
    if let Ok(models) = models {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&models)
            .map(|d| d.map(|e| e.expect("entry").path()).collect())
            .unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "gguf"));
        files.sort();
        let ids: Vec<u32> = (0..24).map(|i| 100 + 37 * i).collect();
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            println!("{name}: {}", run(&f, &ids));
        }
    }
}
