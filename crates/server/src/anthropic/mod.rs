//! Anthropic's Messages API on the same server and port (Anthropic's API reference,
//! "Messages"; the shapes as the official `anthropic` Python SDK declares them):
//! `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is read into the OpenAI chat request it means ([`request::translate`]) and
//! goes through the same preparation (template, tools, grammar, sampling) and scheduler as
//! `/v1/chat/completions`, so the same conversation gives the same greedy answer. The
//! answer is a list of content blocks (`thinking`, `text`, `tool_use`) with a
//! `stop_reason`, whole or streamed as Anthropic's named server-sent events. Errors are
//! `{"type": "error", "error": {"type", "message"}}`; the key may come as `x-api-key`
//! (the gate reads it) and `anthropic-version` is accepted whatever its value.

mod request;

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use frink_engine::scheduler::{Completion, Event};
use frink_engine::FinishReason;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, json_response, ApiError};
use crate::reasoning::Part;
use crate::requests::{prepare_chat_with, queue, Prepared};
use crate::respond::{event_stream, failed, first_event, gather, OnEvent};
use crate::tools::ToolCall;
use crate::{AppState, St};

/// Anthropic's error `type` for an HTTP status (its "Errors" page).
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `e`'s body in Anthropic's shape.
fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// An error in Anthropic's shape, with `e`'s status.
pub(crate) fn error(e: ApiError) -> Response {
    json_response(e.status, &error_body(&e))
}

/// Reads and prepares a request off the HTTP threads: (the prepared request, whether it
/// streams).
async fn prepare(
    st: &Arc<AppState>,
    body: Bytes,
    count_only: bool,
) -> Result<(Prepared, bool), ApiError> {
    st.offload(move |st| {
        let obj = api::parse_object(&body)?;
        let t = request::translate(&obj, count_only)?;
        check_thinking(st, &t.chat)?;
        let p = prepare_chat_with(st, &t.chat, t.prefill.as_deref())
            .map_err(|e| e.renamed(request::CHAT_NAMES))?;
        Ok((p, t.stream))
    })
    .await
}

/// Refuses thinking (`thinking.type` `enabled` or `adaptive`) on a model whose template
/// has none, as Ollama's `think` is refused: the template would ignore it. (An
/// `output_config.effort` is checked as OpenAI's `reasoning_effort` is.)
fn check_thinking(st: &AppState, chat: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let kwargs = &chat.get("chat_template_kwargs");
    let template = st.template(st.engine()?).unwrap_or("");
    if kwargs.and_then(|k| k.get("enable_thinking")) == Some(&json!(true))
        && !crate::reasoning::thinks(template)
    {
        return Err(ApiError::invalid(
            Some("thinking"),
            "'thinking': this model's chat template has no thinking",
        ));
    }
    Ok(())
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt's length as
/// `/v1/messages` would run it (system, messages and tools through the template).
pub(crate) async fn count_tokens(State(st): St, body: Bytes) -> Response {
    match prepare(&st, body, true).await {
        Ok((p, _)) => json_response(StatusCode::OK, &json!({"input_tokens": p.prompt.len()})),
        Err(e) => error(e),
    }
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(st): St,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    body: Bytes,
) -> Response {
    let (mut p, stream) = match prepare(&st, body, false).await {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let rx = match queue(&st, &mut p, "messages") {
        Ok(rx) => rx,
        Err(e) => return error(e),
    };
    let tok = match st.engine() {
        Ok(eng) => Arc::clone(&eng.tok),
        Err(e) => return error(e),
    };
    let log = log.map(|l| l.0).unwrap_or_default();
    log.set_prompt(&tok, &p.prompt);
    let reply = Reply {
        id: st.next_id("msg"),
        model: std::mem::take(&mut p.model),
        input_tokens: p.prompt.len(),
        log,
        tok,
    };
    let format = std::mem::take(&mut p.answer);
    if stream {
        streamed(reply, format.stream(), rx).await
    } else {
        whole(reply, &format, rx).await
    }
}

/// What every reply carries.
struct Reply {
    id: String,
    model: String,
    input_tokens: usize,
    log: crate::log::RequestLog,
    tok: Arc<frink_tokenizer::Tokenizer>,
}

impl Reply {
    /// `stop_reason` and `stop_sequence` of a finished answer (Anthropic's four reasons).
    fn stop(&self, c: &Completion, has_calls: bool) -> (&'static str, Value) {
        match (c.finish_reason, &c.stop_string) {
            (FinishReason::Length, _) => ("max_tokens", Value::Null),
            (_, Some(s)) => ("stop_sequence", json!(s)),
            _ if has_calls => ("tool_use", Value::Null),
            _ => ("end_turn", Value::Null),
        }
    }

    /// Usage: prompt tokens reused from the cache are `cache_read_input_tokens`, the rest
    /// `input_tokens` (Anthropic counts them apart; their sum is the prompt).
    fn usage(&self, c: Option<&Completion>) -> Value {
        let cached = c.map_or(0, |c| c.cached_tokens);
        json!({
            "input_tokens": self.input_tokens - cached.min(self.input_tokens),
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": c.map_or(0, |c| c.ids.len()),
        })
    }

    /// The message object, with `content` and, once finished, its stop and usage.
    fn message(&self, content: Vec<Value>, done: Option<(&Completion, bool)>) -> Value {
        let (reason, seq) = match done {
            Some((c, calls)) => {
                let (r, s) = self.stop(c, calls);
                (json!(r), s)
            }
            None => (Value::Null, Value::Null),
        };
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": self.usage(done.map(|d| d.0)),
        })
    }
}

