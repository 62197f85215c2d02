//! What a step's logits become: proposals verified, tokens sampled (log-probabilities
//! read), text decoded and stops applied, answers completed, embeddings sent.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::worker::*;
use super::*;

impl<'t> Worker<'t> {
    /// Samples slot `i`'s tokens from the rows of its speculative step (its token at
    /// position `at`, then `drafts`: `logits` holds a row for each) as plain decoding
    /// would, one row at a time: row `m`'s choice is emitted, and if it is not `drafts[m]`
    /// the step ends there (the choice is evaluated next step). The slot is cut back to
    /// the proposals taken; its job goes back unless it finished.
    pub(super) fn verify(&mut self, i: usize, drafts: &[u32], logits: &[f32], at: usize) {
        let Some(mut job) = self.jobs[i].take() else {
            self.kv.register_full_blocks(i);
            return;
        };
        job.proposed += drafts.len();
        let nv = logits.len() / (drafts.len() + 1);
        self.shared
            .spec_proposed
            .fetch_add(drafts.len() as u64, Ordering::Relaxed);
        let q = job
            .proposer
            .as_mut()
            .map(|p| p.distributions())
            .unwrap_or_default();
        let mut job = Some(job);
        let mut taken = 0;
        for m in 0..=drafts.len() {
            let expect = drafts.get(m).map(|&d| (d, q.get(m).map(Vec::as_slice)));
            let j = job.take().expect("running until it ends");
            job = self.sample(j, &logits[m * nv..(m + 1) * nv], at + 1 + m, expect);
            match (job.as_ref(), expect) {
                (Some(j), Some((d, _))) if j.next == Some(d) => taken += 1,
                _ => break,
            }
        }
        if taken < drafts.len() {
            self.kv.cut(i, at + 1 + taken);
        }
        self.kv.register_full_blocks(i);
        if let Some(j) = job.as_mut() {
            j.adaptive.record(drafts.len(), taken);
        }
        self.jobs[i] = job;
    }

    /// Samples the next token of `job` from `logits` (the row at `n_past` positions;
    /// `expect`: the token proposed there and the distribution it was drawn from, if
    /// any, chosen by [`SchedulerConfig::spec_sampling`] and counted when taken), sends
    /// what it adds, and returns the job unless it finished (or its client went away).
    pub(super) fn sample(
        &self,
        mut job: Job<'t>,
        logits: &[f32],
        n_past: usize,
        expect: Option<(u32, Option<&[Candidate]>)>,
    ) -> Option<Job<'t>> {
        if job.req.max_tokens == Some(0) {
            // llama.cpp's `n_predict: 0`: the prompt is evaluated (and its keys and values
            // kept for the next request), nothing is generated.
            self.end_now(job);
            return None;
        }
        let sampled = match expect {
            Some((d, q)) => {
                job.sampler
                    .try_sample_proposed(logits, d, q, self.config.spec_sampling)
            }
            None => job.sampler.try_sample(logits),
        };
        if job.sampler.is_constrained() {
            // All grammar time since the last token, computed ahead or not.
            let busy = job.sampler.constraint_busy();
            let ns = busy.saturating_sub(job.grammar_counted).as_nanos() as u64;
            job.grammar_counted = busy;
            self.shared.grammar_ns.fetch_add(ns, Ordering::Relaxed);
            self.shared.grammar_tokens.fetch_add(1, Ordering::Relaxed);
        }
        let id = match sampled {
            Ok(id) => id,
            Err(e) => {
                self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                job.req.sink.send(Event::Failed(RequestError::Grammar {
                    at: job.ids.len() + 1,
                    reason: e.to_string(),
                }));
                return None;
            }
        };
        job.sampler.accept(id);
        job.ids.push(id);
        self.shared.tokens_generated.fetch_add(1, Ordering::Relaxed);
        if expect.is_some_and(|(d, _)| d == id) {
            job.accepted += 1;
            self.shared.spec_accepted.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        if let Ok(mut h) = self.shared.histograms.lock() {
            if job.first_token.is_none() {
                h.0.observe((now - job.arrived).as_secs_f64());
            } else {
                h.1.observe((now - job.last_token).as_secs_f64());
            }
        }
        job.first_token.get_or_insert(now);
        job.last_token = now;

        // A complete grammar allows only end-of-generation tokens: the answer ends there
        // even with `ignore_eos`.
        let rule = crate::FinishRule {
            max_tokens: job.req.max_tokens,
            ignore_eos: job.req.ignore_eos,
        };
        let eog = rule.ends_at_eog(self.tok.is_eog(id), job.sampler.constraint_complete());
        let mut text = String::new();
        let mut tokens = Vec::new();
        if !eog {
            match job.decoder.push(id) {
                Ok(piece) => text = job.stops.push(&piece),
                Err(e) => {
                    self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                    job.req
                        .sink
                        .send(Event::Failed(RequestError::Decoding(e.to_string())));
                    return None;
                }
            }
            if let Some(n) = job.req.top_logprobs {
                tokens.push(logprob_of(logits, id, n));
            }
        }
        let finish = rule.after(
            eog,
            job.stops.stopped() || job.req.sink.stop_requested(),
            job.ids.len(),
            n_past >= self.n_ctx_of(&job) && self.shift_of(&job, n_past).is_none(),
        );
        let Some(finish_reason) = finish else {
            if (!text.is_empty() || !tokens.is_empty())
                && !job.req.sink.send(Event::Delta { text, tokens })
            {
                self.shared
                    .requests_cancelled
                    .fetch_add(1, Ordering::Relaxed);
                return None;
            }
            job.next = Some(id);
            return Some(job);
        };
        self.complete(job, finish_reason, text, tokens, now);
        None
    }

