//! A model-scoped request on its way to its model: the name read from the body's `model`
//! (or a GET's `?model=`), the model leased (loaded first if need be), a created model's
//! defaults written into the request, and the request passed to the model's own router.
//! The lease rides on the response's body, so a streamed answer keeps its model loaded to
//! its last byte.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::registry::Defaults;
use super::{KeepAlive, Lease};
use crate::api::ApiError;
use crate::gate::error_for_path;
use crate::{Arrival, Server};

/// The API family of a path, for the defaults a created model applies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    OllamaChat,
    OllamaGenerate,
    OpenAiChat,
    /// OpenAI's and llama.cpp's completions, `/infill`.
    Completion,
    Anthropic,
    Responses,
    /// Embeddings, tokenizer, properties: no defaults apply.
    Other,
}

fn family(path: &str) -> Family {
    match path {
        "/api/chat" => Family::OllamaChat,
        "/api/generate" => Family::OllamaGenerate,
        "/v1/chat/completions" | "/chat/completions" => Family::OpenAiChat,
        "/v1/completions" | "/completions" | "/completion" | "/infill" => Family::Completion,
        "/v1/messages" | "/v1/messages/count_tokens" => Family::Anthropic,
        "/v1/responses" => Family::Responses,
        _ => Family::Other,
    }
}

/// The route of every model-scoped endpoint (see the module documentation).
pub(crate) async fn dispatch(State(srv): State<Arc<Server>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    match route(&srv, req).await {
        Ok(r) => r,
        Err(e) => error_for_path(&path, e),
    }
}

async fn route(srv: &Arc<Server>, req: Request) -> Result<Response, ApiError> {
    let arrived = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::invalid(None, format!("cannot read the body: {e}")))?;
    // The handler reports a body that is not a JSON object; here it only has no name.
    let mut obj = serde_json::from_slice::<Map<String, Value>>(&bytes).ok();
    if obj.is_none() && !bytes.is_empty() && srv.registry.cli_source().is_none() {
        // No model to pass it to: the body's own fault is the answer.
        crate::api::parse_object(&bytes)?;
    }
    let name = match obj.as_ref().and_then(|o| o.get("model")) {
        None | Some(Value::Null) => query_model(&parts.uri),
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::invalid(
                Some("model"),
                format!("'model' must be a string, got {v}"),
            ))
        }
    };
    let keep = match obj.as_ref().and_then(|o| o.get("keep_alive")) {
        Some(v) if !v.is_null() && path.starts_with("/api/") => {
            Some(KeepAlive::parse(v).map_err(|m| ApiError::invalid(Some("keep_alive"), m))?)
        }
        _ => None,
    };
    let fam = family(&path);
    if keep == Some(KeepAlive::For(std::time::Duration::ZERO))
        && obj.as_ref().is_some_and(|o| only_loads(o, fam))
    {
        return unload(srv, name.as_deref(), fam);
    }
    let source = srv.registry.resolve(name.as_deref())?;
    let was_loaded = srv.models.is_loaded(&source.key());
    let waited = std::time::Instant::now();
    let lease = srv.models.acquire(&source, keep).await?;
    let mut parts = parts;
    parts.extensions.insert(Arrival {
        at: arrived,
        load: if was_loaded {
            std::time::Duration::ZERO
        } else {
            waited.elapsed()
        },
    });
    let bytes = match (&source.defaults, obj.as_mut()) {
        (Some(d), Some(o)) if fam != Family::Other => {
            apply(d, fam, o)?;
            Bytes::from(serde_json::to_vec(o).unwrap_or_default())
        }
        _ => bytes,
    };
    let mut router = lease.loaded.router.clone();
    let req = Request::from_parts(parts, Body::from(bytes));
    let response = tower_service::Service::call(&mut router, req)
        .await
        .unwrap_or_else(|e| match e {});
    Ok(response.map(|body| {
        Body::new(Leased {
            body,
            _lease: lease,
        })
    }))
}

