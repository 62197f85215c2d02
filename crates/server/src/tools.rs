//! Tool calls: which format a model's chat template asks the model to write calls in, the
//! parser that turns its output into OpenAI's `tool_calls` (whole or streamed), and the
//! grammar that enforces a call where `tool_choice` requires one.
//!
//! Formats implemented: Hermes (`<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`,
//! what Qwen2.5, Qwen3, Hermes 2/3 and SmolLM3 templates teach; detected by the template
//! text `<tool_call>`) and Llama 3.x JSON (the whole answer `{"name": …, "parameters": {…}}`,
//! what the Llama 3.1/3.2/3.3 templates teach with `"parameters": dictionary of argument
//! name`; the `<|python_tag|>` control token before it is not part of the text). A template without a known format makes a request with tools a 400
//! naming the reason, rather than an answer whose calls are left in the text.

use frink_engine::partial_match_len;
use serde_json::{json, Map, Value};

/// How a model writes tool calls, detected from its chat template (never its file name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, calls one after another.
    Hermes,
    /// The whole answer one call `{"name": "f", "parameters": {…}}` (Llama 3.x).
    Llama3Json,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format `template` teaches the model, if frink knows it.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains(OPEN) {
            Some(ToolFormat::Hermes)
        } else if template.contains("\"parameters\": dictionary of argument name") {
            Some(ToolFormat::Llama3Json)
        } else {
            None
        }
    }

    /// The name frink reports (`frink inspect`).
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes (<tool_call>{\"name\", \"arguments\"}</tool_call>)",
            ToolFormat::Llama3Json => "llama3-json ({\"name\", \"parameters\"})",
        }
    }

    /// A Lark grammar (llguidance's syntax) that admits only calls of `tools` (OpenAI
    /// `{"type": "function", "function": {"name", "parameters"}}` objects), each call's
    /// arguments valid against its parameters' schema; one call, or several with
    /// `parallel`. What `tool_choice: "required"` (all tools) or a named function (that
    /// one) compiles to.
    pub fn call_grammar(self, tools: &[&Value], parallel: bool) -> String {
        let key = match self {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3Json => "parameters",
        };
        let alternatives: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                let params = match f.get("parameters") {
                    Some(p) if p.is_object() => p.clone(),
                    _ => json!({"type": "object"}),
                };
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f["name"]}, key: params},
                    "required": ["name", key],
                    "additionalProperties": false
                })
            })
            .collect();
        let schema = json!({
            "x-guidance": {"whitespace_pattern": frink_engine::constraint::JSON_WHITESPACE},
            "anyOf": alternatives
        });
        match self {
            ToolFormat::Hermes => {
                let repeat = if parallel { "(\"\\n\" call)*" } else { "" };
                format!(
                    "%llguidance {{}}\nstart: call {repeat}\ncall: \"{OPEN}\\n\" body \"\\n{CLOSE}\"\nbody: %json {schema}\n"
                )
            }
            // One call: the Llama 3 templates teach no parallel calls.
            ToolFormat::Llama3Json => {
                format!("%llguidance {{}}\nstart: body\nbody: %json {schema}\n")
            }
        }
    }
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as a JSON text (OpenAI's `function.arguments` is a string).
    pub arguments: String,
}

/// What a piece of output turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// Text for `content`.
    Text(String),
    /// A complete call.
    Call(ToolCall),
}

/// Parses a call body: a JSON object with a string `name` and `arguments` (an object, or a
/// string holding JSON, as some models write it).
fn parse_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
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

/// The generic JSON fallback: an answer that is, as a whole (optionally in a ```json
/// fence), a call object `{"name": <one of the tools>, "arguments": {…}}` or an array of
/// them. Small models asked for tools often answer so instead of in their template's
/// format.
fn json_fallback(text: &str, names: &[String]) -> Option<Vec<ToolCall>> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|r| r.trim_end().strip_suffix("```"))
        .unwrap_or(t);
    let v: Value = serde_json::from_str(t.trim()).ok()?;
    let objects = match &v {
        Value::Array(a) if !a.is_empty() => a.iter().collect(),
        Value::Object(_) => vec![&v],
        _ => return None,
    };
    objects
        .into_iter()
        .map(|o| {
            let c = parse_call(&o.to_string())?;
            names.contains(&c.name).then_some(c)
        })
        .collect()
}

