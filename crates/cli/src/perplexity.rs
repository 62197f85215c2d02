//! `frink perplexity`: llama-perplexity's number for a text file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{ArgAction, Args};
use frink_tokenizer::Tokenizer;

use crate::common::{read_text, ModelArgs};

/// Flags of `frink perplexity` (CONTRACT.md).
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file (byte for byte; `-`: standard input).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Chunk size in tokens.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
    /// Print one JSON object {"ppl", "ppl_plus_minus", "n_chunks", "ctx", "n_tokens"}.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
}

/// Tokenizes the whole file (add_special = true, parse_special = false, as
/// llama-perplexity does) and computes the perplexity of its chunks.
pub fn run(args: &PerplexityArgs) -> Result<()> {
    // (Whole chunks in batches: no decode path to measure.)
    let mut model = crate::common::ModelArgs {
        decode_seqs: 0,
        ..args.model.clone()
    }
    .load()?;
    crate::common::generative(&model, "perplexity")?;
    let tok =
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?;
    let text = read_text(&args.file)?;
    let tokens = tok.encode(&text, true, false)?;
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    anyhow::ensure!(
        args.ctx >= 4,
        "-c {}: a chunk needs at least 4 tokens",
        args.ctx
    );
    anyhow::ensure!(
        tokens.len() >= args.ctx,
        "the text has {} tokens, fewer than one chunk of {} (-c): perplexity scores whole chunks",
        tokens.len(),
        args.ctx
    );
    eprintln!(
        "{} tokens, {} chunks of {}",
        tokens.len(),
        tokens.len() / args.ctx.max(1),
        args.ctx
    );
    let kv = args.model.kv_type;
    if let (Some(held), Some(full)) = (
        frink_models::SeqState::kv_bytes(&model.config, args.ctx, kv),
        frink_models::SeqState::kv_bytes_all_positions(&model.config, args.ctx, kv),
    ) {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        eprintln!(
            "KV cache {:.2} MiB ({:.1}% of the {:.2} MiB that every position of every layer takes)",
            mib(held),
            100.0 * held as f64 / full.max(1) as f64,
            mib(full)
        );
    }
    let r = frink_engine::perplexity(
        &model,
        &tokens,
        args.ctx,
        bos,
        args.model.kv_type,
        |i, ppl| eprint!("[{}]{ppl:.4},", i + 1),
    )?;
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
