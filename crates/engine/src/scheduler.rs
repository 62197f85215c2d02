//! The continuous-batching scheduler behind `frink serve`.
//!
//! One dedicated OS thread owns the model and `parallel` sequence slots, each a KV cache of
//! `n_ctx` positions plus the token ids it holds. Requests arrive through a bounded queue
//! ([`Scheduler::submit`] refuses when it is full). Each step of the loop:
//!
//! 1. takes queued requests while a slot is free, giving each the free slot whose cached
//!    tokens share the longest prefix with its prompt (the cache is cut back to that prefix
//!    and only the rest of the prompt is evaluated: prompt-prefix reuse); when another slot,
//!    busy or free, shares a longer prefix (a common system prompt), those positions' keys
//!    and values are copied from it instead of evaluated. A model with recurrent layers
//!    reuses only a slot's whole state (its previous prompt and answer), never a part:
//!    [`frink_models::SeqState::reusable`];
//! 2. drops requests whose client has gone (their slot is free at once);
//! 3. runs one [`Model::forward_batch`] over every active sequence: a decoding sequence
//!    contributes its last sampled token, a sequence still in prefill a chunk of its
//!    remaining prompt, the prefill rows of one step capped at
//!    [`SchedulerConfig::prefill_chunk`] so running streams wait at most one chunk;
//! 4. samples each sequence that produced logits with its own [`Sampler`] (seeded per
//!    request), decodes the token with the tokenizer's stream decoder (never splitting a
//!    UTF-8 character), applies the stop strings with a [`StopMatcher`] (stop text is never
//!    sent) and sends the text through the request's [`EventSink`].
//!
//! When nothing is active the thread blocks on the queue. The forward pass gives each
//! sequence the same bits alone or in a batch, and all sampling state is per request, so a
//! request's tokens do not depend on what else runs beside it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use frink_models::{Checkpoint, KvPool, KvType, Logits, Model, SeqState, Sequence};
use frink_tokenizer::{StreamDecoder, Tokenizer};

use crate::draft::DraftModel;
use crate::generate::{
    Adaptive, FinishReason, NgramLookup, PredictionLookup, Propose, Speculation, StepCost,
    StopMatcher,
};
use crate::kv_blocks::{block_hash, block_hashes, BlockManager};
use crate::sampling::{Candidate, Sampler, SamplingParams, SpecSampling};

/// Sizes of the scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences decoded together at most (`--parallel`).
    pub parallel: usize,
    /// Positions one request may use at most (`--ctx`); not a reservation.
    pub n_ctx: usize,
    /// Positions of the KV block pool all sequences share (`--kv-size`; 0: `parallel ×
    /// n_ctx`), in blocks of [`frink_models::KV_BLOCK`].
    pub kv_size: usize,
    /// Requests that may wait for a slot (`--queue`); at least 1.
    pub queue: usize,
    /// KV cache element type.
    pub kv_type: KvType,
    /// Most prompt tokens evaluated in one step, over all sequences in prefill, while
    /// other sequences are decoding (they wait for the step).
    pub prefill_chunk: usize,
    /// The same limit when no sequence is decoding (nobody waits; larger chunks use the
    /// matrix kernels better).
    pub prefill_chunk_alone: usize,
    /// Recurrent models: checkpoints of a slot's recurrent state kept per slot
    /// (`--ctx-checkpoints`, as llama-server's; 0: none, a slot's state is reused only
    /// whole). Taken during prefill at every multiple of
    /// [`SchedulerConfig::checkpoint_interval`] and before and after each prompt's last
    /// token; a new request whose prompt shares a slot's tokens up to a checkpoint
    /// continues from it. The oldest goes first.
    pub ctx_checkpoints: usize,
    /// Positions between the periodic checkpoints (`--checkpoint-interval`; prefill chunks
    /// end at its multiples, so a prefix's checkpoint does not depend on how its prompt
    /// was chunked).
    pub checkpoint_interval: usize,
    /// Bytes all slots' checkpoints may hold together (`--checkpoint-budget`); the oldest
    /// go first beyond it.
    pub checkpoint_budget: usize,
    /// Prompt-lookup speculation ([`NgramLookup`]) for every request without a
    /// prediction (`--spec ngram`; `false`: `--spec off`). A request's prediction
    /// ([`Request::prediction`]) is proposed either way. Never changes a token: see
    /// [`SPEC_ROWS`] for when a step verifies proposals.
    pub prompt_lookup: bool,
    /// Most tokens proposed in one step (`--draft-max`; 0: no speculation at all).
    pub draft_max: usize,
    /// Decode rows a step may reach with proposals ([`SPEC_ROWS`]; tests raise it to
    /// verify proposals beside many streams).
    pub spec_rows: usize,
    /// Each request proposes the number that gives the step the most tokens per second
    /// ([`Adaptive::choose`] on measured step times); `false`: as many as the rows allow
    /// (tests that must verify proposals whatever the machine's step times).
    pub spec_adaptive: bool,
    /// A draft model's settings ([`Scheduler::start_with_draft`]; [`DraftModel::p_min`],
    /// [`DraftModel::n_min`]: `--draft-p-min`, `--draft-min`).
    pub draft_p_min: f32,
    pub draft_min: usize,
    /// How proposals are accepted (`--spec-sampling`; [`SpecSampling::Exact`]: the
    /// tokens of speculation off). Under [`SpecSampling::Rejection`] a draft model draws
    /// its proposals from the request's sampling chain ([`DraftModel::sample_with`]).
    pub spec_sampling: SpecSampling,
}

/// A request's [`DraftModel`], its cache made at the first proposal (a queued request
/// holds none) and dropped with the request.
struct LazyDraft<'t> {
    model: &'t Model,
    n_ctx: usize,
    kv_type: KvType,
    p_min: f32,
    n_min: usize,
    eog: HashSet<u32>,
    /// Draws from this chain (rejection sampling), else greedy.
    sampling: Option<SamplingParams>,
    draft: Option<DraftModel<'t>>,
}

impl Propose for LazyDraft<'_> {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let d = self.draft.get_or_insert_with(|| {
            let mut d = DraftModel::new(self.model, self.n_ctx, self.kv_type);
            d.p_min = self.p_min;
            d.n_min = self.n_min;
            d.eog = std::mem::take(&mut self.eog);
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

/// Decode rows one step evaluates at most for speculation (the default of
/// [`SchedulerConfig::spec_rows`]): proposals are verified only
/// while the decoding sequences' rows and the proposals together stay within it (given
/// out oldest request first), so a large batch — whose step already reads every weight
/// once for many rows — decodes without them. The small-batch kernels evaluate up to 8
/// rows at nearly the cost of one; past that, rows cost their share.
pub const SPEC_ROWS: usize = 8;

/// The prompt lengths a scheduler can run: the one rule its admission and the server's
/// request checks read ([`PromptLimit::check`]). A prompt must leave a position to
/// generate into, in the per-request context and in the shared KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLimit {
    /// Positions one request may use (`--ctx`).
    pub n_ctx: usize,
    /// Positions of the whole KV pool.
    pub kv_positions: usize,
}

/// Why a prompt cannot run ([`PromptLimit::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// No token.
    #[error("the prompt is empty")]
    Empty,
    /// `n` tokens leave no position in the context of `n_ctx`.
    #[error("the prompt is {n} tokens, longer than the context of {n_ctx} tokens (--ctx)")]
    Context {
        /// Tokens.
        n: usize,
        /// The context.
        n_ctx: usize,
    },
    /// `n` tokens leave no position in the KV pool of `positions`.
    #[error(
        "the prompt is {n} tokens, longer than the KV pool of {positions} positions (--kv-size)"
    )]
    Pool {
        /// Tokens.
        n: usize,
        /// The pool's positions.
        positions: usize,
    },
}

