//! OpenAI's harmony response format (gpt-oss): the answer is a sequence of messages, each a
//! header (` to=RECIPIENT`, `<|channel|>CHANNEL`, a `<|constrain|>` or `json` content type)
//! then `<|message|>` and a body ending at `<|end|>`, at the next `<|start|>` or at the end
//! of generation (`<|call|>` and `<|return|>` end it; frink's vocabulary treats `<|end|>` as
//! text, as llama.cpp does). The generation prompt ends with `<|start|>assistant`, so the
//! first header follows at once; later messages repeat `<|start|>assistant`.
//!
//! Channels (the rules of the format as the gpt-oss chat template writes the history, and
//! OpenAI's harmony guide describes them): `analysis` is reasoning (`reasoning_content`),
//! `final` is the answer, `commentary` to `functions.NAME` is a call of tool NAME whose body
//! is the JSON arguments, other `commentary` is content (a preamble the model shows the user).
//! With `--reasoning-format none` (or a request's `reasoning_format: "none"`) the analysis
//! messages stay in the content as the model wrote them, markers included.

use crate::calls::{Part, ToolSet};
use frink_engine::partial_match_len;

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
/// The role after each later `<|start|>`.
const ROLE: &str = "assistant";

/// The harmony markers the parser reads (they render as text; `<|end|>` is a control
/// token of the vocabulary, shown for the parser).
pub const MARKERS: &[&str] = &[START, END, MESSAGE, CHANNEL, CONSTRAIN];

