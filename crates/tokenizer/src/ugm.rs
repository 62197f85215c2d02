//! Unigram (`tokenizer.ggml.model = t5`), as llama.cpp's `llm_tokenizer_ugm` and
//! `llm_tokenizer_ugm_session` (src/llama-vocab.cpp) tokenize one raw fragment.
//!
//! 1. Normalization (`normalize`, `normalize_prefix`), over bytes: at each position, a prefix
//!    on the path of a user-defined token passes unchanged; else the longest prefix the
//!    precompiled character map ([`Charsmap`]) knows is replaced by its replacement string;
//!    else one character passes unchanged, or one byte that starts no character becomes
//!    U+FFFD. In the result, each space becomes `▁`; with `add_space_prefix` a `▁` goes
//!    before the first non-space, with `remove_extra_whitespaces` runs of spaces collapse to
//!    one `▁` before the next non-space (leading and trailing ones vanish).
//! 2. The best segmentation (Viterbi): moving one character at a time, every token (normal,
//!    user-defined or unused) that the text continues with is scored as the best score up
//!    to here plus its score (user-defined tokens score 0); a character no single token
//!    covers may be the unknown token, scored as the lowest normal score minus 10. Scores
//!    add up in `f64`. The best path from the end is read back, consecutive unknown tokens
//!    merged into one.

use std::collections::HashSet;
use std::ops::Range;

use crate::error::{Result, TokenizerError};
use crate::unicode;
use crate::vocab::{TokenAttr, TokenTexts, Vocab, KEY_CHARSMAP, KEY_UNK};

const SPACE: &[u8] = "\u{2581}".as_bytes();
const REPLACEMENT_CHARACTER: &[u8] = "\u{FFFD}".as_bytes();
/// What llama.cpp subtracts from the lowest normal score to score the unknown token.
const UNKNOWN_PENALTY: f32 = 10.0;

fn bad(what: impl Into<String>) -> TokenizerError {
    TokenizerError::BadValue {
        key: KEY_CHARSMAP,
        what: what.into(),
    }
}

/// SentencePiece's precompiled character map: a little-endian `u32` byte length, that many
/// bytes of XOR-compressed compact double array (XCDA, `u32` entries), then NUL-terminated
/// replacement strings, as llama.cpp's `llm_tokenizer_ugm` reads it.
///
/// An XCDA entry packs BASE in bits 10..31 (shifted left 8 more when bit 9 is set), LEAF in
/// bit 8 and LCHECK in bits 0..8 plus bit 31; an entry holding a replacement offset (bits
/// 0..31) has bit 31 set. From a node's BASE `p`, byte `c` leads to entry `p ^ c` if that
/// entry's LCHECK is `c`; the next BASE is that entry's index XOR its BASE, and if it is a
/// leaf the replacement offset is in the entry at that next BASE.
#[derive(Clone, Debug)]
pub(crate) struct Charsmap {
    xcda: Vec<u32>,
    replacements: Vec<u8>,
}

fn base(node: u32) -> u32 {
    (node >> 10) << ((node & (1 << 9)) >> 6)
}

fn lcheck(node: u32) -> u32 {
    node & ((1 << 31) | 0xff)
}

fn is_leaf(node: u32) -> bool {
    (node >> 8) & 1 == 1
}

fn value(node: u32) -> u32 {
    node & ((1 << 31) - 1)
}

