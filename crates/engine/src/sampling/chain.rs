//! A sampler chain in an order the request gives (llama.cpp's `samplers` field), and
//! llama.cpp's `infill` sampler, which only such a chain runs.
//!
//! llama.cpp builds its chain from the names in `common_params_sampling::samplers`
//! (`common_sampler_init`, `common/sampling.cpp`), each stage run where it is named, then
//! the random draw. A stage that is not named does not run: with no `temperature` stage
//! the logits are never divided, so a request's temperature of 0 does not make such a chain
//! greedy. The stages here are the ones frink implements; llama.cpp's `dry`, `typ_p`,
//! `xtc` and `top_n_sigma` do nothing at their neutral settings, which the server requires
//! of any request that names them.

use std::sync::Arc;

use super::{by_logit_desc, softmax_f32, Candidate, Sampler};

/// One stage of a custom chain, with llama.cpp's name in [`Stage::from_name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `penalties`: repeat, frequency and presence penalties.
    Penalties,
    /// `top_k`.
    TopK,
    /// `top_p`.
    TopP,
    /// `min_p`.
    MinP,
    /// `temperature`: divides the logits; at `<= 0` keeps only the best candidate
    /// (`llama_sampler_temp_impl`).
    Temperature,
    /// `infill`: llama.cpp's fill-in-the-middle sampler ([`Sampler::infill`]).
    Infill,
}

impl Stage {
    /// The stage llama.cpp names `name` (`common_sampler_type_from_str`'s names):
    /// `Some(Some(stage))`; `Some(None)` for a sampler frink leaves out at its neutral
    /// settings (`dry`, `typ_p`/`typical_p`, `xtc`, `top_n_sigma`); `None` for a name
    /// llama.cpp does not know.
    pub fn from_name(name: &str) -> Option<Option<Stage>> {
        Some(Some(match name {
            "penalties" => Stage::Penalties,
            "top_k" => Stage::TopK,
            "top_p" | "nucleus" => Stage::TopP,
            "min_p" => Stage::MinP,
            "temperature" | "temp" => Stage::Temperature,
            "infill" => Stage::Infill,
            "dry" | "typ_p" | "typical_p" | "typical" | "xtc" | "top_n_sigma" => return Some(None),
            _ => return None,
        }))
    }
}

/// What llama.cpp's infill sampler reads of the vocabulary: each token's text as
/// `token_to_piece(id, special = false)` gives it (a control token's is empty), which
/// tokens end generation, and the end-of-turn token it falls back to.
pub struct InfillVocab {
    pieces: Vec<Box<[u8]>>,
    eog: Vec<bool>,
    eot: u32,
}

impl std::fmt::Debug for InfillVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InfillVocab")
            .field("n_vocab", &self.pieces.len())
            .field("eot", &self.eot)
            .finish()
    }
}

impl InfillVocab {
    /// From every token's piece (index = id), the end-of-generation ids and the
    /// end-of-turn id (llama.cpp's `token_eot`; the caller falls back to EOS).
    pub fn new(pieces: Vec<Vec<u8>>, eog: &[u32], eot: u32) -> InfillVocab {
        let mut is_eog = vec![false; pieces.len()];
        for &id in eog {
            if let Some(e) = is_eog.get_mut(id as usize) {
                *e = true;
            }
        }
        InfillVocab {
            pieces: pieces.into_iter().map(Vec::into_boxed_slice).collect(),
            eog: is_eog,
            eot,
        }
    }

    fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }

    fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }
}

/// A request's sampler order: its stages, and the vocabulary when it names `infill`.
#[derive(Clone, Debug)]
pub struct Chain {
    /// The stages, in the order they run (then the draw).
    pub stages: Vec<Stage>,
    /// What the infill stage reads; required when `stages` holds [`Stage::Infill`].
    pub infill: Option<Arc<InfillVocab>>,
}

