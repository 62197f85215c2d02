//! Tool calls: which format a model's chat template asks the model to write calls in, the
//! parser that turns its output into OpenAI's `tool_calls` (whole or streamed), and the
//! grammar that enforces a call where `tool_choice` requires one.
//!
//! Formats, each detected from the template text (never the file name) and each read as
//! the template writes an assistant's calls into the history:
//!
//! | format | a call as the model writes it | families |
//! |---|---|---|
//! | `hermes` | `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` | Qwen2.5, Qwen3, Hermes 2/3 |
//! | `qwen3-xml` | `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>` | Qwen3-Coder |
//! | `llama3-json` | the whole answer `{"name": …, "parameters": {…}}`, after `<\|python_tag\|>` or not | Llama 3.1/3.2/3.3 |
//! | `mistral-json` | `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` | Mistral 7B v0.3, Mixtral, Mistral-Nemo |
//! | `granite` | `<\|tool_call\|>[{"name": …, "arguments": {…}}, …]` | Granite 3.x |
//! | `mistral-args` | `[TOOL_CALLS]f[ARGS]{…}` (a `[CALL_ID]id` before `[ARGS]` is read too) | Mistral-Small 3.2, Magistral, Devstral |
//! | `deepseek-r1` | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` | DeepSeek-R1 and its distills, DeepSeek-V3 |
//! | `deepseek-v3.1` | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` | DeepSeek-V3.1 |
//! | `harmony` | `<\|channel\|>commentary to=functions.f <\|constrain\|>json<\|message\|>{…}` ending at `<\|call\|>` | gpt-oss (parsed with its channels in [`crate::harmony`]) |
//! | `gemma4` | `<\|tool_call>call:f{city:<\|"\|>Paris<\|"\|>,days:3}<tool_call\|>` (bare keys, strings between `<\|"\|>` marks) | Gemma 4 |
//!
//! Markers that are control tokens of the vocabulary (`[TOOL_CALLS]`, `[ARGS]`,
//! `<|python_tag|>`, …) render as text for requests with tools ([`ToolFormat::markers`],
//! llama-server's "preserved tokens"), and grammars name them by token id. Every format also
//! takes the generic JSON fallback: an answer that is as a whole a call object (or an array
//! of them) naming one of the tools. A template without a known format makes a request with
//! tools a 400 naming the reason, rather than an answer whose calls are left in the text.

use frink_engine::constraint::Trigger;
use frink_engine::partial_match_len;
use frink_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

/// How a model writes tool calls, detected from its chat template (never its file name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, calls one after another.
    Hermes,
    /// `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>`
    /// (Qwen3-Coder): string values raw, others JSON.
    Qwen3Xml,
    /// The whole answer one call `{"name": "f", "parameters": {…}}` (Llama 3.x), perhaps
    /// after `<|python_tag|>`.
    Llama3Json,
    /// `[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}` (Mistral's v3 tokenizers).
    MistralJson,
    /// `[TOOL_CALLS]f[ARGS]{…}` per call (Mistral's v11 tokenizers).
    MistralArgs,
    /// `<|tool_call|>` and a JSON array of `{"name", "arguments"}` (Granite 3.x).
    Granite,
    /// DeepSeek-R1's markers, the type, the name and a fenced JSON block.
    DeepSeekR1,
    /// DeepSeek-V3.1's markers, the name and the JSON arguments.
    DeepSeekV31,
    /// OpenAI's harmony channels (gpt-oss): a call is a commentary message to `functions.f`.
    Harmony,
    /// `<|tool_call>call:f{key:value,…}<tool_call|>` (Gemma 4): the template's own
    /// argument syntax ([`gemma4_value`]), calls one after another.
    Gemma4,
}

/// How a format delimits its calls (harmony's channels are parsed in [`crate::harmony`]).
struct Syntax {
    /// What opens a call.
    open: &'static str,
    /// What closes it; `None`: the call runs to the next `open` or the end of the output.
    close: Option<&'static str>,
    /// Markers around a group of calls, dropped from the content.
    drop: &'static [&'static str],
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const GRANITE_CALL: &str = "<|tool_call|>";
const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const GEMMA4_OPEN: &str = "<|tool_call>";
const GEMMA4_CLOSE: &str = "<tool_call|>";
/// Gemma 4's string delimiter (both ends), in calls and tool declarations.
const GEMMA4_QUOTE: &str = "<|\"|>";
/// How a Gemma 4 template writes a call (llama.cpp's `common/chat.cpp` detects the
/// format by the same text).
const GEMMA4_CALL: &str = "'<|tool_call>call:'";