/// Where the parser is.
#[derive(Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet.
    Start,
    /// The answer began with `{` or a fence: held whole for the JSON fallback.
    Json,
    /// Streaming text and tagged calls.
    Tagged,
}

/// Turns a model's output, fed piece by piece, into text and calls: text before, between
/// and after calls is content (held back only while it may be the start of a call tag); a
/// call whose body is not a valid call stays in the content as the model wrote it (never an
/// error). An answer that starts with `{` or a code fence is held to the end, where the
/// JSON fallback may read it as calls (otherwise it is content). The whole output parses
/// the same fed at once or token by token.
#[derive(Debug)]
pub struct StreamParser {
    buf: String,
    in_call: bool,
    mode: Mode,
    /// The tools the answer may call (the fallback accepts only these names).
    names: Vec<String>,
}

impl StreamParser {
    /// A parser for `format` and the tools named `names`.
    pub fn new(format: ToolFormat, names: Vec<String>) -> StreamParser {
        // Both formats parse alike: Hermes tags where they appear, the JSON fallback for a
        // whole-answer call (which is all a Llama 3 call is).
        let (ToolFormat::Hermes | ToolFormat::Llama3Json) = format;
        StreamParser {
            buf: String::new(),
            in_call: false,
            mode: Mode::Start,
            names,
        }
    }

    /// Feeds `text`; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Item> {
        self.buf.push_str(text);
        if self.mode == Mode::Start {
            match self.buf.trim_start().chars().next() {
                None => return Vec::new(),
                Some('{' | '[' | '`') => self.mode = Mode::Json,
                Some(_) => self.mode = Mode::Tagged,
            }
        }
        if self.mode == Mode::Json {
            if !self.buf.contains(OPEN) {
                return Vec::new();
            }
            self.mode = Mode::Tagged;
        }
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body: String = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                out.push(match parse_call(&body) {
                    Some(c) => Item::Call(c),
                    None => Item::Text(format!("{OPEN}{body}{CLOSE}")),
                });
            } else if let Some(start) = self.buf.find(OPEN) {
                let before: String = self.buf[..start].to_string();
                self.buf.drain(..start + OPEN.len());
                self.in_call = true;
                if !before.is_empty() {
                    out.push(Item::Text(before));
                }
            } else {
                let keep = partial_match_len(&self.buf, OPEN);
                let cut = self.buf.len() - keep;
                if cut > 0 {
                    out.push(Item::Text(self.buf[..cut].to_string()));
                    self.buf.drain(..cut);
                }
                break;
            }
        }
        out
    }

    /// The end of the output: held text, or an unterminated call (a call the model ended
    /// without its closing tag counts if its body is a valid call).
    pub fn finish(mut self) -> Vec<Item> {
        let rest = std::mem::take(&mut self.buf);
        if self.mode == Mode::Json {
            if let Some(calls) = json_fallback(&rest, &self.names) {
                return calls.into_iter().map(Item::Call).collect();
            }
        }
        if self.in_call {
            return vec![match parse_call(&rest) {
                Some(c) => Item::Call(c),
                None => Item::Text(format!("{OPEN}{rest}")),
            }];
        }
        if rest.is_empty() {
            Vec::new()
        } else {
            vec![Item::Text(rest)]
        }
    }
}

/// A whole output parsed: its content (text between calls, joined; surrounding whitespace
/// of a reply that has calls trimmed) and its calls.
pub fn parse(format: ToolFormat, names: &[String], text: &str) -> (String, Vec<ToolCall>) {
    let mut p = StreamParser::new(format, names.to_vec());
    let mut items = p.push(text);
    items.extend(p.finish());
    let (mut content, calls) = gather(items);
    if !calls.is_empty() {
        content = content.trim().to_string();
    }
    (content, calls)
}

/// The text of `items` joined, and their calls in order.
fn gather(items: Vec<Item>) -> (String, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    for it in items {
        match it {
            Item::Text(t) => content.push_str(&t),
            Item::Call(c) => calls.push(c),
        }
    }
    (content, calls)
}

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