impl Charsmap {
    /// Parses and checks `blob` (`None` for an empty one, which llama.cpp ignores).
    ///
    /// The checks are llama.cpp's load-time ones (a 4-byte header; the XCDA ends before the
    /// blob does), and, where llama.cpp would fail only once some input walks there (an
    /// entry index past the array, a replacement offset past the strings, a replacement
    /// without its NUL), a walk over every node reachable from the root: a damaged map is
    /// refused here, so tokenizing never meets one.
    ///
    /// Errors: [`TokenizerError::BadValue`] on `tokenizer.ggml.precompiled_charsmap`, saying
    /// what is wrong.
    pub fn parse(blob: &[u8]) -> Result<Option<Charsmap>> {
        if blob.is_empty() {
            return Ok(None);
        }
        let header: [u8; 4] = blob
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| bad(format!("{} bytes, too short for its header", blob.len())))?;
        let xcda_len = u32::from_le_bytes(header) as usize;
        if xcda_len as u64 + 4 >= blob.len() as u64 {
            return Err(bad(format!(
                "double array of {xcda_len} bytes does not fit in the {}-byte map",
                blob.len()
            )));
        }
        let xcda = blob[4..4 + xcda_len]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let map = Charsmap {
            xcda,
            replacements: blob[4 + xcda_len..].to_vec(),
        };
        map.check()?;
        Ok(Some(map))
    }

    fn node(&self, index: u32) -> Option<u32> {
        self.xcda.get(index as usize).copied()
    }

    /// The replacement string at `offset`, if it lies in the strings and ends with a NUL.
    fn replacement(&self, offset: u32) -> Option<&[u8]> {
        let rest = self.replacements.get(offset as usize..)?;
        let end = memchr::memchr(0, rest)?;
        Some(&rest[..end])
    }

    /// Walks every node reachable from the root, checking every index and replacement a
    /// walk can meet.
    fn check(&self) -> Result<()> {
        let Some(root) = self.xcda.first() else {
            return Ok(());
        };
        let mut seen = HashSet::new();
        let mut stack = vec![base(*root)];
        while let Some(p) = stack.pop() {
            for c in 1..=255u32 {
                let index = p ^ c;
                let node = self
                    .node(index)
                    .ok_or_else(|| bad(format!("entry {index} is past the double array")))?;
                if lcheck(node) != c {
                    continue;
                }
                let next = index ^ base(node);
                if is_leaf(node) {
                    let v = self.node(next).ok_or_else(|| {
                        bad(format!("value entry {next} is past the double array"))
                    })?;
                    self.replacement(value(v)).ok_or_else(|| {
                        bad(format!(
                            "replacement at {} is out of bounds or unterminated",
                            value(v)
                        ))
                    })?;
                }
                if seen.insert(next) {
                    stack.push(next);
                }
            }
        }
        Ok(())
    }

    /// The longest prefix of `input` the map replaces: its length and its replacement.
    fn longest_match(&self, input: &[u8]) -> Option<(usize, &[u8])> {
        let mut p = base(*self.xcda.first()?);
        let mut found = None;
        for (k, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            let index = p ^ u32::from(c);
            let Some(node) = self.node(index).filter(|&n| lcheck(n) == u32::from(c)) else {
                break;
            };
            p = index ^ base(node);
            if is_leaf(node) {
                // Checked at load: both lookups succeed.
                if let Some(r) = self.node(p).and_then(|v| self.replacement(value(v))) {
                    found = Some((k + 1, r));
                }
            }
        }
        found
    }
}

/// Token ids sorted by text, walked as a trie: the ids whose texts start with a given
/// prefix are a contiguous range (llama.cpp's `naive_trie`, without the nodes).
#[derive(Clone, Debug, Default)]
struct SortedTrie {
    ids: Vec<u32>,
}

impl SortedTrie {
    fn new(texts: &TokenTexts, mut ids: Vec<u32>) -> SortedTrie {
        ids.sort_by(|&a, &b| {
            texts[a as usize]
                .as_bytes()
                .cmp(texts[b as usize].as_bytes())
        });
        SortedTrie { ids }
    }

    fn root(&self) -> Range<usize> {
        0..self.ids.len()
    }

    /// From the ids in `r`, whose texts share their first `depth` bytes, those whose next
    /// byte is `b`.
    fn step(&self, texts: &TokenTexts, r: Range<usize>, depth: usize, b: u8) -> Range<usize> {
        let ids = &self.ids[r.clone()];
        let key = |id: &u32| {
            texts[*id as usize]
                .as_bytes()
                .get(depth)
                .map(|&x| i32::from(x))
        };
        let lo = ids.partition_point(|id| key(id).unwrap_or(-1) < i32::from(b));
        let hi = ids.partition_point(|id| key(id).unwrap_or(-1) <= i32::from(b));
        r.start + lo..r.start + hi
    }

    /// The id in `r` whose text is exactly `len` bytes long (it sorts first), if any.
    fn exact(&self, texts: &TokenTexts, r: &Range<usize>, len: usize) -> Option<u32> {
        let id = *self.ids.get(r.start).filter(|_| !r.is_empty())?;
        (texts[id as usize].len() == len).then_some(id)
    }
}

/// The Unigram tokenizer of a vocabulary.
#[derive(Clone, Debug)]
pub(crate) struct Ugm {
    charsmap: Option<Charsmap>,
    /// Normal, user-defined and unused tokens: what segmentation may use.
    tokens: SortedTrie,
    /// User-defined tokens: text on their paths is not normalized.
    user_defined: SortedTrie,
    unknown_score: f32,
    add_space_prefix: bool,
    remove_extra_whitespaces: bool,
}

