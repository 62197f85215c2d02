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
    /// `system`, `user`, `assistant` (or whatever roles the template knows).
    pub role: String,
    /// The message text; always tokenized as literal text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Where a prompt's template came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// A Jinja template: the file's `tokenizer.chat_template` or one given by the caller.
    Jinja,
    /// llama.cpp's built-in `gemma` template (the file has none).
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

/// `tojson` as Python's `json.dumps(x, ensure_ascii=False, indent=indent)` formats it, which
/// is what Hugging Face's template environment registers.
fn to_python_json(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
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
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                to_python_json(v, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter().map(|it| it.collect()).unwrap_or_default();
            if keys.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let key = k
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| k.to_string());
                out.push_str(&serde_json::to_string(&key).expect("strings serialize"));
                out.push_str(": ");
                let v = value.get_item(k).unwrap_or(Value::UNDEFINED);
                to_python_json(&v, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            let s = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            out.push_str(&serde_json::to_string(&s).expect("strings serialize"));
        }
    }
}

fn tojson_filter(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; Python's defaults are what is implemented.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    to_python_json(&value, indent, 0, &mut out);
    Ok(out)
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn environment(source: &str) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizerError::Template(e.to_string()))?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson_filter);
    env.add_template_owned("chat_template", source.to_string())
        .map_err(template_error)?;
    Ok(env)
}

fn template_error(e: Error) -> TokenizerError {
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
        let template = template.or(self.chat_template());
        let (mut b, source) = match template {
            Some(t) => (
                self.render_jinja(t, messages, add_generation_prompt)?,
                TemplateSource::Jinja,
            ),
            None if self.architecture().starts_with("gemma") => (
                gemma(messages, add_generation_prompt),
                TemplateSource::BuiltinGemma,
            ),
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

    fn render_jinja(
        &self,
        template: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Builder> {
        let env = environment(template)?;
        let tmpl = env.get_template("chat_template").map_err(template_error)?;
        let text_of = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        let render = |msgs: &[ChatMessage]| -> Result<String> {
            tmpl.render(minijinja::context! {
                messages => Value::from(minijinja::value::Serde(msgs)),
                add_generation_prompt => add_generation_prompt,
                bos_token => text_of(self.bos_id()),
                eos_token => text_of(self.eos_id()),
            })
            .map_err(template_error)
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
        Ok(b)
    }

    /// Tokenizes a rendered prompt: BOS/EOS as the model adds them, special tokens parsed in
    /// the template's text, message contents literal (a user who types `<|im_end|>` gets the
    /// characters, not the control token).
    ///
    /// Errors: as [`Tokenizer::encode`].
    pub fn encode_chat(&self, prompt: &ChatPrompt) -> Result<Vec<u32>> {
        let mut special = Vec::with_capacity(prompt.content_ranges.len() + 1);
        let mut at = 0;
        for r in &prompt.content_ranges {
            if r.start > at {
                special.push(at..r.start);
            }
            at = r.end;
        }
        if at < prompt.text.len() {
            special.push(at..prompt.text.len());
        }
        self.encode_ranges(&prompt.text, &special, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(v: serde_json::Value, indent: Option<usize>) -> String {
        let mut out = String::new();
        to_python_json(
            &Value::from(minijinja::value::Serde(&v)),
            indent,
            0,
            &mut out,
        );
        out
    }

    #[test]
    fn tojson_formats_like_python_json_dumps() {
        // Expected strings written as Python 3's json.dumps(x, ensure_ascii=False) prints them.
        let v = serde_json::json!({"name": "get", "args": [1, 2.5, true, null, "é\n\"<>"]});
        let s = json(v, None);
        assert!(
            s == r#"{"args": [1, 2.5, true, null, "é\n\"<>"], "name": "get"}"#
                || s == r#"{"name": "get", "args": [1, 2.5, true, null, "é\n\"<>"]}"#,
            "{s}"
        );
        assert_eq!(json(serde_json::json!([]), None), "[]");
        assert_eq!(
            json(serde_json::json!([1, [2]]), Some(2)),
            "[\n  1,\n  [\n    2\n  ]\n]"
        );
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
