//! An Anthropic Messages request read into the OpenAI chat request it means, so that one
//! path ([`crate::requests::prepare_chat_with`]) renders, constrains and tokenizes both.
//!
//! The rules are Anthropic's API reference (Messages, "Create a Message"): `system` is a
//! string or text blocks; a message's `content` a string or blocks (`text`, `tool_use`,
//! `tool_result`, `thinking`, `redacted_thinking`); `tools` carry `input_schema`;
//! `tool_choice` is `auto`, `any`, `tool` (named) or `none`; a conversation that ends with
//! an assistant message is continued from that text ("prefill").

use serde_json::{json, Map, Value};

use crate::api::{self, ApiError};

/// What an Anthropic request asks, in the OpenAI shape frink prepares.
pub(crate) struct Translated {
    /// The OpenAI chat request (`messages`, `tools`, `tool_choice`, `max_tokens`, …).
    pub(crate) chat: Map<String, Value>,
    /// A final assistant message's text, which the answer continues.
    pub(crate) prefill: Option<String>,
    /// `stream`.
    pub(crate) stream: bool,
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), message)
}

/// Whether `v` asks for nothing (absent, null, false, an empty string, array or object):
/// the value an SDK echoes for a feature nobody used.
fn unset(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    }
}

/// Top-level fields and how they are treated: read below (`Read`), no effect on the
/// answer (`Inert`), or refused unless [`unset`] (`Refused`, with why).
enum Treat {
    Read,
    Inert,
    Refused(&'static str),
}

/// Every top-level field of Anthropic's Messages and count-tokens requests; a field not
/// listed is refused by name, as Anthropic refuses it ("Extra inputs are not permitted").
const FIELDS: &[(&str, Treat)] = &[
    ("model", Treat::Read),
    ("messages", Treat::Read),
    ("max_tokens", Treat::Read),
    ("system", Treat::Read),
    ("stop_sequences", Treat::Read),
    ("stream", Treat::Read),
    ("temperature", Treat::Read),
    ("top_p", Treat::Read),
    ("top_k", Treat::Read),
    ("tools", Treat::Read),
    ("tool_choice", Treat::Read),
    ("thinking", Treat::Read),
    ("output_config", Treat::Read),
    ("output_format", Treat::Read),
    // Identify the end user; prompt caching here is automatic; capacity, region and
    // speed tiers are Anthropic's infrastructure.
    ("metadata", Treat::Inert),
    ("cache_control", Treat::Inert),
    ("service_tier", Treat::Inert),
    ("inference_geo", Treat::Inert),
    ("speed", Treat::Inert),
    ("diagnostics", Treat::Inert),
    ("user_profile_id", Treat::Inert),
    ("workspace_id", Treat::Inert),
    (
        "container",
        Treat::Refused("code-execution containers are Anthropic's server tools"),
    ),
    (
        "mcp_servers",
        Treat::Refused("remote MCP servers are not called by frink; pass their tools in 'tools'"),
    ),
    (
        "context_management",
        Treat::Refused("context editing is not implemented"),
    ),
];

/// Refuses fields frink does not know or cannot honour (see [`FIELDS`]).
fn check_fields(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for (k, v) in obj {
        match FIELDS.iter().find(|(name, _)| name == k) {
            Some((_, Treat::Read | Treat::Inert)) => {}
            Some((_, Treat::Refused(why))) if !unset(Some(v)) => {
                return Err(bad(k, format!("'{k}': {why}")).with_code("unsupported_field"))
            }
            Some(_) => {}
            None if unset(Some(v)) => {}
            None => {
                return Err(bad(
                    k,
                    format!("'{k}' is not a field of the Messages API frink implements"),
                )
                .with_code("unsupported_field"))
            }
        }
    }
    Ok(())
}

/// Text of a `text` block list (or a string): `system`, a tool result's content. Any
/// other block is refused, naming `at`.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                parts.push(text_block(b, &format!("{at}[{i}]"))?);
            }
            Ok(parts.join("\n"))
        }
        _ => Err(bad(at, format!("'{at}' must be a string or text blocks"))),
    }
}

