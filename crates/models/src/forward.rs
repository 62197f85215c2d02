//! The decoder forward pass, one body for every architecture of the table, parameterised
//! by [`crate::arch::ArchSpec`] and the weights present.
//!
//! Per layer (llama.cpp `src/models/{llama,qwen2,gemma3}.cpp`, names as llama.cpp's graph
//! names the intermediates): `attn_norm` → Q/K/V projections (+ biases) → per-head Q/K norm
//! → RoPE → store K/V in the cache → attention over the cache (causal, sliding window where
//! the layer has one) → output projection (→ post-attention norm) → residual; `ffn_norm`
//! → gate/up → activation(gate)·up → down (→ post-FFN norm) → residual. Then the output
//! norm and the LM head on the rows whose logits are wanted.

use crate::arch::{Activation, Ffn, Norm, Position, RopeLayout};
use crate::config::{Gating, MoeConfig, RopeParams};
use crate::error::{ModelError, Result};
use crate::kernels::{
    add_bias, dot_multi_keys, gelu_tanh, layer_norm, matmul, matmul_many, matrix_row, rms_norm,
    rope_angles, rope_rotate, silu_in_place, softmax, softmax_with_sink, swiglu_oai,
    weighted_sum_multi, Matrix, Projection,
};
use crate::kv::{KvCache, KvLayer};
use crate::model::{
    DenseFfn, FfnWeights, LayerWeights, MlaWeights, Model, MoeFfn, NormWeights, QkvWeights,
};
use crate::pool::{self, Disjoint};

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
    /// No logits: every row's hidden state after the output norm instead, `n_tokens ×
    /// n_embd` values (the input of the LM head; what llama.cpp pools into embeddings,
    /// its `result_norm` / `t_embd`).
    Hidden,
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

    /// Multi-head latent attention's queries, keys and values for `n` rows of `input`
    /// (llama.cpp `src/models/deepseek2.cpp`, the absorbed form; transformers
    /// `DeepseekV2Attention`): per head, the query's no-RoPE part is projected into the
    /// latent through `attn_k_b`, so `q` holds `[latent query | RoPE part]` per head, `k` the
    /// shared `[normed latent | RoPE key]` and `v` the normed latent: the scores equal the
    /// un-absorbed ones and attention runs as multi-query attention over the latent.
    #[allow(clippy::too_many_arguments)]
    fn mla_qkv(
        &self,
        w: &MlaWeights,
        input: &[f32],
        n: usize,
        q: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let mc = c.mla.as_ref().expect("MLA weights have an MLA config");
        let (rank, rope) = (mc.kv_lora_rank, c.n_rot);
        let (qk, nope) = (mc.qk_head_dim, mc.qk_head_dim - rope);
        let mut qf = vec![0f32; n * c.n_head * qk];
        match &w.q_a {
            Some((qa, qa_norm)) => {
                let mut t = vec![0f32; n * qa.rows];
                matmul(qa, self.data(qa), input, n, &mut t)?;
                rms_norm(&mut t, qa_norm, c.norm_eps);
                matmul(&w.q_b, self.data(&w.q_b), &t, n, &mut qf)?;
            }
            None => matmul(&w.q_b, self.data(&w.q_b), input, n, &mut qf)?,
        }
        let mut kv = vec![0f32; n * (rank + rope)];
        matmul(&w.kv_a, self.data(&w.kv_a), input, n, &mut kv)?;
        let (kd, vd, qd) = (c.k_dim(), c.v_dim(), c.q_dim());
        for i in 0..n {
            let row = &kv[i * (rank + rope)..(i + 1) * (rank + rope)];
            let kr = &mut k[i * kd..(i + 1) * kd];
            kr.copy_from_slice(row);
            rms_norm(&mut kr[..rank], &w.kv_a_norm, c.norm_eps);
            v[i * vd..(i + 1) * vd].copy_from_slice(&kr[..rank]);
        }
        let mut nope_rows = vec![0f32; n * nope];
        let mut absorbed = vec![0f32; n * rank];
        for h in 0..c.n_head {
            for i in 0..n {
                nope_rows[i * nope..(i + 1) * nope]
                    .copy_from_slice(&qf[(i * c.n_head + h) * qk..][..nope]);
            }
            let kb = w.k_b.expert(h);
            matmul(&kb, self.data(&kb), &nope_rows, n, &mut absorbed)?;
            for i in 0..n {
                let head = &mut q[i * qd + h * (rank + rope)..][..rank + rope];
                head[..rank].copy_from_slice(&absorbed[i * rank..(i + 1) * rank]);
                head[rank..].copy_from_slice(&qf[(i * c.n_head + h) * qk + nope..][..rope]);
            }
        }
        Ok(())
    }

    /// The model's norm (RMSNorm or LayerNorm, [`crate::arch::Norm`]) of each
    /// `weight.len()`-sized row of `x` in place, plus the bias when there is one.
    fn norm(&self, x: &mut [f32], nw: &NormWeights) {
        match self.config.arch.norm {
            Norm::Rms => rms_norm(x, &nw.weight, self.config.norm_eps),
            Norm::Layer => layer_norm(x, &nw.weight, self.config.norm_eps),
        }
        if let Some(b) = &nw.bias {
            add_bias(x, b);
        }
    }

    /// The feed-forward block of layer `lw` on `input` (`n × n_embd`), into `out`: dense
    /// ([`Model::dense_ffn`]) or mixture of experts ([`Model::moe_ffn`]). `gate` and `up`
    /// are scratch.
    #[allow(clippy::too_many_arguments)]
    fn ffn(
        &self,
        il: usize,
        lw: &LayerWeights,
        input: &[f32],
        n: usize,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        out: &mut [f32],
    ) -> Result<()> {
        match &lw.ffn {
            FfnWeights::Dense(d) => self.dense_ffn(
                d,
                self.config.arch.ffn,
                self.config.n_ff,
                input,
                n,
                gate,
                up,
                out,
                None,
            ),
            FfnWeights::Moe(m) => self.moe_ffn(il, m, input, n, out),
        }
    }

    /// A dense FFN of width `nf` on `input` (`n × n_embd`), into `out`: gated
    /// (`down(act(gate) · up)`, gate and up from separate matrices or one fused matrix) or
    /// plain (`down(act(up))`), with the biases the file has. `gate` and `up` are scratch.
    /// `bytes` gives the gate, up and down matrices' bytes when they do not come from
    /// the file mapping (the expert cache).
    #[allow(clippy::too_many_arguments)]
    fn dense_ffn(
        &self,
        f: &DenseFfn,
        kind: Ffn,
        nf: usize,
        input: &[f32],
        n: usize,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        out: &mut [f32],
        bytes: Option<[&[u8]; 3]>,
    ) -> Result<()> {
        up.resize(n * f.up.rows, 0.0);
        gate.resize(n * nf, 0.0);
        let data = |i: usize, m: &Matrix| -> &[u8] {
            match &bytes {
                Some(b) => b[i],
                None => self.data(m),
            }
        };
        match &f.gate {
            Some(wg) => matmul_many(
                &mut [
                    Projection {
                        w: wg,
                        data: data(0, wg),
                        out: gate,
                    },
                    Projection {
                        w: &f.up,
                        data: data(1, &f.up),
                        out: up,
                    },
                ],
                input,
                n,
            )?,
            None => matmul(&f.up, data(1, &f.up), input, n, up)?,
        }
        if let Some(b) = &f.b_up {
            add_bias(up, b);
        }
        if let Some(b) = &f.b_gate {
            add_bias(gate, b);
        }
        let act = self.config.arch.activation;
        // In place over a slice: x = act(x) · u for the gated kinds (`Some(u)`), act(x) for
        // the plain one (`None`; gelu for every non-SiLU activation). SiLU on eight lanes.
        let activate = |x: &mut [f32], u: Option<&[f32]>| match (act, u) {
            (Activation::Silu, _) => silu_in_place(x, u),
            (Activation::GeluTanh, Some(u)) => x
                .iter_mut()
                .zip(u)
                .for_each(|(g, u)| *g = gelu_tanh(*g) * u),
            (Activation::SwigluOai, Some(u)) => x
                .iter_mut()
                .zip(u)
                .for_each(|(g, u)| *g = swiglu_oai(*g, *u)),
            (Activation::GeluTanh | Activation::SwigluOai, None) => {
                x.iter_mut().for_each(|v| *v = gelu_tanh(*v))
            }
        };
        let up = &*up;
        // Element-wise: even a decode step's one row is split over the threads.
        let per = elems_per_task(n * nf, nf);
        let rows = rows_per_task(n);
        match kind {
            Ffn::Gated => pool::for_each_chunk(gate, per, &|ci, part| {
                activate(part, Some(&up[ci * per..][..part.len()]));
            }),
            // Rows of 2·n_ff: the gate half, then the up half.
            Ffn::GatedFused => pool::for_each_chunk(gate, rows * nf, &|ci, part| {
                for (r, g) in part.chunks_exact_mut(nf).enumerate() {
                    let row = &up[(ci * rows + r) * 2 * nf..][..2 * nf];
                    let (gh, uh) = row.split_at(nf);
                    g.copy_from_slice(gh);
                    activate(g, Some(uh));
                }
            }),
            Ffn::Plain => pool::for_each_chunk(gate, per, &|ci, part| {
                part.copy_from_slice(&up[ci * per..][..part.len()]);
                activate(part, None);
            }),
        }
        matmul(&f.down, data(2, &f.down), gate, n, out)?;
        if let Some(b) = &f.b_down {
            add_bias(out, b);
        }
        Ok(())
    }

    /// A mixture-of-experts FFN on `input` (`n × n_embd`), into `out` (llama.cpp
    /// `llm_graph_context::build_moe_ffn`; transformers `Qwen2MoeSparseMoeBlock.forward`
    /// and its siblings): the router's logits, [`route`]'s experts and weights per row,
    /// then each expert once over all the rows that chose it (its weights read once per
    /// call), each row's expert outputs summed with their weights in selection order,
    /// plus the shared expert (× `sigmoid(shared_gate · x)` where it has a gate).
    fn moe_ffn(
        &self,
        il: usize,
        m: &MoeFfn,
        input: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let mc = c.moe.as_ref().expect("a MoE layer has a MoE config");
        let (d, ne, k) = (c.n_embd, mc.n_expert, mc.n_used);
        let mut logits = vec![0f32; n * ne];
        matmul(&m.router, self.data(&m.router), input, n, &mut logits)?;
        if let Some(b) = &m.router_bias {
            add_bias(&mut logits, b);
        }
        let sel: Vec<(usize, f32)> = logits
            .chunks_exact(ne)
            .flat_map(|row| route(row, m.selection_bias.as_deref(), mc))
            .collect();
        self.moe_stats.record(il, sel.iter().map(|&(e, _)| e));
        // Each expert over the rows that chose it; results land in slot (row, j).
        let mut slots = vec![0f32; n * k * d];
        let (mut gate, mut up) = (Vec::new(), Vec::new());
        // The chosen experts, in index order; under a budget the next one's matrices are
        // read into the cache (prefetched) while the current one computes.
        let chosen: Vec<usize> = (0..ne).filter(|&e| sel.iter().any(|s| s.0 == e)).collect();
        let load = |e: usize| {
            self.expert_cache.as_ref().map(|cache| {
                [
                    m.gate_exps.expert(e),
                    m.up_exps.expert(e),
                    m.down_exps.expert(e),
                ]
                .map(|w| cache.get(&self.file, &w))
            })
        };
        std::thread::scope(|scope| -> Result<()> {
            let mut next = None;
            for (j, &e) in chosen.iter().enumerate() {
                let cached = match next.take() {
                    Some(h) => std::thread::ScopedJoinHandle::join(h)
                        .map_err(|_| ModelError::Unsupported("expert prefetch panicked".into()))?,
                    None => load(e),
                };
                if let (Some(_), Some(&following)) = (&cached, chosen.get(j + 1)) {
                    next = Some(scope.spawn(move || load(following)));
                }
                let picks: Vec<usize> = (0..n * k).filter(|&s| sel[s].0 == e).collect();
                let xs: Vec<f32> = picks
                    .iter()
                    .flat_map(|&s| input[(s / k) * d..(s / k + 1) * d].iter().copied())
                    .collect();
                let bias = |b: &Option<Vec<f32>>, len: usize| {
                    b.as_ref().map(|b| b[e * len..(e + 1) * len].to_vec())
                };
                let expert = DenseFfn {
                    gate: Some(m.gate_exps.expert(e)),
                    up: m.up_exps.expert(e),
                    down: m.down_exps.expert(e),
                    b_gate: bias(&m.gate_exps_bias, mc.n_ff_exp),
                    b_up: bias(&m.up_exps_bias, mc.n_ff_exp),
                    b_down: bias(&m.down_exps_bias, d),
                };
                let mut ys = vec![0f32; picks.len() * d];
                // Under a budget the matrices come from the cache (the file's bytes).
                let bytes = cached.as_ref().map(|c| [&c[0][..], &c[1][..], &c[2][..]]);
                self.dense_ffn(
                    &expert,
                    Ffn::Gated,
                    mc.n_ff_exp,
                    &xs,
                    picks.len(),
                    &mut gate,
                    &mut up,
                    &mut ys,
                    bytes,
                )?;
                for (&s, y) in picks.iter().zip(ys.chunks_exact(d)) {
                    slots[s * d..(s + 1) * d].copy_from_slice(y);
                }
            }
            Ok(())
        })?;
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            for j in 0..k {
                let (_, wt) = sel[r * k + j];
                let y = &slots[(r * k + j) * d..][..d];
                if j == 0 {
                    o.iter_mut().zip(y).for_each(|(o, y)| *o = y * wt);
                } else {
                    o.iter_mut().zip(y).for_each(|(o, y)| *o += y * wt);
                }
            }
        }
        if let Some(sh) = &m.shared {
            let mut ys = vec![0f32; n * d];
            self.dense_ffn(
                sh,
                Ffn::Gated,
                sh.up.rows,
                input,
                n,
                &mut gate,
                &mut up,
                &mut ys,
                None,
            )?;
            let mut g = vec![1f32; n];
            if let Some(wg) = &m.shared_gate {
                matmul(wg, self.data(wg), input, n, &mut g)?;
                g.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
            }
            for ((o, y), g) in out.chunks_exact_mut(d).zip(ys.chunks_exact(d)).zip(&g) {
                o.iter_mut().zip(y).for_each(|(o, y)| *o += y * g);
            }
        }
        Ok(())
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
    /// The one-sequence case of [`Model::forward_batch`].
    ///
    /// Errors: [`ModelError::ContextFull`] if the tokens would pass the cache's size,
    /// [`ModelError::TokenOutOfRange`] for an id outside the vocabulary; both are checked
    /// before anything is written to the cache.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        let mut seqs = [Sequence {
            cache,
            tokens,
            logits,
        }];
        Ok(self.forward_batch(&mut seqs)?.pop().unwrap_or_default())
    }

    /// Evaluates several sequences in one pass: each sequence's `tokens` at positions
    /// `cache.n_past ..` of its own cache, appending their keys and values there. Returns
    /// each sequence's requested logits (row-major `[rows][n_vocab]`), in order.
    ///
    /// The rows of all sequences share each projection (one matrix product per weight per
    /// call, reading each weight once: continuous batching), while attention reads each
    /// sequence's own cache. A row's result depends only on its token, its position and
    /// its sequence's cache, never on the other rows or sequences of the call, nor on the
    /// thread count: the same bits alone, in a batch, in a prefill chunk of any size or as
    /// a single decode step (tests/batch_invariance.rs).
    ///
    /// Errors: [`ModelError::ContextFull`] if a sequence's tokens would pass its cache's
    /// size, [`ModelError::TokenOutOfRange`] for an id outside the vocabulary; both are
    /// checked for every sequence before anything is written to any cache.
    pub fn forward_batch(&self, seqs: &mut [Sequence<'_>]) -> Result<Vec<Vec<f32>>> {
        for s in seqs.iter() {
            self.check_input(s.cache, s.tokens)?;
        }
        let c = &self.config;
        let w = &self.weights;
        let d = c.n_embd;
        // Row ranges of the sequences in the batch, and each row's position.
        let mut starts = Vec::with_capacity(seqs.len() + 1);
        let mut pos = Vec::new();
        starts.push(0);
        for s in seqs.iter() {
            pos.extend((0..s.tokens.len()).map(|i| s.cache.n_past + i));
            starts.push(pos.len());
        }
        let n = pos.len();
        if n == 0 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }

        // inp_embd (× sqrt(n_embd) for gemma, × embedding_scale for granite), then bloom's
        // token_embd_norm.
        let mut x = vec![0f32; n * d];
        let tokens = seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            matrix_row(&w.token_embd, self.data(&w.token_embd), t as usize, row)?;
            if c.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= c.embed_scale);
            }
        }
        if let Some(nw) = &w.token_embd_norm {
            self.norm(&mut x, nw);
        }

        let mut cur = vec![0f32; n * d];
        let mut q = vec![0f32; n * c.q_dim()];
        let mut k = vec![0f32; n * c.k_dim()];
        let mut v = vec![0f32; n * c.v_dim()];
        let mut qkv = Vec::new();
        let mut attn = vec![0f32; n * c.n_head * c.head_dim_v];
        // Sized by each FFN as it runs (`dense_ffn`, the experts' widths).
        let mut gate = Vec::new();
        let mut up = Vec::new();
        let mut ffn_out = Vec::new();
        let mut ffn_in = vec![0f32; n * d];
        let mut attn_out = Vec::new();
        let mut rope_tables: Vec<(RopeParams, Vec<(f32, f32)>)> = Vec::new();

        for (il, lw) in w.layers.iter().enumerate() {
            // attn_norm (post-norm-only architectures read the residual stream itself).
            cur.copy_from_slice(&x);
            if let Some(nw) = &lw.attn_norm {
                self.norm(&mut cur, nw);
            }
            // Qcur, Kcur, Vcur
            match &lw.qkv {
                QkvWeights::Separate { wq, wk, wv } => {
                    matmul_many(
                        &mut [
                            self.projection(wq, &mut q),
                            self.projection(wk, &mut k),
                            self.projection(wv, &mut v),
                        ],
                        &cur,
                        n,
                    )?;
                    for (t, b) in [(&mut q, &lw.bq), (&mut k, &lw.bk), (&mut v, &lw.bv)] {
                        if let Some(b) = b {
                            add_bias(t, b);
                        }
                    }
                }
                QkvWeights::Mla(mla) => self.mla_qkv(mla, &cur, n, &mut q, &mut k, &mut v)?,
                QkvWeights::Fused(wqkv) => {
                    qkv.resize(n * wqkv.rows, 0.0);
                    matmul(wqkv, self.data(wqkv), &cur, n, &mut qkv)?;
                    if let Some(b) = &lw.bqkv {
                        add_bias(&mut qkv, b);
                    }
                    let (qd, kd, vd) = (c.q_dim(), c.k_dim(), c.v_dim());
                    for (i, row) in qkv.chunks_exact(qd + kd + vd).enumerate() {
                        q[i * qd..(i + 1) * qd].copy_from_slice(&row[..qd]);
                        k[i * kd..(i + 1) * kd].copy_from_slice(&row[qd..qd + kd]);
                        v[i * vd..(i + 1) * vd].copy_from_slice(&row[qd + kd..]);
                    }
                }
            }
            // Q/K norm: rows of head_dim_k values, or of the whole projection.
            if let Some(qn) = &lw.q_norm {
                rms_norm(&mut q, qn, c.norm_eps);
            }
            if let Some(kn) = &lw.k_norm {
                rms_norm(&mut k, kn, c.norm_eps);
            }
            if let Position::Rope(layout) = c.arch.position {
                // RoPE: one table of rotations per position and parameter set, shared by
                // every head and every layer with the same parameters.
                let neox = layout == RopeLayout::Neox;
                let rp = c.rope(il);
                let ti = match rope_tables.iter().position(|(k, _)| *k == rp) {
                    Some(i) => i,
                    None => {
                        let mut table = Vec::with_capacity(n * c.n_rot / 2);
                        let mut angles = Vec::new();
                        for &p in &pos {
                            rope_angles(p, c.n_rot, &rp, w.rope_freqs.as_deref(), &mut angles);
                            table.extend_from_slice(&angles);
                        }
                        rope_tables.push((rp, table));
                        rope_tables.len() - 1
                    }
                };
                let table = &rope_tables[ti].1;
                let half = c.n_rot / 2;
                // The rotated dimensions: a head's first n_rot, or with MLA its last n_rot
                // (the RoPE part after the latent).
                let off = if c.mla.is_some() {
                    c.head_dim_k - c.n_rot
                } else {
                    0
                };
                let rows = rows_per_task(n);
                for (t, dim) in [(&mut q, c.q_dim()), (&mut k, c.k_dim())] {
                    pool::for_each_chunk(t, rows * dim, &|ci, part| {
                        for (r, row) in part.chunks_exact_mut(dim).enumerate() {
                            let i = ci * rows + r;
                            let angles = &table[i * half..(i + 1) * half];
                            for head in row.chunks_exact_mut(c.head_dim_k) {
                                rope_rotate(&mut head[off..], angles, neox);
                            }
                        }
                    });
                }
            }
            for (si, s) in seqs.iter_mut().enumerate() {
                let (r0, r1) = (starts[si], starts[si + 1]);
                let layer = &mut s.cache.layers[il];
                let p0 = s.cache.n_past;
                layer
                    .k
                    .write(p0 * c.k_dim(), &k[r0 * c.k_dim()..r1 * c.k_dim()]);
                layer
                    .v
                    .write(p0 * c.v_dim(), &v[r0 * c.v_dim()..r1 * c.v_dim()]);
            }
            let window = if c.swa_layers[il] { c.n_swa } else { 0 };
            let parts: Vec<AttnSeq<'_>> = seqs
                .iter()
                .enumerate()
                .map(|(si, s)| AttnSeq {
                    layer: &s.cache.layers[il],
                    p0: s.cache.n_past,
                    r0: starts[si],
                    n: starts[si + 1] - starts[si],
                })
                .collect();
            attention(c, &parts, &q, window, lw.attn_sinks.as_deref(), &mut attn);
            // The FFN input: the attention's normed input for a parallel block (computed
            // before `cur` is overwritten), else the residual after attention.
            if c.arch.parallel_residual {
                ffn_out.resize(n * d, 0.0);
                self.ffn(il, lw, &cur, n, &mut gate, &mut up, &mut ffn_out)?;
            }
            if let QkvWeights::Mla(mla) = &lw.qkv {
                // Each head's latent output projected out of the latent (attn_v_b).
                let mc = c.mla.as_ref().expect("MLA weights have an MLA config");
                let (rank, vh) = (mc.kv_lora_rank, mc.v_head_dim);
                attn_out.resize(n * c.n_head * vh, 0.0);
                let mut lat = vec![0f32; n * rank];
                let mut o = vec![0f32; n * vh];
                for h in 0..c.n_head {
                    for i in 0..n {
                        lat[i * rank..(i + 1) * rank]
                            .copy_from_slice(&attn[(i * c.n_head + h) * rank..][..rank]);
                    }
                    let vb = mla.v_b.expert(h);
                    matmul(&vb, self.data(&vb), &lat, n, &mut o)?;
                    for i in 0..n {
                        attn_out[(i * c.n_head + h) * vh..][..vh]
                            .copy_from_slice(&o[i * vh..(i + 1) * vh]);
                    }
                }
                matmul(&lw.wo, self.data(&lw.wo), &attn_out, n, &mut cur)?;
            } else {
                matmul(&lw.wo, self.data(&lw.wo), &attn, n, &mut cur)?;
            }
            if let Some(b) = &lw.bo {
                add_bias(&mut cur, b);
            }
            if let Some(nw) = &lw.post_attn_norm {
                self.norm(&mut cur, nw);
            }
            if c.residual_scale != 1.0 {
                cur.iter_mut().for_each(|v| *v *= c.residual_scale);
            }
            if c.arch.parallel_residual {
                // falcon: l_out = (ffn + attention) + residual.
                x.iter_mut()
                    .zip(cur.iter().zip(&ffn_out))
                    .for_each(|(a, (at, f))| *a += f + at);
                continue;
            }
            // ffn_inp = residual + attention
            x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);

            ffn_in.copy_from_slice(&x);
            if let Some(nw) = &lw.ffn_norm {
                self.norm(&mut ffn_in, nw);
            }
            self.ffn(il, lw, &ffn_in, n, &mut gate, &mut up, &mut cur)?;
            if let Some(nw) = &lw.post_ffn_norm {
                self.norm(&mut cur, nw);
            }
            if c.residual_scale != 1.0 {
                cur.iter_mut().for_each(|v| *v *= c.residual_scale);
            }
            // l_out
            x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);
        }
        for s in seqs.iter_mut() {
            s.cache.n_past += s.tokens.len();
        }

        // Sequences that want hidden states get their rows after the output norm (the same
        // norm, row by row, as the LM head's input); the others are left out of the LM head.
        let mut hidden: Vec<Option<Vec<f32>>> = vec![None; seqs.len()];
        for (si, s) in seqs.iter().enumerate() {
            if s.logits == Logits::Hidden {
                let mut h = x[starts[si] * d..starts[si + 1] * d].to_vec();
                self.norm(&mut h, &w.output_norm);
                hidden[si] = Some(h);
            }
        }
        // The rows whose logits are wanted, gathered for one LM-head product.
        let mut wanted: Vec<(usize, usize)> = Vec::with_capacity(seqs.len()); // (first, count)
        let mut rows = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            let (r0, r1) = (starts[si], starts[si + 1]);
            let from = match s.logits {
                Logits::None | Logits::Hidden => r1,
                Logits::Last => r1.saturating_sub(1).max(r0),
                Logits::All => r0,
                Logits::From(i) => (r0 + i).min(r1),
            };
            wanted.push((rows.len() / d, r1 - from));
            rows.extend_from_slice(&x[from * d..r1 * d]);
        }
        // Each sequence's output: its hidden states, or its rows of the LM head's product.
        let mut outputs = |mut per_seq: Vec<Vec<f32>>| -> Vec<Vec<f32>> {
            for (o, h) in per_seq.iter_mut().zip(hidden.iter_mut()) {
                if let Some(h) = h.take() {
                    *o = h;
                }
            }
            per_seq
        };
        let n_rows = rows.len() / d;
        // The LM head's product: into the caller's vector for one sequence, else into a
        // reused per-thread buffer split per sequence afterwards (a fresh multi-megabyte
        // buffer per decode step cost 13% of an 8-sequence step in page faults).
        let logits_of = |out: &mut [f32]| -> Result<()> {
            if n_rows > 0 {
                self.norm(&mut rows, &w.output_norm);
                matmul(&w.output, self.data(&w.output), &rows, n_rows, out)?;
                if c.logit_scale != 1.0 {
                    out.iter_mut().for_each(|v| *v /= c.logit_scale);
                }
                if let Some(cap) = c.final_softcap {
                    out.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
                }
            }
            Ok(())
        };
        let mut logits_of = logits_of;
        if wanted.len() == 1 {
            let mut out = vec![0f32; n_rows * c.n_vocab];
            logits_of(&mut out)?;
            return Ok(outputs(vec![out]));
        }
        let per_seq = LOGITS_SCRATCH.with_borrow_mut(|out| -> Result<Vec<Vec<f32>>> {
            out.resize(n_rows * c.n_vocab, 0.0);
            logits_of(out)?;
            Ok(wanted
                .into_iter()
                .map(|(first, count)| out[first * c.n_vocab..(first + count) * c.n_vocab].to_vec())
                .collect())
        })?;
        Ok(outputs(per_seq))
    }
}

