//! A generation loop over one [`Session`] (a contiguous KV cache, no scheduler): what
//! `frink verify` checks the golden tokens with, `frink bench` measures speculation with,
//! and the scheduler's tests compare against. `frink run`, `chat` and the server decode
//! through the scheduler ([`crate::scheduler`]); the finishing rule ([`FinishRule`]) is
//! one for both.

use std::collections::HashSet;
use std::time::Instant;

use frink_models::{Logits, ModelError};

use crate::constraint::GrammarError;
use crate::sampling::{Candidate, Sampler, SpecSampling};
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
    /// Speculation: tokens proposed and verified, and how many of them were accepted.
    pub proposed: usize,
    pub accepted: usize,
}

/// The one finishing rule of every decode loop: [`generate_with`] and the scheduler (`frink
/// run`, `chat` and the server) apply it after each token, so a rule cannot exist in one and not
/// the other (llama.cpp's CLI and server share theirs). An end-of-generation token ends the
/// answer with `Stop`; with `ignore_eos` none can be sampled (llama.cpp's meaning: its
/// server adds a `-inf` logit bias to each, [`FinishRule::prepare`]), except where a
/// complete grammar allows nothing else, which still ends the answer there. A stop string
/// ends it with `Stop` too; `max_tokens` generated tokens or a full context with `Length`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinishRule {
    /// Most tokens to generate (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// llama.cpp's `ignore_eos`: end-of-generation tokens are never sampled.
    pub ignore_eos: bool,
}

impl FinishRule {
    /// Readies `sampler` for the rule: with `ignore_eos`, the end-of-generation tokens
    /// `eog` banned (a `-inf` bias), unless a grammar constrains it (a complete grammar
    /// allows only those tokens, and ends the answer with them).
    pub fn prepare(
        &self,
        sampler: &mut crate::sampling::Sampler,
        eog: impl IntoIterator<Item = u32>,
    ) {
        if self.ignore_eos && !sampler.is_constrained() {
            sampler.ban(eog);
        }
    }

    /// Whether a token (`is_eog`: in the model's end-of-generation set) ends the answer as
    /// its end of generation: its text is then not shown.
    pub fn ends_at_eog(&self, is_eog: bool, grammar_complete: bool) -> bool {
        is_eog && (!self.ignore_eos || grammar_complete)
    }

    /// Why the answer ends after its `generated`-th token, if it does: `eog` from
    /// [`FinishRule::ends_at_eog`], `stopped` when a stop string was seen (or the caller
    /// stops), `context_full` when no position is left for another token.
    pub fn after(
        &self,
        eog: bool,
        stopped: bool,
        generated: usize,
        context_full: bool,
    ) -> Option<FinishReason> {
        if eog || stopped {
            Some(FinishReason::Stop)
        } else if self.max_tokens.is_some_and(|m| generated >= m) || context_full {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

/// Limits of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Never sample end-of-generation tokens ([`FinishRule::ignore_eos`]).
    pub ignore_eos: bool,
    /// End-of-generation token ids (the model's EOG set).
    pub eog: HashSet<u32>,
    /// Speculative decoding by prompt lookup (`None`: off). It never changes the tokens.
    pub speculation: Option<Speculation>,
    /// How proposals are accepted ([`SpecSampling::Exact`]: the tokens of plain decoding).
    pub spec_sampling: SpecSampling,
}

/// Prompt-lookup speculation ([`NgramLookup`]) with at most `draft_max` proposed tokens a
/// step (`--spec ngram --draft-max N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculation {
    pub draft_max: usize,
}

impl Default for Speculation {
    /// 7 proposals: with the token they follow, 8 rows, the most a decode step takes at
    /// nearly the cost of one (frink-models' small-batch kernels read each weight once).
    fn default() -> Self {
        Speculation { draft_max: 7 }
    }
}

/// Proposes the tokens that may follow `history` (the prompt and the tokens generated so
/// far): at most `max` of them, possibly none. A proposal only decides what is verified;
/// the tokens generated are those the model and the sampler choose (see [`generate_with`]).
pub trait Propose {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32>;