/// The text of one `text` block; an `image` here (a tool result's, a system prompt's) or a
/// `document` is refused, as is any other type, and so are citations.
fn text_block(b: &Value, at: &str) -> Result<String, ApiError> {
    let ty = b.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "text" => {
            if !unset(b.get("citations")) {
                return Err(bad(at, format!("'{at}.citations' are not implemented")));
            }
            b.get("text")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(at, format!("'{at}.text' must be a string")))
        }
        "image" | "document" | "search_result" => Err(bad(
            at,
            format!("'{at}': {ty} blocks are not supported here (images go in a user message's content)"),
        )
        .with_code("unsupported_field")),
        _ => Err(bad(
            at,
            format!("'{at}': a block of type {ty:?} cannot be here"),
        )),
    }
}

/// A user's `image` block as an OpenAI `image_url` part: a `base64` source as a data URI,
/// a `url` source as its URL (fetched only with `--allow-image-urls`); a `file` source is
/// refused (frink has no Files API).
fn image_block(b: &Value, at: &str) -> Result<Value, ApiError> {
    let src = b.get("source").unwrap_or(&Value::Null);
    let field = |k: &str| src.get(k).and_then(Value::as_str);
    let url = match field("type") {
        Some("base64") => match (field("media_type"), field("data")) {
            (Some(m), Some(d)) => format!("data:{m};base64,{d}"),
            _ => {
                return Err(bad(
                    at,
                    format!("'{at}.source' needs media_type and data strings"),
                ))
            }
        },
        Some("url") => field("url")
            .ok_or_else(|| bad(at, format!("'{at}.source.url' must be a string")))?
            .to_string(),
        t => {
            return Err(bad(
                at,
                format!("'{at}.source.type' {t:?}: frink takes base64 and url images"),
            )
            .with_code("unsupported_field"))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// One Anthropic message as the OpenAI messages it means, appended to `out`: a user's
/// `tool_result` blocks become `tool` messages (before the user's text), an assistant's
/// `tool_use` blocks its `tool_calls`, its `thinking` its `reasoning_content`.
fn message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
    if role != "user" && role != "assistant" {
        return Err(bad(
            "messages",
            format!("'{at}.role' must be \"user\" or \"assistant\", got {role:?}"),
        ));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(bad(
                "messages",
                format!("'{at}.content' must be a string or an array of blocks"),
            ))
        }
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut thinking = String::new();
    for (k, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{k}]");
        match (role, b.get("type").and_then(Value::as_str).unwrap_or("")) {
            ("user", "tool_result") => {
                let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                let mut content = text_of(b.get("content").unwrap_or(&Value::Null), &at)?;
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    // Anthropic's flag, said in words to a model that reads only text.
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("assistant", "tool_use") => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let input = b.get("input").cloned().unwrap_or(json!({}));
                calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(json!(format!("toolu_{i}_{k}"))),
                    "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            ("assistant", "thinking") => {
                if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                    thinking.push_str(t);
                }
            }
            // Claude's encrypted reasoning: nothing a local model can read.
            ("assistant", "redacted_thinking") => {}
            ("user", "image") => text.push(image_block(b, &at)?),
            _ => text.push(json!({"type": "text", "text": text_block(b, &at)?})),
        }
    }
    if role == "user" && text.is_empty() {
        return Ok(());
    }
    let mut msg = json!({"role": role, "content": text});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    if !thinking.is_empty() {
        msg["reasoning_content"] = json!(thinking);
    }
    out.push(msg);
    Ok(())
}

/// `tools`: custom tools (`name`, `description`, `input_schema`) as OpenAI functions;
/// Anthropic's server tools (a `type` other than `custom`) are refused.
fn tools(v: &Value) -> Result<Value, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("tools", "'tools' must be an array"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("custom");
        if ty != "custom" {
            return Err(bad(
                "tools",
                format!("tools[{i}]: {ty:?} is one of Anthropic's server tools; frink calls only custom tools"),
            )
            .with_code("unsupported_field"));
        }
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("tools", format!("tools[{i}].name must be a string")))?;
        let mut f = json!({"name": name, "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` as OpenAI's (`any` is `required`), and whether parallel calls are allowed
/// (`disable_parallel_tool_use`).
fn tool_choice(v: &Value) -> Result<(Value, bool), ApiError> {
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
    let parallel = v.get("disable_parallel_tool_use").and_then(Value::as_bool) != Some(true);
    let choice = match ty {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => match v.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(bad(
                    "tool_choice",
                    "'tool_choice' of type tool needs a 'name'",
                ))
            }
        },
        _ => {
            return Err(bad(
                "tool_choice",
                format!("'tool_choice.type' must be auto, any, tool or none, got {ty:?}"),
            ))
        }
    };
    Ok((choice, parallel))
}

