//! The scheduler's loop for an encoder model ([`frink_models::arch::ArchSpec::encoder`]:
//! BERT and its family), in place of the decoder's slots and KV pool: an encoder evaluates
//! each input whole, both ways, and keeps nothing after it. Every embedding request
//! waiting is one input; each pass takes the oldest ones while their tokens fit the pass
//! ([`SchedulerConfig::prefill_chunk_alone`], `--ubatch`; an input longer than that goes
//! alone) and evaluates them together in one forward pass ([`Model::encode_batch`]), so a
//! request of 256 short sentences is a few passes, not 256, and requests arriving
//! meanwhile join the next pass in arrival order (none waits behind more than the inputs
//! queued before it), after waiting up to [`LINGER`] for more while the pass is not full.
//! A vector does not depend on its pass.
//!
//! Keys and values are kept in f32 during a pass whatever `--kv-type` says: there is no
//! cache to save (llama.cpp evaluates encoders without one, `build_attn_inp_no_cache`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use frink_models::{EncoderInput, KvType, Model, Pooling};

use super::metrics::Shared;
use super::{Completion, Event, Request, RequestError, SchedulerConfig};
use crate::generate::FinishReason;

/// How long the loop waits for another input before it starts a pass that is not full:
/// a request's inputs are queued one after another (as earlier ones finish, past
/// `--queue`), and a pass takes 10–1000 ms, so a millisecond fills passes that would
/// otherwise take the one or two inputs queued so far.
const LINGER: Duration = Duration::from_millis(1);

/// Tokens of the inputs waiting.
fn waiting_tokens(waiting: &VecDeque<Waiting>) -> usize {
    waiting.iter().map(|w| w.req.prompt.len()).sum()
}

/// An admitted input waiting for its pass.
struct Waiting {
    req: Request,
    arrived: Instant,
}

