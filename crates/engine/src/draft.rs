//! Draft-model speculation (llama.cpp's `--model-draft`/`-md`): a smaller model of the same
//! vocabulary proposes the next tokens greedily from its own KV cache; the target verifies
//! them ([`crate::generate_with`]), so the answer is the target's whatever the draft says.

use std::collections::HashSet;

use frink_models::{KvType, Logits, Model, ModelError};
use frink_tokenizer::Tokenizer;

use crate::generate::Propose;
use crate::sampling::{Candidate, Sampler, SamplingParams};
use crate::session::Session;

/// Checks that a draft model's tokenizer is the target's: the same number of tokens and
/// the same text for every id (llama.cpp's `common_speculative_are_compatible` compares
/// the vocabulary type, BOS/EOS and the texts; frink requires all of them equal, so every
/// proposed id means the same to the target).
///
/// Errors: a message naming the first difference.
pub fn check_same_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if target.n_vocab() != draft.n_vocab() {
        return Err(format!(
            "the draft model has {} tokens, the model {}: a draft model needs the same vocabulary",
            draft.n_vocab(),
            target.n_vocab()
        ));
    }
    if target.bos_id() != draft.bos_id() {
        return Err(format!(
            "the draft model's BOS token is {:?}, the model's {:?}",
            draft.bos_id(),
            target.bos_id()
        ));
    }
    let id = (0..target.n_vocab() as u32).find(|&i| target.token_text(i) != draft.token_text(i));
    match id {
        Some(i) => Err(format!(
            "token {i} is {:?} in the draft model and {:?} in the model: a draft model needs the same vocabulary",
            draft.token_text(i).unwrap_or(""),
            target.token_text(i).unwrap_or("")
        )),
        None => Ok(()),
    }
}

/// Loads the draft model at `path` for a model of tokenizer `target` whose cache is of
/// `kv_type` (the draft's is too): its vocabulary must be the same
/// ([`check_same_vocabulary`]), its state cut back (no recurrent layers) and its heads
/// fit for `kv_type` ([`KvType::check_heads`]).
///
/// Errors: a message naming the file's error, the vocabulary difference, the layers or
/// the head sizes.
pub fn load_draft_model(
    path: &std::path::Path,
    target: &Tokenizer,
    kv_type: KvType,
) -> Result<Model, String> {
    let draft = Model::load(path)
        .map_err(|e| format!("cannot load the draft model {}: {e}", path.display()))?;
    let tok = Tokenizer::from_gguf(&draft.file)
        .map_err(|e| format!("the draft model's tokenizer: {e}"))?;
    check_same_vocabulary(target, &tok)?;
    if draft.config.plan.is_recurrent() {
        return Err("the draft model has recurrent layers (its state cannot be cut back)".into());
    }
    kv_type
        .check_heads(&draft.config)
        .map_err(|e| format!("the draft model {}: {e}", path.display()))?;
    Ok(draft)
}

/// Proposes with a draft model: it evaluates the history it does not hold yet (keeping the
/// longest prefix it already holds: what the target rejected is cut off), then picks its
/// most likely token while that token's probability is at least `p_min`, up to the number
/// asked for; fewer than `n_min` proposals are none (llama.cpp's `--draft-p-min`,
/// `--draft-min`). A draft ends with an end-of-generation token ([`DraftModel::eog`]):
/// nothing after one is ever verified. With [`DraftModel::sample_with`] it draws each
/// token from a sampling chain instead and reports the distributions
/// ([`Propose::distributions`]) for rejection sampling.
pub struct DraftModel<'m> {
    session: Session<'m>,
    /// The tokens its cache holds (`session.n_past()` of them).
    held: Vec<u32>,
    /// Stop proposing below this probability of the draft's choice.
    pub p_min: f32,
    /// Propose nothing rather than fewer than this.
    pub n_min: usize,
    /// Tokens before the history [`Propose::propose`] is given (a chat's earlier turns,
    /// which the target's session already held when generation began).
    pub prefix: Vec<u32>,
    /// End-of-generation ids (the target's; the vocabulary is the same): a draft stops
    /// after proposing one.
    pub eog: HashSet<u32>,
    /// Never propose an end-of-generation token (the target bans them: `ignore_eos`,
    /// [`crate::FinishRule::prepare`]), so the draft follows the target's distribution.
    pub ban_eog: bool,
    /// Draws proposals from this chain instead of taking the most likely token.
    sampler: Option<Sampler>,
    /// The distributions of the last draft's tokens (with a sampler).
    dists: Vec<Vec<Candidate>>,
}

