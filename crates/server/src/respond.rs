//! Answers of completion requests: the JSON of whole responses and of streamed chunks
//! (server-sent events), from the scheduler's events.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{json_response, ApiError};
use std::collections::VecDeque;
use std::convert::Infallible;

use frink_engine::scheduler::{
    Completion, Event, FailureKind, PromptError, RequestError, TokenLogprob,
};
use frink_tokenizer::Tokenizer;

use crate::{answer, reasoning, tools};

/// Builds the JSON of responses and chunks.
pub(crate) struct Formatter {
    pub(crate) kind: Kind,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) tok: Arc<Tokenizer>,
    pub(crate) logprobs: bool,
    pub(crate) include_usage: bool,
    /// Choices (`n`).
    pub(crate) n: usize,
    /// What to read out of a chat answer (reasoning, tool calls).
    pub(crate) answer: answer::AnswerFormat,
    /// The request gave a `prediction` (its counts go into `usage`).
    pub(crate) prediction: bool,
    /// The request field its grammar came from (named by a grammar error).
    pub(crate) grammar_param: Option<&'static str>,
    /// Where the request's log line finds its counts.
    pub(crate) log: crate::log::RequestLog,
}

/// The finished choices' counts as OpenAI's `usage` reports them: the prompt once, the
/// generated tokens of every choice; timings and cached tokens of the first choice.
#[derive(Default)]
pub(crate) struct Totals {
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    first_token_ms: f64,
    gen_ms: f64,
    /// Speculation over every choice: tokens proposed and verified, and accepted.
    proposed: usize,
    accepted: usize,
}

impl Totals {
    /// These counts for the request's log line.
    fn log(&self, fmt: &Formatter) {
        fmt.log.set(crate::log::Counts {
            model: fmt.model.clone(),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens,
            first_token_ms: self.first_token_ms,
            gen_ms: self.gen_ms,
        });
    }

    fn add(&mut self, index: usize, c: &Completion, fmt: &Formatter) {
        if index == 0 {
            // Special tokens rendered: the answer as the model wrote it.
            fmt.log.set_answer(&fmt.tok, &c.ids);
            self.prompt_tokens = c.prompt_tokens;
            self.cached_tokens = c.cached_tokens;
            self.first_token_ms = c.first_token_ms;
            self.gen_ms = c.gen_ms;
        }
        self.completion_tokens += c.ids.len();
        self.proposed += c.proposed;
        self.accepted += c.accepted;
    }
}

impl Formatter {
    /// The id stem of choice `i`'s tool calls (`call_<stem>_<k>`): unique per response
    /// and choice, the same streamed or whole.
    fn call_ids(&self, i: usize) -> String {
        format!("{}_{i}", self.id)
    }

    /// The chunk choices of a streamed tool call: its id, type and name with empty
    /// arguments, then the arguments in one fragment.
    fn call_deltas(&self, choice: usize, k: usize, c: &tools::ToolCall) -> [Value; 2] {
        let full = tools::call_json(&self.call_ids(choice), k, c);
        let mut head = full.clone();
        head["index"] = json!(k);
        head["function"]["arguments"] = json!("");
        [
            json!({"index": choice, "delta": {"tool_calls": [head]}, "logprobs": null, "finish_reason": null}),
            json!({"index": choice, "delta": {"tool_calls": [{"index": k, "function": {"arguments": c.arguments}}]}, "logprobs": null, "finish_reason": null}),
        ]
    }

