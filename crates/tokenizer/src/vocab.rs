//! The vocabulary as llama.cpp loads it from `tokenizer.ggml.*` metadata: token texts,
//! scores and attributes, the special-token ids, the add-BOS/EOS/space-prefix flags and the
//! end-of-generation set.
//!
//! The rules follow `llama_vocab::impl::load` in llama.cpp's src/llama-vocab.cpp (the
//! snapshot the golden data was made with): per-family defaults, metadata overrides, the
//! by-name detection of EOT/EOM/FIM tokens (retyping a non-control token so named to
//! control), the EOG list by name, and the special-token cache sorted longest text first.

use std::collections::{BTreeSet, HashMap};

use frink_gguf::{GgufFile, MetaArray, MetaValue};

use crate::error::{Result, TokenizerError};
use crate::pretok::PreTokenizer;

/// Per-token attributes, as llama.cpp's `llama_token_attr` bit set.
///
/// A GGUF `tokenizer.ggml.token_type` value maps to one attribute (1 normal, 2 unknown,
/// 3 control, 4 user-defined, 5 unused, 6 byte, anything else undefined); loading may add
/// bits (a control-looking token gains [`TokenAttr::CONTROL`], a control token whose text
/// contains "unused" gains [`TokenAttr::UNUSED`], Phi-3 special tokens gain
/// [`TokenAttr::RSTRIP`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TokenAttr(pub u16);

