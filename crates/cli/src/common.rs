//! Options and setup shared by the model-running subcommands.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use frink_models::{KvType, Model};
use frink_store::Store;

/// `-m`, `-t` and `--kv-type`, as CONTRACT.md spells them.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Catalog name (fetched on first use) or path to a .gguf file.
    #[arg(short = 'm', long = "model", env = "FRINK_MODEL", default_value = frink_store::default_model_name())]
    pub model: String,
    /// Compute threads (default: the machine's available parallelism).
    #[arg(short = 't', long = "threads", env = "FRINK_THREADS")]
    pub threads: Option<usize>,
    /// KV cache element type: f16 (llama.cpp's default) or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
}

impl ModelArgs {
    /// Resolves `-m` through the store (fetching a catalog model on first use).
    pub fn path(&self) -> Result<PathBuf> {
        Ok(Store::from_env()?.resolve(&self.model)?)
    }

    /// Sizes the compute thread pool, resolves and loads the model.
    pub fn load(&self) -> Result<Model> {
        init_threads(self.threads)?;
        let path = self.path()?;
        Model::load(&path).with_context(|| format!("cannot load {}", path.display()))
    }
}

/// Sizes rayon's global pool once: `threads`, or the available parallelism.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = threads
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // A second call (tests running commands in-process) keeps the first pool.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
    Ok(())
}

/// Parses `1,2,3` into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .with_context(|| format!("bad token id {p:?} in {s:?}"))
        })
        .collect()
}
