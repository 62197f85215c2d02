//! `frink embed -m M TEXT…` (CONTRACT.md): each text's embedding, pooled as the server's
//! (`--pooling`, else the file's `pooling_type`, else mean) and L2-normalised as
//! `llama-embedding` does by default (`--normalize`, llama.cpp's `--embd-normalize`). An
//! encoder's texts are evaluated several at a time (`--ubatch` tokens a pass), as
//! `llama-embedding` batches them.

use anyhow::{Context, Result};
use clap::{ArgAction, Args};
use frink_engine::Session;
use frink_models::{KvType, Pooling};
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
    /// Keep the first N values before normalising (Matryoshka; only for models trained
    /// for it, such as nomic-embed-text v1.5).
    #[arg(long)]
    pub dimensions: Option<usize>,
    /// Encoder models: tokens evaluated in one pass at most, over several texts (an input
    /// longer than this goes alone).
    #[arg(long = "ubatch", default_value_t = frink_engine::embed::ENCODER_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_048_576))]
    pub ubatch: usize,
    /// Read the texts from FILE, one per line (`-`: stdin), after any given as arguments.
    #[arg(short = 'f', long = "file")]
    pub file: Option<String>,
    /// The texts (each its own sequence, special tokens added as llama.cpp does).
    #[arg(required_unless_present = "file", num_args = 1..)]
    pub texts: Vec<String>,
}

/// A `--pooling` value (`mean`, `cls`, `last`, or `rank`: a reranker's scores).
pub fn parse_pooling(s: &str) -> std::result::Result<Pooling, String> {
    match Pooling::from_name(s) {
        Some(p @ (Pooling::Mean | Pooling::Cls | Pooling::Last | Pooling::Rank)) => Ok(p),
        _ => Err(format!("{s:?} is not a pooling (mean, cls, last or rank)")),
    }
}

/// Embeds each text and prints the vectors: an encoder's texts in passes of several
/// (`--ubatch` tokens), a decoder's each in a fresh session.
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
    let n_embd = model.config.n_embd;
    if let Some(d) = args.dimensions.filter(|&d| d != n_embd) {
        anyhow::ensure!(
            frink_engine::embed::matryoshka(&model),
            "--dimensions {d}: this model's embeddings have {n_embd} dimensions and it was not \
             trained to be shortened (Matryoshka)"
        );
        anyhow::ensure!(
            (1..n_embd).contains(&d),
            "--dimensions {d}: must be between 1 and {n_embd}"
        );
    }
    let texts = crate::rerank::texts_with_file(&args.texts, args.file.as_deref())?;
    let ids = texts
        .iter()
        .map(|t| tok.encode(t, true, true))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut out = if model.config.plan.encoder {
        crate::rerank::check_encoder_lengths(&model, &ids)?;
        let inputs: Vec<(Vec<u32>, Vec<u32>)> = ids.into_iter().map(|t| (t, Vec::new())).collect();
        frink_engine::embed::encode_all(&model, &inputs, pooling, args.ubatch, KvType::F32)?
    } else {
        let mut out = Vec::with_capacity(ids.len());
        for ids in &ids {
            let mut session = Session::new(&model, ids.len().max(1), args.model.kv_type);
            out.push(session.embed(ids, pooling)?);
        }
        out
    };
    for v in &mut out {
        if let Some(d) = args.dimensions {
            v.truncate(d);
        }
        frink_engine::embed::normalize(v, args.normalize);
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
