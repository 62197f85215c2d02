//! The generation loop and stop conditions shared by `frink run`, `frink chat` and (later)
//! the server.

use std::collections::HashSet;
use std::time::Instant;

use frink_models::{Logits, ModelError};

use crate::constraint::GrammarError;
use crate::sampling::Sampler;
use crate::session::Session;

/// Why [`generate`] failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The prompt did not fit, or evaluation failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The sampler's grammar reached an error state.
    #[error("grammar: {0}")]
    Grammar(#[from] GrammarError),
}

/// Why generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token budget (`-n`) or the context ran out.
    Length,
}

impl FinishReason {
    /// `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What the caller's token callback decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop now (a stop string matched); the token just delivered is kept in `ids`.
    Stop,
}

/// Per-phase timings of one generation, in milliseconds.
///
/// `prompt_ms` is the prefill of the prompt; `first_token_ms` is from the start of the
/// prefill until the first generated token is known (time to first token); `gen_ms` covers
/// the `gen_tokens` tokens after the first (the steady state: `gen_tokens / gen_ms` is the
/// decode rate, never mixed with prefill).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    pub first_token_ms: f64,
    pub gen_tokens: usize,
    pub gen_ms: f64,
}

/// The result of [`generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Generated ids in order, including the end-of-generation token when one ended it.
    pub ids: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Generation stopped because the context was full (then `finish_reason` is `Length`).
    pub context_full: bool,
    pub timings: Timings,
}

/// Limits of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// End-of-generation token ids (the model's EOG set).
    pub eog: HashSet<u32>,
}

/// Evaluates `prompt` after what `session` holds, then samples up to `max_tokens` tokens,
/// handing each to `on_token` as soon as it is chosen.
///
/// Stops after an end-of-generation token (included in `ids`, not evaluated), when
/// `on_token` says [`Flow::Stop`], after `max_tokens`, or when the next token would not fit
/// in the context (`context_full`). Prompt tokens are recorded in the sampler's penalty
/// history first, as llama.cpp does.
///
/// With a constrained sampler ([`Sampler::with_constraint`]) every token is one its grammar
/// allows; a complete grammar allows only end-of-generation tokens, so the answer ends with
/// [`FinishReason::Stop`].
///
/// Errors: [`ModelError::ContextFull`] if the prompt itself does not fit (checked before
/// anything is written); evaluation errors; a grammar in an error state.
pub fn generate(
    session: &mut Session<'_>,
    prompt: &[u32],
    sampler: &mut Sampler,
    params: &GenerateParams,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation, GenerateError> {
    let start = Instant::now();
    let mut logits = session.eval(prompt, Logits::Last)?;
    let prompt_ms = ms(start);
    for &t in prompt {
        sampler.accept(t);
    }
    let mut out = Generation {
        ids: Vec::new(),
        finish_reason: FinishReason::Length,
        context_full: false,
        timings: Timings {
            prompt_tokens: prompt.len(),
            prompt_ms,
            ..Timings::default()
        },
    };
    let mut steady_start = None;
    while out.ids.len() < params.max_tokens {
        let id = sampler.try_sample(&logits)?;
        sampler.accept(id);
        out.ids.push(id);
        if out.ids.len() == 1 {
            out.timings.first_token_ms = ms(start);
            steady_start = Some(Instant::now());
        } else {
            out.timings.gen_tokens += 1;
        }
        let flow = on_token(id);
        if params.eog.contains(&id) || flow == Flow::Stop {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        if out.ids.len() == params.max_tokens {
            break;
        }
        if session.n_past() >= session.n_ctx() {
            out.context_full = true;
            break;
        }
        logits = session.eval(&[id], Logits::Last)?;
    }
    if let Some(s) = steady_start {
        out.timings.gen_ms = ms(s);
    }
    Ok(out)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// The length of the longest proper prefix of `pat` that `text` ends with: text that may
/// still become `pat` with what is streamed next, which a streaming matcher holds back
/// (stop strings here; the server's tool-call and reasoning tags).
pub fn partial_match_len(text: &str, pat: &str) -> usize {
    pat.char_indices()
        .skip(1)
        .map(|(i, _)| i)
        .filter(|&i| text.ends_with(&pat[..i]))
        .max()
        .unwrap_or(0)
}

/// Matches stop strings on streamed text across token boundaries.
///
/// [`StopMatcher::push`] returns the text that is safe to show: text that could still be
/// the start of a stop string is held back until it is decided. A matched stop string and
/// everything after it are never returned.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `text`; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return out;
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| partial_match_len(&self.pending, s))
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        out
    }

    /// Releases held-back text at the end of generation (nothing if a stop matched).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            String::new()
        } else {
            std::mem::take(&mut self.pending)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            out += &m.push(p);
        }
        out += &m.finish();
        (out, m.stopped())
    }

    #[test]
    fn stop_strings_across_pieces() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxyz"]),
            ("abc".into(), true)
        );
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "x"]),
            ("abcENx".into(), false)
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            run(&["\n\n", "User:"], &["hi", "\n", "User", ":"]),
            ("hi\n".into(), true)
        );
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
        // Held-back text is released as soon as it cannot start a stop string.
        let stops = vec!["STOP".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("xS"), "x");
        assert_eq!(m.push("T"), "");
        assert_eq!(m.push("x"), "STx");
    }
}