    /// Ends `job` here with `length` and nothing more to show (a budget of 0 tokens, or a
    /// full pool with no other request to preempt).
    pub(super) fn end_now(&self, job: Job<'t>) {
        self.complete(
            job,
            FinishReason::Length,
            String::new(),
            Vec::new(),
            Instant::now(),
        );
    }

    /// Ends `job` with `finish_reason`: the text its decoder and stop matcher still hold
    /// (after `text`), then `Done`.
    pub(super) fn complete(
        &self,
        job: Job<'t>,
        finish_reason: FinishReason,
        mut text: String,
        tokens: Vec<TokenLogprob>,
        now: Instant,
    ) {
        let Job {
            mut req,
            decoder,
            mut stops,
            ..
        } = job;
        text.push_str(&stops.push(&decoder.finish()));
        text.push_str(&stops.finish());
        if !text.is_empty() || !tokens.is_empty() {
            req.sink.send(Event::Delta { text, tokens });
        }
        let first = job.first_token.unwrap_or(now);
        // Counted before the client can see the end, so a client reading the metrics right
        // after its answer sees its request finished and its slot free (the job is out of
        // its slot already).
        self.shared
            .requests_finished
            .fetch_add(1, Ordering::Relaxed);
        self.publish_busy();
        let stop_string = stops.matched().map(str::to_string);
        req.sink.send(Event::Done(Completion {
            finish_reason,
            stop_string,
            prompt_tokens: req.prompt.len(),
            cached_tokens: job.cached,
            ids: job.ids,
            first_token_ms: (first - job.arrived).as_secs_f64() * 1e3,
            gen_ms: (now - first).as_secs_f64() * 1e3,
            proposed: job.proposed,
            accepted: job.accepted,
            context_shifts: job.shifts,
        }));
    }
}

impl Worker<'_> {
    /// Sends an embedding request's vector and its end; its slot is free.
    pub(super) fn finish_embedding(&self, mut job: Job<'_>) {
        let Some(pooler) = job.pooler.take() else {
            return;
        };
        match pooler.finish() {
            Ok(v) => {
                job.req.sink.send(Event::Embedding(v));
            }
            Err(e) => {
                self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                job.req
                    .sink
                    .send(Event::Failed(RequestError::Embedding(e.to_string())));
                return;
            }
        }
        let now = Instant::now();
        self.shared
            .requests_finished
            .fetch_add(1, Ordering::Relaxed);
        self.publish_busy();
        job.req.sink.send(Event::Done(Completion {
            finish_reason: FinishReason::Stop,
            stop_string: None,
            prompt_tokens: job.req.prompt.len(),
            cached_tokens: 0,
            ids: Vec::new(),
            first_token_ms: (now - job.arrived).as_secs_f64() * 1e3,
            gen_ms: 0.0,
            proposed: 0,
            accepted: 0,
            context_shifts: 0,
        }));
    }
}

/// `id`'s log-probability in the softmax of `logits`, and the `n` best alternatives.
pub(super) fn logprob_of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| ((v - max) as f64).exp())
        .sum();
    let lse = max + sum.ln() as f32;
    let lp = |v: f32| {
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v - lse
        }
    };
    // The n best by (logit descending, id ascending), kept sorted while scanning.
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &v) in logits.iter().enumerate() {
            if v.is_nan() || (top.len() == n && v <= top[n - 1].1) {
                continue;
            }
            let at = top.partition_point(|&(_, t)| t >= v);
            top.insert(at, (i as u32, v));
            top.truncate(n);
        }
    }
    TokenLogprob {
        id,
        logprob: lp(logits[id as usize]),
        top: top.into_iter().map(|(t, v)| (t, lp(v))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_normalized_log_softmax() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let p: f32 = (0..4)
            .map(|j| logprob_of(&logits, j, 0).logprob.exp())
            .sum();
        assert!((p - 1.0).abs() < 1e-5, "{p}");
        // Best first, ties to the lower id.
        let t = logprob_of(&logits, 2, 3);
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        assert_eq!(t.logprob, t.top[2].1);
        assert!(t.top[0].1 > t.top[2].1);
    }

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::default();
        h.observe(0.003);
        h.observe(0.2);
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[5], 2);
        assert_eq!(h.count, 2);
    }
}