impl PromptLimit {
    /// Whether a prompt of `n` tokens can run.
    ///
    /// Errors: [`PromptError`] saying which limit it passes.
    pub fn check(&self, n: usize) -> Result<(), PromptError> {
        if n == 0 {
            Err(PromptError::Empty)
        } else if n >= self.n_ctx {
            Err(PromptError::Context {
                n,
                n_ctx: self.n_ctx,
            })
        } else if n >= self.kv_positions {
            Err(PromptError::Pool {
                n,
                positions: self.kv_positions,
            })
        } else {
            Ok(())
        }
    }
}

impl SchedulerConfig {
    /// The prompt lengths this configuration runs.
    pub fn prompt_limit(&self) -> PromptLimit {
        PromptLimit {
            n_ctx: self.n_ctx,
            kv_positions: self.kv_blocks() * frink_models::KV_BLOCK,
        }
    }

    /// Blocks of the KV pool: `kv_size` positions, or `parallel × n_ctx`, rounded up to
    /// whole blocks.
    pub fn kv_blocks(&self) -> usize {
        let size = if self.kv_size > 0 {
            self.kv_size
        } else {
            self.parallel.max(1).saturating_mul(self.n_ctx)
        };
        size.div_ceil(frink_models::KV_BLOCK)
    }
}

impl Default for SchedulerConfig {
    /// 4 sequences of at most 4096 positions sharing a pool of 4 × 4096, a queue of 64, f16 caches, prefill chunks of 256 rows
    /// beside decoding sequences and 512 ([`crate::DEFAULT_BATCH`]) otherwise; for
    /// recurrent models 8 checkpoints per slot, every 256 positions, 1 GiB in all.
    fn default() -> Self {
        SchedulerConfig {
            parallel: 4,
            n_ctx: 4096,
            kv_size: 0,
            queue: 64,
            kv_type: KvType::F16,
            prefill_chunk: 256,
            prefill_chunk_alone: crate::DEFAULT_BATCH,
            ctx_checkpoints: 8,
            checkpoint_interval: 256,
            checkpoint_budget: 1 << 30,
            prompt_lookup: true,
            draft_max: Speculation::default().draft_max,
            spec_rows: SPEC_ROWS,
            spec_adaptive: true,
            draft_p_min: DraftModel::DEFAULT_P_MIN,
            draft_min: 0,
            spec_sampling: SpecSampling::Exact,
        }
    }
}

/// Where a request's events go (an HTTP response, a test's channel).
pub trait EventSink: Send {
    /// Delivers one event; `false` when the receiver is gone (the request is cancelled).
    fn send(&mut self, event: Event) -> bool;
    /// Whether the receiver is gone (checked every step, also before the first token).
    fn is_closed(&self) -> bool;
}

impl EventSink for mpsc::Sender<Event> {
    fn send(&mut self, event: Event) -> bool {
        mpsc::Sender::send(self, event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// One generation request.
pub struct Request {
    /// The prompt's token ids (template applied, BOS included where the model adds one).
    pub prompt: Vec<u32>,
    /// Sampling settings (the seed included).
    pub sampling: SamplingParams,
    /// Most tokens to generate (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// Stop strings: generation ends when the text contains one; it is not sent.
    pub stop: Vec<String>,
    /// Keep generating after an end-of-generation token (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Report each token's log-probability and this many alternatives (`None`: none).
    pub top_logprobs: Option<usize>,
    /// The grammar the answer must match (compiled for this request), if any.
    pub constraint: Option<crate::constraint::Constraint>,
    /// Another choice of the same prompt (OpenAI's `n`): requests with the same group
    /// share one prompt evaluation. One of them (`follows_prefix: false`) evaluates the
    /// prompt; the others wait until a slot holds it (or that one is gone) and then copy
    /// its keys and values, evaluating only the last prompt token themselves.
    pub prefix_group: Option<u64>,
    /// This request waits for its group's prompt (see [`Request::prefix_group`]).
    pub follows_prefix: bool,
    /// Compute the prompt's embedding with this pooling instead of generating: the
    /// request gets one [`Event::Embedding`] (not normalised) and `Done`. Its prompt is
    /// evaluated in full (no reused prefix: every token's hidden state is pooled).
    pub embed: Option<frink_models::Pooling>,
    /// Control tokens whose text the answer shows (the markers of a tool-call format a
    /// parser reads, such as Mistral's `[TOOL_CALLS]`); other control tokens render empty.
    pub shown_tokens: Vec<u32>,
    /// The LoRA adapters it runs with: (index into the model's adapters, user scale); the
    /// others do not apply. A slot's cache is reused only by a request of the same
    /// adapters and scales.
    pub lora: Vec<(usize, f32)>,
    /// OpenAI's predicted outputs: tokens the answer is expected to repeat, proposed for
    /// speculative verification ([`PredictionLookup`]) instead of prompt lookup. They
    /// never change the answer, only how many tokens a step can accept. Ignored (nothing
    /// proposed or counted) on models with recurrent layers.
    pub prediction: Option<Vec<u32>>,
    /// Where the events go.
    pub sink: Box<dyn EventSink>,
}

/// A generated token's log-probability under the model's distribution (the raw logits,
/// before penalties and temperature), with the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its natural-log probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// Counts and timings of a finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// `stop` (end of generation or a stop string) or `length` (budget or context).
    pub finish_reason: FinishReason,
    /// Prompt tokens of the request.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from a slot's cache (not evaluated again).
    pub cached_tokens: usize,
    /// Generated ids, including an end-of-generation token that ended the generation.
    pub ids: Vec<u32>,
    /// From the request's arrival to its first token, in milliseconds.
    pub first_token_ms: f64,
    /// From the first token to the last, in milliseconds.
    pub gen_ms: f64,
    /// Speculation: tokens proposed and verified (a prediction's or prompt lookup's), and
    /// how many of them the answer took. Rows verified and not taken are
    /// `proposed - accepted` (OpenAI's `rejected_prediction_tokens` for a prediction).
    pub proposed: usize,
    pub accepted: usize,
}

/// What the scheduler sends about a request, in order: any number of `Delta`s, then one
/// `Done` or one `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text (possibly empty when only `tokens` are reported) and, when log-probabilities
    /// were asked for, the tokens sampled since the last event.
    Delta {
        /// Text safe to show: whole UTF-8 characters, no part of a stop string.
        text: String,
        /// The tokens' log-probabilities (empty unless asked for).
        tokens: Vec<TokenLogprob>,
    },
    /// The embedding of an [`Request::embed`] request (`n_embd` values, pooled, not
    /// normalised), sent before its `Done`.
    Embedding(Vec<f32>),
    /// The request finished.
    Done(Completion),
    /// The request failed (the message says why).
    Error(String),
    /// The request's own input cannot be served, found while generating: its grammar
    /// reached a state no token continues or went past `llguidance`'s parser limits (an
    /// HTTP server answers 400, as for a grammar refused when compiled).
    Refused(String),
    /// The server cancelled the request unfinished because it is shutting down (an HTTP
    /// server answers 503 rather than a failure).
    Cancelled(String),
}

/// Why [`Scheduler::submit`] refused a request.
#[derive(Debug)]
pub enum SubmitError {
    /// The queue is full (HTTP 503).
    QueueFull,
    /// The scheduler has stopped.
    Stopped,
}

/// Fixed-bucket latency histogram (seconds), in Prometheus' cumulative form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Number of observations at or below each bound of [`Histogram::BOUNDS`].
    pub counts: Vec<u64>,
    /// Number of observations.
    pub count: u64,
    /// Sum of the observations, in seconds.
    pub sum: f64,
}