impl<'m> DraftModel<'m> {
    /// The default of [`DraftModel::p_min`] (`--draft-p-min`).
    pub const DEFAULT_P_MIN: f32 = 0.75;

    /// A draft of `model` with a cache of `n_ctx` positions of `kv_type` (the target's
    /// context: it holds the same tokens).
    pub fn new(model: &'m Model, n_ctx: usize, kv_type: KvType) -> DraftModel<'m> {
        DraftModel {
            session: Session::new(model, n_ctx, kv_type),
            held: Vec::new(),
            p_min: Self::DEFAULT_P_MIN,
            n_min: 0,
            prefix: Vec::new(),
            eog: HashSet::new(),
            ban_eog: false,
            sampler: None,
            dists: Vec::new(),
        }
    }

    /// Drafts by drawing from the sampling chain of `params` (a request's settings,
    /// without its penalties, which need the history, and with its seed mixed so the
    /// draft's draws are not the target's) instead of taking the most likely token: for
    /// [`crate::SpecSampling::Rejection`], where a draft that samples as the model does
    /// is accepted more often. `--draft-p-min` then applies to the chain's most likely
    /// candidate. Greedy settings keep the greedy draft.
    pub fn sample_with(&mut self, params: &SamplingParams) {
        self.sampler = (!params.is_greedy()).then(|| {
            Sampler::new(SamplingParams {
                repeat_penalty: 1.0,
                frequency_penalty: 0.0,
                presence_penalty: 0.0,
                seed: params.seed ^ 0x9e37_79b9_7f4a_7c15,
                ..params.clone()
            })
        });
    }

    fn draft(&mut self, h: &[u32], max: usize) -> Result<Vec<u32>, ModelError> {
        // Hold h[..len - 1] and evaluate the last token for the next position's logits.
        let common = self.held.iter().zip(h).take_while(|(a, b)| a == b).count();
        let keep = self.session.truncate(common.min(h.len() - 1));
        self.held.truncate(keep);
        let room = self.session.n_ctx() - keep;
        if h.len() - keep > room {
            return Ok(Vec::new());
        }
        let mut logits = self.session.eval(&h[keep..], Logits::Last)?;
        self.held.extend_from_slice(&h[keep..]);
        let mut out = Vec::new();
        self.dists.clear();
        while out.len() < max {
            if self.ban_eog {
                for &t in &self.eog {
                    if let Some(l) = logits.get_mut(t as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let (t, p) = match &mut self.sampler {
                None => most_likely(&logits),
                Some(s) => {
                    let (t, q) = s.sample_distribution(&logits);
                    let top = q.iter().fold(0.0f32, |m, c| m.max(c.p));
                    self.dists.push(q.to_vec());
                    (t, top)
                }
            };
            if p < self.p_min {
                self.dists.truncate(out.len());
                break;
            }
            out.push(t);
            if out.len() == max
                || self.eog.contains(&t)
                || self.session.n_past() >= self.session.n_ctx()
            {
                break;
            }
            logits = self.session.eval(&[t], Logits::Last)?;
            self.held.push(t);
        }
        if out.len() < self.n_min {
            out.clear();
            self.dists.clear();
        }
        Ok(out)
    }
}

impl Propose for DraftModel<'_> {
    /// A failed draft evaluation proposes nothing (the target decodes on; the draft's
    /// cache starts over).
    fn propose(&mut self, h: &[u32], max: usize) -> Vec<u32> {
        if max == 0 || h.is_empty() {
            return Vec::new();
        }
        let whole;
        let h = if self.prefix.is_empty() {
            h
        } else {
            whole = [&self.prefix[..], h].concat();
            &whole[..]
        };
        self.draft(h, max).unwrap_or_else(|_| {
            self.session.truncate(0);
            self.held.clear();
            self.dists.clear();
            Vec::new()
        })
    }

    fn distributions(&mut self) -> Vec<Vec<Candidate>> {
        std::mem::take(&mut self.dists)
    }
}

/// The highest-scoring id (the lowest on ties) and its softmax probability.
fn most_likely(logits: &[f32]) -> (u32, f32) {
    let (mut best, mut max) = (0usize, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            best = i;
            max = v;
        }
    }
    let sum: f32 = logits.iter().map(|&v| (v - max).exp()).sum();
    (best as u32, 1.0 / sum)
}