/// `output_config.format` (or the older `output_format`): `{"type": "json_schema",
/// "schema": …}` as OpenAI's `response_format`.
fn output_format(v: &Value, at: &str) -> Result<Option<Value>, ApiError> {
    if unset(Some(v)) {
        return Ok(None);
    }
    match (v.get("type").and_then(Value::as_str), v.get("schema")) {
        (Some("json_schema"), Some(schema)) => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }))),
        _ => Err(bad(
            at,
            format!("'{at}' must be {{\"type\": \"json_schema\", \"schema\": …}}"),
        )),
    }
}

/// `thinking` (`enabled` with a budget, `adaptive`, `disabled`) as the template variable
/// the Ollama side sets for the same ask, `enable_thinking`. `budget_tokens` is a target in Anthropic's API too ("Claude
/// may not use its entire budget"); `max_tokens` bounds the whole answer.
fn thinking(obj: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = Map::new();
    if let Some(t) = obj.get("thinking").filter(|t| !t.is_null()) {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => {
                kwargs.insert("enable_thinking".into(), json!(true));
            }
            Some("disabled") => {
                kwargs.insert("enable_thinking".into(), json!(false));
            }
            other => {
                return Err(bad(
                    "thinking",
                    format!("'thinking.type' must be enabled, adaptive or disabled, got {other:?}"),
                ))
            }
        }
    }
    Ok(kwargs)
}

/// The chat request's fields that Anthropic names otherwise ([`ApiError::renamed`]): an
/// error about one of them names the field the client sent.
pub(crate) const CHAT_NAMES: &[(&str, &str)] = &[
    ("stop", "stop_sequences"),
    ("response_format", "output_config.format"),
    ("reasoning_effort", "output_config.effort"),
    ("chat_template_kwargs", "thinking"),
];

