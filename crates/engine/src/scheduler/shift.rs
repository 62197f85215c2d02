//! Context shift in the scheduler ([`SchedulerConfig::context_shift`]): a generation
//! whose cache is full keeps its first `n_keep` tokens, drops the older half of the rest
//! and goes on (llama.cpp's server, `--context-shift`: `n_discard = (n_past - n_keep) / 2`
//! in `update_slots`; Ollama's runner the same with `num_keep`).

use std::sync::atomic::Ordering;

use super::worker::*;
use super::Request;

/// The context a request may fill: `n_ctx` (`--ctx`), or less where it asks (`num_ctx`).
pub(super) fn ctx_limit(n_ctx: usize, req: &Request) -> usize {
    req.n_ctx.map_or(n_ctx, |n| n.min(n_ctx))
}

impl Worker<'_> {
    /// The context `job` may fill ([`ctx_limit`]).
    pub(super) fn n_ctx_of(&self, job: &Job) -> usize {
        ctx_limit(self.config.n_ctx, &job.req)
    }

    /// How `job`, its cache full at `n_past` positions, goes on: the positions it keeps
    /// and drops (`None`: it cannot, and ends with `length`). Shifting is on, the
    /// request generates text without images (an image's rows are placed by prompt
    /// position), and at least one position is dropped.
    pub(super) fn shift_of(&self, job: &Job, n_past: usize) -> Option<(usize, usize)> {
        if !self.config.context_shift || !job.req.images.is_empty() || job.pooler.is_some() {
            return None;
        }
        let keep = job.req.n_keep.min(job.req.prompt.len()).min(n_past);
        let discard = (n_past - keep) / 2;
        (discard > 0).then_some((keep, discard))
    }

    /// Shifts every decoding job whose cache is full ([`Worker::shift_of`]): its cache
    /// keeps `keep` positions and the newest `n_past - keep - discard`, moved back by
    /// `discard` with their keys rotated ([`frink_models::shift`]). A job whose shift
    /// finds no blocks ends with `length`. Its proposer is dropped (its history no longer
    /// matches the cache), and what it evaluated after its prompt is now part of `input`.
    pub(super) fn shift_full(&mut self) {
        if !self.config.context_shift {
            return;
        }
        for i in 0..self.jobs.len() {
            let Some(job) = self.jobs[i].as_ref() else {
                continue;
            };
            let n_past = self.kv.n_past(i);
            if decoding(job).is_none() || n_past < self.n_ctx_of(job) {
                continue;
            }
            let Some((keep, discard)) = self.shift_of(job, n_past) else {
                continue;
            };
            let idle = self.idle();
            if !self.kv.shift(i, self.model, (keep, discard), &idle) {
                let job = self.jobs[i].take().expect("slot i runs a job");
                self.end_now(job);
                continue;
            }
            let tokens = self.kv.tokens(i).to_vec();
            let job = self.jobs[i].as_mut().expect("slot i runs a job");
            job.fed = tokens.len();
            job.input = tokens;
            job.proposer = None;
            job.shifts += 1;
            self.shared.context_shifts.fetch_add(1, Ordering::Relaxed);
        }
    }
}
