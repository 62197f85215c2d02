//! The worker thread: admission (the queue, the deferred requests, cancellation) and the
//! step (one batched forward pass over every active sequence).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use frink_models::{EmbdRows, KvType, Logits, Model, ModelError, Sequence};
use frink_tokenizer::{StreamDecoder, Tokenizer};

use crate::image::{
    check_images, chunk_end, embd_rows, is_image_key, model_ids, reached, rope_shift, PromptImage,
};

use super::kv::*;
use super::*;

/// A request's [`DraftModel`], its cache made at the first proposal (a queued request
/// holds none) and dropped with the request.
pub(super) struct LazyDraft<'t> {
    pub(super) model: &'t Model,
    pub(super) n_ctx: usize,
    pub(super) kv_type: KvType,
    pub(super) p_min: f32,
    pub(super) n_min: usize,
    pub(super) eog: HashSet<u32>,
    /// The target bans end-of-generation tokens ([`DraftModel::ban_eog`]).
    pub(super) ban_eog: bool,
    /// Draws from this chain (rejection sampling), else greedy.
    pub(super) sampling: Option<SamplingParams>,
    pub(super) draft: Option<DraftModel<'t>>,
}

impl Propose for LazyDraft<'_> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let d = self.draft.get_or_insert_with(|| {
            let mut d = DraftModel::new(self.model, self.n_ctx, self.kv_type);
            d.p_min = self.p_min;
            d.n_min = self.n_min;
            d.eog = std::mem::take(&mut self.eog);
            d.ban_eog = self.ban_eog;
            if let Some(p) = &self.sampling {
                d.sample_with(p);
            }
            d
        });
        d.propose(history, max)
    }

    fn distributions(&mut self) -> Vec<Vec<Candidate>> {
        self.draft
            .as_mut()
            .map(Propose::distributions)
            .unwrap_or_default()
    }
}

/// How often an idle worker looks at its slot operations ([`super::slots`]).
const IDLE_POLL: Duration = Duration::from_millis(20);

/// A request running in a slot, or waiting for one.
pub(super) struct Job<'t> {
    pub(super) req: Request,
    pub(super) sampler: Sampler,
    /// The grammar time already added to the metrics.
    pub(super) grammar_counted: Duration,
    pub(super) decoder: StreamDecoder<'t>,
    pub(super) stops: StopMatcher,
    /// The tokens its cache must hold before it decodes: the prompt, and after a
    /// preemption also the answer so far (all but the sampled token not yet evaluated).
    pub(super) input: Vec<u32>,
    /// Tokens of `input` already in the cache.
    pub(super) fed: usize,
    /// Prompt tokens reused from a cache when it was first placed.
    pub(super) cached: usize,
    /// Whether it has been placed in a slot before (a preempted job has).
    pub(super) placed: bool,
    /// The last sampled token, not yet evaluated (decode phase).
    pub(super) next: Option<u32>,
    /// An embedding request's pooled rows so far.
    pub(super) pooler: Option<crate::embed::Pooler>,
    pub(super) ids: Vec<u32>,
    pub(super) arrived: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) last_token: Instant,
    /// What proposes tokens to verify (`None`: it decodes one token a step).
    pub(super) proposer: Option<Box<dyn Propose + 't>>,
    /// How many to propose, from its acceptance so far.
    pub(super) adaptive: Adaptive,
    /// Tokens proposed and verified, and accepted ([`Completion::proposed`]).
    pub(super) proposed: usize,
    pub(super) accepted: usize,
    /// Context shifts so far: its cache holds its tokens with some dropped (a
    /// preemption evaluates those again, not the whole history).
    pub(super) shifts: usize,
}

/// The identity of an adapter set for prefix reuse: the adapters of nonzero scale, by
/// index, with their scales' bits (scale 0 computes exactly the base model).
pub(super) fn lora_key(set: &[(usize, f32)]) -> Vec<(usize, u32)> {
    let mut k: Vec<(usize, u32)> = set
        .iter()
        .filter(|(_, s)| *s != 0.0)
        .map(|&(i, s)| (i, s.to_bits()))
        .collect();
    k.sort_unstable();
    k.dedup_by_key(|e| e.0);
    k
}

