//! [`SeqState`]: everything one sequence carries between calls of the forward pass, sized
//! by the model's [`crate::plan::Plan`]: for each attention layer its keys and values (the
//! KV cache), for each recurrent layer its convolution window and scan state.
//!
//! The two kinds differ in what they allow: a KV cache holds every position separately, so
//! it can be cut back to any prefix and a prefix can be copied to another sequence; a
//! recurrent state folds all positions into one value, so it can only be kept whole or
//! cleared. [`SeqState::reusable`] is the one rule that the scheduler, the sessions and
//! the benchmarks ask.

use crate::config::ModelConfig;
use crate::kv::{window_blocks, KvLayer, KvPool, KvType, EVICTED, KV_BLOCK, WINDOW_STEP};

/// A recurrent layer's state after the positions evaluated so far (f32).
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentLayer {
    /// The convolution's window: the last `taps - 1` inputs, oldest first, `channels`
    /// values each (zeros before the first position).
    pub conv: Vec<f32>,
    /// The scan's state: Mamba-1 `d_inner × d_state`, Mamba-2 `n_head × head_dim ×
    /// d_state`; empty for a short convolution.
    pub ssm: Vec<f32>,
}

/// One layer's part of a sequence's state: keys and values where the layer attends, a
/// recurrent state where it scans (both for falcon-h1's parallel mixers).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerState {
    /// Keys and values; row `p` holds position `p`.
    pub kv: Option<KvLayer>,
    pub recurrent: Option<RecurrentLayer>,
}

/// A sequence's recurrent state saved after its first `n_past` positions
/// ([`SeqState::checkpoint`]): what, with the KV cache of those positions, lets the
/// sequence continue from there ([`SeqState::restore`]). Holds no keys or values.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The positions the saved state has seen.
    pub n_past: usize,
    /// Per layer, its recurrent state (`None` for an attention layer).
    layers: Vec<Option<RecurrentLayer>>,
}

impl Checkpoint {
    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|r| (r.conv.len() + r.ssm.len()) * 4)
            .sum()
    }
}

/// The state of one sequence, sized for `n_ctx` positions.
///
/// Its keys and values are either its own (contiguous: row `p` holds position `p`) or
/// blocks of a shared [`KvPool`] named by its block table ([`SeqState::pooled`]: block
/// `i` of [`SeqState::blocks`] holds positions `16i .. 16i + 16`); the forward pass gives
/// the same bits either way.
///
/// A layer with a sliding window reads only the keys of its last `window` positions, so
/// its rows live apart where that saves memory: in a state of its own, a ring of
/// [`crate::kv::window_blocks`]`(window, WINDOW_STEP)` blocks (block `i` of the sequence in
/// ring block `i % ring`) once `n_ctx` is longer than that; in a pool with a window group,
/// blocks named by the window table, whose blocks behind the window its caller gives back
/// ([`EVICTED`]). Either way the state can be cut back only where the window's rows are
/// still held ([`SeqState::reusable`]).
///
/// Memory: per attention layer `n_ctx · (k_dim + v_dim)` elements of 2 (f16) or 4 (f32)
/// bytes (the ring's positions for a windowed layer; none for a pooled state: the pool
/// holds them); per recurrent layer a fixed number of f32 values, whatever the length.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqState {
    pub kv_type: KvType,
    pub n_ctx: usize,
    pub layers: Vec<LayerState>,
    /// A pooled state's block table (empty for a state with its own cache): the pool's
    /// owner edits it through [`SeqState::table_mut`], [`SeqState::adopt`] and
    /// [`SeqState::take_table`].
    pub(crate) blocks: Vec<u32>,
    /// Whether its keys and values live in a shared pool.
    pooled: bool,
    /// The longest sliding window of its layers ([`crate::plan::Plan::window`]; 0: none).
    pub window: usize,
    /// The block table of its windowed layers where they live apart (see above), else
    /// `None` (they use the main table, or row = position).
    window_table: Option<Vec<u32>>,
    /// Blocks of its own windowed layers' ring (0: none).
    ring: usize,
    /// Positions written since it was last cleared (a ring's blocks were overwritten up
    /// to there, also past a later cut).
    written: usize,
    /// Positions `0..n_past` have been evaluated ([`SeqState::n_past`]; advanced by the
    /// forward pass, cut by [`SeqState::truncate`], set by [`SeqState::adopt`]).
    pub(crate) n_past: usize,
}

