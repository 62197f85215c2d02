//! Hostile metadata: every numeric metadata key of every tiny fixture rewritten to each of
//! a set of edge values (integers 0, 1, 3, 7, 2^20, 2^31 − 1; floats 0, −1, NaN, ∞, 1e30)
//! with the project's own GGUF writer, loaded in-process and evaluated. Each variant must
//! load and give finite logits, or fail with an error naming the key (a tensor whose shape
//! the value contradicts is refused naming the keys its expected size comes from).
//! Measured: 3156 fixture variants in ~6 s (1778 refused naming the key, 1261 identical,
//! 117 valid and different), 168 catalog variants (131, 29, 8), 0 bad; before the shape
//! errors named their keys, 595 fixture and 42 catalog refusals named only the tensor. No
//! panic, no abort (an allocation the file cannot justify), no NaN. `FRINK_FUZZ_CASES=N`
//! adds N random values per key. The catalog models (fetched through the store) get the
//! same for the keys of their architecture, set in memory ([`GgufFile::set_metadata`]: the
//! same reads, without copying their tensors).

use std::panic::{catch_unwind, AssertUnwindSafe};

use frink_gguf::{GgufFile, GgufWriter, MetaValue};
use frink_models::{KvType, Logits, Model, SeqState};

/// The edge values of a key of `v`'s type (those the type can hold).
fn variants(v: &MetaValue, extra: &[u64]) -> Vec<MetaValue> {
    let ints: Vec<u64> = [0u64, 1, 3, 7, 1 << 20, (1 << 31) - 1]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let floats = [0.0f64, -1.0, f64::NAN, f64::INFINITY, 1e30];
    match v {
        MetaValue::U8(_) => ints
            .iter()
            .filter(|&&x| x <= u8::MAX as u64)
            .map(|&x| MetaValue::U8(x as u8))
            .collect(),
        MetaValue::U16(_) => ints
            .iter()
            .filter(|&&x| x <= u16::MAX as u64)
            .map(|&x| MetaValue::U16(x as u16))
            .collect(),
        MetaValue::U32(_) => ints.iter().map(|&x| MetaValue::U32(x as u32)).collect(),
        MetaValue::U64(_) => ints.iter().map(|&x| MetaValue::U64(x)).collect(),
        MetaValue::I32(_) => ints
            .iter()
            .map(|&x| MetaValue::I32(x as i32))
            .chain([MetaValue::I32(-1)])
            .collect(),
        MetaValue::I64(_) => ints
            .iter()
            .map(|&x| MetaValue::I64(x as i64))
            .chain([MetaValue::I64(-1)])
            .collect(),
        MetaValue::F32(_) => floats.iter().map(|&x| MetaValue::F32(x as f32)).collect(),
        MetaValue::F64(_) => floats.iter().map(|&x| MetaValue::F64(x)).collect(),
        _ => Vec::new(),
    }
}

/// The first logits of `ids` under `file`, or the load/evaluation error.
fn logits(file: GgufFile, ids: &[u32]) -> Result<Vec<f32>, String> {
    let model = Model::from_gguf(file).map_err(|e| e.to_string())?;
    let mut cache = SeqState::new(&model.config, 8, KvType::F32);
    model
        .forward(&mut cache, ids, Logits::All)
        .map_err(|e| e.to_string())
}

/// The verdicts on a run of variants.
#[derive(Default)]
struct Tally {
    cases: usize,
    refused: usize,
    same: usize,
    changed: usize,
    bad: Vec<String>,
}

impl Tally {
    /// Judges the variant of `name` with `key = v`, run by `run`, against `base`: a
    /// refusal must name the key (a consistency check names every key it reads, a shape
    /// error the keys of the size it expected); logits must be finite.
    fn judge(
        &mut self,
        name: &str,
        key: &str,
        v: &MetaValue,
        base: &[f32],
        run: impl FnOnce() -> Result<Vec<f32>, String>,
    ) {
        self.cases += 1;
        match catch_unwind(AssertUnwindSafe(run)) {
            Err(_) => self.bad.push(format!("{name}: {key} = {v}: panic")),
            Ok(Err(e)) => {
                self.refused += 1;
                if !e.contains(key) {
                    self.bad.push(format!(
                        "{name}: {key} = {v}: error does not name the key: {e}"
                    ));
                }
            }
            Ok(Ok(l)) if l.iter().any(|x| !x.is_finite()) => self
                .bad
                .push(format!("{name}: {key} = {v}: non-finite logits")),
            Ok(Ok(l)) if l == base => self.same += 1,
            Ok(Ok(_)) => self.changed += 1,
        }
    }

    /// Prints the counts and fails on any bad variant.
    fn finish(self, what: &str, start: std::time::Instant) {
        eprintln!(
            "{what}: {} variants in {:.1} s: {} refused by name, {} identical, {} valid and different, {} bad",
            self.cases,
            start.elapsed().as_secs_f64(),
            self.refused,
            self.same,
            self.changed,
            self.bad.len()
        );
        assert!(
            self.bad.is_empty(),
            "{} bad variants:\n{}",
            self.bad.len(),
            self.bad.join("\n")
        );
    }
}

#[test]
fn hostile_numeric_metadata_is_refused_by_name_or_harmless() {
    let Some(root) = frink_testdata::require("fixtures/tiny", "metadata fuzzing") else {
        return;
    };
    let extra: Vec<u64> = {
        let n: usize = std::env::var("FRINK_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % (1 << 24)
            })
            .collect()
    };
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut tally = Tally::default();
    let start = std::time::Instant::now();
    for dir in dirs {
        let path = dir.join("model.gguf");
        let Ok(file) = GgufFile::read(&path) else {
            continue;
        };
        let ids: Vec<u32> = frink_testdata::fixture_input_ids(&dir)[..4].to_vec();
        let Ok(base) = logits(GgufFile::read(&path).unwrap(), &ids) else {
            continue; // an architecture frink does not implement
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for (key, value) in file.metadata() {
            for v in variants(value, &extra) {
                let mut w = GgufWriter::from_file(&file).unwrap();
                w.add_metadata(key.clone(), v.clone());
                let variant = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
                // (Printed so that an abort, which no test can catch, names its case.)
                eprintln!("case {name} {key} = {v}");
                tally.judge(&name, key, &v, &base, || logits(variant, &ids));
            }
        }
    }
    tally.finish("fixtures", start);
}

#[test]
fn hostile_numeric_metadata_of_the_catalog_models_is_refused_or_harmless() {
    let store = frink_store::Store::from_env().unwrap();
    let mut tally = Tally::default();
    let start = std::time::Instant::now();
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        let path = store.resolve(name).unwrap();
        let ids = [1u32, 2, 3, 4];
        let base = logits(GgufFile::open(&path).unwrap(), &ids).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let arch = file.architecture().unwrap().to_string();
        let keys: Vec<(String, MetaValue)> = file
            .metadata()
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{arch}.")))
            .cloned()
            .collect();
        for (key, value) in keys {
            for v in variants(&value, &[]) {
                let mut variant = GgufFile::open(&path).unwrap();
                variant.set_metadata(&key, v.clone());
                tally.judge(name, &key, &v, &base, || logits(variant, &ids));
            }
        }
    }
    tally.finish("catalog", start);
}
