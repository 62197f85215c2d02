//! Ollama's native API on the same server and port (Ollama's `docs/api.md`; request and
//! response types as the official `ollama` Python client declares them, `ollama/_types.py`):
//! `POST /api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`, `/api/show`,
//! `/api/pull`; `GET /api/tags`, `/api/ps`, `/api/version`. Errors are `{"error": "…"}`.
//!
//! A chat or generate request is translated into the OpenAI request it means and goes
//! through the same preparation (template, tools, grammar, sampling) and scheduler as
//! `/v1/chat/completions`, so the same messages give the same greedy answer; only the
//! shapes differ: NDJSON lines (streaming is Ollama's default), `message.thinking`,
//! `tool_calls` with `arguments` as an object, durations in nanoseconds.
//!
//! The `model` field chose the model before the request got here ([`crate::models`]);
//! the model endpoints (`/api/tags`, `/api/ps`, `/api/show`, `/api/create`, …) are in
//! [`crate::models::manage`].

use std::collections::VecDeque;
use std::time::Instant;

use axum::body::Body;
use axum::http::header;

use super::*;
use crate::embeddings::{check_dimensions, embed_inputs, embedding_inputs};
use crate::requests::{model_field, prepare_chat, prepare_completion, queue, Prepared};
use crate::respond::{answer_stream, failed, first_event, gather, OnEvent};
use crate::Arrival;

/// When the request arrived and how long it waited for its model to load (a request
/// that did not pass through the dispatcher: now, none).
fn arrival(a: Option<axum::Extension<Arrival>>) -> Arrival {
    a.map_or(
        Arrival {
            at: Instant::now(),
            load: std::time::Duration::ZERO,
        },
        |e| e.0,
    )
}

/// What `/api/tags`, `/api/show` and `/api/ps` report about the loaded model, read from
/// its file once at load.
pub struct ModelInfo {
    pub(crate) digest: Option<String>,
    family: String,
    parameter_size: String,
    /// The number of weights (Ollama's `general.parameter_count`, a number).
    parameter_count: u64,
    quantization_level: String,
    model_info: Map<String, Value>,
    template: String,
    pub(crate) capabilities: Vec<&'static str>,
    pub(crate) modified_at: String,
    path: String,
}

/// A GGUF scalar as JSON (arrays are left out of `model_info`, as Ollama leaves the
/// tokenizer's arrays out unless asked for them).
fn scalar_json(v: &frink_gguf::MetaValue) -> Option<Value> {
    use frink_gguf::MetaValue as M;
    Some(match v {
        M::U8(x) => json!(x),
        M::I8(x) => json!(x),
        M::U16(x) => json!(x),
        M::I16(x) => json!(x),
        M::U32(x) => json!(x),
        M::I32(x) => json!(x),
        M::U64(x) => json!(x),
        M::I64(x) => json!(x),
        M::F32(x) => json!(x),
        M::F64(x) => json!(x),
        M::Bool(x) => json!(x),
        M::String(s) => json!(s),
        M::Array(_) => return None,
    })
}

/// RFC 3339 time in UTC with microseconds, as Ollama writes `created_at`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let micros = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_micros());
    let base = frink_tokenizer::strftime("%Y-%m-%dT%H:%M:%S", t).unwrap_or_default();
    format!("{base}.{micros:06}Z")
}

impl ModelInfo {
    /// Reads what the endpoints report from `model` (before the tokenizer's arrays are
    /// released) and the template the server renders with.
    pub fn read(model: &Model, path: &str, template: Option<&str>) -> ModelInfo {
        ModelInfo::read_file(&model.file, model.config.pooling.is_some(), path, template)
    }

