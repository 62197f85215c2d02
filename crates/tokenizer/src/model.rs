//! Building the `tokenizers` pipeline that turns one raw text fragment (a span between
//! special tokens) into ids.
//!
//! * `gpt2` (byte-level BPE): the GGUF merges in rank order, a pre-tokenizer `Sequence` of
//!   `Split(regex, Isolated)` per [`PreTokenizer::regexes`], then `ByteLevel` without its own
//!   regex to map bytes to GPT-2's printable characters. This is llama.cpp's
//!   `llm_tokenizer_bpe_session`: regex split, byte encoding, merges by rank, leftmost first.
//! * `llama` (SentencePiece): a BPE whose merges are derived from the vocabulary scores and
//!   byte fallback to `<0xNN>` tokens, after the normalizer `Prepend("▁")` (only with
//!   `add_space_prefix`) and `Replace(" ", "▁")`. llama.cpp's `llm_tokenizer_spm_session`
//!   merges the adjacent pair whose concatenation is the highest-scoring token, leftmost
//!   first; listing every split `(left, right)` of every token whose halves are tokens,
//!   ordered by the token's score (highest first), gives a BPE that makes the same choices.
//!   This is how transformers' `convert_slow_tokenizer.py` (`SentencePieceExtractor`) turns a
//!   SentencePiece model into a `tokenizers` BPE; it orders ties by the ids of the halves,
//!   which matters only when two different tokens have equal scores.
//!
//! llama.cpp prepends the space to every raw fragment that starts the text or follows a
//! special token; since raw fragments are always separated by special tokens, that is every
//! fragment, which is what a per-fragment `Prepend` normalizer does.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use crate::error::{Result, TokenizerError};
use crate::vocab::{Vocab, VocabKind};

fn hf<E: std::fmt::Display>(e: E) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}

fn vocab_map(vocab: &Vocab) -> tokenizers::models::bpe::Vocab {
    vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect()
}

/// The `tokenizers` pipeline for `vocab`.
///
/// Errors: [`TokenizerError::BadMerge`] for a GGUF merge whose halves or result are not
/// tokens; [`TokenizerError::Hf`] if `tokenizers` rejects the model or a regex.
pub(crate) fn build(vocab: &Vocab) -> Result<Tokenizer> {
    match vocab.kind {
        VocabKind::Bpe => build_bpe(vocab),
        VocabKind::Spm => build_spm(vocab),
        VocabKind::Gemma4 => build_gemma4(vocab),
        VocabKind::Wpm | VocabKind::Ugm => Err(TokenizerError::Hf(format!(
            "{:?} vocabularies are tokenized without a `tokenizers` pipeline",
            vocab.kind
        ))),
    }
}

/// llama.cpp's `gemma4` pre-tokenizer: runs of newlines and runs of anything else.
pub(crate) const GEMMA4_SPLIT: &str = r"[^\n]+|[\n]+";

/// Splits a GGUF merge line at its first space after the first character (llama.cpp looks
/// for the separator from byte 1, so a merge may begin with a space).
fn split_merge(line: &str) -> Option<(&str, &str)> {
    let first_len = line.chars().next()?.len_utf8();
    let pos = line[first_len..].find(' ')? + first_len;
    Some((&line[..pos], &line[pos + 1..]))
}

/// The GGUF merges in rank order, each checked to join two tokens into a token.
///
/// Errors: [`TokenizerError::BadMerge`] naming the first that does not.
fn checked_merges(vocab: &Vocab) -> Result<Vec<(String, String)>> {
    let mut merges = Vec::with_capacity(vocab.merges.len());
    for (rank, line) in vocab.merges.iter().enumerate() {
        let bad = || TokenizerError::BadMerge {
            rank,
            merge: line.clone(),
        };
        let (a, b) = split_merge(line).ok_or_else(bad)?;
        let joined = format!("{a}{b}");
        if !vocab.text_to_id.contains_key(a)
            || !vocab.text_to_id.contains_key(b)
            || !vocab.text_to_id.contains_key(&joined)
        {
            return Err(bad());
        }
        merges.push((a.to_string(), b.to_string()));
    }
    Ok(merges)
}