/// Tokens of a sequence's answer that admission keeps blocks for (its `max_tokens` when
/// smaller): a new request is placed beside running ones only when the pool holds its
/// prompt and this much growth of it and of every running sequence. Without it, with 64
/// streams of 350-token prompts and 128-token answers on a pool of 16k positions, every
/// request was admitted and two thirds of them were preempted (their prompts evaluated
/// twice or more: 66 preemptions per 64 requests, smollm2-135m); a longer answer than
/// the horizon still grows, by preemption of the youngest when the pool runs out.
pub(super) const GROWTH_HORIZON: usize = 256;

pub(super) struct Worker<'t> {
    pub(super) model: &'t Model,
    /// Decode and verification step times by rows (how many proposals pay).
    pub(super) step_cost: StepCost,
    /// The draft model (`--draft-model`), if any.
    pub(super) draft: Option<&'t Model>,
    pub(super) tok: &'t Tokenizer,
    pub(super) config: SchedulerConfig,
    pub(super) shared: Arc<Shared>,
    /// Every slot's keys and values, and the pool they live in.
    pub(super) kv: KvManager,
    /// The job each slot runs (`None`: the slot is idle).
    pub(super) jobs: Vec<Option<Job<'t>>>,
    /// Requests waiting for their group's prompt to be evaluated.
    pub(super) deferred: Vec<Request>,
    /// Jobs waiting for a slot and blocks, oldest first: new ones the pool could not
    /// take yet, and preempted ones.
    pub(super) waiting: std::collections::VecDeque<Box<Job<'t>>>,
    /// Jobs placed so far (the slots' `used` order).
    pub(super) placements: u64,
    /// Requests ended (finished or cancelled) when a sequence was last preempted: until
    /// another ends, no waiting job is placed beside running ones (placing it would only
    /// take blocks the running ones are about to need: vLLM schedules no new prefill in
    /// a step that preempted).
    pub(super) pressed: Option<u64>,
    /// Whether the machine has a core the compute pool leaves free, where grammar masks
    /// are computed beside the forward pass (see `step`).
    pub(super) spare_core: bool,
    /// The model's [`crate::state_file::model_fingerprint`], made at the first slot
    /// operation that needs it.
    pub(super) fingerprint: Option<String>,
}

impl<'t> Worker<'t> {
    pub(super) fn new(
        model: &'t Model,
        draft: Option<&'t Model>,
        tok: &'t Tokenizer,
        config: SchedulerConfig,
        shared: Arc<Shared>,
    ) -> Self {
        let mut config = config;
        let kv = KvManager::new(model, &mut config, Arc::clone(&shared));
        let jobs = (0..config.parallel).map(|_| None).collect();
        Worker {
            model,
            step_cost: StepCost::default(),
            draft,
            tok,
            config,
            shared,
            kv,
            jobs,
            deferred: Vec::new(),
            waiting: Default::default(),
            placements: 0,
            pressed: None,
            spare_core: std::thread::available_parallelism()
                .is_ok_and(|n| n.get() > frink_models::pool::threads()),
            fingerprint: None,
        }
    }

    pub(super) fn busy(&self) -> usize {
        self.jobs.iter().filter(|j| j.is_some()).count()
    }

    /// Which slots are idle (`idle[i]`: slot `i` runs no job).
    pub(super) fn idle(&self) -> Vec<bool> {
        self.jobs.iter().map(Option::is_none).collect()
    }

    /// Requests finished, cancelled or failed so far.
    pub(super) fn ended(&self) -> u64 {
        self.shared.requests_finished.load(Ordering::Relaxed)
            + self.shared.requests_cancelled.load(Ordering::Relaxed)
            + self.shared.requests_failed.load(Ordering::Relaxed)
    }

    /// Whether `req` should wait for its group's prompt: it follows one, no slot holds
    /// that prompt yet (all but its last token), and the request evaluating it still runs.
    pub(super) fn must_wait(&self, req: &Request) -> bool {
        let Some(group) = req.prefix_group.filter(|_| req.follows_prefix) else {
            return false;
        };
        let want = req.prompt.len().saturating_sub(1);
        let held =
            (0..self.jobs.len()).any(|i| common_prefix(self.kv.tokens(i), &req.prompt) >= want);
        let leader_runs = self.jobs.iter().any(|j| {
            j.as_ref()
                .is_some_and(|j| j.req.prefix_group == Some(group) && !j.req.follows_prefix)
        });
        !held && leader_runs
    }