    /// [`ModelInfo::read`] from the file alone (a model not loaded): `embedding` says
    /// whether it pools embeddings (its configuration's `pooling`).
    pub fn read_file(
        f: &frink_gguf::GgufFile,
        embedding: bool,
        path: &str,
        template: Option<&str>,
    ) -> ModelInfo {
        let arch = f.architecture().unwrap_or("unknown").to_string();
        let model_info: Map<String, Value> = f
            .metadata()
            .iter()
            .filter(|(k, _)| k != "tokenizer.chat_template")
            .filter_map(|(k, v)| Some((k.clone(), scalar_json(v)?)))
            .collect();
        let params = f.parameter_count();
        let quantization_level = f.file_type_name().unwrap_or("unknown").to_string();
        let template = template
            .map(str::to_string)
            .or_else(|| {
                f.get("tokenizer.chat_template")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let mut capabilities = Vec::new();
        if embedding {
            capabilities.push("embedding");
        } else {
            capabilities.push("completion");
            if crate::tools::ToolFormat::detect(&template).is_some() {
                capabilities.push("tools");
            }
            if crate::reasoning::thinks(&template) {
                capabilities.push("thinking");
            }
        }
        let meta = std::fs::metadata(path).ok();
        let modified = meta
            .as_ref()
            .and_then(|m| m.modified().ok())
            .unwrap_or(UNIX_EPOCH);
        // A catalog file's published sha256 (computing one for any file would read it all).
        let digest = frink_store::catalog()
            .into_iter()
            .find(|e| path.ends_with(&e.file))
            .map(|e| e.sha256);
        ModelInfo {
            digest,
            family: arch,
            parameter_size: frink_gguf::parameter_size(params),
            parameter_count: params,
            quantization_level,
            model_info,
            template,
            capabilities,
            modified_at: rfc3339(modified),
            path: path.to_string(),
        }
    }

    /// The model file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What `/api/show` answers (and `frink show` prints): the modelfile line, default
    /// parameters, template, details, metadata (`model_info`) and capabilities.
    pub fn show(&self) -> Value {
        let mut model_info = self.model_info.clone();
        model_info.insert(
            "general.parameter_count".into(),
            json!(self.parameter_count),
        );
        json!({
            "modelfile": format!("# served by frink\nFROM {}\n", self.path),
            "parameters": "temperature 0.8\ntop_k 40\ntop_p 0.95\nmin_p 0.05\nrepeat_penalty 1",
            "template": self.template,
            "details": self.details(),
            "model_info": model_info,
            "capabilities": self.capabilities,
            "modified_at": self.modified_at,
        })
    }

    /// Ollama's `details` of a model (`/api/tags`, `/api/ps`, `/api/show`).
    pub fn details(&self) -> Value {
        json!({
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization_level,
        })
    }
}

/// An error in Ollama's shape.
pub(crate) fn error(e: ApiError) -> Response {
    json_response(e.status, &json!({"error": e.message}))
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::invalid(None, message)
}

/// Ollama's `options` as the OpenAI and llama.cpp fields they mean, added to `out`.
/// `num_ctx` is returned for the caller (a per-request context limit). Options about
/// hardware and loading cannot change the output and are informational; an option whose
/// value would change the output and that frink does not implement is refused by the
/// same rules as on the OpenAI endpoints (`typical_p`, `mirostat`).
pub(crate) fn options(
    obj: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<Option<usize>, ApiError> {
    let Some(o) = obj.get("options").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let o = o
        .as_object()
        .ok_or_else(|| bad("'options' must be an object"))?;
    let mut num_ctx = None;
    for (k, v) in o {
        match k.as_str() {
            "temperature" | "top_k" | "top_p" | "min_p" | "seed" | "stop" | "repeat_penalty"
            | "repeat_last_n" | "presence_penalty" | "frequency_penalty" | "typical_p"
            | "mirostat" | "mirostat_tau" | "mirostat_eta" => {
                out.insert(k.clone(), v.clone());
            }
            "num_predict" => match v.as_i64() {
                Some(n) if n > 0 => {
                    out.insert("max_tokens".into(), json!(n));
                }
                // -1: no limit; -2: until the context is full (the same here).
                Some(-1 | -2) => {}
                _ => {
                    return Err(bad(format!(
                        "options.num_predict must be positive, -1 or -2, got {v}"
                    )))
                }
            },
            "num_keep" => match v.as_i64() {
                Some(n) if n >= -1 => {
                    out.insert("n_keep".into(), json!(n));
                }
                _ => {
                    return Err(bad(format!(
                        "options.num_keep must be -1 (the whole prompt) or more, got {v}"
                    )))
                }
            },
            "num_ctx" => match v.as_u64() {
                Some(n) if n >= 2 => num_ctx = Some(n as usize),
                _ => return Err(bad(format!("options.num_ctx must be at least 2, got {v}"))),
            },
            "tfs_z" if v.as_f64() != Some(1.0) => {
                return Err(bad(
                    "options.tfs_z (tail-free sampling) is not implemented; 1 disables it",
                ))
            }
            "penalize_newline" if v.as_bool() == Some(true) => {
                return Err(bad("options.penalize_newline is not implemented"))
            }
            // Hardware, loading and context shifting: no effect on the answer.
            _ => {}
        }
    }
    Ok(num_ctx)
}

/// Ollama's option names (its `api.Options` and `Runner`), by the type of their value.
const NUMBER_OPTIONS: &[&str] = &[
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "seed",
    "num_predict",
    "num_ctx",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "tfs_z",
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
];
const BOOL_OPTIONS: &[&str] = &[
    "penalize_newline",
    "numa",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "use_mmap",
    "use_mlock",
];

/// One of Ollama's options (in `field`: `/api/create`'s `parameters`): a known name with
/// a value of its type. ([`options`] reads those that change an answer.)
///
/// Errors: a 400 naming the option.
pub(crate) fn check_option(k: &str, v: &Value, field: &'static str) -> Result<(), ApiError> {
    let ok = if NUMBER_OPTIONS.contains(&k) {
        v.is_number()
    } else if BOOL_OPTIONS.contains(&k) {
        v.is_boolean()
    } else if k == "stop" {
        v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    } else {
        return Err(ApiError::invalid(
            Some(field),
            format!("'{field}.{k}' is not one of Ollama's options"),
        ));
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            Some(field),
            format!("'{field}.{k}' has the wrong type: {v}"),
        ))
    }
}

/// `logprobs` and `top_logprobs` (0–20 alternatives) as the OpenAI fields of a chat
/// (`chat`) or raw completion request.
fn logprobs(
    obj: &Map<String, Value>,
    out: &mut Map<String, Value>,
    chat: bool,
) -> Result<(), ApiError> {
    if !api::opt_bool(obj, "logprobs")?.unwrap_or(false) {
        return Ok(());
    }
    let top = api::opt_i64(obj, "top_logprobs")?.unwrap_or(0);
    if !(0..=20).contains(&top) {
        return Err(bad(format!(
            "'top_logprobs' must be between 0 and 20, got {top}"
        )));
    }
    if chat {
        out.insert("logprobs".into(), json!(true));
        out.insert("top_logprobs".into(), json!(top));
    } else {
        out.insert("logprobs".into(), json!(top));
    }
    Ok(())
}

/// `format`: `"json"`, a JSON schema, or nothing, as the OpenAI `response_format`.
fn format(obj: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    match obj.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(v) => {
            return Err(bad(format!(
                "'format' must be \"json\" or a JSON schema, got {v}"
            )))
        }
    }
    Ok(())
}

