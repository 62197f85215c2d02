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
use crate::kv::{KvLayer, KvPool, KvStore, KvType, KV_BLOCK};

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
/// Memory: per attention layer `n_ctx · (k_dim + v_dim)` elements of 2 (f16) or 4 (f32)
/// bytes (none for a pooled state: the pool holds them); per recurrent layer a fixed
/// number of f32 values, whatever the length.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqState {
    pub kv_type: KvType,
    pub n_ctx: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub layers: Vec<LayerState>,
    /// A pooled state's block table (empty for a state with its own cache).
    pub blocks: Vec<u32>,
    /// Whether its keys and values live in a shared pool.
    pooled: bool,
    /// Positions `0..n_past` have been evaluated.
    pub n_past: usize,
}

impl SeqState {
    /// Bytes the KV cache of one sequence of `n_ctx` positions takes (what
    /// [`SeqState::new`] allocates for its attention layers), or `None` when that does not
    /// fit in a `usize` (a context no machine holds).
    pub fn kv_bytes(config: &ModelConfig, n_ctx: usize, kv_type: KvType) -> Option<usize> {
        let layers = config
            .plan
            .layers
            .iter()
            .filter(|l| l.mixer.has_attention())
            .count();
        kv_type
            .bytes(n_ctx.checked_mul(config.k_dim() + config.v_dim())?)?
            .checked_mul(layers)
    }

    /// An empty state for `n_ctx` positions of the model described by `config`.
    pub fn new(config: &ModelConfig, n_ctx: usize, kv_type: KvType) -> SeqState {
        Self::with_kv(config, n_ctx, kv_type, false)
    }

    /// An empty state of at most `n_ctx` positions whose keys and values live in `pool`
    /// (its recurrent layers' states are its own): the caller gives it blocks
    /// ([`SeqState::blocks`]) before evaluating positions in them and passes the pool to
    /// the forward pass ([`crate::Model::forward_batch_in`]).
    pub fn pooled(config: &ModelConfig, n_ctx: usize, pool: &KvPool) -> SeqState {
        Self::with_kv(config, n_ctx, pool.kv_type, true)
    }

    fn with_kv(config: &ModelConfig, n_ctx: usize, kv_type: KvType, pooled: bool) -> SeqState {
        let (k_dim, v_dim) = (config.k_dim(), config.v_dim());
        let layers = config
            .plan
            .layers
            .iter()
            .map(|l| LayerState {
                kv: (l.mixer.has_attention() && !pooled).then(|| KvLayer {
                    k: KvStore::new(kv_type, n_ctx * k_dim),
                    v: KvStore::new(kv_type, n_ctx * v_dim),
                }),
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
            k_dim,
            v_dim,
            layers,
            blocks: Vec::new(),
            pooled,
            n_past: 0,
        }
    }

    /// Whether its keys and values live in a shared pool ([`SeqState::pooled`]).
    pub fn is_pooled(&self) -> bool {
        self.pooled
    }

    /// Positions it can hold now: `n_ctx`, or for a pooled state what its blocks hold
    /// (at most `n_ctx`).
    pub fn capacity(&self) -> usize {
        if self.pooled {
            (self.blocks.len() * KV_BLOCK).min(self.n_ctx)
        } else {
            self.n_ctx
        }
    }

    /// Blocks a pooled state needs to hold `n` positions.
    pub fn blocks_for(n: usize) -> usize {
        n.div_ceil(KV_BLOCK)
    }

    /// Whether this state has the layers `plan` asks for (a state made for this model).
    pub fn fits(&self, plan: &crate::plan::Plan) -> bool {
        self.layers.len() == plan.layers.len()
            && self.layers.iter().zip(&plan.layers).all(|(s, l)| {
                s.recurrent.is_some() == l.mixer.is_recurrent()
                    && s.kv.is_some() == (l.mixer.has_attention() && !self.pooled)
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
    /// layers only the whole state (`n_past`, when `n >= n_past`) or nothing (0).
    pub fn reusable(&self, n: usize) -> usize {
        if !self.is_recurrent() {
            n.min(self.n_past)
        } else if n >= self.n_past {
            self.n_past
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
        }
        self.n_past = keep;
        keep
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
                && (self.k_dim, self.v_dim, self.layers.len())
                    == (src.k_dim, src.v_dim, src.layers.len()),
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
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            match (&mut d.kv, &s.kv) {
                (Some(d), Some(s)) => {
                    d.k.copy_from(&s.k, n * self.k_dim);
                    d.v.copy_from(&s.v, n * self.v_dim);
                }
                (None, None) => {}
                _ => panic!("copy_prefix: states of different layer kinds"),
            }
        }
        self.copy_recurrent(src);
        self.n_past = n;
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
        let row = self.kv_type.bytes(self.k_dim).unwrap_or(0)
            + self.kv_type.bytes(self.v_dim).unwrap_or(0);
        self.layers
            .iter()
            .map(|l| {
                let kv = l.kv.as_ref().map_or(0, |_| self.n_ctx * row);
                kv + l
                    .recurrent
                    .as_ref()
                    .map_or(0, |r| (r.conv.len() + r.ssm.len()) * 4)
            })
            .sum()
    }
}