    /// The distributions the last [`Propose::propose`]'s tokens were drawn from, one per
    /// token (each the drafting sampler's candidates), handed over once; empty when each
    /// was chosen deterministically (prompt lookup, a prediction, a greedy draft): the `q`
    /// of [`crate::sampling::Sampler::try_sample_proposed`] under
    /// [`SpecSampling::Rejection`].
    fn distributions(&mut self) -> Vec<Vec<Candidate>> {
        Vec::new()
    }
}

/// Prompt lookup (Saxena's prompt-lookup decoding; llama.cpp's `ngram` speculative
/// modes): the longest of the last `n_max` down to `n_min` tokens that occurred earlier in
/// the history, at its latest earlier occurrence, proposes the tokens that followed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramLookup {
    pub n_min: usize,
    pub n_max: usize,
}

impl Default for NgramLookup {
    fn default() -> Self {
        NgramLookup { n_min: 2, n_max: 4 }
    }
}

impl Propose for NgramLookup {
    fn propose(&mut self, h: &[u32], max: usize) -> Vec<u32> {
        if max == 0 {
            return Vec::new();
        }
        for n in (self.n_min.max(1)..=self.n_max).rev() {
            if h.len() <= n {
                continue;
            }
            let tail = &h[h.len() - n..];
            // Latest p < len − n with h[p..p+n] == tail: what followed is h[p+n..].
            if let Some(p) = (0..h.len() - n).rev().find(|&p| &h[p..p + n] == tail) {
                let from = p + n;
                return h[from..(from + max).min(h.len())].to_vec();
            }
        }
        Vec::new()
    }
}

/// Predicted outputs (OpenAI's `prediction` on chat completions): the text the answer is
/// expected to be, as tokens, proposed where the answer follows it. With no answer yet it
/// proposes the prediction's start; after that, the longest of the answer's last
/// `n_max`..1 tokens found in the prediction (the first occurrence at or after where the
/// last match ended, else the first anywhere) proposes what follows it there, so an answer
/// that leaves the prediction for an edit and comes back is followed again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PredictionLookup {
    /// The prediction's tokens.
    pub prediction: Vec<u32>,
    /// Tokens of the history before the answer (the prompt).
    pub prompt_len: usize,
    /// Longest answer suffix matched.
    pub n_max: usize,
    /// Where in the prediction the last proposal ended.
    cursor: usize,
}

impl PredictionLookup {
    /// Proposes from `prediction` for an answer that follows `prompt_len` prompt tokens.
    pub fn new(prediction: Vec<u32>, prompt_len: usize) -> PredictionLookup {
        PredictionLookup {
            prediction,
            prompt_len,
            n_max: 8,
            cursor: 0,
        }
    }
}

impl Propose for PredictionLookup {
    fn propose(&mut self, h: &[u32], max: usize) -> Vec<u32> {
        let answer = &h[self.prompt_len.min(h.len())..];
        let pred = &self.prediction;
        let from = if answer.is_empty() {
            Some(0)
        } else {
            (1..=self.n_max.min(answer.len())).rev().find_map(|n| {
                let tail = &answer[answer.len() - n..];
                let found = |lo: usize| {
                    (lo..pred.len().saturating_sub(n - 1))
                        .find(|&p| &pred[p..p + n] == tail)
                        .map(|p| p + n)
                };
                found(self.cursor.saturating_sub(n)).or_else(|| found(0))
            })
        };
        let Some(from) = from.filter(|&f| f < pred.len()) else {
            return Vec::new();
        };
        let end = (from + max).min(pred.len());
        self.cursor = end;
        pred[from..end].to_vec()
    }
}

