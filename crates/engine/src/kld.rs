//! KL divergence against a base model's saved log-probabilities, as llama-perplexity's
//! `--kl-divergence-base FILE` and `--kl-divergence` compute it
//! (tools/perplexity/perplexity.cpp: `log_softmax`, `process_logits`, `kl_divergence`),
//! in its file format, so that either engine reads the other's file.
//!
//! The file: `_logits_`, then `n_ctx`, `n_vocab`, `n_chunk` (u32, i32, i32 little-endian),
//! the `n_chunk · n_ctx` evaluated tokens (i32), then for every chunk its scored rows
//! (positions `n_ctx/2 .. n_ctx−2`), each `nv = 2·⌈n_vocab/2⌉ + 4` u16: the row's scale and
//! smallest kept log-probability (two f32), then each token's log-probability as
//! `round((logit − min_logit) / scale)`, where `min_logit` is at most 16 below the largest
//! logit and `scale = (max_logit − min_logit) / 65535` (0 below `min_logit`).

use std::io::{Read, Write};

use frink_models::{KvType, Model, ModelError};

use crate::perplexity::{perplexity_rows, score_chunks};
use crate::Perplexity;

const MAGIC: &[u8; 8] = b"_logits_";
const HEADER_BYTES: u64 = 8 + 3 * 4;

/// The most tokens a base file may hold (2^26: 256 MiB of token ids; wikitext-2's test
/// set, the usual corpus, is 330k).
pub const MAX_TOKENS: usize = 1 << 26;

/// Errors of the KL-divergence file and evaluation.
#[derive(Debug, thiserror::Error)]
pub enum KldError {
    #[error("log-probability file: {0}")]
    Io(#[from] std::io::Error),
    /// The file is not one llama-perplexity's `--kl-divergence-base` writes, or does not fit
    /// this model (the message names what).
    #[error("log-probability file: {0}")]
    Format(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// u16 values a row of `n_vocab` log-probabilities takes in the file (llama.cpp's `nv`).
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Tokens a chunk of `n_ctx` scores (positions `n_ctx/2 .. n_ctx−2`).
fn scored(n_ctx: usize) -> usize {
    n_ctx - n_ctx / 2 - 1
}

/// Encodes one row of logits as llama.cpp's `log_softmax` stores it (`out.len()` =
/// [`row_len`]`(logits.len())`): f32 arithmetic as there, the sum of exponentials in f64.
pub fn encode_row(logits: &[f32], out: &mut [u16]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let min = logits
        .iter()
        .fold(f32::INFINITY, |m, &v| m.min(v))
        .max(max - 16.0);
    let sum_exp: f64 = logits.iter().map(|&v| (v - max).exp() as f64).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    let (head, rest) = out.split_at_mut(4);
    for (i, v) in [scale, min_log_prob].into_iter().enumerate() {
        let b = v.to_le_bytes();
        head[2 * i] = u16::from_le_bytes([b[0], b[1]]);
        head[2 * i + 1] = u16::from_le_bytes([b[2], b[3]]);
    }
    rest.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (q, &v) in rest.iter_mut().zip(logits) {
            if v > min {
                // ggml's nearest_int: round half to even (values 0 ..= 65535 here).
                *q = (inv * (v - min)).round_ties_even() as u16;
            }
        }
    }
}

/// The scale and smallest log-probability of an encoded row.
fn row_scale(row: &[u16]) -> (f32, f32) {
    let f = |i: usize| {
        let (lo, hi) = (row[i].to_le_bytes(), row[i + 1].to_le_bytes());
        f32::from_le_bytes([lo[0], lo[1], hi[0], hi[1]])
    };
    (f(0), f(2))
}

/// Refuses a stored row whose scale or smallest log-probability could not have come from
/// logits: not finite, a negative scale, or log-probabilities above 0 (a zero scale is a
/// row of equal logits, which llama.cpp writes as such).
fn check_row(row: &[u16]) -> Result<(), String> {
    let (scale, min_log_prob) = row_scale(row);
    let top = min_log_prob + 65535.0 * scale;
    if !scale.is_finite() || scale < 0.0 || !min_log_prob.is_finite() || top > 1e-3 {
        return Err(format!(
            "scale {scale} and smallest log-probability {min_log_prob} are not a row of \
             log-probabilities"
        ));
    }
    Ok(())
}

/// The header and tokens of a log-probability file.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseHeader {
    /// Tokens per chunk (`-c`).
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// The `n_chunk · n_ctx` evaluated tokens (the first of a chunk before any BOS).
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    /// The file's total size in bytes, or `None` on overflow.
    fn file_bytes(n_ctx: usize, n_vocab: usize, n_chunk: usize) -> Option<u64> {
        let toks = (n_ctx as u64).checked_mul(n_chunk as u64)?.checked_mul(4)?;
        let rows = (scored(n_ctx) as u64)
            .checked_mul(n_chunk as u64)?
            .checked_mul(row_len(n_vocab) as u64)?
            .checked_mul(2)?;
        HEADER_BYTES.checked_add(toks)?.checked_add(rows)
    }

    /// Writes the header and tokens (`tokens.len()` = `n_chunk · n_ctx`).
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(MAGIC)?;
        for v in [self.n_ctx, self.n_vocab, self.n_chunk] {
            w.write_all(&(v as u32).to_le_bytes())?;
        }
        let mut buf = Vec::with_capacity(self.tokens.len() * 4);
        for &t in &self.tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        w.write_all(&buf)
    }

