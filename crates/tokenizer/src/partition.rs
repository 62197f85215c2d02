//! Cutting special tokens out of a text before BPE/SentencePiece sees it.
//!
//! This is llama.cpp's `tokenizer_st_partition` (src/llama-vocab.cpp): the control,
//! user-defined and unknown tokens are tried one after another, longest text first; each
//! splits every raw fragment at every occurrence of its text, left to right (a fragment is
//! searched again after each match). Control and unknown tokens are tried only where special
//! parsing is on; user-defined tokens always. A token with the `LSTRIP`/`RSTRIP` attribute
//! also eats the ASCII whitespace beside it.
//!
//! frink adds one thing: special parsing can be on for some byte ranges of the text and off
//! for others. A chat prompt uses that to keep message contents literal while the
//! template's scaffolding is parsed, without cutting the text into separately tokenized
//! pieces (a control token whose text overlaps a literal range is not matched, and the raw
//! text around it stays one fragment, as llama.cpp's whole-string tokenization would see it).

use std::ops::Range;

use aho_corasick::AhoCorasick;

use crate::error::{Result, TokenizerError};
use crate::vocab::{TokenAttr, Vocab};

/// A piece of the partitioned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// A special token matched in the text.
    Token(u32),
    /// Raw text (a byte range of the input) for the BPE/SentencePiece model.
    Text(Range<usize>),
}

/// The special-token matcher of a vocabulary.
#[derive(Clone, Debug)]
pub(crate) struct Partitioner {
    /// Token ids in the order llama.cpp tries them.
    order: Vec<u32>,
    /// Finds which of `order`'s texts occur at all (overlapping search), so that only those
    /// are tried: the result is the same as trying all of them, in O(text) instead of
    /// O(text × number of special tokens).
    prefilter: Option<AhoCorasick>,
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

impl Partitioner {
    pub fn new(vocab: &Vocab) -> Result<Partitioner> {
        let order = vocab.special_cache.clone();
        let prefilter = if order.is_empty() {
            None
        } else {
            let patterns: Vec<&str> = order.iter().map(|&i| &vocab.tokens[i as usize]).collect();
            Some(AhoCorasick::new(patterns).map_err(|e| TokenizerError::Hf(e.to_string()))?)
        };
        Ok(Partitioner { order, prefilter })
    }

    /// Partitions `text` (bytes, as llama.cpp searches them; UTF-8 or not). `special` lists
    /// the byte ranges (sorted, disjoint) where control and unknown tokens may be matched.
    /// In valid UTF-8, every fragment boundary is a character boundary (token texts are
    /// valid UTF-8, so they only match at character boundaries).
    pub fn partition(&self, vocab: &Vocab, text: &[u8], special: &[Range<usize>]) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0..text.len())];
        let Some(prefilter) = &self.prefilter else {
            return frags;
        };
        let mut present = vec![false; self.order.len()];
        for m in prefilter.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        let allowed = |r: &Range<usize>| {
            // The last special range starting at or before r.start must contain r.
            let i = special.partition_point(|s| s.start <= r.start);
            i > 0 && special[i - 1].end >= r.end
        };
        let bytes = text;
        for (k, &id) in self.order.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let attr = vocab.attrs[id as usize];
            let needs_special = attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN);
            if needs_special && special.is_empty() {
                continue;
            }
            let tok = vocab.tokens[id as usize].as_bytes();
            let finder = memchr::memmem::Finder::new(tok);
            let mut out = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(r) = f else {
                    out.push(f);
                    continue;
                };
                let (mut start, mut from) = (r.start, r.start);
                while let Some(off) = finder.find(&text[from..r.end]) {
                    let m = from + off;
                    let span = m..m + tok.len();
                    if needs_special && !allowed(&span) {
                        // Not a match here: search on from the next byte.
                        from = m + 1;
                        continue;
                    }
                    let mut left_end = m;
                    if attr.has(TokenAttr::LSTRIP) {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        out.push(Fragment::Text(start..left_end));
                    }
                    out.push(Fragment::Token(id));
                    let mut right = span.end;
                    if attr.has(TokenAttr::RSTRIP) {
                        while right < r.end && is_c_space(bytes[right]) {
                            right += 1;
                        }
                    }
                    start = right;
                    from = right;
                }
                if start < r.end {
                    out.push(Fragment::Text(start..r.end));
                }
            }
            frags = out;
        }
        frags
    }
}
