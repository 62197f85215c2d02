//! Encoders (BERT family) against transformers (fp32) on the tiny random-weight fixtures
//! of tests/data/encoders (make_fixture.py: BertModel with a WordPiece vocabulary,
//! XLMRobertaModel with a Unigram one, and their sequence-classification variants,
//! converted by llama.cpp's converter): each case's pooled embedding (the pooling the
//! file names) or reranking score, from transformers' own token ids and token types.
//! Also: every input alone equals the same input inside a batch, bit for bit, and the
//! features that make an encoder one (bidirectional attention, learned positions, token
//! types, the post-residual norms, the exact GELU) each change the output.

use std::path::{Path, PathBuf};

use frink_models::{EncoderInput, KvType, Model, Pooling};
use serde_json::Value;

fn dir(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/encoders")
        .join(family)
}

fn meta(family: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir(family).join("meta.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .unwrap_or_default()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// max |a - b| / max |b|.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

fn pool(h: &[f32], d: usize, p: Pooling) -> Vec<f32> {
    let n = h.len() / d;
    match p {
        Pooling::Cls => h[..d].to_vec(),
        Pooling::Mean => (0..d)
            .map(|j| (0..n).map(|i| h[i * d + j] as f64).sum::<f64>() / n as f64)
            .map(|v| v as f32)
            .collect(),
        other => panic!("pooling {other:?}"),
    }
}

/// Each case's embedding from transformers' ids, ≤ 1e-3 relative (measured: 1.1e-6 for
/// bert, 1.5e-6 for xlmr; without the erf GELU 1.7e-4, without the final norms ~1).
fn embeddings(family: &str) -> f32 {
    let m = meta(family);
    let model = Model::load(dir(family).join("model.gguf")).unwrap();
    let d = model.config.n_embd;
    let pooling = model.config.pooling.expect("the fixture names its pooling");
    let mut worst = 0f32;
    for c in m["cases"].as_array().unwrap() {
        let tokens = ids(&c["hf_ids"]);
        let h = &model
            .encode_batch(
                &[EncoderInput {
                    tokens: &tokens,
                    token_types: &[],
                }],
                KvType::F32,
            )
            .unwrap()[0];
        let got = pool(h, d, pooling);
        let r = rel(&got, &floats(&c["embedding"]));
        worst = worst.max(r);
    }
    eprintln!("{family}: pooled embeddings ≤ {worst:.2e} relative to transformers");
    worst
}

#[test]
fn bert_embeddings_match_transformers() {
    assert!(embeddings("bert") < 1e-3);
}

#[test]
fn xlm_roberta_embeddings_match_transformers() {
    assert!(embeddings("xlmr") < 1e-3);
}

/// ModernBERT: pre-norm, RoPE with a base per layer kind, symmetric windows of ±4 on
/// the middle layer (opening the window moves the fixture's embeddings by 2–7%).
#[test]
fn modernbert_embeddings_match_transformers() {
    assert!(embeddings("modernbert") < 1e-3);
}

/// Case 0's hidden states, every row (hidden.bin), as a layer-level check.
#[test]
fn bert_hidden_states_match_transformers() {
    for family in ["bert", "xlmr", "modernbert"] {
        let m = meta(family);
        let model = Model::load(dir(family).join("model.gguf")).unwrap();
        let tokens = ids(&m["cases"][0]["hf_ids"]);
        let want: Vec<f32> = std::fs::read(dir(family).join("hidden.bin"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let input = EncoderInput {
            tokens: &tokens,
            token_types: &[],
        };
        let got = &model.encode_batch(&[input], KvType::F32).unwrap()[0];
        let r = rel(got, &want);
        eprintln!("{family}: hidden states ≤ {r:.2e}");
        assert!(r < 1e-3, "{family}: {r}");
    }
}

/// A reranker's score: the classifier head on each input's first row.
fn scores(model: &Model, cases: &[(Vec<u32>, Vec<u32>)]) -> Vec<f32> {
    let inputs: Vec<EncoderInput> = cases
        .iter()
        .map(|(t, ty)| EncoderInput {
            tokens: t,
            token_types: ty,
        })
        .collect();
    let d = model.config.n_embd;
    let first: Vec<f32> = model
        .encode_batch(&inputs, KvType::F32)
        .unwrap()
        .iter()
        .flat_map(|h| h[..d].to_vec())
        .collect();
    model.classify(&first, cases.len()).unwrap()
}

/// XLMRobertaForSequenceClassification: dense, tanh, out_proj on the `<s>` row, against
/// transformers' logits on its own pair encoding (`<s> q </s></s> d </s>`). Measured:
/// |Δ| ≤ 1.2e-6 (the scores are ~1).
#[test]
fn xlm_roberta_reranker_scores_match_transformers() {
    let m = meta("xlmr_rank");
    let model = Model::load(dir("xlmr_rank").join("model.gguf")).unwrap();
    let cases: Vec<_> = m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["hf_ids"]), Vec::new()))
        .collect();
    let got = scores(&model, &cases);
    let mut worst = 0f32;
    for (g, c) in got.iter().zip(m["cases"].as_array().unwrap()) {
        worst = worst.max((g - c["score"].as_f64().unwrap() as f32).abs());
    }
    eprintln!("xlmr_rank: scores within {worst:.2e} of transformers");
    assert!(worst < 1e-3);
}

/// BertForSequenceClassification as llama.cpp's converter writes it: the pooler (dense +
/// tanh) is dropped, only the classifier stays (`cls.output`), so the file cannot give
/// transformers' scores (they differ by 0.5–0.8 here). Checked against transformers'
/// classifier on the `[CLS]` row without the pooler, with llama.cpp's ids (its server's
/// pair layout, all token type 0), which is what the file computes; and the token types
/// of transformers' pair encoding change the score.
#[test]
fn bert_reranker_without_pooler_scores_as_its_file_says() {
    let m = meta("bert_rank");
    let model = Model::load(dir("bert_rank").join("model.gguf")).unwrap();
    let cs = m["cases"].as_array().unwrap();
    let want: Vec<f32> = m["diagnostic_rank"]["without_pooler_on_llama_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["classifier_on_cls_row_without_pooler"].as_f64().unwrap() as f32)
        .collect();
    let cases: Vec<_> = cs
        .iter()
        .map(|c| (ids(&c["llama_ids"]), Vec::new()))
        .collect();
    let got = scores(&model, &cases);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0f32, f32::max);
    eprintln!("bert_rank: scores within {worst:.2e} of the file's classifier in transformers");
    assert!(worst < 1e-3);
    let typed: Vec<_> = cs
        .iter()
        .map(|c| (ids(&c["hf_ids"]), ids(&c["hf_token_type_ids"])))
        .collect();
    let untyped: Vec<_> = typed.iter().map(|(t, _)| (t.clone(), Vec::new())).collect();
    let (a, b) = (scores(&model, &typed), scores(&model, &untyped));
    assert!(
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() > 1e-3),
        "{a:?} {b:?}"
    );
}

