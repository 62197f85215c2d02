//! Which format a chat template teaches (detected from its text), each format's markers
//! and syntax, and the reading of one call body in it.

use frink_engine::constraint::Trigger;

use super::parse::{gemma4_value, json_calls, parse_call, parse_xml};
use crate::calls::{call_from, ToolCall, ToolSet};

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
pub(super) struct Syntax {
    /// What opens a call.
    pub(super) open: &'static str,
    /// What closes it; `None`: the call runs to the next `open` or the end of the output.
    pub(super) close: Option<&'static str>,
    /// Markers around a group of calls, dropped from the content.
    pub(super) drop: &'static [&'static str],
}

pub(super) const HERMES_OPEN: &str = "<tool_call>";
pub(super) const HERMES_CLOSE: &str = "</tool_call>";
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
pub(super) const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
pub(super) const MISTRAL_ARGS: &str = "[ARGS]";
pub(super) const MISTRAL_CALL_ID: &str = "[CALL_ID]";
pub(super) const GRANITE_CALL: &str = "<|tool_call|>";
pub(super) const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(super) const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub(super) const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub(super) const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
pub(super) const DS_SEP: &str = "<｜tool▁sep｜>";
pub(super) const GEMMA4_OPEN: &str = "<|tool_call>";
pub(super) const GEMMA4_CLOSE: &str = "<tool_call|>";
pub(super) use super::parse::GEMMA4_QUOTE;
/// How a Gemma 4 template writes a call (llama.cpp's `common/chat.cpp` detects the
/// format by the same text).
pub(super) const GEMMA4_CALL: &str = "'<|tool_call>call:'";

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

    pub(super) fn syntax(self) -> Syntax {
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
    pub(super) fn trigger(self) -> &'static str {
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
    pub(super) fn parse_body(self, body: &str, tools: &ToolSet) -> Option<Vec<ToolCall>> {
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

    /// Whether a call in the JSON fallback's shapes is enforced under `auto` too.
    pub(super) fn json_fallback_triggers(self) -> bool {
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
}