/// `?model=NAME` of a request's query string (percent-decoded; none in a malformed one).
fn query_model(uri: &axum::http::Uri) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Query {
        model: Option<String>,
    }
    axum::extract::Query::<Query>::try_from_uri(uri)
        .ok()?
        .0
        .model
}

/// Whether an Ollama request only loads or unloads its model: a generate without a
/// prompt, a chat without messages (Ollama's `docs/api.md`, "Load a model").
fn only_loads(obj: &Map<String, Value>, fam: Family) -> bool {
    match fam {
        Family::OllamaGenerate => obj
            .get("prompt")
            .is_none_or(|p| p.as_str().is_some_and(str::is_empty) || p.is_null()),
        Family::OllamaChat => obj
            .get("messages")
            .is_none_or(|m| m.is_null() || m.as_array().is_some_and(Vec::is_empty)),
        _ => false,
    }
}

/// Ollama's unload request (`keep_alive: 0`, nothing to answer): the model goes now if it
/// is loaded and idle, or when its last request ends.
fn unload(srv: &Server, name: Option<&str>, fam: Family) -> Result<Response, ApiError> {
    let source = srv.registry.resolve(name)?;
    // Busy: it is marked to go when its requests end, which is what was asked.
    let _ = srv.models.unload_now(&source.key(), true);
    let shape = match fam {
        Family::OllamaChat => crate::ollama::Shape::Chat,
        _ => crate::ollama::Shape::Generate,
    };
    Ok(crate::ollama::no_work(
        name.unwrap_or(&source.name),
        shape,
        "unload",
    ))
}

/// Writes a created model's defaults into a request of family `fam`: its system prompt
/// where the request has none, its messages before the request's (chat), its parameters
/// where the request sets none (as Ollama options, or the family's own fields).
///
/// Errors: a 400 if the request's `options` or `messages` are malformed.
fn apply(d: &Defaults, fam: Family, obj: &mut Map<String, Value>) -> Result<(), ApiError> {
    match fam {
        Family::OllamaChat | Family::OpenAiChat => {
            let mut msgs = match obj.remove("messages") {
                Some(Value::Array(a)) => a,
                None | Some(Value::Null) => Vec::new(),
                Some(v) => {
                    obj.insert("messages".into(), v);
                    return Ok(());
                }
            };
            // The request's own leading system messages, else the created model's; then
            // its conversation, then the request's.
            let lead = msgs
                .iter()
                .take_while(|m| m["role"] == "system" || m["role"] == "developer")
                .count();
            let rest = msgs.split_off(lead);
            if let (0, Some(s)) = (lead, &d.system) {
                msgs.push(json!({"role": "system", "content": s}));
            }
            msgs.extend(d.messages.iter().cloned());
            msgs.extend(rest);
            obj.insert("messages".into(), Value::Array(msgs));
        }
        Family::OllamaGenerate => {
            if let Some(s) = &d.system {
                let empty = obj.get("system").is_none_or(|v| v.is_null() || v == "");
                if empty {
                    obj.insert("system".into(), json!(s));
                }
            }
        }
        Family::Anthropic => {
            if let (Some(s), true) = (&d.system, unset(obj, "system")) {
                obj.insert("system".into(), json!(s));
            }
        }
        Family::Responses => {
            // A system or developer item of the input is the request's own system prompt.
            let own = obj["input"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|i| i["role"] == "system" || i["role"] == "developer")
            });
            if let (Some(s), true, false) = (&d.system, unset(obj, "instructions"), own) {
                obj.insert("instructions".into(), json!(s));
            }
        }
        Family::Completion | Family::Other => {}
    }
    if d.parameters.is_empty() {
        return Ok(());
    }
    if matches!(fam, Family::OllamaChat | Family::OllamaGenerate) {
        let opts = obj.entry("options").or_insert_with(|| json!({}));
        if opts.is_null() {
            *opts = json!({});
        }
        if let Some(o) = opts.as_object_mut() {
            for (k, v) in &d.parameters {
                if unset(o, k) {
                    o.insert(k.clone(), v.clone());
                }
            }
        }
        return Ok(());
    }
    // The same reading of Ollama's option names as Ollama's own endpoints.
    let mut fields = Map::new();
    let mut wrapped = Map::new();
    wrapped.insert("options".into(), Value::Object(d.parameters.clone()));
    crate::ollama::options(&wrapped, &mut fields)?;
    for (k, v) in fields {
        let k = match (fam, k.as_str()) {
            (Family::Anthropic, "stop") => "stop_sequences".to_string(),
            (Family::Responses, "max_tokens") => "max_output_tokens".to_string(),
            (
                Family::Anthropic | Family::Responses,
                "temperature" | "top_p" | "top_k" | "max_tokens" | "stop_sequences"
                | "max_output_tokens",
            ) => k,
            (Family::Anthropic | Family::Responses, _) => continue,
            _ => k,
        };
        if unset(obj, &k) {
            obj.insert(k, v);
        }
    }
    Ok(())
}

