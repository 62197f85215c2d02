//! `frink run` and `chat` decode through the server's scheduler: one slot of `--ctx`
//! positions, the same admission, speculation, sampling, finishing rules and stops as
//! `frink serve`, so a rule cannot exist in one and not the other (llama.cpp's CLI and
//! server share their loop the same way). A conversation's earlier turns stay in the slot
//! and are reused as the server reuses a client's prefix.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::{Context, Result};
use frink_engine::constraint::Constraint;
use frink_engine::sampling::SamplingParams;
use frink_engine::scheduler::{
    Completion, Event, EventSink, Request, Scheduler, SchedulerConfig, SlotAction,
};
use frink_models::{KvType, Model};

use crate::common::GenArgs;

/// The scheduler's settings for one conversation at a time: one slot and a KV pool of
/// `--ctx` positions, the speculation `--spec`, `--draft-max`, `--draft-min`,
/// `--draft-p-min` and `--spec-sampling` ask for.
///
/// # Errors
/// An unknown `--spec` value.
pub fn config(gen: &GenArgs, kv_type: KvType) -> Result<SchedulerConfig> {
    let spec = gen.spec.kind()?;
    Ok(SchedulerConfig {
        parallel: 1,
        n_ctx: gen.ctx,
        kv_size: gen.ctx,
        queue: 1,
        kv_type,
        prompt_lookup: spec == crate::common::SpecKind::Ngram,
        draft_max: if spec == crate::common::SpecKind::Off {
            0
        } else {
            gen.spec.draft_max
        },
        draft_p_min: gen.spec.draft_p_min,
        draft_min: gen.spec.draft_min,
        spec_sampling: gen.spec.spec_sampling(),
        ..SchedulerConfig::default()
    })
}

/// What one answer is asked with.
pub struct Ask {
    /// The prompt's token ids (template applied).
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub constraint: Option<Constraint>,
    /// The prompt's images (their rows at their keys' places).
    pub images: Vec<frink_engine::image::PromptImage>,
}

/// The request's end of the channel: `stop_requested` once Ctrl+C was pressed or the
/// reader of the answer went away; before the answer's first text that closes it instead
/// (the scheduler drops it between prompt chunks: a long prompt is not evaluated to its end).
struct Sink {
    tx: mpsc::Sender<Event>,
    interrupted: Arc<AtomicBool>,
    gone: Arc<AtomicBool>,
    /// Text has come (set by the receiving side).
    started: Arc<AtomicBool>,
}

impl EventSink for Sink {
    fn send(&mut self, event: Event) -> bool {
        self.tx.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.stop_requested() && !self.started.load(Ordering::Relaxed)
    }
    fn stop_requested(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed) || self.gone.load(Ordering::Relaxed)
    }
}

/// Asks `sched` for the answer to `ask` with the adapters `model` applies (`--lora`),
/// handing each piece of text to `on_text` as it comes (`false` from it: the reader has
/// gone, and the answer ends at the next token, as it does once `interrupted` is set).
///
/// # Errors
/// The scheduler refuses or fails the request (the message says why).
pub fn answer(
    sched: &Scheduler,
    model: &Model,
    ask: Ask,
    interrupted: &Arc<AtomicBool>,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Completion> {
    let (tx, rx) = mpsc::channel();
    let gone = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let n_prompt = ask.prompt.len();
    let req = Request {
        prompt: ask.prompt,
        sampling: ask.sampling,
        max_tokens: ask.max_tokens,
        stop: ask.stop,
        ignore_eos: ask.ignore_eos,
        top_logprobs: None,
        constraint: ask.constraint,
        prefix_group: None,
        follows_prefix: false,
        embed: None,
        shown_tokens: Vec::new(),
        lora: model.lora_scales.iter().copied().enumerate().collect(),
        prediction: None,
        images: ask.images,
        n_ctx: None,
        n_keep: 0,
        sink: Box::new(Sink {
            tx,
            interrupted: Arc::clone(interrupted),
            gone: Arc::clone(&gone),
            started: Arc::clone(&started),
        }),
    };
    sched
        .submit(req)
        .map_err(|e| anyhow::anyhow!("the scheduler refused the request: {e:?}"))?;
    loop {
        match rx.recv() {
            Ok(Event::Delta { text, .. }) => {
                started.store(true, Ordering::Relaxed);
                if !text.is_empty() && !on_text(&text) {
                    gone.store(true, Ordering::Relaxed);
                }
            }
            Ok(Event::Done(c)) => return Ok(c),
            Ok(Event::Failed(e)) => return Err(e.into()),
            Ok(Event::Embedding(_)) => {}
            // Dropped while its prompt was evaluated (Ctrl+C, or no reader): no answer.
            Err(_) if interrupted.load(Ordering::Relaxed) || gone.load(Ordering::Relaxed) => {
                return Ok(Completion {
                    finish_reason: frink_engine::FinishReason::Stop,
                    stop_string: None,
                    prompt_tokens: n_prompt,
                    cached_tokens: 0,
                    ids: Vec::new(),
                    first_token_ms: 0.0,
                    gen_ms: 0.0,
                    proposed: 0,
                    accepted: 0,
                    context_shifts: 0,
                })
            }
            Err(_) => anyhow::bail!("the scheduler ended without an answer"),
        }
    }
}

/// Whether `c`, the answer to a prompt of `n_prompt` tokens with the budget `max_tokens`,
/// ended because the context of `n_ctx` positions was full (the scheduler reports that as
/// `length`, as the budget).
pub fn context_full(
    c: &Completion,
    n_prompt: usize,
    max_tokens: Option<usize>,
    n_ctx: usize,
) -> bool {
    c.finish_reason == frink_engine::FinishReason::Length
        && Some(c.ids.len()) != max_tokens
        && n_prompt + c.ids.len() >= n_ctx
}

/// The timings of `c` as `run` reports them: the prompt tokens evaluated (those a chat's
/// earlier turns left in the cache are not) and the time to the first token, then the
/// tokens after the first.
pub fn timings(c: &Completion) -> frink_engine::Timings {
    frink_engine::Timings {
        prompt_tokens: c.prompt_tokens - c.cached_tokens,
        prompt_ms: c.first_token_ms,
        first_token_ms: c.first_token_ms,
        gen_tokens: c.ids.len().saturating_sub(1),
        gen_ms: c.gen_ms,
    }
}

/// `--prompt-cache FILE` before the answer: the state saved in FILE, if there is one, in
/// the scheduler's slot (a later prompt that starts with its tokens reuses them).
///
/// Errors: the file is not a state, is damaged, or was saved with another model, KV
/// type or adapter set (named).
pub fn restore_cache(sched: &Scheduler, file: &std::path::Path) -> Result<()> {
    if !file.exists() {
        return Ok(());
    }
    sched
        .slot(0, SlotAction::Restore(file.to_path_buf()))
        .map(drop)
        .context("--prompt-cache")
}

/// `--prompt-cache FILE` after the answer: the slot's state (prompt and answer) saved.
pub fn save_cache(sched: &Scheduler, file: &std::path::Path) -> Result<()> {
    sched
        .slot(0, SlotAction::Save(file.to_path_buf()))
        .map(drop)
        .context("--prompt-cache")
}
