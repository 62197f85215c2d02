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

mod encoder;
mod kv;
mod metrics;
mod output;
mod placement;
mod shift;
mod slots;
mod worker;

use metrics::Shared;
pub use metrics::{Histogram, MetricsSnapshot};
pub use slots::{SlotAction, SlotError, SlotInfo, SlotReply};
use worker::Worker;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use frink_models::{KvType, Model};
use frink_tokenizer::Tokenizer;

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
    /// A generation that reaches `n_ctx` keeps its request's [`Request::n_keep`] first
    /// tokens, drops the older half of the rest and goes on, the kept rows' keys rotated
    /// to their new positions (llama.cpp's `--context-shift`, off by default as there:
    /// without it the answer ends with `length`). The caller checked that the model's
    /// cache can be shifted ([`frink_models::shift::shift_refusal`]).
    pub context_shift: bool,
    /// The prefix cache's disk tier (`--cache-disk DIR --cache-disk-size BYTES`): full
    /// blocks evicted from memory are kept under DIR, at most BYTES, and read back when a
    /// prompt's blocks match them. The caller checked the model allows it (no sliding
    /// window, no recurrent layers: [`disk_tier_refusal`]).
    pub cache_disk: Option<(std::path::PathBuf, u64)>,
}

/// Why the prefix cache's disk tier cannot serve `model`, or `None` when it can: it keeps
/// the main group's full blocks, which a recurrent model (no prefix cache) or one with
/// sliding-window layers (a hit needs their window blocks too) cannot use alone.
pub fn disk_tier_refusal(config: &frink_models::ModelConfig) -> Option<String> {
    let arch = config.plan.arch;
    if config.plan.is_recurrent() {
        return Some(format!("{arch}'s recurrent layers keep no prefix cache"));
    }
    if config.plan.window() > 0 {
        return Some(format!(
            "{arch}'s sliding-window layers keep their rows apart from the blocks it saves"
        ));
    }
    None
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
            kv_positions: self.kv_blocks().saturating_mul(frink_models::KV_BLOCK),
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
            context_shift: false,
            cache_disk: None,
        }
    }
}

/// Where a request's events go (an HTTP response, a test's channel).
pub trait EventSink: Send {
    /// Delivers one event; `false` when the receiver is gone (the request is cancelled).
    fn send(&mut self, event: Event) -> bool;
    /// Whether the receiver is gone (checked every step, also before the first token).
    fn is_closed(&self) -> bool;
    /// Whether the receiver wants the answer to end now, as a stop string would end it:
    /// the next sampled token is the last, and `Done` follows with what was generated
    /// (Ctrl+C in `frink run` and `chat`). Checked at every sampled token.
    fn stop_requested(&self) -> bool {
        false
    }
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
    /// Compute the prompt's embedding instead of generating: the request gets one
    /// [`Event::Embedding`] (not normalised; a reranker's scores under `rank` pooling)
    /// and `Done`. Its prompt is evaluated in full (no reused prefix: every token's hidden
    /// state is pooled).
    pub embed: Option<Embed>,
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
    /// The images of the prompt: their rows replace the prompt's values at their places,
    /// which carry their keys ([`crate::image`]). Checked at admission
    /// ([`crate::image::check_images`]); a request with images proposes nothing for
    /// speculation.
    pub images: Vec<crate::image::PromptImage>,
    /// The context this request may fill, where it asks for less than `n_ctx` (Ollama's
    /// `num_ctx`): it ends there with `length`, or shifts there
    /// ([`SchedulerConfig::context_shift`]).
    pub n_ctx: Option<usize>,
    /// Tokens from the prompt's start a context shift keeps
    /// ([`SchedulerConfig::context_shift`]; llama.cpp's `n_keep` with the BOS it adds,
    /// Ollama's `num_keep`): at most the prompt.
    pub n_keep: usize,
    /// Where the events go.
    pub sink: Box<dyn EventSink>,
}

/// What an embedding request asks for ([`Request::embed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Embed {
    /// How the hidden states pool ([`crate::embed::pool_rows`]).
    pub pooling: frink_models::Pooling,
    /// Each prompt token's type (an encoder's segment ids: 1 for the document of a
    /// reranker's pair); empty: all 0. Refused by a model without token types.
    pub token_types: Vec<u32>,
}

impl Embed {
    /// Pooling `pooling`, every token of type 0.
    pub fn pooled(pooling: frink_models::Pooling) -> Embed {
        Embed {
            pooling,
            token_types: Vec::new(),
        }
    }
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
    /// The stop string that ended the answer (its `stop` list's), if one did.
    pub stop_string: Option<String>,
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
    /// Context shifts during the answer ([`SchedulerConfig::context_shift`]; llama.cpp's
    /// `truncated` when above 0).
    pub context_shifts: usize,
}

/// What the scheduler sends about a request, in order: any number of `Delta`s (and, for an
/// embedding request, one `Embedding`), then one `Done` or one `Failed`.
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
    /// The request ended unfinished; [`RequestError::kind`] says whose fault it was.
    Failed(RequestError),
}

