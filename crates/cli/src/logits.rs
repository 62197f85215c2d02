//! `frink logits`: all-position logits of an id sequence, evaluated in one batch.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use frink_engine::Session;
use frink_models::Logits;

use crate::common::ModelArgs;
pub use crate::intermediates::DumpArgs;

/// Evaluates `ids` from an empty cache (one chunk) and writes little-endian f32
/// `[n_ids][n_vocab]` to `out`, and the chosen intermediates where `dump` asks; prints
/// `{"n", "n_vocab"}` (and `"intermediates"`: the records written).
pub fn run(args: &ModelArgs, ids: &[u32], out: &Path, dump: &DumpArgs) -> Result<()> {
    anyhow::ensure!(!ids.is_empty(), "--ids is empty");
    // (One batch from an empty cache: no decode path to measure.)
    let model = crate::common::ModelArgs {
        decode_seqs: 0,
        ..args.clone()
    }
    .load()?;
    crate::common::generative(&model, "logits")?;
    let taps = dump.taps()?;
    let mut model = model;
    model.set_taps(taps.clone());
    let mut session = Session::new(&model, ids.len(), args.kv_type).with_batch(ids.len());
    let logits = session.eval(ids, Logits::All)?;
    let mut bytes = Vec::with_capacity(logits.len() * 4);
    for v in &logits {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::File::create(out)
        .and_then(|mut f| f.write_all(&bytes))
        .with_context(|| format!("cannot write {}", out.display()))?;
    let mut line = serde_json::json!({"n": ids.len(), "n_vocab": model.config.n_vocab});
    if let (Some(taps), Some(dir)) = (taps, &dump.dir) {
        line["intermediates"] = crate::intermediates::write(dir, &taps.take())?.into();
    }
    outln!("{line}");
    Ok(())
}