/// `think`: `true`/`false` switch a reasoning template's thinking (`enable_thinking`), a
/// level (`"low"`, `"medium"`, `"high"`) sets `reasoning_effort` (gpt-oss). Asking a model
/// whose template has no thinking to think is refused, as Ollama refuses it; `false` is
/// what such a model does anyway.
fn think(
    st: &AppState,
    obj: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let asked = !matches!(
        obj.get("think"),
        None | Some(Value::Null) | Some(Value::Bool(false))
    );
    if asked && !crate::reasoning::thinks(st.template(st.engine()?).unwrap_or("")) {
        return Err(bad("'think': this model's chat template has no thinking"));
    }
    let kwargs = match obj.get("think") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Bool(b)) => json!({"enable_thinking": b}),
        Some(Value::String(level)) => {
            if !st
                .template(st.engine()?)
                .unwrap_or("")
                .contains("reasoning_effort")
            {
                return Err(bad(format!(
                    "'think': {level:?}: this model's chat template has no levels of thinking; \
                     send true or false"
                )));
            }
            json!({"reasoning_effort": level})
        }
        Some(v) => {
            return Err(bad(format!(
                "'think' must be a boolean or a level, got {v}"
            )))
        }
    };
    out.insert("chat_template_kwargs".into(), kwargs);
    Ok(())
}

