//! Locating the reference data that tests compare against.
//!
//! The data lives in `shared/` beside the checkout (`golden/`, `fixtures/`), or wherever
//! `$FRINK_TEST_DATA` points. Where it is absent a test skips with a visible notice on
//! stderr, except under `CI=true`, where its absence fails the run: a check that silently
//! skips is a check that cannot fail.

pub mod http;
pub mod hub;

use std::path::{Path, PathBuf};

/// The reference data directory, if present.
///
/// Order: `$FRINK_TEST_DATA`, then `shared/` next to the workspace root (the checkout's
/// parent directory).
pub fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FRINK_TEST_DATA") {
        let dir = PathBuf::from(dir);
        return dir.is_dir().then_some(dir);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = workspace.join("../shared");
    dir.is_dir().then(|| dir.canonicalize().unwrap_or(dir))
}

/// `shared/<rel>` for a test named `test`, or `None` after printing a skip notice.
///
/// Panics under `CI=true` when the data is missing, so CI cannot pass by skipping.
pub fn require(rel: &str, test: &str) -> Option<PathBuf> {
    let found = shared_dir().map(|d| d.join(rel)).filter(|p| p.exists());
    if found.is_none() {
        let msg = format!(
            "reference data shared/{rel} not found (set FRINK_TEST_DATA or place shared/ beside the checkout)"
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test}: {msg}; CI=true requires it");
        }
        skipped(test, &msg);
    }
    found
}

/// Says that `test` skipped and why: `SKIPPED {test}: {why}` on stderr (which cargo shows
/// only for failing tests), and the same line appended to the file `$FRINK_SKIP_LOG` names,
/// if set, so that a run can count what it skipped (`.ci/run` prints the list).
pub fn skipped(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("FRINK_SKIP_LOG") {
        use std::io::Write;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = appended {
            eprintln!("cannot append to $FRINK_SKIP_LOG: {e}");
        }
    }
}

/// A fixture directory's `meta.json`. The generator writes it with Python's `json`, which
/// spells non-finite floats `Infinity`, `-Infinity` and `NaN` (not JSON; e.g. the Mamba-2
/// fixtures' `time_step_limit`): those tokens, outside strings, read as `null`.
///
/// Panics if the file is missing or malformed (the directory came from [`require`]).
pub fn read_meta(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("meta.json")).expect("meta.json");
    serde_json::from_str(&python_json(&text)).expect("meta.json is JSON")
}

