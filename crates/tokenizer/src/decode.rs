//! Token ids back to text: per-token byte pieces, llama.cpp's detokenization rules, and a
//! streaming decoder that only ever emits complete UTF-8 and adds up to the one-shot decode.
//!
//! Pieces follow llama.cpp's `token_to_piece` (src/llama-vocab.cpp): control and unknown
//! tokens render as their text only when special tokens are rendered; user-defined tokens
//! always render as their text; normal tokens render as `▁`→space (SentencePiece, Gemma 4,
//! WordPiece and Unigram: `LLAMA_VOCAB_TYPE_SPM`/`WPM`/`UGM` share one rule) or through
//! the GPT-2 byte mapping undone (byte-level BPE); `<0xNN>` byte tokens render as the byte;
//! unused and undefined tokens render as nothing. `llama_detokenize` (with
//! `remove_special = false`) then drops one leading space of the first piece when the
//! vocabulary adds a space prefix, and for vocabularies with `clean_spaces` removes the space
//! before `?!.,`, around a lone `'` and before `'s 'm 're 've`.

use std::collections::HashMap;

use crate::vocab::{TokenAttr, Vocab, VocabKind};

/// GPT-2's byte-to-character table: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100 onward in byte order (as in GPT-2's `bytes_to_unicode` and llama.cpp's
/// `unicode_byte_to_utf8_map`).
pub(crate) fn byte_level_char_to_byte() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0u32..256 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let c = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        map.insert(char::from_u32(c).expect("valid code point"), b as u8);
    }
    map
}

/// The bytes a normal byte-level BPE token stands for. A character outside GPT-2's table
/// (not produced by byte-level BPE, but possible in a hand-made vocabulary) renders the way
/// llama.cpp renders it: `[UNK_BYTE_0x` + the character's UTF-8 in hex + the token text + `]`.
fn byte_level_decode(text: &str, table: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match table.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The byte of a `<0xNN>` token: the hex digits at offsets 3..5, read as C's `strtol` reads
/// them (leading hex digits only; none gives 0).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.get(3..5).unwrap_or("");
    let hex: String = digits
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    u8::from_str_radix(&hex, 16).unwrap_or(0)
}

/// The pieces of every token with special tokens rendered, and which tokens are hidden when
/// they are not.
#[derive(Clone, Debug)]
pub(crate) struct Pieces {
    /// Every token's piece, concatenated in id order.
    bytes: Vec<u8>,
    /// `ends[i]`: where token `i`'s piece ends in `bytes` (it starts where `i - 1`'s ends).
    ends: Vec<usize>,
    special: Vec<bool>,
}

impl Pieces {
    pub fn new(vocab: &Vocab) -> Pieces {
        let table = byte_level_char_to_byte();
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(vocab.n_tokens());
        let mut special = Vec::with_capacity(vocab.n_tokens());
        for (text, &attr) in vocab.tokens.iter().zip(&vocab.attrs) {
            special.push(attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN));
            if attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN | TokenAttr::USER_DEFINED) {
                bytes.extend_from_slice(text.as_bytes());
            } else if attr.has(TokenAttr::NORMAL) {
                match vocab.kind {
                    VocabKind::Spm | VocabKind::Gemma4 | VocabKind::Wpm | VocabKind::Ugm => {
                        bytes.extend_from_slice(text.replace('▁', " ").as_bytes())
                    }
                    VocabKind::Bpe => bytes.extend(byte_level_decode(text, &table)),
                }
            } else if attr.has(TokenAttr::BYTE) {
                bytes.push(byte_token_value(text));
            }
            ends.push(bytes.len());
        }
        bytes.shrink_to_fit();
        Pieces {
            bytes,
            ends,
            special,
        }
    }

    /// The piece of `id` (in range), empty for a hidden special token.
    pub fn get(&self, id: u32, render_special: bool) -> &[u8] {
        let i = id as usize;
        if !render_special && self.special[i] {
            &[]
        } else {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.bytes[start..self.ends[i]]
        }
    }
}