/// Runs until the queue closes (after finishing what waits) or shutdown cancels all.
pub(super) fn run(model: &Model, config: &SchedulerConfig, shared: &Shared, rx: Receiver<Request>) {
    // An encoder keeps no slots to save or restore.
    super::slots::close(shared);
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut open = true;
    loop {
        if waiting.is_empty() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(req) => admit(model, shared, req, &mut waiting),
                Err(_) => return,
            }
        }
        // Gather what arrives while the pass is not full, waiting up to LINGER after each
        // arrival: the inputs of one HTTP request come in a burst, one after another.
        while open && waiting_tokens(&waiting) < config.prefill_chunk_alone {
            match rx.recv_timeout(LINGER) {
                Ok(req) => admit(model, shared, req, &mut waiting),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        if shared.cancel_all.load(Ordering::SeqCst) {
            for mut w in waiting.drain(..).chain(rx.try_iter().map(|req| Waiting {
                req,
                arrived: Instant::now(),
            })) {
                shared.queued.fetch_sub(1, Ordering::SeqCst);
                w.req.sink.send(Event::Failed(RequestError::ShuttingDown));
            }
            continue;
        }
        waiting.retain(|w| {
            let gone = w.req.sink.is_closed();
            if gone {
                shared.queued.fetch_sub(1, Ordering::SeqCst);
                shared.requests_cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        let n = pass_len(&waiting, config.prefill_chunk_alone);
        let pass: Vec<Waiting> = waiting.drain(..n).collect();
        if !pass.is_empty() {
            evaluate(model, shared, pass);
        }
    }
}

/// How many of the oldest inputs the next pass takes: while their tokens fit `batch`, at
/// least one.
fn pass_len(waiting: &VecDeque<Waiting>, batch: usize) -> usize {
    let mut tokens = 0;
    let mut n = 0;
    for w in waiting {
        let t = w.req.prompt.len();
        if n > 0 && tokens + t > batch {
            break;
        }
        tokens += t;
        n += 1;
    }
    n
}

/// Checks `req` (an embedding request whose tokens, types and length the model takes)
/// and queues it, or fails it at once.
fn admit(model: &Model, shared: &Shared, mut req: Request, waiting: &mut VecDeque<Waiting>) {
    match check(model, &req) {
        Ok(()) => {
            shared
                .prompt_tokens
                .fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
            waiting.push_back(Waiting {
                req,
                arrived: Instant::now(),
            });
        }
        Err(e) => {
            shared.queued.fetch_sub(1, Ordering::SeqCst);
            shared.requests_failed.fetch_add(1, Ordering::Relaxed);
            req.sink.send(Event::Failed(e));
        }
    }
}

/// Why an encoder cannot serve `req`.
fn check(model: &Model, req: &Request) -> Result<(), RequestError> {
    let c = &model.config;
    let name = c.arch.name;
    let Some(embed) = &req.embed else {
        return Err(RequestError::Encoder(format!(
            "the model is an encoder ({name}): it gives embeddings and reranking scores, \
             it does not generate text"
        )));
    };
    if embed.pooling == Pooling::None {
        return Err(RequestError::Encoder(
            "pooling `none` gives no single vector per input".into(),
        ));
    }
    if embed.pooling == Pooling::Rank && !model.has_classifier() {
        return Err(RequestError::Encoder(format!(
            "the model ({name}) has no classifier head (cls.output): it is not a reranker"
        )));
    }
    if !req.images.is_empty() {
        return Err(RequestError::Images(
            "an embedding request takes no images".into(),
        ));
    }
    let n = req.prompt.len();
    if n == 0 {
        return Err(super::PromptError::Empty.into());
    }
    if n > c.n_ctx_train {
        return Err(RequestError::Encoder(format!(
            "the input is {n} tokens, longer than the {} positions the model takes \
             ({name}.context_length)",
            c.n_ctx_train
        )));
    }
    if let Some(&id) = req.prompt.iter().find(|&&t| t as usize >= c.n_vocab) {
        return Err(RequestError::TokenOutOfVocabulary {
            id,
            n_vocab: c.n_vocab,
        });
    }
    let types = &embed.token_types;
    if !types.is_empty() && types.len() != n {
        return Err(RequestError::Encoder(format!(
            "{} token types for {n} tokens",
            types.len()
        )));
    }
    if types
        .iter()
        .any(|&t| t != 0 && t as usize >= c.n_token_types)
    {
        return Err(RequestError::Encoder(format!(
            "token type above the model's {} (token_type_count)",
            c.n_token_types
        )));
    }
    Ok(())
}

/// One forward pass over `pass`'s inputs; each gets its vector (or its failure) and its
/// end.
fn evaluate(model: &Model, shared: &Shared, pass: Vec<Waiting>) {
    let inputs: Vec<EncoderInput> = pass
        .iter()
        .map(|w| EncoderInput {
            tokens: &w.req.prompt,
            token_types: w.req.embed.as_ref().map_or(&[][..], |e| &e.token_types[..]),
        })
        .collect();
    let t0 = Instant::now();
    shared.forward_steps.fetch_add(1, Ordering::Relaxed);
    let result = model.encode_batch(&inputs, KvType::F32);
    shared
        .prefill_ns
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    shared.queued.fetch_sub(pass.len(), Ordering::SeqCst);
    let rows = match result {
        Ok(rows) => rows,
        Err(e) => {
            for mut w in pass {
                shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                w.req
                    .sink
                    .send(Event::Failed(RequestError::Evaluation(e.to_string())));
            }
            return;
        }
    };
    for (mut w, rows) in pass.into_iter().zip(rows) {
        let pooling = w.req.embed.as_ref().map_or(Pooling::Mean, |e| e.pooling);
        match crate::embed::pool_rows(model, &rows, pooling) {
            Ok(v) => {
                w.req.sink.send(Event::Embedding(v));
                shared.requests_finished.fetch_add(1, Ordering::Relaxed);
                let ms = w.arrived.elapsed().as_secs_f64() * 1e3;
                w.req.sink.send(Event::Done(Completion {
                    finish_reason: FinishReason::Stop,
                    stop_string: None,
                    prompt_tokens: w.req.prompt.len(),
                    cached_tokens: 0,
                    ids: Vec::new(),
                    first_token_ms: ms,
                    gen_ms: 0.0,
                    proposed: 0,
                    accepted: 0,
                    context_shifts: 0,
                }));
            }
            Err(e) => {
                shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                w.req
                    .sink
                    .send(Event::Failed(RequestError::Embedding(e.to_string())));
            }
        }
    }
}
