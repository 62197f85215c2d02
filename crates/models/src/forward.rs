//! The decoder forward pass, one body for every architecture of the table, parameterised
//! by [`crate::arch::ArchSpec`] and the weights present.
//!
//! Per layer (llama.cpp `src/models/{llama,qwen2,gemma3}.cpp`, names as llama.cpp's graph
//! names the intermediates): `attn_norm` → Q/K/V projections (+ biases) → per-head Q/K norm
//! → RoPE → store K/V in the cache → attention over the cache (causal, sliding window where
//! the layer has one) → output projection (→ post-attention norm) → residual; `ffn_norm`
//! → gate/up → activation(gate)·up → down (→ post-FFN norm) → residual. Then the output
//! norm and the LM head on the rows whose logits are wanted.

use crate::arch::{Activation, RopeLayout};
use crate::error::{ModelError, Result};
use crate::kernels::{
    add_bias, axpy, dot, gelu_tanh, matmul, matmul_many, matrix_row, rms_norm, rope, silu, softmax,
    Matrix, Projection,
};
use crate::kv::{KvCache, KvLayer};
use crate::model::Model;
use crate::pool::Disjoint;

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
    /// Matrix `w` of this model with its stored bytes, writing into `out`.
    fn projection<'a>(&'a self, w: &'a Matrix, out: &'a mut [f32]) -> Projection<'a> {
        Projection {
            w,
            data: self.data(w),
            out,
        }
    }

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
            matmul_many(
                &mut [
                    self.projection(&lw.wq, &mut q),
                    self.projection(&lw.wk, &mut k),
                    self.projection(&lw.wv, &mut v),
                ],
                &cur,
                n,
            )?;
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
            matmul_many(
                &mut [
                    self.projection(&lw.w_gate, &mut gate),
                    self.projection(&lw.w_up, &mut up),
                ],
                &cur,
                n,
            )?;
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

/// Query rows per attention task: each cached key and value row is widened to f32 once
/// per block of this many query rows (prefill), instead of once per row.
const ATTN_ROWS_PER_TASK: usize = 16;

/// Attention of the query rows at positions `p0..p0+n` over the cached keys and values of
/// one layer, writing `n × (n_head · head_dim_v)` values to `out`.
///
/// Query head `h` reads KV head `h / (n_head / n_head_kv)` (GQA). Row at position `p` sees
/// keys `0..=p` (causal), and with a `window` > 0 only keys `t` with `p - t < window`
/// (llama.cpp `LLAMA_SWA_TYPE_STANDARD`). Scores are scaled by `attn_scale`, softmaxed,
/// and the values summed in position order.
///
/// Work is split over (head, block of [`ATTN_ROWS_PER_TASK`] query rows); a task reads each
/// key and value row it needs once, widened exactly from the cache's type, and applies it
/// to every row of its block. Each output element is the same sequence of operations
/// whatever the block, the chunk or the thread: scores in key order, one softmax, values
/// accumulated in key order.
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
    let n = q.len() / c.q_dim();
    let row_out = c.n_head * hd_v;
    let n_blocks = n.div_ceil(ATTN_ROWS_PER_TASK);
    // Keys visible from position `pos`.
    let first_key = |pos: usize| {
        if window > 0 {
            (pos + 1).saturating_sub(window)
        } else {
            0
        }
    };
    let outs = Disjoint::new(out);
    crate::pool::run(c.n_head * n_blocks, &|task| {
        let (h, blk) = (task % c.n_head, task / c.n_head);
        let i0 = blk * ATTN_ROWS_PER_TASK;
        let i1 = (i0 + ATTN_ROWS_PER_TASK).min(n);
        let g = h / group;
        ATTN_SCRATCH.with_borrow_mut(|s| {
            let AttnScratch { scores, kv } = s;
            let (t0, t1) = (first_key(p0 + i0), p0 + i1); // keys t0..t1 are read
            let span = t1 - t0;
            scores.clear();
            scores.resize((i1 - i0) * span, 0.0);
            kv.resize(hd_k.max(hd_v), 0.0);
            // Scores: row i's keys first_key(p0+i)..=p0+i sit at the start of its span.
            for t in t0..t1 {
                let kt = &mut kv[..hd_k];
                layer.k.read(t * c.k_dim() + g * hd_k, kt);
                for i in i0..i1 {
                    let pos = p0 + i;
                    let f = first_key(pos);
                    if t < f || t > pos {
                        continue;
                    }
                    let qh = &q[i * c.q_dim() + h * hd_k..][..hd_k];
                    scores[(i - i0) * span + (t - f)] = dot(qh, kt) * c.attn_scale;
                }
            }
            for i in i0..i1 {
                let pos = p0 + i;
                let len = pos + 1 - first_key(pos);
                softmax(&mut scores[(i - i0) * span..][..len]);
                // SAFETY: task (h, blk) alone writes head h of rows i0..i1.
                #[allow(unsafe_code)]
                let o = unsafe { outs.range(i * row_out + h * hd_v, hd_v) };
                o.fill(0.0);
            }
            for t in t0..t1 {
                let vt = &mut kv[..hd_v];
                layer.v.read(t * c.v_dim() + g * hd_v, vt);
                for i in i0..i1 {
                    let pos = p0 + i;
                    let f = first_key(pos);
                    if t < f || t > pos {
                        continue;
                    }
                    let p = scores[(i - i0) * span + (t - f)];
                    // SAFETY: as above (the earlier reference to this range is dead).
                    #[allow(unsafe_code)]
                    let o = unsafe { outs.range(i * row_out + h * hd_v, hd_v) };
                    axpy(o, p, vt);
                }
            }
        });
    });
}

/// Per-thread scratch of an attention task.
#[derive(Default)]
struct AttnScratch {
    /// Scores of the block's rows, `span` per row.
    scores: Vec<f32>,
    /// One key or value row widened to f32.
    kv: Vec<f32>,
}

thread_local! {
    static ATTN_SCRATCH: std::cell::RefCell<AttnScratch> =
        std::cell::RefCell::new(AttnScratch::default());
}