    /// Reads and checks the header and tokens of a file of `file_len` bytes for a model of
    /// `n_vocab` tokens and a context of `max_ctx` (0: no bound): every size is checked
    /// against the file's length, the context and [`MAX_TOKENS`] before anything is
    /// allocated.
    ///
    /// Errors: [`KldError::Format`] naming the field that is wrong (magic, sizes, a token
    /// outside the vocabulary, a length that is not the one the header gives).
    pub fn read(
        r: &mut impl Read,
        file_len: u64,
        n_vocab: usize,
        max_ctx: usize,
    ) -> Result<Self, KldError> {
        let bad = |m: String| KldError::Format(m);
        let mut head = [0u8; HEADER_BYTES as usize];
        r.read_exact(&mut head).map_err(|_| {
            bad(format!(
                "{file_len} bytes, shorter than the {HEADER_BYTES}-byte header"
            ))
        })?;
        if &head[..8] != MAGIC {
            return Err(bad(
                "not a llama-perplexity --kl-divergence-base file (no _logits_ magic)".into(),
            ));
        }
        let field = |i: usize| i32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().unwrap());
        let (n_ctx, file_vocab, n_chunk) = (field(0), field(1), field(2));
        if !(4..=1 << 24).contains(&n_ctx) || n_chunk < 1 || file_vocab < 1 {
            return Err(bad(format!(
                "n_ctx {n_ctx}, n_vocab {file_vocab}, n_chunk {n_chunk}: out of range"
            )));
        }
        let (n_ctx, file_vocab, n_chunk) = (n_ctx as usize, file_vocab as usize, n_chunk as usize);
        if file_vocab != n_vocab {
            return Err(bad(format!(
                "saved with a vocabulary of {file_vocab} tokens; this model has {n_vocab}"
            )));
        }
        if max_ctx > 0 && n_ctx > max_ctx {
            return Err(bad(format!(
                "chunks of {n_ctx} tokens, longer than this model's context of {max_ctx}"
            )));
        }
        if n_ctx.saturating_mul(n_chunk) > MAX_TOKENS {
            return Err(bad(format!(
                "{n_chunk} chunks of {n_ctx}: more than {MAX_TOKENS} tokens"
            )));
        }
        let want = Self::file_bytes(n_ctx, n_vocab, n_chunk);
        if want != Some(file_len) {
            return Err(bad(format!(
                "{file_len} bytes, but its header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk \
                 {n_chunk}) makes {}",
                want.map_or("an impossible size".into(), |w| format!("{w} bytes"))
            )));
        }
        let mut raw = vec![0u8; n_ctx * n_chunk * 4];
        r.read_exact(&mut raw)?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(bad(format!(
                "token {} is outside the vocabulary of {n_vocab}",
                *t as i32
            )));
        }
        Ok(BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
        })
    }
}