/// The one rule of [`SeqState::table`]: a windowed layer's window table where there is
/// one, else a pooled state's main table, else none (row = position).
fn table_of<'a>(
    window_table: &'a Option<Vec<u32>>,
    blocks: &'a [u32],
    pooled: bool,
    windowed: bool,
) -> Option<&'a [u32]> {
    match window_table {
        Some(t) if windowed => Some(t),
        _ if pooled => Some(blocks),
        _ => None,
    }
}

/// Rows a layer with mixer `mixer` keeps in a state of `n_ctx` positions whose windowed
/// layers have a ring of `ring` blocks (0: none): whole blocks ([`KvLayer::rows_for`]).
fn layer_rows(mixer: &crate::plan::Mixer, ring: usize, n_ctx: usize) -> usize {
    KvLayer::rows_for(if ring > 0 && mixer.window() > 0 {
        ring * KV_BLOCK
    } else {
        n_ctx
    })
}

/// Ring blocks a state of `n_ctx` positions gives its layers of window `window` (0: none,
/// the ring would be no shorter than `n_ctx`).
fn ring_blocks(window: usize, n_ctx: usize) -> usize {
    let w = window_blocks(window, WINDOW_STEP);
    if window == 0 || w * KV_BLOCK >= n_ctx {
        0
    } else {
        w
    }
}

impl SeqState {
    /// Bytes the KV cache of one sequence of `n_ctx` positions takes (what
    /// [`SeqState::new`] allocates for its attention layers), or `None` when that does not
    /// fit in a `usize` (a context no machine holds).
    pub fn kv_bytes(config: &ModelConfig, n_ctx: usize, kv_type: KvType) -> Option<usize> {
        Self::kv_bytes_with(config, n_ctx, kv_type, true)
    }

    /// [`SeqState::kv_bytes`] were every layer to keep every position (no ring for the
    /// windowed layers): the layout it saves against.
    pub fn kv_bytes_all_positions(
        config: &ModelConfig,
        n_ctx: usize,
        kv_type: KvType,
    ) -> Option<usize> {
        Self::kv_bytes_with(config, n_ctx, kv_type, false)
    }

    fn kv_bytes_with(
        config: &ModelConfig,
        n_ctx: usize,
        kv_type: KvType,
        rings: bool,
    ) -> Option<usize> {
        let ring = if rings {
            ring_blocks(config.plan.window(), n_ctx)
        } else {
            0
        };
        // Per layer with a cache of its own (a KV-sharing layer reads its source's).
        config
            .plan
            .layers
            .iter()
            .filter_map(|l| Some((l, l.mixer.kv_dims(config.n_head_kv)?)))
            .try_fold(0usize, |sum, (l, (kd, vd))| {
                let row = kv_type.row_bytes(kd, vd)?;
                sum.checked_add(layer_rows(&l.mixer, ring, n_ctx).checked_mul(row)?)
            })
    }

    /// An empty state for `n_ctx` positions of the model described by `config`.
    pub fn new(config: &ModelConfig, n_ctx: usize, kv_type: KvType) -> SeqState {
        Self::with_kv(config, n_ctx, kv_type, None)
    }

    /// An empty state of at most `n_ctx` positions whose keys and values live in `pool`
    /// (its recurrent layers' states are its own): the caller gives it blocks
    /// ([`SeqState::blocks`]) before evaluating positions in them and passes the pool to
    /// the forward pass ([`crate::Model::forward_batch_in`]).
    pub fn pooled(config: &ModelConfig, n_ctx: usize, pool: &KvPool) -> SeqState {
        Self::with_kv(config, n_ctx, pool.kv_type, Some(pool))
    }

