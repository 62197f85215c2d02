//! `frink embed -m M TEXT…` (CONTRACT.md): each text's embedding, pooled as the server's
//! (`--pooling`, else the file's `pooling_type`, else mean) and L2-normalised as
//! `llama-embedding` does by default (`--normalize`, llama.cpp's `--embd-normalize`).

use anyhow::{Context, Result};
use clap::{ArgAction, Args};
use frink_engine::Session;
use frink_models::Pooling;
use frink_tokenizer::Tokenizer;

use crate::common::ModelArgs;

/// Flags of `frink embed`.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// How the hidden states pool: mean, cls or last (default: the file's, else mean).
    #[arg(long, value_parser = parse_pooling)]
    pub pooling: Option<Pooling>,
    /// Normalisation: -1 none, 0 max-absolute (int16), 1 taxicab, 2 Euclidean, p > 2 p-norm.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    pub normalize: i32,
    /// Print `{"embeddings": [[…], …]}` instead of one line of numbers per text.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
    /// The texts (each its own sequence, special tokens added as llama.cpp does).
    #[arg(required = true, num_args = 1..)]
    pub texts: Vec<String>,
}

/// A `--pooling` value (`mean`, `cls`, `last`).
pub fn parse_pooling(s: &str) -> std::result::Result<Pooling, String> {
    match Pooling::from_name(s) {
        Some(p @ (Pooling::Mean | Pooling::Cls | Pooling::Last)) => Ok(p),
        _ => Err(format!("{s:?} is not a pooling (mean, cls or last)")),
    }
}

/// Embeds each text in a fresh session and prints the vectors.
pub fn run(args: &EmbedArgs) -> Result<()> {
    // (Whole inputs in batches: no decode path to measure.)
    let mut model = crate::common::ModelArgs {
        decode_seqs: 0,
        ..args.model.clone()
    }
    .load()?;
    let tok =
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?;
    let pooling = frink_engine::embed::pooling(args.pooling, model.config.pooling);
    let mut out = Vec::with_capacity(args.texts.len());
    for text in &args.texts {
        let ids = tok.encode(text, true, true)?;
        let mut session = Session::new(&model, ids.len().max(1), args.model.kv_type);
        let mut v = session.embed(&ids, pooling)?;
        frink_engine::embed::normalize(&mut v, args.normalize);
        out.push(v);
    }
    if args.json {
        outln!("{}", serde_json::json!({ "embeddings": out }));
    } else {
        for v in &out {
            let line: Vec<String> = v.iter().map(|x| format!("{x:.7}")).collect();
            outln!("{}", line.join(" "));
        }
    }
    Ok(())
}
