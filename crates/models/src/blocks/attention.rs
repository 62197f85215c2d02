//! Softmax attention, the token mixer of most layers (llama.cpp `build_attn` and the
//! Q/K/V part of `src/models/{llama,qwen2,gemma3,...}.cpp`; transformers
//! `LlamaAttention.forward` and its siblings): `attn_q/k/v` (or fused `attn_qkv`, or MLA)
//! with their biases → Q/K norm → RoPE → keys and values into the sequence's KV cache →
//! attention over the cache (causal, windowed, soft-capped, ALiBi, sinks as the plan says)
//! → `attn_output` (+ bias).

use crate::arch::{Position, QkNorm, RopeLayout};
use crate::blocks::mla::MlaWeights;
use crate::blocks::{rows_per_task, Rows};
use crate::config::{ModelConfig, RopeParams};
use crate::error::Result;
use crate::kernels::{
    add_bias, dot_multi_keys, hadamard_rotate, matmul, matmul_many, rms_norm, rope_angles,
    rope_rotate, softmax_with_sink, weighted_sum_multi, Matrix,
};
use crate::kv::{KvLayer, KvPool};
use crate::load::Loader;
use crate::lora::LoraRows;
use crate::model::Model;
use crate::plan::{AttentionPlan, QkvLayout};
use crate::pool::{self, Disjoint};
use crate::rope::mrope_angles;
use crate::Sequence;

/// The Q, K and V projections: separate matrices, or one fused `attn_qkv` whose rows are
/// Q, then K, then V (the converters reorder falcon's and bloom's interleaved layouts).
#[derive(Clone, Debug)]
pub enum QkvWeights {
    Separate {
        wq: Matrix,
        wk: Matrix,
        wv: Matrix,
    },
    Fused(Matrix),
    /// Multi-head latent attention ([`crate::config::MlaConfig`]).
    Mla(Box<MlaWeights>),
    /// `attn_q` alone: a layer that attends over another layer's keys and values
    /// ([`crate::plan::AttnGeometry::kv_source`]).
    QueryOnly(Matrix),
}

/// One attention layer's widths: the model's head counts, the layer's head sizes
/// ([`crate::plan::AttnGeometry`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub hd_k: usize,
    pub hd_v: usize,
}

impl Dims {
    pub fn of(c: &ModelConfig, ap: &AttentionPlan) -> Dims {
        Dims {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            hd_k: ap.geometry.head_dim_k,
            hd_v: ap.geometry.head_dim_v,
        }
    }
    /// Queries per row: `n_head · hd_k`.
    pub fn q(&self) -> usize {
        self.n_head * self.hd_k
    }
    /// Keys per row: `n_head_kv · hd_k`.
    pub fn k(&self) -> usize {
        self.n_head_kv * self.hd_k
    }
    /// Values per row: `n_head_kv · hd_v`.
    pub fn v(&self) -> usize {
        self.n_head_kv * self.hd_v
    }
    /// Attention output per row: `n_head · hd_v`.
    pub fn attn(&self) -> usize {
        self.n_head * self.hd_v
    }
    /// The output projection's input width: [`Dims::attn`], or MLA's value width.
    pub fn out(&self, c: &ModelConfig) -> usize {
        match &c.mla {
            Some(_) => c.attn_out_dim(),
            None => self.attn(),
        }
    }
}