/// A message's `content` with its `images` (Ollama: base64 strings) before the text, as
/// OpenAI content parts (each image a part whose URL is the base64: the server takes
/// bare base64 too).
///
/// Errors: `images` not an array of strings.
fn with_images(content: &Value, images: Option<&Value>, field: &str) -> Result<Value, ApiError> {
    let list = match images {
        None | Some(Value::Null) => return Ok(content.clone()),
        Some(Value::Array(a)) if a.is_empty() => return Ok(content.clone()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad(format!("'{field}' must be an array of base64 strings"))),
    };
    let mut parts = Vec::with_capacity(list.len() + 1);
    for (k, im) in list.iter().enumerate() {
        let b64 = im
            .as_str()
            .ok_or_else(|| bad(format!("{field}[{k}] must be a base64 string")))?;
        parts.push(json!({"type": "image_url", "image_url": {"url": b64}}));
    }
    match content {
        Value::String(t) if !t.is_empty() => parts.push(json!({"type": "text", "text": t})),
        // Parts already (what OpenAI-minded clients send): after the images.
        Value::Array(more) => parts.extend(more.iter().cloned()),
        _ => {}
    }
    Ok(Value::Array(parts))
}

/// Ollama's chat messages as OpenAI's: `tool_calls` with `arguments` objects become
/// OpenAI calls (JSON-string arguments, an id), `thinking` is kept for templates that
/// read it (gpt-oss's `thinking`, Qwen3's `reasoning_content`), `tool_name` passes on.
fn messages(v: &Value) -> Result<Value, ApiError> {
    let ms = v
        .as_array()
        .ok_or_else(|| bad("'messages' must be an array"))?;
    let mut out = Vec::with_capacity(ms.len());
    for (i, m) in ms.iter().enumerate() {
        let mut m = m
            .as_object()
            .cloned()
            .ok_or_else(|| bad(format!("messages[{i}] must be an object")))?;
        if let Some(images) = m.remove("images") {
            let content = m.get("content").cloned().unwrap_or(Value::Null);
            let field = format!("messages[{i}].images");
            m.insert(
                "content".into(),
                with_images(&content, Some(&images), &field)?,
            );
        }
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let f = &c["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => s.clone(),
                        a => a.to_string(),
                    };
                    json!({"id": format!("call_{i}_{k}"), "type": "function",
                           "function": {"name": f["name"], "arguments": args}})
                })
                .collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(t) = m.get("thinking").cloned() {
            m.entry("reasoning_content").or_insert(t);
        }
        out.push(Value::Object(m));
    }
    Ok(Value::Array(out))
}

