//! `frink inspect`: what a GGUF file holds.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use frink_gguf::{GgmlType, GgufFile, MetaArray, MetaValue};
use serde_json::{json, Value};

/// Arrays up to this many elements appear in full in `--json` output; longer ones (token
/// lists, merges) are summarised as `{"type": "array", "elem_type", "len", "head"}`.
const FULL_ARRAY_MAX: usize = 256;

/// Prints the layer plan the file compiles to ([`frink_models::plan::Plan`]): one line
/// per run of identical layers.
///
/// Errors: the file's, and [`frink_models::ModelConfig::from_gguf`]'s (an unsupported
/// architecture, inconsistent metadata).
pub fn plan(path: &Path) -> Result<()> {
    let f = GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config = frink_models::ModelConfig::from_gguf(&f)?;
    out!("{}", config.plan);
    Ok(())
}

/// Prints the file's summary (and tensor table with `tensors`), as text or one JSON object:
/// `{"path", "version", "architecture", "file_bytes", "alignment", "data_offset",
/// "metadata": {key: value}, "tensor_count", "type_counts": {type: {"count", "bytes"}},
/// "tool_format",
/// "tensors": [{"name", "type", "shape", "offset", "n_bytes"}]}` where `offset` is the
/// absolute byte offset of the tensor's data in the file and `shape` is ne0 first. JSON
/// always carries the tensor table.
pub fn inspect(path: &Path, tensors: bool, json: bool) -> Result<()> {
    let f = GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut counts: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
    for t in f.tensor_infos() {
        let e = counts.entry(t.ggml_type).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    // Most tensors first, as a reader scans for the main quant type.
    let mut by_count: Vec<_> = counts.iter().collect();
    by_count.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));

    if json {
        let metadata: serde_json::Map<String, Value> = f
            .metadata()
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect();
        let type_counts: serde_json::Map<String, Value> = by_count
            .iter()
            .map(|(t, (n, b))| (t.name().to_string(), json!({"count": n, "bytes": b})))
            .collect();
        let table: Vec<Value> = f
            .tensor_infos()
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "type": t.ggml_type.name(),
                    "shape": t.shape,
                    "offset": f.data_offset() + t.offset,
                    "n_bytes": t.n_bytes,
                })
            })
            .collect();
        let out = json!({
            "path": path.display().to_string(),
            "version": f.version(),
            "architecture": f.architecture(),
            "file_bytes": f.file_len(),
            "alignment": f.alignment(),
            "data_offset": f.data_offset(),
            "metadata": metadata,
            "tensor_count": f.tensor_infos().len(),
            "type_counts": type_counts,
            "tool_format": tool_format_name(&f),
            "lora": lora_summary(&f).map(|l| json!({
                "base_architecture": f.architecture(),
                "alpha": l.alpha,
                "ranks": l.ranks,
                "targets": l.targets,
            })),
            "tensors": table,
        });
        outln!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }

    let total: u64 = counts.values().map(|c| c.1).sum();
    outln!("file:          {}", path.display());
    outln!("architecture:  {}", f.architecture().unwrap_or("(none)"));
    if let Some(name) = f.get("general.name").and_then(|v| v.as_str()) {
        outln!("name:          {name}");
    }
    outln!(
        "GGUF:          v{}, {} bytes, {} metadata keys, data at byte {} (alignment {})",
        f.version(),
        f.file_len(),
        f.metadata().len(),
        f.data_offset(),
        f.alignment()
    );
    outln!("tensors:       {} ({total} bytes)", f.tensor_infos().len());
    if let Some(l) = lora_summary(&f) {
        let ranks = match (l.ranks.first(), l.ranks.last()) {
            (Some(a), Some(b)) if a == b => format!("rank {a}"),
            (Some(a), Some(b)) => format!("ranks {a}..{b}"),
            _ => "no matrices".into(),
        };
        // The targets by kind (the part after `blk.N.`), with how many layers each.
        let mut kinds: Vec<(String, usize)> = Vec::new();
        for t in &l.targets {
            let kind = t
                .split_once("blk.")
                .and_then(|(_, r)| r.split_once('.'))
                .map_or(t.as_str(), |(_, k)| k);
            match kinds.iter_mut().find(|(k, _)| k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind.to_string(), 1)),
            }
        }
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        outln!(
            "LoRA adapter:  for {}, alpha {}, {ranks}, {} matrices: {}",
            f.architecture().unwrap_or("(none)"),
            l.alpha,
            l.targets.len(),
            kinds.join(", ")
        );
    } else {
        outln!("tool calls:    {}", tool_format_name(&f));
    }
    for (t, (n, b)) in &by_count {
        outln!("  {:<8} {n:>5} tensors {b:>12} bytes", t.name());
    }
    outln!("metadata:");
    for (k, v) in f.metadata() {
        outln!("  {k} = {}", value_text(v));
    }
    if tensors {
        outln!("tensor table (offset = absolute byte offset of the data; shape ne0 first):");
        for t in f.tensor_infos() {
            outln!(
                "  {:<40} {:<8} {:<24} {:>12} {:>12}",
                t.name,
                t.ggml_type.name(),
                format!("{:?}", t.shape),
                f.data_offset() + t.offset,
                t.n_bytes
            );
        }
    }
    Ok(())
}