impl TokenAttr {
    /// No attribute (GGUF type 0 or unknown values).
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token (GGUF type 2).
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    /// An unused slot (GGUF type 5): never produced, decodes to nothing.
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    /// An ordinary token (GGUF type 1).
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    /// A control token (GGUF type 3): matched in text only with special parsing on.
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    /// A user-defined token (GGUF type 4): matched in text before BPE/SPM, always.
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    /// A byte-fallback token `<0xNN>` (GGUF type 6).
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    /// Strip whitespace to the left of a match of this token.
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    /// Strip whitespace to the right of a match of this token.
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);

    /// The attribute of a GGUF `token_type` value.
    pub fn from_gguf_type(t: i64) -> TokenAttr {
        match t {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }

    /// Whether any bit of `other` is set in `self`.
    pub fn has(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    fn set(&mut self, other: TokenAttr, on: bool) {
        if on {
            self.0 |= other.0;
        } else {
            self.0 &= !other.0;
        }
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

/// The tokenizer family (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `llama`: SentencePiece BPE over scores, with byte fallback.
    Spm,
    /// `gpt2`: byte-level BPE over explicit merges, with a regex pre-tokenizer.
    Bpe,
    /// `gemma4`: BPE over explicit merges on SentencePiece-style pieces: spaces escaped to
    /// `▁`, raw UTF-8 characters as the first symbols (no byte-level mapping), a symbol
    /// that is no token falling back to `<0xNN>` byte tokens, the text split into runs of
    /// newlines and runs of anything else (llama.cpp src/llama-vocab.cpp: the `gemma4`
    /// model, `LLAMA_VOCAB_PRE_TYPE_GEMMA4`, `byte_encode = false`, `escape_whitespaces`).
    Gemma4,
    /// `bert`: WordPiece (llama.cpp `LLAMA_VOCAB_TYPE_WPM`, `llm_tokenizer_wpm_session` in
    /// src/llama-vocab.cpp): BERT's normalization and splitting into words, then greedy
    /// longest match within each word, word-initial pieces marked with `▁` (the converter's
    /// rewrite of WordPiece's `##` continuation pieces).
    Wpm,
    /// `t5`: Unigram (llama.cpp `LLAMA_VOCAB_TYPE_UGM`, `llm_tokenizer_ugm_session`):
    /// SentencePiece normalization through the precompiled character map, spaces escaped
    /// to `▁`, then the best-scoring segmentation (Viterbi) over the token scores.
    Ugm,
}

/// Special token ids; `None` where the model has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn.
    pub eot: Option<u32>,
    /// End of message.
    pub eom: Option<u32>,
    /// Unknown.
    pub unk: Option<u32>,
    /// Separator.
    pub sep: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// Mask.
    pub mask: Option<u32>,
    /// Fill-in-the-middle: prefix.
    pub fim_pre: Option<u32>,
    /// Fill-in-the-middle: suffix.
    pub fim_suf: Option<u32>,
    /// Fill-in-the-middle: middle.
    pub fim_mid: Option<u32>,
    /// Fill-in-the-middle: padding.
    pub fim_pad: Option<u32>,
    /// Fill-in-the-middle: repository name.
    pub fim_rep: Option<u32>,
    /// Fill-in-the-middle: file separator.
    pub fim_sep: Option<u32>,
}

/// Every token's text in id order, stored as one string and the end offsets (a `Vec<String>`
/// of a 262k-token vocabulary costs about 10 MB more in headers and allocator slack).
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenTexts {
    text: String,
    ends: Vec<usize>,
}

impl TokenTexts {
    fn with_capacity(n: usize) -> TokenTexts {
        TokenTexts {
            text: String::new(),
            ends: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, t: &str) {
        self.text.push_str(t);
        self.ends.push(self.text.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.text[start..end])
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).map(|i| &self[i])
    }
}

impl std::ops::Index<usize> for TokenTexts {
    type Output = str;

    /// Token `i`'s text; panics when `i` is out of range, as a slice index does.
    fn index(&self, i: usize) -> &str {
        self.get(i).expect("token id in range")
    }
}

/// The loaded vocabulary and its rules.
#[derive(Clone, Debug)]
pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub pre: Option<PreTokenizer>,
    pub tokens: TokenTexts,
    pub scores: Vec<f32>,
    pub attrs: Vec<TokenAttr>,
    pub text_to_id: HashMap<String, u32>,
    pub special: SpecialTokens,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first (ties by id), the order
    /// in which llama.cpp's `tokenizer_st_partition` tries them.
    pub special_cache: Vec<u32>,
    /// `tokenizer.ggml.merges` (BPE only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.add_sep_token` (default: true for WordPiece): whether a separator goes
    /// between the two texts of a pair in llama-server's rerank prompt.
    pub add_sep: bool,
    /// `tokenizer.ggml.remove_extra_whitespaces` (Unigram normalization).
    pub remove_extra_whitespaces: bool,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece; default true).
    pub lowercase: bool,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; default: `lowercase`).
    pub strip_accents: bool,
    /// `tokenizer.ggml.precompiled_charsmap` (Unigram), as raw bytes; empty if absent.
    pub charsmap: Vec<u8>,
    /// Unigram only (else empty): the attributes as the token types give them, before the
    /// load-time adjustments, which is when llama.cpp builds its Unigram tries.
    pub type_attrs: Vec<TokenAttr>,
}

/// Selects one id of [`SpecialTokens`].
type IdField = fn(&mut SpecialTokens) -> &mut Option<u32>;

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const KEY_TYPES: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_ADD_SEP: &str = "tokenizer.ggml.add_sep_token";
const KEY_REMOVE_EXTRA_WS: &str = "tokenizer.ggml.remove_extra_whitespaces";
const KEY_LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";
const KEY_STRIP_ACCENTS: &str = "tokenizer.ggml.normalizer.strip_accents";
pub(crate) const KEY_CHARSMAP: &str = "tokenizer.ggml.precompiled_charsmap";
pub(crate) const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub(crate) const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub(crate) const KEY_SEP: &str = "tokenizer.ggml.seperator_token_id";

fn string_array<'a>(file: &'a GgufFile, key: &'static str) -> Result<Option<&'a [String]>> {
    match file.get(key) {
        None => Ok(None),
        Some(MetaValue::Array(MetaArray::String(v))) => Ok(Some(v)),
        Some(other) => Err(TokenizerError::BadValue {
            key,
            what: format!("expected an array of strings, found {other}"),
        }),
    }
}

