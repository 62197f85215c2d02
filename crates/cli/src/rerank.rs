//! `frink rerank -m M --query Q DOC…` (CONTRACT.md): each document's relevance to the
//! query from a reranker (a cross-encoder with a classifier head: bge-reranker,
//! ms-marco cross-encoders), best first, with the raw score llama-server's `/v1/rerank`
//! returns. The (query, document) pairs are encoded as the model's tokenizer pairs texts
//! and evaluated several at a time (`--ubatch` tokens a pass).

use anyhow::{Context, Result};
use clap::{ArgAction, Args};
use frink_models::{KvType, Model, Pooling};
use frink_tokenizer::Tokenizer;

use crate::common::ModelArgs;

/// Flags of `frink rerank`.
#[derive(Args, Debug)]
pub struct RerankArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The query the documents are ranked against.
    #[arg(long)]
    pub query: String,
    /// Print only the best N (default: all).
    #[arg(long = "top-n")]
    pub top_n: Option<usize>,
    /// Tokens evaluated in one pass at most, over several pairs.
    #[arg(long = "ubatch", default_value_t = frink_engine::embed::ENCODER_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_048_576))]
    pub ubatch: usize,
    /// Print `{"results": [{"index", "relevance_score", "document": {"text"}}, …]}`, best
    /// first (the shape of `/v1/rerank` with `return_documents`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
    /// Read the documents from FILE, one per line (`-`: stdin), after any given as
    /// arguments.
    #[arg(short = 'f', long = "file")]
    pub file: Option<String>,
    /// The documents.
    #[arg(required_unless_present = "file", num_args = 1..)]
    pub documents: Vec<String>,
}

/// `texts`, then the lines of `file` (`-`: stdin) where given.
///
/// Errors: the file cannot be read or is not UTF-8.
pub fn texts_with_file(texts: &[String], file: Option<&str>) -> Result<Vec<String>> {
    let mut out = texts.to_vec();
    if let Some(f) = file {
        let text = if f == "-" {
            std::io::read_to_string(std::io::stdin()).context("cannot read stdin")?
        } else {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {f}"))?
        };
        out.extend(text.lines().map(str::to_string));
    }
    Ok(out)
}

/// Refuses an encoder input longer than the model's positions or empty, naming it,
/// before anything is evaluated.
///
/// Errors: the first input that does not fit.
pub fn check_encoder_lengths(model: &Model, inputs: &[Vec<u32>]) -> Result<()> {
    let max = model.config.n_ctx_train;
    for (i, t) in inputs.iter().enumerate() {
        anyhow::ensure!(!t.is_empty(), "input {i} has no tokens");
        anyhow::ensure!(
            t.len() <= max,
            "input {i} is {} tokens, longer than the {max} positions the model takes \
             ({}.context_length)",
            t.len(),
            model.config.arch.name
        );
    }
    Ok(())
}

/// Scores each document against the query and prints them best first.
pub fn run(args: &RerankArgs) -> Result<()> {
    let mut model = ModelArgs {
        decode_seqs: 0,
        ..args.model.clone()
    }
    .load()?;
    anyhow::ensure!(
        model.config.plan.encoder && model.has_classifier(),
        "{} ({}) cannot rerank: it has no classifier head (a reranker's GGUF has cls.output, \
         e.g. bge-reranker)",
        args.model.model,
        model.config.arch.name
    );
    let tok =
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?;
    let docs = texts_with_file(&args.documents, args.file.as_deref())?;
    let pairs = docs
        .iter()
        .map(|d| tok.encode_pair(&args.query, d))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let ids: Vec<Vec<u32>> = pairs.iter().map(|p| p.0.clone()).collect();
    check_encoder_lengths(&model, &ids)?;
    let scores =
        frink_engine::embed::encode_all(&model, &pairs, Pooling::Rank, args.ubatch, KvType::F32)?;
    let mut ranked: Vec<(usize, f32)> = scores.iter().map(|s| s[0]).enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(args.top_n.unwrap_or(ranked.len()));
    if args.json {
        let results: Vec<serde_json::Value> = ranked
            .iter()
            .map(|&(i, s)| {
                serde_json::json!({"index": i, "relevance_score": s, "document": {"text": docs[i]}})
            })
            .collect();
        outln!("{}", serde_json::json!({ "results": results }));
    } else {
        for (i, s) in &ranked {
            outln!("{s:.6}\t{i}\t{}", docs[*i]);
        }
    }
    Ok(())
}