/// An attention layer's weights, named as llama.cpp names the tensors (`blk.N.<name>`).
/// Optional parts are present exactly when the file has them (and the plan allows them).
#[derive(Clone, Debug)]
pub struct AttentionWeights {
    pub qkv: QkvWeights,
    /// Biases of separate projections, or of the fused one (`bqkv`).
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bqkv: Option<Vec<f32>>,
    pub wo: Matrix,
    pub bo: Option<Vec<f32>>,
    /// `attn_sinks`: one learned logit per query head that joins each softmax (gpt-oss).
    pub attn_sinks: Option<Vec<f32>>,
    /// RMSNorm weights of Q and K (`head_dim_k` each, or the whole projection width).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}

impl AttentionWeights {
    /// Loads layer `il`'s attention as `ap` plans it.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        il: usize,
        c: &ModelConfig,
        ap: &AttentionPlan,
    ) -> Result<AttentionWeights> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let g = Dims::of(c, ap);
        let qkv_rows = g.q() + g.k() + g.v();
        let q_rows = if ap.output_gate { 2 * g.q() } else { g.q() };
        let shares = ap.geometry.kv_source.is_some();
        if shares && (ap.qkv != QkvLayout::Separate || ap.output_gate) {
            return Err(crate::ModelError::Unsupported(format!(
                "layer {il}: shared keys and values with fused, latent or gated Q/K/V"
            )));
        }
        let (qkv, bqkv) = match ap.qkv {
            // A KV-sharing layer projects its queries only.
            QkvLayout::Separate if shares => (
                QkvWeights::QueryOnly(l.matrix(&n("attn_q.weight"), q_rows, c.n_embd)?),
                None,
            ),
            QkvLayout::Latent => {
                let mla = c.mla.as_ref().expect("a latent plan has an MLA config");
                (
                    QkvWeights::Mla(Box::new(MlaWeights::load(l, il, c, mla)?)),
                    None,
                )
            }
            QkvLayout::Fused => (
                QkvWeights::Fused(l.matrix(&n("attn_qkv.weight"), qkv_rows, c.n_embd)?),
                l.vector_opt(&n("attn_qkv.bias"), qkv_rows)?,
            ),
            // Keys that are also the values (Gemma 4 31B's `attention_k_eq_v`: llama.cpp
            // takes V = K where attn_v is absent) have no fixture here: refused by name.
            QkvLayout::Separate if l.has(&n("attn_k.weight")) && !l.has(&n("attn_v.weight")) => {
                return Err(crate::ModelError::Unsupported(format!(
                    "layer {il}: keys used as values (blk.{il}.attn_k.weight without blk.{il}.attn_v.weight: Gemma 4's attention_k_eq_v)"
                )))
            }
            QkvLayout::Separate => (
                QkvWeights::Separate {
                    // With an output gate each head's query is followed by its gate.
                    wq: l.matrix(&n("attn_q.weight"), q_rows, c.n_embd)?,
                    wk: l.matrix(&n("attn_k.weight"), g.k(), c.n_embd)?,
                    wv: l.matrix(&n("attn_v.weight"), g.v(), c.n_embd)?,
                },
                None,
            ),
        };
        let separate = ap.qkv == QkvLayout::Separate;
        if ap.output_gate && !separate {
            return Err(crate::ModelError::Unsupported(format!(
                "layer {il}: an attention output gate with fused or latent Q/K/V"
            )));
        }
        let mut bias = |name: &str, len: usize| {
            if separate {
                l.vector_opt(&n(name), len)
            } else {
                Ok(None)
            }
        };
        // A gated Q projection has no bias frink would add: a file with one is refused
        // as unused rather than read and ignored.
        let (bq, bk, bv) = (
            if ap.output_gate {
                None
            } else {
                bias("attn_q.bias", g.q())?
            },
            // A sharing layer computes no keys or values: biases of them are refused.
            if shares {
                None
            } else {
                bias("attn_k.bias", g.k())?
            },
            if shares {
                None
            } else {
                bias("attn_v.bias", g.v())?
            },
        );
        let (q_norm_len, k_norm_len) = match ap.qk_norm {
            QkNorm::Whole => (g.q(), g.k()),
            _ => (g.hd_k, g.hd_k),
        };
        // Weighted norms only: Llama 4's L2 norm has no weight.
        let qk_norm = matches!(ap.qk_norm, QkNorm::PerHead | QkNorm::Whole);
        Ok(AttentionWeights {
            qkv,
            bq,
            bk,
            bv,
            bqkv,
            wo: l.matrix(&n("attn_output.weight"), c.n_embd, g.out(c))?,
            bo: l.vector_opt(&n("attn_output.bias"), c.n_embd)?,
            attn_sinks: l.vector_if(ap.sinks, &n("attn_sinks.weight"), c.n_head)?,
            q_norm: l.vector_if(qk_norm, &n("attn_q_norm.weight"), q_norm_len)?,
            k_norm: l.vector_if(qk_norm && !shares, &n("attn_k_norm.weight"), k_norm_len)?,
        })
    }

    /// The matrices it multiplies.
    pub(crate) fn matrices(&self) -> Vec<&Matrix> {
        let mut m: Vec<&Matrix> = match &self.qkv {
            QkvWeights::Separate { wq, wk, wv } => vec![wq, wk, wv],
            QkvWeights::QueryOnly(w) | QkvWeights::Fused(w) => vec![w],
            QkvWeights::Mla(a) => a.matrices().collect(),
        };
        m.push(&self.wo);
        m
    }
}

/// What a table of RoPE rotations depends on: the parameters, the rotated width and
/// whether `rope_freqs` applies.
type RopeKey = (RopeParams, usize, bool);

/// Buffers of the attention layers of one forward call, reused from layer to layer.
#[derive(Default)]
pub(crate) struct AttnScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    attn_out: Vec<f32>,
    /// The output gate's logits (`n × n_head · head_dim`), for a gated layer.
    gate: Vec<f32>,
    /// One table of rotations per position and parameter set, shared by every head and
    /// every layer with the same parameters.
    rope_tables: Vec<(RopeKey, Vec<(f32, f32)>)>,
}