/// Every input's hidden states are the same bits alone and inside a batch of all cases.
#[test]
fn an_input_gives_the_same_bits_alone_and_in_a_batch() {
    for family in ["bert", "xlmr", "modernbert"] {
        let m = meta(family);
        let model = Model::load(dir(family).join("model.gguf")).unwrap();
        let all: Vec<Vec<u32>> = m["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| ids(&c["hf_ids"]))
            .collect();
        let inputs: Vec<EncoderInput> = all
            .iter()
            .map(|t| EncoderInput {
                tokens: t,
                token_types: &[],
            })
            .collect();
        let batch = model.encode_batch(&inputs, KvType::F32).unwrap();
        for (i, input) in inputs.iter().enumerate() {
            let alone = model.encode_batch(&[*input], KvType::F32).unwrap();
            assert_eq!(alone[0], batch[i], "{family} case {i}");
        }
    }
}

/// Bidirectional attention: the first row depends on the last token (a causal mask would
/// leave it as it is); token types change the rows; an input past the position table is
/// refused before anything is computed.
#[test]
fn encoder_features_change_the_output() {
    let model = Model::load(dir("bert").join("model.gguf")).unwrap();
    let d = model.config.n_embd;
    let run = |t: &[u32], ty: &[u32]| {
        model
            .encode_batch(
                &[EncoderInput {
                    tokens: t,
                    token_types: ty,
                }],
                KvType::F32,
            )
            .unwrap()
            .remove(0)
    };
    let (a, b) = (run(&[2, 202, 45, 3], &[]), run(&[2, 202, 46, 3], &[]));
    assert!(rel(&a[..d], &b[..d]) > 1e-3, "the first row sees the last");
    let c = run(&[2, 202, 45, 3], &[0, 0, 1, 1]);
    assert!(rel(&a, &c) > 1e-3, "token types");
    assert_eq!(
        run(&[2, 202, 45, 3], &[0, 0, 0, 0]),
        a,
        "type 0 is the default"
    );
    let n = model.config.n_ctx_train;
    let long = vec![5u32; n + 1];
    let err = model
        .encode_batch(
            &[EncoderInput {
                tokens: &long,
                token_types: &[],
            }],
            KvType::F32,
        )
        .unwrap_err();
    assert!(err.to_string().contains(&n.to_string()), "{err}");
    assert!(
        model.classify(&a[..d], 1).is_err(),
        "no head on an embedding model"
    );
}