/// Measured forward-step times by rows (decode and verification steps only), for
/// [`Adaptive::choose`]: what a step of `n` rows costs against one of fewer rows depends
/// on the machine (measured: qwen2.5-coder-0.5b, 2 threads, one AMD EPYC VM: 8 rows 1.3×
/// one row's time, another 2.8×), so it is measured rather than assumed.
#[derive(Clone, Debug)]
pub struct StepCost {
    /// Exponentially weighted seconds of a step of `i` rows (0: not measured).
    secs: Vec<f32>,
}

impl Default for StepCost {
    fn default() -> Self {
        StepCost {
            secs: vec![0.0; Self::MAX_ROWS + 1],
        }
    }
}

impl StepCost {
    /// Row counts recorded separately (larger steps count as this many).
    pub const MAX_ROWS: usize = 64;
    /// The cost assumed for each row past the largest measured step below it: low, so a
    /// size not tried yet gets tried (and measured) once.
    const UNSEEN_ROW: f32 = 0.05;

    /// Records a step of `rows` rows that took `secs` seconds.
    pub fn record(&mut self, rows: usize, secs: f32) {
        let c = &mut self.secs[rows.clamp(1, Self::MAX_ROWS)];
        *c = if *c == 0.0 {
            secs
        } else {
            0.8 * *c + 0.2 * secs
        };
    }

    /// The cost of a step of `rows` rows: measured, else the largest measured step
    /// below it plus [`StepCost::UNSEEN_ROW`] of it per extra row, else the smallest
    /// measured above it; with nothing measured, `1 + 0.05 (rows - 1)`.
    pub fn cost(&self, rows: usize) -> f32 {
        let n = rows.clamp(1, Self::MAX_ROWS);
        if self.secs[n] > 0.0 {
            return self.secs[n];
        }
        if let Some(m) = (1..n).rev().find(|&m| self.secs[m] > 0.0) {
            return self.secs[m] * (1.0 + Self::UNSEEN_ROW * (n - m) as f32);
        }
        match (n + 1..=Self::MAX_ROWS).find(|&m| self.secs[m] > 0.0) {
            Some(m) => self.secs[m],
            None => 1.0 + Self::UNSEEN_ROW * (n - 1) as f32,
        }
    }
}

/// How many tokens to propose: the acceptance seen so far (exponentially weighted, recent
/// steps count most; with nothing seen, 1/2) against what rows cost ([`StepCost`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    proposed: f32,
    accepted: f32,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            proposed: 0.0,
            accepted: 0.0,
        }
    }
}

impl Adaptive {
    /// Weight of the history against one new step.
    const DECAY: f32 = 0.9;

    /// The estimated chance that one proposal is accepted (Laplace's rule over the
    /// weighted counts).
    pub fn rate(&self) -> f32 {
        (self.accepted + 1.0) / (self.proposed + 2.0)
    }

    /// Proposals (at most `max`) for a sequence joining a step that already has `rows`
    /// rows expected to give `tokens` tokens: the `k` that gives the most tokens per
    /// second, `(tokens + e(k)) / cost(rows + k)`, where a proposal is taken only after
    /// every one before it, so `e(k) = a + a² + … + a^k` for the rate `a`. Alone
    /// (`rows = tokens = 1`) with free rows it proposes `max`; 0 when no proposal pays.
    pub fn choose(&self, max: usize, rows: usize, tokens: f32, cost: &StepCost) -> usize {
        let (mut best, mut best_rate) = (0, tokens / cost.cost(rows));
        for k in 1..=max {
            let r = (tokens + self.expected(k)) / cost.cost(rows + k);
            if r > best_rate {
                (best, best_rate) = (k, r);
            }
        }
        best
    }

    /// Proposals of `k` expected to be taken: `a + a² + … + a^k` for the rate `a` (each
    /// is taken only after every one before it).
    pub fn expected(&self, k: usize) -> f32 {
        let a = self.rate();
        (1..=k as i32).map(|i| a.powi(i)).sum()
    }

