//! `frink perplexity --kl-divergence-base FILE [--kl-divergence]`: llama-perplexity's base
//! file written beside a perplexity run, and a run compared with one.

use std::io::{BufReader, BufWriter};
use std::path::Path;

use anyhow::{bail, Context, Result};
use frink_engine::kld::{kl_divergence, perplexity_saving, BaseHeader, KldReport};
use frink_engine::Perplexity;
use frink_models::{KvType, Model};
use frink_tokenizer::Tokenizer;

use super::PerplexityArgs;
use crate::common::read_text;

/// Computes the perplexity of `tokens` and writes the base file `out` whole or not at all.
pub(super) fn save(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    kv: KvType,
    out: &Path,
    progress: impl FnMut(usize, f64),
) -> Result<Perplexity> {
    let (f, part) = crate::output::create_part(out)?;
    let result = perplexity_saving(model, tokens, ctx, bos, kv, BufWriter::new(f), progress)
        .map_err(anyhow::Error::from)
        .and_then(|(r, w)| {
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            Ok(r)
        });
    match result {
        Ok(r) => {
            crate::output::finish(&part, out)?;
            eprintln!("saved the log-probabilities to {}", out.display());
            Ok(r)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e.context(format!("cannot write {}", out.display())))
        }
    }
}

/// Evaluates the base file's tokens and prints llama-perplexity's KL-divergence summary.
pub(super) fn run(
    args: &PerplexityArgs,
    model: &Model,
    tok: &Tokenizer,
    bos: Option<u32>,
) -> Result<()> {
    let path = args
        .kl_divergence_base
        .as_ref()
        .context("--kl-divergence needs --kl-divergence-base FILE")?;
    // The type first: opening a FIFO with no writer would wait for one.
    let is_file = std::fs::metadata(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .is_file();
    if !is_file {
        bail!("{}: not a regular file", path.display());
    }
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        bail!("{}: not a regular file", path.display());
    }
    let mut r = BufReader::new(f);
    let header = BaseHeader::read(
        &mut r,
        meta.len(),
        model.config.n_vocab,
        model.config.n_ctx_train,
    )
    .with_context(|| path.display().to_string())?;
    if let Some(c) = args.ctx.filter(|&c| c != header.n_ctx) {
        bail!(
            "-c {c}: {} was saved with chunks of {}; drop -c or give that",
            path.display(),
            header.n_ctx
        );
    }
    if let Some(file) = &args.file {
        let tokens = tok.encode(&read_text(file)?, true, false)?;
        if tokens.get(..header.tokens.len()) != Some(&header.tokens[..]) {
            bail!(
                "{} does not hold the tokens {} was saved with (its first {} chunks of {})",
                file.display(),
                path.display(),
                header.n_chunk,
                header.n_ctx
            );
        }
    }
    eprintln!(
        "{} chunks of {} from {}",
        header.n_chunk,
        header.n_ctx,
        path.display()
    );
    let stats = kl_divergence(
        model,
        &header,
        &mut r,
        bos,
        args.model.kv_type,
        |i, s| {
            let r = s.report();
            eprintln!(
                "[{}] PPL {:.4}  ln(PPL(Q)/PPL(base)) {:.5} ± {:.5}  KLD {:.5} ± {:.5}  same top {:.3}%",
                i + 1,
                r.ppl,
                r.ln_ppl_ratio,
                r.ln_ppl_ratio_unc,
                r.kld,
                r.kld_unc,
                100.0 * r.same_top
            )
        },
    )
    .with_context(|| path.display().to_string())?;
    print_report(&stats.report(), args.json);
    Ok(())
}

/// Prints `r` as one JSON object or as llama-perplexity's summary lines.
fn print_report(r: &KldReport, json: bool) {
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "n_tokens": r.n_tokens,
                "ppl": r.ppl,
                "ppl_base": r.ppl_base,
                "ln_ppl_ratio": r.ln_ppl_ratio,
                "ln_ppl_ratio_unc": r.ln_ppl_ratio_unc,
                "kld": r.kld,
                "kld_unc": r.kld_unc,
                "kld_max": r.kld_max,
                "kld_99_9": r.kld_99_9,
                "kld_99": r.kld_99,
                "kld_median": r.kld_median,
                "rms_dp": r.rms_dp,
                "rms_dp_unc": r.rms_dp_unc,
                "same_top": r.same_top,
                "same_top_unc": r.same_top_unc,
            })
        );
        return;
    }
    outln!("Mean PPL(Q)                : {:.6}", r.ppl);
    outln!("Mean PPL(base)             : {:.6}", r.ppl_base);
    outln!(
        "Mean ln(PPL(Q)/PPL(base))  : {:.6} ± {:.6}",
        r.ln_ppl_ratio,
        r.ln_ppl_ratio_unc
    );
    outln!(
        "Mean PPL(Q)/PPL(base)      : {:.6} ± {:.6}",
        r.ln_ppl_ratio.exp(),
        r.ln_ppl_ratio.exp() * r.ln_ppl_ratio_unc
    );
    outln!("Mean    KLD: {:.6} ± {:.6}", r.kld, r.kld_unc);
    outln!("Maximum KLD: {:.6}", r.kld_max);
    outln!("99.9%   KLD: {:.6}", r.kld_99_9);
    outln!("99.0%   KLD: {:.6}", r.kld_99);
    outln!("Median  KLD: {:.6}", r.kld_median);
    outln!(
        "RMS Δp    : {:.3} ± {:.3} %",
        100.0 * r.rms_dp,
        100.0 * r.rms_dp_unc
    );
    outln!(
        "Same top p: {:.3} ± {:.3} % ({} tokens)",
        100.0 * r.same_top,
        100.0 * r.same_top_unc,
        r.n_tokens
    );
}
