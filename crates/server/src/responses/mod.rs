//! OpenAI's Responses API on the same server and port (OpenAI's API reference,
//! "Responses"; shapes as the official `openai` Python package declares them):
//! `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`.
//!
//! A request is read into the chat request it means ([`request::translate`]) and runs
//! through the same preparation and scheduler as `/v1/chat/completions`. The answer's
//! parts become output items ([`output::Items`]), whole or streamed as `response.*`
//! events. Stored responses (`store`, the default) are kept in memory ([`Store`]: bounded
//! in count and bytes, oldest dropped first, each for a day at most) with their
//! conversation, so `previous_response_id` continues it; an unknown id is a 404.

mod output;
mod request;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use frink_engine::scheduler::{Completion, Event};
use frink_engine::FinishReason;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, json_response, ApiError};
use crate::requests::{prepare_chat, queue};
use crate::respond::{event_stream, failed, first_event, gather, OnEvent};
use crate::{unix_now, AppState, St};

/// The most responses kept.
const MAX_STORED: usize = 1024;
/// The most bytes stored responses and conversations hold in memory ([`held_bytes`]).
const MAX_STORED_BYTES: usize = 64 << 20;
/// How long a stored response is kept.
const EXPIRY: Duration = Duration::from_secs(24 * 3600);

/// What `v` holds in memory, estimated from above: every JSON node as a whole
/// `serde_json::Value` (its text can be 2 bytes: `0,`), strings and keys by their length.
fn held_bytes(v: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>() + 16;
    NODE + match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(held_bytes).sum(),
        Value::Object(o) => o.iter().map(|(k, v)| k.len() + NODE + held_bytes(v)).sum(),
        _ => 0,
    }
}

/// A stored response and the conversation that continues from it.
struct Stored {
    response: Value,
    conversation: Vec<Value>,
    bytes: usize,
    at: Instant,
}

/// The stored responses, by id.
#[derive(Default)]
pub(crate) struct Store {
    inner: Mutex<(HashMap<String, Stored>, VecDeque<String>, usize)>,
}

impl Store {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, (HashMap<String, Stored>, VecDeque<String>, usize)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `response` and its conversation, dropping the oldest (and the expired) to
    /// stay within the bounds; one larger than all of them is not kept (returns false).
    fn put(&self, id: String, response: Value, conversation: Vec<Value>) -> bool {
        let bytes = held_bytes(&response) + conversation.iter().map(held_bytes).sum::<usize>();
        if bytes > MAX_STORED_BYTES {
            return false;
        }
        let mut g = self.lock();
        let (map, order, total) = &mut *g;
        while map.len() >= MAX_STORED
            || *total + bytes > MAX_STORED_BYTES
            || order
                .front()
                .is_some_and(|o| map.get(o).is_none_or(|s| s.at.elapsed() > EXPIRY))
        {
            let Some(old) = order.pop_front() else { break };
            if let Some(s) = map.remove(&old) {
                *total -= s.bytes;
            }
        }
        *total += bytes;
        order.push_back(id.clone());
        map.insert(
            id,
            Stored {
                response,
                conversation,
                bytes,
                at: Instant::now(),
            },
        );
        true
    }

    /// A stored response and its conversation, unless unknown or expired.
    fn get(&self, id: &str) -> Option<(Value, Vec<Value>)> {
        let g = self.lock();
        g.0.get(id)
            .filter(|s| s.at.elapsed() <= EXPIRY)
            .map(|s| (s.response.clone(), s.conversation.clone()))
    }

    fn remove(&self, id: &str) -> bool {
        let mut g = self.lock();
        let (map, _, total) = &mut *g;
        match map.remove(id) {
            Some(s) => {
                *total -= s.bytes;
                true
            }
            None => false,
        }
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no stored response with id '{id}' (responses are kept in memory, at most {MAX_STORED}, for a day)"),
    )
}

/// One answer being made: what its response object echoes and where it is stored.
struct Reply {
    st: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    asked: request::Asked,
    tok: Arc<frink_tokenizer::Tokenizer>,
    log: crate::log::RequestLog,
}

