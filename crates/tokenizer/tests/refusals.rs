//! Vocabularies frink must refuse, each with an error that names the problem, and the
//! behaviour of small hand-made vocabularies whose expected ids follow from llama.cpp's rules
//! by hand.

#![allow(clippy::single_range_in_vec_init)] // byte ranges of special parsing, not vectors of numbers

use frink_gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use frink_tokenizer::{Tokenizer, TokenizerError};

fn strings(v: &[&str]) -> MetaValue {
    MetaValue::Array(MetaArray::String(v.iter().map(|s| s.to_string()).collect()))
}

/// A byte-level BPE vocabulary: the printable ASCII letters used below, "Ġ", merges
/// `Ġ a`, `Ġa b`, and two control tokens.
fn bpe(pre: Option<&str>, extra: &[(&str, MetaValue)]) -> GgufFile {
    let tokens = [
        "<s>", "<|x|>", "a", "b", "Ġ", "Ġa", "Ġab", "c", "<", ">", "|", "x",
    ];
    let mut types = vec![3i32, 3];
    types.extend(std::iter::repeat_n(1, tokens.len() - 2));
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()))
        .add_metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .add_metadata("tokenizer.ggml.tokens", strings(&tokens))
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(types)),
        )
        .add_metadata("tokenizer.ggml.merges", strings(&["Ġ a", "Ġa b"]))
        .add_metadata("tokenizer.ggml.bos_token_id", MetaValue::U32(0))
        .add_metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(0));
    if let Some(p) = pre {
        w.add_metadata("tokenizer.ggml.pre", MetaValue::String(p.into()));
    }
    for (k, v) in extra {
        w.add_metadata(*k, v.clone());
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn unsupported_tokenizer_families_and_pre_tokenizers_are_named() {
    let f = bpe(
        Some("gpt-2"),
        &[("tokenizer.ggml.model", MetaValue::String("rwkv".into()))],
    );
    let err = Tokenizer::from_gguf(&f).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::UnsupportedModel(m) if m == "rwkv"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`rwkv`"), "{err}");
    for pre in ["falcon", "bloom", "viking", "qwen35", "kimi-k2"] {
        let err = Tokenizer::from_gguf(&bpe(Some(pre), &[])).unwrap_err();
        assert!(
            matches!(&err, TokenizerError::UnsupportedPreTokenizer(p) if p == pre),
            "{err:?}"
        );
        assert!(err.to_string().contains(pre), "{err}");
    }
    // A missing `pre` means llama.cpp's `default`.
    let tok = Tokenizer::from_gguf(&bpe(None, &[])).unwrap();
    assert_eq!(
        tok.pre_tokenizer(),
        Some(frink_tokenizer::PreTokenizer::Default)
    );
    eprintln!("1 unsupported family and 5 unsupported pre-tokenizers refused by name");
}

#[test]
fn malformed_vocabularies_are_refused() {
    let dup = bpe(
        Some("gpt-2"),
        &[("tokenizer.ggml.tokens", strings(&["a", "b", "a"]))],
    );
    assert!(matches!(
        Tokenizer::from_gguf(&dup).unwrap_err(),
        TokenizerError::DuplicateToken {
            first: 0,
            second: 2,
            ..
        }
    ));
    let merge = bpe(
        Some("gpt-2"),
        &[("tokenizer.ggml.merges", strings(&["Ġ a", "a c"]))],
    );
    assert!(matches!(
        Tokenizer::from_gguf(&merge).unwrap_err(),
        TokenizerError::BadMerge { rank: 1, .. }
    ));
    let no_bos = bpe(
        Some("gpt-2"),
        &[
            ("tokenizer.ggml.bos_token_id", MetaValue::U32(99)),
            ("tokenizer.ggml.add_bos_token", MetaValue::Bool(true)),
        ],
    );
    // Id 99 is out of range (ignored, keeping the default 11, which is in range here).
    assert_eq!(Tokenizer::from_gguf(&no_bos).unwrap().bos_id(), Some(11));
    let missing_bos = bpe(
        Some("gpt-2"),
        &[
            ("tokenizer.ggml.tokens", strings(&["a", "b", "c"])),
            (
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(vec![1, 1, 1])),
            ),
            ("tokenizer.ggml.bos_token_id", MetaValue::U32(99)),
            ("tokenizer.ggml.add_bos_token", MetaValue::Bool(true)),
        ],
    );
    assert!(matches!(
        Tokenizer::from_gguf(&missing_bos).unwrap_err(),
        TokenizerError::MissingSpecialToken { .. }
    ));
    let types = bpe(
        Some("gpt-2"),
        &[("tokenizer.ggml.token_type", MetaValue::String("x".into()))],
    );
    assert!(matches!(
        Tokenizer::from_gguf(&types).unwrap_err(),
        TokenizerError::BadValue {
            key: "tokenizer.ggml.token_type",
            ..
        }
    ));
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", MetaValue::String("llama".into()));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert!(matches!(
        Tokenizer::from_gguf(&f).unwrap_err(),
        TokenizerError::MissingKey("tokenizer.ggml.tokens")
    ));
    eprintln!("6 malformed vocabularies refused");
}

#[test]
fn a_hand_made_bpe_vocabulary_follows_llama_cpp_rules() {
    let tok = Tokenizer::from_gguf(&bpe(Some("gpt-2"), &[])).unwrap();
    // " ab" is one pre-token; merges make Ġa then Ġab.
    assert_eq!(tok.encode(" ab", false, false).unwrap(), [6]);
    // Control token text: literal unless parsed (characters missing from the vocabulary,
    // here none, would be dropped as llama.cpp drops them).
    assert_eq!(
        tok.encode("<|x|>", false, false).unwrap(),
        [8, 10, 11, 10, 9]
    );
    assert_eq!(tok.encode("a<|x|>b", true, true).unwrap(), [2, 1, 3]);
    assert_eq!(tok.decode(&[2, 1, 3], true).unwrap(), "a<|x|>b");
    assert_eq!(tok.decode(&[2, 1, 3], false).unwrap(), "ab");
    let err = tok.decode(&[2, 99], true).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::IdOutOfRange {
                id: 99,
                n_vocab: 12
            }
        ),
        "{err:?}"
    );
    // Special parsing only inside the given ranges.
    assert_eq!(
        tok.encode_ranges("<|x|><|x|>", &[5..10], false).unwrap(),
        [8, 10, 11, 10, 9, 1]
    );
    assert_eq!(
        tok.encode_ranges("<|x|><|x|>", &[0..5], false).unwrap(),
        [1, 8, 10, 11, 10, 9]
    );
    // A match straddling a special range's edge is not a match.
    assert_eq!(
        tok.encode_ranges("<|x|>", &[0..3], false).unwrap(),
        [8, 10, 11, 10, 9]
    );
    eprintln!("hand-made BPE vocabulary: 10 checks");
}
