//! The KV cache manager: the block pool and its groups (the main one and the window
//! group), every slot's keys and values (its [`SeqState`], the tokens and prefix-cache
//! keys of its blocks, its recurrent checkpoints) and the operations on them: prefix
//! matching (a slot's own tokens, the prefix cache, a donor slot, a checkpoint),
//! allocation, freeing, reclaiming idle slots' blocks, sliding windows, registering full
//! blocks and checkpoints. The worker ([`super::worker`]) decides which job runs where
//! (its placement policy, [`super::placement`]) and reaches a slot's keys and values only
//! through this interface. (vLLM's `kv_cache_manager.py` is the same split.)

use std::sync::atomic::Ordering;
use std::sync::Arc;

mod disk;

use frink_models::shift::{read_shifted, write_shifted};
use frink_models::state_io::{self, Extent};
use frink_models::{Checkpoint, KvPool, Model, SeqState};

use super::metrics::Shared;
use super::*;

/// A slot's keys and values: its state (in blocks of the shared pool), the ids its blocks
/// hold (`tokens.len() == cache.n_past()`) and the keys of its full blocks, and for a
/// recurrent model checkpoints of its state at positions up to there (each valid for
/// `tokens[..n_past]`, which stay unchanged while it is kept). An idle slot keeps its
/// blocks (a conversation's next turn continues from them) until the pool needs them.
pub(super) struct SeqKv {
    cache: SeqState,
    tokens: Vec<u32>,
    /// Prefix-cache keys of its full blocks (block `i`: `hashes[i]`).
    hashes: Vec<u64>,
    /// (creation order, checkpoint), oldest first.
    checkpoints: Vec<(u64, Checkpoint)>,
    /// The adapters its tokens were evaluated with ([`lora_key`]).
    lora: Vec<(usize, u32)>,
    /// When it was last given a job (idle slots give their blocks back oldest first).
    used: u64,
    /// Positions `0..exact` hold what evaluating `tokens[..exact]` writes; after a
    /// context shift the rest do not (they attended to dropped tokens, their keys were
    /// rotated), so they are never reused by another request nor entered in the prefix
    /// cache (`usize::MAX`: all of them).
    exact: usize,
}

/// The KV cache manager (module docs). Slot `i`'s keys and values are `seqs[i]`; which
/// slots are idle (hold no job) is the worker's to say, as `idle[i]`, where an operation
/// may take an idle slot's blocks.
pub(super) struct KvManager {
    /// The keys and values of every slot, in blocks.
    pool: KvPool,
    /// Which blocks are free, held, cached.
    blocks: BlockManager,
    /// The same for the pool's window group (a model with sliding-window layers whose
    /// pool keeps their rows apart: [`KvPool::with_window_group`]). Sized so that it never
    /// runs out: each slot holds at most [`frink_models::window_blocks`] of it.
    window_blocks: Option<BlockManager>,
    seqs: Vec<SeqKv>,
    /// The model's sliding window (0: none).
    window: usize,
    /// The model has recurrent layers (no prefix cache; checkpoints).
    recurrent: bool,
    /// `--ctx-checkpoints` per slot and `--checkpoint-budget` bytes in all.
    ctx_checkpoints: usize,
    checkpoint_budget: usize,
    /// Checkpoints taken so far (their creation order).
    checkpoints_taken: u64,
    /// The gauges and counters it keeps up to date.
    shared: Arc<Shared>,
    /// The prefix cache's disk tier (`--cache-disk`), if any.
    disk: Option<disk::DiskTier>,
}

impl KvManager {
    /// The pool for `config` (`parallel` slots of `n_ctx` positions, `kv_blocks()`
    /// blocks; the prefill chunks capped where a window group is made:
    /// [`KvManager::window_group`]) and empty slots; publishes the pool's size.
    pub(super) fn new(model: &Model, config: &mut SchedulerConfig, shared: Arc<Shared>) -> Self {
        let n_blocks = config.kv_blocks();
        let n_window = Self::window_group(model, config, n_blocks);
        let pool = KvPool::with_window_group(&model.config, n_blocks, n_window, config.kv_type);
        let seqs = (0..config.parallel)
            .map(|_| SeqKv {
                cache: SeqState::pooled(&model.config, config.n_ctx, &pool),
                tokens: Vec::new(),
                hashes: Vec::new(),
                checkpoints: Vec::new(),
                lora: Vec::new(),
                used: 0,
                exact: usize::MAX,
            })
            .collect();
        shared.kv_blocks_total.store(n_blocks, Ordering::Relaxed);
        shared
            .kv_window_blocks_total
            .store(pool.n_window_blocks, Ordering::Relaxed);
        shared.kv_bytes.store(pool.bytes(), Ordering::Relaxed);
        let disk = config.cache_disk.as_ref().and_then(|(dir, max)| {
            let identity = format!(
                "{}-{}",
                &crate::state_file::model_fingerprint(model)[..16],
                config.kv_type.name()
            );
            disk::DiskTier::open(dir, &identity, *max)
                .map_err(|e| tracing::warn!("--cache-disk {}: {e}", dir.display()))
                .ok()
        });
        let blocks = match disk.is_some() {
            true => BlockManager::new(n_blocks).spilling(),
            false => BlockManager::new(n_blocks),
        };
        let kv = KvManager {
            pool,
            blocks,
            window_blocks: (n_window > 0).then(|| BlockManager::new(n_window)),
            seqs,
            window: model.config.plan.window(),
            recurrent: model.config.plan.is_recurrent(),
            ctx_checkpoints: config.ctx_checkpoints,
            checkpoint_budget: config.checkpoint_budget,
            checkpoints_taken: 0,
            shared,
            disk,
        };
        kv.publish_disk();
        kv
    }