    /// Admits `req`, or keeps it aside while it must wait for its group's prompt.
    pub(super) fn admit_or_defer(&mut self, req: Request) {
        if self.must_wait(&req) {
            self.deferred.push(req);
        } else {
            self.admit(req);
        }
    }

    /// Admits the deferred requests that need not wait any longer.
    pub(super) fn admit_deferred(&mut self) {
        let mut i = 0;
        while i < self.deferred.len() {
            if self.must_wait(&self.deferred[i]) {
                i += 1;
            } else {
                let req = self.deferred.remove(i);
                self.admit(req);
            }
        }
    }

    /// Whether a job could be placed now: a free slot, and nobody waiting before it.
    pub(super) fn can_take(&self) -> bool {
        self.waiting.is_empty() && self.jobs.iter().any(Option::is_none)
    }

    pub(super) fn run(mut self, rx: Receiver<Request>) {
        let mut open = true;
        loop {
            self.slot_ops();
            self.admit_deferred();
            self.place_waiting();
            if self.busy() == 0 && self.waiting.is_empty() {
                if !open {
                    return;
                }
                // Idle: wait until a request arrives or the queue closes, looking at the
                // slot operations every `IDLE_POLL`.
                match rx.recv_timeout(IDLE_POLL) {
                    Ok(req) => self.admit_or_defer(req),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                self.place_waiting();
            }
            while open && self.can_take() {
                match rx.try_recv() {
                    Ok(req) => {
                        self.admit_or_defer(req);
                        self.place_waiting();
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if self.shared.cancel_all.load(Ordering::SeqCst) {
                // Refuse what still waits, then stop what runs.
                let deferred = std::mem::take(&mut self.deferred);
                for mut req in rx.try_iter().chain(deferred) {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    req.sink.send(Event::Failed(RequestError::ShuttingDown));
                }
                for mut job in std::mem::take(&mut self.waiting) {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    job.req.sink.send(Event::Failed(RequestError::ShuttingDown));
                }
            }
            self.drop_cancelled();
            if self.busy() > 0 {
                self.step();
            }
            self.publish_busy();
        }
    }

    /// Checks `req`, makes its job and queues it for a slot ([`Worker::place_waiting`]).
    pub(super) fn admit(&mut self, mut req: Request) {
        if req.sink.is_closed() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.shared
                .requests_cancelled
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.shared.cancel_all.load(Ordering::SeqCst) {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            req.sink.send(Event::Failed(RequestError::ShuttingDown));
            return;
        }
        let n_vocab = self.model.config.n_vocab;
        let error = match self.config.prompt_limit().check(req.prompt.len()) {
            Err(e) => Some(RequestError::Prompt(e)),
            Ok(()) => image_error(&req, self.model.config.n_embd).or_else(|| {
                req.prompt
                    .iter()
                    .find(|&&t| t as usize >= n_vocab && !is_image_key(t))
                    .map(|&id| RequestError::TokenOutOfVocabulary { id, n_vocab })
            }),
        };
        let pooler = match &req.embed {
            Some(e) if e.token_types.iter().any(|&t| t != 0) => Err(RequestError::Embedding(
                "token types on a model without them (a decoder)".into(),
            )),
            Some(e) => crate::embed::Pooler::new(e.pooling, self.model.config.n_embd)
                .map(Some)
                .map_err(|e| RequestError::Embedding(e.to_string())),
            None => Ok(None),
        };
        let pooler = match error.map_or(pooler, Err) {
            Ok(p) => p,
            Err(e) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                req.sink.send(Event::Failed(e));
                return;
            }
        };
        let mut sampler = Sampler::new(req.sampling.clone()).with_constraint(req.constraint.take());
        crate::FinishRule {
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
        }
        .prepare(&mut sampler, self.tok.eog_ids().iter().copied());
        for t in model_ids(&req.prompt, IMAGE_PLACEHOLDER) {
            sampler.accept(t);
        }
        let now = Instant::now();
        let decoder = self.tok.stream_decoder(false).showing(&req.shown_tokens);
        // A recurrent state cannot be cut back past rejected proposals.
        let proposer: Option<Box<dyn Propose + 't>> = if pooler.is_some()
            || self.model.config.plan.is_recurrent()
            || !req.images.is_empty()
        {
            None
        } else if let Some(p) = req.prediction.take() {
            Some(Box::new(PredictionLookup::new(p, req.prompt.len())))
        } else if let Some(d) = self.draft {
            Some(Box::new(LazyDraft {
                model: d,
                n_ctx: self.config.n_ctx,
                kv_type: self.config.kv_type,
                p_min: self.config.draft_p_min,
                n_min: self.config.draft_min,
                eog: self.tok.eog_ids().iter().copied().collect(),
                ban_eog: req.ignore_eos && !sampler.is_constrained(),
                sampling: (self.config.spec_sampling == SpecSampling::Rejection)
                    .then(|| req.sampling.clone()),
                draft: None,
            }))
        } else if self.config.prompt_lookup {
            Some(Box::new(NgramLookup::default()))
        } else {
            None
        };
        self.waiting.push_back(Box::new(Job {
            stops: StopMatcher::new(&req.stop),
            input: req.prompt.clone(),
            req,
            sampler,
            grammar_counted: Duration::ZERO,
            decoder,
            fed: 0,
            cached: 0,
            placed: false,
            next: None,
            pooler,
            ids: Vec::new(),
            arrived: now,
            first_token: None,
            last_token: now,
            proposer,
            adaptive: Adaptive::default(),
            proposed: 0,
            accepted: 0,
            shifts: 0,
        }));
    }

    /// Frees the slots of requests whose client has gone (or all, at shutdown), and
    /// forgets waiting jobs whose client has gone.
    pub(super) fn drop_cancelled(&mut self) {
        let all = self.shared.cancel_all.load(Ordering::SeqCst);
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.req.sink.is_closed());
        let gone = (before - self.waiting.len()) as u64;
        if gone > 0 {
            self.shared
                .queued
                .fetch_sub(gone as usize, Ordering::SeqCst);
            self.shared
                .requests_cancelled
                .fetch_add(gone, Ordering::Relaxed);
        }
        for slot in &mut self.jobs {
            let gone = slot.as_ref().is_some_and(|j| j.req.sink.is_closed());
            if gone || (all && slot.is_some()) {
                if let Some(mut job) = slot.take() {
                    if !gone {
                        job.req.sink.send(Event::Failed(RequestError::ShuttingDown));
                    }
                    self.shared
                        .requests_cancelled
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.publish_busy();
    }

    /// One batched forward pass over every active sequence, then sampling.
    /// One forward step: decode inputs (with speculation) first, then prompt chunks
    /// within the step's prefill budget; blocks for each (preempting the youngest job
    /// when the pool runs out); one batched forward pass; then each row's outcome.
    pub(super) fn step(&mut self) {
        self.shift_full();
        let mut inputs = self.decode_inputs();
        let n_decode = inputs.len();
        self.prefill_inputs(&mut inputs, n_decode);
        self.allocate(&mut inputs);
        if inputs.is_empty() {
            return;
        }
        let n_decode: usize = inputs
            .iter()
            .filter(|x| (x.1.len() == 1 && x.2 == Logits::Last) || x.2 == Logits::All)
            .map(|x| x.1.len())
            .sum();
        let n_prefill = inputs.iter().map(|x| x.1.len()).sum::<usize>() - n_decode;
        inputs.sort_by_key(|x| x.0);

        let t0 = Instant::now();
        self.shared.forward_steps.fetch_add(1, Ordering::Relaxed);
        let result = self.forward(&inputs);
        let ns = t0.elapsed().as_nanos() as u64;
        if n_prefill == 0 {
            self.step_cost.record(n_decode, ns as f32 * 1e-9);
        }
        let rows = (n_prefill + n_decode).max(1) as u64;
        self.shared
            .prefill_ns
            .fetch_add(ns * n_prefill as u64 / rows, Ordering::Relaxed);
        self.shared
            .decode_ns
            .fetch_add(ns * n_decode as u64 / rows, Ordering::Relaxed);

        match result {
            Ok(rows) => self.take_rows(inputs, rows),
            Err(e) => {
                // Checked before anything was written: fail the sequences of this step.
                for (i, _, _) in &inputs {
                    if let Some(mut job) = self.jobs[*i].take() {
                        self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                        job.req
                            .sink
                            .send(Event::Failed(RequestError::Evaluation(e.to_string())));
                    }
                }
            }
        }
    }

    /// The step's decode inputs, oldest job first: each decoding job's next token,
    /// followed by its proposer's drafts where speculation has room (the context after
    /// the token, the answer's budget, `draft_max`, the step's spare rows). A decode
    /// input with drafts asks for every row's logits (`Logits::All`).
    fn decode_inputs(&mut self) -> Vec<Input> {
        let mut inputs: Vec<Input> = Vec::new();
        let n_decode = self
            .jobs
            .iter()
            .filter(|j| j.as_ref().and_then(decoding).is_some())
            .count();
        let mut spare = self.config.spec_rows.saturating_sub(n_decode);
        let draft_max = self.config.draft_max;
        // Rows of the step so far and the tokens they are expected to give.
        let (mut rows, mut expected) = (n_decode, n_decode as f32);
        let mut order: Vec<usize> = (0..self.jobs.len()).collect();
        order.sort_by_key(|&i| self.jobs[i].as_ref().map(|j| j.arrived));
        for i in order {
            let n_past = self.kv.n_past(i);
            let Some(job) = self.jobs[i].as_mut() else {
                continue;
            };
            let Some(t) = decoding(job) else { continue };
            let mut toks = vec![t];
            let n_ctx = super::shift::ctx_limit(self.config.n_ctx, &job.req);
            if let Some(p) = job.proposer.as_mut().filter(|_| spare > 0) {
                let room = n_ctx
                    .saturating_sub(n_past + 1)
                    .min(
                        job.req
                            .max_tokens
                            .map_or(usize::MAX, |m| m.saturating_sub(job.ids.len())),
                    )
                    .min(draft_max)
                    .min(spare);
                let room = if self.config.spec_adaptive {
                    job.adaptive.choose(room, rows, expected, &self.step_cost)
                } else {
                    room
                };
                if room > 0 {
                    let history: Vec<u32> =
                        job.req.prompt.iter().chain(&job.ids).copied().collect();
                    let drafts = p.propose(&history, room);
                    let k = drafts.len().min(room);
                    spare -= k;
                    rows += k;
                    expected += job.adaptive.expected(k);
                    toks.extend(drafts.into_iter().take(room));
                } else {
                    job.adaptive.record(0, 0);
                }
            }
            let want = if toks.len() > 1 {
                Logits::All
            } else {
                Logits::Last
            };
            inputs.push((i, toks, want));
        }
        inputs
    }

    /// Appends the step's prompt chunks to `inputs`, in slot order, within the prefill
    /// budget (`prefill_chunk` beside `n_decode` decode inputs, `prefill_chunk_alone`
    /// without); with checkpoints on, a chunk ends at the next checkpoint position.
    fn prefill_inputs(&self, inputs: &mut Vec<Input>, n_decode: usize) {
        let mut budget = if n_decode > 0 {
            self.config.prefill_chunk
        } else {
            self.config.prefill_chunk_alone
        };
        let checkpointing = self.kv.checkpointing();
        for (i, job) in self.jobs.iter().enumerate() {
            let Some(job) = job else { continue };
            if job.fed == job.input.len() || budget == 0 {
                continue;
            }
            let rest = &job.input[job.fed..];
            let mut take = rest.len().min(budget);
            if checkpointing && job.pooler.is_none() {
                // End at the next checkpoint: a multiple of the interval, or the position
                // before the prompt's last token.
                let (pos, n) = (job.fed, job.input.len());
                let t = self.config.checkpoint_interval;
                take = take.min((pos / t + 1) * t - pos);
                if pos + 1 < n {
                    take = take.min(n - 1 - pos);
                }
            }
            // An image whose rows see each other both ways goes in one call.
            take = chunk_end(&job.req.images, job.fed, take);
            budget = budget.saturating_sub(take);
            let want = if job.pooler.is_some() {
                Logits::Hidden
            } else if take == rest.len() && job.next.is_none() {
                Logits::Last
            } else {
                // A chunk before the last, or a preempted job's evaluation again (its
                // next token is already sampled).
                Logits::None
            };
            inputs.push((i, rest[..take].to_vec(), want));
        }
    }

    /// KV blocks for every input, oldest job first; when the pool runs out, the youngest
    /// job gives its blocks back (perhaps the one that needed them), drafts are dropped
    /// rather than take blocks from another sequence, and a job alone in a full pool
    /// ends with `FinishReason::Length`. Removes the inputs of jobs that no longer run.
    fn allocate(&mut self, inputs: &mut Vec<Input>) {
        let arrived = |w: &Self, i: usize| w.jobs[i].as_ref().map(|j| j.arrived);
        inputs.sort_by_key(|x| arrived(self, x.0));
        let mut k = 0;
        while k < inputs.len() {
            let (i, ref toks, _) = inputs[k];
            if self.jobs[i].is_none() {
                inputs.remove(k);
                continue;
            }
            let n = self.kv.n_past(i) + toks.len();
            self.kv.slide(i);
            let idle = self.idle();
            if self.kv.grow(i, n, &idle) {
                k += 1;
                continue;
            }
            if inputs[k].2 == Logits::All {
                // Proposals never take blocks from another sequence.
                inputs[k].1.truncate(1);
                inputs[k].2 = Logits::Last;
                continue;
            }
            let running: Vec<usize> = (0..self.jobs.len())
                .filter(|&j| self.jobs[j].is_some())
                .collect();
            let youngest = *running
                .iter()
                .max_by_key(|&&j| arrived(self, j))
                .expect("slot i runs a job");
            if running.len() == 1 {
                // Alone and the pool is full: its context ends here.
                let job = self.jobs[i].take().expect("slot i runs a job");
                self.end_now(job);
                inputs.remove(k);
                continue;
            }
            self.preempt(youngest);
        }
        inputs.retain(|x| self.jobs[x.0].is_some());
    }

    /// The batched forward pass over `inputs` (sorted by slot). Samplers whose grammar
    /// mask the next sampling needs compute it on another thread meanwhile (the mask
    /// depends only on the grammar's state, known now), only where the compute pool
    /// leaves a core over: on a machine the pool fills the mask thread takes its time
    /// from the forward pass (measured on 2 cores, smollm2, 8 constrained streams: 0.87x
    /// of free decoding with it, 0.89x without).
    fn forward(&mut self, inputs: &[Input]) -> Result<Vec<Vec<f32>>, ModelError> {
        let spare_core = self.spare_core;
        // The images each input reaches (shared rows; none on a decode step), apart from the
        // jobs the samplers borrow.
        let images: Vec<Vec<PromptImage>> = inputs
            .iter()
            .map(|(i, toks, _)| {
                let images = self.jobs[*i]
                    .as_ref()
                    .map_or(&[][..], |j| &j.req.images[..]);
                reached(images, self.kv.n_past(*i), toks.len())
                    .cloned()
                    .collect()
            })
            .collect();
        // Multimodal RoPE: how far the images already evaluated moved positions back.
        let shifts: Vec<usize> = inputs
            .iter()
            .map(|(i, _, _)| {
                let images = self.jobs[*i].as_ref().map_or(&[][..], |j| &j.req.images);
                rope_shift(images, self.kv.n_past(*i))
            })
            .collect();
        let mut masks: Vec<&mut Sampler> = Vec::new();
        let mut loras: Vec<Option<&[(usize, f32)]>> = Vec::with_capacity(inputs.len());
        let mut it = inputs.iter().peekable();
        for (i, job) in self.jobs.iter_mut().enumerate() {
            if let Some(inp) = it.next_if(|x| x.0 == i) {
                let mut lora = None;
                if let Some(Job { sampler, req, .. }) = job.as_mut() {
                    if spare_core && inp.2 == Logits::Last && sampler.is_constrained() {
                        masks.push(sampler);
                    }
                    lora = Some(&req.lora[..]);
                }
                loras.push(lora);
            }
        }
        // Inputs with image rows: the ids the model reads and the rows it takes instead.
        let d = self.model.config.n_embd;
        let mut feeds: Vec<Option<Vec<u32>>> = Vec::with_capacity(inputs.len());
        let mut embds: Vec<Vec<EmbdRows<'_>>> = Vec::with_capacity(inputs.len());
        for ((i, toks, _), images) in inputs.iter().zip(&images) {
            let rows = embd_rows(images, self.kv.n_past(*i), toks.len(), d);
            feeds.push((!rows.is_empty()).then(|| model_ids(toks, IMAGE_PLACEHOLDER)));
            embds.push(rows);
        }
        let which: Vec<usize> = inputs.iter().map(|x| x.0).collect();
        let (pool, states) = self.kv.states(&which);
        let mut seqs: Vec<Sequence> = states
            .into_iter()
            .zip(inputs)
            .zip(loras)
            .zip(feeds.iter().zip(&embds).zip(shifts))
            .map(
                |(((state, inp), lora), ((feed, embd), rope_shift))| Sequence {
                    state,
                    tokens: feed.as_deref().unwrap_or(&inp.1),
                    logits: inp.2,
                    lora,
                    embd,
                    rope_shift,
                    token_types: &[],
                },
            )
            .collect();
        let model = &self.model;
        std::thread::scope(|scope| {
            let ahead = (!masks.is_empty()).then(|| {
                scope.spawn(move || {
                    for s in masks {
                        s.prepare_constraint();
                    }
                })
            });
            let r = model.forward_batch_in(Some(pool), &mut seqs);
            // A panic in the mask thread only loses the head start: sampling computes
            // the mask itself then.
            if let Some(h) = ahead {
                let _ = h.join();
            }
            r
        })
    }

    /// Each input's outcome from its rows of logits: drafts verified, prompt chunks
    /// counted (with checkpoints at the interval's multiples and around the prompt's
    /// last token), embeddings pooled, the next token sampled.
    fn take_rows(&mut self, inputs: Vec<Input>, rows: Vec<Vec<f32>>) {
        let checkpointing = self.kv.checkpointing();
        for ((i, toks, want), logits) in inputs.into_iter().zip(rows) {
            self.kv.extend_tokens(i, &toks);
            let n_past = self.kv.n_past(i);
            if want == Logits::All {
                self.verify(i, &toks[1..], &logits, n_past - toks.len());
                continue;
            }
            self.kv.register_full_blocks(i);
            let Some(mut job) = self.jobs[i].take() else {
                continue;
            };
            if job.fed < job.input.len() {
                job.fed += toks.len();
                let (n, t) = (job.input.len(), self.config.checkpoint_interval);
                if checkpointing
                    && job.pooler.is_none()
                    && (n_past.is_multiple_of(t) || n_past + 1 == n || n_past == n)
                {
                    self.kv.save_checkpoint(i);
                }
            }
            if let Some(p) = job.pooler.as_mut() {
                p.push(&logits);
                if job.fed == job.input.len() {
                    self.finish_embedding(job);
                    continue;
                }
                self.jobs[i] = Some(job);
                continue;
            }
            let job = if logits.is_empty() {
                Some(job)
            } else {
                self.sample(job, &logits, n_past, None)
            };
            self.jobs[i] = job;
        }
        self.publish_busy();
    }
}

/// One input of a step: the slot, the tokens it feeds, and which logits it wants.
type Input = (usize, Vec<u32>, Logits);

/// The token a job feeds next when it is decoding (its prompt all fed).
pub(super) fn decoding(job: &Job) -> Option<u32> {
    job.next.filter(|_| job.fed == job.input.len())
}

/// The id the model reads at an image's rows (any id in the vocabulary: the row is
/// replaced by the image's).
const IMAGE_PLACEHOLDER: u32 = 0;

/// Why a request's images cannot run: misplaced ([`check_images`]), or on an embedding
/// request.
fn image_error(req: &Request, n_embd: usize) -> Option<RequestError> {
    if req.images.is_empty() {
        return None;
    }
    if req.embed.is_some() {
        return Some(RequestError::Images(
            "an embedding request takes no images".into(),
        ));
    }
    check_images(&req.prompt, &req.images, n_embd)
        .err()
        .map(RequestError::Images)
}
