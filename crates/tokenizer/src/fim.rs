//! Fill-in-the-middle prompts: the text before a gap (prefix), after it (suffix), the start
//! of the middle already typed, and other files of the repository as context, in the token
//! layout llama.cpp's server builds (`format_prompt_infill`, tools/server/server-common.cpp;
//! the repository-level pattern of Qwen2.5-Coder, arXiv 2409.12186):
//!
//! `[extra][BOS][FIM_PRE]prefix middle[FIM_SUF]suffix[FIM_MID]`, where `extra` is
//! `[FIM_REP]myproject\n` then, per file, `[FIM_SEP]NAME\n TEXT` and finally
//! `[FIM_SEP]filename\n` (without `FIM_SEP`, files are joined by a `--- snippet ---` line).
//! Only llama.cpp's prefix-suffix-middle order is built (its `--spm-infill` is not).

use crate::error::{Result, TokenizerError};
use crate::Tokenizer;

/// The text around a gap and the repository context of one infill request.
#[derive(Clone, Debug, Default)]
pub struct Infill<'a> {
    /// The text before the gap (llama.cpp's `input_prefix`).
    pub prefix: &'a str,
    /// The text after the gap (`input_suffix`).
    pub suffix: &'a str,
    /// The start of the middle already typed (`/infill`'s `prompt`), continued by the model.
    pub middle: &'a str,
    /// Other files as context (`input_extra`): `(file name, text)`.
    pub extra: Vec<(&'a str, &'a str)>,
}

/// How much of each part a prompt keeps, as llama-server sizes it: the prefix and suffix
/// share one batch 3:1 (the prefix's end and the suffix's start are kept), the extra
/// context fills what the context leaves after a batch and twice the budget.
#[derive(Clone, Copy, Debug)]
pub struct InfillLimits {
    /// Positions of the context (llama-server: the slot's `n_ctx`).
    pub n_ctx: usize,
    /// llama-server's `--batch-size` (default 2048).
    pub n_batch: usize,
    /// The request's token budget (`None`: none, llama.cpp's `n_predict: -1`).
    pub n_predict: Option<usize>,
}

impl Default for InfillLimits {
    fn default() -> Self {
        InfillLimits {
            n_ctx: 4096,
            n_batch: 2048,
            n_predict: None,
        }
    }
}

/// The separator of extra files for a vocabulary without a file-separator token
/// (llama.cpp writes it as bytes: "\n\n--- snippet ---\n\n").
const SNIPPET: &str = "\n\n--- snippet ---\n\n";

impl Tokenizer {
    /// The FIM token ids (prefix, suffix, middle).
    ///
    /// # Errors
    /// [`TokenizerError::NoFim`] naming the tokens the vocabulary lacks.
    pub fn fim_tokens(&self) -> Result<(u32, u32, u32)> {
        let s = &self.vocab.special;
        match (s.fim_pre, s.fim_suf, s.fim_mid) {
            (Some(p), Some(q), Some(m)) => Ok((p, q, m)),
            (p, q, m) => {
                let missing: Vec<&str> = [(p, "FIM prefix"), (q, "FIM suffix"), (m, "FIM middle")]
                    .iter()
                    .filter(|(id, _)| id.is_none())
                    .map(|(_, name)| *name)
                    .collect();
                Err(TokenizerError::NoFim {
                    missing: missing.join(", "),
                })
            }
        }
    }

    /// The token ids of the infill prompt for `infill` (module docs), the parts cut to
    /// `limits` as llama-server cuts them. Texts are tokenized as plain text (special-token
    /// text is not parsed).
    ///
    /// # Errors
    /// [`TokenizerError::NoFim`] for a vocabulary without FIM tokens; tokenizer errors.
    pub fn infill_prompt(&self, infill: &Infill<'_>, limits: InfillLimits) -> Result<Vec<u32>> {
        let (pre, suf, mid) = self.fim_tokens()?;
        let special = &self.vocab.special;
        let plain = |t: &str| self.encode(t, false, false);
        let mut extra = Vec::new();
        if let Some(rep) = special.fim_rep {
            extra.push(rep);
            extra.extend(plain("myproject\n")?);
        }
        for (name, text) in &infill.extra {
            match special.fim_sep {
                Some(sep) => {
                    extra.push(sep);
                    extra.extend(plain(&format!("{name}\n"))?);
                }
                None => extra.extend(plain(SNIPPET)?),
            }
            extra.extend(plain(text)?);
        }
        if let Some(sep) = special.fim_sep {
            extra.push(sep);
            extra.extend(plain("filename\n")?);
        }
        let middle = plain(infill.middle)?;
        let mut prefix = plain(infill.prefix)?;
        let mut suffix = plain(infill.suffix)?;
        let n_batch = limits.n_batch;
        let prefix_take = prefix.len().min(3 * (n_batch / 4));
        let suffix_take = suffix
            .len()
            .min((n_batch / 4).saturating_sub(2 + middle.len()));
        // llama.cpp: max(0, n_ctx - n_batch - 2 * n_predict), n_predict -1 without a budget.
        let budget = limits.n_predict.map_or(-2, |n| 2 * n as i64);
        let room = (limits.n_ctx as i64 - n_batch as i64 - budget).max(0) as usize;
        let extra_take = extra.len().min(room);
        prefix.drain(..prefix.len() - prefix_take);
        suffix.truncate(suffix_take);

        let mut ids =
            Vec::with_capacity(extra_take + prefix.len() + suffix.len() + middle.len() + 4);
        ids.extend_from_slice(&extra[extra.len() - extra_take..]);
        if self.vocab.add_bos {
            ids.extend(special.bos);
        }
        ids.push(pre);
        ids.extend(prefix);
        ids.extend(middle);
        ids.push(suf);
        ids.extend(suffix);
        ids.push(mid);
        Ok(ids)
    }
}