/// Checks `tools`: an array of `{"type": "function", "function": {"name", …}}`.
pub fn check_tools(v: &Value) -> Result<Vec<Value>, String> {
    let a = v.as_array().ok_or("'tools' must be an array")?;
    for (i, t) in a.iter().enumerate() {
        let ok = t.get("type").and_then(Value::as_str) == Some("function")
            && t.pointer("/function/name")
                .and_then(Value::as_str)
                .is_some();
        if !ok {
            return Err(format!(
                "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …, \"parameters\": …}}}}"
            ));
        }
    }
    Ok(a.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded Qwen2.5-style outputs: text before a call, two calls, malformed JSON, an
    /// unterminated call, arguments as a string.
    #[test]
    fn hermes_outputs_parse_into_content_and_calls() {
        let f = ToolFormat::Hermes;
        let names: Vec<String> = ["get_weather", "a", "b", "x"].map(String::from).to_vec();
        let parse = |f, t: &str| parse(f, &names, t);
        let (c, calls) = parse(
            f,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        );
        assert_eq!(c, "Let me check.");
        assert_eq!(
            calls,
            [ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        let two = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>";
        let (c, calls) = parse(f, two);
        assert_eq!(c, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"x": 1}"#);
        let bad = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call> done";
        assert_eq!(parse(f, bad), (bad.to_string(), vec![]));
        let (_, calls) = parse(
            f,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 2}}",
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(
            parse(f, "no calls <tool"),
            ("no calls <tool".to_string(), vec![])
        );
    }

    /// Split at every byte boundary, the stream gives the same content and calls.
    #[test]
    fn streaming_at_every_boundary_gives_the_whole_parse() {
        let f = ToolFormat::Hermes;
        let text = "Sure: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call> ok";
        let names: Vec<String> = vec!["get_weather".into(), "x".into()];
        let whole = parse(f, &names, text);
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut p = StreamParser::new(f, names.clone());
            let mut items = p.push(&text[..cut]);
            items.extend(p.push(&text[cut..]));
            items.extend(p.finish());
            let (content, calls) = gather(items);
            assert_eq!((content.trim().to_string(), calls), whole, "cut at {cut}");
        }
    }

    /// Llama 3.x: the whole answer a `{"name", "parameters"}` object; its grammar takes the
    /// parameters under that key.
    #[test]
    fn llama3_json_calls_parse_and_their_grammar_uses_parameters() {
        let t = "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}";
        assert_eq!(ToolFormat::detect(t), Some(ToolFormat::Llama3Json));
        assert_eq!(ToolFormat::detect("<tool_call>"), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::detect("{{ messages }}"), None);
        let names = vec!["get_weather".to_string()];
        let (c, calls) = parse(
            ToolFormat::Llama3Json,
            &names,
            r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
        );
        assert_eq!(
            (c.as_str(), calls[0].arguments.as_str()),
            ("", r#"{"city":"Paris"}"#)
        );
        let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        let g = ToolFormat::Llama3Json.call_grammar(&[&tool], true);
        assert!(
            g.contains("\"parameters\"") && !g.contains("tool_call"),
            "{g}"
        );
    }

    #[test]
    fn tool_choice_selects_and_requires() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "a"}}),
            json!({"type": "function", "function": {"name": "b"}}),
        ];
        assert_eq!(choice(&tools, None).unwrap().0.len(), 2);
        assert!(!choice(&tools, Some(&json!("auto"))).unwrap().1);
        assert!(choice(&tools, Some(&json!("none"))).unwrap().0.is_empty());
        assert!(choice(&tools, Some(&json!("required"))).unwrap().1);
        let (t, req) = choice(
            &tools,
            Some(&json!({"type": "function", "function": {"name": "b"}})),
        )
        .unwrap();
        assert!(req && t.len() == 1 && t[0]["function"]["name"] == "b");
        assert!(choice(
            &tools,
            Some(&json!({"type": "function", "function": {"name": "c"}}))
        )
        .is_err());
        assert!(choice(&tools, Some(&json!("maybe"))).is_err());
    }
}
