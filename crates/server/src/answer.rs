//! How a chat answer is read: reasoning split off ([`crate::reasoning`], harmony channels
//! in [`crate::harmony`]), then tool calls parsed out of the content ([`crate::tools`]).
//! One body for both shapes of response: a whole answer is the stream fed at once.

use crate::reasoning::{Mode, Part, Splitter};
use crate::tools::{Item, StreamParser, ToolCall, ToolFormat, ToolSet};

/// What to read out of a chat answer.
#[derive(Clone, Debug, Default)]
pub struct AnswerFormat {
    /// Parse tool calls written in this format out of the content.
    pub tool_format: Option<ToolFormat>,
    /// The tools the answer may call.
    pub tools: ToolSet,
    /// Split reasoning off.
    pub reasoning: Option<Mode>,
}

impl AnswerFormat {
    /// A reader for one answer.
    pub fn stream(&self) -> AnswerStream {
        AnswerStream {
            splitter: self.reasoning.map(|m| Splitter::new(m, &self.tools)),
            parser: self
                .tool_format
                .map(|f| StreamParser::new(f, self.tools.clone())),
        }
    }

    /// A whole answer read: (reasoning, content, calls); the content of an answer with
    /// calls has its surrounding whitespace trimmed.
    pub fn parse(&self, text: &str) -> (String, String, Vec<ToolCall>) {
        let mut s = self.stream();
        let mut parts = s.push(text);
        parts.extend(s.finish());
        let calls = crate::reasoning::calls(&parts);
        let (reasoning, mut content) = crate::reasoning::gather(parts);
        if !calls.is_empty() {
            content = content.trim().to_string();
        }
        (reasoning, content, calls)
    }
}

/// One answer being read, piece by piece.
#[derive(Debug)]
pub struct AnswerStream {
    splitter: Option<Splitter>,
    parser: Option<StreamParser>,
}

impl AnswerStream {
    /// Content parts through the tool-call parser.
    fn through_parser(&mut self, parts: Vec<Part>) -> Vec<Part> {
        let Some(p) = self.parser.as_mut() else {
            return parts;
        };
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Content(t) => out.extend(p.push(&t).into_iter().map(item_part)),
                other => out.push(other),
            }
        }
        out
    }

    /// Feeds `text`; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let parts = match self.splitter.as_mut() {
            Some(s) => s.push(text),
            None => vec![Part::Content(text.to_string())],
        };
        self.through_parser(parts)
    }

    /// The end of the answer: what was held.
    pub fn finish(mut self) -> Vec<Part> {
        let parts = self
            .splitter
            .take()
            .map(Splitter::finish)
            .unwrap_or_default();
        let mut out = self.through_parser(parts);
        if let Some(p) = self.parser.take() {
            out.extend(p.finish().into_iter().map(item_part));
        }
        out
    }
}

fn item_part(it: Item) -> Part {
    match it {
        Item::Text(t) => Part::Content(t),
        Item::Call(c) => Part::Call(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Qwen3 thinking, then text and a Hermes call: reasoning, content and the call apart,
    /// the same whole and fed at every character boundary.
    #[test]
    fn reasoning_then_calls_read_alike_whole_and_streamed() {
        let t = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let fmt = AnswerFormat {
            tool_format: Some(ToolFormat::Hermes),
            tools: ToolSet::new(&[&t]),
            reasoning: Some(Mode::Think {
                inside: false,
                tags: crate::reasoning::THINK,
            }),
        };
        let text = "<think>\nNeed f.\n</think>\n\nCalling.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        let whole = fmt.parse(text);
        assert_eq!(
            whole,
            (
                "\nNeed f.\n".to_string(),
                "Calling.".to_string(),
                vec![ToolCall {
                    name: "f".into(),
                    arguments: r#"{"x":1}"#.into()
                }]
            )
        );
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut s = fmt.stream();
            let mut parts = s.push(&text[..cut]);
            parts.extend(s.push(&text[cut..]));
            parts.extend(s.finish());
            let calls = crate::reasoning::calls(&parts);
            let (r, c) = crate::reasoning::gather(parts);
            assert_eq!((r, c.trim().to_string(), calls), whole, "cut at {cut}");
        }
    }
}