impl ToolFormat {
    /// The format `template` teaches the model, if frink knows it. The checks run from the
    /// most specific marker to the least (Qwen3-Coder's template also has `<tool_call>`).
    pub fn detect(template: &str) -> Option<ToolFormat> {
        let has = |m: &str| template.contains(m);
        Some(if crate::harmony::detect(template) {
            ToolFormat::Harmony
        } else if has(GEMMA4_CALL) {
            ToolFormat::Gemma4
        } else if has("<function=") {
            ToolFormat::Qwen3Xml
        } else if has(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if has(MISTRAL_ARGS) {
            ToolFormat::MistralArgs
        } else if has(MISTRAL_CALLS) {
            ToolFormat::MistralJson
        } else if has(GRANITE_CALL) {
            ToolFormat::Granite
        } else if has(DS_CALL_BEGIN) && has("```json") {
            ToolFormat::DeepSeekR1
        } else if has(DS_CALL_BEGIN) {
            ToolFormat::DeepSeekV31
        } else if has("\"parameters\": dictionary of argument name") {
            ToolFormat::Llama3Json
        } else {
            return None;
        })
    }

    /// The name frink reports (`frink inspect`).
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes (<tool_call>{\"name\", \"arguments\"}</tool_call>)",
            ToolFormat::Qwen3Xml => "qwen3-xml (<tool_call><function=f><parameter=p>…)",
            ToolFormat::Llama3Json => "llama3-json ({\"name\", \"parameters\"})",
            ToolFormat::MistralJson => "mistral-json ([TOOL_CALLS][{\"name\", \"arguments\"}])",
            ToolFormat::MistralArgs => "mistral-args ([TOOL_CALLS]f[ARGS]{…})",
            ToolFormat::Granite => "granite (<|tool_call|>[{\"name\", \"arguments\"}])",
            ToolFormat::DeepSeekR1 => {
                "deepseek-r1 (<｜tool▁call▁begin｜>function<｜tool▁sep｜>f ```json …)"
            }
            ToolFormat::DeepSeekV31 => "deepseek-v3.1 (<｜tool▁call▁begin｜>f<｜tool▁sep｜>{…})",
            ToolFormat::Harmony => "harmony (commentary to=functions.f <|message|>{…})",
            ToolFormat::Gemma4 => "gemma4 (<|tool_call>call:f{key:value}<tool_call|>)",
        }
    }

    fn syntax(self) -> Syntax {
        let tagged = |open, close| Syntax {
            open,
            close,
            drop: &[],
        };
        match self {
            ToolFormat::Hermes | ToolFormat::Qwen3Xml => tagged(HERMES_OPEN, Some(HERMES_CLOSE)),
            ToolFormat::Llama3Json => tagged(PYTHON_TAG, None),
            ToolFormat::MistralJson | ToolFormat::MistralArgs => tagged(MISTRAL_CALLS, None),
            ToolFormat::Granite => tagged(GRANITE_CALL, None),
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV31 => Syntax {
                open: DS_CALL_BEGIN,
                close: Some(DS_CALL_END),
                drop: &[DS_CALLS_BEGIN, DS_CALLS_END],
            },
            // Harmony's calls are read out of its channels by crate::harmony (the server
            // runs no tool parser for it); a NUL marker, which never occurs in model text,
            // leaves any text given here as content.
            ToolFormat::Harmony => tagged("\u{0}", None),
            ToolFormat::Gemma4 => tagged(GEMMA4_OPEN, Some(GEMMA4_CLOSE)),
        }
    }

    /// What begins a call: the trigger of `tool_choice: "auto"`'s lazy grammar (the text of
    /// [`ToolFormat::call_grammar`]'s start, or its first marker).
    fn trigger(self) -> &'static str {
        match self {
            ToolFormat::Hermes | ToolFormat::Qwen3Xml => HERMES_OPEN,
            ToolFormat::Llama3Json => "{\"name\"",
            ToolFormat::MistralJson | ToolFormat::MistralArgs => MISTRAL_CALLS,
            ToolFormat::Granite => GRANITE_CALL,
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV31 => DS_CALLS_BEGIN,
            ToolFormat::Harmony => "<|channel|>commentary to=functions.",
            ToolFormat::Gemma4 => GEMMA4_OPEN,
        }
    }

