//! The decoder forward pass, one body for every architecture of the table, parameterised
//! by [`crate::arch::ArchSpec`] and the weights present.
//!
//! Per layer (llama.cpp `src/models/{llama,qwen2,gemma3}.cpp`, names as llama.cpp's graph
//! names the intermediates): `attn_norm` → Q/K/V projections (+ biases) → per-head Q/K norm
//! → RoPE → store K/V in the cache → attention over the cache (causal, sliding window where
//! the layer has one) → output projection (→ post-attention norm) → residual; `ffn_norm`
//! → gate/up → activation(gate)·up → down (→ post-FFN norm) → residual. Then the output
//! norm and the LM head on the rows whose logits are wanted.

use rayon::prelude::*;

use crate::arch::{Activation, RopeLayout};
use crate::error::{ModelError, Result};
use crate::kernels::{add_bias, dot, gelu_tanh, matmul, matrix_row, rms_norm, rope, silu, softmax};
use crate::kv::{KvCache, KvLayer};
use crate::model::Model;

/// Which rows' logits [`Model::forward`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (prefill of a prompt whose continuation is not needed yet).
    None,
    /// The last row only: `n_vocab` values.
    Last,
    /// Every row: `n_tokens × n_vocab` values, row `i` = logits after `tokens[0..=i]`.
    All,
    /// Rows `i..n_tokens` of this call (perplexity scores the second half of a chunk).
    From(usize),
}

impl Model {
    /// Checks that `tokens` fit after what `cache` holds and are all in the vocabulary: the
    /// one predicate behind every evaluation, run before anything is written.
    ///
    /// Errors: [`ModelError::ContextFull`], [`ModelError::TokenOutOfRange`].
    pub fn check_input(&self, cache: &KvCache, tokens: &[u32]) -> Result<()> {
        let needed = cache.n_past + tokens.len();
        if needed > cache.n_ctx {
            return Err(ModelError::ContextFull {
                needed,
                n_ctx: cache.n_ctx,
            });
        }
        let n_vocab = self.config.n_vocab;
        match tokens.iter().find(|&&t| t as usize >= n_vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// Evaluates `tokens` at positions `cache.n_past ..`, appends their keys and values to
    /// `cache`, and returns the requested logits (row-major `[rows][n_vocab]`).
    ///
    /// All rows are processed together: each projection is one matrix product over the
    /// chunk. A row's result depends only on its token, its position and the cache, never
    /// on the other rows of the call.
    ///
    /// Errors: [`ModelError::ContextFull`] if the tokens would pass the cache's size,
    /// [`ModelError::TokenOutOfRange`] for an id outside the vocabulary; both are checked
    /// before anything is written to the cache.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        self.check_input(cache, tokens)?;
        let c = &self.config;
        let w = &self.weights;
        let n = tokens.len();
        let p0 = cache.n_past;
        if n == 0 {
            return Ok(Vec::new());
        }
        let d = c.n_embd;

        // inp_embd (× sqrt(n_embd) for gemma).
        let mut x = vec![0f32; n * d];
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            matrix_row(&w.token_embd, self.data(&w.token_embd), t as usize, row)?;
            if c.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.embed_scale);
            }
        }

        let mut cur = vec![0f32; n * d];
        let mut q = vec![0f32; n * c.q_dim()];
        let mut k = vec![0f32; n * c.k_dim()];
        let mut v = vec![0f32; n * c.v_dim()];
        let mut attn = vec![0f32; n * c.n_head * c.head_dim_v];
        let mut gate = vec![0f32; n * c.n_ff];
        let mut up = vec![0f32; n * c.n_ff];
        let neox = c.arch.rope == RopeLayout::Neox;

        for (il, lw) in w.layers.iter().enumerate() {
            // attn_norm
            cur.copy_from_slice(&x);
            rms_norm(&mut cur, &lw.attn_norm, c.rms_eps);
            // Qcur, Kcur, Vcur
            matmul(&lw.wq, self.data(&lw.wq), &cur, n, &mut q)?;
            matmul(&lw.wk, self.data(&lw.wk), &cur, n, &mut k)?;
            matmul(&lw.wv, self.data(&lw.wv), &cur, n, &mut v)?;
            for (t, b) in [(&mut q, &lw.bq), (&mut k, &lw.bk), (&mut v, &lw.bv)] {
                if let Some(b) = b {
                    add_bias(t, b);
                }
            }
            // Per-head Q/K norm: rows of head_dim_k values.
            if let Some(qn) = &lw.q_norm {
                rms_norm(&mut q, qn, c.rms_eps);
            }
            if let Some(kn) = &lw.k_norm {
                rms_norm(&mut k, kn, c.rms_eps);
            }
            let rp = c.rope(il);
            for i in 0..n {
                let pos = p0 + i;
                for head in q[i * c.q_dim()..(i + 1) * c.q_dim()].chunks_exact_mut(c.head_dim_k) {
                    rope(head, pos, c.n_rot, rp.freq_base, rp.freq_scale, neox);
                }
                for head in k[i * c.k_dim()..(i + 1) * c.k_dim()].chunks_exact_mut(c.head_dim_k) {
                    rope(head, pos, c.n_rot, rp.freq_base, rp.freq_scale, neox);
                }
            }
            let layer = &mut cache.layers[il];
            layer.k.write(p0 * c.k_dim(), &k);
            layer.v.write(p0 * c.v_dim(), &v);
            let window = if c.swa_layers[il] { c.n_swa } else { 0 };
            attention(c, layer, &q, p0, window, &mut attn);
            matmul(&lw.wo, self.data(&lw.wo), &attn, n, &mut cur)?;
            if let Some(pn) = &lw.post_attn_norm {
                rms_norm(&mut cur, pn, c.rms_eps);
            }
            // ffn_inp = residual + attention
            x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);

            cur.copy_from_slice(&x);
            rms_norm(&mut cur, &lw.ffn_norm, c.rms_eps);
            matmul(&lw.w_gate, self.data(&lw.w_gate), &cur, n, &mut gate)?;
            matmul(&lw.w_up, self.data(&lw.w_up), &cur, n, &mut up)?;
            match c.arch.activation {
                Activation::Silu => gate
                    .iter_mut()
                    .zip(&up)
                    .for_each(|(g, u)| *g = silu(*g) * u),
                Activation::GeluTanh => gate
                    .iter_mut()
                    .zip(&up)
                    .for_each(|(g, u)| *g = gelu_tanh(*g) * u),
            }
            matmul(&lw.w_down, self.data(&lw.w_down), &gate, n, &mut cur)?;
            if let Some(pn) = &lw.post_ffn_norm {
                rms_norm(&mut cur, pn, c.rms_eps);
            }
            // l_out
            x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);
        }
        cache.n_past = p0 + n;

        let rows: &mut [f32] = match logits {
            Logits::None => return Ok(Vec::new()),
            Logits::Last => &mut x[(n - 1) * d..],
            Logits::All => &mut x[..],
            Logits::From(i) => &mut x[i.min(n) * d..],
        };
        let n_rows = rows.len() / d;
        if n_rows == 0 {
            return Ok(Vec::new());
        }
        rms_norm(rows, &w.output_norm, c.rms_eps);
        let mut out = vec![0f32; n_rows * c.n_vocab];
        matmul(&w.output, self.data(&w.output), rows, n_rows, &mut out)?;
        Ok(out)
    }
}