/// Applies `num_ctx` to a prepared request: the prompt must fit it, and generation stops
/// where prompt and answer fill it (at most the server's `--ctx`).
fn limit_context(st: &AppState, p: &mut Prepared, num_ctx: Option<usize>) -> Result<(), ApiError> {
    let Some(n) = num_ctx else {
        return Ok(());
    };
    let n = n.min(st.n_ctx);
    if p.prompt.len() >= n {
        return Err(bad(format!(
            "the prompt is {} tokens: options.num_ctx ({n}) leaves no room for an answer",
            p.prompt.len()
        )));
    }
    if st.engine.get().is_some_and(|e| e.context_shift) {
        // Generation shifts at this context instead of ending there.
        p.opts.n_ctx = Some(n);
        return Ok(());
    }
    let room = n - p.prompt.len();
    p.opts.max_tokens = Some(p.opts.max_tokens.map_or(room, |m| m.min(room)));
    Ok(())
}

/// What a reply line carries: the chat's `message` or generate's `response`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Chat,
    Generate,
}

/// The lines of one reply, built as the answer is read. (Generate's deprecated `context`
/// is not returned: frink does not take it back.)
struct Reply {
    shape: Shape,
    model: String,
    start: Instant,
    /// Time spent waiting for the model to load.
    load: std::time::Duration,
    /// The request's log line, and the tokenizer its `--log-prompts` texts are read with.
    log: crate::log::RequestLog,
    tok: Arc<frink_tokenizer::Tokenizer>,
}

impl Reply {
    fn line(&self, mut v: Value) -> Value {
        v["model"] = json!(self.model);
        v["created_at"] = json!(rfc3339(SystemTime::now()));
        v
    }

    /// A line (or whole reply) with `content`, `thinking` and `calls`.
    fn part(
        &self,
        content: &str,
        thinking: &str,
        calls: &[crate::tools::ToolCall],
        done: bool,
    ) -> Value {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let args: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
                json!({"function": {"name": c.name, "arguments": args}})
            })
            .collect();
        let mut v = match self.shape {
            Shape::Chat => {
                let mut m = json!({"role": "assistant", "content": content});
                if !thinking.is_empty() {
                    m["thinking"] = json!(thinking);
                }
                if !calls.is_empty() {
                    m["tool_calls"] = Value::Array(calls);
                }
                json!({"message": m})
            }
            Shape::Generate => {
                let mut v = json!({"response": content});
                if !thinking.is_empty() {
                    v["thinking"] = json!(thinking);
                }
                v
            }
        };
        v["done"] = json!(done);
        self.line(v)
    }

    /// The last line's fields: why it ended and the counts and durations (nanoseconds).
    fn finish(&self, v: &mut Value, c: &Completion) {
        let ns = |ms: f64| (ms * 1e6) as u64;
        v["done"] = json!(true);
        v["done_reason"] = json!(match c.finish_reason {
            frink_engine::FinishReason::Length => "length",
            _ => "stop",
        });
        v["total_duration"] = json!(self.start.elapsed().as_nanos() as u64);
        v["load_duration"] = json!(self.load.as_nanos() as u64);
        v["prompt_eval_count"] = json!(c.prompt_tokens);
        v["prompt_eval_duration"] = json!(ns(c.first_token_ms));
        v["eval_count"] = json!(c.ids.len());
        v["eval_duration"] = json!(ns(c.gen_ms));
        self.log.finished(&self.model, c, &self.tok);
    }
}