    /// Every marker text of the format: those that are control tokens of a vocabulary must
    /// render as text for the parser to see them (llama-server's preserved tokens).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Qwen3Xml => &[HERMES_OPEN, HERMES_CLOSE],
            ToolFormat::Llama3Json => &[PYTHON_TAG],
            ToolFormat::MistralJson => &[MISTRAL_CALLS],
            ToolFormat::Granite => &[GRANITE_CALL],
            ToolFormat::MistralArgs => &[MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID],
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV31 => &[
                DS_CALLS_BEGIN,
                DS_CALLS_END,
                DS_CALL_BEGIN,
                DS_CALL_END,
                DS_SEP,
            ],
            ToolFormat::Harmony => crate::harmony::MARKERS,
            ToolFormat::Gemma4 => &[GEMMA4_OPEN, GEMMA4_CLOSE, GEMMA4_QUOTE],
        }
    }

    /// The calls of one delimited call body (`None`: it is not a valid call).
    fn parse_body(self, body: &str, tools: &ToolSet) -> Option<Vec<ToolCall>> {
        match self {
            ToolFormat::Hermes | ToolFormat::Harmony => Some(vec![parse_call(body)?]),
            ToolFormat::Qwen3Xml => Some(vec![parse_xml(body, tools)?]),
            ToolFormat::Llama3Json | ToolFormat::MistralJson | ToolFormat::Granite => {
                json_calls(body)
            }
            ToolFormat::MistralArgs => {
                let (name, args) = body.split_once(MISTRAL_ARGS)?;
                // `name[CALL_ID]id[ARGS]{…}`: the id is the model's, frink gives its own.
                let name = name.split(MISTRAL_CALL_ID).next()?.trim();
                Some(vec![call_from(name, args)?])
            }
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV31 => {
                let (left, right) = body.split_once(DS_SEP)?;
                let call = match right.split_once("\n```json") {
                    // R1: the type left of the separator, the name on the line after it.
                    Some((name, fenced)) if left.trim() == "function" => {
                        let args = fenced.trim_end().strip_suffix("```")?;
                        call_from(name.trim(), args)?
                    }
                    _ => call_from(left.trim(), right)?,
                };
                Some(vec![call])
            }
            ToolFormat::Gemma4 => {
                let body = body.trim().strip_prefix("call:")?;
                let brace = body.find('{')?;
                let (name, args) = body.split_at(brace);
                let (args, rest) = gemma4_value(args)?;
                if !rest.trim().is_empty() || !args.is_object() {
                    return None;
                }
                Some(vec![ToolCall {
                    name: name.trim().to_string(),
                    arguments: args.to_string(),
                }])
            }
        }
    }

    /// A Lark grammar (llguidance's syntax) that admits only calls of `tools` (OpenAI
    /// `{"type": "function", "function": {"name", "parameters"}}` objects), each call's
    /// arguments valid against its parameters' schema; one call, or several with
    /// `parallel`. What `tool_choice: "required"` (all tools) or a named function (that
    /// one) compiles to. `token` gives the id of a marker that is one control token of the
    /// vocabulary (named `<[id]>` in the grammar, since its text is not what the model
    /// writes); other markers are literal text.
    pub fn call_grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
    ) -> String {
        self.grammar(tools, parallel, token, false)
    }

    /// The grammar of `tool_choice: "auto"`'s lazy constraint: [`ToolFormat::call_grammar`],
    /// or (formats whose calls are not JSON already) the generic fallback's shapes that
    /// [`ToolFormat::triggers`] start: one call object, bare or in a ```json fence, as
    /// small models write it instead of their template's format.
    pub fn auto_grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
    ) -> String {
        self.grammar(tools, parallel, token, self.json_fallback_triggers())
    }

    /// Whether a call in the JSON fallback's shapes is enforced under `auto` too.
    fn json_fallback_triggers(self) -> bool {
        !matches!(self, ToolFormat::Llama3Json | ToolFormat::Harmony)
    }

    /// What begins a call under `tool_choice: "auto"` (the triggers of
    /// [`ToolFormat::auto_grammar`]'s lazy constraint): the format's opening marker
    /// anywhere (its token where `token` says it is one control token), and the JSON
    /// fallback's shapes at the answer's start.
    pub fn triggers(self, token: &dyn Fn(&str) -> Option<u32>) -> Vec<Trigger> {
        let t = self.trigger();
        let mut out = vec![match token(t) {
            Some(id) => Trigger::Token(id),
            None => Trigger::Text(t.to_string()),
        }];
        if self.json_fallback_triggers() {
            out.extend(["```json", "{\"name\""].map(|p| Trigger::Prefix(p.to_string())));
        }
        out
    }

    fn grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
        fallback: bool,
    ) -> String {
        let lit = |m: &str| match token(m) {
            Some(id) => format!("<[{id}]>"),
            None => Value::from(m).to_string(),
        };
        let params = |t: &Value| match t["function"].get("parameters") {
            Some(p) if p.is_object() => p.clone(),
            _ => json!({"type": "object"}),
        };
        let name = |t: &Value| t["function"]["name"].as_str().unwrap_or("").to_string();
        let json_rule = |schema: &Value| {
            format!(
                "%json {}",
                frink_engine::constraint::json_schema_defaults(schema)
            )
        };
        // One object schema per tool: `{"name": <const>, key: <its parameters>}` and the
        // `extra` properties (all required).
        let named_objects = |key: &str, extra: Value| -> Value {
            let alternatives: Vec<Value> = tools
                .iter()
                .map(|t| {
                    let mut props = json!({"name": {"const": name(t)}, key: params(t)});
                    let mut required = vec![json!("name"), json!(key)];
                    for (k, v) in extra.as_object().into_iter().flatten() {
                        props[k] = v.clone();
                        required.push(json!(k));
                    }
                    json!({
                        "type": "object",
                        "properties": props,
                        "required": required,
                        "additionalProperties": false
                    })
                })
                .collect();
            json!({"anyOf": alternatives})
        };
        // `start` as one call or, with `parallel`, calls joined by `sep`.
        let repeated = |sep: &str| {
            if parallel {
                format!("native: call ({sep} call)*\n")
            } else {
                "native: call\n".to_string()
            }
        };
        // One rule per tool, `call: c0 | c1 | …`, each built by `one(i, tool)`.
        let per_tool = |one: &dyn Fn(usize, &Value) -> String| {
            let alts: Vec<String> = (0..tools.len()).map(|i| format!("c{i}")).collect();
            let mut g = format!("call: {}\n", alts.join(" | "));
            for (i, t) in tools.iter().enumerate() {
                g.push_str(&one(i, t));
            }
            g
        };
        let mut g = String::from("%llguidance {}\n");
        if fallback {
            // The fallback reads `arguments` (and `parameters`); one call, as parsed.
            g += &format!(
                "start: native | fallback\nfallback: fbody | \"```json\\n\" fbody \"\\n```\"\nfbody: {}\n",
                json_rule(&named_objects("arguments", json!({})))
            );
        } else {
            g += "start: native\n";
        }
        match self {
            ToolFormat::Hermes => {
                g += &repeated("\"\\n\"");
                g += &format!(
                    "call: {} \"\\n\" body \"\\n\" {}\nbody: {}\n",
                    lit(HERMES_OPEN),
                    lit(HERMES_CLOSE),
                    json_rule(&named_objects("arguments", json!({})))
                );
            }
            // One call: the Llama 3 templates teach no parallel calls.
            ToolFormat::Llama3Json => {
                g += &format!(
                    "native: body\nbody: {}\n",
                    json_rule(&named_objects("parameters", json!({})))
                );
            }
            ToolFormat::MistralJson | ToolFormat::Granite => {
                // Mistral: each call with the 9-character id its templates write into the
                // history (and refuse other ids), as the model learnt to write it.
                let (marker, extra) = if self == ToolFormat::MistralJson {
                    let id = json!({"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}});
                    (MISTRAL_CALLS, id)
                } else {
                    (GRANITE_CALL, json!({}))
                };
                let mut array = json!({"type": "array", "items": named_objects("arguments", extra), "minItems": 1});
                if !parallel {
                    array["maxItems"] = json!(1);
                }
                g += &format!(
                    "native: {} body\nbody: {}\n",
                    lit(marker),
                    json_rule(&array)
                );
            }
            ToolFormat::MistralArgs => {
                g += &repeated("");
                g += &per_tool(&|i, t| {
                    format!(
                        "c{i}: {} {} {} a{i}\na{i}: {}\n",
                        lit(MISTRAL_CALLS),
                        Value::from(name(t)),
                        lit(MISTRAL_ARGS),
                        json_rule(&params(t))
                    )
                });
            }
            ToolFormat::DeepSeekR1 | ToolFormat::DeepSeekV31 => {
                let sep = if self == ToolFormat::DeepSeekR1 {
                    "\"\\n\""
                } else {
                    ""
                };
                let calls = if parallel {
                    format!("call ({sep} call)*")
                } else {
                    "call".to_string()
                };
                g += &format!(
                    "native: {} {calls} {}\n",
                    lit(DS_CALLS_BEGIN),
                    lit(DS_CALLS_END)
                );
                g += &per_tool(&|i, t| {
                    let head = if self == ToolFormat::DeepSeekR1 {
                        format!(
                            "\"function\" {} {} \"\\n```json\\n\" a{i} \"\\n```\"",
                            lit(DS_SEP),
                            Value::from(name(t))
                        )
                    } else {
                        format!("{} {} a{i}", Value::from(name(t)), lit(DS_SEP))
                    };
                    format!(
                        "c{i}: {} {head} {}\na{i}: {}\n",
                        lit(DS_CALL_BEGIN),
                        lit(DS_CALL_END),
                        json_rule(&params(t))
                    )
                });
            }
            ToolFormat::Qwen3Xml => {
                g += &repeated("\"\\n\"");
                g += &format!(
                    "call: {} \"\\n\" fn \"\\n\" {}\n",
                    lit(HERMES_OPEN),
                    lit(HERMES_CLOSE)
                );
                let alts: Vec<String> = (0..tools.len()).map(|i| format!("f{i}")).collect();
                g += &format!("fn: {}\n", alts.join(" | "));
                for (i, t) in tools.iter().enumerate() {
                    g += &xml_function_rules(i, &name(t), &params(t), &json_rule);
                }
            }
            // A call right away (gpt-oss asked for a call goes straight to the commentary
            // channel); the call ends at `<|call|>`, an end-of-generation token.
            ToolFormat::Harmony => {
                g += "native: call\n";
                g += &per_tool(&|i, t| {
                    format!(
                        "c{i}: {} \"commentary to=functions.\" {} \" \" {} \"json\" {} a{i}\na{i}: {}\n",
                        lit("<|channel|>"),
                        Value::from(name(t)),
                        lit("<|constrain|>"),
                        lit("<|message|>"),
                        json_rule(&params(t))
                    )
                });
            }
            // Calls one after another; each tool's arguments in the key order the
            // template writes them (`dictsort`), the required ones present.
            ToolFormat::Gemma4 => {
                g += &repeated("");
                g += &gemma4_value_rules(&lit(GEMMA4_QUOTE));
                g += &per_tool(&|i, t| {
                    let (args, rules) =
                        gemma4_args_rule(i, &params(t), &lit(GEMMA4_QUOTE), &json_rule);
                    format!(
                        "c{i}: {} {} \"{{\" {args} \"}}\" {}\n{rules}",
                        lit(GEMMA4_OPEN),
                        Value::from(format!("call:{}", name(t))),
                        lit(GEMMA4_CLOSE),
                    )
                });
            }
        }
        g
    }
}

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

/// Lark rules of any Gemma 4 value (`gv`), for arguments whose schema the grammar does
/// not follow (objects, arrays, untyped): strings between `quote` marks holding no `<|`,
/// dicts with bare keys, lists, JSON numbers, `true`, `false`, `null`.
fn gemma4_value_rules(quote: &str) -> String {
    format!(
        "gv: gs | gd | gl | gn | \"true\" | \"false\" | \"null\"\n\
         gs: {quote} /(?:[^<]|<[^|])*/ {quote}\n\
         gd: \"{{\" (gk \":\" gv (\",\" gk \":\" gv)*)? \"}}\"\n\
         gk: /[A-Za-z_][A-Za-z0-9_.-]*/\n\
         gl: \"[\" (gv (\",\" gv)*)? \"]\"\n\
         gn: /-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/\n"
    )
}

/// The Lark expression of tool `i`'s arguments inside `{…}` and its rules: the
/// parameters in the order the template writes them (sorted by name, as its `dictsort`),
/// comma-separated, the required ones present; a string `key:` `quote`d text holding no
/// `<|` (with `minLength`/`maxLength`, no `<` at all, so the bounds count characters
/// exactly; `enum`: one of its values), numbers, integers and booleans as JSON valid
/// against their schema, anything else any Gemma 4 value (`gv`).
fn gemma4_args_rule(
    i: usize,
    params: &Value,
    quote: &str,
    json_rule: &dyn Fn(&Value) -> String,
) -> (String, String) {
    let mut props = schema_properties(params);
    props.sort_by_key(|p| p.0);
    let mut rules = String::new();
    let mut items = Vec::new();
    for (j, &(p, schema, required)) in props.iter().enumerate() {
        let rule = format!("g{i}_{j}");
        let value = match schema["type"].as_str() {
            Some("string") => match schema["enum"].as_array() {
                Some(e) => e
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|v| format!("{quote} {} {quote}", Value::from(v)))
                    .collect::<Vec<_>>()
                    .join(" | "),
                // The schema's length bounds hold on the text between the marks.
                None if schema.get("minLength").is_some() || schema.get("maxLength").is_some() => {
                    format!("{quote} /[^<]{}/ {quote}", length_repeat(schema))
                }
                None => "gs".to_string(),
            },
            Some("number" | "integer" | "boolean" | "null") => {
                rules += &format!("v{i}_{j}: {}\n", json_rule(schema));
                format!("v{i}_{j}")
            }
            _ => "gv".to_string(),
        };
        rules += &format!("{rule}: {} ({value})\n", Value::from(format!("{p}:")));
        items.push((rule, required));
    }
    // seq(j): the items from j on, the first present one without a comma before it.
    fn seq(items: &[(String, bool)], j: usize) -> Option<String> {
        let (rule, req) = items.get(j)?;
        let rest: String = items[j + 1..]
            .iter()
            .map(|(r, q)| {
                if *q {
                    format!(" \",\" {r}")
                } else {
                    format!(" (\",\" {r})?")
                }
            })
            .collect();
        let here = format!("{rule}{rest}");
        Some(if *req {
            here
        } else {
            match seq(items, j + 1) {
                Some(later) => format!("({here} | {later})"),
                None => format!("({here})?"),
            }
        })
    }
    // (With no required item, seq(0) already admits no item at all.)
    (seq(&items, 0).unwrap_or_default(), rules)
}

