//! WordPiece (`tokenizer.ggml.model = bert`), as llama.cpp's `llm_tokenizer_wpm_session`
//! (src/llama-vocab.cpp) tokenizes one raw fragment.
//!
//! 1. `preprocess`: the bytes are read as code points (`unicode_cpts_from_utf8`: what is not
//!    UTF-8 becomes U+FFFD); with `strip_accents` each becomes the first code point of its
//!    decomposition (llama.cpp's one-to-one "NFD" table). Whitespace ends a word; NUL,
//!    U+FFFD, control characters and (with `strip_accents`) accent marks are dropped; the
//!    rest is lower-cased (with `lowercase`) and either is a word of its own (punctuation,
//!    ASCII symbols, CJK ideographs) or is appended to the current word. The tables are
//!    llama.cpp's own (src/unicode-data.cpp), see [`crate::unicode`].
//! 2. Each word gets a `▁` in front (the converter stores WordPiece's word-initial pieces
//!    with `▁` and its `##` continuation pieces bare), then is cut greedily from the left
//!    into the longest pieces that are tokens (comparing bytes, up to the longest token's
//!    length). A word with a position where no piece matches becomes one unknown token.

use crate::error::{Result, TokenizerError};
use crate::unicode::{self, ACCENT_MARK, CONTROL, PUNCTUATION, SYMBOL};
use crate::vocab::{Vocab, KEY_UNK};

/// The WordPiece tokenizer of a vocabulary.
#[derive(Clone, Debug)]
pub(crate) struct Wpm {
    /// The longest token text, in bytes (`max_token_len`).
    max_token_len: usize,
    lowercase: bool,
    strip_accents: bool,
}

/// The CJK ideograph ranges llama.cpp's WordPiece makes one-character words of
/// (`is_chinese_char`; its Extension E starts at 0x2B920, as in Hugging Face's code).
fn is_chinese_char(c: u32) -> bool {
    matches!(c,
        0x4e00..=0x9fff
        | 0x3400..=0x4dbf
        | 0x20000..=0x2a6df
        | 0x2a700..=0x2b73f
        | 0x2b740..=0x2b81f
        | 0x2b920..=0x2ceaf
        | 0xf900..=0xfaff
        | 0x2f800..=0x2fa1f)
}

const WORD_PREFIX: &[u8] = "\u{2581}".as_bytes();

impl Wpm {
    pub fn new(vocab: &Vocab) -> Wpm {
        Wpm {
            max_token_len: vocab.tokens.iter().map(str::len).max().unwrap_or(0),
            lowercase: vocab.lowercase,
            strip_accents: vocab.strip_accents,
        }
    }

    /// The words of one raw fragment (llama.cpp's `preprocess`), as UTF-8 bytes.
    ///
    /// Errors: [`TokenizerError::BeyondUnicode`] for raw bytes that decode beyond U+10FFFF
    /// and are kept (llama.cpp throws there).
    fn preprocess(&self, text: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut words: Vec<Vec<u8>> = vec![Vec::new()];
        for mut cpt in unicode::cpts_lenient(text) {
            if self.strip_accents {
                cpt = unicode::nfd_first(cpt);
            }
            if unicode::is_whitespace(cpt) {
                if !words.last().expect("never empty").is_empty() {
                    words.push(Vec::new());
                }
                continue;
            }
            let cat = unicode::categories(cpt);
            if cpt == 0 || cpt == 0xfffd || cat & CONTROL != 0 {
                continue;
            }
            if self.strip_accents && cat & ACCENT_MARK != 0 {
                continue;
            }
            let shown = if self.lowercase {
                unicode::to_lower(cpt)
            } else {
                cpt
            };
            let alone =
                cat & PUNCTUATION != 0 || (cpt < 0x7f && cat & SYMBOL != 0) || is_chinese_char(cpt);
            let last = words.last_mut().expect("never empty");
            if alone {
                let mut word = Vec::with_capacity(4);
                unicode::push_utf8(shown, &mut word).ok_or(TokenizerError::BeyondUnicode(cpt))?;
                if last.is_empty() {
                    *last = word;
                } else {
                    words.push(word);
                }
                words.push(Vec::new());
            } else {
                unicode::push_utf8(shown, last).ok_or(TokenizerError::BeyondUnicode(cpt))?;
            }
        }
        if words.last().is_some_and(Vec::is_empty) {
            words.pop();
        }
        Ok(words)
    }

    /// Tokenizes one raw fragment (UTF-8 or not) onto `out`.
    ///
    /// Errors: [`TokenizerError::MissingToken`] for a word that needs the unknown token of a
    /// vocabulary without one; [`TokenizerError::BeyondUnicode`].
    pub fn tokenize(&self, vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        let lookup = |piece: &[u8]| {
            std::str::from_utf8(piece)
                .ok()
                .and_then(|s| vocab.text_to_id.get(s).copied())
        };
        let mut word1 = Vec::new();
        for word in self.preprocess(text)? {
            if word.is_empty() {
                continue;
            }
            word1.clear();
            word1.extend_from_slice(WORD_PREFIX);
            word1.extend_from_slice(&word);
            let n = word1.len();
            let before = out.len();
            let mut i = 0;
            while i < n {
                let longest = n.min(i + self.max_token_len + 1);
                match (i + 1..=longest)
                    .rev()
                    .find_map(|j| lookup(&word1[i..j]).map(|id| (id, j)))
                {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(before);
                        break;
                    }
                }
            }
            if out.len() == before {
                out.push(vocab.special.unk.ok_or(TokenizerError::MissingToken {
                    what: "unknown",
                    key: KEY_UNK,
                })?);
            }
        }
        Ok(())
    }
}
