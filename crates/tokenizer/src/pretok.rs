//! The BPE pre-tokenizers: which regexes split the text before byte-level BPE, per
//! `tokenizer.ggml.pre`.
//!
//! The table follows llama.cpp's `llm_tokenizer_bpe` constructor (src/llama-vocab.cpp): a
//! pre-tokenizer is a list of regexes applied in sequence, each splitting every piece the
//! previous one produced into its matches and the gaps between them (what
//! `unicode_regex_split` in src/unicode.cpp does), which is a `tokenizers` `Sequence` of
//! `Split(regex, Isolated)`. Only entries with reference data are implemented (see
//! [`SUPPORTED`]); any other name is refused with
//! [`TokenizerError::UnsupportedPreTokenizer`].

use crate::error::{Result, TokenizerError};

/// GPT-2's word regex (llama.cpp's "gpt2" entry and the second half of "smollm").
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2's regex as llama.cpp writes it: the case-insensitive contractions spelled out.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's regex as llama.cpp writes it (numbers in runs of up to three digits).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's regex in llama.cpp's adaptation: "a letter that is not a-z" / "not A-Z" in
/// place of the upper/lower-case classes.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken regex in llama.cpp's adaptation (as GPT-4o's, single digits).
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM's letter class, llama.cpp's list of ranges (written as escapes: several of
/// its characters are canonical singletons that text tools silently normalize).
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";
/// CJK runs (DeepSeek). llama.cpp matches regexes without `\p{..}` classes with
/// `std::wregex` after replacing every non-ASCII whitespace character by U+000B, so such a
/// character never falls inside a range like U+0800-U+4E00; `&&\S` says the same here.
const DEEPSEEK_CJK: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}&&\S]+";

/// The `tokenizer.ggml.pre` names frink implements. Besides the catalog's and the tiny
/// fixtures' (`smollm`, `qwen2`, `gpt-2`, `default`), each is checked against llama.cpp's own
/// output (tests/data/llamacpp_pre_vectors.json: a catalog vocabulary with `pre` replaced,
/// tokenized by the llama.cpp snapshot of the golden files).
pub const SUPPORTED: &[&str] = &[
    "default",
    "gpt-2",
    "smollm",
    "qwen2",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "starcoder",
    "command-r",
    "deepseek-llm",
    "deepseek-coder",
    "gpt-4o",
    "tekken",
];

/// A supported BPE pre-tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `default` (also a missing `pre`): llama.cpp's fallback list of four regexes.
    Default,
    /// `gpt-2`: the GPT-2 regex.
    Gpt2,
    /// `smollm`: single digits (`\p{N}`), then the GPT-2 regex.
    Smollm,
    /// `starcoder`: as `smollm`, with detokenization's space clean-up on.
    Starcoder,
    /// `command-r`: as `smollm`.
    CommandR,
    /// `qwen2`: Qwen2's regex (single digits, newline runs kept together).
    Qwen2,
    /// `llama3`, `llama-v3`, `llama-bpe`: Llama 3's regex; a word that is a token skips the
    /// merges; BOS added unless the metadata says otherwise.
    Llama3,
    /// `deepseek-llm`: newlines, letter runs, punctuation runs, trailing spaces, CJK runs,
    /// number runs.
    DeepseekLlm,
    /// `deepseek-coder`: newlines, letter runs, punctuation runs, CJK runs, single digits.
    DeepseekCoder,
    /// `gpt-4o`: GPT-4o's regex (case-aware words, numbers in runs of up to three).
    Gpt4o,
    /// `tekken`: Mistral's Tekken regex; merges skipped for whole-token words; BOS added.
    Tekken,
}

impl PreTokenizer {
    /// The pre-tokenizer named `name`.
    ///
    /// Errors: [`TokenizerError::UnsupportedPreTokenizer`] for any other name.
    pub fn from_name(name: &str) -> Result<PreTokenizer> {
        Ok(match name {
            "default" | "" => PreTokenizer::Default,
            // llama.cpp maps modern-bert to LLAMA_VOCAB_PRE_TYPE_GPT2.
            "gpt-2" | "modern-bert" => PreTokenizer::Gpt2,
            "smollm" => PreTokenizer::Smollm,
            "starcoder" => PreTokenizer::Starcoder,
            "command-r" => PreTokenizer::CommandR,
            "qwen2" => PreTokenizer::Qwen2,
            "llama3" | "llama-v3" | "llama-bpe" => PreTokenizer::Llama3,
            "deepseek-llm" => PreTokenizer::DeepseekLlm,
            "deepseek-coder" => PreTokenizer::DeepseekCoder,
            "gpt-4o" => PreTokenizer::Gpt4o,
            "tekken" => PreTokenizer::Tekken,
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
            PreTokenizer::Smollm | PreTokenizer::Starcoder | PreTokenizer::CommandR => {
                &[r"\p{N}", GPT2]
            }
            PreTokenizer::Qwen2 => &[QWEN2],
            PreTokenizer::Llama3 => &[LLAMA3],
            PreTokenizer::DeepseekLlm => &[
                r"[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}&&\S]+",
                r"\s+$",
                DEEPSEEK_CJK,
                r"\p{N}+",
            ],
            PreTokenizer::DeepseekCoder => &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                DEEPSEEK_CJK,
                r"\p{N}",
            ],
            PreTokenizer::Gpt4o => &[GPT4O],
            PreTokenizer::Tekken => &[TEKKEN],
        }
    }

    /// Whether detokenization cleans up spaces before punctuation (llama.cpp's
    /// `clean_spaces`, on for BPE unless the pre-tokenizer entry turns it off).
    pub fn clean_spaces(self) -> bool {
        matches!(
            self,
            PreTokenizer::Default
                | PreTokenizer::Gpt2
                | PreTokenizer::Starcoder
                | PreTokenizer::Llama3
        )
    }

    /// Whether a pre-tokenized word that is itself a token skips the merges.
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Tekken)
    }

    /// Whether BOS is added when `add_bos_token` is absent.
    pub fn default_add_bos(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Tekken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_pre_tokenizer_compiles() {
        for name in SUPPORTED {
            let p = PreTokenizer::from_name(name).unwrap();
            for (i, re) in p.regexes().iter().enumerate() {
                tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{name} regex {i}: {e}"));
            }
        }
        eprintln!("{} pre-tokenizer names compile", SUPPORTED.len());
    }
}