/// Why a request ended without its answer ([`Event::Failed`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// The prompt cannot run ([`PromptLimit`]): found at admission.
    #[error(transparent)]
    Prompt(#[from] PromptError),
    /// A prompt token id is not in the model's vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    TokenOutOfVocabulary {
        /// The id.
        id: u32,
        /// The vocabulary's size.
        n_vocab: usize,
    },
    /// The prompt's images do not fit it ([`crate::image::check_images`]), or its kind of
    /// request takes none (embeddings).
    #[error("images: {0}")]
    Images(String),
    /// The request's grammar reached a state no token continues, or went past
    /// `llguidance`'s parser limits, at the `at`-th generated token.
    #[error("the grammar cannot be followed at generated token {at}: {reason}")]
    Grammar {
        /// 1-based index of the token being sampled.
        at: usize,
        /// llguidance's words.
        reason: String,
    },
    /// The forward pass failed (the step's sequences all fail; nothing was written).
    #[error("evaluation failed: {0}")]
    Evaluation(String),
    /// A generated token could not be turned into text.
    #[error("decoding failed: {0}")]
    Decoding(String),
    /// The embedding could not be pooled.
    #[error("embedding failed: {0}")]
    Embedding(String),
    /// The scheduler cancelled the request unfinished because it is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A request an encoder model cannot serve (it embeds and ranks; it does not
    /// generate, take images or pool to `none`), or whose token types do not fit it.
    #[error("{0}")]
    Encoder(String),
}

/// Whose fault a [`RequestError`] is: what an HTTP server answers (400, 500, 503).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The request's own input cannot be served (HTTP 400).
    Request,
    /// The engine failed (HTTP 500).
    Engine,
    /// The server is shutting down (HTTP 503).
    Unavailable,
}

impl RequestError {
    /// Whose fault it is.
    pub fn kind(&self) -> FailureKind {
        match self {
            RequestError::Prompt(_)
            | RequestError::TokenOutOfVocabulary { .. }
            | RequestError::Images(_)
            | RequestError::Grammar { .. }
            | RequestError::Encoder(_) => FailureKind::Request,
            RequestError::Evaluation(_)
            | RequestError::Decoding(_)
            | RequestError::Embedding(_) => FailureKind::Engine,
            RequestError::ShuttingDown => FailureKind::Unavailable,
        }
    }
}

/// Why [`Scheduler::submit`] refused a request.
#[derive(Debug)]
pub enum SubmitError {
    /// The queue is full (HTTP 503).
    QueueFull,
    /// The scheduler has stopped.
    Stopped,
}

/// Handle of the scheduler thread: submit requests, read metrics, shut down (on drop too).
pub struct Scheduler {
    tx: Option<SyncSender<Request>>,
    /// Slot operations ([`Scheduler::slot`]).
    ctl: mpsc::Sender<slots::SlotOp>,
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
        let (mut sched, rx) = Scheduler::handle(config);
        let thread = {
            let shared = Arc::clone(&sched.shared);
            let config = sched.config.clone();
            std::thread::Builder::new()
                .name("frink-scheduler".into())
                .spawn(move || {
                    // Slot operations end with the thread, also when it panics.
                    let _ops = slots::CloseOnDrop(Arc::clone(&shared));
                    match model.config.plan.encoder {
                        true => encoder::run(&model, &config, &shared, rx),
                        false => Worker::new(&model, draft.as_ref(), &tok, config, shared).run(rx),
                    }
                })
                .expect("cannot start the scheduler thread")
        };
        sched.thread = Some(thread);
        sched
    }

    /// Runs `f` with a scheduler over borrowed models (`frink run` and `chat`, which keep
    /// the model for what follows: `--stats`); the scheduler's thread ends, its running
    /// requests finished, before this returns.
    pub fn scoped<R>(
        model: &Model,
        draft: Option<&Model>,
        tok: Arc<Tokenizer>,
        config: SchedulerConfig,
        f: impl FnOnce(&Scheduler) -> R,
    ) -> R {
        let (sched, rx) = Scheduler::handle(config);
        let shared = Arc::clone(&sched.shared);
        let worker_config = sched.config.clone();
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("frink-scheduler".into())
                .spawn_scoped(scope, move || {
                    // Slot operations end with the thread, also when it panics.
                    let _ops = slots::CloseOnDrop(Arc::clone(&shared));
                    match model.config.plan.encoder {
                        true => encoder::run(model, &worker_config, &shared, rx),
                        false => Worker::new(model, draft, &tok, worker_config, shared).run(rx),
                    }
                })
                .expect("cannot start the scheduler thread");
            let r = f(&sched);
            // Closing the queue ends the worker; the scope waits for it.
            drop(sched);
            r
        })
    }

    /// The handle's half of a scheduler (its thread not yet started) and the queue's
    /// receiving end, `config` with its minimums applied.
    fn handle(mut config: SchedulerConfig) -> (Scheduler, Receiver<Request>) {
        config.parallel = config.parallel.max(1);
        config.queue = config.queue.max(1);
        config.prefill_chunk = config.prefill_chunk.max(1);
        config.prefill_chunk_alone = config.prefill_chunk_alone.max(1);
        config.checkpoint_interval = config.checkpoint_interval.max(1);
        let (tx, rx) = mpsc::sync_channel(config.queue);
        let (ctl, ctl_rx) = mpsc::channel();
        let shared = Shared {
            slot_ops: std::sync::Mutex::new(Some(ctl_rx)),
            ..Shared::default()
        };
        let sched = Scheduler {
            tx: Some(tx),
            ctl,
            shared: Arc::new(shared),
            thread: None,
            config,
        };
        (sched, rx)
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

    /// Cancels every running and queued request (each gets [`Event::Failed`] with [`RequestError::ShuttingDown`]) and
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
            context_shifts: s.context_shifts.load(Ordering::Relaxed),
            cache_disk_hits: s.cache_disk_hits.load(Ordering::Relaxed),
            cache_disk_bytes: s.cache_disk_bytes.load(Ordering::Relaxed),
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
