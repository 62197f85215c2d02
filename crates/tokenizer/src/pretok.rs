//! The BPE pre-tokenizers: which regexes split the text before byte-level BPE, per
//! `tokenizer.ggml.pre`.
//!
//! The table follows llama.cpp's `llm_tokenizer_bpe` constructor (src/llama-vocab.cpp): a
//! pre-tokenizer is a list of regexes applied in sequence, each splitting every piece the
//! previous one produced into its matches and the gaps between them (what
//! `unicode_regex_split` in src/unicode.cpp does), which is a `tokenizers` `Sequence` of
//! `Split(regex, Isolated)`. Only entries with reference data are implemented: `smollm`,
//! `qwen2` and `gpt-2` (the golden files and the tiny fixtures) and `default`; any other
//! name is refused with [`TokenizerError::UnsupportedPreTokenizer`].

use crate::error::{Result, TokenizerError};

/// GPT-2's word regex (llama.cpp's "gpt2" entry and the second half of "smollm").
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2's regex as llama.cpp writes it: the case-insensitive contractions spelled out.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` names frink implements.
pub const SUPPORTED: &[&str] = &["smollm", "qwen2", "gpt-2", "default"];

/// A supported BPE pre-tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `default` (also a missing `pre`): llama.cpp's fallback list of four regexes.
    Default,
    /// `gpt-2`: the GPT-2 regex.
    Gpt2,
    /// `smollm`: single digits (`\p{N}`), then the GPT-2 regex.
    Smollm,
    /// `qwen2`: Qwen2's regex (single digits, newline runs kept together).
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer named `name`.
    ///
    /// Errors: [`TokenizerError::UnsupportedPreTokenizer`] for any other name.
    pub fn from_name(name: &str) -> Result<PreTokenizer> {
        Ok(match name {
            "default" | "" => PreTokenizer::Default,
            "gpt-2" => PreTokenizer::Gpt2,
            "smollm" => PreTokenizer::Smollm,
            "qwen2" => PreTokenizer::Qwen2,
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        })
    }

    /// The regexes, applied in sequence.
    pub fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Default => {
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
            }
            PreTokenizer::Gpt2 => &[GPT2],
            PreTokenizer::Smollm => &[r"\p{N}", GPT2],
            PreTokenizer::Qwen2 => &[QWEN2],
        }
    }

    /// Whether detokenization cleans up spaces before punctuation (llama.cpp's
    /// `clean_spaces`, on for BPE unless the pre-tokenizer entry turns it off).
    pub fn clean_spaces(self) -> bool {
        matches!(self, PreTokenizer::Default | PreTokenizer::Gpt2)
    }

    /// Whether a pre-tokenized word that is itself a token skips the merges.
    pub fn ignore_merges(self) -> bool {
        false
    }

    /// Whether BOS is added when `add_bos_token` is absent.
    pub fn default_add_bos(self) -> bool {
        false
    }
}