    /// Slot `i`'s positions in the cache.
    pub(super) fn n_past(&self, i: usize) -> usize {
        self.seqs[i].cache.n_past()
    }

    /// The ids slot `i`'s cache holds.
    pub(super) fn tokens(&self, i: usize) -> &[u32] {
        &self.seqs[i].tokens
    }

    /// Blocks slot `i` holds (in the main group).
    pub(super) fn held_blocks(&self, i: usize) -> usize {
        self.seqs[i].cache.blocks().len()
    }

    /// Blocks of slot `i` (main group) that no other slot or the prefix cache holds.
    pub(super) fn blocks_alone(&self, i: usize) -> usize {
        let blocks = self.seqs[i].cache.blocks();
        blocks.iter().filter(|&&b| self.blocks.refs(b) == 1).count()
    }

    /// Free blocks of the main group (cached ones nobody holds included).
    pub(super) fn available(&self) -> usize {
        self.blocks.available()
    }

    /// Records that slot `i` holds a job's tokens evaluated with the adapters `lora`,
    /// placed as the `used`-th placement (idle slots give their blocks back oldest
    /// first).
    pub(super) fn assign(&mut self, i: usize, lora: Vec<(usize, u32)>, used: u64) {
        let seq = &mut self.seqs[i];
        seq.lora = lora;
        seq.used = used;
    }

    /// Records that slot `i`'s cache now holds `toks` after what it held (they were
    /// evaluated in a forward pass).
    pub(super) fn extend_tokens(&mut self, i: usize, toks: &[u32]) {
        self.seqs[i].tokens.extend_from_slice(toks);
    }

    /// The pool and the states of the slots `which` (ascending), for a forward pass.
    pub(super) fn states<'a>(
        &'a mut self,
        which: &[usize],
    ) -> (&'a mut KvPool, Vec<&'a mut SeqState>) {
        let states = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| which.contains(i))
            .map(|(_, s)| &mut s.cache)
            .collect();
        (&mut self.pool, states)
    }

    /// (positions, blocks) the slots `running` hold: the positions summed, the blocks
    /// counted once however many of them share one.
    pub(super) fn held_by(&self, running: &[usize]) -> (usize, usize) {
        let used = running.iter().map(|&i| self.seqs[i].cache.n_past()).sum();
        let mut blocks: Vec<u32> = running
            .iter()
            .flat_map(|&i| self.seqs[i].cache.blocks().iter().copied())
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        (used, blocks.len())
    }

    /// Updates the pool's gauges: `running` blocks used by running sequences, the rest
    /// held cached (the prefix cache's blocks nobody holds, idle slots' conversations),
    /// the window group's held blocks.
    pub(super) fn publish_blocks(&self, running: usize) {
        let held = self.pool.n_blocks - self.blocks.free_blocks();
        self.shared.kv_blocks_used.store(running, Ordering::Relaxed);
        self.shared
            .kv_blocks_cached
            .store(held - running, Ordering::Relaxed);
        if let Some(wm) = &self.window_blocks {
            self.shared
                .kv_window_blocks_held
                .store(wm.stats().used, Ordering::Relaxed);
        }
    }

    /// Updates the checkpoint gauges.
    pub(super) fn publish_checkpoints(&self) {
        let all = self.seqs.iter().flat_map(|s| &s.checkpoints);
        let (n, bytes) = all.fold((0, 0), |(n, b), (_, c)| (n + 1, b + c.bytes()));
        self.shared.checkpoints.store(n, Ordering::Relaxed);
        self.shared.checkpoint_bytes.store(bytes, Ordering::Relaxed);
    }
}