/// An NDJSON response from a stream of lines.
pub(crate) fn ndjson(stream: impl futures_util::Stream<Item = Value> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    let body = stream.map(|v| Ok::<Bytes, Infallible>(line(&v)));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

/// Queues `p` and answers in Ollama's shape, streamed (NDJSON) or whole.
async fn answer(
    st: &AppState,
    mut p: Prepared,
    shape: Shape,
    stream: bool,
    arrival: Arrival,
    log: Option<axum::Extension<crate::log::RequestLog>>,
) -> Response {
    let log = log.map(|l| l.0).unwrap_or_default();
    let mut rx = match queue(
        st,
        &mut p,
        if shape == Shape::Chat {
            "messages"
        } else {
            "prompt"
        },
    ) {
        Ok(rx) => rx,
        Err(e) => return error(e),
    };
    // Queued: the engine is there.
    let tok = match st.engine() {
        Ok(eng) => Arc::clone(&eng.tok),
        Err(e) => return error(e),
    };
    log.set_prompt(&tok, &p.prompt);
    let reply = Reply {
        shape,
        model: std::mem::take(&mut p.model),
        start: arrival.at,
        load: arrival.load,
        log,
        tok,
    };
    let format = std::mem::take(&mut p.answer);
    let with_logprobs = p.logprobs.is_some();
    if !stream {
        let mut g = match gather(1, rx, |_, _| {}).await {
            Ok(g) => g,
            Err(e) => return error(failed(e, "an answer")),
        };
        let (thinking, content, calls) = format.parse(&g.text[0]);
        let mut v = reply.part(&content, &thinking, &calls, true);
        if with_logprobs {
            v["logprobs"] = crate::respond::token_logprobs(&reply.tok, &g.tokens[0], false);
        }
        reply.finish(&mut v, &g.done.remove(0));
        return json_response(StatusCode::OK, &v);
    }
    let first = match first_event(&mut rx).await {
        Ok(e) => e,
        Err(e) => return error(failed(e, "an answer")),
    };
    let state = Streamed {
        reader: Some(format.stream()),
        reply,
        pending: with_logprobs.then(Vec::new),
    };
    answer_stream("application/x-ndjson", state, VecDeque::new(), first, rx)
}

/// A streamed Ollama answer: a line per piece of the answer (its reasoning, content or a
/// call), the last with `done: true` and the counts; an error after the first token as a
/// line `{"error": …}`.
struct Streamed {
    reader: Option<answer::AnswerStream>,
    reply: Reply,
    /// With `logprobs`: the tokens not yet on a line (text held back by the reader goes
    /// out with a later line).
    pending: Option<Vec<frink_engine::scheduler::TokenLogprob>>,
}

impl Streamed {
    fn parts(&mut self, parts: Vec<reasoning::Part>, out: &mut VecDeque<Bytes>) {
        for part in parts {
            let mut v = match part {
                reasoning::Part::Reasoning(t) => self.reply.part("", &t, &[], false),
                reasoning::Part::Content(t) if t.is_empty() => continue,
                reasoning::Part::Content(t) => self.reply.part(&t, "", &[], false),
                reasoning::Part::Call(c) => self.reply.part("", "", &[c], false),
            };
            self.logprobs(&mut v);
            out.push_back(line(&v));
        }
    }

    fn logprobs(&mut self, v: &mut Value) {
        if let Some(p) = self.pending.as_mut() {
            v["logprobs"] =
                crate::respond::token_logprobs(&self.reply.tok, &std::mem::take(p), false);
        }
    }
}

impl OnEvent for Streamed {
    fn on_event(&mut self, event: Option<(usize, Event)>, out: &mut VecDeque<Bytes>) -> bool {
        match event {
            Some((_, Event::Delta { text, tokens })) => {
                if let Some(p) = self.pending.as_mut() {
                    p.extend(tokens);
                }
                let parts = self
                    .reader
                    .as_mut()
                    .map(|r| r.push(&text))
                    .unwrap_or_default();
                self.parts(parts, out);
                false
            }
            Some((_, Event::Done(c))) => {
                let parts = self.reader.take().map(|r| r.finish()).unwrap_or_default();
                self.parts(parts, out);
                let mut v = self.reply.part("", "", &[], true);
                if self.pending.as_ref().is_some_and(|p| !p.is_empty()) {
                    self.logprobs(&mut v);
                }
                self.reply.finish(&mut v, &c);
                out.push_back(line(&v));
                true
            }
            Some((_, Event::Embedding(_))) => false,
            Some((_, Event::Failed(e))) => {
                out.push_back(line(&json!({"error": e.to_string()})));
                true
            }
            None => {
                out.push_back(line(
                    &json!({"error": "the request ended without an answer"}),
                ));
                true
            }
        }
    }
}

/// One NDJSON line.
fn line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

/// The reply to a request that names no work (`messages` or `prompt` empty): Ollama loads
/// the model and answers `done_reason: "load"` (or, with `keep_alive: 0`, unloads it and
/// answers `"unload"`: [`crate::models::dispatch`]).
pub(crate) fn no_work(model: &str, shape: Shape, reason: &str) -> Response {
    let mut v = match shape {
        Shape::Chat => json!({"message": {"role": "assistant", "content": ""}}),
        Shape::Generate => json!({"response": ""}),
    };
    v["model"] = json!(model);
    v["created_at"] = json!(rfc3339(SystemTime::now()));
    v["done"] = json!(true);
    v["done_reason"] = json!(reason);
    json_response(StatusCode::OK, &v)
}

/// What every chat and generate request starts with (the gate has checked the key): parsed, what frink
/// cannot honour refused; (the request, its `model` field, whether it streams: Ollama's
/// default is yes).
fn begin(st: &AppState, body: &Bytes) -> Result<(Map<String, Value>, String, bool), ApiError> {
    let obj = api::parse_object(body)?;
    let model = model_field(st, &obj);
    let stream = api::opt_bool(&obj, "stream")?.unwrap_or(true);
    Ok((obj, model, stream))
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    State(st): St,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    arrived: Option<axum::Extension<Arrival>>,
    body: Bytes,
) -> Response {
    let start = arrival(arrived);
    let r = st
        .offload(move |st| {
            let (obj, model, stream) = begin(st, &body)?;
            let msgs = obj.get("messages").cloned().unwrap_or(json!([]));
            if msgs.as_array().is_some_and(Vec::is_empty) {
                return Ok(Err(model));
            }
            let mut oa = Map::new();
            oa.insert("model".into(), json!(model));
            oa.insert("messages".into(), messages(&msgs)?);
            if let Some(t) = obj.get("tools").filter(|t| !t.is_null()) {
                oa.insert("tools".into(), t.clone());
            }
            let num_ctx = options(&obj, &mut oa)?;
            format(&obj, &mut oa)?;
            think(st, &obj, &mut oa)?;
            logprobs(&obj, &mut oa, true)?;
            let mut p = prepare_chat(st, &oa)?;
            limit_context(st, &mut p, num_ctx)?;
            Ok(Ok((p, stream)))
        })
        .await;
    match r {
        Ok(Ok((p, stream))) => answer(&st, p, Shape::Chat, stream, start, log).await,
        Ok(Err(model)) => no_work(&model, Shape::Chat, "load"),
        Err(e) => error(e),
    }
}

/// `POST /api/generate`: `prompt` (and `system`) through the chat template, or as given
/// with `raw`, or with `suffix` fill-in-the-middle ([`crate::infill`]); a `template` of
/// Ollama's Go syntax and a previous `context` are refused.
pub(crate) async fn generate(
    State(st): St,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    arrived: Option<axum::Extension<Arrival>>,
    body: Bytes,
) -> Response {
    let start = arrival(arrived);
    let r = st
        .offload(move |st| {
        let (obj, model, stream) = begin(st, &body)?;
        for (field, what) in [
            ("template", "'template' is Ollama's Go template syntax; frink renders the file's Jinja template (use --chat-template)"),
        ] {
            if obj.get(field).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                return Err(bad(what));
            }
        }
        if obj
            .get("context")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(bad("'context' (a previous answer's token ids) is not implemented; send the conversation with /api/chat"));
        }
        let prompt = api::opt_str(&obj, "prompt")?.unwrap_or("");
        if prompt.is_empty() {
            return Ok(Err(model));
        }
        let mut oa = Map::new();
        oa.insert("model".into(), json!(model));
        let num_ctx = options(&obj, &mut oa)?;
        format(&obj, &mut oa)?;
        let raw = api::opt_bool(&obj, "raw")?.unwrap_or(false);
        let suffix = api::opt_str(&obj, "suffix")?.filter(|s| !s.is_empty());
        let images = obj.get("images").filter(|v| v.as_array().is_none_or(|a| !a.is_empty()));
        let mut p = if raw || suffix.is_some() {
            if images.is_some() {
                return Err(bad("'images' need the chat template, which 'raw' and 'suffix' bypass"));
            }
            if !matches!(obj.get("think"), None | Some(Value::Null) | Some(Value::Bool(false))) {
                return Err(bad("'think' needs the chat template, which 'raw' and 'suffix' bypass"));
            }
            // With a suffix: fill-in-the-middle, the prompt the text before the gap.
            oa.insert("prompt".into(), json!(prompt));
            if let Some(suffix) = suffix {
                oa.insert("suffix".into(), json!(suffix));
            }
            logprobs(&obj, &mut oa, false)?;
            prepare_completion(st, &oa)?
        } else {
            let mut msgs = Vec::new();
            if let Some(system) = api::opt_str(&obj, "system")?.filter(|s| !s.is_empty()) {
                msgs.push(json!({"role": "system", "content": system}));
            }
            msgs.push(json!({"role": "user", "content": with_images(&json!(prompt), images, "images")?}));
            oa.insert("messages".into(), Value::Array(msgs));
            think(st, &obj, &mut oa)?;
            logprobs(&obj, &mut oa, true)?;
            prepare_chat(st, &oa)?
        };
        limit_context(st, &mut p, num_ctx)?;
        Ok(Ok((p, stream)))
    })
        .await;
    match r {
        Ok(Ok((p, stream))) => answer(&st, p, Shape::Generate, stream, start, log).await,
        Ok(Err(model)) => no_work(&model, Shape::Generate, "load"),
        Err(e) => error(e),
    }
}