thread_local! {
    /// The LM head's output of a multi-sequence call, reused across calls.
    static LOGITS_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows per task of the row-wise steps of the forward pass (RoPE, the gated activation),
/// at most.
const ROWS_PER_TASK: usize = 16;

/// Rows per task of a row-wise step over `n` rows: [`ROWS_PER_TASK`], or fewer so that a
/// decode step's few rows still reach every thread.
fn rows_per_task(n: usize) -> usize {
    n.div_ceil(pool::threads()).clamp(1, ROWS_PER_TASK)
}

/// Elements per task of an element-wise step over `total` elements in rows of `width`:
/// [`ROWS_PER_TASK`] rows, or an even share per thread (at least 256 elements) when that
/// is less, so that even one row is split.
fn elems_per_task(total: usize, width: usize) -> usize {
    total
        .div_ceil(pool::threads())
        .max(256)
        .min(ROWS_PER_TASK * width)
        .max(1)
}

/// One sequence of a [`Model::forward_batch`] call.
pub struct Sequence<'a> {
    /// Its KV cache: the tokens go at positions `cache.n_past ..`.
    pub cache: &'a mut KvCache,
    /// The tokens to evaluate (may be empty).
    pub tokens: &'a [u32],
    /// Which of its rows' logits to return.
    pub logits: Logits,
}

