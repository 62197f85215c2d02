//! `frink perplexity`: llama-perplexity's number for a text file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{ArgAction, Args};
use frink_tokenizer::Tokenizer;

use crate::common::{read_text, ModelArgs};

mod kld;

/// Flags of `frink perplexity` (CONTRACT.md).
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file (byte for byte; `-`: standard input). With `--kl-divergence` the
    /// tokens come from the base file; a file given then must hold the same tokens.
    #[arg(short = 'f', long = "file", required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Chunk size in tokens (default 512; with `--kl-divergence`, the base file's).
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// Save every scored token's log-probabilities to FILE (llama-perplexity's
    /// `--kl-divergence-base` format: either engine reads the other's); with
    /// `--kl-divergence`, read them from FILE instead.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this run with the base file of `--kl-divergence-base` (llama-perplexity's
    /// `--kl-divergence`): KL divergence, the perplexity ratio, Δp and top-token agreement.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub kl_divergence: bool,
    /// Print one JSON object {"ppl", "ppl_plus_minus", "n_chunks", "ctx", "n_tokens"} (with
    /// `--kl-divergence`: {"n_tokens", "ppl", "ppl_base", "ln_ppl_ratio", "kld", "kld_max",
    /// "kld_99_9", "kld_99", "kld_median", "rms_dp", "same_top" and the `_unc`
    /// uncertainties; KL divergences in nats, `rms_dp` and `same_top` as fractions}).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
}

/// Tokenizes the whole file (add_special = true, parse_special = false, as
/// llama-perplexity does) and computes the perplexity of its chunks.
pub fn run(args: &PerplexityArgs) -> Result<()> {
    // (Whole chunks in batches: no decode path to measure.)
    let model_path = args.model.path()?;
    let mut model = crate::common::ModelArgs {
        decode_seqs: 0,
        ..args.model.clone()
    }
    .load_path(&model_path)?;
    crate::common::generative(&model, "perplexity")?;
    let tok =
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?;
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    if args.kl_divergence {
        return kld::run(args, &model, &tok, bos);
    }
    let file = args.file.as_ref().context("-f FILE: the text to score")?;
    let ctx = args.ctx.unwrap_or(DEFAULT_CTX);
    if let Some(base) = &args.kl_divergence_base {
        // Before any evaluation: a bad output path fails now, not after the work.
        let mut inputs = model.file.shard_paths(&model_path);
        inputs.push(file.clone());
        let m = &args.model;
        inputs.extend(
            m.lora
                .iter()
                .chain(m.lora_scaled.iter().map(|(p, _)| p))
                .cloned(),
        );
        crate::output::check(base, &inputs)?;
    }
    let text = read_text(file)?;
    let tokens = tok.encode(&text, true, false)?;
    check_chunks(tokens.len(), ctx)?;
    report_kv(&model, ctx, args.model.kv_type);
    let progress = |i: usize, ppl: f64| eprint!("[{}]{ppl:.4},", i + 1);
    let kv = args.model.kv_type;
    let r = match &args.kl_divergence_base {
        Some(base) => kld::save(&model, &tokens, ctx, bos, kv, base, progress)?,
        None => frink_engine::perplexity(&model, &tokens, ctx, bos, kv, progress)?,
    };
    eprintln!();
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "ppl": r.ppl,
                "ppl_plus_minus": r.ppl_plus_minus,
                "n_chunks": r.n_chunks,
                "ctx": r.ctx,
                "n_tokens": tokens.len(),
            })
        );
    } else {
        outln!(
            "PPL = {:.4} +/- {:.5} ({} chunks of {})",
            r.ppl,
            r.ppl_plus_minus,
            r.n_chunks,
            r.ctx
        );
    }
    Ok(())
}

/// `-c` when not given (llama-perplexity's default).
const DEFAULT_CTX: usize = 512;

/// Refuses a chunk size under 4 or a text shorter than one chunk.
fn check_chunks(n_tokens: usize, ctx: usize) -> Result<()> {
    anyhow::ensure!(ctx >= 4, "-c {ctx}: a chunk needs at least 4 tokens");
    anyhow::ensure!(
        n_tokens >= ctx,
        "the text has {n_tokens} tokens, fewer than one chunk of {ctx} (-c): perplexity scores whole chunks",
    );
    eprintln!("{n_tokens} tokens, {} chunks of {ctx}", n_tokens / ctx);
    Ok(())
}

/// Prints the KV cache's size for chunks of `ctx`.
fn report_kv(model: &frink_models::Model, ctx: usize, kv: frink_models::KvType) {
    if let (Some(held), Some(full)) = (
        frink_models::SeqState::kv_bytes(&model.config, ctx, kv),
        frink_models::SeqState::kv_bytes_all_positions(&model.config, ctx, kv),
    ) {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        eprintln!(
            "KV cache {:.2} MiB ({:.1}% of the {:.2} MiB that every position of every layer takes)",
            mib(held),
            100.0 * held as f64 / full.max(1) as f64,
            mib(full)
        );
    }
}