impl SeqKv {
    /// The longest prefix of at most `n` positions this slot can continue from: its
    /// state cut back ([`SeqState::reusable`]) or one of its checkpoints (its index);
    /// nothing when its tokens were evaluated with other adapters than `lora`.
    pub(super) fn reusable(&self, n: usize, lora: &[(usize, u32)]) -> (usize, Option<usize>) {
        if self.lora != lora {
            return (0, None);
        }
        let n = n.min(self.exact);
        let whole = self.cache.reusable(n);
        self.checkpoints
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| c.n_past <= n && c.n_past > whole)
            .max_by_key(|(_, (_, c))| c.n_past)
            .map_or((whole, None), |(i, (_, c))| (c.n_past, Some(i)))
    }
}

/// Why [`KvManager::restore_state`] failed.
pub(super) enum RestoreError {
    /// The pool has no room for it now.
    Pool(String),
    /// The state does not fit the model (length, values).
    State(String),
}

/// A slot's state as [`KvManager::save_state`] gives it.
pub(super) struct SavedSlot {
    pub(super) extent: Extent,
    pub(super) tokens: Vec<u32>,
    pub(super) payload: Vec<u8>,
    /// Its adapters ([`lora_key`]).
    pub(super) lora: Vec<(usize, u32)>,
}

/// Where a placed job's reused prefix comes from.
pub(super) enum Source {
    /// The chosen slot's own tokens (or one of its checkpoints).
    Own(usize, Option<usize>),
    /// Full blocks of the prefix cache, and the tokens after them another slot holds
    /// in its next block (that slot, how many): copied into a block of its own
    /// (copy-on-write for the partial last block).
    Cache(Vec<u32>, Option<(usize, usize)>, Vec<u64>),
    /// Another slot's tokens (a recurrent model: with its checkpoint).
    Donor(usize, usize, Option<usize>),
}

impl Source {
    pub(super) fn len(&self) -> usize {
        match self {
            Source::Own(n, _) | Source::Donor(_, n, _) => *n,
            Source::Cache(b, tail, disk) => {
                (b.len() + disk.len()) * frink_models::KV_BLOCK + tail.map_or(0, |t| t.1)
            }
        }
    }
}

impl KvManager {
    /// Blocks of the pool's window group for `model` (0: none, its windowed layers live in
    /// the main blocks): every slot's window and its longest step
    /// ([`frink_models::window_blocks`]), plus one for a copy in flight, when that is less
    /// than the main group. With a window group, prompt chunks are at most
    /// [`frink_models::WINDOW_STEP`] rows (gemma3-270m at 8k positions: 24.8% of the
    /// full-attention layout instead of 27.5% with 512-row chunks). Models with recurrent
    /// layers keep one group (their prefix donors copy main blocks only).
    pub(super) fn window_group(
        model: &Model,
        config: &mut SchedulerConfig,
        n_blocks: usize,
    ) -> usize {
        let window = model.config.plan.window();
        if window == 0 || model.config.plan.is_recurrent() {
            return 0;
        }
        let step = frink_models::WINDOW_STEP;
        let n = config
            .parallel
            .max(1)
            .saturating_mul(frink_models::window_blocks(window, step))
            .saturating_add(1);
        if n >= n_blocks {
            return 0;
        }
        config.prefill_chunk = config.prefill_chunk.min(step);
        config.prefill_chunk_alone = config.prefill_chunk_alone.min(step);
        n
    }

    /// The block manager of the window group (`window`) or the main group.
    pub(super) fn group(&mut self, window: bool) -> &mut BlockManager {
        if window {
            self.window_blocks
                .as_mut()
                .expect("a window group is asked for only where the pool has one")
        } else {
            &mut self.blocks
        }
    }

    /// Slot `i`'s block table of the window group (`window`) or the main group.
    pub(super) fn table(&mut self, i: usize, window: bool) -> &mut Vec<u32> {
        let cache = &mut self.seqs[i].cache;
        if window {
            cache
                .window_table_mut()
                .expect("pooled slots of a pool with a window group have a window table")
        } else {
            cache.table_mut()
        }
    }