impl Reply {
    /// The response object with `output`, `status` and, once finished, usage.
    fn object(&self, status: &str, output: &[Value], c: Option<&Completion>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "error": null,
            "incomplete_details": null,
            "instructions": null,
            "max_output_tokens": null,
            "previous_response_id": null,
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "reasoning": {"effort": null, "summary": null},
            "truncation": "disabled",
            "store": self.asked.store,
            "metadata": {},
        });
        for (k, e) in &self.asked.echo {
            v[k] = e.clone();
        }
        if status == "incomplete" {
            v["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        if let Some(c) = c {
            let reasoning: usize = output
                .iter()
                .filter(|i| i["type"] == "reasoning")
                .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
                .map(|p| {
                    self.tok
                        .encode(p["text"].as_str().unwrap_or(""), false, false)
                        .map_or(0, |t| t.len())
                })
                .sum();
            v["usage"] = json!({
                "input_tokens": c.prompt_tokens,
                "input_tokens_details": {"cached_tokens": c.cached_tokens},
                "output_tokens": c.ids.len(),
                "output_tokens_details": {"reasoning_tokens": reasoning.min(c.ids.len())},
                "total_tokens": c.prompt_tokens + c.ids.len(),
            });
        }
        v
    }

    /// The finished response: its object, stored when asked.
    fn finish(&self, output: &[Value], c: &Completion) -> Value {
        self.log.finished(&self.model, c, &self.tok);
        let status = match c.finish_reason {
            FinishReason::Length => "incomplete",
            FinishReason::Stop => "completed",
        };
        let v = self.object(status, output, Some(c));
        if self.asked.store {
            let mut conversation = self.asked.conversation.clone();
            conversation.extend(output::as_messages(output));
            if !self
                .st
                .shared
                .responses
                .put(self.id.clone(), v.clone(), conversation)
            {
                tracing::warn!("response {} is larger than the store; not kept", self.id);
            }
        }
        v
    }
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(st): St,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    body: Bytes,
) -> Response {
    let r = st
        .offload(move |st| {
            let obj = api::parse_object(&body)?;
            let previous = match api::opt_str(&obj, "previous_response_id")? {
                Some(id) if !id.is_empty() => {
                    Some(st.shared.responses.get(id).ok_or_else(|| not_found(id))?.1)
                }
                _ => None,
            };
            let asked = request::translate(&obj, previous)?;
            let p = prepare_chat(st, &asked.chat).map_err(|e| e.renamed(request::CHAT_NAMES))?;
            Ok((p, asked))
        })
        .await;
    let (mut p, asked) = match r {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let rx = match queue(&st, &mut p, "input") {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    let tok = match st.engine() {
        Ok(eng) => Arc::clone(&eng.tok),
        Err(e) => return e.into_response(),
    };
    let log = log.map(|l| l.0).unwrap_or_default();
    log.set_prompt(&tok, &p.prompt);
    let stream = asked.stream;
    let items = output::Items::new(stream, asked.encrypted_reasoning);
    let reply = Reply {
        st: Arc::clone(&st),
        id: output::new_id("resp"),
        created: unix_now(),
        model: std::mem::take(&mut p.model),
        asked,
        tok,
        log,
    };
    let reader = std::mem::take(&mut p.answer).stream();
    if stream {
        streamed(reply, items, reader, rx).await
    } else {
        whole(reply, items, reader, rx).await
    }
}

async fn whole(
    reply: Reply,
    mut items: output::Items,
    mut reader: crate::answer::AnswerStream,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let mut g = match gather(1, rx, |_, _| {}).await {
        Ok(g) => g,
        Err(e) => return failed(e, "an answer").into_response(),
    };
    items.parts(reader.push(&g.text[0]));
    items.parts(reader.finish());
    items.close();
    json_response(
        StatusCode::OK,
        &reply.finish(&items.done, &g.done.remove(0)),
    )
}

/// One `event:`/`data:` pair with the stream's sequence number.
fn event(ty: &str, mut payload: Value, seq: &mut u64) -> Bytes {
    payload["type"] = json!(ty);
    payload["sequence_number"] = json!(*seq);
    *seq += 1;
    Bytes::from(format!("event: {ty}\ndata: {payload}\n\n"))
}

/// The answer as `response.*` events: `response.created`, `response.in_progress`, the
/// items' events, `response.completed` (or `response.incomplete`); a failure after the
/// start is `response.failed`. A request that fails before its first token gets its error
/// status instead.
async fn streamed(
    reply: Reply,
    items: output::Items,
    reader: crate::answer::AnswerStream,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let first = match first_event(&mut rx).await {
        Ok(e) => e,
        Err(e) => return failed(e, "an answer").into_response(),
    };
    let mut seq = 0;
    let mut out = VecDeque::new();
    let start = reply.object("in_progress", &[], None);
    out.push_back(event(
        "response.created",
        json!({"response": start}),
        &mut seq,
    ));
    out.push_back(event(
        "response.in_progress",
        json!({"response": start}),
        &mut seq,
    ));
    let state = Streamed {
        reply,
        items,
        reader: Some(reader),
        seq,
    };
    event_stream(state, out, first, rx)
}

/// A streamed answer's state ([`streamed`]).
struct Streamed {
    reply: Reply,
    items: output::Items,
    reader: Option<crate::answer::AnswerStream>,
    /// The next event's sequence number.
    seq: u64,
}

impl Streamed {
    fn flush(&mut self, out: &mut VecDeque<Bytes>) {
        for (ty, payload) in self.items.take_events() {
            out.push_back(event(&ty, payload, &mut self.seq));
        }
    }
}

impl OnEvent for Streamed {
    fn on_event(&mut self, ev: Option<(usize, Event)>, out: &mut VecDeque<Bytes>) -> bool {
        match ev {
            Some((_, Event::Delta { text, .. })) => {
                let parts = self
                    .reader
                    .as_mut()
                    .map(|r| r.push(&text))
                    .unwrap_or_default();
                self.items.parts(parts);
                self.flush(out);
                false
            }
            Some((_, Event::Done(c))) => {
                let parts = self.reader.take().map(|r| r.finish()).unwrap_or_default();
                self.items.parts(parts);
                self.items.close();
                self.flush(out);
                let v = self.reply.finish(&self.items.done, &c);
                let ty = if v["status"] == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                out.push_back(event(ty, json!({"response": v}), &mut self.seq));
                true
            }
            Some((_, Event::Embedding(_))) => false,
            other => {
                let e = failed(other.map(|(_, e)| e), "an answer");
                let mut v = self.reply.object("failed", &self.items.done, None);
                v["error"] =
                    json!({"code": e.code.unwrap_or("server_error"), "message": e.message});
                out.push_back(event(
                    "response.failed",
                    json!({"response": v}),
                    &mut self.seq,
                ));
                true
            }
        }
    }
}

/// `GET /v1/responses/{id}`: a stored response.
pub(crate) async fn retrieve(
    State(st): State<Arc<crate::Server>>,
    Path(id): Path<String>,
) -> Response {
    match st.shared.responses.get(&id) {
        Some((v, _)) => json_response(StatusCode::OK, &v),
        None => not_found(&id).into_response(),
    }
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    State(st): State<Arc<crate::Server>>,
    Path(id): Path<String>,
) -> Response {
    if st.shared.responses.remove(&id) {
        json_response(
            StatusCode::OK,
            &json!({"id": id, "object": "response", "deleted": true}),
        )
    } else {
        not_found(&id).into_response()
    }
}

/// `POST /v1/responses/{id}/cancel`: only a background response can be cancelled, and
/// frink runs none (a streamed one is cancelled by closing its connection), so a stored
/// response is a 400 saying it has finished.
pub(crate) async fn cancel(
    State(st): State<Arc<crate::Server>>,
    Path(id): Path<String>,
) -> Response {
    match st.shared.responses.get(&id) {
        Some(_) => ApiError::invalid(
            None,
            format!("response '{id}' has finished; only background responses can be cancelled, and frink runs none"),
        )
        .into_response(),
        None => not_found(&id).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored value is counted by what it holds, not by its text: a million `0,` (2 MB
    /// of text) count as tens of megabytes (here 200,000: several megabytes each), so a few fill the store, and the oldest go.
    #[test]
    fn the_store_counts_memory_and_drops_the_oldest() {
        let big = json!({"k": vec![0; 200_000]});
        assert!(held_bytes(&big) >= 200_000 * std::mem::size_of::<Value>());
        let store = Store::default();
        for i in 0..8 {
            store.put(format!("r{i}"), big.clone(), Vec::new());
        }
        let g = store.lock();
        assert!(g.2 <= MAX_STORED_BYTES, "{}", g.2);
        assert!(g.0.len() < 8 && g.0.contains_key("r7") && !g.0.contains_key("r0"));
    }
}