/// llama.cpp's `clean_spaces` post-processing as a streaming transducer: three passes, each
/// holding back only the few ASCII bytes whose fate depends on what follows.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpaceCleaner {
    /// Pass 1: a space not yet known to precede `?!.,`.
    p1_space: bool,
    /// Pass 2: held bytes of a possible " ' " (0, 1 = " ", 2 = " '").
    p2_held: u8,
    /// Pass 3: held bytes of a possible " 's" / " 're" (the bytes themselves).
    p3_held: Vec<u8>,
}

impl SpaceCleaner {
    /// Feeds `input` and appends whatever is decided to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.pass1(b, out);
        }
    }

    /// Flushes the held bytes (the end of the text decides them).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.p1_space) {
            self.pass2(b' ', out);
        }
        match std::mem::take(&mut self.p2_held) {
            1 => self.pass3(b' ', out),
            2 => {
                self.pass3(b' ', out);
                self.pass3(b'\'', out);
            }
            _ => {}
        }
        out.append(&mut self.p3_held);
    }

    /// Removes a space directly followed by `?`, `!`, `.` or `,`.
    fn pass1(&mut self, b: u8, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.p1_space) && !matches!(b, b'?' | b'!' | b'.' | b',') {
            self.pass2(b' ', out);
        }
        if b == b' ' {
            self.p1_space = true;
        } else {
            self.pass2(b, out);
        }
    }

    /// Turns " ' " into "'"; the space a match consumes cannot start the next match.
    fn pass2(&mut self, b: u8, out: &mut Vec<u8>) {
        match (self.p2_held, b) {
            (0, b' ') => self.p2_held = 1,
            (0, _) => self.pass3(b, out),
            (1, b'\'') => self.p2_held = 2,
            (1, b' ') => self.pass3(b' ', out),
            (1, _) => {
                self.p2_held = 0;
                self.pass3(b' ', out);
                self.pass3(b, out);
            }
            (_, b' ') => {
                self.p2_held = 0;
                self.pass3(b'\'', out);
            }
            (_, _) => {
                self.p2_held = 0;
                self.pass3(b' ', out);
                self.pass3(b'\'', out);
                self.pass2(b, out);
            }
        }
    }

    /// Removes the space of " 's", " 'm", " 're" and " 've".
    fn pass3(&mut self, b: u8, out: &mut Vec<u8>) {
        let held = &mut self.p3_held;
        match (held.as_slice(), b) {
            ([], b' ') => held.push(b' '),
            ([], _) => out.push(b),
            ([b' '], b'\'') => held.push(b),
            ([b' '], b' ') => out.push(b' '),
            ([b' ', b'\''], b's' | b'm') => {
                held.clear();
                out.extend_from_slice(&[b'\'', b]);
            }
            ([b' ', b'\''], b'r' | b'v') => held.push(b),
            ([b' ', b'\'', _], b'e') => {
                out.extend_from_slice(&held[1..]);
                out.push(b);
                held.clear();
            }
            _ => {
                out.append(held);
                self.pass3(b, out);
            }
        }
    }
}

