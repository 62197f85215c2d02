//! Token sampling: turning one row of logits into the next token id.
//!
//! # The chain
//!
//! [`Sampler`] applies, in this order, the samplers that llama.cpp's default chain
//! applies with its default settings (`common_params_sampling::samplers` in
//! llama.cpp's `common/common.h`, assembled by `common_sampler_init` in
//! `common/sampling.cpp`, each sampler's semantics from `src/llama-sampling.cpp`):
//!
//! 0. **grammar mask and logit bias**: under a constraint ([`Sampler::with_constraint`])
//!    the tokens its grammar does not allow are set to `-inf`; then
//!    [`SamplingParams::logit_bias`] is added (`llama_sampler_logit_bias_apply`, which heads
//!    llama.cpp's chain), on a copy of the row made only when either is present, so the
//!    penalties and greedy decoding see the masked, biased logits.
//! 1. **penalties** (`llama_sampler_penalties_apply`): for every token seen in the last
//!    [`SamplingParams::repeat_last_n`] accepted tokens, with `count` occurrences there,
//!    the logit is divided by `repeat_penalty` when it is positive and multiplied by it
//!    when it is zero or negative (so a penalty > 1 never makes a token more likely),
//!    then `count * frequency_penalty + presence_penalty` is subtracted.
//! 2. **top-k** (`llama_sampler_top_k_impl`): keep the `top_k` highest logits, sorted
//!    in descending order; `top_k <= 0` disables it, `top_k` larger than the number of
//!    candidates keeps them all (but still sorts them, as llama.cpp does).
//! 3. **top-p** (`llama_sampler_top_p_apply`): softmax over the surviving candidates,
//!    then keep the smallest prefix (in descending order) whose cumulative probability
//!    reaches `top_p` (`cum >= top_p`, so a boundary hit exactly at `p` stops there);
//!    `top_p >= 1` disables it.
//! 4. **min-p** (`llama_sampler_min_p_apply`): keep the candidates whose probability is
//!    at least `min_p` times the largest one, computed as llama.cpp does in logit space:
//!    `logit >= max_logit + ln(min_p)`; `min_p <= 0` disables it.
//! 5. **temperature** (`llama_sampler_temp_impl`): divide the surviving logits by
//!    `temperature`.
//! 6. **dist** (`llama_sampler_dist_apply`): softmax over what is left (normalizing sum
//!    in f64, as there), a uniform `r` in `[0, 1)`, and the first candidate whose
//!    cumulative probability exceeds `r` (llama.cpp: reaches `r * sum`; the two differ
//!    only in never choosing a zero-probability candidate here).
//!
//! Top-p and min-p therefore see the distribution *before* temperature, exactly as in
//! llama.cpp's default order. Every filter keeps at least one candidate (`min_keep = 1`;
//! llama.cpp's `common_params_sampling::min_keep` defaults to 0, which in top-p and
//! min-p behaves identically, as both always keep the most likely token).
//!
//! llama.cpp's default chain also names DRY, top-n-sigma, typical-p and XTC; all four
//! are disabled by its defaults (`dry_multiplier = 0`, `top_n_sigma = -1`,
//! `typ_p = 1`, `xtc_probability = 0`), so they are left out here. Mirostat, dynamic
//! temperature, logit bias and grammars are not implemented either.
//!
//! # Greedy decoding
//!
//! When [`SamplingParams::is_greedy`] (temperature `<= 0`; [`SamplingParams::greedy`] is
//! what `--greedy` maps to), the penalties are still applied (as in llama.cpp, where a
//! temperature `<= 0` makes `llama_sampler_temp_impl` keep only the highest logit after
//! the penalties) and the result is the [`argmax`] of the penalized logits, ties going
//! to the lowest token id. The filters cannot change that argmax, so they are skipped,
//! and no random number is drawn.
//!
//! # Determinism
//!
//! Candidates are ordered by (logit descending, id ascending), a total order, so every
//! partial selection and sort gives the same result on every platform. The random draw
//! uses ChaCha20 ([`rand_chacha::ChaCha20Rng`], seeded with `seed_from_u64`, which is
//! specified to be portable): the same seed, logits and accepted tokens give the same
//! tokens everywhere. The stream is not llama.cpp's (which uses `std::mt19937`), so the
//! same seed does not give the same tokens as llama.cpp.
//!
//! # Cost per call
//!
//! No n_vocab-sized allocation happens per call: the candidate buffer is kept between
//! calls. Greedy decoding is one pass over the row. With top-k active (the default) the
//! row is scanned once into a buffer of about `2k` candidates that is cut back to the
//! best `k` by partial selection, and only those `k` are sorted; the penalized tokens
//! (at most `repeat_last_n`) are handled apart. Only without top-k is the whole row
//! copied, and top-p then sorts the best 256 first and the rest only if needed, as
//! llama.cpp does. (At n_vocab = 262,144, about 0.1 ms per token for the default
//! chain and 0.2 ms for greedy on this project's build machine.)
//!
//! # Non-finite logits
//!
//! A NaN logit is treated as `-inf` and `+inf` as `f32::MAX`. A row with nothing above
//! `-inf` is degenerate: greedy then follows [`argmax`] (NaN never wins unless the whole
//! row is NaN) and sampling draws uniformly among the remaining candidates.