/// A `tool_use` block of call `k` of message `msg_id` (its input `{}` when streamed: the
/// input follows as JSON deltas).
fn tool_use(msg_id: &str, k: usize, c: &ToolCall, input: bool) -> Value {
    let args: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
    json!({"type": "tool_use", "id": format!("toolu_{}_{k}", msg_id.trim_start_matches("msg-")),
           "name": c.name, "input": if input { args } else { json!({}) }})
}

/// The answer as one message.
async fn whole(
    reply: Reply,
    format: &crate::answer::AnswerFormat,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let mut g = match gather(1, rx, |_, _| {}).await {
        Ok(g) => g,
        Err(e) => return error(failed(e, "an answer")),
    };
    let c = g.done.remove(0);
    let (thinking, content, calls) = format.parse(&g.text[0]);
    let mut blocks = Vec::new();
    if !thinking.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !content.is_empty() {
        blocks.push(json!({"type": "text", "text": content}));
    }
    for (k, call) in calls.iter().enumerate() {
        blocks.push(tool_use(&reply.id, k, call, true));
    }
    reply.log.finished(&reply.model, &c, &reply.tok);
    let v = reply.message(blocks, Some((&c, !calls.is_empty())));
    json_response(StatusCode::OK, &v)
}

/// One named server-sent event.
fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// The kind of the content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// The streamed answer's blocks: parts of the answer become `content_block_start`,
/// `content_block_delta` and `content_block_stop` events, a block per run of one kind.
struct Blocks {
    /// The message's id (its calls' ids derive from it).
    id: String,
    open: Option<Open>,
    /// The index of the next block.
    next: usize,
    calls: usize,
    out: VecDeque<Bytes>,
}

