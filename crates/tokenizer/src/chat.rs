//! Chat prompts: the model's `tokenizer.chat_template` rendered with minijinja (or a
//! built-in template chosen by architecture when the file has none), and tokenized so that
//! the template's own text is parsed for special tokens while every message's content is
//! literal.
//!
//! Rendering follows what llama.cpp's server does with a Jinja template (common/chat.cpp):
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token` in the context,
//! `trim_blocks` and `lstrip_blocks` on (as in Hugging Face's and llama.cpp's Jinja
//! environments), Python string/dict methods (minijinja-contrib's `pycompat`),
//! `raise_exception(msg)`, and `tojson` formatted as Python's `json.dumps` (`", "` and
//! `": "` separators, non-ASCII kept). A rendered prompt that starts with the BOS text loses
//! it when the model adds BOS itself (and one that ends with the EOS text loses it when the
//! model adds EOS), so the tokenized prompt carries exactly one.
//!
//! To know which bytes of the rendered text are message contents, the template is rendered
//! twice: with the real contents and with a unique placeholder for each. The placeholder
//! rendering is cut at the placeholders; putting each content (or, where the template trims
//! it, its trimmed form) back must give the real rendering byte for byte, or the prompt is
//! refused ([`TokenizerError::TemplateContentNotLiteral`]), since a content the template
//! rewrote could no longer be kept apart from the scaffolding.
//!
//! Built-in templates: `gemma` (llama.cpp's `LLM_CHAT_TEMPLATE_GEMMA` in src/llama-chat.cpp:
//! system text merged into the first user turn followed by a blank line, contents trimmed
//! of ASCII whitespace, the assistant role written `model`) for architectures named
//! `gemma*`; ChatML (`LLM_CHAT_TEMPLATE_CHATML`) for a vocabulary with `<|im_start|>`.

use std::ops::Range;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TokenizerError};
use crate::Tokenizer;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (or whatever roles the template knows).
    pub role: String,
    /// The message text; always tokenized as literal text.
    pub content: String,
    /// Every other field the template sees, as OpenAI's and transformers' messages carry
    /// them: `tool_calls` (with `function.arguments` as an object, as templates expect),
    /// `tool_call_id`, `name`, `reasoning_content`.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            extra: serde_json::Map::new(),
        }
    }
}

/// What a chat template sees besides the messages: transformers' `render_jinja_template`
/// arguments (`tools`, `documents`, `add_generation_prompt`, and the keyword arguments a
/// caller adds, such as `enable_thinking` or `reasoning_effort`: llama.cpp's
/// `--chat-template-kwargs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateInputs {
    /// Append the assistant turn's header.
    pub add_generation_prompt: bool,
    /// The tools' JSON schemas (`None`: the template sees `tools` as none).
    pub tools: Option<serde_json::Value>,
    /// Retrieval documents (`None`: none).
    pub documents: Option<serde_json::Value>,
    /// More variables, set in the template's context (they win over the defaults).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// The time `strftime_now` formats (`None`: the system clock); tests freeze it.
    pub now: Option<std::time::SystemTime>,
    /// Each message's content as a list of one text part (`[{"type": "text", "text":
    /// …}]`) instead of a string, as llama.cpp `common/chat.cpp` normalises messages for
    /// templates that read only typed content (SmolVLM's). [`Tokenizer::apply_template_with`]
    /// switches to it by itself when a template renders a string content nowhere.
    pub typed_content: bool,
}

/// The names a message's reasoning comes under; templates read `reasoning_content`, gpt-oss
/// reads `thinking` (transformers `_alias_reasoning_fields` fills both).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// `m` as the template sees it: its fields, with the reasoning under both names templates
/// read (transformers `_alias_reasoning_fields`).
fn template_message(m: &ChatMessage, typed: bool) -> serde_json::Value {
    let mut o = m.extra.clone();
    o.insert("role".into(), m.role.clone().into());
    let content = match typed {
        true => serde_json::json!([{"type": "text", "text": m.content}]),
        false => m.content.clone().into(),
    };
    o.insert("content".into(), content);
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| m.extra.get(*k).filter(|v| !v.is_null()).cloned());
    if let Some(r) = reasoning {
        o.entry("thinking").or_insert_with(|| r.clone());
        o.insert("reasoning_content".into(), r);
    }
    serde_json::Value::Object(o)
}