/// The Lark rules of Qwen3-Coder's `<function=NAME>` block for tool `i`: its parameters in
/// the schema's order (the required ones present, the others optional), a string value
/// raw up to `\n</parameter>` (a value holding `</` cannot be written; `maxLength`
/// and `minLength` bound it, counting a `<` and the character after it as one; `enum`
/// lists its texts), any other value
/// JSON valid against its property schema.
fn xml_function_rules(
    i: usize,
    name: &str,
    params: &Value,
    json_rule: &dyn Fn(&Value) -> String,
) -> String {
    let mut rules = String::new();
    let mut seq = Vec::new();
    for (j, (p, schema, required)) in schema_properties(params).into_iter().enumerate() {
        let rule = format!("p{i}_{j}");
        let open = Value::from(format!("<parameter={p}>\n"));
        let close = "\"\\n</parameter>\\n\"";
        let value = if schema["type"] == "string" {
            match schema["enum"].as_array() {
                Some(e) => e
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|v| format!("{} {close}", Value::from(v)))
                    .collect::<Vec<_>>()
                    .join(" | "),
                // The schema's length bounds hold on the raw text.
                None => format!(
                    r"/(?:[^<]|<[^\/]){}\n<\/parameter>\n/",
                    length_repeat(schema)
                ),
            }
        } else {
            rules += &format!("v{i}_{j}: {}\n", json_rule(schema));
            format!("v{i}_{j} {close}")
        };
        rules += &format!("{rule}: {open} ({value})\n");
        seq.push(if required { rule } else { format!("{rule}?") });
    }
    format!(
        "f{i}: {} {} \"</function>\"\n{rules}",
        Value::from(format!("<function={name}>\n")),
        seq.join(" ")
    )
}