/// Query rows per attention task (prefill): the block's units share each key and value row
/// they load while it is in cache.
const ATTN_ROWS_PER_TASK: usize = 16;

/// One sequence's part of an attention step: its layer cache (keys and values already
/// written for the new rows), its first new position, and its rows `r0..r0+n` of the
/// batch.
struct AttnSeq<'a> {
    layer: &'a KvLayer,
    p0: usize,
    r0: usize,
    n: usize,
}

/// Attention of every sequence's new query rows over its own cached keys and values of
/// one layer, writing `n_rows × (n_head · head_dim_v)` values to `out` (rows in batch
/// order).
///
/// Query head `h` reads KV head `h / (n_head / n_head_kv)` (GQA). Row at position `p` sees
/// keys `0..=p` (causal), and with a `window` > 0 only keys `t` with `p - t < window`
/// (llama.cpp `LLAMA_SWA_TYPE_STANDARD`). Scores are scaled by `attn_scale`, soft-capped
/// (`c · tanh(s / c)`, gemma2) and given the ALiBi bias where the model has them,
/// softmaxed (with the head's sink logit in the denominator where the layer has
/// `attn_sinks`: gpt-oss), and the values summed in position order.
///
/// Work is split over (sequence, KV head, block of [`ATTN_ROWS_PER_TASK`] query rows),
/// or per query head for blocks of fewer than 4 rows (decode) when there are too few
/// sequences to occupy the threads otherwise, largest tasks first. A
/// task reads the keys and values its block can see in place (f16 widened in registers),
/// taking its (query head, row) pairs four at a time, each key and value row loaded once
/// for the four: scores ([`dot_multi_keys`]) and weighted value sums ([`weighted_sum_multi`]); a
/// decode step's four are the query heads that share a KV head. Each output element
/// is the same sequence of operations whatever the block, the chunk, the batch or the
/// thread: scores in `dot`'s order, one softmax over the visible keys, values
/// accumulated in key order.
fn attention(
    c: &crate::config::ModelConfig,
    seqs: &[AttnSeq<'_>],
    q: &[f32],
    window: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let (hd_k, hd_v) = (c.head_dim_k, c.head_dim_v);
    let group = c.n_head / c.n_head_kv;
    let row_out = c.n_head * hd_v;
    // Keys visible from position `pos`: first_key(pos)..=pos.
    let first_key = |pos: usize| {
        if window > 0 {
            (pos + 1).saturating_sub(window)
        } else {
            0
        }
    };
    // Tasks: (sequence, first query head, heads, first row within the sequence).
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
    // Enough sequences to keep every thread busy with one task per KV head: then each KV
    // row is widened once for all the heads that read it, even for one-row blocks.
    let many = seqs.len() * c.n_head_kv >= 2 * crate::pool::threads();
    for (si, s) in seqs.iter().enumerate() {
        for i0 in (0..s.n).step_by(ATTN_ROWS_PER_TASK) {
            if s.n - i0 >= 4 || many {
                tasks.extend((0..c.n_head_kv).map(|g| (si, g * group, group, i0)));
            } else {
                tasks.extend((0..c.n_head).map(|h| (si, h, 1, i0)));
            }
        }
    }
    let work = |&(si, _, heads, i0): &(usize, usize, usize, usize)| {
        let s = &seqs[si];
        let i1 = (i0 + ATTN_ROWS_PER_TASK).min(s.n);
        heads * (s.p0 + i1 - first_key(s.p0 + i0)) * (i1 - i0)
    };
    tasks.sort_by_key(|t| std::cmp::Reverse(work(t)));
    // A raw score q·k of head h with key position t: scaled, soft-capped (gemma2), plus
    // the ALiBi bias (bloom).
    let score = |raw: f32, h: usize, t: usize| {
        let mut s = raw * c.attn_scale;
        if let Some(cap) = c.attn_softcap {
            s = cap * (s / cap).tanh();
        }
        if let Some(slope) = c.alibi_slopes.get(h) {
            s += slope * t as f32;
        }
        s
    };
    let outs = Disjoint::new(out);
    crate::pool::run(tasks.len(), &|task| {
        let (si, h0, heads, i0) = tasks[task];
        let AttnSeq { layer, p0, r0, n } = seqs[si];
        let i1 = (i0 + ATTN_ROWS_PER_TASK).min(n);
        let nr = i1 - i0;
        let g = h0 / group;
        ATTN_SCORES.with_borrow_mut(|scores| {
            let (t0, t1) = (first_key(p0 + i0), p0 + i1); // keys t0..t1 are read
            let span = t1 - t0;
            // KV head g's keys and values of positions t0.., read in place.
            let keys = layer.k.rows(t0 * c.k_dim() + g * hd_k, c.k_dim());
            let values = layer.v.rows(t0 * c.v_dim() + g * hd_v, c.v_dim());
            // The task's units are its (query head, row) pairs, head by head: unit `u` is
            // head `h0 + u / nr`, row `u % nr` of the block. Units go through the kernels
            // up to four at a time, sharing each key and value row they load (a decode
            // step's units are the heads of one KV head).
            let units = heads * nr;
            let head = |u: usize| h0 + u / nr;
            // Unit u sees keys lo(u)..hi(u), relative to t0.
            let lo = |u: usize| first_key(p0 + i0 + u % nr) - t0;
            let hi = |u: usize| p0 + i0 + u % nr + 1 - t0;
            let qrow = |u: usize| &q[(r0 + i0 + u % nr) * c.q_dim() + head(u) * hd_k..][..hd_k];
            scores.resize(units * span, 0.0);
            for c0 in (0..units).step_by(4) {
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

thread_local! {
    /// Per-thread scores of an attention task: one row of its visible keys per unit.
    static ATTN_SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The experts one row chooses and their weights: the one routing rule of every MoE
/// architecture (llama.cpp `llm_graph_context::build_moe_ffn`; transformers
/// `Qwen2MoeSparseMoeBlock.forward`, `DeepseekV3TopkRouter`), its variants as parameters:
///
/// 1. scores: softmax of the router logits, or a sigmoid per expert ([`Gating`]);
/// 2. selection scores: the scores plus `selection_bias` where there is one (deepseek v3's
///    correction bias: used for choosing only, never as a weight);
/// 3. group-limited routing (`n_group > 0`): each group of `n_expert / n_group` experts
///    is ranked by the sum of its two best selection scores, and only the experts of the
///    best `n_group_used` groups stay eligible;
/// 4. the `n_used` best eligible selection scores (ties to the lower index), in
///    descending order;
/// 5. weights: their scores, renormalised to sum 1 where `norm_topk`, times
///    `weights_scale`.
pub fn route(logits: &[f32], selection_bias: Option<&[f32]>, mc: &MoeConfig) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    match mc.gating {
        Gating::Softmax => softmax(&mut p),
        Gating::Sigmoid => p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
    }
    let choice: Vec<f32> = match selection_bias {
        Some(b) => p.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => p.clone(),
    };
    let mut eligible = vec![true; p.len()];
    if let Some(per) = p.len().checked_div(mc.n_group) {
        let group_score = |g: usize| {
            let mut s: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
            s.sort_by(|a, b| b.total_cmp(a));
            s.iter().take(2).sum::<f32>()
        };
        let mut groups: Vec<usize> = (0..mc.n_group).collect();
        groups.sort_by(|&a, &b| group_score(b).total_cmp(&group_score(a)).then(a.cmp(&b)));
        eligible.iter_mut().for_each(|e| *e = false);
        for &g in &groups[..mc.n_group_used] {
            eligible[g * per..(g + 1) * per]
                .iter_mut()
                .for_each(|e| *e = true);
        }
    }
    let mut idx: Vec<usize> = (0..p.len()).filter(|&e| eligible[e]).collect();
    idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    idx.truncate(mc.n_used);
    let mut w: Vec<f32> = idx.iter().map(|&e| p[e]).collect();
    if mc.norm_topk {
        let sum: f32 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= sum);
    }
    if mc.weights_scale != 1.0 {
        w.iter_mut().for_each(|v| *v *= mc.weights_scale);
    }
    idx.into_iter().zip(w).collect()
}