impl Model {
    /// Attention layer `il` on `input` (`n × n_embd`, the batch's rows), appending each
    /// sequence's keys and values to its cache; the output projection into `out`
    /// (`n × n_embd`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_block(
        &self,
        il: usize,
        ap: &AttentionPlan,
        lw: &AttentionWeights,
        seqs: &mut [Sequence<'_>],
        rows: &Rows<'_>,
        input: &[f32],
        s: &mut AttnScratch,
        out: &mut [f32],
        lora: &LoraRows,
        mut pool: Option<&mut KvPool>,
    ) -> Result<()> {
        let c = &self.config;
        let n = rows.n();
        let (starts, pos) = (rows.starts, rows.pos);
        let cur = input;
        let AttnScratch {
            q,
            k,
            v,
            qkv,
            attn,
            attn_out,
            gate,
            rope_tables,
        } = s;
        let g = Dims::of(c, ap);
        let shares = ap.geometry.kv_source.is_some();
        q.resize(n * g.q(), 0.0);
        k.resize(n * g.k(), 0.0);
        v.resize(n * g.v(), 0.0);
        attn.resize(n * g.attn(), 0.0);
        // Qcur, Kcur, Vcur (Qcur alone where the layer shares another's keys and values)
        self.qkv_rows(ap, lw, g, cur, n, lora, (q, k, v), (qkv, gate))?;
        // Q/K norm: rows of head_dim_k values, or of the whole projection.
        if let Some(qn) = &lw.q_norm {
            rms_norm(q, qn, c.norm_eps);
        }
        // (A sharing layer has no K norm.)
        if let Some(kn) = &lw.k_norm {
            rms_norm(k, kn, c.norm_eps);
        }
        // Gemma 4's V-norm: each value head to unit RMS (no weight: `x · 1` is `x`).
        if ap.v_norm && !shares {
            rms_norm(v, &vec![1f32; g.hd_v], c.norm_eps);
        }
        // Keys to rotate and norm: none where they are another layer's.
        let k_new: &mut [f32] = if shares { &mut [] } else { k.as_mut_slice() };
        if let Position::Rope(layout) = ap.position {
            self.rope_rows(ap, g, layout, rows, (q, k_new), rope_tables);
        }
        // Llama 4's L2 norm of each head, after RoPE (no weight: `x · 1` is `x`).
        if ap.qk_norm == QkNorm::L2 {
            let ones = vec![1f32; g.hd_k];
            rms_norm(q, &ones, c.norm_eps);
            rms_norm(k_new, &ones, c.norm_eps);
        }
        // NoPE layers' query temperature, by each row's position.
        if let Some(t) = ap.temperature {
            for (row, &p) in q.chunks_exact_mut(g.q()).zip(pos) {
                let f = t.factor(p);
                if f != 1.0 {
                    row.iter_mut().for_each(|v| *v *= f);
                }
            }
        }
        rotate_for_cache(seqs, starts, g, shares, (q, k, v));
        let dims = (g.k(), g.v());
        // A windowed layer's rows go through the sequence's window table where it has one
        // (a pool's window group, a ring of its own).
        let windowed = ap.window > 0;
        // The keys and values this layer writes (none where it shares) and reads: its own
        // cache, or its source layer's (of the same kind, windowed or not).
        let src = ap.geometry.kv_source.unwrap_or(il);
        if !shares {
            write_kv(
                il,
                windowed,
                seqs,
                starts,
                (k, v),
                dims,
                pool.as_deref_mut(),
            );
        }
        let pool = pool.as_deref();
        let bidi = two_way_ranges(seqs, c.n_embd, c.plan.encoder);
        let parts: Vec<AttnSeq<'_>> = seqs
            .iter()
            .enumerate()
            .map(|(si, s)| AttnSeq {
                layer: match pool.filter(|_| s.state.is_pooled()) {
                    Some(p) => p.layer(src),
                    None => s.state.kv(src),
                },
                blocks: s.state.table(match pool.filter(|_| s.state.is_pooled()) {
                    Some(p) => p.in_window_group(src),
                    None => windowed,
                }),
                p0: s.state.n_past,
                r0: starts[si],
                n: starts[si + 1] - starts[si],
                bidi: &bidi[si],
                ahead: match (c.plan.encoder, ap.window) {
                    (true, w) if w > 0 => w / 2,
                    _ => usize::MAX,
                },
            })
            .collect();
        attention(
            c,
            g,
            &parts,
            q,
            Visible {
                window: ap.window,
                chunk: ap.chunk,
                symmetric: c.plan.encoder,
            },
            ap.softcap,
            lw.attn_sinks.as_deref(),
            attn,
        );
        // The output is a sum of rotated values: rotated back (the block is its own
        // inverse).
        let row_out = g.attn();
        for (si, s) in seqs.iter().enumerate() {
            if let Some(b) = s.state.kv_type.value_rotation(g.hd_v) {
                hadamard_rotate(&mut attn[starts[si] * row_out..starts[si + 1] * row_out], b);
            }
        }
        if ap.output_gate {
            attn.iter_mut()
                .zip(gate.iter())
                .for_each(|(a, &g)| *a *= 1.0 / (1.0 + (-g).exp()));
        }
        if let QkvWeights::Mla(mla) = &lw.qkv {
            self.mla_output(mla, attn, n, attn_out)?;
            matmul(&lw.wo, self.weight(&lw.wo), attn_out, n, out)?;
            self.lora_add(&lw.wo, attn_out, lora, out)?;
        } else {
            matmul(&lw.wo, self.weight(&lw.wo), attn, n, out)?;
            self.lora_add(&lw.wo, attn, lora, out)?;
        }
        if let Some(b) = &lw.bo {
            add_bias(out, b);
        }
        Ok(())
    }

