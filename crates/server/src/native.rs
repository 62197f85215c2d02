//! llama.cpp's native completion shape, which `POST /completion` and `POST /infill` answer
//! in (llama.cpp's `tools/server/README.md`): `content`, `stop`, `stop_type` (`eos`,
//! `word` with `stopping_word`, `limit`), `tokens_predicted`, `tokens_evaluated`,
//! `tokens_cached`, `timings`, `tokens` with `return_tokens`, `completion_probabilities`
//! with `n_probs`; streamed as `data:` lines of `{"content", "stop": false}` and a last
//! one with `stop: true` and the counts.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use frink_engine::scheduler::{Completion, Event, TokenLogprob};
use frink_engine::FinishReason;
use frink_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, json_response, ApiError};
use crate::requests::{prepare_completion, queue, Prepared};
use crate::respond::{event_stream, failed, first_event, gather, sse, OnEvent};
use crate::{AppState, Engine, St};

/// Takes `return_tokens` out of a request (the OpenAI endpoints refuse it; the native ones
/// honour it).
///
/// # Errors
/// A 400 when it is not a boolean.
pub(crate) fn take_return_tokens(obj: &mut Map<String, Value>) -> Result<bool, ApiError> {
    let v = api::opt_bool(obj, "return_tokens")?.unwrap_or(false);
    obj.remove("return_tokens");
    Ok(v)
}

/// `POST /completion`: llama.cpp's native completion (`prompt` text or token ids, every
/// sampling field), answered in its shape, streamed with `"stream": true`.
pub(crate) async fn completion(
    State(st): State<Arc<AppState>>,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    body: Bytes,
) -> Response {
    let r = st
        .offload(move |st| {
            let mut obj = api::parse_object(&body)?;
            let return_tokens = take_return_tokens(&mut obj)?;
            Ok((prepare_completion(st, &obj)?, return_tokens))
        })
        .await;
    match r {
        Ok((p, return_tokens)) => {
            answer(
                &st,
                p,
                "prompt",
                return_tokens,
                log.map(|l| l.0).unwrap_or_default(),
            )
            .await
        }
        Err(e) => e.into_response(),
    }
}

/// `stop_type` and `stopping_word` of a finished answer.
fn stop_type(c: &Completion) -> (&'static str, &str) {
    match (c.finish_reason, &c.stop_string) {
        (FinishReason::Length, _) => ("limit", ""),
        (_, Some(s)) => ("word", s.as_str()),
        _ => ("eos", ""),
    }
}

/// What every line of one answer is written with.
struct Native {
    model: String,
    tok: Arc<Tokenizer>,
    return_tokens: bool,
    probs: bool,
    /// The prompt, detokenized (llama.cpp's `prompt` field).
    prompt: String,
    log: crate::log::RequestLog,
}

impl Native {
    /// `completion_probabilities` entries of `tokens` (llama.cpp's shape with
    /// `post_sampling_probs` off: log-probabilities, the best alternatives).
    fn probs(&self, tokens: &[TokenLogprob]) -> Value {
        crate::respond::token_logprobs(&self.tok, tokens, true)
    }

    /// A streamed piece.
    fn piece(&self, text: String, tokens: &[TokenLogprob]) -> Value {
        let mut v = json!({"index": 0, "content": text, "tokens": [], "stop": false});
        if self.probs {
            v["completion_probabilities"] = self.probs(tokens);
        }
        v
    }

    /// The whole answer (`content`: all of it, or "" at the end of a stream).
    fn last(&self, content: String, c: &Completion, probs: &[TokenLogprob]) -> Value {
        self.log.finished(&self.model, c, &self.tok);
        let (stop_type, word) = stop_type(c);
        let n_gen = c.ids.len();
        let mut v = json!({
            "index": 0,
            "content": content,
            "tokens": if self.return_tokens { json!(c.ids) } else { json!([]) },
            "id_slot": -1,
            "model": self.model,
            "stop": true,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_predicted": n_gen,
            "tokens_evaluated": c.prompt_tokens,
            "tokens_cached": c.cached_tokens,
            "truncated": c.context_shifts > 0,
            "prompt": self.prompt,
            "timings": {
                "prompt_n": c.prompt_tokens - c.cached_tokens,
                "prompt_ms": c.first_token_ms,
                "cache_n": c.cached_tokens,
                "predicted_n": n_gen,
                "predicted_ms": c.gen_ms,
                "predicted_per_second": if c.gen_ms > 0.0 && n_gen > 1 {
                    (n_gen - 1) as f64 * 1e3 / c.gen_ms
                } else {
                    0.0
                },
            },
        });
        if self.probs {
            v["completion_probabilities"] = self.probs(probs);
        }
        v
    }
}