    /// Records a step: `proposed` tokens verified, `accepted` of them taken (a step
    /// without proposals records 0 of 0: the estimate drifts back to 1/2, so proposals
    /// are tried again).
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.proposed = self.proposed * Self::DECAY + proposed as f32;
        self.accepted = self.accepted * Self::DECAY + accepted as f32;
    }
}

/// Evaluates `prompt` after what `session` holds, then samples up to `max_tokens` tokens,
/// handing each to `on_token` as soon as it is chosen.
///
/// Stops by [`FinishRule`]: after an end-of-generation token (included in `ids`, not
/// evaluated; not with `ignore_eos`), when `on_token` says [`Flow::Stop`], after
/// `max_tokens`, or when the next token would not fit in the context (`context_full`). Prompt tokens are recorded in the sampler's penalty
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
    on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation, GenerateError> {
    let mut lookup = NgramLookup::default();
    let proposer: Option<(&mut dyn Propose, usize)> = params
        .speculation
        .map(|s| (&mut lookup as &mut dyn Propose, s.draft_max));
    generate_with(session, prompt, sampler, params, proposer, on_token)
}

/// [`generate`] with speculation by `proposer` (and at most that many proposals a step),
/// or none. The tokens, the finish reason and the session's state at the end are those of
/// plain decoding, whatever is proposed: a step evaluates the token just chosen and the
/// proposals in one batch (its rows have the bits a one-token step gives them: the
/// forward pass is batch-invariant), then the sampler chooses from each row in turn as it
/// would have — penalties, grammar and random draws advanced only by the tokens it emits —
/// and the first choice that differs from the proposal ends the step; the keys and values
/// of the rejected proposals are cut off. Models with recurrent layers (a state that
/// cannot be cut back) decode without it. With `params.spec_sampling`
/// [`SpecSampling::Rejection`] each row is chosen by rejection sampling instead
/// ([`Sampler::try_sample_proposed`]): the tokens follow the same distribution, greedy
/// ones are unchanged, seeded ones are not plain decoding's.
///
/// Errors: as [`generate`].
pub fn generate_with(
    session: &mut Session<'_>,
    prompt: &[u32],
    sampler: &mut Sampler,
    params: &GenerateParams,
    mut proposer: Option<(&mut dyn Propose, usize)>,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation, GenerateError> {
    let start = Instant::now();
    let logits = session.eval(prompt, Logits::Last)?;
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
        proposed: 0,
        accepted: 0,
    };
    if session.cache().layers.iter().any(|l| l.recurrent.is_some()) {
        proposer = None;
    }
    // What the session held after the prompt: at every exit it holds that plus every
    // emitted token but the last (which plain decoding never evaluates).
    let base = session.n_past();
    let nv = session.model().config.n_vocab;
    let rule = FinishRule {
        max_tokens: Some(params.max_tokens),
        ignore_eos: params.ignore_eos,
    };
    rule.prepare(sampler, params.eog.iter().copied());
    let mut steady_start = None;
    // Emits `id`: true when generation ends with it.
    let mut emit = |id: u32, out: &mut Generation, sampler: &mut Sampler| -> bool {
        sampler.accept(id);
        out.ids.push(id);
        if out.ids.len() == 1 {
            out.timings.first_token_ms = ms(start);
            steady_start = Some(Instant::now());
        } else {
            out.timings.gen_tokens += 1;
        }
        let flow = on_token(id);
        let eog = rule.ends_at_eog(params.eog.contains(&id), sampler.constraint_complete());
        match rule.after(eog, flow == Flow::Stop, out.ids.len(), false) {
            Some(reason) => {
                out.finish_reason = reason;
                true
            }
            None => false,
        }
    };
    // The prompt and the tokens emitted, for the proposer (extended as they are emitted).
    let mut history: Vec<u32> = Vec::new();
    if proposer.is_some() {
        history.extend_from_slice(prompt);
    }
    let mut adaptive = Adaptive::default();
    let mut cost = StepCost::default();
    let mut next = Next::Sample(logits);
    while out.ids.len() < params.max_tokens {
        let id = match next {
            Next::Sample(logits) => {
                let id = sampler.try_sample(&logits)?;
                if emit(id, &mut out, sampler) {
                    break;
                }
                id
            }
            Next::Evaluate(id) => id,
        };
        if session.n_past() >= session.n_ctx() {
            out.context_full = true;
            break;
        }
        let drafts = match proposer.as_mut() {
            Some((p, k)) => {
                history.extend_from_slice(&out.ids[history.len() - prompt.len()..]);
                let room = (session.n_ctx() - session.n_past() - 1)
                    .min(params.max_tokens - out.ids.len())
                    .min(adaptive.choose(*k, 1, 1.0, &cost));
                p.propose(&history, room)
            }
            None => Vec::new(),
        };
        if drafts.is_empty() {
            let t = Instant::now();
            next = Next::Sample(session.eval(&[id], Logits::Last)?);
            cost.record(1, t.elapsed().as_secs_f32());
            adaptive.record(0, 0);
            continue;
        }
        let batch: Vec<u32> = std::iter::once(id).chain(drafts.iter().copied()).collect();
        let t = Instant::now();
        let rows = session.eval(&batch, Logits::All)?;
        cost.record(batch.len(), t.elapsed().as_secs_f32());
        let at = session.n_past() - batch.len(); // where `id` went
        let mut ended = false;
        let mut rejected = None;
        let mut accepted = 0;
        let q = proposer
            .as_mut()
            .map(|(p, _)| p.distributions())
            .unwrap_or_default();
        for (j, &d) in drafts.iter().enumerate() {
            let row = &rows[j * nv..(j + 1) * nv];
            let t = sampler.try_sample_proposed(
                row,
                d,
                q.get(j).map(Vec::as_slice),
                params.spec_sampling,
            )?;
            accepted += usize::from(t == d);
            if emit(t, &mut out, sampler) {
                ended = true;
                break;
            }
            if t != d {
                // Keep `id` and the proposals before j; `t` is evaluated next step.
                session.truncate(at + 1 + j);
                rejected = Some(t);
                break;
            }
        }
        adaptive.record(drafts.len(), accepted);
        out.proposed += drafts.len();
        out.accepted += accepted;
        if ended {
            break;
        }
        next = match rejected {
            Some(t) => Next::Evaluate(t),
            None => Next::Sample(rows[drafts.len() * nv..].to_vec()),
        };
    }
    // Plain decoding's state: the prompt and every emitted token but the last.
    session.truncate(base + out.ids.len().saturating_sub(1));
    if let Some(s) = steady_start {
        out.timings.gen_ms = ms(s);
    }
    Ok(out)
}