/// Reads an Anthropic request into the OpenAI chat request it means. `count_only`: a
/// count-tokens request (no `max_tokens`, nothing generated).
///
/// Errors: a 400 naming the field at fault: a missing `max_tokens` or `messages`, a
/// field frink does not implement, blocks it cannot read (images, server tools).
pub(crate) fn translate(
    obj: &Map<String, Value>,
    count_only: bool,
) -> Result<Translated, ApiError> {
    check_fields(obj)?;
    let mut chat = Map::new();
    if let Some(m) = obj.get("model") {
        chat.insert("model".into(), m.clone());
    }
    if !count_only {
        match api::opt_i64(obj, "max_tokens")? {
            Some(n) if n >= 1 => {
                chat.insert("max_tokens".into(), json!(n));
            }
            Some(n) => {
                return Err(bad(
                    "max_tokens",
                    format!("'max_tokens' must be at least 1, got {n}"),
                ))
            }
            None => return Err(bad("max_tokens", "'max_tokens' is required")),
        }
    }
    for name in ["temperature", "top_p", "top_k"] {
        if let Some(v) = obj.get(name).filter(|v| !v.is_null()) {
            chat.insert(name.into(), v.clone());
        }
    }
    if let Some(stops) = obj.get("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stops.clone());
    }
    let mut messages = Vec::new();
    if let Some(s) = obj.get("system").filter(|s| !unset(Some(s))) {
        messages.push(json!({"role": "system", "content": text_of(s, "system")?}));
    }
    let list = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("messages", "'messages' must not be empty")),
        Some(_) => return Err(bad("messages", "'messages' must be an array")),
        None => return Err(bad("messages", "'messages' is required")),
    };
    for (i, m) in list.iter().enumerate() {
        message(i, m, &mut messages)?;
    }
    // A final assistant message is the start of the answer.
    let prefill = match messages.last() {
        Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_none() => {
            let text: String = m["content"]
                .as_array()
                .map(|parts| parts.iter().filter_map(|p| p["text"].as_str()).collect())
                .or_else(|| m["content"].as_str().map(str::to_string))
                .unwrap_or_default();
            messages.pop();
            // Anthropic: trailing whitespace of a prefill is an error; kept here as given.
            Some(text)
        }
        _ => None,
    };
    if !messages.iter().any(|m| m["role"] != "system") {
        return Err(bad(
            "messages",
            "'messages' holds no user turn to answer (its content is empty, or it is only an assistant prefill)",
        ));
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(t) = obj.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), tools(t)?);
    }
    if let Some(c) = obj.get("tool_choice").filter(|c| !c.is_null()) {
        let (choice, parallel) = tool_choice(c)?;
        chat.insert("tool_choice".into(), choice);
        chat.insert("parallel_tool_calls".into(), json!(parallel));
    }
    let format = match (
        obj.get("output_config").and_then(|c| c.get("format")),
        obj.get("output_format"),
    ) {
        (Some(f), _) if !unset(Some(f)) => output_format(f, "output_config.format")?,
        (_, Some(f)) => output_format(f, "output_format")?,
        _ => None,
    };
    if let Some(f) = format {
        chat.insert("response_format".into(), f);
    }
    let kwargs = thinking(obj)?;
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    // The template's variable, checked where every API's effort is.
    if let Some(effort) = obj
        .get("output_config")
        .and_then(|c| c.get("effort"))
        .filter(|e| !e.is_null())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    Ok(Translated {
        chat,
        prefill,
        stream: api::opt_bool(obj, "stream")?.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_tool_loop_reads_as_openai_messages() {
        let t = translate(
            &obj(json!({
                "model": "m", "max_tokens": 32, "system": [{"type": "text", "text": "Be brief."}],
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "Call it.", "signature": ""},
                        {"type": "text", "text": "Checking.", "citations": null},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": true}]},
                ],
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "stop_sequences": ["END"], "metadata": {"user_id": "u"},
            })),
            false,
        )
        .unwrap();
        let m = t.chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(m[2]["reasoning_content"], "Call it.");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(m[4]["content"], "Error: down");
        assert_eq!(m.len(), 5);
        assert_eq!(t.chat["tool_choice"], "required");
        assert_eq!(t.chat["parallel_tool_calls"], false);
        assert_eq!(t.chat["stop"], json!(["END"]));
        assert_eq!(t.prefill, None);
    }

    #[test]
    fn a_final_assistant_message_is_a_prefill() {
        let t = translate(
            &obj(json!({"max_tokens": 8, "messages": [
                {"role": "user", "content": "Pick (A) or (B)."},
                {"role": "assistant", "content": "The answer is ("}]})),
            false,
        )
        .unwrap();
        assert_eq!(t.prefill.as_deref(), Some("The answer is ("));
        assert_eq!(t.chat["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut o = obj(base.clone());
            o.insert(k.into(), v);
            translate(&o, false).err().and_then(|e| e.param)
        };
        assert_eq!(
            with("mcp_servers", json!([{"url": "x"}])).as_deref(),
            Some("mcp_servers")
        );
        assert_eq!(with("frobnicate", json!(1)).as_deref(), Some("frobnicate"));
        assert_eq!(
            with(
                "tools",
                json!([{"type": "web_search_20250305", "name": "web_search"}])
            )
            .as_deref(),
            Some("tools")
        );
        assert_eq!(
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}])
            )
            .as_deref(),
            Some("messages[0].content[0]")
        );
        // What an SDK echoes for unused features is accepted.
        assert_eq!(with("mcp_servers", json!([])), None);
        assert_eq!(with("container", Value::Null), None);
        assert_eq!(with("metadata", json!({"user_id": "u"})), None);
        let mut o = obj(base);
        o.remove("max_tokens");
        assert_eq!(
            translate(&o, false).err().and_then(|e| e.param).as_deref(),
            Some("max_tokens")
        );
        assert!(translate(&o, true).is_ok());
    }
}