mod chain;

use std::collections::{HashMap, VecDeque};
use std::fmt;

pub use chain::{Chain, InfillVocab, Stage, INFILL_MAX_CANDIDATES};

use rand_chacha::ChaCha20Rng;

use crate::constraint::{Constraint, GrammarError};
use rand_core::{RngCore, SeedableRng};

/// The seed [`SamplingParams::default`] uses: `0xFFFF_FFFF`, the value of llama.cpp's
/// `LLAMA_DEFAULT_SEED`.
///
/// In llama.cpp that value means "pick a random seed"; here it is an ordinary fixed
/// seed, so a default-constructed sampler is reproducible. The CLI and the server pass
/// a fresh random seed themselves when the user gives none.
pub const DEFAULT_SEED: u64 = 0xFFFF_FFFF;

/// The fewest candidates any filter leaves (llama.cpp's `min_keep`).
const MIN_KEEP: usize = 1;

/// When top-p runs on unsorted candidates of more than this many tokens, it first sorts
/// only the best [`TOP_P_PARTIAL`] of them and sorts the rest only if the cumulative
/// probability has not reached `top_p` by then (llama.cpp's `llama_sampler_top_p_apply`
/// uses the same thresholds).
const TOP_P_PARTIAL_ABOVE: usize = 1024;
/// See [`TOP_P_PARTIAL_ABOVE`].
const TOP_P_PARTIAL: usize = 256;

/// The sampling settings of one generation, with llama.cpp's names and defaults.
///
/// The defaults ([`SamplingParams::default`]) are those of llama.cpp's
/// `common_params_sampling` (`common/common.h`).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature applied to the logits after the filters (logits are divided
    /// by it). `<= 0` (or NaN) means greedy decoding. Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `<= 0` disables. Default 40.
    pub top_k: i32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability
    /// sums to at least `top_p`; `>= 1` disables. Default 0.95.
    pub top_p: f32,
    /// Keep only tokens whose probability is at least `min_p` times that of the most
    /// likely token; `<= 0` disables. Default 0.05.
    pub min_p: f32,
    /// Repetition penalty (a factor) on tokens seen in the last `repeat_last_n` tokens:
    /// positive logits are divided by it, others multiplied; `1.0` disables. Default 1.0.
    pub repeat_penalty: f32,
    /// How many of the most recently accepted tokens (prompt included) the three
    /// penalties look at; `0` disables the penalties. Default 64. (llama.cpp's `-1`,
    /// "the context size", is for the caller to translate into a count.)
    pub repeat_last_n: usize,
    /// Subtracted from a token's logit once per occurrence in the penalty window
    /// (logit units per occurrence); `0.0` disables. Default 0.0.
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of every token present in the penalty window
    /// (logit units); `0.0` disables. Default 0.0.
    pub presence_penalty: f32,
    /// Seed of the random draw. Default [`DEFAULT_SEED`].
    pub seed: u64,
    /// Added to the logits of these tokens (logit units) before anything else runs, as
    /// llama.cpp's `logit_bias` sampler heads its chain (`common_sampler_init`); a bias of
    /// `-inf` bans the token (see [`ban_bias`]). Ids outside the row are skipped; a token
    /// listed twice gets both biases. Default: none.
    pub logit_bias: Vec<(u32, f32)>,
    /// The stages in a request's order (llama.cpp's `samplers`), instead of the default
    /// chain above; `None`: the default. ([`chain`]'s rules: a stage not named does not run.)
    pub chain: Option<Chain>,
}

