//! Property tests over random Unicode strings (unpaired combining marks, emoji sequences,
//! CJK, control characters, noncharacters and private-use code points, special-token texts):
//! tokenizing and detokenizing never fail or panic for any tokenizer, streaming equals the
//! one-shot decode, and text comes back unchanged where the tokenizer is lossless (byte-level
//! BPE without space clean-up; SentencePiece for text without `▁`, which it uses for spaces).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use frink_tokenizer::{TokenAttr, Tokenizer, VocabKind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const PIECES: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "</s>",
    "<unk>",
    "<tool_call>",
    "<0x41>",
    "▁",
    "'s",
    "'LL",
    "\r\n",
    "\n\n",
    "  ",
    "\t",
    "\u{00a0}",
    "\u{3000}",
    "\u{200d}",
    "\u{0301}",
    "\u{20dd}",
    "👨\u{200d}👩\u{200d}👧",
    "👍🏽",
    "🇫🇷",
    "你好",
    "こんにちは",
    "안녕",
    "مرحبا",
    "नमस्ते",
    "\u{0}",
    "\u{1b}",
    "\u{7f}",
    "\u{85}",
    "\u{feff}",
    "\u{fffd}",
    "\u{ffff}",
    "\u{e000}",
    "\u{10ffff}",
    "123",
    "½",
    "…",
];

fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => any::<char>().prop_map(String::from),
        3 => proptest::char::range(' ', '~').prop_map(String::from),
        2 => proptest::sample::select(PIECES).prop_map(str::to_string),
        1 => proptest::char::range('\u{300}', '\u{36f}').prop_map(String::from),
        1 => proptest::char::range('\u{4e00}', '\u{9fff}').prop_map(String::from),
        1 => proptest::char::range('\u{1f300}', '\u{1faff}').prop_map(String::from),
        1 => proptest::char::range('\0', '\u{1f}').prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

/// The bytes some token renders as on its own: a text whose bytes are all among them can
/// come back (smollm2's vocabulary, for one, lacks 21 of the 256 byte-level characters, and
/// llama.cpp drops those bytes as frink does).
fn byte_coverage(tok: &Tokenizer) -> [bool; 256] {
    let mut covered = [false; 256];
    for id in 0..tok.n_vocab() as u32 {
        if let [b] = tok.token_to_piece(id, true).unwrap() {
            covered[*b as usize] = true;
        }
    }
    covered
}

/// Whether `s` must survive `decode(encode(s))`: every byte has a token; byte-level BPE
/// without the space clean-up; SentencePiece only for text without `▁` (its space symbol)
/// and, with a space prefix, only when no special token cut the text (each raw fragment
/// gets its own prefix, as in llama.cpp).
fn lossless(tok: &Tokenizer, covered: &[bool; 256], s: &str, ids: &[u32]) -> bool {
    if !s.bytes().all(|b| covered[b as usize]) {
        return false;
    }
    match tok.kind() {
        VocabKind::Bpe => !tok.pre_tokenizer().unwrap().clean_spaces(),
        // Gemma 4: llama.cpp's space clean-up is always on (and `▁` decodes as a space);
        // its round trip is checked where neither applies (llamacpp_vectors.rs).
        VocabKind::Gemma4 => false,
        // Encoders lower-case, drop characters and clean spaces (WordPiece) or normalize
        // (Unigram): not lossless; checked against llama.cpp in llamacpp_vectors.rs.
        VocabKind::Wpm | VocabKind::Ugm => false,
        VocabKind::Spm => {
            let cut = ids.iter().any(|&t| {
                tok.token_attr(t)
                    .unwrap()
                    .has(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
            });
            let prefixed_fragments = tok.add_space_prefix() && cut;
            !s.contains('▁') && !prefixed_fragments
        }
    }
}

fn run(name: &str, tok: &Tokenizer, cases: u32) {
    let covered = byte_coverage(tok);
    let checked = AtomicUsize::new(0);
    let roundtrips = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&text(), |s| {
            for (add, parse) in [(false, false), (false, true), (true, false), (true, true)] {
                let ids = tok.encode(&s, add, parse).unwrap();
                for render in [false, true] {
                    let one_shot = tok.decode(&ids, render).unwrap();
                    let mut d = tok.stream_decoder(render);
                    let mut streamed = String::new();
                    for &id in &ids {
                        streamed.push_str(&d.push(id).unwrap());
                    }
                    streamed.push_str(&d.finish());
                    prop_assert_eq!(&streamed, &one_shot);
                }
                if !add && lossless(tok, &covered, &s, &ids) {
                    prop_assert_eq!(
                        tok.decode(&ids, true).unwrap(),
                        s.clone(),
                        "parse={}",
                        parse
                    );
                    roundtrips.fetch_add(1, Ordering::Relaxed);
                }
            }
            checked.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!(
        "{name}: {} random strings x 4 flag settings, {} lossless round trips",
        checked.load(Ordering::Relaxed),
        roundtrips.load(Ordering::Relaxed)
    );
}

#[test]
fn catalog_tokenizers_round_trip_random_unicode() {
    for model in common::MODELS {
        run(model, common::tokenizer(model), 300);
    }
}

#[test]
fn tiny_fixture_tokenizers_never_fail_on_random_unicode() {
    for (name, path) in common::tiny_fixtures("tiny_fixture_tokenizers_never_fail") {
        if ![
            "qwen2",
            "llama",
            "gemma",
            "phi3",
            "llama_q256",
            "qwen2_moe_q256",
        ]
        .contains(&name.as_str())
        {
            continue;
        }
        run(
            &format!("tiny/{name}"),
            &Tokenizer::from_path(&path).unwrap(),
            100,
        );
    }
}
