//! Request parsing and OpenAI-shaped errors.
//!
//! Bodies are parsed as JSON values and the known fields read one by one into each endpoint
//! family's typed request ([`request`]), so a wrong type names its field (`param`). [`FIELDS`] lists every field OpenAI's chat and completions
//! APIs or llama.cpp's server define and how frink treats it: honoured, informational (it
//! cannot change the output), or refused with a 400 naming it unless it has its neutral
//! value (CONTRACT.md: a defined field is never accepted and ignored). Fields neither API
//! defines are ignored (clients send new ones).

pub mod llamacpp;
pub mod request;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use frink_engine::constraint::Grammar;
use frink_engine::sampling::SamplingParams;
use serde_json::{json, Map, Value};

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`, …).
    pub kind: &'static str,
    /// The offending request field, if one.
    pub param: Option<String>,
    /// A short machine-readable code, if one.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// An error of any status and type.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// With a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The error as the API a request was translated from names its fields: each
    /// `(chat_name, own_name)` pair renames the `param` and the quoted name in the message
    /// (`'stop'` becomes `'stop_sequences'` for an Anthropic request).
    pub fn renamed(mut self, names: &[(&str, &str)]) -> ApiError {
        for (chat, own) in names {
            if self.param.as_deref() == Some(*chat) {
                self.param = Some(own.to_string());
            }
            self.message = self
                .message
                .replace(&format!("'{chat}'"), &format!("'{own}'"));
        }
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body())
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// Parses a body that must be a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid(
            None,
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::invalid(None, format!("malformed JSON: {e}"))),
    }
}

/// A present, non-null field.
pub(crate) fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// An optional number.
pub fn opt_f64(obj: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(Some(name), format!("'{name}' must be a number"))),
    }
}

/// An optional integer.
pub fn opt_i64(obj: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(Some(name), format!("'{name}' must be an integer"))),
    }
}

/// An optional boolean.
pub fn opt_bool(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(Some(name), format!("'{name}' must be a boolean"))),
    }
}

/// An optional string.
pub fn opt_str<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(Some(name), format!("'{name}' must be a string"))),
    }
}

/// OpenAI's predicted outputs: `prediction: {"type": "content", "content": TEXT}`, the
/// content a string or an array of `{"type": "text", "text": …}` parts (joined). `None`
/// when absent or null.
///
/// Errors: a 400 naming `prediction` for another shape or type.
pub fn prediction(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(v) = field(obj, "prediction") else {
        return Ok(None);
    };
    let bad = |m: &str| ApiError::invalid(Some("prediction"), m.to_string());
    let o = v
        .as_object()
        .ok_or_else(|| bad("'prediction' must be an object"))?;
    if o.get("type").and_then(Value::as_str) != Some("content") {
        return Err(bad("'prediction.type' must be \"content\""));
    }
    match o.get("content") {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(bad(
                        "'prediction.content' parts must be {\"type\": \"text\", \"text\": …}",
                    )),
                },
            )
            .collect::<Result<String, _>>()
            .map(Some),
        _ => Err(bad(
            "'prediction.content' must be a string or an array of text parts",
        )),
    }
}

/// A number field checked against `lo..=hi`.
fn ranged(obj: &Map<String, Value>, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match opt_f64(obj, name)? {
        Some(v) if !(lo..=hi).contains(&v) => Err(ApiError::invalid(
            Some(name),
            format!("'{name}' must be between {lo} and {hi}, got {v}"),
        )),
        v => Ok(v.map(|v| v as f32)),
    }
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// Where a field is defined: OpenAI's chat API, its completions API, both, or llama.cpp's
/// server (which accepts its fields on both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defined {
    /// OpenAI's chat completions request.
    Chat,
    /// OpenAI's (legacy) completions request.
    Completions,
    /// Both of OpenAI's requests.
    Both,
    /// llama.cpp's server (`/completion` and its OpenAI-compatible endpoints).
    LlamaCpp,
}

impl Defined {
    /// Whether the field belongs to requests at `ep`.
    pub fn applies_to(self, ep: Endpoint) -> bool {
        match self {
            Defined::Chat => ep == Endpoint::Chat,
            Defined::Completions => ep == Endpoint::Completions,
            Defined::Both | Defined::LlamaCpp => true,
        }
    }
}

/// How frink treats a defined request field.
#[derive(Clone, Copy, Debug)]
pub enum Treatment {
    /// Read and honoured (its parser gives wrong types and values a 400).
    Honoured,
    /// Accepted; it cannot change the output (bookkeeping, or a setting that only matters
    /// where another, refused, field is set).
    Informational,
    /// A 400 naming the field unless `neutral(value)`: the values that change nothing.
    Refused {
        /// Whether a value is one that changes nothing (null always is).
        neutral: fn(&Value) -> bool,
        /// Why, as the error says it.
        why: &'static str,
    },
}

/// A field of [`FIELDS`].
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// The JSON name.
    pub name: &'static str,
    /// Which API defines it.
    pub defined: Defined,
    /// What frink does with it.
    pub treatment: Treatment,
}

const fn field_of(name: &'static str, defined: Defined, treatment: Treatment) -> Field {
    Field {
        name,
        defined,
        treatment,
    }
}

const fn refused(neutral: fn(&Value) -> bool, why: &'static str) -> Treatment {
    Treatment::Refused { neutral, why }
}

fn never(_: &Value) -> bool {
    false
}
fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}
fn is_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}
fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}
fn at_most_one(v: &Value) -> bool {
    v.as_f64().is_some_and(|x| x <= 1.0)
}
fn not_positive(v: &Value) -> bool {
    v.as_f64().is_some_and(|x| x <= 0.0)
}
fn empty(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}
fn text_only(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")))
}
fn no_tool_use(v: &Value) -> bool {
    matches!(v.as_str(), Some("none" | "auto"))
}

use Defined::{Both, Chat as ChatApi, Completions as TextApi, LlamaCpp};
use Treatment::{Honoured, Informational};

/// Every request field of OpenAI's chat and completions APIs and of llama.cpp's server,
/// and frink's treatment of it (docs/server.md's table lists the same). Sources: OpenAI's API
/// reference (`CreateChatCompletionRequest`, `CreateCompletionRequest`); llama.cpp's
/// tools/server/README.md (`POST /completion` options and the OpenAI-compatible ones).
pub const FIELDS: &[Field] = &[
    // OpenAI, honoured.
    field_of("messages", ChatApi, Honoured),
    field_of("prompt", TextApi, Honoured),
    field_of("max_tokens", Both, Honoured),
    field_of("max_completion_tokens", ChatApi, Honoured),
    field_of("temperature", Both, Honoured),
    field_of("top_p", Both, Honoured),
    field_of("frequency_penalty", Both, Honoured),
    field_of("presence_penalty", Both, Honoured),
    field_of("logit_bias", Both, Honoured),
    field_of("seed", Both, Honoured),
    field_of("stop", Both, Honoured),
    field_of("stream", Both, Honoured),
    field_of("stream_options", Both, Honoured),
    field_of("logprobs", Both, Honoured),
    field_of("top_logprobs", ChatApi, Honoured),
    field_of("response_format", Both, Honoured),
    field_of("tools", ChatApi, Honoured),
    field_of("tool_choice", ChatApi, Honoured),
    field_of("parallel_tool_calls", ChatApi, Honoured),
    field_of("parse_tool_calls", LlamaCpp, Honoured),
    field_of("reasoning_format", LlamaCpp, Honoured),
    field_of("n", Both, Honoured),
    field_of("prediction", ChatApi, Honoured),
    // OpenAI, informational.
    field_of("model", Both, Informational),
    field_of("user", Both, Informational),
    field_of("metadata", ChatApi, Informational),
    field_of("store", ChatApi, Informational),
    field_of("service_tier", ChatApi, Informational),
    field_of("prompt_cache_key", ChatApi, Informational),
    field_of("safety_identifier", ChatApi, Informational),
    // OpenAI, refused unless neutral.
    field_of(
        "functions",
        ChatApi,
        refused(empty, "function calling is not supported"),
    ),
    field_of(
        "function_call",
        ChatApi,
        refused(no_tool_use, "function calling is not supported"),
    ),
    field_of(
        "audio",
        ChatApi,
        refused(never, "audio output is not supported"),
    ),
    field_of(
        "modalities",
        ChatApi,
        refused(text_only, "only the text modality is supported"),
    ),
    field_of("reasoning_effort", ChatApi, Honoured),
    field_of(
        "verbosity",
        ChatApi,
        refused(never, "verbosity is not supported"),
    ),
    field_of(
        "web_search_options",
        ChatApi,
        refused(never, "web search is not supported"),
    ),
    field_of(
        "best_of",
        TextApi,
        refused(is_one, "only best_of = 1 is supported"),
    ),
    field_of("echo", TextApi, refused(is_false, "echo is not supported")),
    // Fill-in-the-middle: the prompt is the prefix (crate::infill).
    field_of("suffix", TextApi, Honoured),
    // llama.cpp, honoured.
    field_of("top_k", LlamaCpp, Honoured),
    field_of("min_p", LlamaCpp, Honoured),
    field_of("repeat_penalty", LlamaCpp, Honoured),
    field_of("repeat_last_n", LlamaCpp, Honoured),
    field_of("n_predict", LlamaCpp, Honoured),
    field_of("ignore_eos", LlamaCpp, Honoured),
    field_of("n_probs", LlamaCpp, Honoured),
    field_of("json_schema", LlamaCpp, Honoured),
    field_of("grammar", LlamaCpp, Honoured),
    field_of("chat_template_kwargs", LlamaCpp, Honoured),
    // llama.cpp, informational.
    field_of("cache_prompt", LlamaCpp, Informational),
    field_of("id_slot", LlamaCpp, Informational),
    field_of("timings_per_token", LlamaCpp, Informational),
    field_of("n_keep", LlamaCpp, Honoured),
    field_of("dynatemp_exponent", LlamaCpp, Informational),
    field_of("dry_base", LlamaCpp, Informational),
    field_of("dry_allowed_length", LlamaCpp, Informational),
    field_of("dry_penalty_last_n", LlamaCpp, Informational),
    field_of("dry_sequence_breakers", LlamaCpp, Informational),
    field_of("mirostat_tau", LlamaCpp, Informational),
    field_of("mirostat_eta", LlamaCpp, Informational),
    field_of("xtc_threshold", LlamaCpp, Informational),
    // llama.cpp, refused unless neutral.
    field_of(
        "dynatemp_range",
        LlamaCpp,
        refused(is_zero, "dynamic temperature is not supported"),
    ),
    field_of(
        "typical_p",
        LlamaCpp,
        refused(is_one, "typical-p sampling is not supported"),
    ),
    field_of(
        "dry_multiplier",
        LlamaCpp,
        refused(is_zero, "DRY sampling is not supported"),
    ),
    field_of(
        "xtc_probability",
        LlamaCpp,
        refused(is_zero, "XTC sampling is not supported"),
    ),
    field_of(
        "mirostat",
        LlamaCpp,
        refused(is_zero, "mirostat is not supported"),
    ),
    field_of(
        "top_n_sigma",
        LlamaCpp,
        refused(not_positive, "top-n-sigma sampling is not supported"),
    ),
    field_of(
        "min_keep",
        LlamaCpp,
        refused(at_most_one, "min_keep above 1 is not supported"),
    ),
    field_of("n_indent", LlamaCpp, Honoured),
    field_of("t_max_predict_ms", LlamaCpp, Honoured),
    field_of("samplers", LlamaCpp, Honoured),
    field_of("lora", LlamaCpp, Honoured),
    field_of(
        "image_data",
        LlamaCpp,
        refused(empty, "the old image_data form is not supported: send images as the prompt's multimodal_data ({\"prompt_string\": …, \"multimodal_data\": [base64…]})"),
    ),
    field_of(
        "multimodal_data",
        LlamaCpp,
        refused(empty, "multimodal_data goes inside the prompt: {\"prompt\": {\"prompt_string\": …, \"multimodal_data\": [base64…]}}"),
    ),
    field_of(
        "return_tokens",
        LlamaCpp,
        refused(is_false, "return_tokens is not supported"),
    ),
    field_of(
        "post_sampling_probs",
        LlamaCpp,
        refused(is_false, "post_sampling_probs is not supported"),
    ),
    field_of(
        "response_fields",
        LlamaCpp,
        refused(empty, "response_fields is not supported"),
    ),
    field_of(
        "return_progress",
        LlamaCpp,
        refused(is_false, "return_progress is not supported"),
    ),
];

/// Refuses a request that sets a [`Treatment::Refused`] field of `ep` to a value other
/// than its neutral one: a 400 naming the first such field (in [`FIELDS`] order) and why.
pub fn refuse_unsupported(obj: &Map<String, Value>, ep: Endpoint) -> Result<(), ApiError> {
    for f in FIELDS {
        let Treatment::Refused { neutral, why } = f.treatment else {
            continue;
        };
        if !f.defined.applies_to(ep) {
            continue;
        }
        if let Some(v) = field(obj, f.name) {
            if !neutral(v) {
                return Err(ApiError::invalid(
                    Some(f.name),
                    format!("'{}': {why} (frink refuses what it cannot honour)", f.name),
                )
                .with_code("unsupported_field"));
            }
        }
    }
    Ok(())
}

/// The grammar a request asks its answer to match: OpenAI's `response_format`
/// (`json_object`, optionally with llama.cpp's `schema`; `json_schema` with
/// `json_schema.schema`), llama.cpp's `json_schema` (a schema) or `grammar` (GBNF, or
/// llguidance's Lark syntax marked by a first line `%llguidance`, as llama.cpp's llguidance
/// build reads it: [`Grammar::from_grammar_text`]). Returns the field it came from with it.
///
/// Errors: two of them at once; a wrong shape; GBNF that does not parse or uses token
/// references.
pub fn grammar(obj: &Map<String, Value>) -> Result<Option<(&'static str, Grammar)>, ApiError> {
    let mut found: Vec<(&'static str, Grammar)> = Vec::new();
    if let Some(rf) = field(obj, "response_format") {
        let bad = |m: &str| ApiError::invalid(Some("response_format"), m.to_string());
        let rf = rf
            .as_object()
            .ok_or_else(|| bad("'response_format' must be an object"))?;
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => found.push((
                "response_format",
                match rf.get("schema").filter(|s| !s.is_null()) {
                    Some(schema) => Grammar::JsonSchema(schema.clone()),
                    None => Grammar::JsonObject,
                },
            )),
            Some("json_schema") => {
                let schema = rf
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .filter(|s| !s.is_null())
                    .ok_or_else(|| bad("'response_format.json_schema.schema' is required"))?;
                found.push(("response_format", Grammar::JsonSchema(schema.clone())));
            }
            _ => {
                return Err(bad(
                    "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        }
    }
    if let Some(schema) = field(obj, "json_schema") {
        if !schema.is_object() && !schema.is_boolean() {
            return Err(ApiError::invalid(
                Some("json_schema"),
                "'json_schema' must be a JSON schema (an object)",
            ));
        }
        found.push(("json_schema", Grammar::JsonSchema(schema.clone())));
    }
    if let Some(g) = opt_str(obj, "grammar")?.filter(|g| !g.trim().is_empty()) {
        let g = Grammar::from_grammar_text(g).map_err(|e| {
            ApiError::invalid(Some("grammar"), format!("'grammar': {e}"))
                .with_code("unsupported_field")
        })?;
        found.push(("grammar", g));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid(
            Some(found[1].0),
            format!(
                "'{}' and '{}' both constrain the answer; send one",
                found[0].0, found[1].0
            ),
        )),
    }
}

/// Generation options common to both completion endpoints.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Token budget (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// Sampler settings, the seed resolved.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// llama.cpp's `ignore_eos`.
    pub ignore_eos: bool,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Choices to generate (`n`, at least 1).
    pub n: usize,
    /// llama.cpp's `n_indent` and `t_max_predict_ms` ([`crate::api::llamacpp::Watch`]).
    pub limits: crate::api::llamacpp::TextLimits,
    /// llama.cpp's `n_keep` (Ollama's `num_keep`): prompt tokens a context shift keeps
    /// after the BOS (-1: the whole prompt; `None`: 0).
    pub n_keep: Option<i64>,
    /// The context this request may fill when less than `--ctx` (Ollama's `num_ctx` on a
    /// server with `--context-shift`; without it, `num_ctx` bounds `max_tokens`).
    pub n_ctx: Option<usize>,
    /// llama.cpp's `lora`: `[{"id", "scale"}]`, the request's adapters (the others at
    /// scale 0; [`lora_list`] reads it against the loaded adapters). `None`: the server's
    /// current scales.
    pub lora: Option<Value>,
}

/// Reads a `[{"id": N, "scale": S}]` list (a request's `lora`, `POST /lora-adapters`) for
/// `n` loaded adapters: each id once, each scale a finite number.
///
/// Errors: a 400 naming `field` for any other shape, an id that is not loaded, an id
/// given twice.
pub fn lora_list(v: &Value, n: usize, field: &'static str) -> Result<Vec<(usize, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid(Some(field), m);
    let items = v.as_array().ok_or_else(|| {
        bad(format!(
            "'{field}' must be an array of {{\"id\", \"scale\"}}"
        ))
    })?;
    let mut out: Vec<(usize, f32)> = Vec::with_capacity(items.len());
    for item in items {
        let id = item
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(format!("'{field}' entries need an integer \"id\"")))?;
        let scale = match item.get("scale") {
            None => 1.0,
            Some(s) => s.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                bad(format!(
                    "'{field}': the scale of adapter {id} must be a number"
                ))
            })?,
        };
        let id = usize::try_from(id).ok().filter(|&i| i < n).ok_or_else(|| {
            bad(format!(
                "'{field}': adapter {id} is not loaded ({n} adapters: ids 0..{n})"
            ))
        })?;
        if out.iter().any(|&(i, _)| i == id) {
            return Err(bad(format!("'{field}': adapter {id} is given twice")));
        }
        out.push((id, scale as f32));
    }
    Ok(out)
}

/// Reads `logit_bias`: OpenAI's object of token id (a decimal string) → bias in -100..=100,
/// or llama.cpp's array of `[id, bias]` pairs where `bias` may be `false` (a ban). Each
/// bias passes through [`ban_bias`](frink_engine::sampling::ban_bias) (-100 bans).
///
/// Errors: a key that is not a token id of the vocabulary (`n_vocab` tokens), a bias that
/// is not a number in range, any other shape.
pub fn logit_bias(obj: &Map<String, Value>, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid(Some("logit_bias"), m);
    let id_of = |k: &str| -> Result<u32, ApiError> {
        k.trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < n_vocab)
            .ok_or_else(|| {
                bad(format!(
                    "'logit_bias' keys must be token ids below the vocabulary size {n_vocab}, got {k:?}"
                ))
            })
    };
    let bias_of = |v: &Value| -> Result<f32, ApiError> {
        match v {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            v => v
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .map(|b| frink_engine::sampling::ban_bias(b as f32))
                .ok_or_else(|| {
                    bad(format!(
                        "'logit_bias' values must be numbers between -100 and 100, got {v}"
                    ))
                }),
        }
    };
    match field(obj, "logit_bias") {
        None => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| Ok((id_of(k)?, bias_of(v)?)))
            .collect(),
        Some(Value::Array(pairs)) => pairs
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([id, b]) if id.is_u64() => Ok((id_of(&id.to_string())?, bias_of(b)?)),
                _ => Err(bad(format!(
                    "'logit_bias' as an array must hold [token id, bias] pairs, got {p}"
                ))),
            })
            .collect(),
        Some(v) => Err(bad(format!(
            "'logit_bias' must be an object of token id -> bias, got {v}"
        ))),
    }
}

/// Reads the options shared by `/v1/chat/completions` and `/v1/completions` within `limits`
/// (the model's vocabulary, the choices one request may ask for: `--parallel`), after
/// refusing the fields frink cannot honour there
/// ([`refuse_unsupported`]). `n` is checked first of all, before anything is built per
/// choice (a huge `n` once allocated before it was refused).
pub fn gen_options(
    obj: &Map<String, Value>,
    ep: Endpoint,
    limits: request::Limits,
) -> Result<GenOptions, ApiError> {
    let max_choices = limits.max_choices;
    let n = match opt_i64(obj, "n")? {
        None => 1,
        Some(n) if n >= 1 && n as u64 <= max_choices as u64 => n as usize,
        Some(n) if n >= 1 => {
            return Err(ApiError::invalid(
                Some("n"),
                format!("'n' is {n}; this server runs at most {max_choices} choices (--parallel)"),
            ))
        }
        Some(n) => {
            return Err(ApiError::invalid(
                Some("n"),
                format!("'n' must be at least 1, got {n}"),
            ))
        }
    };
    refuse_unsupported(obj, ep)?;
    let mut max_tokens;
    // llama.cpp's order: `n_predict` first, `max_tokens` when it is absent. A negative
    // `n_predict` means no limit; 0 evaluates the prompt (and keeps it cached) and
    // generates nothing.
    let n_predict = opt_i64(obj, "n_predict")?;
    max_tokens = n_predict.and_then(|n| usize::try_from(n).ok());
    for name in ["max_tokens", "max_completion_tokens"] {
        let n = match opt_i64(obj, name)? {
            None => continue,
            // llama.cpp's meaning (its `max_tokens` is `n_predict`): no limit but the
            // context.
            Some(-1) => None,
            Some(n) if n >= 1 => Some(n as usize),
            Some(n) => {
                return Err(ApiError::invalid(
                    Some(name),
                    format!("'{name}' must be at least 1 (or -1: no limit), got {n}"),
                ))
            }
        };
        if n_predict.is_none() {
            max_tokens = n;
        }
    }
    let mut p = SamplingParams::default();
    if let Some(t) = opt_f64(obj, "temperature")? {
        if t < 0.0 {
            return Err(ApiError::invalid(
                Some("temperature"),
                format!("'temperature' must be at least 0, got {t}"),
            ));
        }
        p.temperature = t as f32;
    }
    if let Some(v) = ranged(obj, "top_p", 0.0, 1.0)? {
        p.top_p = v;
    }
    if let Some(v) = ranged(obj, "min_p", 0.0, 1.0)? {
        p.min_p = v;
    }
    if let Some(v) = opt_i64(obj, "top_k")? {
        p.top_k = v.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    }
    if let Some(v) = ranged(obj, "presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = v;
    }
    if let Some(v) = ranged(obj, "frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = v;
    }
    if let Some(v) = ranged(obj, "repeat_penalty", 0.0, 100.0)? {
        p.repeat_penalty = v;
    }
    if let Some(n) = opt_i64(obj, "repeat_last_n")? {
        // llama.cpp: -1 is the whole context, 0 turns the penalties off.
        p.repeat_last_n = match n {
            -1 => usize::MAX,
            n if n >= 0 => n as usize,
            n => {
                return Err(ApiError::invalid(
                    Some("repeat_last_n"),
                    format!("'repeat_last_n' must be -1 (the context) or at least 0, got {n}"),
                ))
            }
        };
    }
    p.logit_bias = logit_bias(obj, limits.n_vocab)?;
    p.chain = crate::api::llamacpp::samplers(obj, p.top_k)?;
    p.seed = match opt_i64(obj, "seed")? {
        Some(s) => s as u64,
        None => frink_engine::sampling::random_seed(),
    };
    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    Some("stop"),
                    "'stop' must be a string or an array of strings",
                )
            })?,
        Some(_) => {
            return Err(ApiError::invalid(
                Some("stop"),
                "'stop' must be a string or an array of strings",
            ))
        }
    };
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    Some("stream_options.include_usage"),
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("stream_options"),
                "'stream_options' must be an object",
            ))
        }
    };
    Ok(GenOptions {
        max_tokens,
        sampling: p,
        stop,
        ignore_eos: opt_bool(obj, "ignore_eos")?.unwrap_or(false),
        stream,
        include_usage,
        n,
        limits: crate::api::llamacpp::TextLimits::read(obj)?,
        lora: field(obj, "lora").cloned(),
        n_keep: n_keep(obj)?,
        n_ctx: None,
    })
}

/// llama.cpp's `n_keep`: -1 (the whole prompt) or more.
fn n_keep(obj: &Map<String, Value>) -> Result<Option<i64>, ApiError> {
    match opt_i64(obj, "n_keep")? {
        Some(n) if n < -1 => Err(ApiError::invalid(
            Some("n_keep"),
            format!("'n_keep' must be -1 (the whole prompt) or more, got {n}"),
        )),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_error_names_the_field_as_sent() {
        let e = ApiError::invalid(Some("stop"), "'stop' must be a string; 'stops' is not it")
            .renamed(&[("stop", "stop_sequences"), ("messages", "input")]);
        assert_eq!(e.param.as_deref(), Some("stop_sequences"));
        assert_eq!(
            e.message,
            "'stop_sequences' must be a string; 'stops' is not it"
        );
        let other = ApiError::invalid(Some("n"), "'n' is 5").renamed(&[("stop", "x")]);
        assert_eq!(
            (other.param.as_deref(), other.message.as_str()),
            (Some("n"), "'n' is 5")
        );
    }
}