/// Where [`generate_with`]'s loop stands: the logits of the next position, to sample
/// from, or a token chosen (and emitted) but not yet evaluated.
enum Next {
    Sample(Vec<f32>),
    Evaluate(u32),
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
    /// The index in `stops` of the string that matched, once one has.
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// Whether a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that matched (the one that starts first in the text; of two that
    /// start at the same place, the first given), if one has (Anthropic's `stop_sequence`,
    /// llama.cpp's `stopping_word`).
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Adds `text`; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        self.pending.push_str(text);
        if let Some((at, i)) = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, i)))
            .min()
        {
            self.matched = Some(i);
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
        if self.matched.is_some() {
            String::new()
        } else {
            std::mem::take(&mut self.pending)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each branch of the one finishing rule.
    #[test]
    fn the_finishing_rule() {
        let plain = FinishRule {
            max_tokens: Some(4),
            ignore_eos: false,
        };
        let ignoring = FinishRule {
            ignore_eos: true,
            ..plain
        };
        assert!(plain.ends_at_eog(true, false));
        assert!(!ignoring.ends_at_eog(true, false));
        // A complete grammar allows nothing else: it ends even under ignore_eos.
        assert!(ignoring.ends_at_eog(true, true));
        assert!(!plain.ends_at_eog(false, true));
        assert_eq!(plain.after(true, false, 1, false), Some(FinishReason::Stop));
        assert_eq!(plain.after(false, true, 1, false), Some(FinishReason::Stop));
        assert_eq!(plain.after(false, false, 3, false), None);
        assert_eq!(
            plain.after(false, false, 4, false),
            Some(FinishReason::Length)
        );
        assert_eq!(
            plain.after(false, false, 1, true),
            Some(FinishReason::Length)
        );
        // Stop wins over the budget reached by the same token.
        assert_eq!(plain.after(true, false, 4, false), Some(FinishReason::Stop));
        let unbounded = FinishRule::default();
        assert_eq!(unbounded.after(false, false, 1 << 20, false), None);
    }

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
    fn a_prediction_is_followed_where_the_answer_meets_it() {
        // Prompt [9, 9]; prediction 1..=8.
        let mut p = PredictionLookup::new((1..=8).collect(), 2);
        assert_eq!(p.propose(&[9, 9], 3), [1, 2, 3], "no answer yet: its start");
        assert_eq!(p.propose(&[9, 9, 1, 2], 3), [3, 4, 5]);
        // An edit (20 replaces 3, 4) and back: "5" is found after the cursor.
        assert_eq!(p.propose(&[9, 9, 1, 2, 20], 3), Vec::<u32>::new());
        assert_eq!(p.propose(&[9, 9, 1, 2, 20, 5], 2), [6, 7]);
        // The longest suffix wins; the end of the prediction proposes nothing.
        assert_eq!(p.propose(&[9, 9, 7, 8], 3), Vec::<u32>::new());
        let mut p = PredictionLookup::new(vec![1, 2, 1, 3], 0);
        assert_eq!(p.propose(&[2, 1], 1), [3], "[2, 1] beats [1]");
        assert_eq!(p.propose(&[5], 2), Vec::<u32>::new());
    }

    #[test]
    fn proposals_follow_the_acceptance_rate_and_the_cost_of_rows() {
        // Step times of qwen2.5-coder-0.5b on one machine (ms by rows 1, 2, 4, 8).
        let mut slow = StepCost::default();
        for (rows, ms) in [
            (1, 37.0),
            (2, 51.0),
            (3, 54.0),
            (4, 57.0),
            (5, 70.0),
            (6, 82.0),
            (7, 93.0),
            (8, 104.0),
        ] {
            slow.record(rows, ms / 1e3);
        }
        let free = StepCost::default();
        let mut a = Adaptive::default();
        assert_eq!(a.choose(7, 1, 1.0, &free), 3, "1/2 and nearly free rows");
        for _ in 0..30 {
            a.record(7, 6);
        }
        assert!((a.rate() - 0.86).abs() < 0.02, "{}", a.rate());
        assert_eq!(a.choose(7, 1, 1.0, &free), 7);
        assert_eq!(a.choose(7, 1, 1.0, &slow), 3, "4 rows for 1.5 rows' time");
        // Beside 7 others, a row costs its share (measured: 16 rows 242 ms): nothing pays.
        for rows in 9..=16 {
            slow.record(rows, (104.0 + 17.25 * (rows - 8) as f32) / 1e3);
        }
        assert_eq!(a.choose(7, 8, 8.0, &slow), 0);
        for _ in 0..30 {
            a.record(3, 0);
        }
        assert_eq!(a.choose(7, 1, 1.0, &slow), 0, "rejected and rows cost");
        // Steps without proposals bring the estimate back to 1/2 (tried again).
        for _ in 0..60 {
            a.record(0, 0);
        }
        assert!((a.rate() - 0.5).abs() < 0.05);
        assert_eq!(a.choose(0, 1, 1.0, &free), 0);
        // Unmeasured sizes: a little more than the largest measured below.
        let mut c = StepCost::default();
        c.record(2, 1.0);
        assert_eq!(c.cost(2), 1.0);
        assert!((c.cost(4) - 1.1).abs() < 1e-6);
        assert_eq!(c.cost(1), 1.0);
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
