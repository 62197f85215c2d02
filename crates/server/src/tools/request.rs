//! A request's tools and tool history: `tools` and `tool_choice` checked, calls in the
//! history shaped as the templates read them, Gemma 4's tool responses, OpenAI's
//! `tool_calls` entries of an answer.

use frink_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use super::format::ToolFormat;
use crate::calls::ToolCall;

/// OpenAI's `tool_calls` entry for call `index` of a response whose id is `response_id`.
pub fn call_json(response_id: &str, index: usize, c: &ToolCall) -> Value {
    json!({
        "id": format!("call_{response_id}_{index}"),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// An OpenAI `tool_calls` history entry as the templates read it: `function.arguments`
/// parsed from its JSON string into an object (transformers' templates `tojson` it; a
/// string that is not JSON stays a string).
pub fn history_call(call: &Value) -> Value {
    let mut c = call.clone();
    if let Some(Value::String(s)) = c.pointer("/function/arguments") {
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
            c["function"]["arguments"] = v;
        }
    }
    c
}

/// The `tools` a request may use under its `tool_choice`: `None` for `"none"` (the template
/// still sees the tools, as OpenAI's models do), all of them for `"auto"`/`"required"`, the
/// named one for `{"type": "function", "function": {"name"}}`. Returns (the tools the answer
/// may call, whether a call is required).
///
/// Errors: a message naming what is wrong (an unknown name, a bad shape).
pub fn choice<'a>(
    tools: &'a [Value],
    tool_choice: Option<&Value>,
) -> Result<(Vec<&'a Value>, bool), String> {
    let by_name = |n: &str| {
        tools
            .iter()
            .find(|t| t["function"]["name"].as_str() == Some(n))
    };
    match tool_choice {
        None | Some(Value::Null) => Ok((tools.iter().collect(), false)),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok((tools.iter().collect(), false)),
            "none" => Ok((Vec::new(), false)),
            "required" => Ok((tools.iter().collect(), true)),
            other => Err(format!(
                "'tool_choice' must be \"none\", \"auto\", \"required\" or a function, got \"{other}\""
            )),
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": …}}")?;
            let t = by_name(name).ok_or_else(|| format!("'tool_choice' names {name:?}, which is not in 'tools'"))?;
            Ok((vec![t], true))
        }
        Some(_) => Err("'tool_choice' must be a string or an object".into()),
    }
}

/// Checks `tools`: an array of `{"type": "function", "function": {"name", …}}`, each
/// name not empty, `parameters` (where given) a schema object.
pub fn check_tools(v: &Value) -> Result<Vec<Value>, String> {
    let a = v.as_array().ok_or("'tools' must be an array")?;
    for (i, t) in a.iter().enumerate() {
        let ok = t.get("type").and_then(Value::as_str) == Some("function")
            && t.pointer("/function/name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
            && t.pointer("/function/parameters")
                .is_none_or(|p| p.is_null() || p.is_object());
        if !ok {
            return Err(format!(
                "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …, \"parameters\": …}}}}"
            ));
        }
    }
    Ok(a.clone())
}

/// Whether `template` is a Gemma 4 template that reads a call's results only as Gemma's
/// `tool_responses` on the model's turn (its earlier versions; the current one also reads
/// OpenAI's `tool` messages, and says so in a comment naming "OpenAI Chat Completions", the
/// text llama.cpp's `common/chat.cpp` tells the two apart by). `format` is what
/// [`ToolFormat::detect`] found in `template`.
pub fn wants_tool_responses(format: Option<ToolFormat>, template: &str) -> bool {
    format == Some(ToolFormat::Gemma4) && !template.contains("OpenAI Chat Completions")
}

/// An OpenAI tool-calling history in Gemma 4's own form ([`wants_tool_responses`]): an
/// assistant message with `tool_calls` takes the `tool` messages after it as its
/// `tool_responses` (`{"name", "response"}`: the name of the call at the same position,
/// else the message's `tool_call_id`; the content parsed as JSON where it is JSON, else
/// the text), and the assistant's answer right after them joins the same turn, as the
/// model saw calls, results and answer in one turn (Google's Gemma 4 prompt format;
/// llama.cpp converts the same way in `common/parsers/gemma4.cpp`). Other messages pass
/// unchanged.
pub fn gemma4_tool_responses(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len());
    let mut it = messages.into_iter().peekable();
    let calls_of = |m: &ChatMessage| {
        m.extra
            .get("tool_calls")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
            .cloned()
    };
    while let Some(mut m) = it.next() {
        let Some(calls) = calls_of(&m).filter(|_| m.role == "assistant") else {
            out.push(m);
            continue;
        };
        let mut responses = Vec::new();
        while let Some(r) = it.next_if(|r| r.role == "tool") {
            let name = calls
                .get(responses.len())
                .and_then(|c| c.pointer("/function/name"))
                .or_else(|| r.extra.get("tool_call_id"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let response = serde_json::from_str::<Value>(&r.content)
                .unwrap_or_else(|_| Value::String(r.content.clone()));
            responses.push(json!({"name": name, "response": response}));
        }
        if !responses.is_empty() {
            m.extra
                .insert("tool_responses".into(), Value::Array(responses));
            if let Some(next) = it.next_if(|n| {
                n.role == "assistant" && calls_of(n).is_none() && !n.content.is_empty()
            }) {
                if !m.content.is_empty() {
                    m.content.push_str("\n\n");
                }
                m.content.push_str(&next.content);
            }
        }
        out.push(m);
    }
    out
}

/// `extra` fields of a message for the template, from an OpenAI message object.
pub fn message_extra(m: &Map<String, Value>) -> Map<String, Value> {
    let mut extra = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "role" | "content" => {}
            "tool_calls" => {
                let calls: Vec<Value> = v
                    .as_array()
                    .map(|a| a.iter().map(history_call).collect())
                    .unwrap_or_default();
                extra.insert(k.clone(), Value::Array(calls));
            }
            _ => {
                extra.insert(k.clone(), v.clone());
            }
        }
    }
    extra
}
