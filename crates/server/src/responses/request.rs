//! A Responses API request read into the OpenAI chat request it means (OpenAI's API
//! reference, "Responses": `input` as a string or items, `instructions`, flat function
//! tools, `text.format`, `reasoning.effort`, `previous_response_id`), so that one path
//! ([`crate::requests::prepare_chat`]) renders, constrains and tokenizes it.

use serde_json::{json, Map, Value};

use crate::api::{self, ApiError};

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), message)
}

fn unset(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// What a request asks beyond the chat request, echoed in the response.
pub(crate) struct Asked {
    /// The chat request (`messages` holds the whole conversation: instructions, the
    /// previous response's, this input).
    pub(crate) chat: Map<String, Value>,
    /// The conversation to store with the answer: the previous response's and this
    /// input's messages (instructions are not carried over, as OpenAI's rule is).
    pub(crate) conversation: Vec<Value>,
    /// `stream`.
    pub(crate) stream: bool,
    /// `store` (default true).
    pub(crate) store: bool,
    /// Return the reasoning in `encrypted_content` too (`include:
    /// ["reasoning.encrypted_content"]`: frink's is the text itself, read back the same
    /// way when a client sends the item again).
    pub(crate) encrypted_reasoning: bool,
    /// The request's own fields echoed in the response object.
    pub(crate) echo: Map<String, Value>,
}

/// Top-level fields: read, inert (cannot change the answer), or refused unless unset.
const INERT: &[&str] = &[
    "metadata",
    "user",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "stream_options",
];
const READ: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "reasoning",
    "store",
    "previous_response_id",
    "stream",
    "include",
    "truncation",
];
const REFUSED: &[(&str, &str)] = &[
    ("background", "background responses are not implemented"),
    (
        "conversation",
        "conversations are not implemented; chain responses with 'previous_response_id'",
    ),
    ("prompt", "reusable prompts are not implemented"),
    (
        "max_tool_calls",
        "a limit on built-in tool calls is not implemented",
    ),
    (
        "top_logprobs",
        "log-probabilities are not implemented on /v1/responses (use /v1/chat/completions)",
    ),
];

fn check_fields(obj: &Map<String, Value>) -> Result<(), ApiError> {
    // Echoed and stored: held to OpenAI's bounds (at most 16 string pairs, keys of 64
    // characters and values of 512; a user id of 256).
    if let Some(m) = obj.get("metadata").filter(|m| !m.is_null()) {
        let ok = m.as_object().is_some_and(|o| {
            o.len() <= 16
                && o.iter().all(|(k, v)| {
                    k.chars().count() <= 64 && v.as_str().is_some_and(|s| s.chars().count() <= 512)
                })
        });
        if !ok {
            return Err(bad("metadata", "'metadata' must be at most 16 string pairs (keys up to 64 characters, values up to 512)"));
        }
    }
    if let Some(u) = obj.get("user").filter(|u| !u.is_null()) {
        if u.as_str().is_none_or(|s| s.chars().count() > 256) {
            return Err(bad(
                "user",
                "'user' must be a string of at most 256 characters",
            ));
        }
    }
    for (k, v) in obj {
        if READ.contains(&k.as_str()) || INERT.contains(&k.as_str()) {
            continue;
        }
        if unset(v) || (k == "top_logprobs" && v == &json!(0)) {
            continue;
        }
        let why = REFUSED.iter().find(|(name, _)| name == k).map_or(
            "it is not a field of the Responses API frink implements",
            |(_, w)| w,
        );
        return Err(bad(k, format!("'{k}': {why}")).with_code("unsupported_field"));
    }
    Ok(())
}

