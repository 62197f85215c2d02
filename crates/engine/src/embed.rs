//! Embeddings: a sequence's hidden states (the output norm's rows, [`Logits::Hidden`])
//! pooled into one vector and normalised, as llama.cpp's embedding path does
//! (`llama_context` pooling in src/llama-graph.cpp `build_pooling`; `common_embd_normalize`
//! in common/common.cpp).

use frink_models::{EncoderInput, KvType, Logits, Model, ModelError, Pooling};

use crate::Session;

/// Why an embedding cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The pooling gives no single vector (`none`: one per token) or is not an
    /// embedding (`rank`: a reranker's score).
    #[error("pooling `{}` does not give one embedding per input (use mean, cls or last)", .0.name())]
    Pooling(Pooling),
    /// An input without tokens.
    #[error("an empty input has no embedding")]
    Empty,
    /// The evaluation failed (context, token range).
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Pools the hidden states of one sequence as they arrive, chunk by chunk (a prompt
/// prefilled in pieces pools as one). Means are accumulated in f64.
#[derive(Clone, Debug)]
pub struct Pooler {
    pooling: Pooling,
    n_embd: usize,
    sum: Vec<f64>,
    first: Vec<f32>,
    last: Vec<f32>,
    n: usize,
}

impl Pooler {
    /// A pooler of `n_embd`-wide rows.
    ///
    /// Errors: [`EmbedError::Pooling`] for `none` and `rank`.
    pub fn new(pooling: Pooling, n_embd: usize) -> Result<Pooler, EmbedError> {
        match pooling {
            Pooling::Mean | Pooling::Cls | Pooling::Last => Ok(Pooler {
                pooling,
                n_embd,
                sum: vec![0.0; n_embd],
                first: Vec::new(),
                last: Vec::new(),
                n: 0,
            }),
            other => Err(EmbedError::Pooling(other)),
        }
    }

    /// Adds rows (`k × n_embd` values, the next `k` tokens' hidden states).
    pub fn push(&mut self, rows: &[f32]) {
        for row in rows.chunks_exact(self.n_embd) {
            if self.n == 0 {
                self.first = row.to_vec();
            }
            self.sum
                .iter_mut()
                .zip(row)
                .for_each(|(s, &v)| *s += v as f64);
            self.n += 1;
        }
        if let Some(row) = rows.chunks_exact(self.n_embd).last() {
            self.last = row.to_vec();
        }
    }

    /// The pooled vector (not normalised).
    ///
    /// Errors: [`EmbedError::Empty`] if no row arrived.
    pub fn finish(self) -> Result<Vec<f32>, EmbedError> {
        if self.n == 0 {
            return Err(EmbedError::Empty);
        }
        Ok(match self.pooling {
            Pooling::Cls => self.first,
            Pooling::Last => self.last,
            _ => self
                .sum
                .iter()
                .map(|&s| (s / self.n as f64) as f32)
                .collect(),
        })
    }
}

/// Normalises `v` in place as llama.cpp's `common_embd_normalize(…, embd_norm)`: `-1` none,
/// `0` max-absolute scaled to int16 range, `1` taxicab, `2` Euclidean (llama-server's and
/// `llama-embedding`'s default), `p > 2` the p-norm. A zero vector stays zero.
pub fn normalize(v: &mut [f32], embd_norm: i32) {
    let norm: f64 = match embd_norm {
        n if n < 0 => return,
        0 => v.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)) / 32760.0,
        1 => v.iter().map(|&x| x.abs() as f64).sum(),
        2 => v
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum::<f64>()
            .sqrt(),
        p => v
            .iter()
            .map(|&x| (x.abs() as f64).powi(p))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    v.iter_mut().for_each(|x| *x = (*x as f64 * scale) as f32);
}

/// The pooling an embedding uses: the one asked for (`--pooling`), else the file's
/// `{arch}.pooling_type`, else mean (a generative model's file names none; llama.cpp would
/// give per-token vectors, which no embedding endpoint returns).
pub fn pooling(requested: Option<Pooling>, file: Option<Pooling>) -> Pooling {
    requested.or(file).unwrap_or(Pooling::Mean)
}