/// Where a prompt's template came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// A Jinja template: the file's `tokenizer.chat_template` or one given by the caller.
    Jinja,
    /// llama.cpp's built-in `gemma` template (the file has none; Gemma 1-3).
    BuiltinGemma,
    /// llama.cpp's built-in ChatML template (the file has none).
    BuiltinChatml,
}

/// A rendered chat prompt: its text and which bytes of it are message contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The text to tokenize (with `add_special`; a BOS the model adds is not in it).
    pub text: String,
    /// Byte ranges of `text` holding message contents, sorted and disjoint: tokenized with
    /// special-token parsing off. Everything else is template text, parsed for special tokens.
    pub content_ranges: Vec<Range<usize>>,
    /// The template used.
    pub source: TemplateSource,
}

impl ChatPrompt {
    /// The byte ranges of `text` that are the template's own (everything outside the
    /// message contents), sorted and disjoint: where special tokens are parsed.
    pub fn template_ranges(&self) -> Vec<Range<usize>> {
        let mut out = Vec::with_capacity(self.content_ranges.len() + 1);
        let mut at = 0;
        for r in &self.content_ranges {
            if r.start > at {
                out.push(at..r.start);
            }
            at = r.end;
        }
        if at < self.text.len() {
            out.push(at..self.text.len());
        }
        out
    }
}

/// Builds a prompt piece by piece.
#[derive(Default)]
struct Builder {
    text: String,
    content: Vec<Range<usize>>,
}

impl Builder {
    fn scaffold(&mut self, s: &str) {
        self.text.push_str(s);
    }
    fn content(&mut self, s: &str) {
        let start = self.text.len();
        self.text.push_str(s);
        match self.content.last_mut() {
            Some(last) if last.end == start => last.end = self.text.len(),
            _ if s.is_empty() => {}
            _ => self.content.push(start..self.text.len()),
        }
    }
}

/// C `isspace` trimming, as llama.cpp's built-in templates trim contents.
fn trim_c_space(s: &str) -> &str {
    s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'))
}

fn gemma(messages: &[ChatMessage], add_generation_prompt: bool) -> Builder {
    let mut b = Builder::default();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(trim_c_space(&m.content));
            continue;
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            m.role.as_str()
        };
        b.scaffold(&format!("<start_of_turn>{role}\n"));
        if !system.is_empty() && role != "model" {
            b.content(&std::mem::take(&mut system));
            b.scaffold("\n\n");
        }
        b.content(trim_c_space(&m.content));
        b.scaffold("<end_of_turn>\n");
    }
    if add_generation_prompt {
        b.scaffold("<start_of_turn>model\n");
    }
    b
}

fn chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> Builder {
    let mut b = Builder::default();
    for m in messages {
        b.scaffold(&format!("<|im_start|>{}\n", m.role));
        b.content(&m.content);
        b.scaffold("<|im_end|>\n");
    }
    if add_generation_prompt {
        b.scaffold("<|im_start|>assistant\n");
    }
    b
}

