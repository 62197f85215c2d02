//! One log line per request, written (by the gate's response body) when its answer has left (a stream's last event) or
//! its client went away: method, path, status, client, the total time and, for a
//! completion, the model, prompt and generated tokens, time to first token and tokens per
//! second (llama-server's and Ollama's request logs), and the time it was written (UTC). Text through `tracing` at info
//! level (`RUST_LOG` as usual), or one JSON object a line on stderr with
//! `--log-format json`; none with `--log-disable`. Prompt and answer text are logged only
//! with `--log-prompts` (`prompt`: the rendered prompt; `answer`: the first choice's text).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use frink_engine::scheduler::Completion;
use frink_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// How request lines are written (`--log-format`, `--log-disable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `tracing` at info level.
    #[default]
    Text,
    /// One JSON object a line on stderr.
    Json,
    /// No request lines.
    Off,
}

/// A completion's counts, filled in by the answer's formatter as choices finish (the
/// request extension the gate gives every request).
#[derive(Clone, Debug, Default)]
pub(crate) struct Counts {
    pub model: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub first_token_ms: f64,
    pub gen_ms: f64,
}

/// Where a request's handler leaves its [`Counts`] (and, under `--log-prompts`, its
/// prompt and answer text) for the log line.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestLog(Arc<Recorded>);

#[derive(Debug, Default)]
struct Recorded {
    /// `--log-prompts`: the line carries the prompt and answer text.
    texts: bool,
    counts: Mutex<Option<Counts>>,
    prompt: Mutex<Option<String>>,
    answer: Mutex<Option<String>>,
}

/// A poisoned lock's data is still the latest written.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RequestLog {
    /// A record for one request; `texts`: keep its prompt and answer text (`--log-prompts`).
    pub(crate) fn new(texts: bool) -> RequestLog {
        RequestLog(Arc::new(Recorded {
            texts,
            ..Default::default()
        }))
    }

    /// Records the request's counts (the latest call wins: all choices so far).
    pub(crate) fn set(&self, c: Counts) {
        *lock(&self.0.counts) = Some(c);
    }

    /// Records the prompt `ids` as the model sees them, the template's special tokens
    /// rendered (decoded only under `--log-prompts`).
    pub(crate) fn set_prompt(&self, tok: &Tokenizer, ids: &[u32]) {
        if self.0.texts {
            // An image's rows carry keys, not token ids: each shows as one marker.
            let mut text = String::new();
            let mut rest = ids;
            while !rest.is_empty() {
                let n = rest
                    .iter()
                    .take_while(|&&t| !frink_engine::image::is_image_key(t))
                    .count();
                text.push_str(&tok.decode(&rest[..n], true).unwrap_or_default());
                let rows = rest[n..]
                    .iter()
                    .take_while(|&&t| frink_engine::image::is_image_key(t))
                    .count();
                if rows > 0 {
                    text.push_str(&format!("[image: {rows} rows]"));
                }
                rest = &rest[n + rows..];
            }
            *lock(&self.0.prompt) = Some(text);
        }
    }

    /// Records the first choice's answer `ids` as the model wrote them (decoded only under
    /// `--log-prompts`).
    pub(crate) fn set_answer(&self, tok: &Tokenizer, ids: &[u32]) {
        if self.0.texts {
            *lock(&self.0.answer) = Some(tok.decode(ids, true).unwrap_or_default());
        }
    }

    /// Records a one-choice request's end: `c`'s counts for `model`, and its answer.
    pub(crate) fn finished(&self, model: &str, c: &Completion, tok: &Tokenizer) {
        self.set(Counts {
            model: model.to_string(),
            prompt_tokens: c.prompt_tokens,
            cached_tokens: c.cached_tokens,
            completion_tokens: c.ids.len(),
            first_token_ms: c.first_token_ms,
            gen_ms: c.gen_ms,
        });
        self.set_answer(tok, &c.ids);
    }

    fn get(&self) -> Option<Counts> {
        lock(&self.0.counts).clone()
    }
}

/// What the line says besides the counts.
pub(crate) struct Line {
    pub format: LogFormat,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub client: Option<std::net::SocketAddr>,
    pub start: Instant,
    pub counts: RequestLog,
}

impl Line {
    /// The line's fields as JSON (`aborted`: the body was dropped before its end).
    fn fields(&self, aborted: bool) -> Value {
        let now = std::time::SystemTime::now();
        let millis = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_millis());
        let time = frink_tokenizer::strftime("%Y-%m-%dT%H:%M:%S", now).unwrap_or_default();
        let mut v = json!({
            "time": format!("{time}.{millis:03}Z"),
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "client": self.client.map(|a| a.to_string()),
            "total_ms": round(self.start.elapsed().as_secs_f64() * 1e3),
        });
        if aborted {
            v["aborted"] = true.into();
        }
        if let Some(c) = self.counts.get() {
            let tps = if c.gen_ms > 0.0 && c.completion_tokens > 1 {
                (c.completion_tokens - 1) as f64 * 1e3 / c.gen_ms
            } else {
                0.0
            };
            v["model"] = c.model.into();
            v["prompt_tokens"] = c.prompt_tokens.into();
            v["cached_tokens"] = c.cached_tokens.into();
            v["completion_tokens"] = c.completion_tokens.into();
            v["first_token_ms"] = round(c.first_token_ms).into();
            v["tokens_per_second"] = round(tps).into();
        }
        if let Some(t) = lock(&self.counts.0.prompt).clone() {
            v["prompt"] = t.into();
        }
        if let Some(t) = lock(&self.counts.0.answer).clone() {
            v["answer"] = t.into();
        }
        v
    }

    /// Writes the line (`aborted`: the body was dropped before its end).
    pub(crate) fn write(&self, aborted: bool) {
        let v = self.fields(aborted);
        match self.format {
            LogFormat::Off => {}
            LogFormat::Json => eprintln!("{}", one_line(&v.to_string())),
            LogFormat::Text => {
                let mut text = format!(
                    "{} {} {} {} ms",
                    self.method, self.path, self.status, v["total_ms"]
                );
                for k in [
                    "model",
                    "prompt_tokens",
                    "completion_tokens",
                    "first_token_ms",
                    "tokens_per_second",
                    "client",
                    "aborted",
                    "prompt",
                    "answer",
                ] {
                    match &v[k] {
                        Value::Null => {}
                        // Texts quoted and escaped, so that a line stays one line.
                        Value::String(s) if k == "prompt" || k == "answer" => {
                            text.push_str(&format!(" {k}={}", Value::String(s.clone())))
                        }
                        Value::String(s) => text.push_str(&format!(" {k}={s}")),
                        other => text.push_str(&format!(" {k}={other}")),
                    }
                }
                tracing::info!("{}", one_line(&text));
            }
        }
    }
}

/// `s` with the characters some readers take as line breaks besides `\n` and `\r` (NEL,
/// U+2028, U+2029; JSON leaves them raw) escaped, so one request stays one line.
fn one_line(s: &str) -> String {
    s.replace('\u{85}', "\\u0085")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    #[test]
    fn unicode_line_breaks_are_escaped() {
        let v = serde_json::json!({"prompt": "a\u{2028}b\u{2029}c\u{85}d\ne"});
        let line = super::one_line(&v.to_string());
        assert_eq!(line.lines().count(), 1);
        assert!(!line.contains(['\u{2028}', '\u{2029}', '\u{85}']), "{line}");
        // Still JSON, with the same text.
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back, v);
    }
}