impl Histogram {
    /// Upper bounds of the buckets, in seconds (`+Inf` is `count`).
    pub const BOUNDS: [f64; 12] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];

    fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; Self::BOUNDS.len()];
        }
        for (c, &b) in self.counts.iter_mut().zip(Self::BOUNDS.iter()) {
            if secs <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

/// A snapshot of the scheduler's counters (for `/metrics`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Requests accepted into the queue.
    pub requests_total: u64,
    /// Requests that ran to `Done`.
    pub requests_finished: u64,
    /// Requests dropped because their client went away, or cancelled at shutdown.
    pub requests_cancelled: u64,
    /// Requests refused because the queue was full.
    pub requests_rejected: u64,
    /// Requests that ended in an error (`Event::Error` or `Event::Refused`: an evaluation
    /// that failed, a grammar the answer could not follow).
    pub requests_failed: u64,
    /// Tokens sampled.
    pub tokens_generated: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, tokens reused from a slot's cache.
    pub prompt_tokens_cached: u64,
    /// Requests that continued from a checkpoint of a recurrent state.
    pub checkpoints_restored: u64,
    /// Forward passes run (one per step: every active sequence's rows together).
    pub forward_steps: u64,
    /// Checkpoints held, and their bytes.
    pub checkpoints: usize,
    pub checkpoint_bytes: usize,
    /// Requests waiting in the queue.
    pub queue_depth: usize,
    /// Slots running a request.
    pub slots_busy: usize,
    /// Slots in all.
    pub slots_total: usize,
    /// KV cache positions held by running requests.
    pub kv_positions_used: usize,
    /// KV cache positions in all (the pool's blocks × [`frink_models::KV_BLOCK`]).
    pub kv_positions_total: usize,
    /// Blocks of the KV pool.
    pub kv_blocks_total: usize,
    /// Blocks running sequences hold.
    pub kv_blocks_used: usize,
    /// Blocks that keep reusable tokens and are not running sequences': the prefix
    /// cache's, idle slots' conversations.
    pub kv_blocks_cached: usize,
    /// Blocks of the pool's window group (0: none; sliding-window layers' rows,
    /// [`frink_models::KvPool::with_window_group`]).
    pub kv_window_blocks_total: usize,
    /// Window-group blocks some slot holds (running or idle).
    pub kv_window_blocks_held: usize,
    /// Bytes of the pool's keys and values (both groups).
    pub kv_bytes: usize,
    /// Sequences preempted (their blocks given to older ones, evaluated again later).
    pub preemptions: u64,
    /// Forward-pass time spent on prompt rows, in seconds (a mixed step is split by rows).
    pub prefill_seconds: f64,
    /// Forward-pass time spent on decode rows, in seconds.
    pub decode_seconds: f64,
    /// Time constrained tokens spent computing their grammar's mask and committing to it,
    /// in seconds (`llguidance`'s part of a step, outside the forward pass).
    pub grammar_seconds: f64,
    /// Tokens sampled under a grammar.
    pub grammar_tokens: u64,
    /// Speculation: tokens proposed and verified, and of those the ones accepted.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    /// Time from arrival to the first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of one request.
    pub token_latency: Histogram,
}

/// State shared between the scheduler thread and its handle.
#[derive(Default)]
struct Shared {
    requests_total: AtomicU64,
    requests_finished: AtomicU64,
    requests_cancelled: AtomicU64,
    requests_rejected: AtomicU64,
    requests_failed: AtomicU64,
    tokens_generated: AtomicU64,
    prompt_tokens: AtomicU64,
    prompt_tokens_cached: AtomicU64,
    checkpoints_restored: AtomicU64,
    forward_steps: AtomicU64,
    checkpoints: AtomicUsize,
    checkpoint_bytes: AtomicUsize,
    queued: AtomicUsize,
    slots_busy: AtomicUsize,
    kv_used: AtomicUsize,
    kv_blocks_total: AtomicUsize,
    kv_blocks_used: AtomicUsize,
    kv_blocks_cached: AtomicUsize,
    kv_window_blocks_total: AtomicUsize,
    kv_window_blocks_held: AtomicUsize,
    kv_bytes: AtomicUsize,
    preemptions: AtomicU64,
    /// Prefill and decode time, in nanoseconds.
    prefill_ns: AtomicU64,
    decode_ns: AtomicU64,
    /// Time constrained tokens spent in their grammar's mask and commit, in nanoseconds,
    /// and how many tokens that was.
    grammar_ns: AtomicU64,
    grammar_tokens: AtomicU64,
    spec_proposed: AtomicU64,
    spec_accepted: AtomicU64,
    histograms: Mutex<(Histogram, Histogram)>,
    /// Refuse queued requests and cancel running ones (shutdown).
    cancel_all: AtomicBool,
}

/// Handle of the scheduler thread: submit requests, read metrics, shut down (on drop too).
pub struct Scheduler {
    tx: Option<SyncSender<Request>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    config: SchedulerConfig,
}

impl Scheduler {
    /// Starts the scheduler thread; it owns `model` from now on.
    pub fn start(model: Model, tok: Arc<Tokenizer>, config: SchedulerConfig) -> Scheduler {
        Self::start_with_draft(model, None, tok, config)
    }

    /// [`Scheduler::start`] with a draft model (`--draft-model`): requests without a
    /// prediction speculate with its proposals ([`DraftModel`], one cache per running
    /// request, made at its first proposal) instead of prompt lookup. The caller checked
    /// its vocabulary ([`crate::check_same_vocabulary`]).
    pub fn start_with_draft(
        model: Model,
        draft: Option<Model>,
        tok: Arc<Tokenizer>,
        config: SchedulerConfig,
    ) -> Scheduler {
        let mut config = config;
        config.parallel = config.parallel.max(1);
        config.queue = config.queue.max(1);
        config.prefill_chunk = config.prefill_chunk.max(1);
        config.prefill_chunk_alone = config.prefill_chunk_alone.max(1);
        config.checkpoint_interval = config.checkpoint_interval.max(1);
        let (tx, rx) = mpsc::sync_channel(config.queue);
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            let config = config.clone();
            std::thread::Builder::new()
                .name("frink-scheduler".into())
                .spawn(move || Worker::new(&model, draft.as_ref(), &tok, config, shared).run(rx))
                .expect("cannot start the scheduler thread")
        };
        Scheduler {
            tx: Some(tx),
            shared,
            thread: Some(thread),
            config,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a request. Errors: [`SubmitError::QueueFull`] when `queue` requests already
    /// wait; [`SubmitError::Stopped`] after shutdown began.
    pub fn submit(&self, req: Request) -> Result<(), SubmitError> {
        let Some(tx) = &self.tx else {
            return Err(SubmitError::Stopped);
        };
        if self.shared.cancel_all.load(Ordering::Relaxed) {
            return Err(SubmitError::Stopped);
        }
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        match tx.try_send(req) {
            Ok(()) => {
                self.shared.requests_total.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                match e {
                    TrySendError::Full(_) => {
                        self.shared
                            .requests_rejected
                            .fetch_add(1, Ordering::Relaxed);
                        Err(SubmitError::QueueFull)
                    }
                    TrySendError::Disconnected(_) => Err(SubmitError::Stopped),
                }
            }
        }
    }

    /// Cancels every running and queued request (each gets an [`Event::Cancelled`]) and
    /// refuses new ones: the last step of a graceful shutdown.
    pub fn cancel_all(&self) {
        self.shared.cancel_all.store(true, Ordering::SeqCst);
    }

    /// Requests running or queued.
    pub fn in_flight(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst) + self.shared.slots_busy.load(Ordering::SeqCst)
    }