/// Python `json.dumps` options, as transformers' `tojson` filter passes them.
struct JsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// A string as `json.dumps` writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`, and with `ensure_ascii` every non-ASCII character as
/// `\uXXXX` (UTF-16 surrogate pairs above U+FFFF).
fn python_json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `value` as Python's `json.dumps(value, **style)` formats it (transformers registers
/// `tojson` as exactly that call; chat_template_utils.py).
fn to_python_json(value: &Value, style: &JsonStyle, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(value.clone()) {
                out.push_str(&i.to_string());
            } else if let Ok(f) = f64::try_from(value.clone()) {
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else if f.is_finite() {
                    out.push_str(&f.to_string());
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                }
            } else {
                out.push_str(&value.to_string());
            }
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter().map(|it| it.collect()).unwrap_or_default();
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                to_python_json(v, style, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<(String, Value)> = value
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        let name = k
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| k.to_string());
                        (name, k)
                    })
                    .collect()
                })
                .unwrap_or_default();
            if keys.is_empty() {
                out.push_str("{}");
                return;
            }
            if style.sort_keys {
                keys.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (name, k)) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                python_json_string(name, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                let v = value.get_item(k).unwrap_or(Value::UNDEFINED);
                to_python_json(&v, style, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            let s = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            python_json_string(&s, style.ensure_ascii, out);
        }
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`: Python's defaults, `separators` a pair `(item, key)` (default
/// `(", ", ": ")`, or `(",", ": ")` with an indent), no HTML escaping.
fn tojson_filter(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.filter(|v| !v.is_none()) {
        None => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
        Some(v) => {
            let parts: Vec<String> = v
                .try_iter()
                .map(|it| it.filter_map(|p| p.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            match parts.as_slice() {
                [a, b] => (a.clone(), b.clone()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    to_python_json(&value, &style, 0, &mut out);
    Ok(out)
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `source` with transformers' `{% generation %}` / `{% endgeneration %}` tags (its
/// `AssistantTracker` extension, which only marks assistant text and renders its body as
/// is) turned into an always-true `if` block with the same whitespace control, which
/// minijinja renders the same way.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(p) = rest.find("{%") {
        out.push_str(&rest[..p]);
        let tag = &rest[p..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Instructions a template may run for one rendering: a real template renders a long
/// conversation in well under a million (the 19 templates of the tests, with tools, in at
/// most some tens of thousands), and a template that loops without end stops within a
/// second instead of holding a server thread (minijinja's fuel).
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// The longest prompt text a template may render, in bytes; longer is an error (a
/// template that renders megabytes of nothing, or a request too large for any context).
pub const TEMPLATE_MAX_OUTPUT: usize = 64 << 20;

fn environment(source: &str, now: std::time::SystemTime) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizerError::Template(e.to_string()))?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", move |format: String| {
        crate::strftime::format(&format, now)
            .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
    });
    env.add_filter("tojson", tojson_filter);
    // Jinja2's `iterable` test: false for none and scalars (minijinja's says true for none,
    // and a template then takes `tools | length` of none: Qwen3-Coder's).
    env.add_test("iterable", |v: Value| {
        matches!(
            v.kind(),
            ValueKind::Seq
                | ValueKind::Map
                | ValueKind::Iterable
                | ValueKind::String
                | ValueKind::Bytes
        )
    });
    env.add_template_owned("chat_template", without_generation_tags(source))
        .map_err(template_error)?;
    Ok(env)
}

/// Renders `source` (a chat template) for `messages` as transformers'
/// `render_jinja_template` does: the context holds `messages` (each message's fields, the
/// reasoning aliased), `tools`, `documents`, `add_generation_prompt`, `bos_token`,
/// `eos_token` and `inputs.kwargs`.
///
/// Errors: [`TokenizerError::Template`] when the template does not compile or fails to
/// render (including `raise_exception`).
pub fn render_template(
    source: &str,
    messages: &[ChatMessage],
    inputs: &TemplateInputs,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let env = environment(
        source,
        inputs.now.unwrap_or_else(std::time::SystemTime::now),
    )?;
    let tmpl = env.get_template("chat_template").map_err(template_error)?;
    let msgs: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| template_message(m, inputs.typed_content))
        .collect();
    let mut ctx = serde_json::Map::new();
    ctx.insert("messages".into(), serde_json::Value::Array(msgs));
    ctx.insert(
        "tools".into(),
        inputs.tools.clone().unwrap_or(serde_json::Value::Null),
    );
    ctx.insert(
        "documents".into(),
        inputs.documents.clone().unwrap_or(serde_json::Value::Null),
    );
    ctx.insert(
        "add_generation_prompt".into(),
        inputs.add_generation_prompt.into(),
    );
    ctx.insert("bos_token".into(), bos_token.into());
    ctx.insert("eos_token".into(), eos_token.into());
    for (k, v) in &inputs.kwargs {
        ctx.insert(k.clone(), v.clone());
    }
    let out = tmpl
        .render(Value::from(minijinja::value::Serde(&ctx)))
        .map_err(template_error)?;
    if out.len() > TEMPLATE_MAX_OUTPUT {
        return Err(TokenizerError::Template(format!(
            "the template rendered {} bytes, more than the {TEMPLATE_MAX_OUTPUT} a prompt may have",
            out.len()
        )));
    }
    Ok(out)
}

fn template_error(e: Error) -> TokenizerError {
    if e.kind() == ErrorKind::OutOfFuel {
        return TokenizerError::Template(format!(
            "the template ran more than {TEMPLATE_FUEL} steps without finishing (does it loop without end?)"
        ));
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    TokenizerError::Template(msg)
}

/// A placeholder marker that appears neither in the template nor in any message.
fn placeholder_marks(template: &str, messages: &[ChatMessage]) -> (String, String) {
    let mut n = 0u32;
    loop {
        let open = format!("\u{F8F0}frink{n}\u{F8F1}");
        let close = format!("\u{F8F2}{n}\u{F8F3}");
        let clash = |s: &str| s.contains('\u{F8F0}') && (s.contains(&open) || s.contains(&close));
        if !clash(template) && !messages.iter().any(|m| clash(&m.content) || clash(&m.role)) {
            return (open, close);
        }
        n += 1;
    }
}

impl Tokenizer {
    /// Renders `messages` with the model's chat template (or the built-in one for its
    /// architecture), `add_generation_prompt` appending the assistant turn's header.
    ///
    /// Errors: [`TokenizerError::NoChatTemplate`] when the file has none and none is built
    /// in for its architecture; [`TokenizerError::Template`] with the engine's message when
    /// the template does not compile or fails to render (including `raise_exception`);
    /// [`TokenizerError::TemplateContentNotLiteral`] when it rewrites message contents.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<ChatPrompt> {
        self.apply_template(self.chat_template(), messages, add_generation_prompt)
    }

    /// As [`Tokenizer::apply_chat_template`], with the Jinja source `template` in place of the
    /// file's (`None`: the file's own or the built-in one), as llama.cpp's `--chat-template`.
    ///
    /// Errors: as [`Tokenizer::apply_chat_template`].
    pub fn apply_template(
        &self,
        template: Option<&str>,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<ChatPrompt> {
        let inputs = TemplateInputs {
            add_generation_prompt,
            ..TemplateInputs::default()
        };
        self.apply_template_with(template, messages, &inputs)
    }

    /// As [`Tokenizer::apply_template`], with everything else the template sees
    /// ([`TemplateInputs`]: tools, documents, keyword arguments, the clock). The built-in
    /// templates (files without one) use only the messages and `add_generation_prompt`.
    ///
    /// Errors: as [`Tokenizer::apply_chat_template`].
    pub fn apply_template_with(
        &self,
        template: Option<&str>,
        messages: &[ChatMessage],
        inputs: &TemplateInputs,
    ) -> Result<ChatPrompt> {
        let add_generation_prompt = inputs.add_generation_prompt;
        let template = template.or(self.chat_template());
        let (mut b, source) = match template {
            Some(t) => (
                self.render_jinja(t, messages, inputs)?,
                TemplateSource::Jinja,
            ),
            // Gemma 1-3's turns; Gemma 4 has a format of its own (`<|turn>`), which a file
            // without a template does not say, so it is refused below rather than guessed.
            None if self.architecture().starts_with("gemma") && self.architecture() != "gemma4" => {
                (
                    gemma(messages, add_generation_prompt),
                    TemplateSource::BuiltinGemma,
                )
            }
            None if self.token_id("<|im_start|>").is_some() => (
                chatml(messages, add_generation_prompt),
                TemplateSource::BuiltinChatml,
            ),
            None => {
                return Err(TokenizerError::NoChatTemplate(
                    self.architecture().to_string(),
                ))
            }
        };
        // One BOS/EOS: the tokenizer adds them where the model says so.
        if self.add_bos() {
            if let Some(bos) = self.bos_id().and_then(|id| self.token_text(id)) {
                let in_scaffold = b.content.first().is_none_or(|r| r.start >= bos.len());
                if in_scaffold && b.text.starts_with(bos) {
                    b.text.drain(..bos.len());
                    for r in &mut b.content {
                        *r = r.start - bos.len()..r.end - bos.len();
                    }
                }
            }
        }
        if self.add_eos() {
            if let Some(eos) = self.eos_id().and_then(|id| self.token_text(id)) {
                let cut = b.text.len().saturating_sub(eos.len());
                let in_scaffold = b.content.last().is_none_or(|r| r.end <= cut);
                if in_scaffold && b.text.ends_with(eos) {
                    b.text.truncate(cut);
                }
            }
        }
        Ok(ChatPrompt {
            text: b.text,
            content_ranges: b.content,
            source,
        })
    }

    /// Renders a Jinja template, its contents located ([`Self::render_jinja_as`]). A
    /// template that renders a message's content nowhere with string contents, but does
    /// with typed ones ([`TemplateInputs::typed_content`]), is rendered with typed ones:
    /// otherwise the message would silently vanish from the prompt.
    fn render_jinja(
        &self,
        template: &str,
        messages: &[ChatMessage],
        inputs: &TemplateInputs,
    ) -> Result<Builder> {
        let (b, placed) = self.render_jinja_as(template, messages, inputs)?;
        let wanted = messages.iter().filter(|m| !m.content.is_empty()).count();
        if placed < wanted && !inputs.typed_content {
            let typed = TemplateInputs {
                typed_content: true,
                ..inputs.clone()
            };
            if let Ok((tb, tplaced)) = self.render_jinja_as(template, messages, &typed) {
                if tplaced > placed {
                    return Ok(tb);
                }
            }
        }
        Ok(b)
    }

    /// Renders a Jinja template and finds each message's content in the result; returns
    /// the text with its content ranges and how many messages' contents it holds.
    fn render_jinja_as(
        &self,
        template: &str,
        messages: &[ChatMessage],
        inputs: &TemplateInputs,
    ) -> Result<(Builder, usize)> {
        let text_of = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        // One clock for both renderings, so a date in the template cannot differ.
        let inputs = TemplateInputs {
            now: Some(inputs.now.unwrap_or_else(std::time::SystemTime::now)),
            ..inputs.clone()
        };
        let render = |msgs: &[ChatMessage]| -> Result<String> {
            render_template(
                template,
                msgs,
                &inputs,
                text_of(self.bos_id()),
                text_of(self.eos_id()),
            )
        };
        let real = render(messages)?;

        let (open, close) = placeholder_marks(template, messages);
        let marked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                role: m.role.clone(),
                content: if m.content.is_empty() {
                    String::new()
                } else {
                    format!("{open}{i}{close}")
                },
                extra: m.extra.clone(),
            })
            .collect();
        let with_marks = render(&marked)?;

        // Cut the placeholder rendering into scaffolding and message references.
        let mut scaffold: Vec<&str> = Vec::new();
        let mut refs: Vec<usize> = Vec::new();
        let mut rest = with_marks.as_str();
        while let Some(p) = rest.find(open.as_str()) {
            scaffold.push(&rest[..p]);
            let after = &rest[p + open.len()..];
            let q = after
                .find(close.as_str())
                .ok_or(TokenizerError::TemplateContentNotLiteral)?;
            let i: usize = after[..q]
                .parse()
                .map_err(|_| TokenizerError::TemplateContentNotLiteral)?;
            if i >= messages.len() {
                return Err(TokenizerError::TemplateContentNotLiteral);
            }
            refs.push(i);
            rest = &after[q + close.len()..];
        }
        scaffold.push(rest);
        if scaffold
            .iter()
            .any(|s| s.contains('\u{F8F0}') || s.contains('\u{F8F2}'))
        {
            // A placeholder was cut or rewritten by the template.
            return Err(TokenizerError::TemplateContentNotLiteral);
        }

        // Put the contents back, each as it is or trimmed, whichever the real text shows.
        let mut b = Builder::default();
        let mut pos = 0;
        for (k, &i) in refs.iter().enumerate() {
            if !real[pos..].starts_with(scaffold[k]) {
                return Err(TokenizerError::TemplateContentNotLiteral);
            }
            b.scaffold(scaffold[k]);
            pos += scaffold[k].len();
            let content = messages[i].content.as_str();
            let next = scaffold[k + 1];
            let fits = |c: &str| {
                let tail = &real[pos..];
                tail.starts_with(c)
                    && if k + 1 == refs.len() {
                        &tail[c.len()..] == next
                    } else {
                        tail[c.len()..].starts_with(next)
                    }
            };
            let chosen = [content, content.trim()]
                .into_iter()
                .find(|c| fits(c))
                .ok_or(TokenizerError::TemplateContentNotLiteral)?;
            b.content(chosen);
            pos += chosen.len();
        }
        let last = scaffold[refs.len()];
        if &real[pos..] != last {
            return Err(TokenizerError::TemplateContentNotLiteral);
        }
        b.scaffold(last);
        debug_assert_eq!(b.text, real);
        let mut placed: Vec<usize> = refs.clone();
        placed.sort_unstable();
        placed.dedup();
        Ok((b, placed.len()))
    }

    /// Tokenizes a rendered prompt: BOS/EOS as the model adds them, special tokens parsed in
    /// the template's text, message contents literal (a user who types `<|im_end|>` gets the
    /// characters, not the control token).
    ///
    /// Errors: as [`Tokenizer::encode`].
    pub fn encode_chat(&self, prompt: &ChatPrompt) -> Result<Vec<u32>> {
        self.encode_ranges(&prompt.text, &prompt.template_ranges(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{{ v | tojson(args) }}` through the template environment.
    fn tojson(v: serde_json::Value, args: &str) -> String {
        let env = environment(
            &format!("{{{{ v | tojson({args}) }}}}"),
            std::time::SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        env.get_template("chat_template")
            .unwrap()
            .render(minijinja::context! { v => Value::from(minijinja::value::Serde(&v)) })
            .unwrap()
    }

    /// Against CPython 3.11's `json.dumps` with the same arguments (transformers' `tojson`
    /// defaults to `ensure_ascii=False`); before, `ensure_ascii` and `sort_keys` were accepted
    /// and ignored.
    #[test]
    fn tojson_formats_like_python_json_dumps() {
        let v = serde_json::json!({"name": "get", "args": [1, 2.5, true, null, "é\n\"<>😀\u{1}"]});
        assert_eq!(
            tojson(v.clone(), ""),
            r#"{"name": "get", "args": [1, 2.5, true, null, "é\n\"<>😀\u0001"]}"#
        );
        assert_eq!(
            tojson(v.clone(), "ensure_ascii=True, sort_keys=True"),
            r#"{"args": [1, 2.5, true, null, "\u00e9\n\"<>\ud83d\ude00\u0001"], "name": "get"}"#
        );
        assert_eq!(
            tojson(v, "separators=(',', ':')"),
            r#"{"name":"get","args":[1,2.5,true,null,"é\n\"<>😀\u0001"]}"#
        );
        assert_eq!(tojson(serde_json::json!([]), ""), "[]");
        assert_eq!(
            tojson(serde_json::json!([1, [2]]), "indent=2"),
            "[\n  1,\n  [\n    2\n  ]\n]"
        );
    }

    /// `{% generation %}` blocks render their body, with their whitespace control kept.
    #[test]
    fn generation_blocks_render_their_body() {
        assert_eq!(
            without_generation_tags("a {%- generation -%} b {% endgeneration %}c{%generation%}"),
            "a {%- if true -%} b {% endif %}c{% if true %}"
        );
        let env = environment(
            "x\n{%- generation %} {{ 1 }} {% endgeneration -%}\ny",
            std::time::SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        let out = env
            .get_template("chat_template")
            .unwrap()
            .render(())
            .unwrap();
        assert_eq!(out, "x 1 y");
    }

    #[test]
    fn gemma_builtin_merges_the_system_prompt() {
        let msgs = [
            ChatMessage::new("system", " Be brief. "),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello\n"),
        ];
        let b = gemma(&msgs, true);
        assert_eq!(
            b.text,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>model\n"
        );
        let contents: Vec<&str> = b.content.iter().map(|r| &b.text[r.clone()]).collect();
        assert_eq!(contents, ["Be brief.", "Hi", "Hello"]);
    }
}