/// What a LoRA adapter file holds (`general.type = adapter`): its alpha, the distinct
/// ranks (sorted) and the adapted base tensors.
struct LoraSummary {
    alpha: f32,
    ranks: Vec<u64>,
    targets: Vec<String>,
}

fn lora_summary(f: &GgufFile) -> Option<LoraSummary> {
    if f.get("general.type").and_then(|v| v.as_str()) != Some("adapter") {
        return None;
    }
    let alpha = f
        .get("adapter.lora.alpha")
        .and_then(|v| v.as_f32())
        .unwrap_or(0.0);
    let mut ranks = Vec::new();
    let mut targets = Vec::new();
    for t in f.tensor_infos() {
        if let Some(base) = t.name.strip_suffix(".lora_b") {
            targets.push(base.to_string());
            ranks.extend(t.shape.first().copied());
        }
    }
    ranks.sort_unstable();
    ranks.dedup();
    Some(LoraSummary {
        alpha,
        ranks,
        targets,
    })
}

/// The tool-call format the file's chat template teaches, as `frink serve` parses it
/// (`hermes`), or why there is none (`none: …`).
fn tool_format_name(f: &GgufFile) -> &'static str {
    match f.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        None => "none (the file has no chat template)",
        Some(t) => match frink_server::tools::ToolFormat::detect(t) {
            Some(f) => f.name(),
            None => "none (the template teaches no tool-call format frink parses)",
        },
    }
}

/// Text form of a value: scalars as-is, short arrays in full, long ones summarised.
fn value_text(v: &MetaValue) -> String {
    match v {
        MetaValue::String(s) if s.len() > 120 => {
            let cut: String = s.chars().take(100).collect();
            format!("{cut:?}… ({} bytes)", s.len())
        }
        MetaValue::Array(a) if a.len() <= 16 && a.elem_type() != frink_gguf::ValueType::Array => {
            let items: Vec<String> = (0..a.len())
                .map(|i| a.get(i).map(|x| x.to_string()).unwrap_or_default())
                .collect();
            format!("[{}]", items.join(", "))
        }
        _ => v.to_string(),
    }
}

fn value_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::F32(x) => json!(x),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        MetaValue::Array(a) => array_json(a),
    }
}

fn array_json(a: &MetaArray) -> Value {
    let elems = |n: usize| -> Vec<Value> {
        match a {
            MetaArray::Array(inner) => inner.iter().take(n).map(array_json).collect(),
            _ => (0..a.len().min(n))
                .filter_map(|i| a.get(i).map(|x| value_json(&x)))
                .collect(),
        }
    };
    if a.len() <= FULL_ARRAY_MAX {
        Value::Array(elems(FULL_ARRAY_MAX))
    } else {
        json!({"type": "array", "elem_type": a.elem_type().name(), "len": a.len(), "head": elems(8)})
    }
}