/// Whether the request leaves field `k` to the defaults (absent or null).
fn unset(obj: &Map<String, Value>, k: &str) -> bool {
    obj.get(k).is_none_or(Value::is_null)
}

/// A response body holding its model's lease until it ends or is dropped.
struct Leased {
    body: Body,
    _lease: Lease,
}

impl http_body::Body for Leased {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_the_request_leaves_open() {
        let mut params = Map::new();
        params.insert("temperature".into(), json!(0));
        params.insert("num_predict".into(), json!(7));
        params.insert("stop".into(), json!(["\n"]));
        let d = Defaults {
            system: Some("S".into()),
            parameters: params,
            messages: vec![json!({"role": "user", "content": "earlier"})],
            license: vec![],
        };
        let mut chat = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 1})
            .as_object()
            .cloned()
            .unwrap();
        apply(&d, Family::OpenAiChat, &mut chat).unwrap();
        assert_eq!(
            chat["messages"][0],
            json!({"role": "system", "content": "S"})
        );
        assert_eq!(chat["messages"][1]["content"], "earlier");
        assert_eq!(chat["messages"][2]["content"], "hi");
        assert_eq!(chat["temperature"], 1, "the request's own value stays");
        assert_eq!(chat["max_tokens"], 7);
        let mut own_system = json!({"messages": [{"role": "system", "content": "mine"}]})
            .as_object()
            .cloned()
            .unwrap();
        apply(&d, Family::OllamaChat, &mut own_system).unwrap();
        assert_eq!(own_system["messages"][0]["content"], "mine");
        assert_eq!(own_system["options"]["temperature"], 0);
        let mut msg = json!({"max_tokens": 3}).as_object().cloned().unwrap();
        apply(&d, Family::Anthropic, &mut msg).unwrap();
        assert_eq!(msg["system"], "S");
        assert_eq!(msg["max_tokens"], 3);
        assert_eq!(msg["stop_sequences"], json!(["\n"]));
        // A null is no value: the default applies.
        let mut nulls = json!({"max_tokens": null, "system": null})
            .as_object()
            .cloned()
            .unwrap();
        apply(&d, Family::Anthropic, &mut nulls).unwrap();
        assert_eq!(
            (nulls["max_tokens"].clone(), nulls["system"].clone()),
            (json!(7), json!("S"))
        );
        // A Responses input with its own system item keeps it alone.
        let mut own = json!({"input": [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]})
            .as_object()
            .cloned()
            .unwrap();
        apply(&d, Family::Responses, &mut own).unwrap();
        assert!(own.get("instructions").is_none(), "{own:?}");
        let mut plain = json!({"input": "hi"}).as_object().cloned().unwrap();
        apply(&d, Family::Responses, &mut plain).unwrap();
        assert_eq!(plain["instructions"], "S");
    }

    #[test]
    fn query_names_are_decoded() {
        let q = |u: &str| query_model(&u.parse().unwrap());
        assert_eq!(
            q("/props?a=1&model=hf%3Aorg%2Fr").as_deref(),
            Some("hf:org/r")
        );
        assert_eq!(
            q("/props?model=..%2F..%2Fetc").as_deref(),
            Some("../../etc")
        );
        assert_eq!(q("/props?x=1"), None);
        assert_eq!(q("/props"), None);
    }
}