    /// Layer `ap`'s Q, K and V rows (`n` each; `q`, `k`, `v` resized by the caller) from
    /// `cur`: separate, fused or latent projections with their adapters and biases, a
    /// query-only layer's queries, or Qwen3-Next's per-head query and output gate
    /// (`scratch`: the fused rows and the gate).
    #[allow(clippy::too_many_arguments)]
    fn qkv_rows(
        &self,
        ap: &AttentionPlan,
        lw: &AttentionWeights,
        g: Dims,
        cur: &[f32],
        n: usize,
        lora: &LoraRows,
        (q, k, v): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
        (qkv, gate): (&mut Vec<f32>, &mut Vec<f32>),
    ) -> Result<()> {
        match &lw.qkv {
            QkvWeights::QueryOnly(wq) => {
                matmul(wq, self.weight(wq), cur, n, q)?;
                self.lora_add(wq, cur, lora, q)?;
                if let Some(b) = &lw.bq {
                    add_bias(q, b);
                }
            }
            QkvWeights::Separate { wq, wk, wv } if ap.output_gate => {
                // Per head: its query, then its gate (llama.cpp qwen3next.cpp's Q/gate
                // split of attn_q).
                qkv.resize(n * 2 * g.q(), 0.0);
                gate.resize(n * g.q(), 0.0);
                matmul_many(
                    &mut [
                        self.projection(wq, qkv),
                        self.projection(wk, k),
                        self.projection(wv, v),
                    ],
                    cur,
                    n,
                )?;
                self.lora_add(wq, cur, lora, qkv)?;
                self.lora_add(wk, cur, lora, k)?;
                self.lora_add(wv, cur, lora, v)?;
                let hd = g.hd_k;
                for ((qg, qr), gr) in qkv
                    .chunks_exact(2 * hd)
                    .zip(q.chunks_exact_mut(hd))
                    .zip(gate.chunks_exact_mut(hd))
                {
                    qr.copy_from_slice(&qg[..hd]);
                    gr.copy_from_slice(&qg[hd..]);
                }
                for (t, b) in [(&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
                    if let Some(b) = b {
                        add_bias(t, b);
                    }
                }
            }
            QkvWeights::Separate { wq, wk, wv } => {
                matmul_many(
                    &mut [
                        self.projection(wq, q),
                        self.projection(wk, k),
                        self.projection(wv, v),
                    ],
                    cur,
                    n,
                )?;
                self.lora_add(wq, cur, lora, q)?;
                self.lora_add(wk, cur, lora, k)?;
                self.lora_add(wv, cur, lora, v)?;
                for (t, b) in [(&mut *q, &lw.bq), (&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
                    if let Some(b) = b {
                        add_bias(t, b);
                    }
                }
            }
            QkvWeights::Mla(mla) => self.mla_qkv(mla, cur, n, q, k, v)?,
            QkvWeights::Fused(wqkv) => {
                qkv.resize(n * wqkv.rows, 0.0);
                matmul(wqkv, self.weight(wqkv), cur, n, qkv)?;
                self.lora_add(wqkv, cur, lora, qkv)?;
                if let Some(b) = &lw.bqkv {
                    add_bias(qkv, b);
                }
                let (qd, kd, vd) = (g.q(), g.k(), g.v());
                for (i, row) in qkv.chunks_exact(qd + kd + vd).enumerate() {
                    q[i * qd..(i + 1) * qd].copy_from_slice(&row[..qd]);
                    k[i * kd..(i + 1) * kd].copy_from_slice(&row[qd..qd + kd]);
                    v[i * vd..(i + 1) * vd].copy_from_slice(&row[qd + kd..]);
                }
            }
        }
        Ok(())
    }

    /// RoPE on the rows' queries and `k_new` (the keys this layer writes; none where it
    /// shares another's) at the rows' positions (multimodal ones where the model has
    /// sections: [`crate::rope::mrope_angles`]), with the layer's parameters (a table of
    /// angles per parameter set, kept in `rope_tables` for the call's other layers).
    fn rope_rows(
        &self,
        ap: &AttentionPlan,
        g: Dims,
        layout: RopeLayout,
        rows: &Rows<'_>,
        (q, k_new): (&mut [f32], &mut [f32]),
        rope_tables: &mut Vec<(RopeKey, Vec<(f32, f32)>)>,
    ) {
        let (w, n, pos) = (&self.weights, rows.n(), rows.pos);
        let neox = layout == RopeLayout::Neox;
        let n_rot = ap.geometry.n_rot;
        let factors = w.rope_freqs.as_deref().filter(|_| ap.geometry.freq_factors);
        // One table per parameter set, rotation width and factors.
        let key = (ap.rope, n_rot, factors.is_some());
        let ti = match rope_tables.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let mut table = Vec::with_capacity(n * n_rot / 2);
                let mut angles = Vec::new();
                let mut scratch: [Vec<(f32, f32)>; 4] = Default::default();
                for (r, &p) in pos.iter().enumerate() {
                    match (&self.config.rope_sections, rows.rope_pos.get(r)) {
                        (Some(sections), Some(&mp)) => {
                            let (rp, f) = (&ap.rope, factors);
                            mrope_angles(mp, sections, n_rot, rp, f, &mut scratch, &mut angles);
                        }
                        _ => rope_angles(p, n_rot, &ap.rope, factors, &mut angles),
                    }
                    table.extend_from_slice(&angles);
                }
                rope_tables.push((key, table));
                rope_tables.len() - 1
            }
        };
        let table = &rope_tables[ti].1;
        let half = n_rot / 2;
        // The rotated dimensions: a head's first n_rot, or with MLA its last n_rot
        // (the RoPE part after the latent).
        let off = if ap.qkv == QkvLayout::Latent {
            g.hd_k - n_rot
        } else {
            0
        };
        let rows = rows_per_task(n);
        for (t, dim) in [(&mut *q, g.q()), (&mut *k_new, g.k())] {
            pool::for_each_chunk(t, rows * dim, &|ci, part| {
                for (r, row) in part.chunks_exact_mut(dim).enumerate() {
                    let i = ci * rows + r;
                    let angles = &table[i * half..(i + 1) * half];
                    for head in row.chunks_exact_mut(g.hd_k) {
                        rope_rotate(&mut head[off..], angles, neox);
                    }
                }
            });
        }
    }
}