    fn with_kv(
        config: &ModelConfig,
        n_ctx: usize,
        kv_type: KvType,
        pool: Option<&KvPool>,
    ) -> SeqState {
        let pooled = pool.is_some();
        let window = config.plan.window();
        let ring = if pooled {
            0
        } else {
            ring_blocks(window, n_ctx)
        };
        let window_table = match pool {
            Some(p) => (p.n_window_blocks > 0).then(Vec::new),
            None => (ring > 0).then(|| {
                (0..SeqState::blocks_for(n_ctx))
                    .map(|i| (i % ring) as u32)
                    .collect()
            }),
        };
        let layers = config
            .plan
            .layers
            .iter()
            .map(|l| LayerState {
                kv: match (pooled, l.mixer.kv_dims(config.n_head_kv)) {
                    (false, Some(dims)) => Some(KvLayer::new(
                        kv_type,
                        layer_rows(&l.mixer, ring, n_ctx),
                        dims,
                        config.n_head_kv,
                    )),
                    _ => None,
                },
                recurrent: l.mixer.is_recurrent().then(|| {
                    let (conv, ssm) = crate::blocks::recurrent_sizes(config, &l.mixer);
                    RecurrentLayer {
                        conv: vec![0.0; conv],
                        ssm: vec![0.0; ssm],
                    }
                }),
            })
            .collect();
        SeqState {
            kv_type,
            n_ctx,
            layers,
            blocks: Vec::new(),
            pooled,
            window,
            window_table,
            ring,
            written: 0,
            n_past: 0,
        }
    }

    /// The block table of its windowed layers when they live apart from the others (a
    /// pool's window group, or its own ring), else `None`.
    pub fn window_table(&self) -> Option<&[u32]> {
        self.window_table.as_deref()
    }

    /// A pooled state's window table, for its caller to give it blocks and take back
    /// those behind the window ([`EVICTED`]); `None` without a window group (or for a
    /// ring, which is its own).
    pub fn window_table_mut(&mut self) -> Option<&mut Vec<u32>> {
        if self.pooled {
            self.window_table.as_mut()
        } else {
            None
        }
    }

    /// The block table through which a layer (`windowed`: with a sliding window) writes
    /// and reads its rows; `None` for row = position.
    pub fn table(&self, windowed: bool) -> Option<&[u32]> {
        table_of(&self.window_table, &self.blocks, self.pooled, windowed)
    }

    /// Most rows one forward step may add: what its ring holds beyond the window
    /// ([`crate::kv::window_blocks`]); unbounded without a ring.
    pub fn max_step(&self) -> usize {
        if self.ring == 0 {
            usize::MAX
        } else {
            ((self.ring - 1) * KV_BLOCK + 1).saturating_sub(self.window)
        }
    }

    /// The first position from which its windowed layers still hold every row: after the
    /// last block given back ([`EVICTED`]) of a pooled window table, past what a ring has
    /// overwritten; 0 when nothing was dropped.
    pub fn window_held_from(&self) -> usize {
        match &self.window_table {
            None => 0,
            Some(t) if self.pooled => t
                .iter()
                .rposition(|&b| b == EVICTED)
                .map_or(0, |i| (i + 1) * KV_BLOCK),
            Some(_) => self.written.div_ceil(KV_BLOCK).saturating_sub(self.ring) * KV_BLOCK,
        }
    }

    /// Whether a row at position `p` can be evaluated after the rows held: its windowed
    /// layers hold the `window - 1` positions before it.
    pub fn window_reaches(&self, p: usize) -> bool {
        p.saturating_sub(self.window.saturating_sub(1)) >= self.window_held_from()
    }

    /// Whether its keys and values live in a shared pool ([`SeqState::pooled`]).
    pub fn is_pooled(&self) -> bool {
        self.pooled
    }

    /// Positions it can hold now: `n_ctx`, or for a pooled state what its blocks hold
    /// (at most `n_ctx`).
    pub fn capacity(&self) -> usize {
        if self.pooled {
            let window = self.window_table.as_ref().map_or(usize::MAX, Vec::len);
            (self.blocks.len().min(window) * KV_BLOCK).min(self.n_ctx)
        } else {
            self.n_ctx
        }
    }

    /// Blocks a pooled state needs to hold `n` positions.
    pub fn blocks_for(n: usize) -> usize {
        n.div_ceil(KV_BLOCK)
    }

    /// Whether this state has the layers `config`'s plan asks for, each cache of its
    /// layer's widths (a state made for this model).
    pub fn fits(&self, config: &ModelConfig) -> bool {
        let n_head_kv = config.n_head_kv;
        self.layers.len() == config.plan.layers.len()
            && self.layers.iter().zip(&config.plan.layers).all(|(s, l)| {
                s.recurrent.is_some() == l.mixer.is_recurrent()
                    && s.kv.as_ref().map(|kv| (kv.k_dim, kv.v_dim))
                        == l.mixer.kv_dims(n_head_kv).filter(|_| !self.pooled)
            })
    }