    /// The groups of the pool: the main one, and the window group where there is one.
    pub(super) fn groups(&self) -> &'static [bool] {
        if self.window_blocks.is_some() {
            &[false, true]
        } else {
            &[false]
        }
    }

    /// Gives back slot `i`'s window blocks that no query from its next position on can
    /// see (wholly before `n_past + 1 - window`); the full ones stay in the prefix cache
    /// until the pool needs them.
    pub(super) fn slide(&mut self, i: usize) {
        if self.window_blocks.is_none() {
            return;
        }
        let behind = self.window_from(self.seqs[i].cache.n_past());
        for j in 0..behind.min(self.table(i, true).len()) {
            let b = std::mem::replace(&mut self.table(i, true)[j], frink_models::EVICTED);
            if b != frink_models::EVICTED {
                self.group(true).release(b);
            }
        }
    }

    /// The first block of the window group that a query at position `p` sees (the one
    /// holding `p + 1 - window`).
    pub(super) fn window_from(&self, p: usize) -> usize {
        (p + 1).saturating_sub(self.window) / frink_models::KV_BLOCK
    }

    /// Shrinks a prefix-cache hit (the full blocks `hit` of the keys `hashes`, then
    /// `tail`: rows of another slot's next block) to what the window group serves too: every window block a query
    /// after it sees is cached under the same key or, for the tail, held by that slot.
    /// (A window block given back and reused for other positions has lost its key.)
    pub(super) fn window_hit(
        &self,
        hashes: &[u64],
        hit: &mut Vec<u32>,
        tail: &mut Option<(usize, usize)>,
    ) {
        let Some(wm) = &self.window_blocks else {
            return;
        };
        loop {
            let m = hit.len();
            let from = self.window_from(m * frink_models::KV_BLOCK + tail.map_or(0, |t| t.1));
            let full = (from..m).all(|j| wm.lookup(hashes[j]).is_some());
            let tail_held = tail.is_none_or(|(d, _)| {
                self.seqs[d]
                    .cache
                    .window_table()
                    .and_then(|t| t.get(m))
                    .is_some_and(|&b| b != frink_models::EVICTED)
            });
            if full && tail_held {
                return;
            }
            if tail.take().is_some() {
                continue;
            }
            if hit.pop().is_none() {
                return;
            }
        }
    }

    /// Whether slots take checkpoints: a model with recurrent layers, checkpoints on.
    pub(super) fn checkpointing(&self) -> bool {
        self.ctx_checkpoints > 0 && self.recurrent
    }

    /// Whether the prefix cache serves this model: attention only (a recurrent layer's
    /// state at a prefix is not in the blocks).
    pub(super) fn prefix_caching(&self) -> bool {
        !self.recurrent
    }

    /// Saves slot `i`'s state as a checkpoint at its current position (once per
    /// position), then drops the oldest beyond the per-slot count and the byte budget.
    pub(super) fn save_checkpoint(&mut self, i: usize) {
        let slot = &mut self.seqs[i];
        let at = slot.cache.n_past();
        if slot.checkpoints.iter().any(|(_, c)| c.n_past == at) {
            return;
        }
        self.checkpoints_taken += 1;
        slot.checkpoints
            .push((self.checkpoints_taken, slot.cache.checkpoint()));
        if slot.checkpoints.len() > self.ctx_checkpoints {
            slot.checkpoints.remove(0);
        }
        loop {
            let bytes: usize = self
                .seqs
                .iter()
                .flat_map(|s| &s.checkpoints)
                .map(|(_, c)| c.bytes())
                .sum();
            if bytes <= self.checkpoint_budget {
                break;
            }
            // The oldest of all.
            let Some((si, ci)) = self
                .seqs
                .iter()
                .enumerate()
                .flat_map(|(si, s)| {
                    s.checkpoints
                        .iter()
                        .enumerate()
                        .map(move |(ci, c)| (c.0, si, ci))
                })
                .min()
                .map(|(_, si, ci)| (si, ci))
            else {
                break;
            };
            self.seqs[si].checkpoints.remove(ci);
        }
        self.publish_checkpoints();
    }

    /// Cuts slot `i` back to its first `keep` positions (fewer for a state that cannot be
    /// cut there: [`SeqState::truncate`]); returns how many it kept. The blocks past them
    /// go back to the pool; a partial last block that another slot holds too or the
    /// prefix cache keeps is replaced by a copy of its kept rows (the slot will write
    /// after them), or dropped when no block is left for the copy.
    pub(super) fn cut(&mut self, i: usize, keep: usize) -> usize {
        let mut keep = keep;
        loop {
            keep = self.seqs[i].cache.truncate(keep);
            let nb = SeqState::blocks_for(keep);
            for &g in self.groups() {
                let len = self.table(i, g).len();
                let gone: Vec<u32> = self.table(i, g).drain(nb.min(len)..).collect();
                for b in gone.into_iter().filter(|&b| b != frink_models::EVICTED) {
                    self.group(g).release(b);
                }
            }
            let rem = keep % frink_models::KV_BLOCK;
            if rem == 0
                || self
                    .groups()
                    .iter()
                    .all(|&g| self.own_block(i, g, nb - 1, rem))
            {
                break;
            }
            keep -= rem;
        }
        let slot = &mut self.seqs[i];
        if keep <= slot.exact {
            slot.exact = usize::MAX;
        }
        slot.tokens.truncate(keep);
        slot.hashes.truncate(keep / frink_models::KV_BLOCK);
        // Checkpoints past the prefix saw tokens a new prompt replaces.
        slot.checkpoints.retain(|(_, c)| c.n_past <= keep);
        keep
    }

    /// Context shift of slot `i` (`keep`, `discard`): its positions `keep + discard ..`
    /// move to `keep ..` with their keys rotated back ([`frink_models::shift`]), the
    /// dropped positions' blocks go back, and its tokens follow. `false` when the pool
    /// has no blocks for the moved rows (or the kept partial block cannot be copied); the
    /// slot is then cut to what it kept.
    pub(super) fn shift(
        &mut self,
        i: usize,
        model: &Model,
        (keep, discard): (usize, usize),
        idle: &[bool],
    ) -> bool {
        let from = keep + discard;
        let n = self.n_past(i).saturating_sub(from);
        let rows = read_shifted(model, &self.pool, &self.seqs[i].cache, from, n, discard);
        let moved = self.seqs[i].tokens[from..].to_vec();
        // The kept partial block may need a copy (the prefix cache keeps the original):
        // idle slots give a block back for it rather than the shift failing.
        self.reclaim(idle, &[i], |w| {
            w.groups().iter().any(|&g| w.group(g).available() < 2)
        });
        if self.cut(i, keep) != keep || !self.grow(i, keep + n, idle) {
            return false;
        }
        let slot = &mut self.seqs[i];
        write_shifted(&mut self.pool, &mut slot.cache, &rows);
        slot.tokens.extend_from_slice(&moved);
        slot.exact = keep;
        true
    }

    /// Slot `i`'s state to save: what it holds ([`frink_models::state_io::save`]), its
    /// tokens and its adapters.
    pub(super) fn save_state(&self, i: usize) -> SavedSlot {
        let slot = &self.seqs[i];
        let mut payload = Vec::new();
        // Only the positions a fresh evaluation of their tokens would give (not those
        // after a context shift).
        let n = slot.cache.n_past().min(slot.exact);
        let extent = state_io::save(&self.pool, &slot.cache, n, &mut payload);
        SavedSlot {
            extent,
            tokens: slot.tokens[..extent.n].to_vec(),
            payload,
            lora: slot.lora.clone(),
        }
    }

    /// The most bytes a state file of this pool's slots takes (a state of `n_ctx`
    /// positions with its header and checksum): what a restore reads at most.
    pub(super) fn max_state_bytes(&self, i: usize) -> usize {
        let cache = &self.seqs[i].cache;
        let extent = Extent {
            n: cache.n_ctx,
            held_from: 0,
        };
        state_io::payload_len(&self.pool, cache, extent) + 4 * cache.n_ctx + (64 << 10) + 64
    }

    /// Makes slot `i` hold a saved state (its extent, tokens and payload; evaluated with
    /// adapters `lora`), its full blocks entered in the prefix cache; `used` orders it
    /// among idle slots. Errors: the pool cannot hold it, or the payload does not fit
    /// the model (the slot is then empty).
    pub(super) fn restore_state(
        &mut self,
        i: usize,
        (extent, tokens, payload): (Extent, Vec<u32>, &[u8]),
        lora: Vec<(usize, u32)>,
        idle: &[bool],
        used: u64,
    ) -> Result<(), RestoreError> {
        if tokens.len() != extent.n {
            return Err(RestoreError::State(format!(
                "{} tokens for {} positions",
                tokens.len(),
                extent.n
            )));
        }
        // Checked before the slot changes: the bytes fit the model and are finite.
        state_io::check(&self.pool, &self.seqs[i].cache, extent, payload)
            .map_err(RestoreError::State)?;
        self.cut(i, 0);
        // The window group holds only the blocks from `held_from` on.
        if self.window_blocks.is_some() {
            let behind = extent.held_from.min(extent.n) / frink_models::KV_BLOCK;
            *self.table(i, true) = vec![frink_models::EVICTED; behind];
        }
        if !self.grow(i, extent.n, idle) {
            self.cut(i, 0);
            return Err(RestoreError::Pool(format!(
                "the KV pool has no room for the state's {} positions",
                extent.n
            )));
        }
        let slot = &mut self.seqs[i];
        if let Err(e) = state_io::load(&mut self.pool, &mut slot.cache, extent, payload) {
            self.cut(i, 0);
            return Err(RestoreError::State(e));
        }
        slot.tokens = tokens;
        slot.hashes.clear();
        slot.checkpoints.clear();
        slot.exact = usize::MAX;
        self.assign(i, lora, used);
        self.slide(i);
        self.register_full_blocks(i);
        Ok(())
    }

    /// A block of group `window` to write ([`BlockManager::alloc`]); a cached block it
    /// evicts from the main group goes to the disk tier first.
    fn alloc_block(&mut self, window: bool) -> Option<u32> {
        let b = self.group(window).alloc()?;
        if !window {
            self.spill();
        }
        Some(b)
    }

    /// Makes block `j` of slot `i`'s table in group `window` its own before it writes
    /// there: a block others hold or the prefix cache keeps is replaced by a copy of its
    /// first `rows` positions; `false` when no block is left for the copy.
    pub(super) fn own_block(&mut self, i: usize, window: bool, j: usize, rows: usize) -> bool {
        let b = self.table(i, window)[j];
        if b == frink_models::EVICTED || !self.group(window).needs_copy(b) {
            return true;
        }
        let Some(copy) = self.copied(window, b, rows) else {
            return false;
        };
        self.table(i, window)[j] = copy;
        self.group(window).release(b);
        true
    }

    /// A new block of group `window` holding a copy of the first `rows` positions of
    /// block `src` (a shared partial block a sequence is about to extend); `None` when no
    /// block is left.
    pub(super) fn copied(&mut self, window: bool, src: u32, rows: usize) -> Option<u32> {
        let copy = self.alloc_block(window)?;
        self.pool.copy_block(window, src, copy, rows);
        Some(copy)
    }

    /// Gives slot `i` blocks for `n` positions (in each group), taking them from idle
    /// slots (least recently used first) when the pool has too few free; `false`
    /// (nothing taken) when even that is not enough.
    pub(super) fn grow(&mut self, i: usize, n: usize, idle: &[bool]) -> bool {
        let want = SeqState::blocks_for(n);
        let need = |w: &mut Self, g: bool| want.saturating_sub(w.table(i, g).len());
        let short = |w: &mut Self| {
            w.groups()
                .iter()
                .any(|&g| need(w, g) > w.group(g).available())
        };
        if short(self) {
            self.reclaim(idle, &[i], short);
        }
        if short(self) {
            return false;
        }
        for &g in self.groups() {
            // A window block the next write lands in that was given back (a window of one
            // position) is replaced.
            let at = self.seqs[i].cache.n_past() / frink_models::KV_BLOCK;
            if self.table(i, g).get(at) == Some(&frink_models::EVICTED) {
                let b = self.alloc_block(g).expect("counted available");
                self.table(i, g)[at] = b;
            }
            for _ in 0..need(self, g) {
                let b = self.alloc_block(g).expect("counted available");
                self.table(i, g).push(b);
            }
        }
        true
    }

    /// Idle slots (not `except`) give their blocks back, least recently used first,
    /// while `short` says the pool is short or until none is left to give.
    pub(super) fn reclaim(
        &mut self,
        idle: &[bool],
        except: &[usize],
        short: impl Fn(&mut Self) -> bool,
    ) {
        while short(self) {
            let Some(i) = (0..self.seqs.len())
                .filter(|i| !except.contains(i))
                .filter(|&i| idle[i] && !self.seqs[i].cache.blocks().is_empty())
                .min_by_key(|&i| self.seqs[i].used)
            else {
                return;
            };
            self.cut(i, 0);
        }
    }

    /// Blocks idle slots (not `except`) hold alone: what [`KvManager::reclaim`] could free.
    pub(super) fn reclaimable(&self, idle: &[bool], except: &[usize]) -> usize {
        (0..self.seqs.len())
            .filter(|&i| !except.contains(&i) && idle[i])
            .flat_map(|i| self.seqs[i].cache.blocks())
            .filter(|&&b| self.blocks.refs(b) == 1)
            .count()
    }

    /// Registers the full blocks slot `i` has filled since the last call in the prefix
    /// cache.
    pub(super) fn register_full_blocks(&mut self, i: usize) {
        if !self.prefix_caching() {
            return;
        }
        let slot = &mut self.seqs[i];
        let full = slot.cache.n_past().min(slot.exact) / frink_models::KV_BLOCK;
        while slot.hashes.len() < full {
            let k = slot.hashes.len();
            let parent = k.checked_sub(1).map_or(0, |p| slot.hashes[p]);
            let toks = &slot.tokens[k * frink_models::KV_BLOCK..(k + 1) * frink_models::KV_BLOCK];
            let h = block_hash(parent, toks, &slot.lora);
            self.blocks.register(slot.cache.blocks()[k], h);
            // The window group's block of the same positions, under the same key (a
            // prefix hit needs both: see `window_hit`).
            if let (Some(wm), Some(t)) = (self.window_blocks.as_mut(), slot.cache.window_table()) {
                if t[k] != frink_models::EVICTED {
                    wm.register(t[k], h);
                }
            }
            slot.hashes.push(h);
        }
    }

    /// The slot for a job and where its reused prefix comes from: the free slot whose
    /// own tokens give the longest prefix (ties to the slot holding the least), unless
    /// the prefix cache (or, for a recurrent model, another slot) gives more. `keep`:
    /// the most positions reused (an embedding reuses none: it pools every token's
    /// hidden state; otherwise one token is evaluated for the next token's logits).
    /// Also returns the prefix-cache keys of the input's full blocks (empty without
    /// prefix caching).
    /// `None` when no slot is idle.
    pub(super) fn choose_source(
        &self,
        input: &[u32],
        keep: usize,
        lora: &[(usize, u32)],
        idle: &[bool],
    ) -> Option<(usize, Source, Vec<u64>)> {
        let free = idle.iter().position(|&f| f)?;
        // The free slot whose own tokens give the longest prefix; ties go to the slot
        // holding the least.
        let (best, (own, checkpoint)) = self
            .seqs
            .iter()
            .enumerate()
            .filter(|&(i, _)| idle[i])
            .map(|(i, s)| {
                let common = common_prefix(&s.tokens, input).min(keep);
                (i, s.reusable(common, lora), s.tokens.len())
            })
            .max_by(|a, b| {
                (a.1)
                    .0
                    .cmp(&(b.1).0)
                    .then(b.2.cmp(&a.2))
                    .then(b.0.cmp(&a.0))
            })
            .map_or((free, (0, None)), |(i, p, _)| (i, p));
        let mut source = Source::Own(own, checkpoint);
        // The prefix-cache keys of the input's full blocks, once for the lookups and the
        // placement below (a prefix's keys are the first of them: each chains its parent).
        let hashes = if self.prefix_caching() {
            block_hashes(&input[..keep], lora)
        } else {
            Vec::new()
        };
        if self.prefix_caching() {
            let mut hit = Vec::new();
            for &h in &hashes {
                match self.blocks.lookup(h) {
                    Some(b) => hit.push(b),
                    None => break,
                }
            }
            // A slot (busy or idle) holding the tokens after the hit in its next block.
            let p = hit.len() * frink_models::KV_BLOCK;
            let tail = self
                .seqs
                .iter()
                .enumerate()
                .filter(|&(i, s)| i != best && s.cache.blocks().len() > hit.len())
                .map(|(i, s)| {
                    (
                        i,
                        s.reusable(common_prefix(&s.tokens, input).min(keep), lora)
                            .0,
                    )
                })
                .filter(|&(_, c)| c > p)
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                .map(|(i, c)| (i, (c - p).min(frink_models::KV_BLOCK)));
            let mut tail = tail;
            self.window_hit(&hashes, &mut hit, &mut tail);
            // The blocks after the memory hit that the disk tier holds (then no tail: it
            // would follow the memory hit).
            let on_disk = self.disk_hits(&hashes[hit.len()..]);
            let disk = hashes[hit.len()..hit.len() + on_disk].to_vec();
            if !disk.is_empty() {
                tail = None;
            }
            let cached = Source::Cache(hit, tail, disk);
            if cached.len() > source.len() {
                source = cached;
            }
        } else {
            // A recurrent model: another slot's state (or checkpoint), busy or free.
            if let Some((d, (shared, cp))) = self
                .seqs
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != best)
                .map(|(i, s)| {
                    (
                        i,
                        s.reusable(common_prefix(&s.tokens, input).min(keep), lora),
                    )
                })
                .max_by(|a, b| (a.1).0.cmp(&(b.1).0).then(b.0.cmp(&a.0)))
            {
                if shared > source.len() {
                    source = Source::Donor(d, shared, cp);
                }
            }
        }
        Some((best, source, hashes))
    }

    /// Gives slot `best` the prefix `source` chose ([`KvManager::choose_source`]; `hashes`
    /// the keys of `input`'s full blocks); returns the positions it holds.
    pub(super) fn take(
        &mut self,
        best: usize,
        source: Source,
        hashes: &[u64],
        input: &[u32],
        idle: &[bool],
    ) -> usize {
        match source {
            Source::Own(p, cp) => self.take_own(best, p, cp),
            Source::Cache(hit, tail, disk) => {
                self.take_cached(best, (hit, tail, &disk), hashes, input, idle)
            }
            Source::Donor(d, shared, cp) => self.take_donor(best, d, shared, cp),
        }
    }

    /// Reuses the slot's own first `p` positions (from checkpoint `cp` where given);
    /// returns the positions kept.
    fn take_own(&mut self, best: usize, p: usize, cp: Option<usize>) -> usize {
        if let Some(c) = cp {
            let SeqKv {
                cache, checkpoints, ..
            } = &mut self.seqs[best];
            cache.restore(&checkpoints[c].1);
        }
        if cp.is_some() {
            self.shared
                .checkpoints_restored
                .fetch_add(1, Ordering::Relaxed);
        }
        self.cut(best, p)
    }

    /// Builds the slot's table from the prefix cache's `hit` blocks (and the window
    /// group's), then a copy of slot `tail.0`'s next block for `tail.1` more positions
    /// where the pool has room; returns the positions kept.
    fn take_cached(
        &mut self,
        best: usize,
        (hit, tail, disk): (Vec<u32>, Option<(usize, usize)>, &[u64]),
        hashes: &[u64],
        input: &[u32],
        idle: &[bool],
    ) -> usize {
        self.cut(best, 0);
        for &b in &hit {
            self.blocks.retain(b);
        }
        let mut table = hit;
        if !disk.is_empty() {
            let short = |w: &mut Self| w.blocks.available() < disk.len();
            self.reclaim(idle, &[best], short);
            self.load_disk_blocks(disk, &mut table);
        }
        let mut p = table.len() * frink_models::KV_BLOCK;
        // The window group's blocks of the hit that a query after it can see
        // (`window_hit` found them all cached), the earlier ones given back.
        let mut window_table = None;
        if self.window_blocks.is_some() {
            let hit_keys = &hashes[..p / frink_models::KV_BLOCK];
            let from = self.window_from(p);
            let mut t = vec![frink_models::EVICTED; from.min(hit_keys.len())];
            // All cached from the tail's window on (`window_hit`); before it, as
            // many as are, in case the tail is not copied after all.
            for h in &hit_keys[t.len()..] {
                let b = self.group(true).lookup(*h);
                if let Some(b) = b {
                    self.group(true).retain(b);
                }
                t.push(b.unwrap_or(frink_models::EVICTED));
            }
            window_table = Some(t);
        }
        if let Some((d, extra)) = tail {
            let short = |w: &mut Self| w.groups().iter().any(|&g| w.group(g).available() == 0);
            self.reclaim(idle, &[best, d], short);
            let src: Vec<u32> = self
                .groups()
                .iter()
                .map(|&g| self.table(d, g)[table.len()])
                .collect();
            let copies: Vec<Option<u32>> = self
                .groups()
                .iter()
                .zip(&src)
                .map(|(&g, &b)| self.copied(g, b, extra))
                .collect();
            if copies.iter().all(Option::is_some) {
                table.push(copies[0].expect("checked"));
                if let (Some(t), Some(c)) = (&mut window_table, copies.get(1)) {
                    t.push(c.expect("checked"));
                }
                p += extra;
            } else {
                for (&g, c) in self.groups().iter().zip(copies) {
                    if let Some(c) = c {
                        self.group(g).release(c);
                    }
                }
            }
        }
        let slot = &mut self.seqs[best];
        slot.cache.adopt(table, p);
        if let Some(t) = window_table {
            *slot.cache.window_table_mut().expect("a window group") = t;
        }
        slot.tokens = input[..p].to_vec();
        slot.hashes = hashes[..p / frink_models::KV_BLOCK].to_vec();
        slot.checkpoints.clear();
        // Where the tail could not be copied, the window blocks before it may be
        // missing: the cut keeps only what the state can continue from.
        let p = self.cut(best, p);
        self.slide(best);
        p
    }

    /// Shares slot `d`'s first `shared` positions (full blocks shared, a partial last
    /// one copied) and copies its recurrent state, or its checkpoint `cp`; starts over
    /// when the state at the reused length is not at hand. Returns the positions kept.
    fn take_donor(&mut self, best: usize, d: usize, shared: usize, cp: Option<usize>) -> usize {
        self.cut(best, 0);
        // Its full blocks shared, a partial last one copied; its state (or
        // checkpoint) copied.
        let full = shared / frink_models::KV_BLOCK;
        let src: Vec<u32> = self.seqs[d].cache.blocks()[..SeqState::blocks_for(shared)].to_vec();
        let mut table = Vec::with_capacity(src.len());
        for &b in &src[..full] {
            self.blocks.retain(b);
            table.push(b);
        }
        let mut p = shared;
        if !shared.is_multiple_of(frink_models::KV_BLOCK) {
            match self.copied(false, src[full], shared % frink_models::KV_BLOCK) {
                Some(copy) => table.push(copy),
                None => p = full * frink_models::KV_BLOCK,
            }
        }
        let (dst, srcs) = if d < best {
            let (a, b) = self.seqs.split_at_mut(best);
            (&mut b[0], &a[d])
        } else {
            let (a, b) = self.seqs.split_at_mut(d);
            (&mut a[best], &b[0])
        };
        dst.cache.adopt(table, p);
        match cp {
            Some(c) if srcs.checkpoints[c].1.n_past == p => {
                dst.cache.restore(&srcs.checkpoints[c].1);
                self.shared
                    .checkpoints_restored
                    .fetch_add(1, Ordering::Relaxed);
            }
            _ if p == srcs.cache.n_past() => {
                dst.cache.copy_recurrent(&srcs.cache);
            }
            _ => {
                // The state at `p` is not at hand: start over.
                for b in dst.cache.take_table() {
                    self.blocks.release(b);
                }
                dst.cache.truncate(0);
                p = 0;
            }
        }
        dst.tokens = srcs.tokens[..p].to_vec();
        dst.hashes.clear();
        dst.checkpoints.clear();
        p
    }
}

/// How many leading tokens `a` and `b` share.
pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