/// Query rows per attention task (prefill): the block's units share each key and value row
/// they load while it is in cache.
const ATTN_ROWS_PER_TASK: usize = 16;

/// One sequence's part of an attention step: its layer cache (keys and values already
/// written for the new rows), its first new position, and its rows `r0..r0+n` of the
/// batch.
struct AttnSeq<'a> {
    layer: &'a KvLayer,
    /// A pooled sequence's block table.
    blocks: Option<&'a [u32]>,
    p0: usize,
    r0: usize,
    n: usize,
    /// Position ranges `a..b` of this call whose rows see each other both ways (an
    /// image's rows in Gemma 3: [`crate::EmbdRows::bidirectional`]).
    bidi: &'a [(usize, usize)],
    /// How many positions past its own a query of a two-way range sees at most (an
    /// encoder's symmetric window: half of it; else unbounded).
    ahead: usize,
}

impl AttnSeq<'_> {
    /// The last key position a query at position `pos` sees: itself (causal), or the
    /// end of its two-way range (at most [`AttnSeq::ahead`] past it).
    fn last_key(&self, pos: usize) -> usize {
        match self.bidi.iter().find(|&&(a, b)| (a..b).contains(&pos)) {
            Some(&(_, b)) => (b - 1).min(pos.saturating_add(self.ahead)),
            None => pos,
        }
    }
}

