//! The code point helpers of llama.cpp's src/unicode.cpp that WordPiece and Unigram use:
//! its lenient UTF-8 reader, and lookups in its own Unicode tables (categories, whitespace,
//! lower case, single-code-point "NFD"), so that the results follow llama.cpp's tables rather
//! than whichever Unicode version Rust's standard library has.

use crate::unicode_tables::{CATEGORY_RANGES, LOWERCASE_RUNS, NFD_RANGES, WHITESPACE};

pub(crate) use crate::unicode_tables::{ACCENT_MARK, CONTROL, PUNCTUATION, SYMBOL};

/// The length of the UTF-8 sequence a byte starts, from its high nibble alone
/// (`unicode_len_utf8`): 1 for ASCII and for continuation bytes.
pub(crate) fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xc | 0xd => 2,
        0xe => 3,
        0xf => 4,
        _ => 1,
    }
}

/// One code point read as `unicode_cpt_from_utf8` reads it: the lead byte says the length
/// (`F0..=F7` four bytes), the following bytes must be continuation bytes, and nothing else
/// is checked (overlong forms, surrogates and values up to 0x1FFFFF pass). `None` where
/// llama.cpp throws: a continuation or `F8..=FF` lead byte, or a truncated sequence.
/// Returns the value and the number of bytes read.
pub(crate) fn decode_lenient(bytes: &[u8]) -> Option<(u32, usize)> {
    let b0 = *bytes.first()?;
    let (len, bits) = match b0 {
        0x00..=0x7f => return Some((u32::from(b0), 1)),
        0x80..=0xbf => return None,
        0xc0..=0xdf => (2, u32::from(b0 & 0x1f)),
        0xe0..=0xef => (3, u32::from(b0 & 0x0f)),
        0xf0..=0xf7 => (4, u32::from(b0 & 0x07)),
        _ => return None,
    };
    let tail = bytes.get(1..len)?;
    if tail.iter().any(|&b| b & 0xc0 != 0x80) {
        return None;
    }
    let cpt = tail
        .iter()
        .fold(bits, |cp, &b| (cp << 6) | u32::from(b & 0x3f));
    Some((cpt, len))
}

/// All code points of `bytes` as `unicode_cpts_from_utf8` reads them: what
/// [`decode_lenient`] refuses becomes U+FFFD for one byte.
pub(crate) fn cpts_lenient(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match decode_lenient(&bytes[i..]) {
            Some((c, n)) => {
                out.push(c);
                i += n;
            }
            None => {
                out.push(0xfffd);
                i += 1;
            }
        }
    }
    out
}

/// Appends the UTF-8 encoding of `cpt` (`unicode_cpt_to_utf8`: surrogates are encoded as
/// any other value). `None` beyond U+10FFFF, where llama.cpp throws.
pub(crate) fn push_utf8(cpt: u32, out: &mut Vec<u8>) -> Option<()> {
    match cpt {
        0..=0x7f => out.push(cpt as u8),
        0x80..=0x7ff => {
            out.extend_from_slice(&[0xc0 | (cpt >> 6) as u8, 0x80 | (cpt & 0x3f) as u8])
        }
        0x800..=0xffff => out.extend_from_slice(&[
            0xe0 | (cpt >> 12) as u8,
            0x80 | ((cpt >> 6) & 0x3f) as u8,
            0x80 | (cpt & 0x3f) as u8,
        ]),
        0x10000..=0x10ffff => out.extend_from_slice(&[
            0xf0 | (cpt >> 18) as u8,
            0x80 | ((cpt >> 12) & 0x3f) as u8,
            0x80 | ((cpt >> 6) & 0x3f) as u8,
            0x80 | (cpt & 0x3f) as u8,
        ]),
        _ => return None,
    }
    Some(())
}