    /// Attention layer `il`'s keys and values. Panics if layer `il` is recurrent (the
    /// forward pass checks [`SeqState::fits`] first).
    pub fn kv(&self, il: usize) -> &KvLayer {
        match &self.layers[il].kv {
            Some(kv) => kv,
            None => panic!("layer {il} has no KV cache"),
        }
    }

    /// [`SeqState::kv`], writable.
    pub fn kv_mut(&mut self, il: usize) -> &mut KvLayer {
        match &mut self.layers[il].kv {
            Some(kv) => kv,
            None => panic!("layer {il} has no KV cache"),
        }
    }

    /// [`SeqState::kv_mut`] with the table its rows go through ([`SeqState::table`]).
    pub(crate) fn kv_and_table_mut(
        &mut self,
        il: usize,
        windowed: bool,
    ) -> (&mut KvLayer, Option<&[u32]>) {
        let table = table_of(&self.window_table, &self.blocks, self.pooled, windowed);
        match &mut self.layers[il].kv {
            Some(kv) => (kv, table),
            None => panic!("layer {il} has no KV cache"),
        }
    }

    /// Recurrent layer `il`'s state. Panics if layer `il` is attention.
    pub fn recurrent_mut(&mut self, il: usize) -> &mut RecurrentLayer {
        match &mut self.layers[il].recurrent {
            Some(r) => r,
            None => panic!("layer {il} has no recurrent state"),
        }
    }