    /// The current counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        let s = &self.shared;
        let (ttft, token_latency) = s.histograms.lock().map(|h| h.clone()).unwrap_or_default();
        MetricsSnapshot {
            requests_total: s.requests_total.load(Ordering::Relaxed),
            requests_finished: s.requests_finished.load(Ordering::Relaxed),
            requests_cancelled: s.requests_cancelled.load(Ordering::Relaxed),
            requests_rejected: s.requests_rejected.load(Ordering::Relaxed),
            requests_failed: s.requests_failed.load(Ordering::Relaxed),
            tokens_generated: s.tokens_generated.load(Ordering::Relaxed),
            prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
            prompt_tokens_cached: s.prompt_tokens_cached.load(Ordering::Relaxed),
            checkpoints_restored: s.checkpoints_restored.load(Ordering::Relaxed),
            forward_steps: s.forward_steps.load(Ordering::Relaxed),
            checkpoints: s.checkpoints.load(Ordering::Relaxed),
            checkpoint_bytes: s.checkpoint_bytes.load(Ordering::Relaxed),
            queue_depth: s.queued.load(Ordering::SeqCst),
            slots_busy: s.slots_busy.load(Ordering::SeqCst),
            slots_total: self.config.parallel,
            kv_positions_used: s.kv_used.load(Ordering::Relaxed),
            kv_positions_total: s.kv_blocks_total.load(Ordering::Relaxed) * frink_models::KV_BLOCK,
            kv_blocks_total: s.kv_blocks_total.load(Ordering::Relaxed),
            kv_blocks_used: s.kv_blocks_used.load(Ordering::Relaxed),
            kv_blocks_cached: s.kv_blocks_cached.load(Ordering::Relaxed),
            kv_window_blocks_total: s.kv_window_blocks_total.load(Ordering::Relaxed),
            kv_window_blocks_held: s.kv_window_blocks_held.load(Ordering::Relaxed),
            kv_bytes: s.kv_bytes.load(Ordering::Relaxed),
            preemptions: s.preemptions.load(Ordering::Relaxed),
            prefill_seconds: s.prefill_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            decode_seconds: s.decode_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            grammar_seconds: s.grammar_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            grammar_tokens: s.grammar_tokens.load(Ordering::Relaxed),
            spec_proposed: s.spec_proposed.load(Ordering::Relaxed),
            spec_accepted: s.spec_accepted.load(Ordering::Relaxed),
            ttft,
            token_latency,
        }
    }
}

impl Drop for Scheduler {
    /// Closes the queue and waits for the thread, which finishes the running requests.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request running in a slot, or waiting for one.
struct Job<'t> {
    req: Request,
    sampler: Sampler,
    /// The grammar time already added to the metrics.
    grammar_counted: Duration,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    /// The tokens its cache must hold before it decodes: the prompt, and after a
    /// preemption also the answer so far (all but the sampled token not yet evaluated).
    input: Vec<u32>,
    /// Tokens of `input` already in the cache.
    fed: usize,
    /// Prompt tokens reused from a cache when it was first placed.
    cached: usize,
    /// Whether it has been placed in a slot before (a preempted job has).
    placed: bool,
    /// The last sampled token, not yet evaluated (decode phase).
    next: Option<u32>,
    /// An embedding request's pooled rows so far.
    pooler: Option<crate::embed::Pooler>,
    ids: Vec<u32>,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Instant,
    /// What proposes tokens to verify (`None`: it decodes one token a step).
    proposer: Option<Box<dyn Propose + 't>>,
    /// How many to propose, from its acceptance so far.
    adaptive: Adaptive,
    /// Tokens proposed and verified, and accepted ([`Completion::proposed`]).
    proposed: usize,
    accepted: usize,
}

/// A sequence slot: its state (keys and values in blocks of the shared pool), the ids its
/// blocks hold (`tokens.len() == cache.n_past`) and the keys of its full blocks, and for a
/// recurrent model checkpoints of its state at positions up to there (each valid for
/// `tokens[..n_past]`, which stay unchanged while it is kept). An idle slot keeps its
/// blocks (a conversation's next turn continues from them) until the pool needs them.
struct Slot<'t> {
    cache: SeqState,
    tokens: Vec<u32>,
    /// Prefix-cache keys of its full blocks (block `i`: `hashes[i]`).
    hashes: Vec<u64>,
    job: Option<Job<'t>>,
    /// (creation order, checkpoint), oldest first.
    checkpoints: Vec<(u64, Checkpoint)>,
    /// The adapters its tokens were evaluated with ([`lora_key`]).
    lora: Vec<(usize, u32)>,
    /// When it was last given a job (idle slots give their blocks back oldest first).
    used: u64,
}

/// The identity of an adapter set for prefix reuse: the adapters of nonzero scale, by
/// index, with their scales' bits (scale 0 computes exactly the base model).
fn lora_key(set: &[(usize, f32)]) -> Vec<(usize, u32)> {
    let mut k: Vec<(usize, u32)> = set
        .iter()
        .filter(|(_, s)| *s != 0.0)
        .map(|&(i, s)| (i, s.to_bits()))
        .collect();
    k.sort_unstable();
    k.dedup_by_key(|e| e.0);
    k
}

impl Slot<'_> {
    /// The longest prefix of at most `n` positions this slot can continue from: its
    /// state cut back ([`SeqState::reusable`]) or one of its checkpoints (its index);
    /// nothing when its tokens were evaluated with other adapters than `lora`.
    fn reusable(&self, n: usize, lora: &[(usize, u32)]) -> (usize, Option<usize>) {
        if self.lora != lora {
            return (0, None);
        }
        let whole = self.cache.reusable(n);
        self.checkpoints
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| c.n_past <= n && c.n_past > whole)
            .max_by_key(|(_, (_, c))| c.n_past)
            .map_or((whole, None), |(i, (_, c))| (c.n_past, Some(i)))
    }
}

/// Where a placed job's reused prefix comes from.
enum Source {
    /// The chosen slot's own tokens (or one of its checkpoints).
    Own(usize, Option<usize>),
    /// Full blocks of the prefix cache, and the tokens after them another slot holds
    /// in its next block (that slot, how many): copied into a block of its own
    /// (copy-on-write for the partial last block).
    Cache(Vec<u32>, Option<(usize, usize)>),
    /// Another slot's tokens (a recurrent model: with its checkpoint).
    Donor(usize, usize, Option<usize>),
}

impl Source {
    fn len(&self) -> usize {
        match self {
            Source::Own(n, _) | Source::Donor(_, n, _) => *n,
            Source::Cache(b, tail) => b.len() * frink_models::KV_BLOCK + tail.map_or(0, |t| t.1),
        }
    }
}

/// Tokens of a sequence's answer that admission keeps blocks for (its `max_tokens` when
/// smaller): a new request is placed beside running ones only when the pool holds its
/// prompt and this much growth of it and of every running sequence. Without it, with 64
/// streams of 350-token prompts and 128-token answers on a pool of 16k positions, every
/// request was admitted and two thirds of them were preempted (their prompts evaluated
/// twice or more: 66 preemptions per 64 requests, smollm2-135m); a longer answer than
/// the horizon still grows, by preemption of the youngest when the pool runs out.
const GROWTH_HORIZON: usize = 256;