/// A message's `content` holding `input_image` parts, as OpenAI chat parts (text parts and
/// `image_url` parts); `None` without images.
fn content_images(v: &Value, at: &str) -> Result<Option<Value>, ApiError> {
    let Some(parts) = v.as_array() else {
        return Ok(None);
    };
    let is_image = |p: &Value| p.get("type").and_then(Value::as_str) == Some("input_image");
    if !parts.iter().any(is_image) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(parts.len());
    for (k, p) in parts.iter().enumerate() {
        if !is_image(p) {
            let text = content_text(&json!([p]), at)?;
            out.push(json!({"type": "text", "text": text}));
            continue;
        }
        let url = p.get("image_url").and_then(Value::as_str).ok_or_else(|| {
            bad(
                "input",
                format!("'{at}.content[{k}]': an input_image needs an image_url (a file_id is not supported)"),
            )
            .with_code("unsupported_field")
        })?;
        out.push(json!({"type": "image_url", "image_url": {"url": url}}));
    }
    Ok(Some(Value::Array(out)))
}

/// The text of a message's `content`: a string, or `input_text`/`output_text` parts.
fn content_text(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (k, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        s.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                        return Err(bad(
                            "input",
                            format!(
                                "'{at}.content[{k}]': {t} is not supported here (images go in a message's content)"
                            ),
                        )
                        .with_code("unsupported_field"))
                    }
                    t => {
                        return Err(bad(
                            "input",
                            format!("'{at}.content[{k}]': a part of type {t:?} cannot be here"),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(bad(
            "input",
            format!("'{at}.content' must be a string or parts"),
        )),
    }
}

/// `input` items as chat messages, appended to `out`: messages, an assistant's function
/// calls (consecutive ones in one assistant message), their outputs as `tool` messages,
/// reasoning attached to the assistant message that follows it.
fn input_messages(input: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => {
            return Err(bad(
                "input",
                "'input' must be a string or an array of items",
            ))
        }
    };
    let mut reasoning = String::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let ty = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match ty {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                if !["user", "system", "developer", "assistant"].contains(&role) {
                    return Err(bad("input", format!("'{at}.role' must be user, system, developer or assistant, got {role:?}")));
                }
                let content = item.get("content").unwrap_or(&Value::Null);
                let text = match content_images(content, &at)? {
                    Some(parts) => parts,
                    None => json!(content_text(content, &at)?),
                };
                let mut m = json!({"role": role, "content": text});
                if role == "assistant" && !reasoning.is_empty() {
                    m["reasoning_content"] = json!(std::mem::take(&mut reasoning));
                }
                out.push(m);
            }
            "function_call" => {
                let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
                let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                let args = item.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                let call = json!({"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": args}});
                let joins = out.last().is_some_and(|m| {
                    m["role"] == "assistant" && (m.get("tool_calls").is_some() || reasoning.is_empty())
                });
                if joins {
                    let last = out.last_mut().expect("checked");
                    match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    }
                } else {
                    let mut m = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                    if !reasoning.is_empty() {
                        m["reasoning_content"] = json!(std::mem::take(&mut reasoning));
                    }
                    out.push(m);
                }
            }
            "function_call_output" => {
                let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
                let output = content_text(item.get("output").unwrap_or(&Value::Null), &format!("{at}.output"))
                    .map_err(|_| bad("input", format!("'{at}.output' must be a string or input_text parts")))?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                let text_of = |key: &str, kind: &str| -> String {
                    item.get(key)
                        .and_then(Value::as_array)
                        .map(|parts| {
                            parts
                                .iter()
                                .filter(|p| p["type"] == kind)
                                .filter_map(|p| p["text"].as_str())
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let mut text = text_of("content", "reasoning_text");
                if text.is_empty() {
                    text = item
                        .get("encrypted_content")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                }
                reasoning.push_str(&text);
            }
            other => {
                return Err(bad(
                    "input",
                    format!("'{at}': items of type {other:?} are not supported (message, function_call, function_call_output, reasoning)"),
                )
                .with_code("unsupported_field"))
            }
        }
    }
    Ok(())
}