/// The bias a request's `bias` stands for: OpenAI's `logit_bias` documents -100 as a ban,
/// so `bias <= -100` is `-inf` (the token can never be chosen, whatever its logit); other
/// values are added as they are, as llama.cpp does (+100 all but forces a token).
pub fn ban_bias(bias: f32) -> f32 {
    if bias <= -100.0 {
        f32::NEG_INFINITY
    } else {
        bias
    }
}

impl Default for SamplingParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no
    /// penalties (repeat 1.0 over the last 64 tokens, frequency 0, presence 0), and the
    /// fixed seed [`DEFAULT_SEED`].
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: DEFAULT_SEED,
            logit_bias: Vec::new(),
            chain: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: the defaults with temperature 0, so that [`Sampler::sample`]
    /// returns the argmax (no penalties, as they are off by default).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether these settings decode greedily: temperature `<= 0` (or NaN) in the
    /// default chain. (A custom chain keeps only the best candidate where its
    /// `temperature` stage runs, and never without one.)
    pub fn is_greedy(&self) -> bool {
        self.chain.is_none() && self.is_temperature_greedy()
    }

    /// Whether the temperature is `<= 0` (or NaN).
    fn is_temperature_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }

    fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// A token still in the running after the filters of the chain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Token id (index into the logits row).
    pub id: u32,
    /// The token's logit after penalties and, once the chain has finished, divided by
    /// the temperature.
    pub logit: f32,
    /// The token's probability among the surviving candidates (they sum to 1) once
    /// [`Sampler::candidates`] returns.
    pub p: f32,
}

/// Descending logit, then ascending id: a total order on sanitized candidates.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// The sampling chain of one sequence: its settings, its seeded random generator and
/// the history the penalties look at.
///
/// Typical use: [`accept`](Sampler::accept) every prompt token (llama.cpp's `main`
/// feeds the prompt to the sampler so the penalties see it), then for each step call
/// [`sample`](Sampler::sample) on the last logits row and [`accept`](Sampler::accept)
/// the token it returns.
///
/// The working buffer is kept between calls, so a call allocates nothing once the
/// first one has sized it to the vocabulary.
#[derive(Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// The last `repeat_last_n` accepted tokens, oldest first.
    history: VecDeque<u32>,
    /// Occurrences of each token in `history`.
    counts: HashMap<u32, u32>,
    /// Working buffer: the candidates of the current call.
    cands: Vec<Candidate>,
    /// Working buffer: the row with [`SamplingParams::logit_bias`] added and the
    /// constraint's mask applied (only with either).
    biased: Vec<f32>,
    /// The grammar the answer must match, if any.
    constraint: Option<Constraint>,
    /// The constraint's error at the last mask, reported by `try_sample`.
    mask_error: Option<GrammarError>,
    /// Whether `cands` is in `by_logit_desc` order.
    sorted: bool,
}

impl fmt::Debug for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler")
            .field("params", &self.params)
            .field("history_len", &self.history.len())
            .finish_non_exhaustive()
    }
}