/// Queues `p` (`prompt_field` names the field of a prompt too long) and answers in
/// llama.cpp's native shape, whole or streamed as `p.opts.stream` says.
pub(crate) async fn answer(
    st: &AppState,
    mut p: Prepared,
    prompt_field: &'static str,
    return_tokens: bool,
    log: crate::log::RequestLog,
) -> Response {
    if p.opts.n > 1 {
        return ApiError::invalid(Some("n"), "llama.cpp's native endpoints answer one choice")
            .into_response();
    }
    let rx = match queue(st, &mut p, prompt_field) {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    let tok = match st.engine() {
        Ok(eng) => Arc::clone(&eng.tok),
        Err(e) => return e.into_response(),
    };
    log.set_prompt(&tok, &p.prompt);
    let n = Native {
        model: std::mem::take(&mut p.model),
        prompt: tok.decode(&p.prompt, true).unwrap_or_default(),
        tok,
        return_tokens,
        probs: p.logprobs.is_some(),
        log,
    };
    if !p.opts.stream {
        return match gather(1, rx, |_, _| {}).await {
            Ok(mut g) => {
                let (content, probs, c) = (g.text.remove(0), g.tokens.remove(0), g.done.remove(0));
                json_response(StatusCode::OK, &n.last(content, &c, &probs))
            }
            Err(e) => failed(e, "an answer").into_response(),
        };
    }
    streamed(n, rx).await
}

/// The native stream: a `data:` line per piece, the last with `stop: true`; an error as a
/// `data: {"error": …}` line. A request that fails before its first token gets its error
/// status instead.
async fn streamed(n: Native, mut rx: mpsc::UnboundedReceiver<(usize, Event)>) -> Response {
    let first = match first_event(&mut rx).await {
        Ok(e) => e,
        Err(e) => return failed(e, "an answer").into_response(),
    };
    event_stream(n, VecDeque::new(), first, rx)
}

impl OnEvent for Native {
    fn on_event(&mut self, event: Option<(usize, Event)>, out: &mut VecDeque<Bytes>) -> bool {
        match event {
            Some((_, Event::Delta { text, tokens })) => {
                if !text.is_empty() || !tokens.is_empty() {
                    out.push_back(sse(&self.piece(text, &tokens)));
                }
                false
            }
            Some((_, Event::Done(c))) => {
                out.push_back(sse(&self.last(String::new(), &c, &[])));
                true
            }
            Some((_, Event::Embedding(_))) => false,
            other => {
                let e = failed(other.map(|(_, e)| e), "an answer");
                out.push_back(sse(&e.body()));
                true
            }
        }
    }
}

/// `GET /props`: what llama.cpp's server reports about itself, for clients that read it
/// (llama.vscode, llama.cpp's web page): the slots, the context, the default sampling
/// settings, the model's file, its chat template and special tokens.
pub(crate) async fn props(State(st): State<Arc<AppState>>) -> Response {
    let r = (|| -> Result<Value, ApiError> {
        let eng = st.engine()?;
        let d = frink_engine::sampling::SamplingParams::default();
        let token = |id: Option<u32>| {
            id.and_then(|id| eng.tok.token_to_piece(id, true).ok())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        Ok(json!({
            "default_generation_settings": {
                "n_ctx": st.n_ctx,
                "params": {
                    "n_predict": -1,
                    "temperature": d.temperature,
                    "top_k": d.top_k,
                    "top_p": d.top_p,
                    "min_p": d.min_p,
                    "repeat_penalty": d.repeat_penalty,
                    "repeat_last_n": d.repeat_last_n,
                    "presence_penalty": d.presence_penalty,
                    "frequency_penalty": d.frequency_penalty,
                    "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
                },
            },
            "total_slots": st.parallel,
            "model_alias": st.model_name,
            "model_path": eng.info.path(),
            "modalities": {"vision": eng.vision.is_some(), "audio": false},
            "chat_template": st.template(eng).unwrap_or(""),
            "bos_token": token(eng.tok.bos_id()),
            "eos_token": token(eng.tok.eos_id()),
            "build_info": format!("frink {}", env!("CARGO_PKG_VERSION")),
        }))
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}
pub(crate) async fn lora_adapters(State(st): St) -> Response {
    let r = (|| Ok::<_, ApiError>(lora_json(st.engine()?)))();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

/// llama-server's `POST /lora-adapters` `[{"id", "scale"}]`: sets the default scales (the
/// adapters it does not name to 0) and answers with the new list.
pub(crate) async fn set_lora_adapters(State(st): St, body: Bytes) -> Response {
    let r = (|| {
        let eng = st.engine()?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(None, format!("the body is not JSON: {e}")))?;
        {
            let mut cur = eng.lora.lock().unwrap_or_else(|e| e.into_inner());
            let list = api::lora_list(&v, cur.len(), "lora-adapters")?;
            for (i, (_, s)) in cur.iter_mut().enumerate() {
                *s = list.iter().find(|e| e.0 == i).map_or(0.0, |e| e.1);
            }
        }
        Ok::<_, ApiError>(lora_json(eng))
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

fn lora_json(eng: &Engine) -> Value {
    let cur = eng.lora.lock().unwrap_or_else(|e| e.into_inner());
    Value::Array(
        cur.iter()
            .enumerate()
            .map(|(i, (path, scale))| json!({"id": i, "path": path, "scale": scale}))
            .collect(),
    )
}

pub(crate) async fn tokenize(State(st): St, body: Bytes) -> Response {
    let r = st
        .offload(move |st| {
            let eng = st.engine()?;
            let obj = api::parse_object(&body)?;
            let content = api::opt_str(&obj, "content")?.unwrap_or_default();
            let add_special = api::opt_bool(&obj, "add_special")?.unwrap_or(false);
            let parse_special = api::opt_bool(&obj, "parse_special")?.unwrap_or(true);
            let ids = eng
                .tok
                .encode(content, add_special, parse_special)
                .map_err(|e| ApiError::invalid(Some("content"), e.to_string()))?;
            Ok::<_, ApiError>(json!({ "tokens": ids }))
        })
        .await;
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn detokenize(State(st): St, body: Bytes) -> Response {
    let r = (|| {
        let eng = st.engine()?;
        let obj = api::parse_object(&body)?;
        let bad = || ApiError::invalid(Some("tokens"), "'tokens' must be an array of token ids");
        let ids = match obj.get("tokens") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(bad)?,
            Some(_) => return Err(bad()),
        };
        let text = eng
            .tok
            .decode(&ids, true)
            .map_err(|e| ApiError::invalid(Some("tokens"), e.to_string()))?;
        Ok(json!({ "content": text }))
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}