struct Worker<'t> {
    model: &'t Model,
    /// Decode and verification step times by rows (how many proposals pay).
    step_cost: StepCost,
    /// The draft model (`--draft-model`), if any.
    draft: Option<&'t Model>,
    tok: &'t Tokenizer,
    config: SchedulerConfig,
    shared: Arc<Shared>,
    /// The keys and values of every slot, in blocks.
    pool: KvPool,
    /// Which blocks are free, held, cached.
    blocks: BlockManager,
    /// The same for the pool's window group (a model with sliding-window layers whose
    /// pool keeps their rows apart: [`KvPool::with_window_group`]). Sized so that it never
    /// runs out: each slot holds at most [`frink_models::window_blocks`] of it.
    window_blocks: Option<BlockManager>,
    slots: Vec<Slot<'t>>,
    /// Requests waiting for their group's prompt to be evaluated.
    deferred: Vec<Request>,
    /// Jobs waiting for a slot and blocks, oldest first: new ones the pool could not
    /// take yet, and preempted ones.
    waiting: std::collections::VecDeque<Box<Job<'t>>>,
    /// Checkpoints taken so far (their creation order).
    checkpoints_taken: u64,
    /// Jobs placed so far (the slots' `used` order).
    placements: u64,
    /// Requests ended (finished or cancelled) when a sequence was last preempted: until
    /// another ends, no waiting job is placed beside running ones (placing it would only
    /// take blocks the running ones are about to need: vLLM schedules no new prefill in
    /// a step that preempted).
    pressed: Option<u64>,
    /// Whether the machine has a core the compute pool leaves free, where grammar masks
    /// are computed beside the forward pass (see `step`).
    spare_core: bool,
}

impl<'t> Worker<'t> {
    fn new(
        model: &'t Model,
        draft: Option<&'t Model>,
        tok: &'t Tokenizer,
        config: SchedulerConfig,
        shared: Arc<Shared>,
    ) -> Self {
        let mut config = config;
        let n_blocks = config.kv_blocks();
        let n_window = Self::window_group(model, &mut config, n_blocks);
        let pool = KvPool::with_window_group(&model.config, n_blocks, n_window, config.kv_type);
        let slots = (0..config.parallel)
            .map(|_| Slot {
                cache: SeqState::pooled(&model.config, config.n_ctx, &pool),
                tokens: Vec::new(),
                hashes: Vec::new(),
                job: None,
                checkpoints: Vec::new(),
                lora: Vec::new(),
                used: 0,
            })
            .collect();
        shared.kv_blocks_total.store(n_blocks, Ordering::Relaxed);
        shared
            .kv_window_blocks_total
            .store(pool.n_window_blocks, Ordering::Relaxed);
        shared.kv_bytes.store(pool.bytes(), Ordering::Relaxed);
        Worker {
            model,
            step_cost: StepCost::default(),
            draft,
            tok,
            config,
            shared,
            pool,
            blocks: BlockManager::new(n_blocks),
            window_blocks: (n_window > 0).then(|| BlockManager::new(n_window)),
            slots,
            deferred: Vec::new(),
            waiting: Default::default(),
            checkpoints_taken: 0,
            placements: 0,
            pressed: None,
            spare_core: std::thread::available_parallelism()
                .is_ok_and(|n| n.get() > frink_models::pool::threads()),
        }
    }

    /// Blocks of the pool's window group for `model` (0: none, its windowed layers live in
    /// the main blocks): every slot's window and its longest step
    /// ([`frink_models::window_blocks`]), plus one for a copy in flight, when that is less
    /// than the main group. With a window group, prompt chunks are at most
    /// [`frink_models::WINDOW_STEP`] rows (gemma3-270m at 8k positions: 24.8% of the
    /// full-attention layout instead of 27.5% with 512-row chunks). Models with recurrent
    /// layers keep one group (their prefix donors copy main blocks only).
    fn window_group(model: &Model, config: &mut SchedulerConfig, n_blocks: usize) -> usize {
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
    fn group(&mut self, window: bool) -> &mut BlockManager {
        if window {
            self.window_blocks
                .as_mut()
                .expect("a window group is asked for only where the pool has one")
        } else {
            &mut self.blocks
        }
    }

    /// Slot `i`'s block table of the window group (`window`) or the main group.
    fn table(&mut self, i: usize, window: bool) -> &mut Vec<u32> {
        let cache = &mut self.slots[i].cache;
        if window {
            cache
                .window_table_mut()
                .expect("pooled slots of a pool with a window group have a window table")
        } else {
            &mut cache.blocks
        }
    }

    /// The groups of the pool: the main one, and the window group where there is one.
    fn groups(&self) -> &'static [bool] {
        if self.window_blocks.is_some() {
            &[false, true]
        } else {
            &[false]
        }
    }

    /// Gives back slot `i`'s window blocks that no query from its next position on can
    /// see (wholly before `n_past + 1 - window`); the full ones stay in the prefix cache
    /// until the pool needs them.
    fn slide(&mut self, i: usize) {
        if self.window_blocks.is_none() {
            return;
        }
        let behind = self.window_from(self.slots[i].cache.n_past);
        for j in 0..behind.min(self.table(i, true).len()) {
            let b = std::mem::replace(&mut self.table(i, true)[j], frink_models::EVICTED);
            if b != frink_models::EVICTED {
                self.group(true).release(b);
            }
        }
    }

    /// The first block of the window group that a query at position `p` sees (the one
    /// holding `p + 1 - window`).
    fn window_from(&self, p: usize) -> usize {
        (p + 1).saturating_sub(self.model.config.plan.window()) / frink_models::KV_BLOCK
    }