    fn piece(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self
            .tok
            .token_to_piece(id, true)
            .unwrap_or_default()
            .to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// Log-probabilities in the endpoint's shape (`offset`: characters before the first).
    fn logprobs_json(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let (text, bytes) = self.piece(t.id);
                        let top: Vec<Value> = t
                            .top
                            .iter()
                            .map(|&(id, lp)| {
                                let (text, bytes) = self.piece(id);
                                json!({"token": text, "logprob": lp, "bytes": bytes})
                            })
                            .collect();
                        json!({"token": text, "logprob": t.logprob, "bytes": bytes, "top_logprobs": top})
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Text => {
                let mut toks = Vec::new();
                let mut lps = Vec::new();
                let mut tops = Vec::new();
                let mut offsets = Vec::new();
                let mut at = offset;
                for t in tokens {
                    let (text, _) = self.piece(t.id);
                    offsets.push(at);
                    at += text.chars().count();
                    toks.push(text);
                    lps.push(t.logprob);
                    let mut m = Map::new();
                    for &(id, lp) in &t.top {
                        m.insert(self.piece(id).0, json!(lp));
                    }
                    tops.push(Value::Object(m));
                }
                json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }

    fn usage(&self, t: &Totals) -> Value {
        json!({
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "total_tokens": t.prompt_tokens + t.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
            "completion_tokens_details": self.completion_details(t),
        })
    }

    /// OpenAI's `completion_tokens_details`: for a request with a `prediction`, its
    /// tokens the answer took (`accepted_prediction_tokens`) and those verified and not
    /// taken (`rejected_prediction_tokens`; counted in `completion_tokens`' cost, not in
    /// its number, as OpenAI bills them); zero otherwise (prompt lookup is not a
    /// prediction: `/metrics` counts it).
    fn completion_details(&self, t: &Totals) -> Value {
        let (accepted, rejected) = if self.prediction {
            (t.accepted, t.proposed - t.accepted)
        } else {
            (0, 0)
        };
        json!({
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
        })
    }

    /// One streamed chunk with `choice` (`None`: the usage-only chunk).
    fn chunk(&self, choice: Option<Value>, usage: Option<Value>) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "frink",
            "choices": choice.map_or_else(Vec::new, |c| vec![c]),
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }

    /// The choice `index` of a streamed chunk: a text delta, or the end with its finish
    /// reason.
    fn delta_choice(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Text => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }
}

pub(crate) fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The state of one streamed answer ([`stream_response`]).
struct S {
    fmt: Formatter,
    /// Characters sent so far, per choice (completion logprobs' text offsets).
    chars: Vec<usize>,
    finished: usize,
    totals: Totals,
    /// Per choice: the answer's reader (chat requests) and the calls sent.
    answers: Vec<Option<answer::AnswerStream>>,
    calls: Vec<usize>,
}
impl S {
    /// Sends choice `i`'s parts: reasoning as `reasoning_content` deltas, content as
    /// content deltas, calls as tool-call deltas.
    fn push_parts(
        &mut self,
        out: &mut VecDeque<Bytes>,
        i: usize,
        parts: Vec<reasoning::Part>,
        mut logprobs: Value,
    ) {
        for p in parts {
            match p {
                reasoning::Part::Reasoning(t) => {
                    let c = json!({"index": i, "delta": {"reasoning_content": t}, "logprobs": std::mem::take(&mut logprobs), "finish_reason": null});
                    out.push_back(sse(&self.fmt.chunk(Some(c), None)));
                }
                reasoning::Part::Content(t) => {
                    let c = self
                        .fmt
                        .delta_choice(i, Some(&t), std::mem::take(&mut logprobs), None);
                    out.push_back(sse(&self.fmt.chunk(Some(c), None)));
                }
                reasoning::Part::Call(call) => {
                    for d in self.fmt.call_deltas(i, self.calls[i], &call) {
                        out.push_back(sse(&self.fmt.chunk(Some(d), None)));
                    }
                    self.calls[i] += 1;
                }
            }
        }
    }
}

/// Streams the answer as server-sent events.
///
/// The event stream owns the receiver: when the client disconnects, the body is dropped,
/// the channel closes and the scheduler frees the slot at its next step.
pub(crate) async fn stream_response(
    fmt: Formatter,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let first = match first_event(&mut rx).await {
        Ok(e) => e,
        Err(e) => return fmt.failed(e).into_response(),
    };
    let mut out = VecDeque::new();
    if fmt.kind == Kind::Chat {
        for i in 0..fmt.n {
            let first = fmt.chunk(
                Some(json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})),
                None,
            );
            out.push_back(sse(&first));
        }
    }
    let state = S {
        answers: (0..fmt.n)
            .map(|_| (fmt.kind == Kind::Chat).then(|| fmt.answer.stream()))
            .collect(),
        calls: vec![0; fmt.n],
        chars: vec![0; fmt.n],
        fmt,
        finished: 0,
        totals: Totals::default(),
    };
    event_stream(state, out, first, rx)
}