/// Attention of the query rows at positions `p0..p0+n` over the cached keys and values of
/// one layer, writing `n × (n_head · head_dim_v)` values to `out`.
///
/// Query head `h` reads KV head `h / (n_head / n_head_kv)` (GQA). Row at position `p` sees
/// keys `0..=p` (causal), and with a `window` > 0 only keys `t` with `p - t < window`
/// (llama.cpp `LLAMA_SWA_TYPE_STANDARD`). Scores are scaled by `attn_scale`, softmaxed,
/// and the values summed in position order. Work is split over (row, head) pairs.
fn attention(
    c: &crate::config::ModelConfig,
    layer: &KvLayer,
    q: &[f32],
    p0: usize,
    window: usize,
    out: &mut [f32],
) {
    let (hd_k, hd_v) = (c.head_dim_k, c.head_dim_v);
    let group = c.n_head / c.n_head_kv;
    // The cached keys and values of positions 0..p0+n as f32, read once per layer rather
    // than once per (row, head): the conversion is exact, so this changes no result.
    let n_pos = p0 + q.len() / c.q_dim();
    let mut keys = vec![0f32; n_pos * c.k_dim()];
    let mut values = vec![0f32; n_pos * c.v_dim()];
    layer.k.read(0, &mut keys);
    layer.v.read(0, &mut values);
    out.par_chunks_mut(hd_v)
        .enumerate()
        .for_each_init(Vec::<f32>::new, |scores, (idx, o)| {
            let (i, h) = (idx / c.n_head, idx % c.n_head);
            let pos = p0 + i;
            let g = h / group;
            let qh = &q[i * c.q_dim() + h * hd_k..][..hd_k];
            let start = if window > 0 {
                (pos + 1).saturating_sub(window)
            } else {
                0
            };
            scores.clear();
            for t in start..=pos {
                let kt = &keys[t * c.k_dim() + g * hd_k..][..hd_k];
                scores.push(dot(qh, kt) * c.attn_scale);
            }
            softmax(scores);
            o.fill(0.0);
            for (t, &p) in (start..=pos).zip(scores.iter()) {
                let vt = &values[t * c.v_dim() + g * hd_v..][..hd_v];
                for (a, b) in o.iter_mut().zip(vt) {
                    *a += p * b;
                }
            }
        });
}