    /// Whether any layer keeps a recurrent state.
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(|l| l.recurrent.is_some())
    }

    /// The longest prefix of at most `n` positions this state can be cut back to (or
    /// copied from): `min(n, n_past)` when every layer is attention; with recurrent
    /// layers only the whole state (`n_past`, when `n >= n_past`) or nothing (0); with
    /// windowed layers only where they still hold the window before it
    /// ([`SeqState::window_reaches`]), else nothing.
    pub fn reusable(&self, n: usize) -> usize {
        let k = if !self.is_recurrent() {
            n.min(self.n_past)
        } else if n >= self.n_past {
            self.n_past
        } else {
            0
        };
        if self.window_reaches(k) {
            k
        } else {
            0
        }
    }

    /// Keeps the first [`SeqState::reusable`]`(n)` positions and forgets the rest (a
    /// recurrent state cut before its end is cleared); returns how many were kept.
    pub fn truncate(&mut self, n: usize) -> usize {
        let keep = self.reusable(n);
        if keep == 0 {
            for r in self.layers.iter_mut().filter_map(|l| l.recurrent.as_mut()) {
                r.conv.fill(0.0);
                r.ssm.fill(0.0);
            }
            self.written = 0;
        }
        self.n_past = keep;
        keep
    }

    /// Positions `0..n_past` have been evaluated: the next token goes at `n_past`.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// A pooled state's block table (the pool block of each 16 positions; empty for a
    /// state with its own cache).
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// The block table, for the pool's owner to add blocks before a step (a block it adds
    /// must be no other sequence's) or release them after a cut.
    pub fn table_mut(&mut self) -> &mut Vec<u32> {
        &mut self.blocks
    }

    /// Makes a pooled state hold `table`, whose first `n` positions already hold this
    /// sequence's keys and values (a prefix placed by the pool's owner: shared blocks of
    /// the prefix cache, or another sequence's); the recurrent layers are not touched
    /// (take them with [`SeqState::copy_recurrent`] or [`SeqState::restore`]).
    ///
    /// Panics if the state is not pooled or `table` cannot hold `n` positions.
    pub fn adopt(&mut self, table: Vec<u32>, n: usize) {
        assert!(self.pooled, "adopt: a state with its own cache");
        assert!(
            table.len() * KV_BLOCK >= n,
            "adopt: {} blocks for {n} positions",
            table.len()
        );
        self.blocks = table;
        self.n_past = n;
    }

    /// Empties a pooled state's block table, returning it (for the pool's owner to release
    /// its blocks); the state must then be cut ([`SeqState::truncate`]) before it is used.
    pub fn take_table(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.blocks)
    }

    /// Records `n` positions evaluated after `n_past` (the forward pass's bookkeeping).
    pub(crate) fn advance(&mut self, n: usize) {
        self.n_past += n;
        self.written = self.written.max(self.n_past);
    }

    /// Makes this state hold `src`'s first `n` positions (and nothing after them): keys and
    /// values copied, recurrent states copied whole, `n_past = n`. Equal to evaluating the
    /// same `n` tokens here, bit for bit: a position's keys and values depend only on the
    /// tokens up to it ([`crate::Model::forward_batch`]).
    ///
    /// Panics if the states differ in shape or element type, or `n` passes `src.n_past`
    /// or this state's `n_ctx`, or `n` is not [`SeqState::reusable`] from `src`.
    pub fn copy_prefix(&mut self, src: &SeqState, n: usize) {
        assert!(
            !self.pooled && !src.pooled,
            "copy_prefix: pooled states share blocks instead"
        );
        assert!(
            self.kv_type == src.kv_type
                && (self.layers.len(), self.ring) == (src.layers.len(), src.ring),
            "copy_prefix: states of different shapes"
        );
        assert!(
            n <= src.n_past && n <= self.n_ctx && src.reusable(n) == n,
            "copy_prefix: {n} positions"
        );
        if n == 0 {
            self.truncate(0);
            return;
        }
        // A ring is copied whole: which of its rows hold the first `n` positions depends
        // on all that was written.
        let ring = self.ring * KV_BLOCK;
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            match (&mut d.kv, &s.kv) {
                (Some(d), Some(s)) => {
                    assert_eq!((d.k_dim, d.v_dim), (s.k_dim, s.v_dim), "copy_prefix: rows");
                    let row_bytes = self.kv_type.k.bytes(d.k_dim).unwrap_or(0).max(1);
                    let is_ring = ring > 0 && d.k.bytes() / row_bytes == ring;
                    let rows = if is_ring { ring } else { n };
                    d.copy_prefix(s, rows);
                }
                (None, None) => {}
                _ => panic!("copy_prefix: states of different layer kinds"),
            }
        }
        self.copy_recurrent(src);
        self.n_past = n;
        self.written = src.written;
    }

    /// Takes `src`'s recurrent layers' states (after `src.n_past` positions); with the
    /// keys and values of the same tokens in place (a pooled state sharing `src`'s blocks,
    /// or [`SeqState::copy_prefix`]) and `n_past = src.n_past`, equal to having evaluated
    /// them here.
    ///
    /// Panics if the states' layers differ in kind.
    pub fn copy_recurrent(&mut self, src: &SeqState) {
        assert_eq!(
            self.layers.len(),
            src.layers.len(),
            "copy_recurrent: other layers"
        );
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            match (&mut d.recurrent, &s.recurrent) {
                (Some(d), Some(s)) => d.clone_from(s),
                (None, None) => {}
                _ => panic!("copy_recurrent: states of different layer kinds"),
            }
        }
    }

    /// Its recurrent state now, to continue from position `n_past` later.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            n_past: self.n_past,
            layers: self.layers.iter().map(|l| l.recurrent.clone()).collect(),
        }
    }

    /// Continues from `cp`: its recurrent state, `n_past = cp.n_past`, and the keys and
    /// values this state holds for positions `0..cp.n_past`. Equal to having evaluated
    /// those positions here, provided this state's first `cp.n_past` positions are the
    /// tokens `cp` saw (the caller's bookkeeping: the scheduler keeps a slot's checkpoints
    /// only while its tokens up to them are unchanged).
    ///
    /// Panics if `cp` is of another model's layers or passes what this state holds.
    pub fn restore(&mut self, cp: &Checkpoint) {
        assert!(
            cp.layers.len() == self.layers.len() && cp.n_past <= self.n_past,
            "restore: a checkpoint of other layers"
        );
        for (l, saved) in self.layers.iter_mut().zip(&cp.layers) {
            match (&mut l.recurrent, saved) {
                (Some(r), Some(s)) => r.clone_from(s),
                (None, None) => {}
                _ => panic!("restore: a checkpoint of other layers"),
            }
        }
        self.n_past = cp.n_past;
    }

    /// Bytes held by the state (a pooled state's keys and values are the pool's).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                let kv = l.kv.as_ref().map_or(0, |kv| kv.k.bytes() + kv.v.bytes());
                kv + l
                    .recurrent
                    .as_ref()
                    .map_or(0, |r| (r.conv.len() + r.ssm.len()) * 4)
            })
            .sum()
    }
}
