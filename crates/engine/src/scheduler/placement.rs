//! Where a request's keys and values live: placing a job in a slot (its own prefix, the
//! prefix cache, a donor slot, a checkpoint), the blocks it holds (cut, grow, reclaim,
//! preempt, slide its window, register its full blocks), and recurrent checkpoints.

use std::sync::atomic::Ordering;

use frink_models::{Model, SeqState};

use super::worker::*;
use super::*;

impl<'t> Worker<'t> {
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
        let cache = &mut self.slots[i].cache;
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
        let behind = self.window_from(self.slots[i].cache.n_past());
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
        (p + 1).saturating_sub(self.model.config.plan.window()) / frink_models::KV_BLOCK
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
                self.slots[d]
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
        self.config.ctx_checkpoints > 0 && self.model.config.plan.is_recurrent()
    }

    /// Whether the prefix cache serves this model: attention only (a recurrent layer's
    /// state at a prefix is not in the blocks).
    pub(super) fn prefix_caching(&self) -> bool {
        !self.model.config.plan.is_recurrent()
    }

    /// Saves slot `i`'s state as a checkpoint at its current position (once per
    /// position), then drops the oldest beyond the per-slot count and the byte budget.
    pub(super) fn save_checkpoint(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let at = slot.cache.n_past();
        if slot.checkpoints.iter().any(|(_, c)| c.n_past == at) {
            return;
        }
        self.checkpoints_taken += 1;
        slot.checkpoints
            .push((self.checkpoints_taken, slot.cache.checkpoint()));
        if slot.checkpoints.len() > self.config.ctx_checkpoints {
            slot.checkpoints.remove(0);
        }
        loop {
            let bytes: usize = self
                .slots
                .iter()
                .flat_map(|s| &s.checkpoints)
                .map(|(_, c)| c.bytes())
                .sum();
            if bytes <= self.config.checkpoint_budget {
                break;
            }
            // The oldest of all.
            let Some((si, ci)) = self
                .slots
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
            self.slots[si].checkpoints.remove(ci);
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
            keep = self.slots[i].cache.truncate(keep);
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
        let slot = &mut self.slots[i];
        slot.tokens.truncate(keep);
        slot.hashes.truncate(keep / frink_models::KV_BLOCK);
        // Checkpoints past the prefix saw tokens a new prompt replaces.
        slot.checkpoints.retain(|(_, c)| c.n_past <= keep);
        keep
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
        let copy = self.group(window).alloc()?;
        self.pool.copy_block(window, src, copy, rows);
        Some(copy)
    }

    /// Gives slot `i` blocks for `n` positions (in each group), taking them from idle
    /// slots (least recently used first) when the pool has too few free; `false`
    /// (nothing taken) when even that is not enough.
    pub(super) fn grow(&mut self, i: usize, n: usize) -> bool {
        let want = SeqState::blocks_for(n);
        let need = |w: &mut Self, g: bool| want.saturating_sub(w.table(i, g).len());
        let short = |w: &mut Self| {
            w.groups()
                .iter()
                .any(|&g| need(w, g) > w.group(g).available())
        };
        if short(self) {
            self.reclaim(&[i], short);
        }
        if short(self) {
            return false;
        }
        for &g in self.groups() {
            // A window block the next write lands in that was given back (a window of one
            // position) is replaced.
            let at = self.slots[i].cache.n_past() / frink_models::KV_BLOCK;
            if self.table(i, g).get(at) == Some(&frink_models::EVICTED) {
                let b = self.group(g).alloc().expect("counted available");
                self.table(i, g)[at] = b;
            }
            for _ in 0..need(self, g) {
                let b = self.group(g).alloc().expect("counted available");
                self.table(i, g).push(b);
            }
        }
        true
    }

    /// Idle slots (not `except`) give their blocks back, least recently used first,
    /// while `short` says the pool is short or until none is left to give.
    pub(super) fn reclaim(&mut self, except: &[usize], short: impl Fn(&mut Self) -> bool) {
        while short(self) {
            let Some(i) = (0..self.slots.len())
                .filter(|i| !except.contains(i))
                .filter(|&i| {
                    self.slots[i].job.is_none() && !self.slots[i].cache.blocks().is_empty()
                })
                .min_by_key(|&i| self.slots[i].used)
            else {
                return;
            };
            self.cut(i, 0);
        }
    }

    /// Blocks idle slots (not `except`) hold alone: what [`Worker::reclaim`] could free.
    pub(super) fn reclaimable(&self, except: &[usize]) -> usize {
        (0..self.slots.len())
            .filter(|i| !except.contains(i) && self.slots[*i].job.is_none())
            .flat_map(|i| self.slots[i].cache.blocks())
            .filter(|&&b| self.blocks.refs(b) == 1)
            .count()
    }

    /// Registers the full blocks slot `i` has filled since the last call in the prefix
    /// cache.
    pub(super) fn register_full_blocks(&mut self, i: usize) {
        if !self.prefix_caching() {
            return;
        }
        let slot = &mut self.slots[i];
        let full = slot.cache.n_past() / frink_models::KV_BLOCK;
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

    /// Answer tokens admission keeps room for after `job`'s input: the rest of its
    /// `max_tokens`, at most [`GROWTH_HORIZON`], at least one.
    pub(super) fn growth(&self, job: &Job) -> usize {
        let left = job.req.max_tokens.map_or(GROWTH_HORIZON, |m| {
            m.saturating_sub(job.ids.len()).min(GROWTH_HORIZON)
        });
        left.max(1)
    }

    /// Blocks running sequences will still take to grow by [`Worker::growth`] (up to
    /// `--ctx`) beyond those they hold.
    pub(super) fn committed_growth(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.job.as_ref().map(|j| (s, j)))
            .map(|(s, j)| {
                let end =
                    (j.req.prompt.len() + j.ids.len() + self.growth(j)).min(self.config.n_ctx);
                SeqState::blocks_for(end).saturating_sub(s.cache.blocks().len())
            })
            .sum()
    }

    /// Stops slot `i`'s job to give its blocks to older ones (vLLM's recompute
    /// preemption): its blocks go back to the pool (the full ones stay in the prefix
    /// cache) and the job waits, in arrival order, to be evaluated again from its prompt
    /// and the answer so far. Its client sees nothing of it: the same tokens follow.
    pub(super) fn preempt(&mut self, i: usize) {
        self.pressed = Some(self.ended());
        let Some(mut job) = self.slots[i].job.take() else {
            return;
        };
        self.cut(i, 0);
        if job.next.is_some() {
            // Every generated token but the last (sampled, not evaluated) is in the
            // cache: all of them are evaluated again before the last one is.
            let evaluated = job.ids.len() - 1;
            job.input.truncate(job.req.prompt.len());
            job.input.extend_from_slice(&job.ids[..evaluated]);
        }
        job.fed = 0;
        if let Some(p) = job.req.embed {
            job.pooler = crate::embed::Pooler::new(p, self.model.config.n_embd).ok();
        }
        self.shared.preemptions.fetch_add(1, Ordering::Relaxed);
        // Waiting again (counted until placed).
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        let at = self
            .waiting
            .iter()
            .position(|w| w.arrived > job.arrived)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, Box::new(job));
        self.publish_busy();
    }

    /// Places waiting jobs in slots, oldest first, while a slot is free and the pool can
    /// hold the next one's tokens (so a large request is not passed by small ones).
    pub(super) fn place_waiting(&mut self) {
        if self.busy() > 0 && self.pressed == Some(self.ended()) {
            return;
        }
        self.pressed = None;
        while let Some(job) = self.waiting.pop_front() {
            if job.req.sink.is_closed() {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                self.shared
                    .requests_cancelled
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match self.place(job) {
                Ok(()) => {}
                Err(job) => {
                    self.waiting.push_front(job);
                    break;
                }
            }
        }
    }

    /// Puts `job` in the free slot that reuses the longest prefix of its input (the
    /// slot's own tokens or one of its checkpoints, full blocks of the prefix cache, or
    /// for a recurrent model another slot's tokens), when the pool can hold the rest of
    /// its input and a first reserve; gives it back otherwise.
    pub(super) fn place(&mut self, mut job: Box<Job<'t>>) -> Result<(), Box<Job<'t>>> {
        let Some(free) = self.slots.iter().position(|s| s.job.is_none()) else {
            return Err(job);
        };
        let n = job.input.len();
        let keep = if job.pooler.is_some() { 0 } else { n - 1 };
        let lora = lora_key(&job.req.lora);
        let (best, source, hashes) = self.choose_source(&job, free, keep, &lora);
        // Blocks it needs beyond the reused ones (a partial reused block may need a
        // copy), against what the pool has and idle slots could give back.
        let reused = source.len();
        let end = (n + self.growth(&job)).min(self.config.n_ctx).max(n + 1);
        let need = SeqState::blocks_for(end) - reused / frink_models::KV_BLOCK;
        let mut keep_slots = vec![best];
        if let Source::Donor(d, ..) | Source::Cache(_, Some((d, _))) = source {
            keep_slots.push(d);
        }
        let own_blocks = match &source {
            Source::Own(..) => 0,
            _ => self.slots[best]
                .cache
                .blocks()
                .iter()
                .filter(|&&b| self.blocks.refs(b) == 1)
                .count(),
        };
        let available = self.blocks.available() + self.reclaimable(&keep_slots) + own_blocks;
        if need + self.committed_growth() > available && self.busy() > 0 {
            return Err(job);
        }
        let prefix = match source {
            Source::Own(p, cp) => self.take_own(best, p, cp),
            Source::Cache(hit, tail) => self.take_cached(best, hit, tail, &hashes, &job.input),
            Source::Donor(d, shared, cp) => self.take_donor(best, d, shared, cp),
        };
        if !job.placed {
            job.placed = true;
            job.cached = prefix;
            self.shared
                .prompt_tokens
                .fetch_add(job.req.prompt.len() as u64, Ordering::Relaxed);
            self.shared
                .prompt_tokens_cached
                .fetch_add(prefix as u64, Ordering::Relaxed);
        }
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        self.placements += 1;
        job.fed = prefix;
        let slot = &mut self.slots[best];
        slot.lora = lora;
        slot.used = self.placements;
        slot.job = Some(*job);
        self.publish_busy();
        self.publish_checkpoints();
        Ok(())
    }

    /// The slot for a job and where its reused prefix comes from: the free slot whose
    /// own tokens give the longest prefix (ties to the slot holding the least), unless
    /// the prefix cache (or, for a recurrent model, another slot) gives more. `keep`:
    /// the most positions reused (an embedding reuses none: it pools every token's
    /// hidden state; otherwise one token is evaluated for the next token's logits).
    /// Also returns the prefix-cache keys of the input's full blocks (empty without
    /// prefix caching).
    fn choose_source(
        &self,
        job: &Job,
        free: usize,
        keep: usize,
        lora: &[(usize, u32)],
    ) -> (usize, Source, Vec<u64>) {
        // The free slot whose own tokens give the longest prefix; ties go to the slot
        // holding the least.
        let (best, (own, checkpoint)) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.job.is_none())
            .map(|(i, s)| {
                let common = common_prefix(&s.tokens, &job.input).min(keep);
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
            block_hashes(&job.input[..keep], lora)
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
                .slots
                .iter()
                .enumerate()
                .filter(|&(i, s)| i != best && s.cache.blocks().len() > hit.len())
                .map(|(i, s)| {
                    (
                        i,
                        s.reusable(common_prefix(&s.tokens, &job.input).min(keep), lora)
                            .0,
                    )
                })
                .filter(|&(_, c)| c > p)
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                .map(|(i, c)| (i, (c - p).min(frink_models::KV_BLOCK)));
            let mut tail = tail;
            self.window_hit(&hashes, &mut hit, &mut tail);
            let cached = Source::Cache(hit, tail);
            if cached.len() > source.len() {
                source = cached;
            }
        } else {
            // A recurrent model: another slot's state (or checkpoint), busy or free.
            if let Some((d, (shared, cp))) = self
                .slots
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != best)
                .map(|(i, s)| {
                    (
                        i,
                        s.reusable(common_prefix(&s.tokens, &job.input).min(keep), lora),
                    )
                })
                .max_by(|a, b| (a.1).0.cmp(&(b.1).0).then(b.0.cmp(&a.0)))
            {
                if shared > source.len() {
                    source = Source::Donor(d, shared, cp);
                }
            }
        }
        (best, source, hashes)
    }

    /// Reuses the slot's own first `p` positions (from checkpoint `cp` where given);
    /// returns the positions kept.
    fn take_own(&mut self, best: usize, p: usize, cp: Option<usize>) -> usize {
        if let Some(c) = cp {
            let Slot {
                cache, checkpoints, ..
            } = &mut self.slots[best];
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
        hit: Vec<u32>,
        tail: Option<(usize, usize)>,
        hashes: &[u64],
        input: &[u32],
    ) -> usize {
        self.cut(best, 0);
        for &b in &hit {
            self.blocks.retain(b);
        }
        let mut p = hit.len() * frink_models::KV_BLOCK;
        let mut table = hit;
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
            self.reclaim(&[best, d], short);
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
        let slot = &mut self.slots[best];
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
        let src: Vec<u32> = self.slots[d].cache.blocks()[..SeqState::blocks_for(shared)].to_vec();
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
            let (a, b) = self.slots.split_at_mut(best);
            (&mut b[0], &a[d])
        } else {
            let (a, b) = self.slots.split_at_mut(d);
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