impl OnEvent for S {
    fn on_event(&mut self, event: Option<(usize, Event)>, out: &mut VecDeque<Bytes>) -> bool {
        let s = self;
        {
            match event {
                Some((i, Event::Delta { text, tokens })) => {
                    // (Text offsets matter to completions, which have neither reasoning nor
                    // tool calls to take text out of the stream.)
                    let lp = if s.fmt.logprobs {
                        s.fmt.logprobs_json(&tokens, s.chars[i])
                    } else {
                        Value::Null
                    };
                    s.chars[i] += text.chars().count();
                    let parts = match s.answers[i].as_mut() {
                        Some(a) => a.push(&text),
                        None => vec![reasoning::Part::Content(text)],
                    };
                    s.push_parts(out, i, parts, lp);
                }
                Some((i, Event::Done(c))) => {
                    if let Some(a) = s.answers[i].take() {
                        let parts = a.finish();
                        s.push_parts(out, i, parts, Value::Null);
                    }
                    let finish = Some(chat_finish(c.finish_reason, s.calls[i] > 0));
                    let fin = s.fmt.delta_choice(i, None, Value::Null, finish);
                    out.push_back(sse(&s.fmt.chunk(Some(fin), None)));
                    s.totals.add(i, &c, &s.fmt);
                    s.totals.log(&s.fmt);
                    s.finished += 1;
                    if s.finished == s.fmt.n {
                        if s.fmt.include_usage {
                            let u = s.fmt.usage(&s.totals);
                            out.push_back(sse(&s.fmt.chunk(None, Some(u))));
                        }
                        out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                        return true;
                    }
                }
                // (Only embedding requests get one.)
                Some((_, Event::Embedding(_))) => {}
                Some((_, e @ Event::Failed(_))) => {
                    out.push_back(sse(&s.fmt.failed(Some(e)).body()));
                    out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    return true;
                }
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the request ended without an answer",
                    );
                    out.push_back(sse(&e.body()));
                    out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    return true;
                }
            }
        }
        false
    }
}

/// Tokens' log-probabilities as llama.cpp's `completion_probabilities` (`with_id`) and
/// Ollama's `logprobs` write them: each token's text, bytes and log-probability, with its
/// best alternatives in `top_logprobs`.
pub(crate) fn token_logprobs(
    tok: &frink_tokenizer::Tokenizer,
    tokens: &[TokenLogprob],
    with_id: bool,
) -> Value {
    let entry = |id: u32, lp: f32| {
        let bytes = tok.token_to_piece(id, true).unwrap_or_default().to_vec();
        let mut e =
            json!({"token": String::from_utf8_lossy(&bytes), "bytes": bytes, "logprob": lp});
        if with_id {
            e["id"] = json!(id);
        }
        e
    };
    Value::Array(
        tokens
            .iter()
            .map(|t| {
                let mut e = entry(t.id, t.logprob);
                e["top_logprobs"] =
                    Value::Array(t.top.iter().map(|&(id, lp)| entry(id, lp)).collect());
                e
            })
            .collect(),
    )
}

/// What a streamed answer does with each event of its request ([`event_stream`]).
pub(crate) trait OnEvent: Send + 'static {
    /// Handles `event` (`None`: the channel closed without an end), queueing what to send
    /// in `out`; true when the stream is over.
    fn on_event(&mut self, event: Option<(usize, Event)>, out: &mut VecDeque<Bytes>) -> bool;
}

/// A server-sent event stream: `out` first, then each event of `rx` (`first` already
/// received: it decided the status, [`first_event`]) through `state`, until it says the
/// stream is over. The stream owns the receiver: when the client disconnects, the body is
/// dropped, the channel closes and the scheduler frees the slot at its next step.
pub(crate) fn event_stream(
    state: impl OnEvent,
    out: VecDeque<Bytes>,
    first: (usize, Event),
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    answer_stream("text/event-stream", state, out, first, rx)
}