/// Flat function tools as chat tools; built-in tools are refused by name.
fn tools(v: &Value) -> Result<Value, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("tools", "'tools' must be an array"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("");
        if ty != "function" {
            return Err(bad(
                "tools",
                format!("tools[{i}]: {ty:?} is one of OpenAI's built-in tools; frink calls only function tools"),
            )
            .with_code("unsupported_field"));
        }
        if !t.get("name").is_some_and(Value::is_string) {
            return Err(bad(
                "tools",
                format!("tools[{i}].name must be a string (the Responses API's tools are flat: {{\"type\": \"function\", \"name\", \"parameters\"}})"),
            ));
        }
        let mut f = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                f.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `text.format` as `response_format`.
fn text_format(text: &Value) -> Result<Option<Value>, ApiError> {
    if !text
        .get("verbosity")
        .is_none_or(|v| v.is_null() || v == "medium")
    {
        return Err(
            bad("text", "'text.verbosity' is not implemented").with_code("unsupported_field")
        );
    }
    let Some(f) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut js = Map::new();
            js.insert(
                "name".into(),
                f.get("name").cloned().unwrap_or(json!("output")),
            );
            for key in ["schema", "strict", "description"] {
                if let Some(v) = f.get(key).filter(|v| !v.is_null()) {
                    js.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        other => Err(bad(
            "text",
            format!(
                "'text.format.type' must be text, json_object or json_schema, got {}",
                other.unwrap_or("nothing")
            ),
        )),
    }
}

/// The chat request's fields that the Responses API names otherwise
/// ([`ApiError::renamed`]): an error about one of them names the field the client sent.
pub(crate) const CHAT_NAMES: &[(&str, &str)] = &[
    ("messages", "input"),
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("reasoning_effort", "reasoning.effort"),
];

/// Reads a Responses request into the chat request it means; `previous` is the stored
/// conversation of `previous_response_id` (the caller looks it up: a missing one is a
/// 404 there).
///
/// Errors: a 400 naming the field at fault.
pub(crate) fn translate(
    obj: &Map<String, Value>,
    previous: Option<Vec<Value>>,
) -> Result<Asked, ApiError> {
    check_fields(obj)?;
    let mut chat = Map::new();
    let mut echo = Map::new();
    if let Some(m) = obj.get("model") {
        chat.insert("model".into(), m.clone());
    }
    let mut conversation = previous.unwrap_or_default();
    let input = obj
        .get("input")
        .ok_or_else(|| bad("input", "'input' is required"))?;
    input_messages(input, &mut conversation)?;
    if conversation.is_empty() {
        return Err(bad(
            "input",
            "'input' holds no message (and there is no previous response to continue)",
        ));
    }
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instr) = obj.get("instructions").filter(|v| !unset(v)) {
        let text = instr
            .as_str()
            .ok_or_else(|| bad("instructions", "'instructions' must be a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(conversation.iter().cloned());
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(n) = api::opt_i64(obj, "max_output_tokens")? {
        if n < 1 {
            return Err(bad(
                "max_output_tokens",
                format!("'max_output_tokens' must be at least 1, got {n}"),
            ));
        }
        chat.insert("max_tokens".into(), json!(n));
    }
    for name in ["temperature", "top_p", "parallel_tool_calls"] {
        if let Some(v) = obj.get(name).filter(|v| !v.is_null()) {
            chat.insert(name.into(), v.clone());
        }
    }
    if let Some(t) = obj.get("tools").filter(|t| !unset(t)) {
        chat.insert("tools".into(), tools(t)?);
    }
    if let Some(c) = obj.get("tool_choice").filter(|c| !c.is_null()) {
        let choice = match c {
            Value::String(_) => c.clone(),
            Value::Object(o)
                if o.get("type").and_then(Value::as_str) == Some("function")
                    && o.get("name").is_some_and(Value::is_string) =>
            {
                json!({"type": "function", "function": {"name": o["name"]}})
            }
            _ => return Err(bad("tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": …}")),
        };
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(f) = obj
        .get("text")
        .filter(|t| !t.is_null())
        .map(text_format)
        .transpose()?
        .flatten()
    {
        chat.insert("response_format".into(), f);
    }
    if let Some(r) = obj.get("reasoning").filter(|r| !r.is_null()) {
        if !r.is_object() {
            return Err(bad("reasoning", "'reasoning' must be an object"));
        }
        if let Some(e) = r.get("effort").filter(|e| !e.is_null()) {
            chat.insert("reasoning_effort".into(), e.clone());
        }
    }
    match obj.get("truncation").and_then(Value::as_str) {
        None | Some("disabled") => {}
        Some(t) => {
            return Err(bad("truncation", format!("'truncation' {t:?}: frink never drops input; a conversation longer than the context is a 400 (\"disabled\")")).with_code("unsupported_field"))
        }
    }
    let mut encrypted_reasoning = false;
    if let Some(inc) = obj.get("include").filter(|v| !v.is_null()) {
        for v in inc
            .as_array()
            .ok_or_else(|| bad("include", "'include' must be an array"))?
        {
            match v.as_str() {
                Some("reasoning.encrypted_content") => encrypted_reasoning = true,
                other => {
                    return Err(bad(
                        "include",
                        format!(
                            "'include': {} is not implemented (reasoning.encrypted_content is)",
                            other.map_or_else(|| v.to_string(), |o| format!("{o:?}"))
                        ),
                    )
                    .with_code("unsupported_field"))
                }
            }
        }
    }
    for key in [
        "instructions",
        "max_output_tokens",
        "previous_response_id",
        "metadata",
        "user",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "temperature",
        "top_p",
        "parallel_tool_calls",
    ] {
        if let Some(v) = obj.get(key) {
            echo.insert(key.into(), v.clone());
        }
    }
    Ok(Asked {
        chat,
        conversation,
        stream: api::opt_bool(obj, "stream")?.unwrap_or(false),
        store: api::opt_bool(obj, "store")?.unwrap_or(true),
        encrypted_reasoning,
        echo,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_function_call_loop_reads_as_chat_messages() {
        let previous = vec![json!({"role": "user", "content": "Weather in Paris?"})];
        let a = translate(
            &obj(json!({
                "instructions": "Be brief.",
                "input": [
                    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
                    {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
                    {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": "{\"city\":\"Lyon\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
                ],
                "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
                "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
                "max_output_tokens": 64,
            })),
            Some(previous),
        )
        .unwrap();
        let m = a.chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1]["content"], "Weather in Paris?");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[2]["reasoning_content"], "Call it.");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
        );
        assert_eq!(m[4]["content"], "rain");
        // Instructions are not part of what is stored.
        assert_eq!(a.conversation.len(), 4);
        assert_eq!(a.chat["tools"][0]["function"]["name"], "weather");
        assert_eq!(a.chat["response_format"]["json_schema"]["name"], "w");
        assert_eq!(a.chat["max_tokens"], 64);
        assert!(a.store && !a.stream);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let with = |k: &str, v: Value| {
            let mut o = obj(json!({"input": "hi"}));
            o.insert(k.into(), v);
            translate(&o, None).err().and_then(|e| e.param)
        };
        assert_eq!(
            with("background", json!(true)).as_deref(),
            Some("background")
        );
        assert_eq!(
            with("tools", json!([{"type": "web_search"}])).as_deref(),
            Some("tools")
        );
        assert_eq!(
            with("truncation", json!("auto")).as_deref(),
            Some("truncation")
        );
        assert_eq!(
            with("include", json!(["file_search_call.results"])).as_deref(),
            Some("include")
        );
        assert_eq!(with("frobnicate", json!(1)).as_deref(), Some("frobnicate"));
        // The Responses shape of a named function, said in its own words.
        let e = translate(
            &obj(json!({"input": "hi", "tool_choice": {"type": "function"}})),
            None,
        )
        .err();
        assert!(e.is_some_and(
            |e| e.message.contains("\"name\": …}") && !e.message.contains("\"function\": {")
        ));
        assert_eq!(with("reasoning", json!(5)).as_deref(), Some("reasoning"));
        assert_eq!(
            with(
                "input",
                json!([{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])
            )
            .as_deref(),
            Some("input")
        );
        assert_eq!(with("background", json!(false)), None);
        assert_eq!(with("metadata", json!({"k": "v"})), None);
        assert_eq!(
            with("include", json!(["reasoning.encrypted_content"])),
            None
        );
    }
}
