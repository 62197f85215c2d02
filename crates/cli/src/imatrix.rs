//! `frink imatrix -m M -f TEXT -o imatrix.gguf`: llama-imatrix's importance matrix (the
//! squared activations entering each weight matrix, per column, per expert) over the
//! text's chunks, evaluated as `frink perplexity` evaluates them, written in llama.cpp's
//! GGUF format or its legacy `.dat` one ([`frink_quant::imatrix`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Args, ValueEnum};
use frink_models::imatrix::{record, Recorder};
use frink_tokenizer::Tokenizer;

use crate::common::{read_text, ModelArgs};

/// The file format of `-o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// llama.cpp's GGUF imatrix.
    Gguf,
    /// llama.cpp's legacy binary format.
    Dat,
}

/// Flags of `frink imatrix` (llama-imatrix's names).
#[derive(Args, Debug)]
pub struct ImatrixArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to evaluate (byte for byte; `-`: standard input).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Where the matrix goes.
    #[arg(short = 'o', long = "output", default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// The format (default: GGUF, or dat for an output named *.dat).
    #[arg(long = "output-format", value_enum)]
    pub output_format: Option<OutputFormat>,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
    /// At most this many chunks (default: all the text holds).
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Skip this many chunks at the start of the text.
    #[arg(long = "chunk", default_value_t = 0)]
    pub skip_chunks: usize,
    /// Also record the LM head (output.weight), which llama-imatrix leaves out by default.
    #[arg(long)]
    pub process_output: bool,
    /// Do not print the running perplexity.
    #[arg(long)]
    pub no_ppl: bool,
    /// Read special tokens written in the text as themselves.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub parse_special: bool,
}

/// Runs `frink imatrix`.
///
/// Errors: the model cannot be loaded or is not generative; the text holds fewer than
/// two chunks (llama-imatrix's rule) after the skipped ones; the output cannot be written.
pub fn run(args: &ImatrixArgs) -> Result<()> {
    if args.ctx < 16 {
        bail!("-c {}: llama-imatrix records products of at least 16 rows, so a chunk needs 16 tokens or more", args.ctx);
    }
    let format =
        args.output_format
            .unwrap_or(if args.output.extension().is_some_and(|e| e == "dat") {
                OutputFormat::Dat
            } else {
                OutputFormat::Gguf
            });
    if !args.model.lora.is_empty() || !args.model.lora_scaled.is_empty() {
        bail!("--lora: an importance matrix is of the base model's weights, without adapters");
    }
    let model_path = args.model.path()?;
    let mut model = ModelArgs {
        decode_seqs: 0,
        ..args.model.clone()
    }
    .load_path(&model_path)?;
    // Before any evaluation: a bad output path fails now, not after the work.
    let mut inputs = model.file.shard_paths(&model_path);
    inputs.push(args.file.clone());
    crate::output::check(&args.output, &inputs)?;
    crate::common::generative(&model, "imatrix")?;
    let tok =
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?;
    let text = read_text(&args.file)?;
    let mut tokens = tok.encode(&text, true, args.parse_special)?;
    let ctx = args.ctx;
    if args.skip_chunks > 0 {
        let needed = args
            .skip_chunks
            .checked_add(2)
            .and_then(|n| n.checked_mul(ctx));
        if needed.is_none_or(|n| n >= tokens.len()) {
            bail!(
                "--chunk {}: not enough tokens left after skipping that many chunks of {ctx}",
                args.skip_chunks
            );
        }
        tokens.drain(..args.skip_chunks * ctx);
    }
    if tokens.len() / 2 < ctx {
        bail!(
            "the text has {} tokens: at least two chunks of {ctx} are needed",
            tokens.len(),
        );
    }
    let n_chunks = (tokens.len() / ctx).min(args.chunks.unwrap_or(usize::MAX));
    if n_chunks == 0 {
        bail!("--chunks 0: nothing to evaluate");
    }
    let plural = if n_chunks == 1 { "" } else { "s" };
    eprintln!("{} tokens, {n_chunks} chunk{plural} of {ctx}", tokens.len());
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    let recorder = Recorder::new(&model.file, args.process_output);
    let no_ppl = args.no_ppl;
    let (r, recorder) = record(recorder, || {
        frink_engine::perplexity_with(
            &model,
            &tokens[..n_chunks * ctx],
            ctx,
            bos,
            args.model.kv_type,
            args.process_output,
            |i, ppl| {
                if !no_ppl {
                    eprint!("[{}]{ppl:.4},", i + 1)
                }
            },
        )
    });
    let r = r?;
    eprintln!();
    if !no_ppl {
        eprintln!(
            "Final estimate: PPL = {:.4} +/- {:.5}",
            r.ppl, r.ppl_plus_minus
        );
    }
    let dataset = args.file.to_string_lossy().into_owned();
    let m = recorder.finish(vec![dataset], n_chunks as u32, ctx as u32);
    let bytes = match format {
        OutputFormat::Gguf => m
            .to_gguf()
            .map_err(anyhow::Error::msg)?
            .to_bytes()
            .context("cannot encode the matrix")?,
        OutputFormat::Dat => m.to_legacy(),
    };
    crate::output::write_all(&args.output, &bytes)?;
    eprintln!(
        "{}: {} matrices, {n_chunks} chunk{plural} of {ctx} ({})",
        args.output.display(),
        m.entries.len(),
        match format {
            OutputFormat::Gguf => "GGUF",
            OutputFormat::Dat => "legacy .dat",
        }
    );
    Ok(())
}