/// The properties of a tool's parameters schema, in the schema's order: each one's name,
/// schema and whether `required` lists it.
fn schema_properties(params: &Value) -> Vec<(&str, &Value, bool)> {
    let required: Vec<&str> = params["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    params["properties"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.as_str(), v, required.contains(&k.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

/// The regex repetition a string schema's `minLength`/`maxLength` allow: `{min,max}`,
/// `{min,}`, or `*` without bounds.
fn length_repeat(schema: &Value) -> String {
    let min = schema["minLength"].as_u64().unwrap_or(0);
    match schema["maxLength"].as_u64() {
        Some(m) => format!("{{{min},{m}}}"),
        None if min == 0 => "*".to_string(),
        None => format!("{{{min},}}"),
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

/// The tools a request may call: each one's name and parameters' schema (the XML format
/// reads a value as a string or as JSON by its property's type; the JSON fallback accepts
/// only these names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolSet {
    tools: Vec<(String, Value)>,
}

impl ToolSet {
    /// From OpenAI `tools` entries (`{"type": "function", "function": {"name", "parameters"}}`).
    pub fn new(tools: &[&Value]) -> ToolSet {
        ToolSet {
            tools: tools
                .iter()
                .filter_map(|t| {
                    let f = &t["function"];
                    Some((f["name"].as_str()?.to_string(), f["parameters"].clone()))
                })
                .collect(),
        }
    }

    /// Whether a tool is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tools.iter().any(|(n, _)| n == name)
    }

    /// The schema of parameter `param` of tool `name`, if declared.
    fn param(&self, name: &str, param: &str) -> Option<&Value> {
        let (_, p) = self.tools.iter().find(|(n, _)| n == name)?;
        p.get("properties")?.get(param)
    }
}

/// A call from a name and a JSON text of its arguments (which must be an object).
pub(crate) fn call_from(name: &str, args: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(args.trim()).ok()?;
    (v.is_object() && !name.is_empty()).then(|| ToolCall {
        name: name.to_string(),
        arguments: v.to_string(),
    })
}

/// Parses a call object: a JSON object with a string `name` and `arguments` (or
/// `parameters`: an object, or a string holding JSON, as some models write it).
fn parse_call_value(v: &Value) -> Option<ToolCall> {
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
fn parse_call(body: &str) -> Option<ToolCall> {
    parse_call_value(&serde_json::from_str(body.trim()).ok()?)
}

/// One call object or a non-empty array of them.
fn json_calls(body: &str) -> Option<Vec<ToolCall>> {
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
fn parse_xml(body: &str, tools: &ToolSet) -> Option<ToolCall> {
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
fn json_fallback(text: &str, tools: &ToolSet) -> Option<Vec<ToolCall>> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|r| r.trim_end().strip_suffix("```"))
        .unwrap_or(t);
    let calls = json_calls(t)?;
    calls.iter().all(|c| tools.has(&c.name)).then_some(calls)
}

/// Where the parser is.
#[derive(Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet.
    Start,
    /// The answer began with `{`, `[` or a fence: held whole for the JSON fallback.
    Json,
    /// Streaming text and delimited calls.
    Tagged,
}

/// Turns a model's output, fed piece by piece, into text and calls: text before, between
/// and after calls is content (held back only while it may be the start of a marker); a
/// call whose body is not a valid call stays in the content as the model wrote it (never an
/// error). An answer that starts with `{`, `[` or a code fence is held to the end, where the
/// JSON fallback may read it as calls (otherwise it is content). The whole output parses
/// the same fed at once or token by token.
#[derive(Debug)]
pub struct StreamParser {
    format: ToolFormat,
    buf: String,
    in_call: bool,
    mode: Mode,
    tools: ToolSet,
    /// Whitespace after a call, held: it goes out only if text follows (whitespace between
    /// parallel calls, or after the last, is not content).
    after_call: Option<String>,
}

impl StreamParser {
    /// A parser for `format` and the tools the answer may call.
    pub fn new(format: ToolFormat, tools: ToolSet) -> StreamParser {
        StreamParser {
            format,
            buf: String::new(),
            in_call: false,
            mode: Mode::Start,
            tools,
            after_call: None,
        }
    }

    /// `items` with whitespace-only text after a call held back (see `after_call`).
    fn settle(&mut self, items: Vec<Item>) -> Vec<Item> {
        let mut out = Vec::new();
        for it in items {
            match (it, self.after_call.as_mut()) {
                (Item::Text(t), Some(held)) if t.trim().is_empty() => held.push_str(&t),
                (Item::Text(t), Some(_)) => {
                    let held = self.after_call.take().unwrap_or_default();
                    out.push(Item::Text(held + &t));
                }
                (call @ Item::Call(_), _) => {
                    self.after_call = Some(String::new());
                    out.push(call);
                }
                (text, None) => out.push(text),
            }
        }
        out
    }

    /// The items of a finished call body (its text as written if it is not a call).
    fn body_items(&self, body: &str, syntax: &Syntax, closed: bool) -> Vec<Item> {
        match self.format.parse_body(body, &self.tools) {
            Some(calls) => calls.into_iter().map(Item::Call).collect(),
            None => {
                let close = if closed {
                    syntax.close.unwrap_or("")
                } else {
                    ""
                };
                vec![Item::Text(format!("{}{body}{close}", syntax.open))]
            }
        }
    }

    /// Feeds `text`; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Item> {
        let items = self.read(text);
        self.settle(items)
    }

    fn read(&mut self, text: &str) -> Vec<Item> {
        self.buf.push_str(text);
        let syntax = self.format.syntax();
        if self.mode == Mode::Start {
            match self.buf.trim_start().chars().next() {
                None => return Vec::new(),
                Some('{' | '[' | '`') => self.mode = Mode::Json,
                Some(_) => self.mode = Mode::Tagged,
            }
        }
        if self.mode == Mode::Json {
            if !self.buf.contains(syntax.open) {
                return Vec::new();
            }
            self.mode = Mode::Tagged;
        }
        let mut out = Vec::new();
        loop {
            if self.in_call {
                // The body ends at the close marker, or (formats without one) where the
                // next call opens; the open marker then stays for the next turn.
                let (end, skip) = match syntax.close {
                    Some(c) => match self.buf.find(c) {
                        Some(e) => (e, e + c.len()),
                        None => break,
                    },
                    None => match self.buf.find(syntax.open) {
                        Some(e) => (e, e),
                        None => break,
                    },
                };
                let body: String = self.buf[..end].to_string();
                self.buf.drain(..skip);
                self.in_call = false;
                out.extend(self.body_items(&body, &syntax, syntax.close.is_some()));
            } else if let Some(start) = self.buf.find(syntax.open) {
                let before = strip_markers(&self.buf[..start], syntax.drop);
                self.buf.drain(..start + syntax.open.len());
                self.in_call = true;
                if !before.is_empty() {
                    out.push(Item::Text(before));
                }
            } else {
                let keep = std::iter::once(syntax.open)
                    .chain(syntax.drop.iter().copied())
                    .map(|m| partial_match_len(&self.buf, m))
                    .max()
                    .unwrap_or(0);
                let cut = self.buf.len() - keep;
                if cut > 0 {
                    let t = strip_markers(&self.buf[..cut], syntax.drop);
                    self.buf.drain(..cut);
                    if !t.is_empty() {
                        out.push(Item::Text(t));
                    }
                }
                break;
            }
        }
        out
    }

    /// The end of the output: held text, or an unterminated call (a call the model ended
    /// without its closing marker counts if its body is a valid call).
    pub fn finish(mut self) -> Vec<Item> {
        let items = self.read_end();
        self.settle(items)
    }

    fn read_end(&mut self) -> Vec<Item> {
        let syntax = self.format.syntax();
        let rest = std::mem::take(&mut self.buf);
        if self.mode == Mode::Json {
            if let Some(calls) = json_fallback(&rest, &self.tools) {
                return calls.into_iter().map(Item::Call).collect();
            }
        }
        if self.in_call {
            return self.body_items(strip_markers(&rest, syntax.drop).as_str(), &syntax, false);
        }
        let rest = strip_markers(&rest, syntax.drop);
        if rest.is_empty() {
            Vec::new()
        } else {
            vec![Item::Text(rest)]
        }
    }
}

/// `text` without the markers `drop`.
fn strip_markers(text: &str, drop: &[&str]) -> String {
    drop.iter().fold(text.to_string(), |t, m| t.replace(m, ""))
}

/// A whole output parsed: its content (text between calls, joined; surrounding whitespace
/// of a reply that has calls trimmed) and its calls ([`crate::answer::AnswerFormat::parse`]
/// with no reasoning to split).
pub fn parse(format: ToolFormat, tools: &ToolSet, text: &str) -> (String, Vec<ToolCall>) {
    let answer = crate::answer::AnswerFormat {
        tool_format: Some(format),
        tools: tools.clone(),
        reasoning: None,
    };
    let (_, content, calls) = answer.parse(text);
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}})
    }

    fn tool_set() -> ToolSet {
        let x = json!({"type": "function", "function": {"name": "x", "parameters": {"type": "object"}}});
        ToolSet::new(&[&weather(), &x])
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Recorded outputs of every format, each as its model writes calls (the shapes its
    /// template writes into the history, see tests/data/templates/reference.json): text
    /// before a call, two calls, a malformed body (content as written, never an error).
    /// Each case: (format, output, expected content, expected calls).
    fn cases() -> Vec<(ToolFormat, &'static str, &'static str, Vec<ToolCall>)> {
        let paris = || call("get_weather", r#"{"city":"Paris"}"#);
        let two = || {
            vec![
                call("get_weather", r#"{"city":"Paris","days":2}"#),
                call("x", "{}"),
            ]
        };
        use ToolFormat::*;
        vec![
            (Hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "Let me check.", vec![paris()]),
            (Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"x\", \"arguments\": \"{}\"}\n</tool_call>", "", two()),
            (Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call> done", "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call> done", vec![]),
            (Qwen3Xml, "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", "I will look.", vec![paris()]),
            (Qwen3Xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=x>\n</function>\n</tool_call>", "", two()),
            (Qwen3Xml, "<tool_call>\n<function=get_weather\n</tool_call>", "<tool_call>\n<function=get_weather\n</tool_call>", vec![]),
            (Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", vec![paris()]),
            (Llama3Json, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", vec![paris()]),
            (Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {", "{\"name\": \"get_weather\", \"parameters\": {", vec![]),
            (MistralJson, "Sure.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}]", "Sure.", vec![paris()]),
            (MistralJson, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}, {\"name\": \"x\", \"arguments\": {}}]", "", two()),
            (MistralJson, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\"", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\"", vec![]),
            (Granite, "Checking.<|tool_call|>[{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}]", "Checking.", vec![paris()]),
            (Granite, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}, {\"name\": \"x\", \"arguments\": {}}]", "", two()),
            (Granite, "<|tool_call|>[{\"name\": 3}]", "<|tool_call|>[{\"name\": 3}]", vec![]),
            (MistralArgs, "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "Checking.", vec![paris()]),
            (MistralArgs, "[TOOL_CALLS]get_weather[CALL_ID]call_0001[ARGS]{\"city\": \"Paris\", \"days\": 2}[TOOL_CALLS]x[ARGS]{}", "", two()),
            (MistralArgs, "[TOOL_CALLS]get_weather{\"city\": 1}", "[TOOL_CALLS]get_weather{\"city\": 1}", vec![]),
            (DeepSeekR1, "Looking it up.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "Looking it up.", vec![paris()]),
            (DeepSeekR1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>x\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", two()),
            (DeepSeekR1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\n```<｜tool▁call▁end｜>", vec![]),
            (DeepSeekV31, "On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "On it.", vec![paris()]),
            (DeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", two()),
            (DeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{<｜tool▁call▁end｜>", vec![]),
            // Gemma 4: as its template writes a call into the history.
            (Gemma4, "Let me check.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", "Let me check.", vec![paris()]),
            (Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|><|tool_call>call:x{}<tool_call|>", "", two()),
            (Gemma4, "<|tool_call>call:get_weather{city:Paris}<tool_call|>", "<|tool_call>call:get_weather{city:Paris}<tool_call|>", vec![]),
        ]
    }

    /// An OpenAI tool-calling history (a call, its `tool` result) converted for the earlier
    /// Gemma 4 template renders exactly as transformers renders Gemma's own form (the call
    /// with `tool_responses`) through that template (frink-tokenizer's reference.json,
    /// case `tool_responses`), where unconverted it would give the result a `tool` turn
    /// the model never saw; the current template is left to read `tool` messages itself.
    #[test]
    fn tool_results_become_gemma4_tool_responses() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tokenizer/tests/data/templates/"
        );
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
        let reference: Value = serde_json::from_str(&read("reference.json")).unwrap();
        let case = |name: &str| {
            reference["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap()
                .clone()
        };
        let message = |v: &Value| {
            let mut extra = v.as_object().unwrap().clone();
            let role = extra.remove("role").unwrap().as_str().unwrap().to_string();
            let content = extra
                .remove("content")
                .unwrap()
                .as_str()
                .unwrap()
                .to_string();
            ChatMessage {
                role,
                content,
                extra,
            }
        };
        let openai = case("tool_call_and_result");
        let messages: Vec<ChatMessage> = openai["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message)
            .collect();
        let older = "google-gemma-4-31B-it-interleaved.jinja";
        let wants = |f: &str| wants_tool_responses(ToolFormat::detect(&read(f)), &read(f));
        assert!(wants(older));
        assert!(!wants("google-gemma-4-31B-it.jinja"));
        assert!(!wants("Qwen-Qwen3-0.6B.jinja"));
        let converted = gemma4_tool_responses(messages.clone());
        assert_eq!(converted.len(), 2);
        assert_eq!(
            converted[1].extra["tool_responses"],
            json!([{"name": "get_weather", "response": {"temperature": 21}}])
        );
        let inputs = frink_tokenizer::TemplateInputs {
            add_generation_prompt: true,
            tools: openai.get("tools").cloned(),
            ..Default::default()
        };
        let render = |m: &[ChatMessage]| {
            frink_tokenizer::render_template(&read(older), m, &inputs, "<s>", "</s>").unwrap()
        };
        let want = reference["renderings"][older]["tool_responses"]["text"]
            .as_str()
            .unwrap();
        assert_eq!(render(&converted), want);
        assert_ne!(render(&messages), want);
        // The answer after the results joins the turn; other histories pass unchanged.
        let mut with_answer = messages.clone();
        with_answer.push(ChatMessage::new("assistant", "21 degrees."));
        with_answer.push(ChatMessage::new("user", "Thanks."));
        let c = gemma4_tool_responses(with_answer);
        assert_eq!(
            (c.len(), c[1].content.as_str(), c[2].role.as_str()),
            (3, "21 degrees.", "user")
        );
        let plain = vec![
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "hello"),
        ];
        assert_eq!(gemma4_tool_responses(plain.clone()), plain);
    }

    /// Gemma 4's argument syntax as its template's `format_argument` writes each kind of
    /// value (nested dicts with bare or quoted keys, lists, numbers, booleans, null, a
    /// string holding JSON punctuation), and texts that are not one.
    #[test]
    fn gemma4_values_read_as_json() {
        let q = |s: &str| s.replace('\'', GEMMA4_QUOTE);
        let text = q("{a:'x, {y}: z',b:[1,-2.5e3,true,null],c:{'d e':false,f:[]},g:{}}");
        let (v, rest) = gemma4_value(&text).unwrap();
        assert_eq!(
            v,
            json!({"a": "x, {y}: z", "b": [1, -2500.0, true, null], "c": {"d e": false, "f": []}, "g": {}})
        );
        assert_eq!(rest, "");
        let (v, rest) = gemma4_value(" 12 }").unwrap();
        assert_eq!((v, rest), (json!(12), "}"));
        for bad in [
            "{a:Paris}",
            "{a:1",
            "{:1}",
            "[1,]",
            &q("{a:'x}"),
            "\"json\"",
        ] {
            assert!(gemma4_value(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn recorded_outputs_of_every_format_parse_into_content_and_calls() {
        let tools = tool_set();
        for (f, text, content, calls) in cases() {
            assert_eq!(
                parse(f, &tools, text),
                (content.to_string(), calls),
                "{f:?}: {text:?}"
            );
        }
        // An unterminated Hermes call counts if its body is a call; text that may start a
        // tag is content at the end.
        let (_, calls) = parse(
            ToolFormat::Hermes,
            &tools,
            "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"k\": 2}}",
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(
            parse(ToolFormat::Hermes, &tools, "no calls <tool"),
            ("no calls <tool".to_string(), vec![])
        );
    }

    /// Split at every character boundary, the stream gives the whole parse.
    #[test]
    fn streaming_at_every_boundary_gives_the_whole_parse() {
        let tools = tool_set();
        for (f, text, _, _) in cases() {
            let whole = parse(f, &tools, text);
            for cut in 1..text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut p = StreamParser::new(f, tools.clone());
                let mut items = p.push(&text[..cut]);
                items.extend(p.push(&text[cut..]));
                items.extend(p.finish());
                let (mut content, calls) = gather(items);
                if !calls.is_empty() {
                    content = content.trim().to_string();
                }
                assert_eq!((content, calls), whole, "{f:?} cut at {cut}");
            }
        }
    }

    /// Each format is detected from its family's real template (tests/data/templates,
    /// the files llama.cpp and the model authors publish).
    #[test]
    fn formats_are_detected_from_the_real_templates() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tokenizer/tests/data/templates/"
        );
        let expect = [
            ("Qwen-Qwen2.5-7B-Instruct.jinja", Some(ToolFormat::Hermes)),
            ("Qwen-Qwen3-0.6B.jinja", Some(ToolFormat::Hermes)),
            (
                "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                Some(ToolFormat::Hermes),
            ),
            ("HuggingFaceTB-SmolLM3-3B.jinja", None),
            ("catalog-qwen2.5-coder-0.5b.jinja", Some(ToolFormat::Hermes)),
            ("Qwen3-Coder.jinja", Some(ToolFormat::Qwen3Xml)),
            (
                "meta-llama-Llama-3.1-8B-Instruct.jinja",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "meta-llama-Llama-3.2-3B-Instruct.jinja",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "meta-llama-Llama-3.3-70B-Instruct.jinja",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                Some(ToolFormat::MistralJson),
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                Some(ToolFormat::MistralArgs),
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                Some(ToolFormat::DeepSeekR1),
            ),
            (
                "deepseek-ai-DeepSeek-V3.1.jinja",
                Some(ToolFormat::DeepSeekV31),
            ),
            ("openai-gpt-oss-120b.jinja", Some(ToolFormat::Harmony)),
            ("catalog-smollm2-135m.jinja", None),
            ("google-gemma-2-2b-it.jinja", None),
            (
                "ibm-granite-granite-3.3-2B-Instruct.jinja",
                Some(ToolFormat::Granite),
            ),
            ("google-gemma-4-31B-it.jinja", Some(ToolFormat::Gemma4)),
            (
                "google-gemma-4-31B-it-interleaved.jinja",
                Some(ToolFormat::Gemma4),
            ),
            ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", None),
            ("microsoft-Phi-3.5-mini-instruct.jinja", None),
        ];
        for (file, want) in expect {
            let t = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
            assert_eq!(ToolFormat::detect(&t), want, "{file}");
        }
    }

    /// Llama 3.x's grammar takes the parameters under that key; a marker that is a control
    /// token is named by id, other markers are text.
    #[test]
    fn grammars_use_the_format_keys_and_token_ids() {
        let w = weather();
        let g = ToolFormat::Llama3Json.call_grammar(&[&w], true, &|_| None);
        assert!(
            g.contains("\"parameters\"") && !g.contains("tool_call"),
            "{g}"
        );
        let g =
            ToolFormat::MistralArgs.call_grammar(&[&w], true, &|m| (m == "[ARGS]").then_some(7));
        assert!(g.contains("<[7]>") && g.contains("\"[TOOL_CALLS]\""), "{g}");
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
