//! The forward pass: one loop over the layer plan ([`crate::plan::Plan`]), each layer's
//! token mixer and channel mixer computed by its block ([`crate::blocks`]).
//!
//! Per layer (llama.cpp `src/models/*.cpp`, names as llama.cpp's graph names the
//! intermediates): `attn_norm` → token mixer (attention, a state-space scan, a short
//! convolution) (→ post-attention norm) → residual; `ffn_norm` → channel mixer (dense FFN,
//! experts) (→ post-FFN norm) → residual (or both mixers from one normed input: the
//! parallel residual). Then the output norm and the LM head on the rows whose logits are
//! wanted.

use crate::arch::Norm;
use crate::blocks::attention::AttnScratch;
use crate::blocks::{FfnWeights, MixerWeights, Rows};
use crate::error::{ModelError, Result};
use crate::kernels::{add_bias, layer_norm, matmul, matrix_row, rms_norm, Matrix, Projection};
use crate::kv::KvPool;
use crate::lora::LoraRows;
use crate::model::{LayerWeights, Model, NormWeights};
use crate::plan::{Channel, LayerPlan, Mixer, Residual};
use crate::state::SeqState;

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

impl Logits {
    /// What a call evaluating tokens `offset .. offset + len` of `total` asks for, when
    /// the whole call asks for `self` (a long input evaluated in pieces).
    pub fn piece(self, offset: usize, len: usize, total: usize) -> Logits {
        match self {
            Logits::All => Logits::All,
            Logits::Hidden => Logits::Hidden,
            Logits::Last if offset + len == total => Logits::Last,
            Logits::From(i) if i < offset + len => Logits::From(i.saturating_sub(offset)),
            _ => Logits::None,
        }
    }
}

