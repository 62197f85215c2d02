//! llama.cpp's completion extensions that editors send (llama.vscode, llama.vim): the
//! sampler order (`samplers`), and two limits on the answer's text, `n_indent` and
//! `t_max_predict_ms`, applied as the text arrives ([`Watch`]).
//!
//! Rules from llama.cpp's `tools/server/server-context.cpp` (`process_token`) and
//! `common/sampling.cpp` (`common_sampler_types_from_names`, `…_from_chars`).

use std::time::{Duration, Instant};

use frink_engine::sampling::{Chain, Stage, INFILL_MAX_CANDIDATES};
use frink_engine::scheduler::{Event, EventSink};
use frink_engine::FinishReason;
use serde_json::{Map, Value};

use crate::api::{self, ApiError};

/// The one-letter names of llama.cpp's samplers (`common_sampler_type_to_chr`), for
/// `samplers` given as a string such as `"edkypmxt"`.
const LETTERS: &[(char, &str)] = &[
    ('e', "penalties"),
    ('d', "dry"),
    ('k', "top_k"),
    ('y', "typ_p"),
    ('p', "top_p"),
    ('s', "top_n_sigma"),
    ('m', "min_p"),
    ('x', "xtc"),
    ('t', "temperature"),
    ('i', "infill"),
];

fn bad(message: String) -> ApiError {
    ApiError::invalid(Some("samplers"), message)
}

/// `samplers`: the stages in the order given (names, or one letter each), or `None` for
/// the default chain. An empty list is a chain of no stage (the draw from the whole
/// softmax), as in llama.cpp. `infill` needs a `top_k` of at most
/// [`INFILL_MAX_CANDIDATES`] before it (it compares every pair of candidates).
///
/// # Errors
/// A 400 on `samplers` for another shape, an unknown name, or `infill` without a bounding
/// `top_k` before it.
pub fn samplers(obj: &Map<String, Value>, top_k: i32) -> Result<Option<Chain>, ApiError> {
    let names: Vec<String> = match obj.get("samplers") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s
            .chars()
            .map(|c| {
                LETTERS
                    .iter()
                    .find(|(l, _)| *l == c)
                    .map(|(_, n)| n.to_string())
                    .ok_or_else(|| {
                        bad(format!(
                            "'samplers': {c:?} is not one of llama.cpp's sampler letters ({})",
                            LETTERS.iter().map(|(l, _)| *l).collect::<String>()
                        ))
                    })
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("'samplers' must hold sampler names".into()))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(bad(
                "'samplers' must be an array of sampler names or a string of their letters".into(),
            ))
        }
    };
    let mut stages = Vec::with_capacity(names.len());
    for name in &names {
        match Stage::from_name(name) {
            Some(Some(s)) => stages.push(s),
            Some(None) => {}
            None => {
                return Err(bad(format!(
                    "'samplers': {name:?} is not a sampler (penalties, dry, top_n_sigma, top_k, \
                     typ_p, top_p, min_p, xtc, temperature, infill)"
                )))
            }
        }
    }
    if let Some(at) = stages.iter().position(|&s| s == Stage::Infill) {
        let bounded = stages[..at].contains(&Stage::TopK)
            && top_k > 0
            && top_k as usize <= INFILL_MAX_CANDIDATES;
        if !bounded {
            return Err(bad(format!(
                "'samplers': infill compares every pair of candidates; put top_k (at most \
                 {INFILL_MAX_CANDIDATES}) before it"
            )));
        }
    }
    Ok(Some(Chain {
        stages,
        infill: None,
    }))
}

/// llama.cpp's limits on the answer's text ([`Watch`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TextLimits {
    /// `n_indent`: once a newline is written, each line must be indented by at least this
    /// many spaces or tabs once anything follows its indentation (a blank line's newline
    /// too), else the answer ends before that (0: none).
    pub n_indent: usize,
    /// `t_max_predict_ms`: once a newline is written, the answer ends when this much time
    /// has passed since its first token.
    pub t_max_predict: Option<Duration>,
}

impl TextLimits {
    /// Reads `n_indent` and `t_max_predict_ms` (0 or absent: no limit).
    ///
    /// # Errors
    /// A 400 naming the field for a negative value.
    pub fn read(obj: &Map<String, Value>) -> Result<TextLimits, ApiError> {
        let count = |name: &'static str| -> Result<u64, ApiError> {
            match api::opt_i64(obj, name)? {
                None => Ok(0),
                Some(n) if n >= 0 => Ok(n as u64),
                Some(n) => Err(ApiError::invalid(
                    Some(name),
                    format!("'{name}' must be at least 0, got {n}"),
                )),
            }
        };
        Ok(TextLimits {
            n_indent: count("n_indent")?.min(usize::MAX as u64) as usize,
            t_max_predict: Some(count("t_max_predict_ms")?)
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
        })
    }

    /// Whether either limit is set.
    pub fn any(&self) -> bool {
        self.n_indent > 0 || self.t_max_predict.is_some()
    }
}

/// A sink that applies [`TextLimits`] to the text it forwards: when one ends the answer it
/// forwards the text up to there, asks the scheduler to stop (the scheduler checks at its
/// next token), drops what comes after, and reports the answer as ended by a limit
/// (`length`, llama.cpp's `stop_type: "limit"`).
pub struct Watch<S> {
    inner: S,
    limits: TextLimits,
    /// The answer's text so far (for the indentation rule).
    text: String,
    /// Where the first line not yet checked starts (after its newline).
    line: Option<usize>,
    first: Option<Instant>,
    newline: bool,
    ended: bool,
}

