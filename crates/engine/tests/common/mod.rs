//! What the scheduler tests share: a request with its event channel, and waiting for its
//! answer.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::mpsc;

use frink_engine::sampling::SamplingParams;
use frink_engine::scheduler::{Completion, Event, Request};

/// A request for `prompt` with `sampling`, at most `max_tokens` tokens, end-of-generation
/// tokens banned (`ignore_eos`) and nothing else asked; its events arrive on the receiver.
pub fn request(
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
) -> (Request, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let req = Request {
        prompt: prompt.to_vec(),
        sampling,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        ignore_eos: true,
        top_logprobs: None,
        constraint: None,
        prefix_group: None,
        follows_prefix: false,
        shown_tokens: Vec::new(),
        embed: None,
        lora: Vec::new(),
        prediction: None,
        images: Vec::new(),
        n_ctx: None,
        n_keep: 0,
        sink: Box::new(tx),
    };
    (req, rx)
}

/// The request's completion (panics on a failure).
pub fn done(rx: &mpsc::Receiver<Event>) -> Completion {
    loop {
        match rx.recv().expect("an event") {
            Event::Done(c) => return c,
            Event::Failed(e) => panic!("{e}"),
            Event::Delta { .. } | Event::Embedding(_) => {}
        }
    }
}
