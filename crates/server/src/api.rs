//! Request parsing and OpenAI-shaped errors.
//!
//! Bodies are parsed as JSON values and the known fields read one by one, so a wrong type
//! names its field (`param`) and unknown fields are ignored.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use frink_engine::sampling::SamplingParams;
use serde_json::{json, Map, Value};

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
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
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
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
}

/// Reads the options shared by `/v1/chat/completions` and `/v1/completions`.
pub fn gen_options(obj: &Map<String, Value>) -> Result<GenOptions, ApiError> {
    let mut max_tokens = None;
    for name in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = opt_i64(obj, name)? {
            if n <= 0 {
                return Err(ApiError::invalid(
                    Some(name),
                    format!("'{name}' must be at least 1, got {n}"),
                ));
            }
            max_tokens = Some(n as usize);
        }
    }
    if max_tokens.is_none() {
        // llama.cpp's n_predict: a negative value means no limit.
        if let Some(n) = opt_i64(obj, "n_predict")? {
            if n == 0 {
                return Err(ApiError::invalid(
                    Some("n_predict"),
                    "'n_predict' must not be 0",
                ));
            }
            max_tokens = usize::try_from(n).ok();
        }
    }
    if let Some(n) = opt_i64(obj, "n")? {
        if n != 1 {
            return Err(ApiError::invalid(Some("n"), "only n = 1 is supported"));
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
    })
}

/// `messages` of a chat request as (role, text) pairs; content may be a string or an array
/// of `{"type": "text", "text": …}` parts.
pub fn messages(obj: &Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    let bad = |m: &str| ApiError::invalid(Some("messages"), m.to_string());
    let list = match field(obj, "messages") {
        None => return Err(bad("'messages' is required")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("'messages' must be an array")),
    };
    if list.is_empty() {
        return Err(bad("'messages' must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let m = m
                .as_object()
                .ok_or_else(|| bad(&format!("messages[{i}] must be an object")))?;
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("messages[{i}].role must be a string")))?;
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut s = String::new();
                    for part in parts {
                        match part.get("text").and_then(Value::as_str) {
                            Some(t) => s.push_str(t),
                            None => {
                                return Err(bad(&format!(
                                    "messages[{i}].content parts must be text parts"
                                )))
                            }
                        }
                    }
                    s
                }
                Some(_) => {
                    return Err(bad(&format!(
                        "messages[{i}].content must be a string or an array of parts"
                    )))
                }
            };
            Ok((role.to_string(), content))
        })
        .collect()
}

/// The `prompt` of a completion request: a string (or an array holding one), or token ids.
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

/// Reads `prompt`.
pub fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = |m: &str| ApiError::invalid(Some("prompt"), m.to_string());
    match field(obj, "prompt") {
        None => Err(bad("'prompt' is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => Ok(Prompt::Ids(
            a.iter()
                .map(|v| v.as_u64().unwrap_or_default().min(u32::MAX as u64) as u32)
                .collect(),
        )),
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(Value::is_string) => {
            Err(bad("only one prompt per request is supported"))
        }
        Some(_) => Err(bad(
            "'prompt' must be a string, an array of one string, or an array of token ids",
        )),
    }
}
