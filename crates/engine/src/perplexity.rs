//! Perplexity exactly as llama.cpp's `llama-perplexity` computes it by default
//! (tools/perplexity/perplexity.cpp, `perplexity()`; rules restated in
//! shared/golden/README.md, "perplexity.json").

use frink_models::{KvType, Logits, Model, ModelError, SeqState};

/// The result of [`perplexity`].
#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp(mean NLL)` over every scored token.
    pub ppl: f64,
    /// `ppl · sqrt((mean(NLL²) − mean(NLL)²) / (count − 1))`.
    pub ppl_plus_minus: f64,
    pub n_chunks: usize,
    pub ctx: usize,
    /// Tokens scored per chunk: `ctx − ctx/2 − 1`.
    pub scored_per_chunk: usize,
    /// The running perplexity after each chunk (what llama-perplexity prints as `[j]`).
    pub running: Vec<f64>,
}

/// Perplexity of `tokens` (the whole corpus, tokenized once) in chunks of `ctx`.
///
/// `floor(n / ctx)` non-overlapping chunks, each from an empty cache at positions
/// `0..ctx`; with `bos` (models that add BOS) the first token of every chunk is replaced by
/// it. Only the second half is scored: logits at positions `ctx/2 .. ctx−2` predict the
/// tokens at `ctx/2+1 .. ctx−1`; NLL = −log softmax over the full vocabulary, in f64.
///
/// Errors: `ctx < 4` or fewer than `ctx` tokens (as [`ModelError::ContextFull`] naming the
/// sizes), evaluation errors.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    kv_type: KvType,
    on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity, ModelError> {
    perplexity_with(model, tokens, ctx, bos, kv_type, false, on_chunk)
}

/// [`perplexity`], with `all_rows`: the LM head over every position of each chunk, not
/// only the scored half (llama-imatrix asks for all logits, so its `--process-output`
/// records every row entering `output.weight`). The same numbers either way.
///
/// Errors: as [`perplexity`].
pub fn perplexity_with(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    kv_type: KvType,
    all_rows: bool,
    on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity, ModelError> {
    perplexity_rows(model, tokens, ctx, bos, kv_type, all_rows, on_chunk, |_| {
        Ok(())
    })
}

/// [`perplexity_with`] that also hands `on_rows` each chunk's scored rows (`n_vocab`
/// logits each) before its perplexity is counted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn perplexity_rows<E: From<ModelError>>(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    kv_type: KvType,
    all_rows: bool,
    mut on_chunk: impl FnMut(usize, f64),
    mut on_rows: impl FnMut(&[f32]) -> Result<(), E>,
) -> Result<Perplexity, E> {
    let n_chunks = tokens.len() / ctx.max(1);
    let first = ctx / 2;
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunks);
    score_chunks(
        model,
        tokens,
        ctx,
        bos,
        kv_type,
        all_rows,
        |ci, rows, targets| -> Result<(), E> {
            on_rows(rows)?;
            for (row, &target) in rows.chunks_exact(model.config.n_vocab).zip(targets) {
                let nll = nll(row, target);
                sum += nll;
                sum2 += nll * nll;
                count += 1;
            }
            let ppl = (sum / count as f64).exp();
            running.push(ppl);
            on_chunk(ci, ppl);
            Ok(())
        },
    )?;
    let mean = sum / count as f64;
    let var = (sum2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    Ok(Perplexity {
        ppl,
        ppl_plus_minus: ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt(),
        n_chunks,
        ctx,
        scored_per_chunk: ctx - first - 1,
        running,
    })
}

/// `−log softmax(row)[target]` in f64 (the max subtracted first).
fn nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let log_sum: f64 = row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln();
    -(row[target as usize] as f64 - max - log_sum)
}

/// Evaluates `tokens` in `floor(n / ctx)` chunks as [`perplexity`] does and hands
/// `on_chunk(chunk, rows, targets)` each chunk's scored rows: the logits at positions
/// `ctx/2 .. ctx−2` (`n_vocab` each, row-major) and the tokens they predict. Shared by
/// [`perplexity_with`] and [`crate::kld::kl_divergence`], so both score the same rows.
///
/// Errors: `ctx < 4` or fewer than `ctx` tokens ([`ModelError::ContextFull`]), evaluation
/// errors, and whatever `on_chunk` returns.
pub(crate) fn score_chunks<E: From<ModelError>>(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    kv_type: KvType,
    all_rows: bool,
    mut on_chunk: impl FnMut(usize, &[f32], &[u32]) -> Result<(), E>,
) -> Result<(), E> {
    let n_chunks = tokens.len() / ctx.max(1);
    if ctx < 4 || n_chunks == 0 {
        return Err(ModelError::ContextFull {
            needed: ctx.max(4),
            n_ctx: tokens.len(),
        }
        .into());
    }
    let n_vocab = model.config.n_vocab;
    let first = ctx / 2;
    let mut cache = SeqState::new(&model.config, ctx, kv_type);
    for ci in 0..n_chunks {
        let mut chunk = tokens[ci * ctx..(ci + 1) * ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        cache.truncate(0);
        let head = if all_rows {
            Logits::All
        } else {
            Logits::From(first)
        };
        let logits = model.forward(&mut cache, &chunk, head)?;
        let skip = if all_rows { first * n_vocab } else { 0 };
        // Row r of the scored rows is position first + r; it predicts chunk[first + r + 1].
        let scored = &logits[skip..skip + (ctx - first - 1) * n_vocab];
        // The targets are the corpus's tokens (a BOS put in place of the first is never one).
        on_chunk(ci, scored, &tokens[ci * ctx + first + 1..(ci + 1) * ctx])?;
    }
    Ok(())
}