impl Model {
    /// Matrix `w` of this model with its stored bytes, writing into `out`.
    pub(crate) fn projection<'a>(&'a self, w: &'a Matrix, out: &'a mut [f32]) -> Projection<'a> {
        Projection {
            w,
            data: self.weight(w),
            out,
        }
    }

    /// The model's norm (RMSNorm or LayerNorm, [`crate::arch::Norm`]) of each
    /// `weight.len()`-sized row of `x` in place, plus the bias when there is one.
    pub(crate) fn norm(&self, x: &mut [f32], nw: &NormWeights) {
        match self.config.plan.norm {
            Norm::Rms => rms_norm(x, &nw.weight, self.config.norm_eps),
            Norm::Layer => layer_norm(x, &nw.weight, self.config.norm_eps),
        }
        if let Some(b) = &nw.bias {
            add_bias(x, b);
        }
    }

    /// Layer `il`'s channel mixer on `input` (`n × n_embd`), into `out`: a dense FFN or
    /// experts, as `lp` plans it. `gate` and `up` are scratch.
    #[allow(clippy::too_many_arguments)]
    fn channel_mixer(
        &self,
        il: usize,
        lp: &LayerPlan,
        lw: &LayerWeights,
        input: &[f32],
        n: usize,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        out: &mut [f32],
        lora: &LoraRows,
    ) -> Result<()> {
        match (lp.channel, &lw.ffn) {
            (Channel::Dense(kind, act), FfnWeights::Dense(d)) => self.dense_ffn(
                d,
                kind,
                act,
                self.config.n_ff_layers[il],
                input,
                n,
                gate,
                up,
                out,
                None,
                lora,
            ),
            (Channel::Moe(act), FfnWeights::Moe(m)) => {
                self.moe_ffn(il, m, act, input, n, out, lora)
            }
            _ => Err(plan_mismatch(il)),
        }
    }

    /// Layer `il`'s token mixer `mixer` (weights `w`) on `input` (`n × n_embd`, the batch's
    /// rows), advancing each sequence's state; its output into `out` (`n × n_embd`).
    #[allow(clippy::too_many_arguments)]
    fn token_mixer(
        &self,
        il: usize,
        mixer: &Mixer,
        w: &MixerWeights,
        seqs: &mut [Sequence<'_>],
        rows: &Rows<'_>,
        input: &[f32],
        scratch: &mut AttnScratch,
        out: &mut [f32],
        lora: &LoraRows,
        mut pool: Option<&mut KvPool>,
    ) -> Result<()> {
        match (mixer, w) {
            (Mixer::Attention(ap), MixerWeights::Attention(aw)) => {
                self.attention_block(il, ap, aw, seqs, rows, input, scratch, out, lora, pool)
            }
            (Mixer::Mamba, MixerWeights::Mamba(w)) => {
                self.mamba_block(il, w, seqs, rows, input, out)
            }
            (Mixer::Mamba2 { .. }, MixerWeights::Mamba2(w)) => {
                self.mamba2_block(il, w, seqs, rows, input, out)
            }
            (Mixer::ShortConv, MixerWeights::ShortConv(w)) => {
                self.short_conv_block(il, w, seqs, rows, input, out)
            }
            (Mixer::GatedDeltaNet, MixerWeights::GatedDeltaNet(w)) => {
                self.delta_net_block(il, w, seqs, rows, input, out)
            }
            (Mixer::Parallel(ma, mb), MixerWeights::Parallel(wa, wb)) => {
                // Both on the same input: out = first + second (falcon-h1's attention +
                // Mamba-2, llama.cpp falcon-h1.cpp).
                let mut second = vec![0f32; out.len()];
                let p = pool.as_deref_mut();
                self.token_mixer(il, ma, wa, seqs, rows, input, scratch, out, lora, p)?;
                self.token_mixer(
                    il,
                    mb,
                    wb,
                    seqs,
                    rows,
                    input,
                    scratch,
                    &mut second,
                    lora,
                    pool,
                )?;
                out.iter_mut().zip(&second).for_each(|(o, s)| *o += s);
                Ok(())
            }
            _ => Err(plan_mismatch(il)),
        }
    }

    /// Checks that `tokens` fit after what `state` holds and are all in the vocabulary,
    /// and that `state` was made for this model: the one predicate behind every
    /// evaluation, run before anything is written.
    ///
    /// Errors: [`ModelError::ContextFull`], [`ModelError::TokenOutOfRange`],
    /// [`ModelError::Unsupported`] for a state of another model's layers.
    pub fn check_input(&self, state: &SeqState, tokens: &[u32]) -> Result<()> {
        if !state.fits(&self.config) {
            return Err(ModelError::Unsupported(
                "a sequence state made for another model's layers".into(),
            ));
        }
        let needed = state.n_past + tokens.len();
        if needed > state.n_ctx {
            return Err(ModelError::ContextFull {
                needed,
                n_ctx: state.n_ctx,
            });
        }
        if needed > state.capacity() {
            return Err(ModelError::KvBlocks {
                needed,
                held: state.capacity(),
            });
        }
        if !tokens.is_empty() && !state.window_reaches(state.n_past) {
            return Err(ModelError::WindowRows {
                first: (state.n_past + 1).saturating_sub(state.window),
                held_from: state.window_held_from(),
            });
        }
        let n_vocab = self.config.n_vocab;
        match tokens.iter().find(|&&t| t as usize >= n_vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// Evaluates `tokens` at positions `state.n_past ..`, appends them to `state` (keys and
    /// values, recurrent states), and returns the requested logits (row-major
    /// `[rows][n_vocab]`).
    ///
    /// The one-sequence case of [`Model::forward_batch`].
    ///
    /// Errors: [`ModelError::ContextFull`] if the tokens would pass the state's size,
    /// [`ModelError::TokenOutOfRange`] for an id outside the vocabulary; both are checked
    /// before anything is written to the state.
    pub fn forward(
        &self,
        state: &mut SeqState,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>> {
        // A state with a sliding-window ring takes at most `max_step` rows a step: longer
        // inputs are evaluated in pieces (the same bits: a row's do not depend on the
        // rows beside it).
        let step = state.max_step();
        if tokens.len() > step {
            self.check_input(state, tokens)?;
            let mut out = Vec::new();
            for (i, piece) in tokens.chunks(step).enumerate() {
                let want = logits.piece(i * step, piece.len(), tokens.len());
                out.extend(self.forward(state, piece, want)?);
            }
            return Ok(out);
        }
        self.forward_one(None, state, tokens, logits)
    }

    /// [`Model::forward`] for a sequence whose keys and values live in `pool`
    /// ([`SeqState::pooled`]): the one-sequence case of [`Model::forward_batch_in`].
    ///
    /// Errors: those of [`Model::forward_batch_in`].
    pub fn forward_pooled(
        &self,
        pool: &mut crate::KvPool,
        state: &mut SeqState,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>> {
        self.forward_one(Some(pool), state, tokens, logits)
    }

    /// One sequence of plain tokens through [`Model::forward_batch_in`].
    fn forward_one(
        &self,
        pool: Option<&mut crate::KvPool>,
        state: &mut SeqState,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>> {
        let mut seqs = [Sequence {
            state,
            tokens,
            logits,
            lora: None,
            embd: &[],
            rope_shift: 0,
            token_types: &[],
        }];
        Ok(self
            .forward_batch_in(pool, &mut seqs)?
            .pop()
            .unwrap_or_default())
    }

    /// Evaluates several sequences in one pass: each sequence's `tokens` at positions
    /// `state.n_past ..` of its own state, appending to it. Returns each sequence's
    /// requested logits (row-major `[rows][n_vocab]`), in order.
    ///
    /// The rows of all sequences share each projection (one matrix product per weight per
    /// call, reading each weight once: continuous batching), while attention reads each
    /// sequence's own cache and a recurrent layer advances each sequence's own state. A
    /// row's result depends only on its token, its position and its sequence's state,
    /// never on the other rows or sequences of the call, nor on the thread count: the same
    /// bits alone, in a batch, in a prefill chunk of any size or as a single decode step
    /// (tests/batch_invariance.rs).
    ///
    /// Errors: those of [`Model::check_input`], checked for every sequence before anything
    /// is written to any state.
    pub fn forward_batch(&self, seqs: &mut [Sequence<'_>]) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_in(None, seqs)
    }

    /// [`Model::forward_batch`] where sequences may keep their keys and values in `pool`
    /// ([`SeqState::pooled`]: written and read through their block tables, with the
    /// same bits as in a cache of their own). Each pooled sequence must hold blocks for
    /// its new positions, and a block it writes must be no other sequence's.
    ///
    /// Errors: as [`Model::forward_batch`]; [`ModelError::KvBlocks`] for a pooled
    /// sequence without `pool` or without blocks for its new positions.
    pub fn forward_batch_in(
        &self,
        mut pool: Option<&mut KvPool>,
        seqs: &mut [Sequence<'_>],
    ) -> Result<Vec<Vec<f32>>> {
        self.check_batch(pool.is_some(), seqs)?;
        // Row ranges of the sequences in the batch, and each row's position.
        let mut starts = Vec::with_capacity(seqs.len() + 1);
        let mut pos = Vec::new();
        starts.push(0);
        for s in seqs.iter() {
            pos.extend((0..s.tokens.len()).map(|i| s.state.n_past + i));
            starts.push(pos.len());
        }
        if pos.is_empty() {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let rope_pos = self.mrope_positions(seqs)?;
        let rows = Rows {
            starts: &starts,
            pos: &pos,
            rope_pos: &rope_pos,
        };
        // Each sequence's adapters (the model's default scales unless it names its own),
        // grouped by adapter over the batch's rows.
        let defaults: Vec<(usize, f32)> = self.lora_scales.iter().copied().enumerate().collect();
        let sets: Vec<&[(usize, f32)]> = seqs.iter().map(|s| s.lora.unwrap_or(&defaults)).collect();
        let lora = LoraRows::new(&sets, &rows);

        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let mut x = self.embed_rows(&tokens, &pos, &lora, seqs, &starts)?;
        // Gemma 4's per-layer inputs, once for all layers.
        let ple_inputs = match &self.weights.ple {
            Some(p) => Some(self.ple_inputs(p, &tokens, &x)?),
            None => None,
        };
        let mut bufs = LayerBufs::new(x.len());
        for il in 0..self.config.plan.layers.len() {
            let at = LayerAt {
                il,
                rows: &rows,
                lora: &lora,
                ple_inputs: ple_inputs.as_deref(),
            };
            self.layer(&at, seqs, &mut x, &mut bufs, pool.as_deref_mut())?;
        }
        for s in seqs.iter_mut() {
            s.state.advance(s.tokens.len());
        }
        self.outputs(seqs, &rows, &x, &lora)
    }

    /// The checks of [`Model::forward_batch_in`] on every sequence, before anything is
    /// written: its input ([`Model::check_input`]), a windowed state's step size, and a
    /// pooled state's pool.
    fn check_batch(&self, have_pool: bool, seqs: &[Sequence<'_>]) -> Result<()> {
        for s in seqs {
            self.check_input(s.state, s.tokens)?;
            if s.tokens.len() > s.state.max_step() {
                return Err(ModelError::WindowStep {
                    rows: s.tokens.len(),
                    max: s.state.max_step(),
                });
            }
            self.check_embd(s)?;
            self.check_encoder_input(s)?;
            if s.state.is_pooled() && !have_pool {
                return Err(ModelError::KvBlocks {
                    needed: s.state.n_past + s.tokens.len(),
                    held: 0,
                });
            }
        }
        Ok(())
    }

    /// An encoder's input ([`crate::arch::ArchSpec::encoder`]): whole, from an empty state
    /// (its rows see each other both ways), hidden states asked for, token types one per
    /// token where given; elsewhere no token types.
    fn check_encoder_input(&self, s: &Sequence<'_>) -> Result<()> {
        if !s.token_types.is_empty() && s.token_types.len() != s.tokens.len() {
            return Err(ModelError::Unsupported(format!(
                "{} token types for {} tokens",
                s.token_types.len(),
                s.tokens.len()
            )));
        }
        if !self.config.plan.encoder {
            return match s.token_types.iter().any(|&t| t != 0) {
                true => Err(ModelError::Unsupported(format!(
                    "token types on a {} model",
                    self.config.arch.name
                ))),
                false => Ok(()),
            };
        }
        if s.state.n_past != 0 && !s.tokens.is_empty() {
            return Err(ModelError::Unsupported(format!(
                "an encoder ({}) evaluates its whole input in one call from an empty state \
                 ({} positions already held)",
                self.config.arch.name, s.state.n_past
            )));
        }
        if !matches!(s.logits, Logits::Hidden | Logits::None) {
            return Err(ModelError::Unsupported(format!(
                "an encoder ({}) gives hidden states, not logits",
                self.config.arch.name
            )));
        }
        Ok(())
    }

    /// Every row's multimodal RoPE positions, sequence after sequence
    /// ([`crate::rope::mrope_positions`]; empty for a model with plain RoPE, where a
    /// sequence's [`Sequence::rope_shift`] must be 0).
    ///
    /// Errors: [`ModelError::Unsupported`] for a shift or image grid that does not fit.
    fn mrope_positions(&self, seqs: &[Sequence<'_>]) -> Result<Vec<[usize; 3]>> {
        let d = self.config.n_embd;
        let Some(_) = self.config.rope_sections else {
            return match seqs.iter().find(|s| s.rope_shift != 0) {
                Some(s) => Err(ModelError::Unsupported(format!(
                    "a RoPE shift ({}) on a model without multimodal RoPE",
                    s.rope_shift
                ))),
                None => Ok(Vec::new()),
            };
        };
        let mut out = Vec::new();
        for s in seqs {
            let images: Vec<_> = s
                .embd
                .iter()
                .filter_map(|e| Some((e.at, e.n(d), e.grid?)))
                .collect();
            let n = s.tokens.len();
            let p = crate::rope::mrope_positions(s.state.n_past, n, s.rope_shift, &images)
                .map_err(|e| ModelError::Unsupported(format!("multimodal RoPE: {e}")))?;
            out.extend(p);
        }
        Ok(out)
    }

    /// A sequence's rows given as embeddings: whole rows of this model's width, inside
    /// its tokens, in order and not overlapping, on a model whose layers read nothing but
    /// the embedding rows of them (not Gemma 4's per-layer token inputs).
    fn check_embd(&self, s: &Sequence<'_>) -> Result<()> {
        let d = self.config.n_embd;
        let mut end = 0;
        for e in s.embd {
            let n = e.n(d);
            if n == 0 || e.rows.len() != n * d || e.at < end || e.at + n > s.tokens.len() {
                return Err(ModelError::Unsupported(format!(
                    "embedding rows at {} ({} values) do not fit {} tokens of width {d} \
                     after row {end}",
                    e.at,
                    e.rows.len(),
                    s.tokens.len()
                )));
            }
            end = e.at + n;
        }
        if !s.embd.is_empty() && self.weights.ple.is_some() {
            return Err(ModelError::Unsupported(
                "embedding rows on a model with per-layer token inputs".into(),
            ));
        }
        Ok(())
    }

    /// `inp_embd`: the tokens' embedding rows (+ the adapters' deltas; × sqrt(n_embd) for
    /// gemma, × embedding_scale for granite; + an encoder's position and token-type rows),
    /// then bloom's and BERT's `token_embd_norm`.
    /// `[tokens.len()][n_embd]`.
    fn embed_rows(
        &self,
        tokens: &[u32],
        pos: &[usize],
        lora: &LoraRows,
        seqs: &[Sequence<'_>],
        starts: &[usize],
    ) -> Result<Vec<f32>> {
        let (c, w) = (&self.config, &self.weights);
        let mut x = vec![0f32; tokens.len() * c.n_embd];
        for (row, &t) in x.chunks_exact_mut(c.n_embd).zip(tokens) {
            matrix_row(&w.token_embd, self.weight(&w.token_embd), t as usize, row)?;
        }
        self.lora_embed(tokens, lora, &mut x)?;
        if c.embed_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embed_scale);
        }
        // An encoder's position and token-type rows, before its embedding norm.
        if let Some(e) = &w.encoder {
            let types: Vec<u32> = seqs
                .iter()
                .flat_map(|s| match s.token_types.is_empty() {
                    true => vec![0; s.tokens.len()],
                    false => s.token_types.to_vec(),
                })
                .collect();
            self.add_encoder_rows(e, pos, &types, &mut x)?;
        }
        if let Some(nw) = &w.token_embd_norm {
            self.norm(&mut x, nw);
        }
        // Rows given as embeddings (checked by `check_batch`).
        for (s, &r0) in seqs.iter().zip(starts) {
            for e in s.embd {
                x[(r0 + e.at) * c.n_embd..][..e.rows.len()].copy_from_slice(e.rows);
            }
        }
        self.tap("inp_embd", None, pos, &x);
        Ok(x)
    }

    /// Layer `at.il` over the batch's rows: the residual stream `x` (`[rows][n_embd]`)
    /// becomes the layer's output (`l_out`).
    fn layer(
        &self,
        at: &LayerAt<'_>,
        seqs: &mut [Sequence<'_>],
        x: &mut [f32],
        b: &mut LayerBufs,
        pool: Option<&mut KvPool>,
    ) -> Result<()> {
        let (il, c) = (at.il, &self.config);
        let (lp, lw) = (&c.plan.layers[il], &self.weights.layers[il]);
        let (n, pos) = (at.rows.pos.len(), at.rows.pos);
        // attn_norm (post-norm-only architectures read the residual stream itself).
        b.cur.copy_from_slice(x);
        if let Some(nw) = &lw.attn_norm {
            self.norm(&mut b.cur, nw);
        }
        self.tap("attn_norm", Some(il), pos, &b.cur);
        // A parallel block's FFN reads the token mixer's normed input.
        if lp.residual == Residual::Parallel {
            b.ffn_out.resize(x.len(), 0.0);
            self.channel_mixer(
                il,
                lp,
                lw,
                &b.cur,
                n,
                &mut b.gate,
                &mut b.up,
                &mut b.ffn_out,
                at.lora,
            )?;
            self.tap("ffn_out", Some(il), pos, &b.ffn_out);
        }
        self.token_mixer(
            il,
            &lp.mixer,
            &lw.mixer,
            seqs,
            at.rows,
            &b.cur,
            &mut b.scratch,
            &mut b.mixed,
            at.lora,
            pool,
        )?;
        let after_residual = lp.norms.after_residual;
        if let Some(nw) = lw.post_attn_norm.as_ref().filter(|_| !after_residual) {
            self.norm(&mut b.mixed, nw);
        }
        if c.residual_scale != 1.0 {
            b.mixed.iter_mut().for_each(|v| *v *= c.residual_scale);
        }
        self.tap("attn_out", Some(il), pos, &b.mixed);
        if lp.residual == Residual::Parallel {
            // falcon: l_out = (ffn + attention) + residual.
            x.iter_mut()
                .zip(b.mixed.iter().zip(&b.ffn_out))
                .for_each(|(a, (m, f))| *a += f + m);
        } else {
            // ffn_inp = residual + token mixer
            x.iter_mut().zip(&b.mixed).for_each(|(a, m)| *a += m);
            // BERT: its norm after the add.
            if let Some(nw) = lw.post_attn_norm.as_ref().filter(|_| after_residual) {
                self.norm(x, nw);
            }
        }
        if lp.residual == Residual::Sequential && lp.channel != Channel::None {
            self.tap("ffn_inp", Some(il), pos, x);
            b.ffn_in.copy_from_slice(x);
            if let Some(nw) = &lw.ffn_norm {
                self.norm(&mut b.ffn_in, nw);
            }
            self.tap("ffn_norm", Some(il), pos, &b.ffn_in);
            self.channel_mixer(
                il,
                lp,
                lw,
                &b.ffn_in,
                n,
                &mut b.gate,
                &mut b.up,
                &mut b.cur,
                at.lora,
            )?;
            if let Some(nw) = lw.post_ffn_norm.as_ref().filter(|_| !after_residual) {
                self.norm(&mut b.cur, nw);
            }
            if c.residual_scale != 1.0 {
                b.cur.iter_mut().for_each(|v| *v *= c.residual_scale);
            }
            self.tap("ffn_out", Some(il), pos, &b.cur);
            // l_out
            x.iter_mut().zip(&b.cur).for_each(|(a, f)| *a += f);
            if let Some(nw) = lw.post_ffn_norm.as_ref().filter(|_| after_residual) {
                self.norm(x, nw);
            }
        }
        // Gemma 4: the per-layer embedding block, then the layer's output scale.
        if let (Some(p), Some(inputs)) = (&lw.ple, at.ple_inputs) {
            self.ple_layer(il, p, inputs, x, n)?;
        }
        if let Some(s) = lw.out_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        self.tap("l_out", Some(il), pos, x);
        Ok(())
    }

    /// Each sequence's output from the last layer's rows `x`: its hidden states after the
    /// output norm (`Logits::Hidden`: the same norm, row by row, as the LM head's input),
    /// or its wanted rows' logits (`[rows][n_vocab]`) from one LM-head product over every
    /// wanted row of the batch.
    fn outputs(
        &self,
        seqs: &[Sequence<'_>],
        rows: &Rows<'_>,
        x: &[f32],
        lora: &LoraRows,
    ) -> Result<Vec<Vec<f32>>> {
        let (c, w) = (&self.config, &self.weights);
        let (d, n, starts) = (c.n_embd, rows.pos.len(), rows.starts);
        let mut hidden: Vec<Option<Vec<f32>>> = vec![None; seqs.len()];
        for (si, s) in seqs.iter().enumerate() {
            if s.logits == Logits::Hidden {
                let mut h = x[starts[si] * d..starts[si + 1] * d].to_vec();
                if let Some(nw) = &w.output_norm {
                    self.norm(&mut h, nw);
                }
                hidden[si] = Some(h);
            }
        }
        // The rows whose logits are wanted, gathered for one LM-head product.
        let mut wanted: Vec<(usize, usize)> = Vec::with_capacity(seqs.len()); // (first, count)
        let mut wanted_rows = Vec::new();
        let mut wanted_pos = Vec::new();
        // Batch row → its index among the wanted rows (for the adapters of the LM head).
        let mut wanted_at: Vec<Option<usize>> = vec![None; n];
        for (si, s) in seqs.iter().enumerate() {
            let (r0, r1) = (starts[si], starts[si + 1]);
            let from = match s.logits {
                Logits::None | Logits::Hidden => r1,
                Logits::Last => r1.saturating_sub(1).max(r0),
                Logits::All => r0,
                Logits::From(i) => (r0 + i).min(r1),
            };
            let first = wanted_rows.len() / d;
            wanted.push((first, r1 - from));
            (from..r1).for_each(|r| wanted_at[r] = Some(first + r - from));
            wanted_rows.extend_from_slice(&x[from * d..r1 * d]);
            wanted_pos.extend_from_slice(&rows.pos[from..r1]);
        }
        let lora_head = lora.select(&wanted_at);
        // Each sequence's output: its hidden states, or its rows of the LM head's product.
        let outputs = |mut per_seq: Vec<Vec<f32>>| -> Vec<Vec<f32>> {
            for (o, h) in per_seq.iter_mut().zip(hidden) {
                if let Some(h) = h {
                    *o = h;
                }
            }
            per_seq
        };
        let n_rows = wanted_rows.len() / d;
        // The LM head's product: into the caller's vector for one sequence, else into a
        // reused per-thread buffer split per sequence afterwards (a fresh multi-megabyte
        // buffer per decode step cost 13% of an 8-sequence step in page faults).
        let mut logits_of = |out: &mut [f32]| -> Result<()> {
            if n_rows > 0 {
                if let Some(nw) = &w.output_norm {
                    self.norm(&mut wanted_rows, nw);
                }
                self.tap("result_norm", None, &wanted_pos, &wanted_rows);
                matmul(&w.output, self.weight(&w.output), &wanted_rows, n_rows, out)?;
                self.lora_add(&w.output, &wanted_rows, &lora_head, out)?;
                if c.logit_scale != 1.0 {
                    out.iter_mut().for_each(|v| *v /= c.logit_scale);
                }
                if let Some(cap) = c.final_softcap {
                    out.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
                }
            }
            Ok(())
        };
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

/// What one layer of a [`Model::forward_batch_in`] call reads besides its buffers.
struct LayerAt<'a> {
    il: usize,
    rows: &'a Rows<'a>,
    lora: &'a LoraRows,
    /// Gemma 4's per-layer inputs of every layer.
    ple_inputs: Option<&'a [f32]>,
}

/// The buffers the layers of one call reuse (`[rows][n_embd]` each, the FFN's sized as
/// it runs).
struct LayerBufs {
    cur: Vec<f32>,
    mixed: Vec<f32>,
    ffn_in: Vec<f32>,
    ffn_out: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scratch: AttnScratch,
}

impl LayerBufs {
    fn new(len: usize) -> LayerBufs {
        LayerBufs {
            cur: vec![0f32; len],
            mixed: vec![0f32; len],
            ffn_in: vec![0f32; len],
            ffn_out: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            scratch: AttnScratch::default(),
        }
    }
}

thread_local! {
    /// The LM head's output of a multi-sequence call, reused across calls.
    static LOGITS_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The error of a layer whose weights are not of the kind its plan names (weights
/// changed after load).
fn plan_mismatch(il: usize) -> ModelError {
    ModelError::Unsupported(format!("layer {il}: weights of another kind than its plan"))
}

/// One sequence of a [`Model::forward_batch`] call.
pub struct Sequence<'a> {
    /// Its state: the tokens go at positions `state.n_past ..`.
    pub state: &'a mut SeqState,
    /// The tokens to evaluate (may be empty).
    pub tokens: &'a [u32],
    /// Which of its rows' logits to return.
    pub logits: Logits,
    /// Its LoRA adapters (index into [`Model::adapters`], user scale), or `None` for the
    /// model's defaults ([`Model::lora_scales`]).
    pub lora: Option<&'a [(usize, f32)]>,
    /// Rows of `tokens` given as embeddings instead (an image's rows), in order, not
    /// overlapping; empty for text alone.
    pub embd: &'a [EmbdRows<'a>],
    /// With multimodal RoPE ([`crate::ModelConfig::rope_sections`]): how far the images
    /// before `state.n_past` moved the positions back from the cache rows (the sum of
    /// their [`crate::rope::ImageGrid::shift`]s; the caller keeps it, as transformers keeps
    /// `rope_deltas`). 0 for text alone and for every other model.
    pub rope_shift: usize,
    /// Each token's type (segment) for an encoder with a token-type table: 0 for the first
    /// text of a pair, 1 for the second (transformers `token_type_ids`); empty: all 0.
    pub token_types: &'a [u32],
}

/// Rows of a sequence's input given as embeddings, not token ids (an image's rows from a
/// projector, llama.cpp's `llama_batch.embd`): they replace the embedding rows of
/// `tokens[at .. at + n]` (placeholder ids) as they are, without the embedding scale
/// (llama.cpp `src/models/gemma3.cpp` scales token rows only; transformers scatters the
/// image features after `embed_tokens`' scale).
#[derive(Clone, Copy, Debug)]
pub struct EmbdRows<'a> {
    /// The first row of the call's `tokens` they replace.
    pub at: usize,
    /// `n × n_embd` values.
    pub rows: &'a [f32],
    /// Whether these rows see each other both ways in attention (transformers Gemma 3's
    /// `token_type_ids` mask; llama.cpp `mtmd_decode_use_non_causal`); they still see the
    /// rows before them and only those. All of them must be in the same call.
    pub bidirectional: bool,
    /// Where they sit in their image's grid, for a model with multimodal RoPE (`None`:
    /// positions as text rows; ignored by other models).
    pub grid: Option<crate::rope::ImageGrid>,
}

impl EmbdRows<'_> {
    /// Their number of rows for a model of width `n_embd`.
    pub fn n(&self, n_embd: usize) -> usize {
        self.rows.len() / n_embd.max(1)
    }
}