impl<S: EventSink> Watch<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, limits: TextLimits) -> Watch<S> {
        Watch {
            inner,
            limits,
            text: String::new(),
            line: None,
            first: None,
            newline: false,
            ended: false,
        }
    }

    /// Adds `piece`; returns how much of it to forward (all of it unless a limit ended
    /// the answer in it).
    fn add(&mut self, piece: &str) -> usize {
        let start = self.text.len();
        self.text.push_str(piece);
        if self.limits.n_indent > 0 {
            // Each line after a newline, once it has text, must be indented enough.
            loop {
                let Some(at) = self.line else {
                    match self.text[start..].find('\n') {
                        Some(nl) => {
                            self.line = Some(start + nl + 1);
                            continue;
                        }
                        None => break,
                    }
                };
                let rest = &self.text[at..];
                let indent = rest
                    .bytes()
                    .take_while(|&b| b == b' ' || b == b'\t')
                    .count();
                let after = &rest[indent..];
                if after.is_empty() {
                    break;
                }
                // (A blank line counts: its newline is text at indentation 0.)
                if indent < self.limits.n_indent {
                    self.ended = true;
                    return (at + indent).saturating_sub(start);
                }
                match after.find('\n') {
                    Some(nl) => self.line = Some(at + indent + nl + 1),
                    None => break,
                }
            }
        }
        self.newline |= piece.contains('\n');
        if let (Some(limit), Some(t0)) = (self.limits.t_max_predict, self.first) {
            if self.newline && t0.elapsed() > limit {
                self.ended = true;
            }
        }
        piece.len()
    }
}

impl<S: EventSink> EventSink for Watch<S> {
    fn send(&mut self, event: Event) -> bool {
        match event {
            Event::Delta { .. } if self.ended => true,
            Event::Delta { text, tokens } => {
                self.first.get_or_insert_with(Instant::now);
                let keep = self.add(&text);
                let mut text = text;
                text.truncate(keep);
                self.inner.send(Event::Delta { text, tokens })
            }
            Event::Done(mut c) => {
                if self.ended {
                    c.finish_reason = FinishReason::Length;
                }
                self.inner.send(Event::Done(c))
            }
            other => self.inner.send(other),
        }
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn stop_requested(&self) -> bool {
        self.ended || self.inner.stop_requested()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<String>>);
    impl EventSink for Collect {
        fn send(&mut self, event: Event) -> bool {
            if let Event::Delta { text, .. } = event {
                self.0.lock().unwrap().push_str(&text);
            }
            true
        }
        fn is_closed(&self) -> bool {
            false
        }
    }

    fn feed(n_indent: usize, pieces: &[&str]) -> (String, bool) {
        let out = Collect::default();
        let mut w = Watch::new(
            out.clone(),
            TextLimits {
                n_indent,
                t_max_predict: None,
            },
        );
        for p in pieces {
            w.send(Event::Delta {
                text: p.to_string(),
                tokens: Vec::new(),
            });
        }
        let s = out.0.lock().unwrap().clone();
        (s, w.stop_requested())
    }

    /// llama.cpp's n_indent: the first line is free; a later line with text indented less
    /// ends the answer before that text (its indentation kept); a blank line ends it too.
    #[test]
    fn n_indent_cuts_the_first_line_that_dedents() {
        let body = [
            "x = 1",
            "\n",
            "    y = 2\n",
            "    z",
            " = 3\n",
            "  w = 4\n",
            "    v\n",
        ];
        assert_eq!(
            feed(4, &body),
            ("x = 1\n    y = 2\n    z = 3\n  ".to_string(), true)
        );
        assert_eq!(
            feed(4, &["a\n    b\n", "\n    c"]),
            ("a\n    b\n".to_string(), true)
        );
        assert!(!feed(2, &body).1);
        assert!(!feed(0, &body).1);
        // Split inside the indentation, and a line of one piece.
        assert_eq!(
            feed(4, &["a\n  ", "  ok\n", "  ", "no"]),
            ("a\n    ok\n  ".to_string(), true)
        );
        assert_eq!(feed(4, &["a\nb\n    c"]), ("a\n".to_string(), true));
    }

    #[test]
    fn sampler_names_and_letters() {
        let obj = |v: Value| {
            serde_json::json!({ "samplers": v })
                .as_object()
                .cloned()
                .unwrap()
        };
        let stages = |v: Value, k: i32| samplers(&obj(v), k).map(|c| c.map(|c| c.stages));
        use Stage::*;
        let default = Some(vec![Penalties, TopK, TopP, MinP, Temperature]);
        assert_eq!(stages("edkypmxt".into(), 40).unwrap(), default);
        assert_eq!(
            stages(
                serde_json::json!([
                    "penalties",
                    "dry",
                    "top_k",
                    "typ_p",
                    "top_p",
                    "min_p",
                    "xtc",
                    "temperature"
                ]),
                40
            )
            .unwrap(),
            default
        );
        assert_eq!(
            stages(serde_json::json!(["top_k", "top_p", "infill"]), 40).unwrap(),
            Some(vec![TopK, TopP, Infill])
        );
        assert_eq!(stages(serde_json::json!([]), 40).unwrap(), Some(vec![]));
        assert!(stages(serde_json::json!(["top_k", "mirostat"]), 40).is_err());
        assert!(stages("kq".into(), 40).is_err());
        assert!(stages(serde_json::json!(["infill"]), 40).is_err());
        assert!(stages(serde_json::json!(["top_k", "infill"]), 0).is_err());
        assert!(stages(serde_json::json!(["top_k", "infill"]), 5000).is_err());
        assert_eq!(samplers(&Map::new(), 40).unwrap(), None);
    }
}
