//! The decode path of a loaded model, chosen per machine ([`frink_models::tune`]): forced
//! by a flag (`--no-repack`, `--prefetch`), or read from the tuning cache, or measured
//! once by [`frink_models::Model::calibrate`] and saved there.
//!
//! The cache is `$FRINK_HOME/tuning.json` (default `~/.cache/frink/tuning.json`): one entry
//! per CPU (vendor, family, model, stepping, name), compute threads, sequences per step
//! and file shape (every tensor's name, type and dimensions: a random-weight file with a
//! real model's shapes shares its entry), each with the measured step times. An entry is
//! only ever a speed choice: every path gives the same bits.

use std::path::{Path, PathBuf};

use anyhow::Result;
use frink_gguf::GgufFile;
use frink_models::tune::{Calibration, DecodePath};
use frink_models::Model;
use serde_json::{json, Map, Value};

/// Bumped when the kernels change enough that old measurements no longer hold.
const KERNELS: u32 = 1;

/// Entries the cache keeps (the newest).
const MAX_ENTRIES: usize = 256;

/// How the decode path was chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum How {
    /// A flag named it.
    Forced(&'static str),
    /// The cache had it.
    Cached(PathBuf),
    /// Measured now (and saved, when the cache could be written).
    Measured(Calibration),
    /// Nothing to choose (no packed kernels on this machine, or a command that does not
    /// decode): the loader's default.
    Default,
}

/// The decode path in use and how it was chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The path.
    pub path: DecodePath,
    /// How.
    pub how: How,
}

impl Decision {
    /// One line: `decode path: stored (measured on this CPU: stored 43.1 ms, …)`.
    pub fn describe(&self) -> String {
        let how = match &self.how {
            How::Forced(flag) => format!("forced by {flag}"),
            How::Cached(p) => format!("measured earlier on this CPU, {}", p.display()),
            How::Measured(c) => format!(
                "measured now, {} sequence(s) per step: {}",
                c.seqs,
                c.summary()
            ),
            How::Default => "the default: nothing to choose here".into(),
        };
        format!("decode path: {} ({how})", self.path.name())
    }
}

/// The cache file: next to the model store.
fn cache_path() -> Option<PathBuf> {
    frink_store::home_file("tuning.json")
}

/// `vendor family model stepping name` of the first processor in /proc/cpuinfo.
fn cpu_signature() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
            .and_then(|l| l.split_once(':'))
            .map_or("?", |(_, v)| v.trim())
            .to_string()
    };
    format!(
        "{} {} {} {} {}",
        field("vendor_id"),
        field("cpu family"),
        field("model"),
        field("stepping"),
        field("model name")
    )
}

/// FNV-1a of the architecture and every tensor's name, type and dimensions (stable
/// across builds).
fn shape_hash(file: &GgufFile) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u64::from(x);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(arch(file).as_bytes());
    for t in file.tensor_infos() {
        eat(t.name.as_bytes());
        eat(&(t.ggml_type as u32).to_le_bytes());
        for d in &t.shape {
            eat(&d.to_le_bytes());
        }
    }
    format!("{h:016x}")
}

/// `general.architecture`, or `?`.
fn arch(file: &GgufFile) -> &str {
    file.get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("?")
}

/// The cache key of the model in `file` decoding `seqs` sequences per step here.
fn key(file: &GgufFile, seqs: usize) -> String {
    format!(
        "k{KERNELS} {} | {} threads | {seqs} seqs | {} {}",
        cpu_signature(),
        frink_models::pool::threads(),
        arch(file),
        shape_hash(file)
    )
}

fn read_cache(path: &Path) -> Map<String, Value> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.get("entries").and_then(Value::as_object).cloned())
        .unwrap_or_default()
}

/// Adds `c` under `key` and writes the cache atomically (a temporary file renamed).
fn save(path: &Path, key: &str, c: &Calibration) -> std::io::Result<()> {
    let mut entries = read_cache(path);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let timings: Map<String, Value> = c
        .timings
        .iter()
        .map(|(p, t)| (p.name(), json!(t)))
        .collect();
    entries.insert(
        key.to_string(),
        json!({"path": c.best.name(), "step_seconds": timings, "rounds": c.rounds, "when": now}),
    );
    while entries.len() > MAX_ENTRIES {
        let oldest = entries
            .iter()
            .min_by_key(|(_, v)| v["when"].as_u64().unwrap_or(0))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => entries.remove(&k),
            None => break,
        };
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("json.{}", std::process::id()));
    let text = serde_json::to_string_pretty(&json!({ "entries": entries }))
        .unwrap_or_else(|_| "{}".into());
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Whether packed copies would be made on this machine at all.
pub fn packing_here() -> bool {
    frink_quant::dot::pack::preferred()
}

/// The cached path of the model in `file` decoding `seqs` sequences per step on this
/// machine, and the cache file, if it holds one.
pub fn cached(file: &GgufFile, seqs: usize) -> Option<(DecodePath, PathBuf)> {
    let path = cache_path()?;
    let entries = read_cache(&path);
    let p = entries.get(&key(file, seqs))?.get("path")?.as_str()?;
    DecodePath::parse(p).map(|d| (d, path))
}

/// Measures the paths on `model` (loaded with its packed copies), keeps the fastest
/// (dropping the packed copies when the stored rows win, releasing the stored pages
/// otherwise) and saves it. A cache that cannot be written is reported on stderr, not an
/// error.
///
/// Errors: a decode step's.
pub fn measure(model: &mut Model, seqs: usize) -> Result<Decision> {
    let c = model
        .calibrate(&DecodePath::ALL, seqs)
        .map_err(|e| anyhow::anyhow!("calibrating the decode path: {e}"))?;
    apply(model, c.best);
    if let Some(path) = cache_path() {
        if let Err(e) = save(&path, &key(&model.file, seqs), &c) {
            eprintln!(
                "frink: cannot save the decode-path measurement in {}: {e}",
                path.display()
            );
        }
    }
    Ok(Decision {
        path: c.best,
        how: How::Measured(c),
    })
}

/// Makes `model` decode by `path` for good: the packed copies dropped for the stored
/// rows, the stored pages released for the packed copies.
pub fn apply(model: &mut Model, path: DecodePath) {
    match path {
        DecodePath::Stored => model.set_repack(false),
        DecodePath::Packed(_) => {
            model.set_decode_path(path);
            model.release_stored();
        }
    }
}