/// The best segmentation found so far of the normalized text up to some position.
#[derive(Clone, Copy)]
struct Best {
    token: Option<u32>,
    from: usize,
    score: f64,
}

impl Ugm {
    /// The tokenizer of `vocab`; `type_attrs` are the attributes the token types give,
    /// before llama.cpp's load-time adjustments (llama.cpp builds its Unigram tries then).
    ///
    /// Errors: [`TokenizerError::BadValue`] for a damaged precompiled character map.
    pub fn new(vocab: &Vocab, type_attrs: &[TokenAttr]) -> Result<Ugm> {
        let charsmap = Charsmap::parse(&vocab.charsmap)?;
        let mut min_score = f32::MAX;
        let (mut matchable, mut user) = (Vec::new(), Vec::new());
        for (id, &attr) in type_attrs.iter().enumerate() {
            if attr.has(TokenAttr::NORMAL) {
                min_score = min_score.min(vocab.scores[id]);
            }
            if attr.has(TokenAttr::NORMAL | TokenAttr::USER_DEFINED | TokenAttr::UNUSED) {
                matchable.push(id as u32);
            }
            if attr.has(TokenAttr::USER_DEFINED) {
                user.push(id as u32);
            }
        }
        Ok(Ugm {
            charsmap,
            tokens: SortedTrie::new(&vocab.tokens, matchable),
            user_defined: SortedTrie::new(&vocab.tokens, user),
            unknown_score: min_score - UNKNOWN_PENALTY,
            add_space_prefix: vocab.add_space_prefix,
            remove_extra_whitespaces: vocab.remove_extra_whitespaces,
        })
    }