/// `text` with Python's non-finite float tokens outside strings replaced by `null`.
pub fn python_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_str, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_str {
            in_str = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_str = true;
        } else if let Some(tok) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t))
        {
            out.push_str("null");
            rest = &rest[tok.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The tiny fixtures (`fixtures/tiny/<name>`) of the architectures with recurrent layers:
/// state-space, convolution and hybrid models, which the recurrent-state tests cover.
pub const RECURRENT_FIXTURES: [&str; 6] = [
    "mamba",
    "mamba2",
    "lfm2",
    "falcon_h1",
    "granitemoehybrid",
    "qwen3_next",
];

/// The KV cache types the tests that compare two ways of keeping a cache run through
/// (frink-models' `KvType` names: each float type, a quantized one with a minimum, and
/// keys and values of different quantized types). The catalog tests of
/// `crates/models/tests/kv_quant.rs` go through every type.
pub const KV_TYPES: [&str; 6] = ["f32", "f16", "q8_0", "bf16", "q4_1", "k=q5_0,v=iq4_nl"];

/// `len` deterministic token ids spread over a vocabulary of `n_vocab`, different for each
/// sequence number `s`: the synthetic inputs of the tests that compare two ways of
/// evaluating the same tokens.
pub fn spread_ids(n_vocab: usize, s: u32, len: usize) -> Vec<u32> {
    let v = n_vocab as u32;
    (0..len as u32)
        .map(|i| (i * 7919 + s * 104_729 + 13) % v)
        .collect()
}

/// The 24 `input_ids` of a tiny fixture directory's `meta.json` (fixtures README: random
/// ids, fed as they are at positions 0..23).
///
/// Panics if the file is missing or malformed (the directory came from [`require`]).
pub fn fixture_input_ids(dir: &Path) -> Vec<u32> {
    let meta = read_meta(dir);
    meta["input_ids"]
        .as_array()
        .expect("input_ids")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}

/// Little-endian f32 values of a reference logits file.
pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .expect("logits file")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The names of the folders in `dir` (the tiny fixtures' architectures), sorted.
///
/// Panics if `dir` cannot be read (a test's own data).
pub fn fixture_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the fixtures folder")
        .map(|e| {
            e.expect("a folder entry")
                .file_name()
                .to_string_lossy()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

/// `max |a − b| / max |b|`: the agreement metric of the fixtures README.
pub fn rel_max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let max_b = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / max_b
}

/// `file` cut into `n` shards as llama.cpp's `gguf-split` lays them out: names
/// `{stem}-0000k-of-0000n.gguf`, the first holding all metadata, every shard `split.no`,
/// `split.count` and `split.tensors.count`, the tensors in order, about `1/n` each.
/// Returns (file name, bytes) per shard.
pub fn split_gguf(file: &frink_gguf::GgufFile, stem: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    use frink_gguf::{GgufWriter, MetaValue};
    let tensors: Vec<_> = file.tensors().collect();
    let per = tensors.len().div_ceil(n);
    (0..n)
        .map(|k| {
            let mut w = GgufWriter::new();
            if k == 0 {
                for (key, v) in file.metadata() {
                    w.add_metadata(key.clone(), v.clone());
                }
            }
            w.add_metadata("split.no", MetaValue::U16(k as u16))
                .add_metadata("split.count", MetaValue::U16(n as u16))
                .add_metadata("split.tensors.count", MetaValue::I32(tensors.len() as i32));
            for t in tensors.iter().skip(k * per).take(per) {
                w.add_tensor(
                    t.info.name.clone(),
                    t.info.ggml_type,
                    &t.info.shape,
                    t.data.to_vec(),
                )
                .expect("a tensor of a valid file");
            }
            (
                format!("{stem}-{:05}-of-{n:05}.gguf", k + 1),
                w.to_bytes().expect("a valid image"),
            )
        })
        .collect()
}

/// Writes a random LoRA adapter for `base` in llama.cpp's GGUF form (the layout of
/// `convert_lora_to_gguf.py`: `general.type = adapter`, `adapter.type = lora`,
/// `adapter.lora.alpha`, `<tensor>.lora_a` `[n_in, rank]` and `<tensor>.lora_b` `[rank,
/// n_out]` in F32) on every base matrix whose name ends with one of `targets` (e.g.
/// `attn_q.weight`): A and B uniform in ±`amp`, from a fixed `seed`.
pub fn write_lora(
    base: &frink_gguf::GgufFile,
    targets: &[&str],
    rank: u64,
    alpha: f32,
    amp: f32,
    seed: u64,
    path: &Path,
) {
    use frink_gguf::{GgmlType, GgufWriter, MetaValue};
    let mut w = GgufWriter::new();
    let arch = base.architecture().expect("an architecture").to_string();
    w.add_metadata("general.architecture", MetaValue::String(arch));
    w.add_metadata("general.type", MetaValue::String("adapter".into()));
    w.add_metadata("adapter.type", MetaValue::String("lora".into()));
    w.add_metadata("adapter.lora.alpha", MetaValue::F32(alpha));
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut values = |n: u64| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                ((u * 2.0 - 1.0) * amp).to_le_bytes()
            })
            .collect()
    };
    for t in base.tensor_infos() {
        if !(2..=3).contains(&t.shape.len()) || !targets.iter().any(|s| t.name.ends_with(s)) {
            continue;
        }
        // A stacked-expert tensor gets one pair per expert (a third dimension).
        let (n_in, n_out) = (t.shape[0], t.shape[1]);
        let n_exp = t.shape.get(2).copied();
        let dims = |a: u64, b: u64| -> Vec<u64> { [a, b].into_iter().chain(n_exp).collect() };
        let per = n_exp.unwrap_or(1);
        for (half, (d0, d1)) in [("lora_a", (n_in, rank)), ("lora_b", (rank, n_out))] {
            let data = values(d0 * d1 * per);
            w.add_tensor(
                format!("{}.{half}", t.name),
                GgmlType::F32,
                &dims(d0, d1),
                data,
            )
            .expect(half);
        }
    }
    w.write_to_file(path).expect("write the adapter");
}

/// The `cases` array of a JSON file of recorded requests and answers (a test's data, such
/// as `crates/server/tests/data/infill.json`).
///
/// Panics if the file is missing or not of that shape.
pub fn read_cases(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("the cases file is JSON");
    v["cases"].as_array().expect("a \"cases\" array").clone()
}

#[cfg(test)]
mod tests {
    #[test]
    fn python_json_reads_non_finite_floats_as_null() {
        let v: serde_json::Value = serde_json::from_str(&super::python_json(
            r#"{"a": [0.0, Infinity, -Infinity, NaN], "s": "NaN \" Infinity"}"#,
        ))
        .unwrap();
        assert_eq!(v["a"], serde_json::json!([0.0, null, null, null]));
        assert_eq!(v["s"], "NaN \" Infinity");
    }
}