/// Attention of every sequence's new query rows over its own cached keys and values of
/// one layer, writing `n_rows × (n_head · head_dim_v)` values to `out` (rows in batch
/// order).
///
/// Query head `h` reads KV head `h / (n_head / n_head_kv)` (GQA). Row at position `p` sees
/// the keys [`Visible`] gives it. Scores are scaled by `attn_scale`, soft-capped
/// (`c · tanh(s / c)`, gemma2) and given the ALiBi bias where the model has them,
/// softmaxed (with the head's sink logit in the denominator where the layer has
/// `attn_sinks`: gpt-oss), and the values summed in position order.
///
/// Work is split over (sequence, KV head, block of [`ATTN_ROWS_PER_TASK`] query rows),
/// or per part of a KV head's query heads (at most four) for blocks of fewer than 4 rows
/// (decode) when there are too few sequences to occupy the threads otherwise, largest
/// tasks first. A
/// task reads the keys and values its block can see in place (f16 widened in registers),
/// taking its (query head, row) pairs four at a time, each key and value row loaded once
/// for the four: scores ([`dot_multi_keys`]) and weighted value sums ([`weighted_sum_multi`]); a
/// decode step's four are the query heads that share a KV head. Each output element
/// is the same sequence of operations whatever the block, the chunk, the batch or the
/// thread: scores in `dot`'s order, one softmax over the visible keys, values
/// accumulated in key order.
#[allow(clippy::too_many_arguments)]
fn attention(
    c: &crate::config::ModelConfig,
    dims: Dims,
    seqs: &[AttnSeq<'_>],
    q: &[f32],
    visible: Visible,
    softcap: Option<f32>,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let (hd_k, hd_v) = (dims.hd_k, dims.hd_v);
    let group = dims.n_head / dims.n_head_kv;
    let row_out = dims.attn();
    // Keys visible from position `pos`: first_key(pos)..=pos.
    let first_key = |pos: usize| visible.first_key(pos);
    let tasks = attention_tasks(seqs, dims, visible);
    let score = |raw: f32, h: usize, t: usize| scaled_score(c, softcap, raw, h, t);
    let outs = Disjoint::new(out);
    crate::pool::run(tasks.len(), &|task| {
        let (si, h0, heads, i0) = tasks[task];
        let seq = &seqs[si];
        let AttnSeq {
            layer,
            blocks,
            p0,
            r0,
            n,
            ..
        } = *seq;
        let i1 = (i0 + ATTN_ROWS_PER_TASK).min(n);
        let nr = i1 - i0;
        let g = h0 / group;
        ATTN_SCORES.with_borrow_mut(|scores| {
            // Keys t0..t1 are read.
            let t0 = first_key(p0 + i0);
            let t1 = (i0..i1)
                .map(|i| seq.last_key(p0 + i) + 1)
                .max()
                .unwrap_or(p0 + i1);
            let span = t1 - t0;
            // KV head g's keys and values of positions t0.., read in place (through the
            // block table of a pooled sequence).
            let keys = layer.key_rows(g).starting_at(blocks, t0);
            let values = layer.value_rows(g).starting_at(blocks, t0);
            // The task's units are its (query head, row) pairs, head by head: unit `u` is
            // head `h0 + u / nr`, row `u % nr` of the block. Units go through the kernels
            // up to four at a time, sharing each key and value row they load (a decode
            // step's units are the heads of one KV head).
            let units = heads * nr;
            let head = |u: usize| h0 + u / nr;
            // Unit u sees keys lo(u)..hi(u), relative to t0.
            let lo = |u: usize| first_key(p0 + i0 + u % nr) - t0;
            let hi = |u: usize| seq.last_key(p0 + i0 + u % nr) + 1 - t0;
            let qrow = |u: usize| &q[(r0 + i0 + u % nr) * dims.q() + head(u) * hd_k..][..hd_k];
            scores.resize(units * span, 0.0);
            // The first units read the rows from memory (prefetched, the first rows before
            // the kernels start: OLMoE's decode attention at ~64 cached positions took a
            // median 29.8 us a layer without that, 22.8 with it); the others find them in
            // cache.
            let (keys_first, values_first) = (keys.prefetched(), values.prefetched());
            keys.prefetch_first(0..span, hd_k);
            values.prefetch_first(0..span, hd_v);
            for c0 in (0..units).step_by(4) {
                let keys = if c0 == 0 { keys_first } else { keys };
                let c1 = (c0 + 4).min(units);
                let (a, b) = ((c0..c1).map(lo).min(), (c0..c1).map(hi).max());
                let range = a.unwrap_or(0)..b.unwrap_or(0);
                let mut rows = scores[c0 * span..c1 * span].chunks_exact_mut(span);
                let mut row = || rows.next().expect("one score row per unit");
                match c1 - c0 {
                    4 => dot_multi_keys(
                        [qrow(c0), qrow(c0 + 1), qrow(c0 + 2), qrow(c0 + 3)],
                        keys,
                        range,
                        [row(), row(), row(), row()],
                    ),
                    3 => dot_multi_keys(
                        [qrow(c0), qrow(c0 + 1), qrow(c0 + 2)],
                        keys,
                        range,
                        [row(), row(), row()],
                    ),
                    2 => dot_multi_keys([qrow(c0), qrow(c0 + 1)], keys, range, [row(), row()]),
                    _ => dot_multi_keys([qrow(c0)], keys, range, [row()]),
                }
            }
            for u in 0..units {
                let (h, row) = (head(u), &mut scores[u * span..(u + 1) * span]);
                for (t, v) in row.iter_mut().enumerate().take(hi(u)).skip(lo(u)) {
                    *v = score(*v, h, t0 + t);
                }
                softmax_with_sink(&mut row[lo(u)..hi(u)], sinks.map(|s| s[h]));
            }
            // Weighted sums of the values. Per unit: its keys before the range that all
            // units of the chunk see, that shared range with the chunk's units together,
            // then its keys after it: key order throughout. Without a shared range each
            // unit does all its keys alone.
            // SAFETY (for every `outs.range` below): this task alone writes head h of its
            // rows, and the ranges of different (head, row) units are disjoint.
            #[allow(unsafe_code)]
            let orow = |u: usize| unsafe {
                outs.range((r0 + i0 + u % nr) * row_out + head(u) * hd_v, hd_v)
            };
            let prow = |u: usize| &scores[u * span..(u + 1) * span];
            for c0 in (0..units).step_by(4) {
                let values = if c0 == 0 { values_first } else { values };
                let c1 = (c0 + 4).min(units);
                let a = (c0..c1).map(lo).max().unwrap_or(0);
                let b = (c0..c1).map(hi).min().unwrap_or(0);
                let shared = a < b;
                for u in c0..c1 {
                    let o = orow(u);
                    o.fill(0.0);
                    let pre_end = if shared { a } else { hi(u) };
                    weighted_sum_multi([o], [prow(u)], values, lo(u)..pre_end);
                }
                if shared {
                    let v = values;
                    match c1 - c0 {
                        4 => weighted_sum_multi(
                            [orow(c0), orow(c0 + 1), orow(c0 + 2), orow(c0 + 3)],
                            [prow(c0), prow(c0 + 1), prow(c0 + 2), prow(c0 + 3)],
                            v,
                            a..b,
                        ),
                        3 => weighted_sum_multi(
                            [orow(c0), orow(c0 + 1), orow(c0 + 2)],
                            [prow(c0), prow(c0 + 1), prow(c0 + 2)],
                            v,
                            a..b,
                        ),
                        2 => weighted_sum_multi(
                            [orow(c0), orow(c0 + 1)],
                            [prow(c0), prow(c0 + 1)],
                            v,
                            a..b,
                        ),
                        _ => weighted_sum_multi([orow(c0)], [prow(c0)], v, a..b),
                    }
                    for u in c0..c1 {
                        weighted_sum_multi([orow(u)], [prow(u)], values, b..hi(u));
                    }
                }
            }
        });
    });
}

/// A raw score q·k of head `h` with key position `t`: scaled, soft-capped (gemma2), plus
/// the ALiBi bias (bloom).
fn scaled_score(
    c: &crate::config::ModelConfig,
    softcap: Option<f32>,
    raw: f32,
    h: usize,
    t: usize,
) -> f32 {
    let mut s = raw * c.attn_scale;
    if let Some(cap) = softcap {
        s = cap * (s / cap).tanh();
    }
    if let Some(slope) = c.alibi_slopes.get(h) {
        s += slope * t as f32;
    }
    s
}

/// Each sequence's position ranges whose rows see each other both ways
/// ([`crate::EmbdRows::bidirectional`]) in this call: an encoder's whole input.
fn two_way_ranges(seqs: &[Sequence<'_>], n_embd: usize, encoder: bool) -> Vec<Vec<(usize, usize)>> {
    seqs.iter()
        .map(|s| {
            let p0 = s.state.n_past;
            if encoder {
                return vec![(p0, p0 + s.tokens.len())];
            }
            s.embd
                .iter()
                .filter(|e| e.bidirectional)
                .map(|e| (p0 + e.at, p0 + e.at + e.n(n_embd)))
                .collect()
        })
        .collect()
}

/// A quantized cache holds rotated keys and values (llama.cpp PR #21038): each sequence's
/// queries and keys by its key block, values by its value block (the keys and values only
/// where the layer writes its own, not `shares` another's).
fn rotate_for_cache(
    seqs: &[Sequence<'_>],
    starts: &[usize],
    g: Dims,
    shares: bool,
    (q, k, v): (&mut [f32], &mut [f32], &mut [f32]),
) {
    for (si, s) in seqs.iter().enumerate() {
        let (r0, r1) = (starts[si], starts[si + 1]);
        let kv = s.state.kv_type;
        if let Some(b) = kv.key_rotation(g.hd_k) {
            hadamard_rotate(&mut q[r0 * g.q()..r1 * g.q()], b);
            if !shares {
                hadamard_rotate(&mut k[r0 * g.k()..r1 * g.k()], b);
            }
        }
        if let Some(b) = kv.value_rotation(g.hd_v).filter(|_| !shares) {
            hadamard_rotate(&mut v[r0 * g.v()..r1 * g.v()], b);
        }
    }
}

/// Each sequence's new keys and values of layer `il` (`k`, `v`: the batch's rows, `dims`
/// wide) into its cache: the pool's blocks for a pooled sequence, else its own (its window
/// ring where the layer is `windowed` and it has one).
fn write_kv(
    il: usize,
    windowed: bool,
    seqs: &mut [Sequence<'_>],
    starts: &[usize],
    (k, v): (&[f32], &[f32]),
    dims: (usize, usize),
    mut pool: Option<&mut KvPool>,
) {
    for (si, s) in seqs.iter_mut().enumerate() {
        let (r0, r1) = (starts[si], starts[si + 1]);
        let (kr, vr) = (&k[r0 * dims.0..r1 * dims.0], &v[r0 * dims.1..r1 * dims.1]);
        let p0 = s.state.n_past;
        let state = &mut *s.state;
        if state.is_pooled() {
            let pool = pool
                .as_deref_mut()
                .expect("forward_batch_in checked that pooled sequences have their pool");
            let table = state.table(pool.in_window_group(il));
            pool.layer_mut(il).write_rows(table, p0, kr, vr);
        } else {
            let (layer, table) = state.kv_and_table_mut(il, windowed);
            layer.write_rows(table, p0, kr, vr);
        }
    }
}

/// The tasks of an [`attention`] call, largest first: (sequence, first query head, heads,
/// first row within the sequence), as its doc describes.
fn attention_tasks(
    seqs: &[AttnSeq<'_>],
    dims: Dims,
    visible: Visible,
) -> Vec<(usize, usize, usize, usize)> {
    let group = dims.n_head / dims.n_head_kv;
    let first_key = |pos: usize| visible.first_key(pos);
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
    // Enough sequences to keep every thread busy with one task per KV head: then each KV
    // row is widened once for all the heads that read it, even for one-row blocks.
    let threads = crate::pool::threads();
    let many = seqs.len() * dims.n_head_kv >= 2 * threads;
    for (si, s) in seqs.iter().enumerate() {
        for i0 in (0..s.n).step_by(ATTN_ROWS_PER_TASK) {
            if s.n - i0 >= 4 || many {
                tasks.extend((0..dims.n_head_kv).map(|g| (si, g * group, group, i0)));
            } else {
                // Too few KV heads for the threads: each KV head's query heads in parts
                // of at most four (one kernel call), enough parts for every thread. One
                // head per task left each score a chain of dependent adds (one per eight
                // elements) with nothing beside it, and widened each key row once per
                // head: at 4096 cached tokens Qwen2.5-1.5B's decode spent about 45% of a
                // step in attention (tg128 @ d4096 22.6 t/s against 41.8 at depth 0).
                let parts = threads
                    .div_ceil(dims.n_head_kv)
                    .max(group.div_ceil(4))
                    .min(group);
                let per = group.div_ceil(parts);
                for g in 0..dims.n_head_kv {
                    tasks.extend(
                        (0..group)
                            .step_by(per)
                            .map(|c| (si, g * group + c, per.min(group - c), i0)),
                    );
                }
            }
        }
    }
    let work = |&(si, _, heads, i0): &(usize, usize, usize, usize)| {
        let s = &seqs[si];
        let i1 = (i0 + ATTN_ROWS_PER_TASK).min(s.n);
        heads * (s.p0 + i1 - first_key(s.p0 + i0)) * (i1 - i0)
    };
    tasks.sort_by_key(|t| std::cmp::Reverse(work(t)));
    tasks
}

/// Which earlier keys a query sees: the mask options of an attention layer, composable.
#[derive(Clone, Copy, Debug)]
struct Visible {
    /// With `window > 0`, only keys `t` with `p - t < window` (llama.cpp
    /// `LLAMA_SWA_TYPE_STANDARD`).
    window: usize,
    /// With `chunk > 0`, only the keys of the query's chunk, `t >= ⌊p / chunk⌋ · chunk`
    /// (llama.cpp `LLAMA_SWA_TYPE_CHUNKED`; transformers `chunked_causal_mask`).
    chunk: usize,
    /// The window is symmetric, `|p - t| <= window / 2` (an encoder's: llama.cpp
    /// `LLAMA_SWA_TYPE_SYMMETRIC`; transformers ModernBERT's `sliding_window_mask`); the
    /// keys after the query come from [`AttnSeq::last_key`].
    symmetric: bool,
}

impl Visible {
    /// The first key a query at position `pos` sees; it sees every key from there to
    /// `pos` (causal).
    fn first_key(self, pos: usize) -> usize {
        let by_window = match self.window {
            0 => 0,
            w if self.symmetric => pos.saturating_sub(w / 2),
            w => (pos + 1).saturating_sub(w),
        };
        let by_chunk = match self.chunk {
            0 => 0,
            c => pos / c * c,
        };
        by_window.max(by_chunk)
    }
}

thread_local! {
    /// Per-thread scores of an attention task: one row of its visible keys per unit.
    static ATTN_SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
