//! The stream parser: a model's output read as it arrives into text and complete calls of
//! its format (or the JSON fallback), holding back only what may still become a marker.

use frink_engine::partial_match_len;

use super::format::*;
use super::parse::json_fallback;
use crate::calls::{Item, ToolCall, ToolSet};

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
    /// without its closing marker counts if its body is a valid call; a cut one is
    /// dropped).
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
            // A call the output ends inside counts if its body is already a call. Else, one
            // cut short (by `max_tokens` or the context: a format with a closing marker
            // never wrote it, or the body's brackets or a string are still open) is
            // dropped, never shown as content; a finished body that is no call stays
            // content, as a closed one does.
            let body = strip_markers(&rest, syntax.drop);
            let cut = syntax.close.is_some() || unfinished(&body);
            return match self.format.parse_body(&body, &self.tools) {
                Some(calls) => calls.into_iter().map(Item::Call).collect(),
                None if cut => Vec::new(),
                None => self.body_items(&body, &syntax, false),
            };
        }
        let rest = strip_markers(&rest, syntax.drop);
        if rest.is_empty() {
            Vec::new()
        } else {
            vec![Item::Text(rest)]
        }
    }
}

/// Whether `body` stops inside a JSON string or with a bracket or brace still open.
fn unfinished(body: &str) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0i64, false, false);
    for c in body.chars() {
        match (in_string, c) {
            (true, _) if escaped => escaped = false,
            (true, '\\') => escaped = true,
            (true, '"') => in_string = false,
            (true, _) => {}
            (false, '"') => in_string = true,
            (false, '{' | '[') => depth += 1,
            (false, '}' | ']') => depth -= 1,
            _ => {}
        }
    }
    in_string || depth > 0
}

/// `text` without the markers `drop`.
fn strip_markers(text: &str, drop: &[&str]) -> String {
    drop.iter().fold(text.to_string(), |t, m| t.replace(m, ""))
}

/// A whole output read for calls alone (no reasoning to split): its content (the text
/// between calls, joined; trimmed when there are calls, as a whole chat answer's content is)
/// `crate::answer::AnswerFormat::parse`) and its calls.
pub fn parse(format: ToolFormat, tools: &ToolSet, text: &str) -> (String, Vec<ToolCall>) {
    let mut p = StreamParser::new(format, tools.clone());
    let mut items = p.push(text);
    items.extend(p.finish());
    let (mut content, calls) = gather(items);
    if !calls.is_empty() {
        content = content.trim().to_string();
    }
    (content, calls)
}

/// The text of `items` joined, and their calls in order.
pub(super) fn gather(items: Vec<Item>) -> (String, Vec<ToolCall>) {
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