/// `GET /api/version`: frink's version.
pub(crate) async fn version() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"version": env!("CARGO_PKG_VERSION")}),
    )
}

/// `POST /api/embed`: `input` (a string or strings), L2-normalised vectors; `truncate`
/// (default true) cuts an input longer than the context, false refuses it.
pub(crate) async fn embed(
    State(st): St,
    arrived: Option<axum::Extension<Arrival>>,
    body: Bytes,
) -> Response {
    let start = arrival(arrived);
    let r = async {
        let obj = api::parse_object(&body)?;
        let eng = st.engine()?;
        let dims = check_dimensions(eng, &obj)?;
        let mut inputs = embedding_inputs(&st, &obj).await?;
        if api::opt_bool(&obj, "truncate")?.unwrap_or(true) {
            for t in &mut inputs {
                t.truncate(st.n_ctx - 1);
            }
        }
        let (vectors, tokens) = embed_inputs(&st, inputs, 2, dims).await?;
        Ok(json!({
            "model": model_field(&st, &obj),
            "embeddings": vectors,
            "total_duration": start.at.elapsed().as_nanos() as u64,
            "load_duration": start.load.as_nanos() as u64,
            "prompt_eval_count": tokens,
        }))
    };
    match r.await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error(e),
    }
}

/// `POST /api/embeddings` (Ollama's older endpoint): `prompt`, the vector not normalised.
pub(crate) async fn embeddings(State(st): St, body: Bytes) -> Response {
    let r = async {
        let obj = api::parse_object(&body)?;
        st.engine()?;
        let prompt = api::opt_str(&obj, "prompt")?.unwrap_or("");
        if prompt.is_empty() {
            return Ok(json!({"embedding": []}));
        }
        let mut q = Map::new();
        q.insert("input".into(), json!(prompt));
        let inputs = embedding_inputs(&st, &q).await?;
        let dims = check_dimensions(st.engine()?, &obj)?;
        let (mut vectors, _) = embed_inputs(&st, inputs, -1, dims).await?;
        Ok(json!({"embedding": vectors.pop().unwrap_or_default()}))
    };
    match r.await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error(e),
    }
}