fn build_bpe(vocab: &Vocab) -> Result<Tokenizer> {
    let model = BPE::builder()
        .vocab_and_merges(vocab_map(vocab), checked_merges(vocab)?)
        .ignore_merges(vocab.ignore_merges)
        .build()
        .map_err(hf)?;
    let pre = vocab.pre.expect("BPE vocabularies have a pre-tokenizer");
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in pre.regexes() {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(hf)?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tk = Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(PreSequence::new(steps)));
    tk.with_decoder(Some(ByteLevel::new(false, false, false)));
    Ok(tk)
}

/// The merges of a SentencePiece vocabulary: every split of every token into two tokens,
/// highest-scoring result first (ties: result id, then the halves' ids).
pub(crate) fn spm_merges(vocab: &Vocab) -> Vec<(String, String)> {
    let mut found: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, text) in vocab.tokens.iter().enumerate() {
        for (k, _) in text.char_indices().skip(1) {
            let (l, r) = text.split_at(k);
            if let (Some(&li), Some(&ri)) = (vocab.text_to_id.get(l), vocab.text_to_id.get(r)) {
                found.push((vocab.scores[id], id as u32, li, ri));
            }
        }
    }
    // llama.cpp breaks ties between equal-scoring tokens by position (leftmost first), which
    // BPE ranks cannot express; say so when a vocabulary has such ties among its normal
    // tokens (Gemma's control and user-defined tokens share -1000, the lowest priority, and
    // are cut out before SentencePiece runs).
    let mut results: Vec<(f32, u32)> = found
        .iter()
        .filter(|m| vocab.attrs[m.1 as usize] == crate::vocab::TokenAttr::NORMAL)
        .map(|m| (m.0, m.1))
        .collect();
    results.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    results.dedup_by_key(|r| r.1);
    let ties = results.windows(2).filter(|w| w[0].0 == w[1].0).count();
    if ties > 0 {
        tracing::warn!(
            "{ties} pairs of mergeable SentencePiece tokens share a score; texts where two of them \
             compete may tokenize differently from llama.cpp"
        );
    }
    found.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    found
        .into_iter()
        .map(|(_, _, l, r)| {
            (
                vocab.tokens[l as usize].to_string(),
                vocab.tokens[r as usize].to_string(),
            )
        })
        .collect()
}

fn build_spm(vocab: &Vocab) -> Result<Tokenizer> {
    let model = BPE::builder()
        .vocab_and_merges(vocab_map(vocab), spm_merges(vocab))
        .byte_fallback(true)
        .build()
        .map_err(hf)?;
    spm_pipeline(vocab, model)
}

/// Gemma 4: the GGUF merges (not derived from scores) with byte fallback, the SentencePiece
/// normalizer and pieces, and the newline split before the merges.
fn build_gemma4(vocab: &Vocab) -> Result<Tokenizer> {
    let model = BPE::builder()
        .vocab_and_merges(vocab_map(vocab), checked_merges(vocab)?)
        .byte_fallback(true)
        .build()
        .map_err(hf)?;
    let mut tk = spm_pipeline(vocab, model)?;
    let split = Split::new(
        SplitPattern::Regex(GEMMA4_SPLIT.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(hf)?;
    tk.with_pre_tokenizer(Some(PreSequence::new(vec![split.into()])));
    Ok(tk)
}

/// A SentencePiece-style pipeline around `model`: `▁` for spaces (and a `▁` before each
/// fragment with `add_space_prefix`), pieces decoded back with their byte tokens fused.
fn spm_pipeline(vocab: &Vocab, model: BPE) -> Result<Tokenizer> {
    let mut norm: Vec<NormalizerWrapper> = Vec::new();
    if vocab.add_space_prefix {
        norm.push(Prepend::new("▁".to_string()).into());
    }
    norm.push(Replace::new(" ", "▁").map_err(hf)?.into());
    let mut tk = Tokenizer::new(model);
    tk.with_normalizer(Some(NormalizerSequence::new(norm)));
    let decoders: Vec<DecoderWrapper> = vec![
        tokenizers::decoders::DecoderWrapper::Replace(Replace::new("▁", " ").map_err(hf)?),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    tk.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tk)
}

#[cfg(test)]
mod tests {
    use super::split_merge;

    #[test]
    fn merge_lines_split_after_the_first_character() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
        assert_eq!(split_merge("  a"), Some((" ", "a")));
        assert_eq!(split_merge("ĠĠ ĠĠ"), Some(("ĠĠ", "ĠĠ")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(""), None);
    }
}