impl Sampler {
    /// A sampler with the given settings, an empty history and its generator seeded
    /// with `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha20Rng::seed_from_u64(params.seed);
        Self {
            params,
            rng,
            history: VecDeque::new(),
            counts: HashMap::new(),
            cands: Vec::new(),
            biased: Vec::new(),
            constraint: None,
            mask_error: None,
            sorted: false,
        }
    }

    /// With `constraint`: every token [`Sampler::try_sample`] returns is one the grammar
    /// allows, and it is committed to the grammar. The mask is applied to the logits
    /// before the chain (after the logit bias), so every sampling mode works under it.
    pub fn with_constraint(mut self, constraint: Option<Constraint>) -> Self {
        self.constraint = constraint;
        self
    }

    /// Computes the constraint's next mask ahead of [`Sampler::try_sample`] (see
    /// [`Constraint::prepare`]); nothing without a constraint.
    pub fn prepare_constraint(&mut self) {
        if let Some(c) = &mut self.constraint {
            c.prepare();
        }
    }

    /// Bans `ids` from now on: a `-inf` logit bias each ([`ban_bias`]).
    pub fn ban(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.params
            .logit_bias
            .extend(ids.into_iter().map(|id| (id, f32::NEG_INFINITY)));
    }

    /// Whether a constraint is set.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// The constraint's time in masks and commits so far (zero without one).
    pub fn constraint_busy(&self) -> std::time::Duration {
        self.constraint
            .as_ref()
            .map(Constraint::busy)
            .unwrap_or_default()
    }

    /// Whether a constraint is set and its grammar is complete.
    pub fn constraint_complete(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(Constraint::is_complete)
    }

    /// The settings this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from one row of logits (`logits.len()` = n_vocab) by running
    /// the whole chain. Does not record it: call [`accept`](Sampler::accept) with it.
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(
            self.constraint.is_none(),
            "a constrained sampler samples with try_sample"
        );
        self.pick(logits)
    }

    /// [`Sampler::sample`] under the constraint, if any: the token is one the grammar
    /// allows, and it is committed to the grammar.
    ///
    /// Errors: the grammar is in an error state.
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn try_sample(&mut self, logits: &[f32]) -> Result<u32, GrammarError> {
        let id = self.pick(logits);
        self.commit(id)
    }

    /// The token of a speculative step's row where `proposal` was proposed, under `mode`:
    /// [`SpecSampling::Exact`] samples as [`Sampler::try_sample`] does (the proposal is
    /// taken when the draw equals it); [`SpecSampling::Rejection`] takes the proposal
    /// with probability `min(1, p(d) / q(d))` and otherwise draws from the residual
    /// `max(0, p - q)` renormalized (Leviathan et al. 2023, "Fast Inference from
    /// Transformers via Speculative Decoding", algorithm 1), where `p` is this sampler's
    /// distribution for the row (the whole chain, grammar mask included) and `q` the one
    /// the proposal was drawn from (`None`, or one without the proposal: a point mass on
    /// it, as prompt lookup and predictions propose). Either way the emitted token
    /// follows `p`; rejection spends two uniform draws where it rejects, so the same seed
    /// gives other tokens than plain decoding. Greedy settings take the argmax in both.
    ///
    /// Errors: the grammar is in an error state.
    pub fn try_sample_proposed(
        &mut self,
        logits: &[f32],
        proposal: u32,
        q: Option<&[Candidate]>,
        mode: SpecSampling,
    ) -> Result<u32, GrammarError> {
        let id = match mode {
            SpecSampling::Exact => self.pick(logits),
            SpecSampling::Rejection => self.pick_proposed(logits, proposal, q),
        };
        self.commit(id)
    }

    /// Draws a token from `logits` as [`Sampler::sample`] does and returns the
    /// distribution it was drawn from (the surviving candidates and their probabilities;
    /// greedy: the argmax alone, probability 1): what a drafting sampler reports as the
    /// `q` of [`Sampler::try_sample_proposed`]. No constraint applies (panics under one,
    /// as [`Sampler::sample`]).
    pub fn sample_distribution(&mut self, logits: &[f32]) -> (u32, &[Candidate]) {
        let id = self.sample(logits);
        if self.params.is_greedy() || self.cands.len() == 1 {
            self.cands.truncate(1);
            self.cands[0].p = 1.0;
        }
        (id, &self.cands)
    }

    /// Commits `id` to the constraint, if any (reporting the error of its last mask).
    fn commit(&mut self, id: u32) -> Result<u32, GrammarError> {
        if let Some(c) = &mut self.constraint {
            if let Some(e) = self.mask_error.take() {
                return Err(e);
            }
            c.commit(id)?;
        }
        Ok(id)
    }

    /// The rejection-sampling choice of [`Sampler::try_sample_proposed`].
    fn pick_proposed(&mut self, logits: &[f32], d: u32, q: Option<&[Candidate]>) -> u32 {
        self.run_filters(logits);
        if self.params.is_greedy() || self.cands.len() == 1 {
            return self.cands[0].id;
        }
        self.softmax();
        // q by id (sorted for lookups); a q without the proposal is not the one it was
        // drawn from: a point mass on it.
        let mut q: Vec<(u32, f32)> = q
            .filter(|q| q.iter().any(|c| c.id == d && c.p > 0.0))
            .map_or_else(
                || vec![(d, 1.0)],
                |q| q.iter().map(|c| (c.id, c.p)).collect(),
            );
        q.sort_unstable_by_key(|e| e.0);
        let q_of = |id: u32| q.binary_search_by_key(&id, |e| e.0).map_or(0.0, |i| q[i].1);
        let p_d = self.cands.iter().find(|c| c.id == d).map_or(0.0, |c| c.p);
        if self.uniform() * (q_of(d) as f64) < p_d as f64 {
            return d;
        }
        let p: Vec<f32> = self.cands.iter().map(|c| c.p).collect();
        for c in &mut self.cands {
            c.p = (c.p - q_of(c.id)).max(0.0);
        }
        if self.cands.iter().all(|c| c.p == 0.0) {
            // p ≤ q everywhere: only rounding rejected (p = q); draw from p.
            self.cands.iter_mut().zip(p).for_each(|(c, p)| c.p = p);
        }
        self.draw()
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
        self.run_filters(logits);
        if self.params.is_greedy() || self.cands.len() == 1 {
            return self.cands[0].id;
        }
        self.softmax();
        self.draw()
    }

    /// Runs the chain up to, not including, the random draw, and returns the surviving
    /// candidates with their final logits (penalized, divided by the temperature) and
    /// probabilities (summing to 1), for reporting (log-probabilities) or inspection.
    ///
    /// The order is the chain's: descending by logit when top-k or top-p ran, token id
    /// order otherwise. In greedy mode it is the single argmax with probability 1.
    /// Consumes no randomness and records nothing.
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn candidates(&mut self, logits: &[f32]) -> &[Candidate] {
        self.run_filters(logits);
        self.softmax();
        &self.cands
    }

    /// Records a token for the penalties: generated tokens and, as llama.cpp's `main`
    /// does (`common_sampler_accept` on each prompt token in `tools/main/main.cpp`),
    /// the prompt's tokens. Only the last `repeat_last_n` are kept; with
    /// `repeat_last_n == 0` nothing is recorded (`llama_sampler_penalties_accept`).
    pub fn accept(&mut self, token: u32) {
        let n = self.params.repeat_last_n;
        if n == 0 {
            return;
        }
        if self.history.len() >= n {
            if let Some(old) = self.history.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.history.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Forgets the penalty history and re-seeds the generator with `params.seed`, so the
    /// sampler behaves as if new (as llama.cpp's `llama_sampler_dist_reset` re-seeds).
    pub fn reset(&mut self) {
        self.history.clear();
        self.counts.clear();
        self.rng = ChaCha20Rng::seed_from_u64(self.params.seed);
    }

    /// Fills the buffer from `logits` with the logit bias and the penalties applied, then
    /// either the greedy choice or top-k → top-p → min-p → temperature.
    fn run_filters(&mut self, logits: &[f32]) {
        assert!(!logits.is_empty(), "sampling from an empty logits row");
        if self.params.logit_bias.is_empty() && self.constraint.is_none() {
            return self.run_chain(logits);
        }
        let mut row = std::mem::take(&mut self.biased);
        match &mut self.constraint {
            Some(c) => {
                if let Err(e) = c.masked(logits, &mut row) {
                    self.mask_error = Some(e);
                }
            }
            None => {
                row.clear();
                row.extend_from_slice(logits);
            }
        }
        // After the mask: a banned logit stays -inf whatever its bias.
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = row.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.run_chain(&row);
        self.biased = row;
    }

    /// The chain after the logit bias: penalties, then the greedy choice or
    /// top-k → top-p → min-p → temperature.
    fn run_chain(&mut self, logits: &[f32]) {
        if self.params.chain.is_some() {
            return self.run_custom(logits);
        }
        if self.params.is_greedy() {
            let best = self.greedy_pick(logits);
            self.cands.clear();
            self.cands.push(best);
            self.sorted = true;
            return;
        }
        let k = self.params.top_k;
        if k > 0 && (k as usize) < logits.len() {
            self.fill_top_k(logits, k as usize);
        } else {
            self.fill(logits);
            self.apply_penalties();
            self.top_k();
        }
        self.top_p();
        self.min_p();
        self.temperature();
    }

    /// Whether `id` has a penalty to apply (so the raw logit is not the one to use).
    fn is_penalized(&self, id: u32) -> bool {
        self.params.penalties_active() && self.counts.contains_key(&id)
    }

    /// The whole row, in id order, sanitized.
    fn fill(&mut self, logits: &[f32]) {
        self.cands.clear();
        self.cands
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: sanitize(l),
                p: 0.0,
            }));
        self.sorted = false;
    }

    /// `llama_sampler_penalties_apply` on a buffer filled by [`Sampler::fill`]: still in
    /// id order, so each penalized token is found by index.
    fn apply_penalties(&mut self) {
        if !self.params.penalties_active() {
            return;
        }
        for (&id, &count) in &self.counts {
            if let Some(c) = self.cands.get_mut(id as usize) {
                c.logit = penalize(&self.params, c.logit, count);
            }
        }
    }

    /// The argmax of the penalized logits, ties to the lowest id, without copying the
    /// row: one pass over the raw logits of the unpenalized tokens, then each penalized
    /// token with its new logit.
    fn greedy_pick(&self, logits: &[f32]) -> Candidate {
        let check = self.params.penalties_active() && !self.counts.is_empty();
        let mut best_i = usize::MAX;
        let mut best_l = f32::NEG_INFINITY;
        for (i, &l) in logits.iter().enumerate() {
            // NaN and -inf never pass `>`.
            if l > best_l && !(check && self.counts.contains_key(&(i as u32))) {
                best_i = i;
                best_l = l;
            }
        }
        if best_i == usize::MAX {
            // Every unpenalized logit is -inf or NaN: [`argmax`]'s choice among them,
            // unless a penalized token rose above -inf.
            let mut best = Candidate {
                id: argmax(logits),
                logit: f32::NEG_INFINITY,
                p: 1.0,
            };
            for c in penalized(&self.params, &self.counts, logits) {
                if by_logit_desc(&c, &best).is_lt() && c.logit > f32::NEG_INFINITY {
                    best = Candidate { p: 1.0, ..c };
                }
            }
            return best;
        }
        let mut best = Candidate {
            id: best_i as u32,
            logit: sanitize(best_l),
            p: 1.0,
        };
        for c in penalized(&self.params, &self.counts, logits) {
            if by_logit_desc(&c, &best).is_lt() {
                best = Candidate { p: 1.0, ..c };
            }
        }
        best
    }

    /// Penalties and `llama_sampler_top_k_impl` for `0 < k < n_vocab` in one pass over
    /// the row, without copying it: a buffer of `2 max(k, 64)` candidates is cut back to
    /// its best `k` (partial selection) whenever it fills, and later tokens must beat
    /// the k-th best so far to enter. Penalized tokens are left out of the scan and
    /// added afterwards with their penalized logits. The result is sorted.
    fn fill_top_k(&mut self, logits: &[f32], k: usize) {
        self.cands.clear();
        let cap = 2 * k.max(64);
        // The logit of the k-th best candidate after the last cut: a later token (higher
        // id) must be strictly above it, as it loses ties to every one of those `k`.
        // (No bar yet: -inf, and `have_bar` false lets -inf and NaN in as well.)
        let mut bar = f32::NEG_INFINITY;
        let mut have_bar = false;
        for (i, &l) in logits.iter().enumerate() {
            if have_bar && (l <= bar || l.is_nan()) {
                continue;
            }
            let id = i as u32;
            if self.is_penalized(id) {
                continue;
            }
            self.cands.push(Candidate {
                id,
                logit: sanitize(l),
                p: 0.0,
            });
            if self.cands.len() == cap {
                self.cands.select_nth_unstable_by(k - 1, by_logit_desc);
                self.cands.truncate(k);
                bar = self.cands[k - 1].logit;
                have_bar = true;
            }
        }
        self.cands
            .extend(penalized(&self.params, &self.counts, logits));
        if self.cands.len() > k {
            self.cands.select_nth_unstable_by(k - 1, by_logit_desc);
            self.cands.truncate(k);
        }
        self.cands.sort_unstable_by(by_logit_desc);
        self.sorted = true;
    }

    /// `llama_sampler_top_k_impl` on the full row (top-k disabled, or `k >= n_vocab`,
    /// where it only sorts, as llama.cpp does); `0 < k < n_vocab` goes through
    /// [`Sampler::fill_top_k`].
    fn top_k(&mut self) {
        if self.params.top_k <= 0 {
            return;
        }
        let k = (self.params.top_k as usize).min(self.cands.len());
        if !self.sorted {
            if k < self.cands.len() {
                self.cands.select_nth_unstable_by(k - 1, by_logit_desc);
                self.cands.truncate(k);
            }
            self.cands.sort_unstable_by(by_logit_desc);
            self.sorted = true;
        }
        self.cands.truncate(k);
    }

    /// `llama_sampler_top_p_apply`: softmax over the current candidates, then the
    /// shortest descending prefix whose cumulative probability is `>= top_p`.
    fn top_p(&mut self) {
        let p = self.params.top_p;
        // `>= 1` disables; NaN keeps everything in llama.cpp too (`cum >= NaN` never holds).
        if p >= 1.0 || p.is_nan() {
            return;
        }
        softmax_f32(&mut self.cands, self.sorted);

        let n = self.cands.len();
        // How much of the buffer is known to be in descending order.
        let mut sorted_len = n;
        if !self.sorted {
            if n > TOP_P_PARTIAL_ABOVE {
                sorted_len = TOP_P_PARTIAL;
                self.cands
                    .select_nth_unstable_by(sorted_len - 1, by_logit_desc);
                self.cands[..sorted_len].sort_unstable_by(by_logit_desc);
            } else {
                self.cands.sort_unstable_by(by_logit_desc);
            }
            self.sorted = true;
        }

        let mut cum = 0.0f32;
        let mut last = n;
        for i in 0..n {
            if i == sorted_len {
                // The partial sort was not enough: everything past it is no larger than
                // what came before, so sorting the tail completes the order.
                self.cands[sorted_len..].sort_unstable_by(by_logit_desc);
                sorted_len = n;
            }
            cum += self.cands[i].p;
            if cum >= p && i + 1 >= MIN_KEEP {
                last = i + 1;
                break;
            }
        }
        self.cands.truncate(last);
    }

    /// `llama_sampler_min_p_apply`: keep `logit >= max_logit + ln(min_p)`, i.e.
    /// `p >= min_p * p_max`, preserving the current order.
    fn min_p(&mut self) {
        let p = self.params.min_p;
        // `<= 0` disables; NaN keeps everything in llama.cpp too.
        if p <= 0.0 || p.is_nan() || self.cands.is_empty() {
            return;
        }
        let max = if self.sorted {
            self.cands[0].logit
        } else {
            self.cands
                .iter()
                .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
        };
        let threshold = max + p.ln();
        if self.sorted {
            let mut i = 1;
            while i < self.cands.len() && (self.cands[i].logit >= threshold || i < MIN_KEEP) {
                i += 1;
            }
            self.cands.truncate(i);
        } else {
            // The maximum always satisfies the threshold (ln(p) <= 0 for p <= 1; for
            // p > 1 nothing may pass, and then the best one is kept).
            let kept = self.cands.iter().filter(|c| c.logit >= threshold).count();
            if kept >= MIN_KEEP {
                self.cands.retain(|c| c.logit >= threshold);
            } else {
                self.cands.sort_unstable_by(by_logit_desc);
                self.cands.truncate(MIN_KEEP);
                self.sorted = true;
            }
        }
    }

    /// `llama_sampler_temp_impl` for a positive temperature. A temperature so small that
    /// the best logit divided by it leaves f32's range (1e-38 on a logit of 20) keeps
    /// only the best candidates, the limit as the temperature goes to 0: divided, every
    /// logit above about 3.4 would be +inf and share the mass ([`Self::softmax`]), drawing
    /// at random among them.
    fn temperature(&mut self) {
        let t = self.params.temperature;
        if t == 1.0 {
            return;
        }
        let max = self
            .cands
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        if max.is_finite() && !(max / t).is_finite() {
            for c in &mut self.cands {
                c.logit = if c.logit == max {
                    0.0
                } else {
                    f32::NEG_INFINITY
                };
            }
            return;
        }
        for c in &mut self.cands {
            c.logit /= t;
        }
    }

    /// Final probabilities of the candidates (the softmax of `llama_sampler_dist_apply`,
    /// with the normalizing sum in f64 as there).
    fn softmax(&mut self) {
        let max = self
            .cands
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let mut sum = 0.0f64;
        for c in &mut self.cands {
            // An infinite maximum (all -inf, or a temperature pushing f32::MAX past the
            // range) would make `logit - max` NaN: share the mass among the maxima.
            c.p = if max.is_infinite() {
                if c.logit == max {
                    1.0
                } else {
                    0.0
                }
            } else {
                (c.logit - max).exp()
            };
            sum += c.p as f64;
        }
        for c in &mut self.cands {
            c.p = (c.p as f64 / sum) as f32;
        }
    }

    /// The random draw of `llama_sampler_dist_apply`: a uniform `r` in `[0, 1)` (53 bits
    /// of the generator), then the first candidate, in buffer order, whose cumulative
    /// probability exceeds `r` times the total. A zero-probability candidate is never
    /// chosen.
    fn draw(&mut self) -> u32 {
        let r = self.uniform();
        let total: f64 = self.cands.iter().map(|c| c.p as f64).sum();
        let target = r * total;
        let mut cum = 0.0f64;
        for c in &self.cands {
            cum += c.p as f64;
            if cum > target {
                return c.id;
            }
        }
        // Rounding can leave `target == total`: take the last candidate with mass.
        self.cands
            .iter()
            .rev()
            .find(|c| c.p > 0.0)
            .unwrap_or(&self.cands[0])
            .id
    }

    /// A uniform number in `[0, 1)` from 53 bits of the generator.
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// How a speculative step decides which proposals to take (`--spec-sampling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecSampling {
    /// Exact match (the default): each row is sampled as plain decoding samples it and a
    /// proposal is taken when the draw equals it, so the tokens are exactly plain
    /// decoding's for the same seed.
    #[default]
    Exact,
    /// Distribution-preserving rejection sampling (Leviathan et al. 2023): each token
    /// still follows the model's distribution, a sampling draft's proposals are taken
    /// more often, and a seed no longer fixes the tokens plain decoding gives.
    Rejection,
}