impl PartialEq for Chain {
    fn eq(&self, other: &Chain) -> bool {
        self.stages == other.stages
            && match (&self.infill, &other.infill) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// The most candidates the infill stage compares pairwise; a chain must cut to at most
/// this many with `top_k` before it (the server checks, as the cost is quadratic).
pub const INFILL_MAX_CANDIDATES: usize = 1024;

impl Sampler {
    /// Runs a custom chain on the (biased, masked) row: the candidates in id order, then
    /// each stage where it is named.
    pub(super) fn run_custom(&mut self, logits: &[f32]) {
        self.fill(logits);
        let n = self.params.chain.as_ref().map_or(0, |c| c.stages.len());
        for i in 0..n {
            let Some(stage) = self.params.chain.as_ref().map(|c| c.stages[i]) else {
                return;
            };
            match stage {
                Stage::Penalties => self.penalties_anywhere(),
                Stage::TopK => self.top_k(),
                Stage::TopP => self.top_p(),
                Stage::MinP => self.min_p(),
                Stage::Temperature if self.params.is_temperature_greedy() => self.keep_best(),
                Stage::Temperature => self.temperature(),
                Stage::Infill => {
                    let vocab = self.params.chain.as_ref().and_then(|c| c.infill.clone());
                    if let Some(v) = vocab {
                        self.infill(&v);
                    }
                }
            }
        }
    }

    /// The penalties at any point of the chain (the candidates maybe sorted and cut).
    fn penalties_anywhere(&mut self) {
        if !self.params.penalties_active() {
            return;
        }
        let params = &self.params;
        for c in &mut self.cands {
            if let Some(&count) = self.counts.get(&c.id) {
                c.logit = super::penalize(params, c.logit, count);
            }
        }
        if self.sorted {
            self.cands.sort_unstable_by(by_logit_desc);
        }
    }

    /// `llama_sampler_temp_impl` at a temperature `<= 0`: only the best candidate stays.
    fn keep_best(&mut self) {
        if let Some(best) = self.cands.iter().copied().min_by(by_logit_desc) {
            self.cands.clear();
            self.cands.push(best);
            self.sorted = true;
        }
    }

    /// llama.cpp's `llama_sampler_infill_apply` (`src/llama-sampling.cpp`): with the
    /// candidates' softmax, (1) when end-of-generation is likely (`3 p_eog n > p_txt`),
    /// keep only the end-of-generation tokens; else (2) merge every token whose text is a
    /// prefix of another's into the likelier of the two (its probability added there,
    /// the other dropped), (3) keep the tokens at probability `>= 0.2` and every
    /// end-of-generation token (none of the first kind left: the end-of-turn token
    /// alone), and (4) renormalised, keep those at `>= 1 / (n_text + 1)` and the
    /// end-of-generation ones. The draw then takes its probabilities from the survivors'
    /// logits, as llama.cpp's `dist` does.
    pub(super) fn infill(&mut self, vocab: &InfillVocab) {
        if self.cands.is_empty() {
            return;
        }
        if !self.sorted {
            self.cands.sort_unstable_by(by_logit_desc);
            self.sorted = true;
        }
        softmax_f32(&mut self.cands, true);
        let (mut p_txt, mut p_eog) = (0.0f32, 0.0f32);
        for c in &self.cands {
            if vocab.is_eog(c.id) {
                p_eog += c.p;
            } else {
                p_txt += c.p;
            }
        }
        if 3.0 * p_eog * self.cands.len() as f32 > p_txt {
            self.cands.retain(|c| vocab.is_eog(c.id));
            return;
        }
        let n = self.cands.len();
        for i0 in 0..n {
            for i1 in 0..n {
                if self.cands[i0].logit == f32::NEG_INFINITY {
                    break;
                }
                if i0 == i1 || self.cands[i1].logit == f32::NEG_INFINITY {
                    continue;
                }
                let (a, b) = (
                    vocab.piece(self.cands[i0].id),
                    vocab.piece(self.cands[i1].id),
                );
                if !a.is_empty() && a.len() <= b.len() && b.starts_with(a) {
                    let (dst, src) = if self.cands[i1].p > self.cands[i0].p {
                        (i1, i0)
                    } else {
                        (i0, i1)
                    };
                    self.cands[dst].p += self.cands[src].p;
                    self.cands[src].logit = f32::NEG_INFINITY;
                    self.cands[src].p = 0.0;
                }
            }
        }
        let mut n_text = 0usize;
        let mut sum = 0.0f32;
        self.cands.retain(|c| {
            let eog = vocab.is_eog(c.id);
            let keep = eog || c.p >= 0.2;
            if keep {
                n_text += usize::from(!eog);
                sum += c.p;
            }
            keep
        });
        if n_text == 0 {
            self.cands.clear();
            self.cands.push(Candidate {
                id: vocab.eot,
                logit: 1.0,
                p: 1.0,
            });
            return;
        }
        let threshold = 1.0 / (n_text + 1) as f32;
        self.cands
            .retain(|c| vocab.is_eog(c.id) || c.p / sum >= threshold);
    }
}

#[cfg(test)]
mod tests {
    use super::super::SamplingParams;
    use super::*;

    /// Ids: 0 `a`, 1 `ab`, 2 `b` … 6 `f`, 7 end-of-generation, 8 end-of-turn.
    fn vocab() -> Arc<InfillVocab> {
        let pieces = ["a", "ab", "b", "c", "d", "e", "f", "", ""]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        Arc::new(InfillVocab::new(pieces, &[7, 8], 8))
    }

    fn survivors(probs: &[f32]) -> Vec<u32> {
        let mut s = Sampler::new(SamplingParams {
            chain: Some(Chain {
                stages: vec![Stage::Infill],
                infill: Some(vocab()),
            }),
            ..SamplingParams::default()
        });
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut ids: Vec<u32> = s.candidates(&logits).iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }

    /// Each branch of llama.cpp's rule, with the probabilities worked by hand.
    #[test]
    fn the_infill_rule() {
        // End likely (3 · 0.1 · 9 = 2.7 > 0.9): only the end tokens.
        assert_eq!(
            survivors(&[0.5, 0.2, 0.1, 0.1, 0.0, 0.0, 0.0, 0.05, 0.05]),
            [7, 8]
        );
        // `a` (0.45) absorbs `ab` (0.30): 0.75; `b` (0.24) passes 0.2, then falls under
        // a third of the kept mass (0.242 < 1/3); the end tokens always stay.
        assert_eq!(
            survivors(&[0.45, 0.30, 0.24, 0.0099, 0.0, 0.0, 0.0, 0.0001, 0.0]),
            [0, 7, 8]
        );
        // No text token reaches 0.2 (five at 0.1996): the end-of-turn token alone.
        let t = 0.1996;
        assert_eq!(survivors(&[0.0, 0.0, t, t, t, t, t, 0.001, 0.001]), [8]);
    }

    /// The default order given explicitly samples what the built-in chain samples, and
    /// another order samples something else (here temperature before top-p widens it).
    #[test]
    fn an_explicit_chain_is_the_default_and_order_matters() {
        let logits: Vec<f32> = (0..200).map(|i| ((i * 37 % 101) as f32) / 9.0).collect();
        let run = |chain: Option<Vec<Stage>>, temperature: f32| {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                top_p: 0.9,
                seed: 7,
                chain: chain.map(|stages| Chain {
                    stages,
                    infill: None,
                }),
                ..SamplingParams::default()
            });
            (0..300).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
        };
        let default = vec![
            Stage::Penalties,
            Stage::TopK,
            Stage::TopP,
            Stage::MinP,
            Stage::Temperature,
        ];
        assert_eq!(run(Some(default.clone()), 1.5), run(None, 1.5));
        assert_eq!(run(Some(default), 0.0), run(None, 0.0));
        let temp_first = vec![Stage::Temperature, Stage::TopK, Stage::TopP, Stage::MinP];
        assert_ne!(run(Some(temp_first), 3.0), run(None, 3.0));
        // No temperature stage: a temperature of 0 does not make it greedy.
        let no_temp = run(Some(vec![Stage::TopK, Stage::TopP]), 0.0);
        assert!(no_temp.iter().any(|&t| t != no_temp[0]));
    }
}
