//! Placement policy: which waiting job runs next and where (the worker's side of
//! [`super::kv::KvManager`]): admission by the blocks a job and the running ones will
//! need, placing a job in the slot that reuses most, preempting the youngest.

use std::sync::atomic::Ordering;

use frink_models::SeqState;

use super::kv::*;
use super::worker::*;

impl<'t> Worker<'t> {
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
        self.jobs
            .iter()
            .enumerate()
            .filter_map(|(i, j)| j.as_ref().map(|j| (i, j)))
            .map(|(i, j)| {
                let end =
                    (j.req.prompt.len() + j.ids.len() + self.growth(j)).min(self.config.n_ctx);
                SeqState::blocks_for(end).saturating_sub(self.kv.held_blocks(i))
            })
            .sum()
    }

    /// Stops slot `i`'s job to give its blocks to older ones (vLLM's recompute
    /// preemption): its blocks go back to the pool (the full ones stay in the prefix
    /// cache) and the job waits, in arrival order, to be evaluated again from its prompt
    /// and the answer so far. Its client sees nothing of it: the same tokens follow.
    pub(super) fn preempt(&mut self, i: usize) {
        self.pressed = Some(self.ended());
        let Some(mut job) = self.jobs[i].take() else {
            return;
        };
        if job.shifts > 0 {
            // Its cache holds what is left after the shifts: that is evaluated again.
            job.input = self.kv.tokens(i).to_vec();
        }
        self.kv.cut(i, 0);
        if job.next.is_some() && job.shifts == 0 {
            // Every generated token but the last (sampled, not evaluated) is in the
            // cache: all of them are evaluated again before the last one is.
            let evaluated = job.ids.len() - 1;
            job.input.truncate(job.req.prompt.len());
            job.input.extend_from_slice(&job.ids[..evaluated]);
        }
        job.fed = 0;
        if let Some(e) = &job.req.embed {
            job.pooler = crate::embed::Pooler::new(e.pooling, self.model.config.n_embd).ok();
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
        let idle = self.idle();
        let n = job.input.len();
        let keep = if job.pooler.is_some() { 0 } else { n - 1 };
        let lora = lora_key(&job.req.lora);
        let Some((best, source, hashes)) = self.kv.choose_source(&job.input, keep, &lora, &idle)
        else {
            return Err(job);
        };
        // Blocks it needs beyond the reused ones (a partial reused block may need a
        // copy), against what the pool has and idle slots could give back.
        let reused = source.len();
        let end = (n + self.growth(&job)).min(self.config.n_ctx).max(n + 1);
        let need = SeqState::blocks_for(end) - reused / frink_models::KV_BLOCK;
        let mut keep_slots = vec![best];
        if let Source::Donor(d, ..) | Source::Cache(_, Some((d, _)), _) = source {
            keep_slots.push(d);
        }
        let own_blocks = match &source {
            Source::Own(..) => 0,
            _ => self.kv.blocks_alone(best),
        };
        let available = self.kv.available() + self.kv.reclaimable(&idle, &keep_slots) + own_blocks;
        if need + self.committed_growth() > available && self.busy() > 0 {
            return Err(job);
        }
        let prefix = self.kv.take(best, source, &hashes, &job.input, &idle);
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
        self.kv.assign(best, lora, self.placements);
        self.jobs[best] = Some(*job);
        self.publish_busy();
        self.kv.publish_checkpoints();
        Ok(())
    }
}