/// NaN → `-inf` (never chosen), `+inf` → `f32::MAX` (keeps softmax finite).
fn sanitize(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else if l == f32::INFINITY {
        f32::MAX
    } else {
        l
    }
}

/// The penalized tokens that exist in the row, with their penalized logits (nothing
/// when the penalties are off).
fn penalized<'a>(
    params: &'a SamplingParams,
    counts: &'a HashMap<u32, u32>,
    logits: &'a [f32],
) -> impl Iterator<Item = Candidate> + 'a {
    let active = params.penalties_active();
    counts
        .iter()
        .filter(move |(&id, _)| active && (id as usize) < logits.len())
        .map(move |(&id, &count)| Candidate {
            id,
            logit: penalize(params, sanitize(logits[id as usize]), count),
            p: 0.0,
        })
}

/// One token's penalties (`llama_sampler_penalties_apply`): the repeat penalty divides a
/// positive logit and multiplies a zero or negative one, then `count * frequency +
/// presence` is subtracted.
fn penalize(params: &SamplingParams, logit: f32, count: u32) -> f32 {
    let l = if logit <= 0.0 {
        logit * params.repeat_penalty
    } else {
        logit / params.repeat_penalty
    };
    sanitize(l - (count as f32 * params.frequency_penalty + params.presence_penalty))
}

/// `llama_sampler_softmax_impl` without sorting: f32 exponentials and f32 sum, in
/// buffer order.
fn softmax_f32(cands: &mut [Candidate], sorted: bool) {
    let max = if sorted {
        cands[0].logit
    } else {
        cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
    };
    if max == f32::NEG_INFINITY {
        let p = 1.0 / cands.len() as f32;
        cands.iter_mut().for_each(|c| c.p = p);
        return;
    }
    let mut sum = 0.0f32;
    for c in cands.iter_mut() {
        c.p = (c.logit - max).exp();
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

/// A fresh seed for a request or run that names none (`--seed` absent, no `seed` field):
/// the clock through the standard library's randomly keyed hasher.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The index of the largest logit; ties go to the lowest index and NaN never wins
/// (an all-NaN row gives 0).
///
/// # Panics
/// If `logits` is empty.
pub fn argmax(logits: &[f32]) -> u32 {
    assert!(!logits.is_empty(), "argmax of an empty logits row");
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if l <= b => {}
            _ => best = Some((i, l)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}