/// Writes the scored rows of each chunk, as [`perplexity`](crate::perplexity) evaluates
/// them, after a [`BaseHeader`]: the `--kl-divergence-base` file of a base run.
pub struct BaseWriter<W: Write> {
    w: W,
    n_vocab: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl<W: Write> BaseWriter<W> {
    /// Writes `header` to `w`.
    pub fn new(mut w: W, header: &BaseHeader) -> std::io::Result<Self> {
        header.write(&mut w)?;
        Ok(BaseWriter {
            w,
            n_vocab: header.n_vocab,
            row: vec![0; row_len(header.n_vocab)],
            bytes: Vec::new(),
        })
    }

    /// Appends the encoded rows of one chunk (`rows`: `n_vocab` logits each).
    pub fn write_chunk(&mut self, rows: &[f32]) -> std::io::Result<()> {
        self.bytes.clear();
        for logits in rows.chunks_exact(self.n_vocab) {
            encode_row(logits, &mut self.row);
            for v in &self.row {
                self.bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.w.write_all(&self.bytes)
    }

    /// The writer, flushed.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Sums over scored tokens, as llama.cpp's `kl_divergence_result` keeps them, and each
/// token's KL divergence and probability change for the percentiles.
#[derive(Clone, Debug, Default)]
pub struct KldStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    n_same_top: usize,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

impl KldStats {
    /// Adds one scored token: this run's `logits` (n_vocab), the base's encoded row
    /// (`base.len()` = [`row_len`]`(n_vocab)`) and the token that follows. llama.cpp's
    /// `log_softmax(…, kld)` arithmetic: f32 per token, the sums over the vocabulary in
    /// f64, base log-probabilities below −16 left out of the divergence.
    pub fn add(&mut self, logits: &[f32], base: &[u16], target: u32) {
        let (mut max, mut imax) = (logits[0], 0);
        for (i, &v) in logits.iter().enumerate().skip(1) {
            if v > max {
                (max, imax) = (v, i);
            }
        }
        let sum_exp: f64 = logits.iter().map(|&v| (v - max).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob) = row_scale(base);
        let base = &base[4..4 + logits.len()];
        let t = target as usize;
        let nll = max + log_sum_exp - logits[t];
        let nll_base = -(scale * base[t] as f32 + min_log_prob);
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        let norm = max + log_sum_exp;
        let (mut kld, mut imax_base, mut best) = (0f64, 0, f32::NEG_INFINITY);
        for (i, (&q, &v)) in base.iter().zip(logits).enumerate() {
            let lp_base = scale * q as f32 + min_log_prob;
            if i == 0 || lp_base > best {
                (best, imax_base) = (lp_base, i);
            }
            if lp_base > -16.0 {
                kld += (lp_base.exp() * (lp_base - v + norm)) as f64;
            }
        }
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.n_same_top += usize::from(imax == imax_base);
        let p_diff = (-nll).exp() - (-nll_base).exp();
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff += p_diff as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.kld_values.push(kld as f32);
        self.p_diff_values.push(p_diff);
    }

    /// Tokens added.
    pub fn count(&self) -> usize {
        self.kld_values.len()
    }

    /// llama-perplexity's summary of the tokens added so far (its formulas: a mean's
    /// uncertainty is `sqrt(var / (n − 1))`, 0 for ten tokens or fewer).
    pub fn report(&self) -> KldReport {
        let n = self.count();
        let mean_unc = |sum: f64, sum2: f64| {
            if n == 0 {
                return (0.0, 0.0);
            }
            let f = sum / n as f64;
            let df = sum2 / n as f64 - f * f;
            (
                f,
                if df > 0.0 && n > 10 {
                    (df / (n as f64 - 1.0)).sqrt()
                } else {
                    0.0
                },
            )
        };
        let cov = if n < 10 {
            0.0
        } else {
            let nf = n as f64;
            (self.sum_nll_nll_base / nf - (self.sum_nll / nf) * (self.sum_nll_base / nf))
                / (nf - 1.0)
        };
        let (lq, lq_u) = mean_unc(self.sum_nll, self.sum_nll2);
        let (lb, lb_u) = mean_unc(self.sum_nll_base, self.sum_nll_base2);
        let ln_ratio_unc = (lq_u * lq_u + lb_u * lb_u - 2.0 * cov).max(0.0).sqrt();
        let (kld, kld_unc) = mean_unc(self.sum_kld, self.sum_kld2);
        let (mse, mse_u) = mean_unc(self.sum_p_diff2, self.sum_p_diff4);
        let rms = mse.sqrt();
        let same = if n == 0 {
            0.0
        } else {
            self.n_same_top as f64 / n as f64
        };
        let mut sorted = self.kld_values.clone();
        sorted.sort_by(f32::total_cmp);
        let pct = |f: f64| percentile(&sorted, f);
        KldReport {
            n_tokens: n,
            ppl: lq.exp(),
            ppl_base: lb.exp(),
            ln_ppl_ratio: lq - lb,
            ln_ppl_ratio_unc: ln_ratio_unc,
            kld,
            kld_unc,
            kld_max: pct(1.0),
            kld_99_9: pct(0.999),
            kld_99: pct(0.99),
            kld_median: pct(0.5),
            rms_dp: rms,
            rms_dp_unc: if rms > 0.0 { 0.5 / rms * mse_u } else { 0.0 },
            same_top: same,
            same_top_unc: if n > 1 {
                (same * (1.0 - same) / (n as f64 - 1.0)).sqrt()
            } else {
                0.0
            },
        }
    }
}

/// llama-perplexity's percentile: linear between the two nearest of the sorted values.
fn percentile(sorted: &[f32], fraction: f64) -> f64 {
    let Some((&lo, &hi)) = sorted.first().zip(sorted.last()) else {
        return 0.0;
    };
    if fraction <= 0.0 {
        return lo as f64;
    }
    if fraction >= 1.0 {
        return hi as f64;
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let i = p as usize;
    let f = p - i as f64;
    (1.0 - f) * sorted[i] as f64 + f * sorted[(i + 1).min(sorted.len() - 1)] as f64
}

/// What `--kl-divergence` reports (llama-perplexity's names in the comments).
#[derive(Clone, Debug, PartialEq)]
pub struct KldReport {
    pub n_tokens: usize,
    /// "Mean PPL(Q)": this run's perplexity.
    pub ppl: f64,
    /// "Mean PPL(base)": the base file's.
    pub ppl_base: f64,
    /// "Mean ln(PPL(Q)/PPL(base))" and its uncertainty (paired: the covariance of the two
    /// runs' per-token NLLs taken out).
    pub ln_ppl_ratio: f64,
    pub ln_ppl_ratio_unc: f64,
    /// "Mean KLD" (nats per token) and its uncertainty.
    pub kld: f64,
    pub kld_unc: f64,
    pub kld_max: f64,
    pub kld_99_9: f64,
    pub kld_99: f64,
    pub kld_median: f64,
    /// "RMS Δp": the root mean square change of the next token's probability (0–1).
    pub rms_dp: f64,
    pub rms_dp_unc: f64,
    /// "Same top p": the fraction of tokens whose most likely next token is the base's.
    pub same_top: f64,
    pub same_top_unc: f64,
}

/// Evaluates the base file's chunks (`header.tokens`, `header.n_ctx` each; `bos` in place
/// of each chunk's first token where the model adds one) and compares every scored row
/// with the base's, read from `rows` (the file after its header), as llama-perplexity
/// `--kl-divergence` does. `on_chunk(chunk, stats so far)` after each chunk.
///
/// Errors: a short read of the rows ([`KldError::Io`]), evaluation errors.
pub fn kl_divergence(
    model: &Model,
    header: &BaseHeader,
    rows: &mut impl Read,
    bos: Option<u32>,
    kv_type: KvType,
    mut on_chunk: impl FnMut(usize, &KldStats),
) -> Result<KldStats, KldError> {
    let nv = row_len(header.n_vocab);
    let per_chunk = scored(header.n_ctx);
    let mut stats = KldStats::default();
    let (mut bytes, mut base) = (vec![0u8; per_chunk * nv * 2], vec![0u16; per_chunk * nv]);
    score_chunks(
        model,
        &header.tokens,
        header.n_ctx,
        bos,
        kv_type,
        false,
        |ci, logits, targets| -> Result<(), KldError> {
            rows.read_exact(&mut bytes)?;
            for (v, b) in base.iter_mut().zip(bytes.chunks_exact(2)) {
                *v = u16::from_le_bytes([b[0], b[1]]);
            }
            for (r, ((row, b), &t)) in logits
                .chunks_exact(header.n_vocab)
                .zip(base.chunks_exact(nv))
                .zip(targets)
                .enumerate()
            {
                check_row(b)
                    .map_err(|m| KldError::Format(format!("chunk {}, row {r}: {m}", ci + 1)))?;
                stats.add(row, b, t);
            }
            on_chunk(ci, &stats);
            Ok(())
        },
    )?;
    Ok(stats)
}

/// [`perplexity`](crate::perplexity) of `tokens` that also writes the base file of this
/// run to `w` (llama-perplexity `--kl-divergence-base FILE` without `--kl-divergence`):
/// the header with the evaluated tokens, then each chunk's encoded rows.
///
/// Errors: as [`perplexity`](crate::perplexity), and write errors.
pub fn perplexity_saving<W: Write>(
    model: &Model,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    kv_type: KvType,
    w: W,
    on_chunk: impl FnMut(usize, f64),
) -> Result<(Perplexity, W), KldError> {
    let n_chunk = tokens.len() / ctx.max(1);
    let header = BaseHeader {
        n_ctx: ctx,
        n_vocab: model.config.n_vocab,
        n_chunk,
        tokens: tokens[..n_chunk * ctx].to_vec(),
    };
    let mut writer = BaseWriter::new(w, &header)?;
    let ppl = perplexity_rows(model, tokens, ctx, bos, kv_type, false, on_chunk, |rows| {
        writer.write_chunk(rows).map_err(KldError::from)
    })?;
    Ok((ppl, writer.finish()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits with a spread of values, some far below the largest.
    fn logits(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x % 4000) as f32 / 100.0 - 30.0
            })
            .collect()
    }

    fn log_softmax(l: &[f32]) -> Vec<f64> {
        let max = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let lse = l.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        l.iter().map(|&v| v as f64 - lse).collect()
    }

    /// Within 16 of the largest log-probability an encoded value is the exact one to half
    /// a step (16 / 65535 / 2 = 1.2e-4); below it, the row's floor.
    #[test]
    fn encoded_rows_hold_the_log_probabilities() {
        let l = logits(1001, 7);
        let mut row = vec![0u16; row_len(l.len())];
        assert_eq!(row.len(), 1006);
        encode_row(&l, &mut row);
        let (scale, min_lp) = row_scale(&row);
        let exact = log_softmax(&l);
        let top = exact.iter().cloned().fold(f64::MIN, f64::max);
        for (i, &e) in exact.iter().enumerate() {
            let got = (scale * row[4 + i] as f32 + min_lp) as f64;
            if e > top - 16.0 {
                assert!((got - e).abs() < 1.3e-4, "{i}: {got} vs {e}");
            } else {
                assert_eq!(row[4 + i], 0);
            }
        }
    }

    /// The same logits give a divergence of (nearly) nothing and the same top token; other
    /// logits give the divergence computed exactly, to the encoding's precision.
    #[test]
    fn divergence_is_zero_for_the_same_logits_and_exact_otherwise() {
        let base = logits(512, 1);
        let other: Vec<f32> = base
            .iter()
            .enumerate()
            .map(|(i, &v)| v + (i as f32).sin())
            .collect();
        let mut row = vec![0u16; row_len(512)];
        encode_row(&base, &mut row);
        // A token the base finds likely (a tail token's log-probability is the row's floor).
        let t = (0..512)
            .max_by(|&a, &b| base[a].total_cmp(&base[b]))
            .unwrap();
        let mut same = KldStats::default();
        same.add(&base, &row, t as u32);
        let r = same.report();
        // The encoding's rounding alone (measured 9e-6).
        assert!(r.kld.abs() < 1e-4 && r.same_top == 1.0, "{r:?}");
        assert!(r.ln_ppl_ratio.abs() < 1e-4, "{r:?}");
        let mut diff = KldStats::default();
        diff.add(&other, &row, t as u32);
        let (p, q) = (log_softmax(&base), log_softmax(&other));
        let top = p.iter().cloned().fold(f64::MIN, f64::max);
        let want: f64 = p
            .iter()
            .zip(&q)
            .filter(|(a, _)| **a > top - 16.0)
            .map(|(a, b)| a.exp() * (a - b))
            .sum();
        let r = diff.report();
        assert!(
            want > 0.1 && (r.kld - want).abs() < 1e-3 * want,
            "{} vs {want}",
            r.kld
        );
        assert!((r.ln_ppl_ratio - (p[t] - q[t])).abs() < 1e-3, "{r:?}");
    }

    fn file(n_ctx: usize, n_vocab: usize, n_chunk: usize, tokens: &[u32]) -> Vec<u8> {
        let h = BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens: tokens.to_vec(),
        };
        let mut out = Vec::new();
        h.write(&mut out).unwrap();
        out.resize(
            BaseHeader::file_bytes(n_ctx, n_vocab, n_chunk).unwrap() as usize,
            0,
        );
        out
    }

    /// A good header reads back; each damaged one is refused naming what is wrong, before
    /// anything its sizes would allocate.
    #[test]
    fn damaged_headers_are_refused() {
        let toks: Vec<u32> = (0..16).collect();
        let good = file(8, 20, 2, &toks);
        let read = |b: &[u8], vocab| BaseHeader::read(&mut &b[..], b.len() as u64, vocab, 0);
        let h = read(&good, 20).unwrap();
        assert_eq!((h.n_ctx, h.n_chunk, h.tokens), (8, 2, toks.clone()));
        let err = |b: &[u8], vocab| read(b, vocab).unwrap_err().to_string();
        assert!(err(&good[..10], 20).contains("shorter than"));
        assert!(err(&good, 21).contains("vocabulary of 20"));
        assert!(err(&good[..good.len() - 1], 20).contains("makes"));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(err(&magic, 20).contains("magic"));
        let mut token = good.clone();
        token[20..24].copy_from_slice(&25u32.to_le_bytes());
        assert!(err(&token, 20).contains("token 25"));
        for (at, v) in [(8, i32::MAX), (8, 2), (12, -1), (16, 0), (16, i32::MAX)] {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&v.to_le_bytes());
            let e = err(&b, 20);
            assert!(
                e.contains("out of range")
                    || e.contains("vocabulary")
                    || e.contains("makes")
                    || e.contains("more than"),
                "{at} {v}: {e}"
            );
        }
    }
}
