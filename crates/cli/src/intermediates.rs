//! Named intermediates on the command line: `frink logits --dump-intermediates DIR` writes
//! the forward pass's values (llama.cpp's names, [`frink_models::taps`]) for chosen layers
//! and positions, and `frink verify --intermediates FILE` compares each layer's output with
//! transformers' hidden states and names the first layer that departs.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use frink_engine::Session;
use frink_models::taps::{first_departure, parse_ranges, Tapped, Taps};
use frink_models::{KvType, Logits, Model};
use serde_json::{json, Value};

use crate::verify::{ids, read_f32, read_json, Report};

/// How far a layer's output may sit from transformers' before it "departs":
/// `max|Δ| / max|ref|` over the layer's rows. The fp32 fixtures agree to 1e-7..1e-6 at
/// every layer (`crates/models/tests/intermediates.rs` prints them); a skipped norm moves
/// its layer by 0.064 (gemma3 without `blk.3.ffn_norm`).
pub(crate) const LAYER_TOLERANCE: f32 = 1e-4;

/// `--dump-intermediates DIR` and its choices (each also `FRINK_DUMP_…`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DumpArgs {
    /// Write the forward pass's named intermediates here: `index.json` and one
    /// little-endian f32 file per record (`NAME.f32` or `NAME-LAYER.f32`, `[positions][width]`).
    #[arg(long = "dump-intermediates")]
    pub dir: Option<std::path::PathBuf>,
    /// Which (comma-separated; default all): inp_embd, attn_norm, attn_out, ffn_inp,
    /// ffn_norm, ffn_out, l_out, result_norm (llama.cpp's graph names).
    #[arg(long = "dump-names")]
    pub names: Option<String>,
    /// Which layers, e.g. `0,2-5` (default all).
    #[arg(long = "dump-layers")]
    pub layers: Option<String>,
    /// Which positions, e.g. `0-3` (default all).
    #[arg(long = "dump-positions")]
    pub positions: Option<String>,
}

impl DumpArgs {
    /// The taps these choices ask for (`None` without `--dump-intermediates`).
    ///
    /// # Errors
    /// An unknown name, or a layer or position list that does not parse, named.
    pub fn taps(&self) -> Result<Option<Arc<Taps>>> {
        if self.dir.is_none() {
            anyhow::ensure!(
                self.names.is_none() && self.layers.is_none() && self.positions.is_none(),
                "--dump-names, --dump-layers and --dump-positions need --dump-intermediates DIR"
            );
            return Ok(None);
        }
        let ranges = |flag: &str, v: &Option<String>| {
            v.as_deref()
                .map(parse_ranges)
                .transpose()
                .map(Option::flatten)
                .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
        };
        let names = self
            .names
            .as_ref()
            .map(|n| n.split(',').map(|s| s.trim().to_string()).collect());
        let taps = Taps::new(
            names,
            ranges("--dump-layers", &self.layers)?,
            ranges("--dump-positions", &self.positions)?,
        )
        .map_err(|e| anyhow::anyhow!("--dump-names: {e}"))?;
        Ok(Some(Arc::new(taps)))
    }
}

/// Writes `records` into `dir` (created): one f32 file each and `index.json` listing them
/// (`name`, `layer`, `positions`, `width`, `file`); returns the index.
///
/// # Errors
/// The directory or a file cannot be written.
pub fn write(dir: &Path, records: &[Tapped]) -> Result<Vec<Value>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut index = Vec::new();
    for t in records {
        let file = match t.layer {
            Some(l) => format!("{}-{l}.f32", t.name),
            None => format!("{}.f32", t.name),
        };
        let bytes: Vec<u8> = t.rows.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.join(&file), bytes)
            .with_context(|| format!("cannot write {}", dir.join(&file).display()))?;
        index.push(json!({
            "name": t.name, "layer": t.layer, "positions": t.positions,
            "width": t.width, "file": file,
        }));
    }
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_string_pretty(&index)? + "\n",
    )
    .with_context(|| format!("cannot write {}", dir.join("index.json").display()))?;
    Ok(index)
}

/// Evaluates a tiny fixture's `input_ids` with `l_out` tapped and compares each layer with
/// `file` (transformers' hidden states, f32 `[n_layers][n_tokens][n_embd]`): one line per
/// layer, and one check that no layer departs (naming the first that does).
///
/// # Errors
/// The model, `meta.json` or `file` cannot be read, or `file` is not of the model's shape.
pub fn layer_check(
    path: &Path,
    dir: &Path,
    file: &Path,
    kv_type: KvType,
    report: &mut Report,
) -> Result<()> {
    let meta = read_json(&dir.join("meta.json"))?;
    let input = ids(&meta["input_ids"]);
    let mut model = Model::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    let reference = read_f32(file)?;
    let (n_layers, d) = (model.config.plan.layers.len(), model.config.n_embd);
    anyhow::ensure!(
        reference.len() == n_layers * input.len() * d,
        "{} holds {} values; the model's {n_layers} layers × {} tokens × {d} need {}",
        file.display(),
        reference.len(),
        input.len(),
        n_layers * input.len() * d
    );
    let layers: Vec<Vec<f32>> = reference
        .chunks_exact(input.len() * d)
        .map(<[f32]>::to_vec)
        .collect();
    let taps =
        Arc::new(Taps::new(Some(vec!["l_out".into()]), None, None).map_err(anyhow::Error::msg)?);
    model.set_taps(Some(taps.clone()));
    Session::new(&model, input.len(), kv_type)
        .with_batch(input.len())
        .eval(&input, Logits::Last)?;
    let (errors, first) = first_departure(&taps.take(), &layers, LAYER_TOLERANCE);
    for (layer, err) in &errors {
        outln!("layer {layer:>3} l_out: max|Δ|/max|ref| = {err:.2e}");
    }
    report.check(
        "every layer's output vs transformers",
        first.is_none() && errors.len() == n_layers,
        match first {
            None => format!("{} layers within {LAYER_TOLERANCE:.0e}", errors.len()),
            Some(l) => format!("layer {l} is the first to depart (bound {LAYER_TOLERANCE:.0e})"),
        },
    );
    Ok(())
}