fn flag(file: &GgufFile, key: &'static str) -> Result<Option<bool>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or(TokenizerError::BadValue {
            key,
            what: format!("expected a bool, found {v}"),
        }),
    }
}

fn string<'a>(file: &'a GgufFile, key: &'static str) -> Result<Option<&'a str>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or(TokenizerError::BadValue {
            key,
            what: format!("expected a string, found {v}"),
        }),
    }
}

/// Token texts that llama.cpp takes for an end-of-turn token when the metadata names none.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
/// Token texts that end generation wherever they occur in a vocabulary.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// `tokenizer.ggml.precompiled_charsmap` as bytes (llama.cpp accepts an array of `u8` or
/// `i8`); empty if absent.
fn charsmap_bytes(file: &GgufFile) -> Result<Vec<u8>> {
    match file.get(KEY_CHARSMAP) {
        None => Ok(Vec::new()),
        Some(MetaValue::Array(MetaArray::U8(v))) => Ok(v.clone()),
        Some(MetaValue::Array(MetaArray::I8(v))) => Ok(v.iter().map(|&b| b as u8).collect()),
        Some(other) => Err(TokenizerError::BadValue {
            key: KEY_CHARSMAP,
            what: format!("expected an array of bytes, found {other}"),
        }),
    }
}