/// What one input of an encoder pass gives: its rows pooled as `pooling` says (mean, the
/// first row for `cls`, the last for `last`), or for `rank` the classifier head's scores
/// on its first row (a reranker's relevance is the first value; llama.cpp
/// `build_pooling`, `LLAMA_POOLING_TYPE_RANK` of a non-causal model). `rows` are the
/// input's hidden states (`n × n_embd`).
///
/// Errors: [`EmbedError::Pooling`] for `none`; [`EmbedError::Empty`] without rows;
/// [`EmbedError::Model`] for `rank` on a model without a classifier head.
pub fn pool_rows(model: &Model, rows: &[f32], pooling: Pooling) -> Result<Vec<f32>, EmbedError> {
    let d = model.config.n_embd;
    if rows.len() < d {
        return Err(EmbedError::Empty);
    }
    if pooling == Pooling::Rank {
        return Ok(model.classify(&rows[..d], 1)?);
    }
    let mut p = Pooler::new(pooling, d)?;
    p.push(rows);
    p.finish()
}

/// Whether `model`'s embeddings may be shortened to their first values (Matryoshka
/// representation learning; OpenAI's and Ollama's `dimensions`): the models trained for
/// it, by `general.name` (no GGUF key says so): nomic-embed-text v1.5.
pub fn matryoshka(model: &Model) -> bool {
    const TRAINED: &[&str] = &["nomic-embed-text-v1.5"];
    let name = model
        .file
        .get("general.name")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    TRAINED.iter().any(|t| name.contains(t))
}

/// The most tokens one encoder pass evaluates by default (several inputs together; an
/// input longer than this goes alone): llama.cpp's default `n_batch` for embeddings.
pub const ENCODER_BATCH: usize = 2048;

/// [`pool_rows`] of many whole inputs (tokens and token types, empty for all 0),
/// evaluated in passes of at most `batch` tokens each ([`Model::encode_batch`]; an input
/// longer than `batch` is a pass of its own), in order. A vector does not depend on how
/// the inputs are grouped. `kv_type` holds each pass's keys and values.
///
/// Errors: [`EmbedError`]; the first input that fails fails the call.
pub fn encode_all(
    model: &Model,
    inputs: &[(Vec<u32>, Vec<u32>)],
    pooling: Pooling,
    batch: usize,
    kv_type: KvType,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    if pooling == Pooling::None {
        return Err(EmbedError::Pooling(pooling));
    }
    let mut out = Vec::with_capacity(inputs.len());
    let mut start = 0;
    while start < inputs.len() {
        let mut end = start + 1;
        let mut tokens = inputs[start].0.len();
        while end < inputs.len() && tokens + inputs[end].0.len() <= batch {
            tokens += inputs[end].0.len();
            end += 1;
        }
        let pass: Vec<EncoderInput> = inputs[start..end]
            .iter()
            .map(|(t, ty)| EncoderInput {
                tokens: t,
                token_types: ty,
            })
            .collect();
        if pass.iter().any(|i| i.tokens.is_empty()) {
            return Err(EmbedError::Empty);
        }
        for rows in model.encode_batch(&pass, kv_type)? {
            out.push(pool_rows(model, &rows, pooling)?);
        }
        start = end;
    }
    Ok(out)
}

impl Session<'_> {
    /// The embedding of `tokens` (evaluated after what the cache holds, which the caller
    /// normally leaves empty), pooled with `pooling`, not normalised.
    ///
    /// Errors: [`EmbedError`].
    pub fn embed(&mut self, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>, EmbedError> {
        let mut p = Pooler::new(pooling, self.model().config.n_embd)?;
        p.push(&self.eval(tokens, Logits::Hidden)?);
        p.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean, first and last rows; a prompt pooled in two chunks pools as in one.
    #[test]
    fn pooling_and_normalisation() {
        let rows = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let pool = |p, chunks: &[&[f32]]| {
            let mut q = Pooler::new(p, 2).unwrap();
            chunks.iter().for_each(|c| q.push(c));
            q.finish().unwrap()
        };
        assert_eq!(pool(Pooling::Mean, &[&rows]), [3.0, 4.0]);
        assert_eq!(pool(Pooling::Mean, &[&rows[..2], &rows[2..]]), [3.0, 4.0]);
        assert_eq!(pool(Pooling::Cls, &[&rows[..2], &rows[2..]]), [1.0, 2.0]);
        assert_eq!(pool(Pooling::Last, &[&rows[..4], &rows[4..]]), [5.0, 6.0]);
        assert!(Pooler::new(Pooling::None, 2).is_err());
        assert!(matches!(
            Pooler::new(Pooling::Mean, 2).unwrap().finish(),
            Err(EmbedError::Empty)
        ));
        let mut v = [3.0f32, 4.0];
        normalize(&mut v, 2);
        assert_eq!(v, [0.6, 0.8]);
        let mut v = [3.0f32, -1.0];
        normalize(&mut v, 1);
        assert_eq!(v, [0.75, -0.25]);
        let mut v = [3.0f32, 4.0];
        normalize(&mut v, -1);
        assert_eq!(v, [3.0, 4.0]);
    }
}