impl Blocks {
    fn close(&mut self) {
        if let Some(kind) = self.open.take() {
            let index = self.next - 1;
            if kind == Open::Thinking {
                let d = json!({"type": "signature_delta", "signature": ""});
                self.out.push_back(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": d}),
                ));
            }
            self.out.push_back(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn start(&mut self, block: Value) -> usize {
        let index = self.next;
        self.next += 1;
        self.out.push_back(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    fn delta(&mut self, index: usize, delta: Value) {
        self.out.push_back(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    /// Text of `kind`, in the open block if it is of that kind, else in a new one.
    fn text(&mut self, kind: Open, t: String) {
        if t.is_empty() {
            return;
        }
        if self.open != Some(kind) {
            self.close();
            let block = match kind {
                Open::Text => json!({"type": "text", "text": ""}),
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            self.start(block);
            self.open = Some(kind);
        }
        let delta = match kind {
            Open::Text => json!({"type": "text_delta", "text": t}),
            Open::Thinking => json!({"type": "thinking_delta", "thinking": t}),
        };
        self.delta(self.next - 1, delta);
    }

    fn parts(&mut self, parts: Vec<Part>) {
        for part in parts {
            match part {
                Part::Reasoning(t) => self.text(Open::Thinking, t),
                Part::Content(t) => self.text(Open::Text, t),
                Part::Call(c) => {
                    self.close();
                    let index = self.start(tool_use(&self.id, self.calls, &c, false));
                    self.calls += 1;
                    self.delta(
                        index,
                        json!({"type": "input_json_delta", "partial_json": c.arguments}),
                    );
                    self.out.push_back(event(
                        "content_block_stop",
                        &json!({"type": "content_block_stop", "index": index}),
                    ));
                }
            }
        }
    }

    /// The end: the open block closed, `message_delta` (stop reason, usage) and
    /// `message_stop`.
    fn finish(&mut self, reply: &Reply, c: &Completion) {
        self.close();
        let (reason, seq) = reply.stop(c, self.calls > 0);
        reply.log.finished(&reply.model, c, &reply.tok);
        self.out.push_back(event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": reply.usage(Some(c))}),
        ));
        self.out
            .push_back(event("message_stop", &json!({"type": "message_stop"})));
    }
}

/// The answer as Anthropic's event stream: `message_start`, a `ping`, the blocks,
/// `message_delta`, `message_stop`; a failure after the start is an `error` event. A
/// request that fails before its first token gets its error status instead.
async fn streamed(
    reply: Reply,
    reader: crate::answer::AnswerStream,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let first = match first_event(&mut rx).await {
        Ok(e) => e,
        Err(e) => return error(failed(e, "an answer")),
    };
    let mut out = VecDeque::new();
    out.push_back(event(
        "message_start",
        &json!({"type": "message_start", "message": reply.message(Vec::new(), None)}),
    ));
    out.push_back(event("ping", &json!({"type": "ping"})));
    let state = Streamed {
        blocks: Blocks {
            id: reply.id.clone(),
            open: None,
            next: 0,
            calls: 0,
            out: VecDeque::new(),
        },
        reply,
        reader: Some(reader),
    };
    event_stream(state, out, first, rx)
}

/// A streamed answer's state ([`streamed`]).
struct Streamed {
    reply: Reply,
    blocks: Blocks,
    reader: Option<crate::answer::AnswerStream>,
}

impl OnEvent for Streamed {
    fn on_event(&mut self, ev: Option<(usize, Event)>, out: &mut VecDeque<Bytes>) -> bool {
        let done = match ev {
            Some((_, Event::Delta { text, .. })) => {
                let parts = self
                    .reader
                    .as_mut()
                    .map(|r| r.push(&text))
                    .unwrap_or_default();
                self.blocks.parts(parts);
                false
            }
            Some((_, Event::Done(c))) => {
                let parts = self.reader.take().map(|r| r.finish()).unwrap_or_default();
                self.blocks.parts(parts);
                self.blocks.finish(&self.reply, &c);
                true
            }
            Some((_, Event::Embedding(_))) => false,
            other => {
                let e = failed(other.map(|(_, e)| e), "an answer");
                self.blocks.out.push_back(event("error", &error_body(&e)));
                true
            }
        };
        out.extend(self.blocks.out.drain(..));
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thinking, text, two calls, text again: a block per run, each opened, filled and
    /// closed in order, with increasing indexes; thinking closes with its signature.
    #[test]
    fn parts_become_blocks_in_order() {
        let mut b = Blocks {
            id: "msg-7".into(),
            open: None,
            next: 0,
            calls: 0,
            out: VecDeque::new(),
        };
        let call = |n: &str| {
            Part::Call(ToolCall {
                name: n.into(),
                arguments: "{\"a\":1}".into(),
            })
        };
        b.parts(vec![
            Part::Reasoning("hm".into()),
            Part::Reasoning(" ok".into()),
            Part::Content("Sure.".into()),
            Part::Content(String::new()),
            call("f"),
            call("g"),
            Part::Content("Done.".into()),
        ]);
        b.close();
        let events: Vec<(String, Value)> = b
            .out
            .iter()
            .map(|e| {
                let t = std::str::from_utf8(e).unwrap();
                let (name, data) = t.trim_end().split_once('\n').unwrap();
                let data = data.strip_prefix("data: ").unwrap();
                (
                    name.strip_prefix("event: ").unwrap().to_string(),
                    serde_json::from_str(data).unwrap(),
                )
            })
            .collect();
        let shape: Vec<String> = events
            .iter()
            .map(|(n, v)| {
                let kind = v["content_block"]["type"]
                    .as_str()
                    .or(v["delta"]["type"].as_str())
                    .unwrap_or("");
                format!("{n}:{}:{kind}", v["index"])
            })
            .collect();
        assert_eq!(
            shape,
            [
                "content_block_start:0:thinking",
                "content_block_delta:0:thinking_delta",
                "content_block_delta:0:thinking_delta",
                "content_block_delta:0:signature_delta",
                "content_block_stop:0:",
                "content_block_start:1:text",
                "content_block_delta:1:text_delta",
                "content_block_stop:1:",
                "content_block_start:2:tool_use",
                "content_block_delta:2:input_json_delta",
                "content_block_stop:2:",
                "content_block_start:3:tool_use",
                "content_block_delta:3:input_json_delta",
                "content_block_stop:3:",
                "content_block_start:4:text",
                "content_block_delta:4:text_delta",
                "content_block_stop:4:",
            ]
        );
        assert_eq!(events[8].1["content_block"]["id"], "toolu_7_0");
        assert_eq!(events[11].1["content_block"]["id"], "toolu_7_1");
        assert_eq!(events[9].1["delta"]["partial_json"], "{\"a\":1}");
    }
}