    /// Shrinks a prefix-cache hit (the full blocks `hit` of the keys `hashes`, then
    /// `tail`: rows of another slot's next block) to what the window group serves too: every window block a query
    /// after it sees is cached under the same key or, for the tail, held by that slot.
    /// (A window block given back and reused for other positions has lost its key.)
    fn window_hit(&self, hashes: &[u64], hit: &mut Vec<u32>, tail: &mut Option<(usize, usize)>) {
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

    fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.job.is_some()).count()
    }

    /// Whether slots take checkpoints: a model with recurrent layers, checkpoints on.
    fn checkpointing(&self) -> bool {
        self.config.ctx_checkpoints > 0 && self.model.config.plan.is_recurrent()
    }

    /// Whether the prefix cache serves this model: attention only (a recurrent layer's
    /// state at a prefix is not in the blocks).
    fn prefix_caching(&self) -> bool {
        !self.model.config.plan.is_recurrent()
    }

    /// Saves slot `i`'s state as a checkpoint at its current position (once per
    /// position), then drops the oldest beyond the per-slot count and the byte budget.
    fn save_checkpoint(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let at = slot.cache.n_past;
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

    /// Updates the checkpoint gauges.
    fn publish_checkpoints(&self) {
        let all = self.slots.iter().flat_map(|s| &s.checkpoints);
        let (n, bytes) = all.fold((0, 0), |(n, b), (_, c)| (n + 1, b + c.bytes()));
        self.shared.checkpoints.store(n, Ordering::Relaxed);
        self.shared.checkpoint_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Updates the busy-slot gauge, the KV positions running requests hold, the pool's
    /// block counts and the waiting jobs.
    fn publish_busy(&self) {
        self.shared.slots_busy.store(self.busy(), Ordering::SeqCst);
        let used: usize = self
            .slots
            .iter()
            .filter(|s| s.job.is_some())
            .map(|s| s.cache.n_past)
            .sum();
        self.shared.kv_used.store(used, Ordering::Relaxed);
        // Used: the blocks of running sequences (vLLM's usage); cached: the rest that is
        // not free (the prefix cache's blocks nobody holds, idle slots' conversations).
        let mut running: Vec<u32> = self
            .slots
            .iter()
            .filter(|s| s.job.is_some())
            .flat_map(|s| s.cache.blocks.iter().copied())
            .collect();
        running.sort_unstable();
        running.dedup();
        let held = self.pool.n_blocks - self.blocks.free_blocks();
        self.shared
            .kv_blocks_used
            .store(running.len(), Ordering::Relaxed);
        self.shared
            .kv_blocks_cached
            .store(held - running.len(), Ordering::Relaxed);
        if let Some(wm) = &self.window_blocks {
            self.shared
                .kv_window_blocks_held
                .store(wm.stats().used, Ordering::Relaxed);
        }
    }

    /// Cuts slot `i` back to its first `keep` positions (fewer for a state that cannot be
    /// cut there: [`SeqState::truncate`]); returns how many it kept. The blocks past them
    /// go back to the pool; a partial last block that another slot holds too or the
    /// prefix cache keeps is replaced by a copy of its kept rows (the slot will write
    /// after them), or dropped when no block is left for the copy.
    fn cut(&mut self, i: usize, keep: usize) -> usize {
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
    fn own_block(&mut self, i: usize, window: bool, j: usize, rows: usize) -> bool {
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
    fn copied(&mut self, window: bool, src: u32, rows: usize) -> Option<u32> {
        let copy = self.group(window).alloc()?;
        self.pool.copy_block(window, src, copy, rows);
        Some(copy)
    }

    /// Gives slot `i` blocks for `n` positions (in each group), taking them from idle
    /// slots (least recently used first) when the pool has too few free; `false`
    /// (nothing taken) when even that is not enough.
    fn grow(&mut self, i: usize, n: usize) -> bool {
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
            let at = self.slots[i].cache.n_past / frink_models::KV_BLOCK;
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
    fn reclaim(&mut self, except: &[usize], short: impl Fn(&mut Self) -> bool) {
        while short(self) {
            let Some(i) = (0..self.slots.len())
                .filter(|i| !except.contains(i))
                .filter(|&i| self.slots[i].job.is_none() && !self.slots[i].cache.blocks.is_empty())
                .min_by_key(|&i| self.slots[i].used)
            else {
                return;
            };
            self.cut(i, 0);
        }
    }

    /// Blocks idle slots (not `except`) hold alone: what [`Worker::reclaim`] could free.
    fn reclaimable(&self, except: &[usize]) -> usize {
        (0..self.slots.len())
            .filter(|i| !except.contains(i) && self.slots[*i].job.is_none())
            .flat_map(|i| &self.slots[i].cache.blocks)
            .filter(|&&b| self.blocks.refs(b) == 1)
            .count()
    }

    /// Registers the full blocks slot `i` has filled since the last call in the prefix
    /// cache.
    fn register_full_blocks(&mut self, i: usize) {
        if !self.prefix_caching() {
            return;
        }
        let slot = &mut self.slots[i];
        let full = slot.cache.n_past / frink_models::KV_BLOCK;
        while slot.hashes.len() < full {
            let k = slot.hashes.len();
            let parent = k.checked_sub(1).map_or(0, |p| slot.hashes[p]);
            let toks = &slot.tokens[k * frink_models::KV_BLOCK..(k + 1) * frink_models::KV_BLOCK];
            let h = block_hash(parent, toks, &slot.lora);
            self.blocks.register(slot.cache.blocks[k], h);
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
    fn growth(&self, job: &Job) -> usize {
        let left = job.req.max_tokens.map_or(GROWTH_HORIZON, |m| {
            m.saturating_sub(job.ids.len()).min(GROWTH_HORIZON)
        });
        left.max(1)
    }

    /// Blocks running sequences will still take to grow by [`Worker::growth`] (up to
    /// `--ctx`) beyond those they hold.
    fn committed_growth(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.job.as_ref().map(|j| (s, j)))
            .map(|(s, j)| {
                let end =
                    (j.req.prompt.len() + j.ids.len() + self.growth(j)).min(self.config.n_ctx);
                SeqState::blocks_for(end).saturating_sub(s.cache.blocks.len())
            })
            .sum()
    }

    /// Requests finished, cancelled or failed so far.
    fn ended(&self) -> u64 {
        self.shared.requests_finished.load(Ordering::Relaxed)
            + self.shared.requests_cancelled.load(Ordering::Relaxed)
            + self.shared.requests_failed.load(Ordering::Relaxed)
    }

    /// Stops slot `i`'s job to give its blocks to older ones (vLLM's recompute
    /// preemption): its blocks go back to the pool (the full ones stay in the prefix
    /// cache) and the job waits, in arrival order, to be evaluated again from its prompt
    /// and the answer so far. Its client sees nothing of it: the same tokens follow.
    fn preempt(&mut self, i: usize) {
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

    /// Whether `req` should wait for its group's prompt: it follows one, no slot holds
    /// that prompt yet (all but its last token), and the request evaluating it still runs.
    fn must_wait(&self, req: &Request) -> bool {
        let Some(group) = req.prefix_group.filter(|_| req.follows_prefix) else {
            return false;
        };
        let want = req.prompt.len().saturating_sub(1);
        let held = self
            .slots
            .iter()
            .any(|s| common_prefix(&s.tokens, &req.prompt) >= want);
        let leader_runs = self.slots.iter().any(|s| {
            s.job
                .as_ref()
                .is_some_and(|j| j.req.prefix_group == Some(group) && !j.req.follows_prefix)
        });
        !held && leader_runs
    }

    /// Admits `req`, or keeps it aside while it must wait for its group's prompt.
    fn admit_or_defer(&mut self, req: Request) {
        if self.must_wait(&req) {
            self.deferred.push(req);
        } else {
            self.admit(req);
        }
    }

    /// Admits the deferred requests that need not wait any longer.
    fn admit_deferred(&mut self) {
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
    fn can_take(&self) -> bool {
        self.waiting.is_empty() && self.slots.iter().any(|s| s.job.is_none())
    }

    fn run(mut self, rx: Receiver<Request>) {
        let mut open = true;
        loop {
            self.admit_deferred();
            self.place_waiting();
            if self.busy() == 0 && self.waiting.is_empty() {
                if !open {
                    return;
                }
                // Idle: block until a request arrives or the queue closes.
                match rx.recv() {
                    Ok(req) => self.admit_or_defer(req),
                    Err(_) => return,
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
                    req.sink
                        .send(Event::Cancelled("the server is shutting down".into()));
                }
                for mut job in std::mem::take(&mut self.waiting) {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    job.req
                        .sink
                        .send(Event::Cancelled("the server is shutting down".into()));
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
    fn admit(&mut self, mut req: Request) {
        if req.sink.is_closed() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.shared
                .requests_cancelled
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.shared.cancel_all.load(Ordering::SeqCst) {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            req.sink
                .send(Event::Cancelled("the server is shutting down".into()));
            return;
        }
        let n_vocab = self.model.config.n_vocab;
        let error = match self.config.prompt_limit().check(req.prompt.len()) {
            Err(e) => Some(e.to_string()),
            Ok(()) => req
                .prompt
                .iter()
                .find(|&&t| t as usize >= n_vocab)
                .map(|t| format!("token id {t} is outside the vocabulary of {n_vocab}")),
        };
        let pooler = req
            .embed
            .map(|p| crate::embed::Pooler::new(p, self.model.config.n_embd))
            .transpose()
            .map_err(|e| e.to_string());
        let pooler = match error.map_or(pooler, Err) {
            Ok(p) => p,
            Err(msg) => {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                req.sink.send(Event::Error(msg));
                return;
            }
        };
        let mut sampler = Sampler::new(req.sampling.clone()).with_constraint(req.constraint.take());
        for &t in &req.prompt {
            sampler.accept(t);
        }
        let now = Instant::now();
        let decoder = self.tok.stream_decoder(false).showing(&req.shown_tokens);
        // A recurrent state cannot be cut back past rejected proposals.
        let proposer: Option<Box<dyn Propose + 't>> =
            if pooler.is_some() || self.model.config.plan.is_recurrent() {
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
        }));
    }

    /// Places waiting jobs in slots, oldest first, while a slot is free and the pool can
    /// hold the next one's tokens (so a large request is not passed by small ones).
    fn place_waiting(&mut self) {
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
    fn place(&mut self, mut job: Box<Job<'t>>) -> Result<(), Box<Job<'t>>> {
        let Some(free) = self.slots.iter().position(|s| s.job.is_none()) else {
            return Err(job);
        };
        let n = job.input.len();
        // An embedding pools every prompt token's hidden state: nothing is reused.
        // Otherwise at least one token is evaluated (its logits give the next token).
        let keep = if job.pooler.is_some() { 0 } else { n - 1 };
        let lora = lora_key(&job.req.lora);
        // The free slot whose own tokens give the longest prefix; ties go to the slot
        // holding the least.
        let (best, (own, checkpoint)) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.job.is_none())
            .map(|(i, s)| {
                let common = common_prefix(&s.tokens, &job.input).min(keep);
                (i, s.reusable(common, &lora), s.tokens.len())
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
            block_hashes(&job.input[..keep], &lora)
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
                .filter(|&(i, s)| i != best && s.cache.blocks.len() > hit.len())
                .map(|(i, s)| {
                    (
                        i,
                        s.reusable(common_prefix(&s.tokens, &job.input).min(keep), &lora)
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
                        s.reusable(common_prefix(&s.tokens, &job.input).min(keep), &lora),
                    )
                })
                .max_by(|a, b| (a.1).0.cmp(&(b.1).0).then(b.0.cmp(&a.0)))
            {
                if shared > source.len() {
                    source = Source::Donor(d, shared, cp);
                }
            }
        }
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
                .blocks
                .iter()
                .filter(|&&b| self.blocks.refs(b) == 1)
                .count(),
        };
        let available = self.blocks.available() + self.reclaimable(&keep_slots) + own_blocks;
        if need + self.committed_growth() > available && self.busy() > 0 {
            return Err(job);
        }
        let prefix = match source {
            Source::Own(p, cp) => {
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
            Source::Cache(hit, tail) => {
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
                    let short =
                        |w: &mut Self| w.groups().iter().any(|&g| w.group(g).available() == 0);
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
                slot.cache.blocks = table;
                if let Some(t) = window_table {
                    *slot.cache.window_table_mut().expect("a window group") = t;
                }
                slot.cache.n_past = p;
                slot.tokens = job.input[..p].to_vec();
                slot.hashes = hashes[..p / frink_models::KV_BLOCK].to_vec();
                slot.checkpoints.clear();
                // Where the tail could not be copied, the window blocks before it may be
                // missing: the cut keeps only what the state can continue from.
                let p = self.cut(best, p);
                self.slide(best);
                p
            }
            Source::Donor(d, shared, cp) => {
                self.cut(best, 0);
                // Its full blocks shared, a partial last one copied; its state (or
                // checkpoint) copied.
                let full = shared / frink_models::KV_BLOCK;
                let src: Vec<u32> =
                    self.slots[d].cache.blocks[..SeqState::blocks_for(shared)].to_vec();
                let mut table = Vec::with_capacity(src.len());
                for &b in &src[..full] {
                    self.blocks.retain(b);
                    table.push(b);
                }
                let mut p = shared;
                if shared % frink_models::KV_BLOCK != 0 {
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
                dst.cache.blocks = table;
                match cp {
                    Some(c) if srcs.checkpoints[c].1.n_past == p => {
                        dst.cache.n_past = p;
                        dst.cache.restore(&srcs.checkpoints[c].1);
                        self.shared
                            .checkpoints_restored
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    _ if p == srcs.cache.n_past => {
                        dst.cache.copy_recurrent(&srcs.cache);
                        dst.cache.n_past = p;
                    }
                    _ => {
                        // The state at `p` is not at hand: start over.
                        for b in std::mem::take(&mut dst.cache.blocks) {
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

    /// Frees the slots of requests whose client has gone (or all, at shutdown), and
    /// forgets waiting jobs whose client has gone.
    fn drop_cancelled(&mut self) {
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
        for slot in &mut self.slots {
            let gone = slot.job.as_ref().is_some_and(|j| j.req.sink.is_closed());
            if gone || (all && slot.job.is_some()) {
                if let Some(mut job) = slot.job.take() {
                    if !gone {
                        job.req
                            .sink
                            .send(Event::Cancelled("the server is shutting down".into()));
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
    fn step(&mut self) {
        // Inputs: decode tokens first, then prompt chunks within the step's prefill budget.
        // A decode input with proposals after its token asks for every row's logits
        // (`Logits::All`: only speculative decode inputs do).
        let mut inputs: Vec<(usize, Vec<u32>, Logits)> = Vec::new();
        let decoding = |job: &Job| job.next.filter(|_| job.fed == job.input.len());
        let mut n_decode = self
            .slots
            .iter()
            .filter(|s| s.job.as_ref().and_then(decoding).is_some())
            .count();
        let mut spare = self.config.spec_rows.saturating_sub(n_decode);
        let draft_max = self.config.draft_max;
        // Rows of the step so far and the tokens they are expected to give.
        let (mut rows, mut expected) = (n_decode, n_decode as f32);
        let mut order: Vec<usize> = (0..self.slots.len()).collect();
        order.sort_by_key(|&i| self.slots[i].job.as_ref().map(|j| j.arrived));
        for i in order {
            let n_past = self.slots[i].cache.n_past;
            let Some(job) = self.slots[i].job.as_mut() else {
                continue;
            };
            let Some(t) = decoding(job) else { continue };
            let mut toks = vec![t];
            if let Some(p) = job.proposer.as_mut().filter(|_| spare > 0) {
                // Room: the context after `t`, the answer's budget, the step's rows.
                let room = self
                    .config
                    .n_ctx
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
        let mut budget = if n_decode > 0 {
            self.config.prefill_chunk
        } else {
            self.config.prefill_chunk_alone
        };
        let checkpointing = self.checkpointing();
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(job) = &slot.job else { continue };
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
            budget -= take;
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
        // Blocks for every input, oldest job first; when the pool runs out, the youngest
        // job gives its blocks back (perhaps the one that needed them).
        let arrived = |w: &Self, i: usize| w.slots[i].job.as_ref().map(|j| j.arrived);
        inputs.sort_by_key(|x| arrived(self, x.0));
        let mut k = 0;
        while k < inputs.len() {
            let (i, ref toks, _) = inputs[k];
            if self.slots[i].job.is_none() {
                inputs.remove(k);
                continue;
            }
            let n = self.slots[i].cache.n_past + toks.len();
            self.slide(i);
            if self.grow(i, n) {
                k += 1;
                continue;
            }
            if inputs[k].2 == Logits::All {
                // Proposals never take blocks from another sequence.
                inputs[k].1.truncate(1);
                inputs[k].2 = Logits::Last;
                continue;
            }
            let running: Vec<usize> = (0..self.slots.len())
                .filter(|&j| self.slots[j].job.is_some())
                .collect();
            let youngest = *running
                .iter()
                .max_by_key(|&&j| arrived(self, j))
                .expect("slot i runs a job");
            if running.len() == 1 {
                // Alone and the pool is full: its context ends here.
                let job = self.slots[i].job.take().expect("slot i runs a job");
                self.complete(
                    job,
                    FinishReason::Length,
                    String::new(),
                    Vec::new(),
                    Instant::now(),
                );
                inputs.remove(k);
                continue;
            }
            self.preempt(youngest);
        }
        inputs.retain(|x| self.slots[x.0].job.is_some());
        if inputs.is_empty() {
            return;
        }
        n_decode = inputs
            .iter()
            .filter(|x| (x.1.len() == 1 && x.2 == Logits::Last) || x.2 == Logits::All)
            .map(|x| x.1.len())
            .sum();
        let n_prefill = inputs.iter().map(|x| x.1.len()).sum::<usize>() - n_decode;
        inputs.sort_by_key(|x| x.0);

        let t0 = Instant::now();
        self.shared.forward_steps.fetch_add(1, Ordering::Relaxed);
        let result = {
            let mut seqs = Vec::with_capacity(inputs.len());
            // Samplers whose grammar mask the next sampling needs: computed on another
            // thread while the forward pass runs (the mask depends only on the grammar's
            // state, which is known now), so sampling only applies it; only where a core
            // is left over by the compute pool (on a machine the pool fills, the mask
            // thread would take its time from the forward pass: measured on 2 cores,
            // smollm2, 8 constrained streams, 0.87x of free decoding with it, 0.89x
            // without).
            let spare_core = self.spare_core;
            let mut masks: Vec<&mut Sampler> = Vec::new();
            let mut it = inputs.iter().peekable();
            for (i, slot) in self.slots.iter_mut().enumerate() {
                if let Some(inp) = it.next_if(|x| x.0 == i) {
                    let Slot { cache, job, .. } = slot;
                    let mut lora = None;
                    if let Some(Job { sampler, req, .. }) = job.as_mut() {
                        if spare_core && inp.2 == Logits::Last && sampler.is_constrained() {
                            masks.push(sampler);
                        }
                        lora = Some(&req.lora[..]);
                    }
                    seqs.push(Sequence {
                        state: cache,
                        tokens: &inp.1,
                        logits: inp.2,
                        lora,
                    });
                }
            }
            let model = &self.model;
            let pool = &mut self.pool;
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
        };
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

        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                // Checked before anything was written: fail the sequences of this step.
                for (i, _, _) in &inputs {
                    if let Some(mut job) = self.slots[*i].job.take() {
                        self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                        job.req
                            .sink
                            .send(Event::Error(format!("evaluation failed: {e}")));
                    }
                }
                return;
            }
        };
        for ((i, toks, want), logits) in inputs.into_iter().zip(rows) {
            let slot = &mut self.slots[i];
            slot.tokens.extend_from_slice(&toks);
            let n_past = slot.cache.n_past;
            if want == Logits::All {
                self.verify(i, &toks[1..], &logits, n_past - toks.len());
                continue;
            }
            self.register_full_blocks(i);
            let Some(mut job) = self.slots[i].job.take() else {
                continue;
            };
            if job.fed < job.input.len() {
                job.fed += toks.len();
                // Checkpoints at the interval's multiples and around the prompt's last
                // token.
                let (n, t) = (job.input.len(), self.config.checkpoint_interval);
                if checkpointing
                    && job.pooler.is_none()
                    && (n_past.is_multiple_of(t) || n_past + 1 == n || n_past == n)
                {
                    self.slots[i].job = Some(job);
                    self.save_checkpoint(i);
                    job = self.slots[i].job.take().expect("just put back");
                }
            }
            if let Some(p) = job.pooler.as_mut() {
                p.push(&logits);
                if job.fed == job.input.len() {
                    self.finish_embedding(job);
                    continue;
                }
                self.slots[i].job = Some(job);
                continue;
            }
            let job = if logits.is_empty() {
                Some(job)
            } else {
                self.sample(job, &logits, n_past, None)
            };
            self.slots[i].job = job;
        }
        self.publish_busy();
    }

    /// Samples slot `i`'s tokens from the rows of its speculative step (its token at
    /// position `at`, then `drafts`: `logits` holds a row for each) as plain decoding
    /// would, one row at a time: row `m`'s choice is emitted, and if it is not `drafts[m]`
    /// the step ends there (the choice is evaluated next step). The slot is cut back to
    /// the proposals taken; its job goes back unless it finished.
    fn verify(&mut self, i: usize, drafts: &[u32], logits: &[f32], at: usize) {
        let Some(mut job) = self.slots[i].job.take() else {
            self.register_full_blocks(i);
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
            self.cut(i, at + 1 + taken);
        }
        self.register_full_blocks(i);
        if let Some(j) = job.as_mut() {
            j.adaptive.record(drafts.len(), taken);
        }
        self.slots[i].job = job;
    }

    /// Samples the next token of `job` from `logits` (the row at `n_past` positions;
    /// `expect`: the token proposed there and the distribution it was drawn from, if
    /// any, chosen by [`SchedulerConfig::spec_sampling`] and counted when taken), sends
    /// what it adds, and returns the job unless it finished (or its client went away).
    fn sample(
        &self,
        mut job: Job<'t>,
        logits: &[f32],
        n_past: usize,
        expect: Option<(u32, Option<&[Candidate]>)>,
    ) -> Option<Job<'t>> {
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
                job.req.sink.send(Event::Refused(format!(
                    "the grammar cannot be followed at generated token {}: {e}",
                    job.ids.len() + 1
                )));
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
        let eog = self.tok.is_eog(id) && (!job.req.ignore_eos || job.sampler.constraint_complete());
        let mut text = String::new();
        let mut tokens = Vec::new();
        if !eog {
            match job.decoder.push(id) {
                Ok(piece) => text = job.stops.push(&piece),
                Err(e) => {
                    self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                    job.req
                        .sink
                        .send(Event::Error(format!("decoding failed: {e}")));
                    return None;
                }
            }
            if let Some(n) = job.req.top_logprobs {
                tokens.push(logprob_of(logits, id, n));
            }
        }
        let finish = if eog || job.stops.stopped() {
            Some(FinishReason::Stop)
        } else if job.req.max_tokens.is_some_and(|m| job.ids.len() >= m)
            || n_past >= self.config.n_ctx
        {
            Some(FinishReason::Length)
        } else {
            None
        };
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

    /// Ends `job` with `finish_reason`: the text its decoder and stop matcher still hold
    /// (after `text`), then `Done`.
    fn complete(
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
        req.sink.send(Event::Done(Completion {
            finish_reason,
            prompt_tokens: req.prompt.len(),
            cached_tokens: job.cached,
            ids: job.ids,
            first_token_ms: (first - job.arrived).as_secs_f64() * 1e3,
            gen_ms: (now - first).as_secs_f64() * 1e3,
            proposed: job.proposed,
            accepted: job.accepted,
        }));
    }
}

impl Worker<'_> {
    /// Sends an embedding request's vector and its end; its slot is free.
    fn finish_embedding(&self, mut job: Job<'_>) {
        let Some(pooler) = job.pooler.take() else {
            return;
        };
        match pooler.finish() {
            Ok(v) => {
                job.req.sink.send(Event::Embedding(v));
            }
            Err(e) => {
                self.shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                job.req.sink.send(Event::Error(e.to_string()));
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
            prompt_tokens: job.req.prompt.len(),
            cached_tokens: 0,
            ids: Vec::new(),
            first_token_ms: (now - job.arrived).as_secs_f64() * 1e3,
            gen_ms: 0.0,
            proposed: 0,
            accepted: 0,
        }));
    }
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `id`'s log-probability in the softmax of `logits`, and the `n` best alternatives.
fn logprob_of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
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
