//! Reading call bodies: JSON call objects (or arrays of them), Qwen3-Coder's XML, Gemma 4's
//! argument syntax, and the generic JSON fallback.

use serde_json::{Map, Value};

use crate::calls::{ToolCall, ToolSet};

/// Gemma 4's string delimiter (both ends), in calls and tool declarations.
pub(super) const GEMMA4_QUOTE: &str = "<|\"|>";

/// Parses one value of Gemma 4's argument syntax (its template's `format_argument`):
/// `<|"|>text<|"|>` strings, `{key:value,…}` with bare (or quoted) keys, `[value,…]`,
/// and JSON's numbers, `true`, `false` and `null`; whitespace around them is skipped.
/// Returns the value as JSON and the text after it, or `None` where the text is not
/// one (llama.cpp reads the same syntax in `common/chat-peg-parser.cpp`'s Gemma 4 rules).
pub fn gemma4_value(text: &str) -> Option<(Value, &str)> {
    let t = text.trim_start();
    if let Some(r) = t.strip_prefix(GEMMA4_QUOTE) {
        let end = r.find(GEMMA4_QUOTE)?;
        return Some((Value::from(&r[..end]), &r[end + GEMMA4_QUOTE.len()..]));
    }
    // Items of a dict or a list up to `close`, each read by `item`.
    fn items<'a>(
        mut r: &'a str,
        close: char,
        mut item: impl FnMut(&'a str) -> Option<&'a str>,
    ) -> Option<&'a str> {
        r = r.trim_start();
        if let Some(rest) = r.strip_prefix(close) {
            return Some(rest);
        }
        loop {
            r = item(r)?.trim_start();
            if let Some(rest) = r.strip_prefix(',') {
                r = rest;
            } else {
                return r.strip_prefix(close);
            }
        }
    }
    if let Some(r) = t.strip_prefix('{') {
        let mut map = Map::new();
        let rest = items(r, '}', |r| {
            let r = r.trim_start();
            let (key, r) = match r.strip_prefix(GEMMA4_QUOTE) {
                Some(q) => {
                    let end = q.find(GEMMA4_QUOTE)?;
                    (
                        &q[..end],
                        q[end + GEMMA4_QUOTE.len()..]
                            .trim_start()
                            .strip_prefix(':')?,
                    )
                }
                None => {
                    let (key, r) = r.split_once(':')?;
                    if key.is_empty() || key.contains(['{', '}', ',']) {
                        return None;
                    }
                    (key.trim(), r)
                }
            };
            let (v, r) = gemma4_value(r)?;
            map.insert(key.to_string(), v);
            Some(r)
        })?;
        return Some((Value::Object(map), rest));
    }
    if let Some(r) = t.strip_prefix('[') {
        let mut list = Vec::new();
        let rest = items(r, ']', |r| {
            let (v, r) = gemma4_value(r)?;
            list.push(v);
            Some(r)
        })?;
        return Some((Value::Array(list), rest));
    }
    // A scalar runs to the next delimiter.
    let end = t.find([',', '}', ']']).unwrap_or(t.len());
    let v: Value = serde_json::from_str(t[..end].trim()).ok()?;
    (!v.is_object() && !v.is_array() && !v.is_string()).then_some((v, &t[end..]))
}

/// Parses a call object: a JSON object with a string `name` and `arguments` (or
/// `parameters`: an object, or a string holding JSON, as some models write it).
pub(super) fn parse_call_value(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok()?;
            s.clone()
        }
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// Parses a call body holding one call object.
pub(super) fn parse_call(body: &str) -> Option<ToolCall> {
    parse_call_value(&serde_json::from_str(body.trim()).ok()?)
}

/// One call object or a non-empty array of them.
pub(super) fn json_calls(body: &str) -> Option<Vec<ToolCall>> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    match &v {
        Value::Array(a) if !a.is_empty() => a.iter().map(parse_call_value).collect(),
        Value::Object(_) => Some(vec![parse_call_value(&v)?]),
        _ => None,
    }
}

/// Qwen3-Coder's `<function=f>\n<parameter=p>\nvalue\n</parameter>\n…</function>`: each
/// value without its surrounding newline; a parameter the tool declares as a string stays
/// a string, any other value is read as JSON if it parses (else kept as a string), as
/// Qwen3-Coder's own parser does.
pub(super) fn parse_xml(body: &str, tools: &ToolSet) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let inner_end = rest.rfind("</function>")?;
    rest = &rest[..inner_end];
    let mut args = Map::new();
    while let Some(start) = rest.find("<parameter=") {
        let after = &rest[start + "<parameter=".len()..];
        let (param, after) = after.split_once('>')?;
        let end = after.find("</parameter>")?;
        let raw = &after[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let string = tools
            .param(name, param)
            .is_some_and(|s| s["type"] == "string");
        let value = match serde_json::from_str::<Value>(raw) {
            Ok(v) if !string => v,
            _ => Value::String(raw.to_string()),
        };
        args.insert(param.to_string(), value);
        rest = &after[end + "</parameter>".len()..];
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// The generic JSON fallback: an answer that is, as a whole (optionally in a ```json
/// fence), a call object `{"name": <one of the tools>, "arguments": {…}}` or an array of
/// them. Small models asked for tools often answer so instead of in their template's
/// format.
pub(super) fn json_fallback(text: &str, tools: &ToolSet) -> Option<Vec<ToolCall>> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|r| r.trim_end().strip_suffix("```"))
        .unwrap_or(t);
    let calls = json_calls(t)?;
    calls.iter().all(|c| tools.has(&c.name)).then_some(calls)
}