/// The flags a tokenizer family starts with, before the file's keys.
struct Defaults {
    add_bos: bool,
    add_eos: bool,
    add_sep: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

/// A family's default special tokens (into `special`) and flags, as llama.cpp's
/// `llama_vocab::impl::load` sets them per `tokenizer.ggml.model`.
fn family_defaults(kind: VocabKind, special: &mut SpecialTokens) -> Defaults {
    let d = |add_bos, add_eos, add_space_prefix, clean_spaces| Defaults {
        add_bos,
        add_eos,
        add_sep: false,
        add_space_prefix,
        clean_spaces,
    };
    match kind {
        // SPM adds BOS and a space prefix.
        VocabKind::Spm => {
            special.bos = Some(1);
            special.eos = Some(2);
            special.unk = Some(0);
            d(true, false, true, false)
        }
        // BPE adds neither and cleans spaces in detokenization unless the pre-tokenizer says
        // otherwise.
        VocabKind::Bpe => {
            special.bos = Some(11);
            special.eos = Some(11);
            d(false, false, false, true)
        }
        // No default special tokens (the file names them), and as every BPE model no space
        // prefix and space clean-up in detokenization.
        VocabKind::Gemma4 => d(false, false, false, true),
        // [CLS] 101 as BOS, [UNK] 100, [SEP] 102, [PAD] 0, [MASK] 103; BOS and a separator
        // added, detokenization cleans spaces.
        VocabKind::Wpm => {
            special.bos = Some(101);
            special.unk = Some(100);
            special.sep = Some(102);
            special.pad = Some(0);
            special.mask = Some(103);
            Defaults {
                add_sep: true,
                ..d(true, false, false, true)
            }
        }
        // T5's ids (pad 0, EOS 1, unknown 2), EOS added, no space prefix unless the file
        // says so.
        VocabKind::Ugm => {
            special.eos = Some(1);
            special.unk = Some(2);
            special.pad = Some(0);
            d(false, true, false, false)
        }
    }
}

/// The per-model attributes llama.cpp sets by tokenizer, model or architecture name, at the
/// end of `load` (after building the special-token cache, so they do not change its order):
/// `<mask>` strips spaces on its left for Jina v2/v3, mmBERT and Nomic's MoE BERT; Phi-3's
/// special tokens strip on their right (but `<unk>`, `<s>`, `<|endoftext|>`); ModernBERT's
/// `[MASK]` strips on its left.
fn named_model_attrs(
    file: &GgufFile,
    text_to_id: &HashMap<String, u32>,
    special_cache: &[u32],
    attrs: &mut [TokenAttr],
) -> Result<()> {
    let name = string(file, "general.name")?.unwrap_or("").to_lowercase();
    let pre_name = string(file, KEY_PRE)?.unwrap_or("");
    let arch = string(file, "general.architecture")?.unwrap_or("");
    let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
    let mut set = |t: &str, attr: TokenAttr, on: bool| {
        if let Some(&i) = text_to_id.get(t) {
            attrs[i as usize].set(attr, on);
        }
    };
    if any(
        pre_name,
        &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"],
    ) || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
    {
        set("<mask>", TokenAttr::LSTRIP, true);
    } else if any(&name, &["phi-3", "phi3"]) {
        for &i in special_cache {
            attrs[i as usize].set(TokenAttr::RSTRIP, true);
        }
        let mut set = |t: &str, on: bool| {
            if let Some(&i) = text_to_id.get(t) {
                attrs[i as usize].set(TokenAttr::RSTRIP, on);
            }
        };
        set("</s>", true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(t, false);
        }
    } else if name.contains("modern-bert") {
        set("[MASK]", TokenAttr::LSTRIP, true);
    }
    Ok(())
}

impl Vocab {
    /// Loads the vocabulary of `file`.
    ///
    /// Errors: a missing or mistyped key, an unsupported `tokenizer.ggml.model` or `pre`, a
    /// duplicate token text, `add_bos_token`/`add_eos_token` without the token.
    pub fn load(file: &GgufFile) -> Result<Vocab> {
        let model = string(file, KEY_MODEL)?.ok_or(TokenizerError::MissingKey(KEY_MODEL))?;
        let kind = match model {
            "llama" => VocabKind::Spm,
            "gpt2" => VocabKind::Bpe,
            "gemma4" => VocabKind::Gemma4,
            "bert" => VocabKind::Wpm,
            "t5" => VocabKind::Ugm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let tokens_meta =
            string_array(file, KEY_TOKENS)?.ok_or(TokenizerError::MissingKey(KEY_TOKENS))?;
        let n = tokens_meta.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(TokenizerError::BadValue {
                key: KEY_TOKENS,
                what: format!("{n} tokens"),
            });
        }

        // Family defaults (llama.cpp: SPM adds BOS and a space prefix; BPE does neither and
        // cleans spaces in detokenization unless the pre-tokenizer says otherwise).
        let mut special = SpecialTokens::default();
        let Defaults {
            mut add_bos,
            mut add_eos,
            mut add_sep,
            mut add_space_prefix,
            mut clean_spaces,
        } = family_defaults(kind, &mut special);
        let mut pre = None;
        let mut ignore_merges = false;
        let mut merges = Vec::new();
        if kind == VocabKind::Bpe {
            let name = string(file, KEY_PRE)?.unwrap_or("default");
            let p = PreTokenizer::from_name(name)?;
            clean_spaces = p.clean_spaces();
            ignore_merges = p.ignore_merges();
            add_bos = p.default_add_bos();
            pre = Some(p);
            merges = string_array(file, KEY_MERGES)?
                .ok_or(TokenizerError::MissingKey(KEY_MERGES))?
                .to_vec();
        }
        // `tokenizer.ggml.pre` is not read: llama.cpp sets it to `gemma4` for this model.
        if kind == VocabKind::Gemma4 {
            merges = string_array(file, KEY_MERGES)?
                .ok_or(TokenizerError::MissingKey(KEY_MERGES))?
                .to_vec();
        }
        if let Some(v) = flag(file, KEY_ADD_PREFIX)? {
            add_space_prefix = v;
        }
        let remove_extra_whitespaces = flag(file, KEY_REMOVE_EXTRA_WS)?.unwrap_or(false);
        let lowercase = flag(file, KEY_LOWERCASE)?.unwrap_or(true);
        let strip_accents = flag(file, KEY_STRIP_ACCENTS)?.unwrap_or(lowercase);
        let charsmap = if kind == VocabKind::Ugm {
            charsmap_bytes(file)?
        } else {
            Vec::new()
        };

        let scores: Vec<f32> = match file.get(KEY_SCORES) {
            // SentencePiece merges follow the scores: without them every merge would tie.
            None if kind == VocabKind::Spm => return Err(TokenizerError::MissingKey(KEY_SCORES)),
            None => vec![0.0; n],
            Some(MetaValue::Array(a)) if a.len() >= n => {
                a.to_f32_vec().ok_or(TokenizerError::BadValue {
                    key: KEY_SCORES,
                    what: "expected numbers".into(),
                })?[..n]
                    .to_vec()
            }
            Some(v) => {
                return Err(TokenizerError::BadValue {
                    key: KEY_SCORES,
                    what: format!("expected {n} numbers, found {v}"),
                })
            }
        };
        let mut attrs: Vec<TokenAttr> = match file.get(KEY_TYPES) {
            None => vec![TokenAttr::NORMAL; n],
            Some(MetaValue::Array(a)) if a.len() >= n => {
                a.to_i64_vec().ok_or(TokenizerError::BadValue {
                    key: KEY_TYPES,
                    what: "expected integers".into(),
                })?[..n]
                    .iter()
                    .map(|&t| TokenAttr::from_gguf_type(t))
                    .collect()
            }
            Some(v) => {
                return Err(TokenizerError::BadValue {
                    key: KEY_TYPES,
                    what: format!("expected {n} integers, found {v}"),
                })
            }
        };

        let type_attrs = if kind == VocabKind::Ugm {
            attrs.clone()
        } else {
            Vec::new()
        };
        let mut tokens = TokenTexts::with_capacity(n);
        let mut text_to_id = HashMap::with_capacity(n);
        for (i, t) in tokens_meta.iter().enumerate() {
            let text = if t.is_empty() {
                tracing::warn!("empty token at index {i}");
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            if let Some(&first) = text_to_id.get(&text) {
                return Err(TokenizerError::DuplicateToken {
                    text,
                    first,
                    second: i as u32,
                });
            }
            text_to_id.insert(text.clone(), i as u32);
            tokens.push(&text);
        }

        // Default ids outside the vocabulary are disabled; metadata ids outside it are ignored.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        special.bos = in_range(special.bos);
        special.eos = in_range(special.eos);
        special.unk = in_range(special.unk);
        special.sep = in_range(special.sep);
        special.pad = in_range(special.pad);
        special.mask = in_range(special.mask);
        let id_keys: [(&str, IdField); 17] = [
            (KEY_BOS, |s| &mut s.bos),
            (KEY_EOS, |s| &mut s.eos),
            ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
            ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
            (KEY_UNK, |s| &mut s.unk),
            (KEY_SEP, |s| &mut s.sep),
            ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
            ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
            ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
            ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, field) in id_keys {
            if let Some(v) = file.get(key) {
                match v.as_u32() {
                    Some(id) if (id as usize) < n => *field(&mut special) = Some(id),
                    _ => tracing::warn!("bad special token {key} = {v}, keeping the default"),
                }
            }
        }
        if let Some(v) = flag(file, KEY_ADD_BOS)? {
            add_bos = v;
        }
        if let Some(v) = flag(file, KEY_ADD_EOS)? {
            add_eos = v;
        }
        if let Some(v) = flag(file, KEY_ADD_SEP)? {
            add_sep = v;
        }
        // llama.cpp's WordPiece tokenization adds BOS ([CLS]) and the separator ([SEP])
        // whenever special tokens are added, whatever `add_bos_token` says.
        if kind == VocabKind::Wpm {
            add_bos = true;
            add_eos = false;
            if special.sep.is_none() {
                return Err(TokenizerError::MissingSpecialToken {
                    flag: KEY_ADD_SEP,
                    id_key: KEY_SEP,
                });
            }
        }
        if add_bos && special.bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: KEY_ADD_BOS,
                id_key: KEY_BOS,
            });
        }
        if add_eos && special.eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: KEY_ADD_EOS,
                id_key: KEY_EOS,
            });
        }

        // Special tokens by name where the metadata names none. llama.cpp walks a hash map,
        // so which of several candidates wins is unspecified there; here the lowest id wins.
        // The chosen token becomes a control token if it was not one.
        let by_name = |names: &[&str]| {
            tokens
                .iter()
                .position(|t| names.contains(&t))
                .map(|i| i as u32)
        };
        let named: [(&[&str], IdField); 8] = [
            (EOT_NAMES, |s| &mut s.eot),
            (EOM_NAMES, |s| &mut s.eom),
            (FIM_PRE_NAMES, |s| &mut s.fim_pre),
            (FIM_SUF_NAMES, |s| &mut s.fim_suf),
            (FIM_MID_NAMES, |s| &mut s.fim_mid),
            (FIM_PAD_NAMES, |s| &mut s.fim_pad),
            (FIM_REP_NAMES, |s| &mut s.fim_rep),
            (FIM_SEP_NAMES, |s| &mut s.fim_sep),
        ];
        for (names, field) in named {
            if field(&mut special).is_none() {
                if let Some(id) = by_name(names) {
                    *field(&mut special) = Some(id);
                    attrs[id as usize].set(TokenAttr::CONTROL, true);
                }
            }
        }
        // Control tokens whose text says "unused" are unused.
        for (t, a) in tokens.iter().zip(attrs.iter_mut()) {
            if a.has(TokenAttr::CONTROL) && t.contains("unused") {
                a.set(TokenAttr::UNUSED, true);
            }
        }

        // The end-of-generation set: FIM pad/repo/file-separator, every token named in
        // EOG_NAMES (made control), then EOS, EOT and EOM.
        let mut eog = BTreeSet::new();
        eog.extend(special.fim_pad);
        eog.extend(special.fim_rep);
        eog.extend(special.fim_sep);
        for (i, t) in tokens.iter().enumerate() {
            if EOG_NAMES.contains(&t) {
                eog.insert(i as u32);
                attrs[i].set(TokenAttr::CONTROL, true);
            }
        }
        // gpt-oss: these are rendered always (llama.cpp makes them user-defined).
        for (i, t) in tokens.iter().enumerate() {
            if matches!(
                t,
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[i] = TokenAttr::USER_DEFINED;
            }
        }
        eog.extend(special.eos);
        eog.extend(special.eot);
        eog.extend(special.eom);
        // o200k_harmony / solar-open: `<|end|>` does not end generation when `<|return|>` and
        // `<|call|>` (or `<|calls|>` and `<|flush|>`) exist.
        let eog_has = |eog: &BTreeSet<u32>, s: &str| eog.iter().any(|&i| &tokens[i as usize] == s);
        let end_id = eog
            .iter()
            .copied()
            .find(|&i| &tokens[i as usize] == "<|end|>");
        if let Some(end_id) = end_id {
            let has_call = eog_has(&eog, "<|call|>") || eog_has(&eog, "<|calls|>");
            if has_call && (eog_has(&eog, "<|return|>") || eog_has(&eog, "<|flush|>")) {
                eog.remove(&end_id);
                attrs[end_id as usize] = TokenAttr::USER_DEFINED;
            }
        }
        // gemma4 / paddleocr: `</s>` is ordinary where `<|tool_response>` ends generation.
        if eog_has(&eog, "<|tool_response>") {
            if let Some(s_id) = eog.iter().copied().find(|&i| &tokens[i as usize] == "</s>") {
                eog.remove(&s_id);
                attrs[s_id as usize] = TokenAttr::NORMAL;
            }
        }

        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize]
                    .has(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
            })
            .collect();
        special_cache.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));

        named_model_attrs(file, &text_to_id, &special_cache, &mut attrs)?;

        Ok(Vocab {
            kind,
            pre,
            tokens,
            scores,
            attrs,
            text_to_id,
            special,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            eog: eog.into_iter().collect(),
            special_cache,
            merges,
            add_sep,
            remove_extra_whitespaces,
            lowercase,
            strip_accents,
            charsmap,
            type_attrs,
        })
    }

    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }
}