/// [`event_stream`] as `content_type` (Ollama's answers are `application/x-ndjson`): the
/// one consumer of a request's events that every streamed answer is written by.
pub(crate) fn answer_stream(
    content_type: &'static str,
    state: impl OnEvent,
    out: VecDeque<Bytes>,
    first: (usize, Event),
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let drive = (state, Some(first), rx, out, false);
    let stream = futures_util::stream::unfold(drive, |mut d| async move {
        loop {
            if let Some(b) = d.3.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), d));
            }
            if d.4 {
                return None;
            }
            let event = match d.1.take() {
                Some(e) => Some(e),
                None => d.2.recv().await,
            };
            d.4 = d.0.on_event(event, &mut d.3);
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// The first event of a streamed answer, which decides its status: a request that fails
/// before its first token (a grammar the answer cannot follow, a failed evaluation,
/// shutdown) gets its error status and body (`Err`: the failure, `None` for a channel that
/// closed without one), not a 200 stream that carries the error.
pub(crate) async fn first_event(
    rx: &mut mpsc::UnboundedReceiver<(usize, Event)>,
) -> Result<(usize, Event), Option<Event>> {
    match rx.recv().await {
        Some(e @ (_, Event::Delta { .. } | Event::Done(_) | Event::Embedding(_))) => Ok(e),
        other => Err(other.map(|(_, e)| e)),
    }
}

/// Every choice of a whole answer gathered ([`gather`]).
pub(crate) struct Gathered {
    /// Each choice's text.
    pub(crate) text: Vec<String>,
    /// Each choice's tokens with their log-probabilities (where asked for).
    pub(crate) tokens: Vec<Vec<TokenLogprob>>,
    /// How each choice ended.
    pub(crate) done: Vec<Completion>,
}

/// Gathers the events of `n` choices until each has finished, calling `on_done` as each
/// does (in the order they finish): the one consumer of a request's events that every
/// whole answer is written from.
///
/// Errors: the failure event (`None`: the channel closed first), which the caller
/// answers in its API's error shape.
pub(crate) async fn gather(
    n: usize,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    mut on_done: impl FnMut(usize, &Completion),
) -> Result<Gathered, Option<Event>> {
    let mut text = vec![String::new(); n];
    let mut tokens: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut done: Vec<Option<Completion>> = (0..n).map(|_| None).collect();
    while done.iter().any(Option::is_none) {
        match rx.recv().await {
            Some((
                i,
                Event::Delta {
                    text: t,
                    tokens: lp,
                },
            )) if i < n => {
                text[i].push_str(&t);
                tokens[i].extend(lp);
            }
            Some((i, Event::Done(c))) if i < n => {
                on_done(i, &c);
                done[i] = Some(c);
            }
            // (Only embedding requests get one.)
            Some((_, Event::Embedding(_))) => {}
            other => return Err(other.map(|(_, e)| e)),
        }
    }
    Ok(Gathered {
        text,
        tokens,
        done: done.into_iter().flatten().collect(),
    })
}

/// Which endpoint a completion answers (their shapes differ).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Text,
}

/// OpenAI's `finish_reason` of a chat answer: `tool_calls` where calls were read from an
/// answer that ended by itself; an answer cut by `max_tokens` or the context stays
/// `length` whatever was read from it (as llama-server reports it), so a client sees
/// that the last call may be cut short.
pub(crate) fn chat_finish(reason: frink_engine::FinishReason, has_calls: bool) -> &'static str {
    match reason {
        frink_engine::FinishReason::Stop if has_calls => "tool_calls",
        r => r.as_str(),
    }
}

/// The error of a request whose events ended in `event` (a `Failed`, or the channel closing
/// without `what`): by [`RequestError::kind`], 400 for the request's own input (a grammar
/// the answer could not follow: `invalid_grammar`; a prompt past the context or pool:
/// `context_length_exceeded`), 500 for the engine's failure, 503 at shutdown.
impl Formatter {
    /// [`failed`] for this answer: a grammar error names the field the grammar came from.
    pub(crate) fn failed(&self, event: Option<Event>) -> ApiError {
        let mut e = failed(event, "an answer");
        if e.code == Some("invalid_grammar") {
            e.param = self.grammar_param.map(str::to_string);
        }
        e
    }
}

pub(crate) fn failed(event: Option<Event>, what: &str) -> ApiError {
    match event {
        Some(Event::Failed(e)) => {
            let msg = e.to_string();
            match (e.kind(), e) {
                (_, RequestError::Grammar { .. }) => {
                    ApiError::invalid(None, msg).with_code("invalid_grammar")
                }
                (
                    _,
                    RequestError::Prompt(PromptError::Context { .. } | PromptError::Pool { .. }),
                ) => ApiError::invalid(None, msg).with_code("context_length_exceeded"),
                (FailureKind::Request, _) => ApiError::invalid(None, msg),
                (FailureKind::Engine, _) => {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)
                }
                (FailureKind::Unavailable, _) => shutting_down(msg),
            }
        }
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("the request ended without {what}"),
        ),
    }
}

