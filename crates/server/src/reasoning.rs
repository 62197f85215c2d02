//! Reasoning models' thinking (`<think>…</think>`: Qwen3, QwQ, DeepSeek-R1 and its distills;
//! `<|channel>thought…<channel|>`: Gemma 4) separated from the answer into `message.reasoning_content` (llama-server's and vLLM's
//! field), whole or streamed as `delta.reasoning_content`; `--reasoning-format none` or a
//! request's `reasoning_format: "none"` keeps it in the content.
//!
//! Detected from the chat template (the text of its opening tag, [`Tags`]), never the file
//! name. An answer starts inside the thinking when the rendered prompt ends with the
//! opening tag (DeepSeek-R1's generation prompt `<｜Assistant｜><think>\n`); otherwise an
//! answer that opens with the tag (after whitespace) is thinking up to the closing one. A
//! generation prompt that already closed the thinking (Qwen3 with `enable_thinking: false`,
//! Gemma 4's `<|channel>thought\n<channel|>` without it) gives content only.
//!
//! Harmony templates (gpt-oss) mark reasoning by channel instead; [`Splitter`] runs
//! [`crate::harmony::Parser`] for them, which also yields the answer's tool calls.

/// The tags around a model's thinking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tags {
    pub open: &'static str,
    pub close: &'static str,
    /// The vocabulary tokens the tags are made of (an answer shows them as text where
    /// they are control tokens, so the split sees them).
    pub tokens: &'static [&'static str],
}

/// `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1).
pub const THINK: Tags = Tags {
    open: "<think>",
    close: "</think>",
    tokens: &["<think>", "</think>"],
};

/// Gemma 4's thought channel (its template's `strip_thinking` cuts the same marks out of
/// the history; llama.cpp's `common_chat_params_init_gemma4` splits on them). Control
/// tokens of its vocabulary: an answer that may hold them shows them as text.
pub const GEMMA4: Tags = Tags {
    open: "<|channel>thought",
    close: "<channel|>",
    tokens: &["<|channel>", "<channel|>"],
};

/// The tags `template` teaches the model to think in, if any.
pub fn detect(template: &str) -> Option<Tags> {
    [GEMMA4, THINK]
        .into_iter()
        .find(|t| template.contains(t.open))
}

/// Whether `template` lets the model reason before answering, in tags or in harmony's
/// analysis channel.
pub fn thinks(template: &str) -> bool {
    detect(template).is_some() || crate::harmony::detect(template)
}

/// Whether an answer to `prompt` (the rendered text) starts inside the thinking `tags` open.
pub fn starts_inside(prompt: &str, tags: Tags) -> bool {
    prompt.trim_end().ends_with(tags.open)
}

pub use crate::calls::Part;

/// How an answer's reasoning is marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Thinking between `tags`; `inside`: the answer starts inside the thinking.
    Think {
        /// The prompt opened the thinking.
        inside: bool,
        tags: Tags,
    },
    /// Harmony channels; `inline`: the analysis stays in the content.
    Harmony {
        /// `--reasoning-format none`.
        inline: bool,
    },
}

impl Mode {
    /// The mode for an answer to `prompt` (the rendered text) under `template`, or `None`
    /// when nothing is split off: a template without reasoning, or `split` false for
    /// tag templates (harmony is always parsed, for its final channel and calls).
    pub fn detect(template: &str, prompt: &str, split: bool) -> Option<Mode> {
        if crate::harmony::detect(template) {
            return Some(Mode::Harmony { inline: !split });
        }
        detect(template).filter(|_| split).map(|tags| Mode::Think {
            inside: starts_inside(prompt, tags),
            tags,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the answer may still open the thinking.
    Start,
    Thinking,
    /// Right after the thinking: the answer's leading whitespace is dropped.
    AfterThinking,
    Answer,
}

/// Splits an answer fed piece by piece into thinking, content and (harmony) calls; text that
/// may still be the start of a tag is held back. Fed whole or token by token, the same split.
#[derive(Debug)]
pub enum Splitter {
    /// Thinking tags.
    Think(ThinkSplitter),
    /// Harmony channels.
    Harmony(crate::harmony::Parser),
}

impl Splitter {
    /// A splitter for `mode`; `tools` are those a harmony answer may call.
    pub fn new(mode: Mode, tools: &crate::calls::ToolSet) -> Splitter {
        match mode {
            Mode::Think { inside, tags } => Splitter::Think(ThinkSplitter::new(inside, tags)),
            Mode::Harmony { inline } => {
                Splitter::Harmony(crate::harmony::Parser::new(inline, tools.clone()))
            }
        }
    }

    /// Feeds `text`; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        match self {
            Splitter::Think(s) => s.push(text),
            Splitter::Harmony(p) => p.push(text),
        }
    }

    /// The end of the answer: what was held.
    pub fn finish(self) -> Vec<Part> {
        match self {
            Splitter::Think(s) => s.finish(),
            Splitter::Harmony(p) => p.finish(),
        }
    }
}

/// The splitter of thinking between tags.
#[derive(Debug)]
pub struct ThinkSplitter {
    state: State,
    buf: String,
    tags: Tags,
}

impl ThinkSplitter {
    /// A splitter for an answer that starts inside the thinking or not.
    pub fn new(inside: bool, tags: Tags) -> ThinkSplitter {
        ThinkSplitter {
            state: if inside {
                State::Thinking
            } else {
                State::Start
            },
            buf: String::new(),
            tags,
        }
    }