/// Decodes `pending` as far as it is final, appending to `out` what `String::from_utf8_lossy`
/// would produce for it: complete characters, and U+FFFD per invalid sequence. An incomplete
/// sequence at the end stays in `pending` unless `last`, when it becomes one U+FFFD.
pub(crate) fn drain_utf8(pending: &mut Vec<u8>, out: &mut String, last: bool) {
    let mut start = 0;
    while start < pending.len() {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(
                    std::str::from_utf8(&pending[start..start + valid]).expect("valid prefix"),
                );
                start += valid;
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start += n;
                    }
                    None if last => {
                        out.push('\u{FFFD}');
                        start = pending.len();
                    }
                    None => break,
                }
            }
        }
    }
    pending.drain(..start);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clean-up written as three whole-text passes over a byte vector, straight from the
    /// description of llama.cpp's `detokenize`, to check the streaming transducer against.
    fn clean_reference(text: &[u8]) -> Vec<u8> {
        // Pass 1: drop a space followed by ?!.,
        let mut p1 = Vec::new();
        for (i, &b) in text.iter().enumerate() {
            if b == b' ' && matches!(text.get(i + 1), Some(b'?' | b'!' | b'.' | b',')) {
                continue;
            }
            p1.push(b);
        }
        // Pass 2: " ' " -> "'", left to right, non-overlapping.
        let mut p2 = Vec::new();
        let mut i = 0;
        while i < p1.len() {
            if i + 2 < p1.len() && p1[i] == b' ' && p1[i + 1] == b'\'' && p1[i + 2] == b' ' {
                p2.push(b'\'');
                i += 3;
            } else {
                p2.push(p1[i]);
                i += 1;
            }
        }
        // Pass 3: drop the space of " 's", " 'm", " 're", " 've".
        let mut p3 = Vec::new();
        for (i, &b) in p2.iter().enumerate() {
            if b == b' ' && p2.get(i + 1) == Some(&b'\'') {
                let x1 = p2.get(i + 2).copied();
                let x2 = p2.get(i + 3).copied();
                let drop = matches!(x1, Some(b's' | b'm'))
                    || matches!((x1, x2), (Some(b'r' | b'v'), Some(b'e')));
                if drop {
                    continue;
                }
            }
            p3.push(b);
        }
        p3
    }

    fn clean_streaming(text: &[u8], chunk: usize) -> Vec<u8> {
        let mut c = SpaceCleaner::default();
        let mut out = Vec::new();
        for part in text.chunks(chunk.max(1)) {
            c.push(part, &mut out);
        }
        c.finish(&mut out);
        out
    }

    #[test]
    fn cleaner_matches_whole_text_passes_on_every_short_string() {
        // Every string of length <= 6 over the alphabet the rules look at.
        let alphabet = b" '?.,srmvetdx";
        let mut n = 0;
        let mut stack: Vec<Vec<u8>> = vec![vec![]];
        while let Some(s) = stack.pop() {
            let want = clean_reference(&s);
            for chunk in [1, 2, 5] {
                assert_eq!(
                    clean_streaming(&s, chunk),
                    want,
                    "{:?}",
                    String::from_utf8_lossy(&s)
                );
            }
            n += 1;
            if s.len() < 6 {
                for &b in alphabet {
                    let mut t = s.clone();
                    t.push(b);
                    stack.push(t);
                }
            }
        }
        eprintln!("clean_spaces transducer: {n} strings checked");
    }

    #[test]
    fn cleaner_examples() {
        assert_eq!(
            clean_reference(b"Hello , world ! It 's a ' test ' ."),
            b"Hello, world! It's a'test '.".to_vec()
        );
        assert_eq!(
            clean_streaming(b"we 're you 'll he 'd", 1),
            b"we're you 'll he 'd".to_vec()
        );
    }

    #[test]
    fn byte_table_is_a_bijection() {
        let t = byte_level_char_to_byte();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'!'], b'!');
        let mut seen: Vec<u8> = t.values().copied().collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn utf8_drain_equals_lossy_conversion() {
        let samples: &[&[u8]] = &[
            b"abc",
            "é😀".as_bytes(),
            b"\xf0\x9f\x98",
            b"\xff\xfeabc\xe2\x82",
            b"\xe2\x82\xac\x80\x80z",
            b"\xed\xa0\x80",
        ];
        for s in samples {
            for chunk in 1..=4 {
                let mut pending = Vec::new();
                let mut out = String::new();
                for part in s.chunks(chunk) {
                    pending.extend_from_slice(part);
                    drain_utf8(&mut pending, &mut out, false);
                }
                drain_utf8(&mut pending, &mut out, true);
                assert_eq!(out, String::from_utf8_lossy(s), "{s:?} chunk {chunk}");
            }
        }
    }
}