/// Whether `template` writes harmony messages.
pub fn detect(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

/// What a message's body is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// The analysis channel.
    Reasoning,
    /// The final channel, a commentary preamble, or text with no header at all.
    Content,
    /// A commentary message to `functions.NAME` (one of the request's tools).
    Call(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Reading a header up to `<|message|>`.
    Header,
    /// Inside a body.
    Body(Kind),
    /// After a body: expecting `<|start|>assistant`.
    Between,
}

/// Splits a harmony answer fed piece by piece into reasoning, content and calls; text that
/// may still be the start of a marker is held back. Fed whole or token by token, the same
/// parts.
#[derive(Debug)]
pub struct Parser {
    state: State,
    buf: String,
    /// The header of the message being read (a call's raw text, if it is not a call).
    header: String,
    /// A call's body so far.
    call: String,
    inline: bool,
    tools: ToolSet,
}

impl Parser {
    /// A parser for an answer starting right after `<|start|>assistant`; `inline` keeps the
    /// analysis in the content; `tools` are those the answer may call.
    pub fn new(inline: bool, tools: ToolSet) -> Parser {
        Parser {
            state: State::Header,
            buf: String::new(),
            header: String::new(),
            call: String::new(),
            inline,
            tools,
        }
    }

    /// What a header's message is.
    fn classify(&self, header: &str) -> Kind {
        let recipient = header.split_once("to=").map(|(_, r)| {
            r.split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("")
        });
        if let Some(name) = recipient.and_then(|r| r.strip_prefix("functions.")) {
            if self.tools.has(name) {
                return Kind::Call(name.to_string());
            }
        }
        let channel = header.split_once(CHANNEL).map(|(_, c)| {
            c.split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("")
        });
        match channel {
            Some("analysis") => Kind::Reasoning,
            _ => Kind::Content,
        }
    }

    /// A body piece of the current message, as a part.
    fn body(&mut self, kind: &Kind, text: &str, out: &mut Vec<Part>) {
        if text.is_empty() {
            return;
        }
        match kind {
            Kind::Reasoning if !self.inline => out.push(Part::Reasoning(text.to_string())),
            Kind::Reasoning | Kind::Content => out.push(Part::Content(text.to_string())),
            Kind::Call(_) => self.call.push_str(text),
        }
    }

    /// The end of the current message (`end`: the marker that ended it, as written).
    fn close(&mut self, kind: &Kind, end: &str, out: &mut Vec<Part>) {
        match kind {
            Kind::Reasoning if self.inline => out.push(Part::Content(end.to_string())),
            Kind::Call(name) => {
                let body = std::mem::take(&mut self.call);
                match crate::calls::call_from(name, &body) {
                    Some(c) => out.push(Part::Call(c)),
                    None => out.push(Part::Content(format!(
                        "{}{MESSAGE}{body}{end}",
                        self.header
                    ))),
                }
            }
            _ => {}
        }
    }

    /// Feeds `text`; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state.clone() {
                State::Header => {
                    if let Some(i) = self.buf.find(MESSAGE) {
                        self.header = self.buf[..i].to_string();
                        self.buf.drain(..i + MESSAGE.len());
                        let kind = self.classify(&self.header);
                        if kind == Kind::Reasoning && self.inline {
                            out.push(Part::Content(format!("{}{MESSAGE}", self.header)));
                        }
                        self.state = State::Body(kind);
                        continue;
                    }
                    // No header at all (a model answering in plain text): all content.
                    let t = self.buf.trim_start();
                    let header_like = [CHANNEL, " to=", "to=", CONSTRAIN]
                        .iter()
                        .any(|m| t.starts_with(m) || m.starts_with(t));
                    if !header_like {
                        self.header.clear();
                        self.state = State::Body(Kind::Content);
                        continue;
                    }
                    break;
                }
                State::Body(kind) => {
                    let end = [END, START]
                        .iter()
                        .filter_map(|m| self.buf.find(m).map(|i| (i, *m)))
                        .min();
                    match end {
                        Some((i, m)) => {
                            let piece: String = self.buf[..i].to_string();
                            self.body(&kind, &piece, &mut out);
                            // `<|start|>` stays for the next state to read.
                            let skip = if m == END { i + END.len() } else { i };
                            self.buf.drain(..skip);
                            self.close(&kind, if m == END { END } else { "" }, &mut out);
                            self.state = State::Between;
                        }
                        None => {
                            let keep = [END, START]
                                .iter()
                                .map(|m| partial_match_len(&self.buf, m))
                                .max()
                                .unwrap_or(0);
                            let cut = self.buf.len() - keep;
                            let piece: String = self.buf[..cut].to_string();
                            self.buf.drain(..cut);
                            self.body(&kind, &piece, &mut out);
                            break;
                        }
                    }
                }
                State::Between => {
                    let Some(i) = self.buf.find(START) else {
                        // Only whitespace is expected between messages; hold it.
                        break;
                    };
                    let after = &self.buf[i + START.len()..];
                    if after.len() < ROLE.len() && ROLE.starts_with(after) {
                        break;
                    }
                    let role = if after.starts_with(ROLE) {
                        ROLE.len()
                    } else {
                        0
                    };
                    self.buf.drain(..i + START.len() + role);
                    self.state = State::Header;
                }
            }
        }
        out
    }

    /// The end of the answer: the last message, ended by the end of generation.
    pub fn finish(mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match self.state.clone() {
            State::Header if !rest.trim().is_empty() => out.push(Part::Content(rest)),
            State::Header | State::Between => {}
            State::Body(kind) => {
                self.body(&kind, &rest, &mut out);
                self.close(&kind, "", &mut out);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::ToolCall;
    use serde_json::json;

    fn tools() -> ToolSet {
        let t = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        ToolSet::new(&[&t])
    }

    fn run(inline: bool, text: &str) -> Vec<Part> {
        let mut p = Parser::new(inline, tools());
        let mut parts = p.push(text);
        parts.extend(p.finish());
        merge(parts)
    }

    /// Adjacent parts of one kind joined (streamed pieces compare equal to the whole).
    fn merge(parts: Vec<Part>) -> Vec<Part> {
        let mut out: Vec<Part> = Vec::new();
        for p in parts {
            match (out.last_mut(), &p) {
                (Some(Part::Reasoning(a)), Part::Reasoning(b))
                | (Some(Part::Content(a)), Part::Content(b)) => a.push_str(b),
                _ => out.push(p),
            }
        }
        out
    }

    /// Recorded shapes of gpt-oss answers (the forms its template writes into the history
    /// and the harmony guide shows): analysis then final; analysis then a call with the
    /// recipient after the channel; a call with the recipient in the header before it; a
    /// plain-text answer; a call to an unknown function; a malformed call body.
    #[test]
    fn harmony_answers_split_into_reasoning_content_and_calls() {
        let weather = ToolCall {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        };
        assert_eq!(
            run(false, "<|channel|>analysis<|message|>User asks capital.<|end|><|start|>assistant<|channel|>final<|message|>Paris."),
            [Part::Reasoning("User asks capital.".into()), Part::Content("Paris.".into())]
        );
        assert_eq!(
            run(false, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"),
            [Part::Reasoning("Need weather.".into()), Part::Call(weather.clone())]
        );
        assert_eq!(
            run(false, " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}"),
            [Part::Call(weather.clone())]
        );
        assert_eq!(
            run(false, "Just text."),
            [Part::Content("Just text.".into())]
        );
        let unknown = "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}";
        assert_eq!(
            run(false, unknown),
            [Part::Content("{}".into())],
            "a call of a tool the request does not have is the body as content"
        );
        let bad = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": ";
        assert_eq!(
            run(false, bad),
            [Part::Content(
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": ".into()
            )]
        );
        // Inline: the analysis stays in the content with its markers.
        assert_eq!(
            run(true, "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Paris."),
            [Part::Content("<|channel|>analysis<|message|>Hmm.<|end|>Paris.".into())]
        );
        assert!(detect(
            "{{- \"<|start|>assistant<|channel|>final<|message|>\" }}"
        ));
        assert!(!detect("<|im_start|>"));
    }

    /// Split at every character boundary, the stream gives the whole parse.
    #[test]
    fn harmony_streaming_at_every_boundary_gives_the_whole_parse() {
        let text = "<|channel|>analysis<|message|>Think é <|en.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Zürich\"}<|end|><|start|>assistant<|channel|>final<|message|>Done <|sta";
        for inline in [false, true] {
            let whole = run(inline, text);
            for cut in 1..text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut p = Parser::new(inline, tools());
                let mut parts = p.push(&text[..cut]);
                parts.extend(p.push(&text[cut..]));
                parts.extend(p.finish());
                assert_eq!(merge(parts), whole, "cut at {cut}");
            }
        }
    }
}