    /// Feeds `text`; returns what is decided.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let Tags { open, close, .. } = self.tags;
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(open) {
                        let skip = self.buf.len() - t.len() + open.len();
                        self.buf.drain(..skip);
                        self.state = State::Thinking;
                    } else if t.is_empty() || open.starts_with(t) {
                        break;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.buf.find(close) {
                    Some(end) => {
                        let r: String = self.buf[..end].to_string();
                        self.buf.drain(..end + close.len());
                        if !r.is_empty() {
                            out.push(Part::Reasoning(r));
                        }
                        self.state = State::AfterThinking;
                    }
                    None => {
                        let keep = frink_engine::partial_match_len(&self.buf, close);
                        let cut = self.buf.len() - keep;
                        if cut > 0 {
                            out.push(Part::Reasoning(self.buf[..cut].to_string()));
                            self.buf.drain(..cut);
                        }
                        break;
                    }
                },
                State::AfterThinking => {
                    let t = self.buf.trim_start().len();
                    self.buf.drain(..self.buf.len() - t);
                    if self.buf.is_empty() {
                        break;
                    }
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.buf.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// The end of the answer: what was held.
    pub fn finish(self) -> Vec<Part> {
        match self.state {
            _ if self.buf.is_empty() => Vec::new(),
            State::Thinking => vec![Part::Reasoning(self.buf)],
            State::AfterThinking => Vec::new(),
            State::Start | State::Answer => vec![Part::Content(self.buf)],
        }
    }
}

/// The parts of a whole answer.
pub fn split_parts(mode: Mode, tools: &crate::calls::ToolSet, text: &str) -> Vec<Part> {
    let mut s = Splitter::new(mode, tools);
    let mut parts = s.push(text);
    parts.extend(s.finish());
    parts
}

/// The calls among `parts`, in order.
pub fn calls(parts: &[Part]) -> Vec<crate::calls::ToolCall> {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Call(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// The reasoning and the content of `parts`, each joined (calls left out).
pub fn gather(parts: Vec<Part>) -> (String, String) {
    let (mut r, mut c) = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => r.push_str(&t),
            Part::Content(t) => c.push_str(&t),
            Part::Call(_) => {}
        }
    }
    (r, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(inside: bool, text: &str) -> (String, String) {
        gather(split_parts(
            Mode::Think {
                inside,
                tags: THINK,
            },
            &crate::calls::ToolSet::default(),
            text,
        ))
    }

    /// Recorded shapes: Qwen3 thinking on (the answer opens the tag), DeepSeek-R1 (the
    /// prompt opened it), Qwen3 thinking off (the prompt closed it: no tags in the answer),
    /// an answer cut inside the thinking, an answer with no thinking.
    #[test]
    fn answers_split_into_reasoning_and_content() {
        assert_eq!(
            split(false, "<think>\nThe capital is Paris.\n</think>\n\nParis."),
            (
                "\nThe capital is Paris.\n".to_string(),
                "Paris.".to_string()
            )
        );
        assert_eq!(
            split(true, "Okay, France.\n</think>\n\nParis."),
            ("Okay, France.\n".to_string(), "Paris.".to_string())
        );
        assert_eq!(
            split(false, "Paris."),
            (String::new(), "Paris.".to_string())
        );
        assert_eq!(
            split(true, "Still thinking"),
            ("Still thinking".to_string(), String::new())
        );
        assert_eq!(split(false, "<thin"), (String::new(), "<thin".to_string()));
        assert!(starts_inside("<｜Assistant｜><think>\n", THINK));
        assert!(!starts_inside(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            THINK
        ));
        assert_eq!(detect("{{ '<think>' }}"), Some(THINK));
        assert_eq!(detect("plain"), None);
    }

    /// Gemma 4: its template (tests/data/templates of frink-tokenizer) is detected by its
    /// thought channel; with thinking on the answer opens the channel, with it off the
    /// generation prompt closed an empty one (content only); streamed in pieces the same.
    #[test]
    fn gemma4_thought_channel_splits_off() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tokenizer/tests/data/templates/"
        );
        let t = std::fs::read_to_string(format!("{dir}google-gemma-4-31B-it.jinja")).unwrap();
        assert_eq!(detect(&t), Some(GEMMA4));
        assert!(thinks(&t));
        let off = "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";
        assert_eq!(
            Mode::detect(&t, off, true),
            Some(Mode::Think {
                inside: false,
                tags: GEMMA4
            })
        );
        let mode = Mode::Think {
            inside: false,
            tags: GEMMA4,
        };
        let tools = crate::calls::ToolSet::default();
        let text = "<|channel>thought\nFrance's capital.<channel|>Paris.";
        let whole = gather(split_parts(mode, &tools, text));
        assert_eq!(
            whole,
            ("\nFrance's capital.".to_string(), "Paris.".to_string())
        );
        for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut sp = Splitter::new(mode, &tools);
            let mut parts = sp.push(&text[..cut]);
            parts.extend(sp.push(&text[cut..]));
            parts.extend(sp.finish());
            assert_eq!(gather(parts), whole, "cut at {cut}");
        }
        assert_eq!(
            gather(split_parts(mode, &tools, "Paris.")),
            (String::new(), "Paris.".to_string())
        );
    }

    /// Split at every character boundary, the stream gives the whole split.
    #[test]
    fn streaming_at_every_boundary_gives_the_whole_split() {
        for (inside, text) in [
            (false, "  <think>Hmm, é?</think>\n\nAnswer: <b>é</b>"),
            (true, "think </thi more</think>ok"),
        ] {
            let whole = split(inside, text);
            for cut in 1..text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut s = ThinkSplitter::new(inside, THINK);
                let mut parts = s.push(&text[..cut]);
                parts.extend(s.push(&text[cut..]));
                parts.extend(s.finish());
                assert_eq!(gather(parts), whole, "{text:?} cut at {cut}");
            }
        }
    }
}