    /// How `input` starts normalized: the bytes it becomes and how many it consumes.
    fn normalize_prefix<'a>(&'a self, texts: &TokenTexts, input: &'a [u8]) -> (&'a [u8], usize) {
        // As deep as the text follows a user-defined token's path (not necessarily to a
        // whole token): kept as it is.
        let (mut r, mut depth) = (self.user_defined.root(), 0);
        while depth < input.len() {
            r = self.user_defined.step(texts, r, depth, input[depth]);
            if r.is_empty() {
                break;
            }
            depth += 1;
        }
        if depth > 0 {
            return (&input[..depth], depth);
        }
        if let Some((len, repl)) = self.charsmap.as_ref().and_then(|m| m.longest_match(input)) {
            return (repl, len);
        }
        match unicode::decode_lenient(input) {
            Some((_, n)) => (&input[..n], n),
            None => (REPLACEMENT_CHARACTER, 1),
        }
    }

    /// The normalized text of one raw fragment.
    fn normalize(&self, texts: &TokenTexts, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len() * 3);
        let merge = self.remove_extra_whitespaces;
        let (mut prefixed, mut in_word) = (false, false);
        let mut at = 0;
        while at < input.len() {
            let (piece, consumed) = self.normalize_prefix(texts, &input[at..]);
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (self.add_space_prefix && !prefixed) || merge {
                            out.extend_from_slice(SPACE);
                            prefixed = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(SPACE);
                    }
                }
            }
            at += consumed;
        }
        out
    }

    /// Tokenizes one raw fragment (UTF-8 or not) onto `out`.
    ///
    /// Errors: [`TokenizerError::MissingToken`] where the best segmentation holds the
    /// unknown token and the vocabulary has none.
    pub fn tokenize(&self, vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) -> Result<()> {
        let texts = &vocab.tokens;
        let norm = self.normalize(texts, text);
        let n = norm.len();
        if n == 0 {
            return Ok(());
        }
        let unk = vocab.special.unk;
        let unset = Best {
            token: unk,
            from: 0,
            score: -f64::MAX,
        };
        let mut best = vec![unset; n + 1];
        best[0].score = 0.0;
        let mut at = 0;
        while at < n {
            let units = unicode::utf8_len(norm[at]).min(n - at);
            let here = best[at].score;
            let mut whole_char = false;
            let mut r = self.tokens.root();
            for end in at..n {
                r = self.tokens.step(texts, r, end - at, norm[end]);
                if r.is_empty() {
                    break;
                }
                let len = end + 1 - at;
                let Some(id) = self.tokens.exact(texts, &r, len) else {
                    continue;
                };
                whole_char |= len == units;
                let score = if vocab.attrs[id as usize].has(TokenAttr::USER_DEFINED) {
                    0.0
                } else {
                    f64::from(vocab.scores[id as usize])
                };
                let cand = here + score;
                if cand > best[end + 1].score {
                    best[end + 1] = Best {
                        token: Some(id),
                        from: at,
                        score: cand,
                    };
                }
            }
            if !whole_char {
                let cand = here + f64::from(self.unknown_score);
                let end = at + units;
                if cand > best[end].score {
                    best[end] = Best {
                        token: unk,
                        from: at,
                        score: cand,
                    };
                }
            }
            at += units;
        }
        let start = out.len();
        let (mut pos, mut prev_unknown) = (n, false);
        loop {
            let b = best[pos];
            let unknown = b.token == unk;
            if !(prev_unknown && unknown) {
                out.push(b.token.ok_or(TokenizerError::MissingToken {
                    what: "unknown",
                    key: KEY_UNK,
                })?);
            }
            if b.from == 0 {
                break;
            }
            prev_unknown = unknown;
            pos = b.from;
        }
        out[start..].reverse();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 512-entry XCDA mapping "a" to "b" and "ab" to "X" (root BASE 256; after "a" BASE
    /// 384, after "ab" BASE 300; the value entries hold the offsets with bit 31 set), then
    /// the replacement strings `repl`.
    fn blob(offsets: (u32, u32), repl: &[u8]) -> Vec<u8> {
        let mut xcda = vec![0u32; 512];
        xcda[0] = 256 << 10;
        xcda[256 ^ 0x61] = ((353 ^ 384) << 10) | (1 << 8) | 0x61;
        xcda[384] = (1 << 31) | offsets.0;
        xcda[384 ^ 0x62] = ((482 ^ 300) << 10) | (1 << 8) | 0x62;
        xcda[300] = (1 << 31) | offsets.1;
        let mut out = ((xcda.len() * 4) as u32).to_le_bytes().to_vec();
        out.extend(xcda.iter().flat_map(|e| e.to_le_bytes()));
        out.extend_from_slice(repl);
        out
    }

    #[test]
    fn charsmap_replaces_the_longest_known_prefix() {
        let map = Charsmap::parse(&blob((0, 2), b"b\0X\0")).unwrap().unwrap();
        assert_eq!(map.longest_match(b"abc"), Some((2, &b"X"[..])));
        assert_eq!(map.longest_match(b"ac"), Some((1, &b"b"[..])));
        assert_eq!(
            map.longest_match(b"a\0b"),
            Some((1, &b"b"[..])),
            "NUL ends the walk"
        );
        assert_eq!(map.longest_match(b"ba"), None);
        assert!(Charsmap::parse(&[]).unwrap().is_none());
        // An empty double array matches nothing.
        let empty = Charsmap::parse(&[0, 0, 0, 0, 0]).unwrap().unwrap();
        assert_eq!(empty.longest_match(b"a"), None);
    }

    #[test]
    fn damaged_charsmaps_give_typed_errors() {
        let refused = |b: &[u8]| match Charsmap::parse(b) {
            Err(TokenizerError::BadValue { key, .. }) => key == KEY_CHARSMAP,
            _ => false,
        };
        assert!(refused(&[1, 2, 3]), "short header");
        assert!(refused(&blob((0, 2), b"")), "no strings after the array");
        assert!(refused(&blob((0, 9), b"b\0X\0")), "offset past the strings");
        assert!(refused(&blob((0, 2), b"b\0X")), "unterminated string");
        let mut short = blob((0, 2), b"b\0X\0");
        short[..4].copy_from_slice(&(300u32 * 4).to_le_bytes());
        assert!(refused(&short), "entries past a truncated array");
    }

    /// Every truncation and many byte flips of a valid map: parsing never panics, and a map
    /// that parses normalizes any input without panicking.
    #[test]
    fn mangled_charsmaps_never_panic() {
        let good = blob((0, 2), b"b\0X\0");
        let inputs: [&[u8]; 4] = [b"abab", b"\xff\xfe", b"aaaaaaaa", &[0x61, 0, 0x62]];
        let try_blob = |b: &[u8]| {
            if let Ok(Some(map)) = Charsmap::parse(b) {
                for input in inputs {
                    let _ = map.longest_match(input);
                }
            }
        };
        for len in 0..good.len() {
            try_blob(&good[..len]);
        }
        let mut state = 0x2545_f491_u32;
        for _ in 0..3000 {
            let mut b = good.clone();
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let i = state as usize % b.len();
                b[i] = (state >> 24) as u8;
            }
            try_blob(&b);
        }
    }
}