/// The answer to a request the scheduler cancelled at shutdown: 503, as for a request
/// that arrives after shutdown began.
pub(crate) fn shutting_down(msg: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", msg)
}

/// Collects the events of every choice and answers one JSON object.
pub(crate) async fn whole_response(
    fmt: Formatter,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let mut totals = Totals::default();
    let gathered = gather(fmt.n, rx, |i, c| {
        totals.add(i, c, &fmt);
        totals.log(&fmt);
    })
    .await;
    let Gathered { text, tokens, done } = match gathered {
        Ok(g) => g,
        Err(e) => return fmt.failed(e).into_response(),
    };
    let object = match fmt.kind {
        Kind::Chat => "chat.completion",
        Kind::Text => "text_completion",
    };
    let choices: Vec<Value> = (0..fmt.n)
        .map(|i| {
            let logprobs = if fmt.logprobs {
                fmt.logprobs_json(&tokens[i], 0)
            } else {
                Value::Null
            };
            let mut thinking = String::new();
            let mut choice = match fmt.kind {
                Kind::Chat => {
                    let (r, content, calls) = fmt.answer.parse(&text[i]);
                    thinking = r;
                    let mut message = json!({"role": "assistant", "content": content});
                    let reason = chat_finish(done[i].finish_reason, !calls.is_empty());
                    if !calls.is_empty() {
                        let calls: Vec<Value> = calls
                            .iter()
                            .enumerate()
                            .map(|(k, c)| tools::call_json(&fmt.call_ids(i), k, c))
                            .collect();
                        if content.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = Value::Array(calls);
                    }
                    json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason})
                }
                Kind::Text => json!({
                    "index": i,
                    "text": text[i],
                    "logprobs": logprobs,
                    "finish_reason": done[i].finish_reason.as_str(),
                }),
            };
            if !thinking.is_empty() {
                choice["message"]["reasoning_content"] = json!(thinking);
            }
            choice
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "id": fmt.id,
            "object": object,
            "created": fmt.created,
            "model": fmt.model,
            "system_fingerprint": "frink",
            "choices": choices,
            "usage": fmt.usage(&totals),
            "timings": {
                "first_token_ms": totals.first_token_ms,
                "gen_ms": totals.gen_ms,
                "cached_tokens": totals.cached_tokens,
            },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way a request fails reaches the client with the status its kind says: the
    /// client's own input 400 (with the code a client can act on), the engine 500, shutdown
    /// 503; and the channel closing without an event is a 500 naming what was missing.
    #[test]
    fn each_request_error_has_its_status_and_code() {
        let cases = [
            (
                RequestError::Grammar {
                    at: 3,
                    reason: "no token continues".into(),
                },
                StatusCode::BAD_REQUEST,
                Some("invalid_grammar"),
            ),
            (
                RequestError::Prompt(PromptError::Pool {
                    n: 20,
                    positions: 16,
                }),
                StatusCode::BAD_REQUEST,
                Some("context_length_exceeded"),
            ),
            (
                RequestError::Prompt(PromptError::Empty),
                StatusCode::BAD_REQUEST,
                None,
            ),
            (
                RequestError::TokenOutOfVocabulary {
                    id: 70000,
                    n_vocab: 49152,
                },
                StatusCode::BAD_REQUEST,
                None,
            ),
            (
                RequestError::Evaluation("a step failed".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
            ),
            (
                RequestError::ShuttingDown,
                StatusCode::SERVICE_UNAVAILABLE,
                None,
            ),
        ];
        for (e, status, code) in cases {
            let msg = e.to_string();
            let api = failed(Some(Event::Failed(e)), "an answer");
            assert_eq!((api.status, api.code), (status, code), "{msg}");
            assert_eq!(api.message, msg);
        }
        let none = failed(None, "an embedding");
        assert_eq!(none.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(none.message.contains("without an embedding"));
    }
}