/// The category bits ([`CONTROL`], [`ACCENT_MARK`], [`PUNCTUATION`], [`SYMBOL`]) of `cpt`
/// in llama.cpp's table (`unicode_cpt_flags_from_cpt`); none beyond U+10FFFF.
pub(crate) fn categories(cpt: u32) -> u8 {
    let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cpt);
    CATEGORY_RANGES[i.saturating_sub(1)].1
}

/// Whether `cpt` is in llama.cpp's whitespace set (`unicode_set_whitespace`).
pub(crate) fn is_whitespace(cpt: u32) -> bool {
    WHITESPACE.binary_search(&cpt).is_ok()
}

/// `unicode_tolower`: the one-code-point lower case of llama.cpp's map, else `cpt`.
pub(crate) fn to_lower(cpt: u32) -> u32 {
    let i = LOWERCASE_RUNS.partition_point(|r| r.0 <= cpt);
    if i == 0 {
        return cpt;
    }
    let (first, count, stride, delta) = LOWERCASE_RUNS[i - 1];
    let k = cpt - first;
    if k.is_multiple_of(stride) && k / stride < count {
        cpt.wrapping_add_signed(delta)
    } else {
        cpt
    }
}

/// `unicode_cpts_normalize_nfd` for one code point: the first code point of its canonical
/// decomposition where llama.cpp's table has one, else `cpt` (not a full NFD: the marks of
/// the decomposition are dropped, and Hangul syllables become their first jamo).
pub(crate) fn nfd_first(cpt: u32) -> u32 {
    let i = NFD_RANGES.partition_point(|r| r.0 <= cpt);
    match NFD_RANGES.get(i.wrapping_sub(1)) {
        Some(&(first, last, nfd)) if first <= cpt && cpt <= last => nfd,
        _ => cpt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_give_llama_cpp_answers() {
        assert_eq!(to_lower('A' as u32), 'a' as u32);
        assert_eq!(to_lower('Ā' as u32), 'ā' as u32);
        assert_eq!(to_lower('ā' as u32), 'ā' as u32);
        assert_eq!(to_lower('İ' as u32), 'i' as u32);
        assert_eq!(to_lower('Ω' as u32), 'ω' as u32);
        assert_eq!(nfd_first('é' as u32), 'e' as u32);
        assert_eq!(nfd_first('e' as u32), 'e' as u32);
        assert_eq!(nfd_first(0xac00), 0x1100, "Hangul GA -> first jamo");
        assert!(is_whitespace(' ' as u32) && is_whitespace(0x3000) && !is_whitespace(0x1f));
        assert_eq!(categories('!' as u32), PUNCTUATION);
        assert_eq!(categories('$' as u32), SYMBOL);
        assert_eq!(categories(0x301), ACCENT_MARK);
        assert_eq!(categories(0x7), CONTROL);
        assert_eq!(
            categories(0xd800),
            CONTROL,
            "surrogates are control characters"
        );
        assert_eq!(categories('a' as u32), 0);
        assert_eq!(categories(0x110000), 0);
    }

    #[test]
    fn lenient_reader_accepts_what_llama_cpp_accepts() {
        assert_eq!(decode_lenient(b"\xc0\xbc"), Some((0x3c, 2)), "overlong");
        assert_eq!(
            decode_lenient(b"\xed\xa0\x80"),
            Some((0xd800, 3)),
            "surrogate"
        );
        assert_eq!(decode_lenient(b"\xf7\xbf\xbf\xbf"), Some((0x1fffff, 4)));
        assert_eq!(decode_lenient(b"\xf8\x80"), None);
        assert_eq!(decode_lenient(b"\x80"), None);
        assert_eq!(decode_lenient(b"\xe2\x82"), None);
        assert_eq!(cpts_lenient(b"a\xe2\x82b"), [0x61, 0xfffd, 0xfffd, 0x62]);
        let mut v = Vec::new();
        for c in ['a', 'é', '€', '😀'] {
            v.clear();
            push_utf8(c as u32, &mut v).unwrap();
            assert_eq!(v, c.to_string().as_bytes());
        }
        assert_eq!(push_utf8(0x110000, &mut v), None);
    }
}
