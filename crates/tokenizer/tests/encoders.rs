//! WordPiece (`bert`) and Unigram (`t5`) edge cases on vocabularies built in memory, with the
//! ids worked out by hand from llama.cpp's `llm_tokenizer_wpm_session` and
//! `llm_tokenizer_ugm_session` (src/llama-vocab.cpp); and reranker pair encodings of the
//! encoder fixtures against Hugging Face's own tokenizers of the same models.

use std::path::Path;

use frink_gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use frink_tokenizer::{Tokenizer, TokenizerError, VocabKind};

/// A vocabulary: `(text, GGUF token type, score)` per token, plus extra metadata.
fn build(model: &str, tokens: &[(&str, i32, f32)], extra: &[(&str, MetaValue)]) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("bert".into()))
        .add_metadata("tokenizer.ggml.model", MetaValue::String(model.into()))
        .add_metadata(
            "tokenizer.ggml.tokens",
            MetaValue::Array(MetaArray::String(
                tokens.iter().map(|t| t.0.to_string()).collect(),
            )),
        )
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(tokens.iter().map(|t| t.1).collect())),
        )
        .add_metadata(
            "tokenizer.ggml.scores",
            MetaValue::Array(MetaArray::F32(tokens.iter().map(|t| t.2).collect())),
        );
    for (k, v) in extra {
        w.add_metadata(*k, v.clone());
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER: i32 = 4;

const WPM_TOKENS: &[(&str, i32, f32)] = &[
    ("[PAD]", CONTROL, 0.0),
    ("[UNK]", CONTROL, 0.0),
    ("[CLS]", CONTROL, 0.0),
    ("[SEP]", CONTROL, 0.0),
    ("[MASK]", CONTROL, 0.0),
    ("▁hello", NORMAL, 0.0),
    ("▁world", NORMAL, 0.0),
    ("▁un", NORMAL, 0.0),
    ("aff", NORMAL, 0.0),
    ("able", NORMAL, 0.0),
    ("▁!", NORMAL, 0.0),
    ("▁,", NORMAL, 0.0),
    ("▁hell", NORMAL, 0.0),
    ("o", NORMAL, 0.0),
];

fn wpm(extra: &[(&str, MetaValue)]) -> Tokenizer {
    let ids = [
        ("tokenizer.ggml.bos_token_id", 2),
        ("tokenizer.ggml.unknown_token_id", 1),
        ("tokenizer.ggml.seperator_token_id", 3),
        ("tokenizer.ggml.padding_token_id", 0),
        ("tokenizer.ggml.mask_token_id", 4),
    ];
    let mut meta: Vec<(&str, MetaValue)> =
        ids.iter().map(|&(k, v)| (k, MetaValue::U32(v))).collect();
    meta.extend(extra.iter().cloned());
    Tokenizer::from_gguf(&build("bert", WPM_TOKENS, &meta)).unwrap()
}

#[test]
fn wordpiece_splits_words_and_matches_longest_pieces() {
    let t = wpm(&[]);
    assert_eq!(t.kind(), VocabKind::Wpm);
    assert!(t.hf().is_none());
    assert_eq!(
        (t.sep_id(), t.unk_id(), t.pad_id()),
        (Some(3), Some(1), Some(0))
    );
    // [CLS] and [SEP] around, punctuation split off, lower case.
    assert_eq!(
        t.encode("Hello, World!", true, true).unwrap(),
        [2, 5, 11, 6, 10, 3]
    );
    // Continuation pieces (WordPiece's ##aff, ##able) are stored bare.
    assert_eq!(t.encode("unaffable", false, false).unwrap(), [7, 8, 9]);
    // Accents go with `strip_accents` (on with lower-casing): É -> E -> e.
    assert_eq!(t.encode("HÉLLO", false, false).unwrap(), [5]);
    // A word with an unmatched rest is one unknown token; so is each CJK ideograph.
    assert_eq!(t.encode("unaffablex hello", false, false).unwrap(), [1, 5]);
    assert_eq!(t.encode("你好", false, false).unwrap(), [1, 1]);
    // Control characters, U+FFFD and whitespace runs vanish; empty text gives the specials.
    assert_eq!(
        t.encode("\u{7}hello\u{FFFD}\t \n", false, false).unwrap(),
        [5]
    );
    assert_eq!(t.encode("", true, false).unwrap(), [2, 3]);
    assert_eq!(t.encode(" \t", false, false).unwrap(), [] as [u32; 0]);
    // Control tokens only with special parsing.
    assert_eq!(t.encode("[SEP]", false, true).unwrap(), [3]);
    assert_eq!(t.encode("[SEP]", false, false).unwrap(), [1, 1, 1]);
}

#[test]
fn wordpiece_flags_decoding_and_raw_bytes() {
    let t = wpm(&[]);
    // `▁` becomes a space, and the space clean-up removes the one before `!`.
    assert_eq!(t.decode(&[2, 5, 6, 10, 3], false).unwrap(), " hello world!");
    assert_eq!(
        t.decode(&[2, 5, 3], true).unwrap(),
        "[CLS] hello[SEP]",
        "control tokens render as they are"
    );
    // Invalid UTF-8 is U+FFFD, dropped without ending the word; beyond U+10FFFF llama.cpp
    // throws, frink refuses.
    assert_eq!(t.encode_bytes(b"hel\xfflo", false, false).unwrap(), [5]);
    assert!(matches!(
        t.encode_bytes(b"a\xf4\x90\x80\x80", false, false),
        Err(TokenizerError::BeyondUnicode(0x110000))
    ));
    let cased = wpm(&[(
        "tokenizer.ggml.normalizer.lowercase",
        MetaValue::Bool(false),
    )]);
    assert_eq!(cased.encode("Hello hello", false, false).unwrap(), [1, 5]);
    // `add_bos_token = false` does not stop llama.cpp's WordPiece from adding [CLS].
    let no_bos = wpm(&[("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))]);
    assert!(no_bos.add_bos());
    assert_eq!(no_bos.encode("hello", true, false).unwrap(), [2, 5, 3]);
    // Without a separator token (the default 102 is past this vocabulary) the file is refused.
    let file = build("bert", WPM_TOKENS, &[]);
    assert!(matches!(
        Tokenizer::from_gguf(&file),
        Err(TokenizerError::MissingSpecialToken { .. })
    ));
}

#[test]
fn wordpiece_pairs_have_two_segments() {
    let t = wpm(&[]);
    let (ids, types) = t.encode_pair("hello", "world!").unwrap();
    assert_eq!(ids, [2, 5, 3, 6, 10, 3]);
    assert_eq!(types, [0, 0, 0, 1, 1, 1]);
}

const UGM_TOKENS: &[(&str, i32, f32)] = &[
    ("<pad>", CONTROL, 0.0),
    ("</s>", CONTROL, 0.0),
    ("<unk>", UNKNOWN, 0.0),
    ("<s>", CONTROL, 0.0),
    ("▁", NORMAL, -2.0),
    ("▁a", NORMAL, -1.0),
    ("b", NORMAL, -3.0),
    ("ab", NORMAL, -1.5),
    ("▁ab", NORMAL, -4.0),
    ("<u>", USER, -100.0),
    ("c", NORMAL, -5.0),
];

fn ugm(extra: &[(&str, MetaValue)]) -> Tokenizer {
    let mut meta = vec![
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(3)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(1)),
        ("tokenizer.ggml.unknown_token_id", MetaValue::U32(2)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(true)),
        ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(true)),
    ];
    meta.extend(extra.iter().cloned());
    Tokenizer::from_gguf(&build("t5", UGM_TOKENS, &meta)).unwrap()
}

#[test]
fn unigram_takes_the_best_scoring_segmentation() {
    let t = ugm(&[]);
    assert_eq!(t.kind(), VocabKind::Ugm);
    // "▁ab" alone scores -4, "▁a" "b" -4 too, "▁" "ab" -3.5: the best, not the longest.
    assert_eq!(t.encode("ab", true, false).unwrap(), [3, 4, 7, 1]);
    assert_eq!(t.encode("ab", false, false).unwrap(), [4, 7]);
    // Characters no token covers: one unknown token per run.
    assert_eq!(t.encode("xyz", false, false).unwrap(), [4, 2]);
    // A user-defined token is cut out first; each raw fragment gets its own space prefix.
    assert_eq!(t.encode("a<u>b", false, false).unwrap(), [5, 9, 4, 6]);
    // Spaces are `▁`; the first decoded piece loses the prefix's space.
    assert_eq!(t.encode("a b", false, false).unwrap(), [5, 4, 6]);
    assert_eq!(t.decode(&[5, 4, 6], false).unwrap(), "a b");
    assert_eq!(t.decode(&[3, 5, 1], true).unwrap(), "<s> a</s>");
    assert_eq!(t.encode("", true, false).unwrap(), [3, 1]);
}

#[test]
fn unigram_whitespace_flags() {
    // remove_extra_whitespaces: runs collapse, ends vanish (and a `▁` goes before the first
    // word even without add_space_prefix, as llama.cpp's `normalize` does).
    let merged = ugm(&[
        (
            "tokenizer.ggml.remove_extra_whitespaces",
            MetaValue::Bool(true),
        ),
        ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)),
    ]);
    assert_eq!(merged.encode("  a   b  ", false, false).unwrap(), [5, 4, 6]);
    assert_eq!(merged.encode("   ", false, false).unwrap(), [] as [u32; 0]);
    let bare = ugm(&[("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false))]);
    assert_eq!(bare.encode("a b", false, false).unwrap(), [2, 4, 6]);
    assert_eq!(
        bare.encode("  b", false, false).unwrap(),
        [4, 4, 6],
        "each space its own `▁`"
    );
    // Raw bytes: a byte that starts no character is U+FFFD, here unknown.
    assert_eq!(bare.encode_bytes(b"\xffb", false, false).unwrap(), [2, 6]);
}

#[test]
fn unigram_pairs_follow_xlm_roberta_and_t5() {
    let t = ugm(&[]);
    let (ids, types) = t.encode_pair("ab", "c").unwrap();
    assert_eq!(ids, [3, 4, 7, 1, 1, 4, 10, 1]);
    assert_eq!(types, [0; 8]);
    let t5 = ugm(&[("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))]);
    assert_eq!(t5.encode_pair("ab", "c").unwrap().0, [4, 7, 1, 4, 10, 1]);
}

#[test]
fn damaged_charsmaps_are_refused() {
    let blobs: [&[u8]; 4] = [
        &[1, 0, 0],
        &[4, 0, 0, 0, 1, 2, 3, 4],
        &[0xff, 0xff, 0xff, 0xff, 0],
        // Root BASE 256 in a 4-entry array: every walk leaves it.
        &[
            16, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'x', 0,
        ],
    ];
    for blob in blobs {
        let file = build(
            "t5",
            UGM_TOKENS,
            &[(
                "tokenizer.ggml.precompiled_charsmap",
                MetaValue::Array(MetaArray::U8(blob.to_vec())),
            )],
        );
        match Tokenizer::from_gguf(&file) {
            Err(TokenizerError::BadValue { key, what }) => {
                assert_eq!(key, "tokenizer.ggml.precompiled_charsmap");
                eprintln!("{blob:?}: {what}");
            }
            other => panic!("{blob:?}: {other:?}"),
        }
    }
}

/// The reranker pair form against Hugging Face's tokenizer of the same model
/// (hf/tokenizer.json beside each encoder fixture), on texts where both normalize alike.
#[test]
fn fixture_pairs_match_hugging_face() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data/encoders");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let pairs = [
        (
            "what is a panda?",
            "The giant panda is a bear native to China.",
        ),
        ("hello", "world, hello again"),
        ("Café au lait", "un café, s'il vous plaît"),
    ];
    for name in ["bert", "bert_rank", "xlmr", "xlmr_rank"] {
        let gguf = dir.join(name).join("model.gguf");
        let hf_path = dir.join(name).join("hf/tokenizer.json");
        if !gguf.exists() || !hf_path.exists() {
            assert!(!ci, "{} is missing", gguf.display());
            eprintln!("SKIPPED: no {}", gguf.display());
            continue;
        }
        let tok = Tokenizer::from_path(&gguf).unwrap();
        let hf = tokenizers::Tokenizer::from_file(&hf_path).unwrap();
        for (q, d) in pairs {
            let want = hf.encode((q, d), true).unwrap();
            let (ids, types) = tok.encode_pair(q, d).unwrap();
            assert_eq!(ids, want.get_ids(), "{name}: ids of ({q:?}, {d:?})");
            assert_eq!(
                types,
                want.get_type_ids(),
                "{name}: types of ({q:?}, {d:?})"
            );
        }
        eprintln!("{name}: {} pairs equal transformers'", pairs.len());
    }
}
