//! Shared helpers: the catalog models' tokenizers (fetched through the project's store and
//! built once per test binary) and the golden files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use frink_tokenizer::Tokenizer;
use serde_json::Value;

/// The catalog models with golden data.
pub const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

/// The tokenizer of catalog model `name`, fetched with `Store::pull` on first use.
pub fn tokenizer(name: &str) -> &'static Tokenizer {
    static CELLS: [OnceLock<Tokenizer>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = MODELS
        .iter()
        .position(|m| *m == name)
        .expect("catalog model");
    CELLS[i].get_or_init(|| {
        let store = frink_store::Store::from_env().expect("model store");
        let path = store
            .pull(name)
            .unwrap_or_else(|e| panic!("pull {name}: {e}"));
        let t = std::time::Instant::now();
        let tok = Tokenizer::from_path(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!(
            "{name}: tokenizer built in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        tok
    })
}

/// `shared/golden/<model>/<file>` parsed, or `None` (after a SKIPPED notice) without the data.
pub fn golden(model: &str, file: &str, test: &str) -> Option<Value> {
    let path = frink_testdata::require(&format!("golden/{model}/{file}"), test)?;
    Some(read_json(&path))
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The tiny fixture models (their GGUF files), or an empty list without the data.
pub fn tiny_fixtures(test: &str) -> Vec<(String, PathBuf)> {
    let Some(dir) = frink_testdata::require("fixtures/tiny", test) else {
        return Vec::new();
    };
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .expect("fixtures/tiny")
        .filter_map(|e| {
            let e = e.ok()?;
            let p = e.path().join("model.gguf");
            p.exists()
                .then(|| (e.file_name().to_string_lossy().into_owned(), p))
        })
        .collect();
    out.sort();
    out
}
