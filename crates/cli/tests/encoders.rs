//! Encoder models (BERT family) end to end, on the tiny fixtures of
//! crates/models/tests/data/encoders (transformers' fp32 vectors and scores in meta.json):
//! `frink embed` and `frink rerank`, and `frink serve` through the official `openai` and
//! `ollama` Python clients (tests/encoders_e2e.py): embeddings, batches of 256 inputs,
//! Ollama's `/api/embed`, `/v1/rerank` and its refusals.

mod common;

use std::path::PathBuf;

use common::http::Server;
use common::serve::{lock, openai_venv, run_client_script};
use common::{cosine, floats, frink, last_json_line, stderr};
use serde_json::Value;

fn fixture(family: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/data/encoders")
        .join(family)
}

fn meta(family: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(family).join("meta.json")).unwrap()).unwrap()
}

fn model(family: &str) -> String {
    fixture(family)
        .join("model.gguf")
        .to_string_lossy()
        .into_owned()
}

/// `frink embed` tokenizes as llama.cpp does and gives transformers' vectors: raw
/// (`--normalize=-1`, ≤ 1e-3 relative; measured 2e-7) for the mean-pooled BERT, the
/// CLS-pooled XLM-RoBERTa and the mean-pooled ModernBERT fixture (WordPiece, Unigram and
/// byte-level BPE vocabularies), several texts in one pass.
#[test]
fn frink_embed_gives_transformers_vectors() {
    for family in ["bert", "xlmr", "modernbert"] {
        let m = meta(family);
        let cases = m["cases"].as_array().unwrap();
        let mut args = vec![
            "embed".to_string(),
            "-m".into(),
            model(family),
            "--normalize=-1".into(),
            "--json".into(),
        ];
        args.extend(
            cases
                .iter()
                .map(|c| c["text"].as_str().unwrap().to_string()),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = frink(&args);
        assert!(out.status.success(), "{family}: {}", stderr(&out));
        let got = last_json_line(&out);
        let got = got["embeddings"].as_array().unwrap();
        assert_eq!(got.len(), cases.len());
        let mut worst = 0f64;
        for (g, c) in got.iter().zip(cases) {
            assert_eq!(c["hf_ids"], c["llama_ids"], "the fixture's ids agree");
            let (g, w) = (floats(g), floats(&c["embedding"]));
            let scale = w.iter().fold(0f64, |a, x| a.max(x.abs()));
            let d = g
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f64, f64::max);
            worst = worst.max(d / scale);
        }
        eprintln!("{family}: frink embed ≤ {worst:.2e} relative to transformers");
        assert!(worst < 1e-3, "{family}: {worst}");
    }
}

/// `frink rerank` scores each document as transformers does, best first, `--top-n`
/// keeping the best; an embedding model, a shortening of a model not trained for it, a
/// text past the position table and generation on an encoder are refused naming why.
#[test]
fn frink_rerank_ranks_as_transformers_and_refusals_name_the_reason() {
    let m = meta("xlmr_rank");
    let cases = m["cases"].as_array().unwrap();
    let query = cases[0]["query"].as_str().unwrap();
    let same: Vec<&Value> = cases.iter().filter(|c| c["query"] == query).collect();
    let mut args = vec![
        "rerank".to_string(),
        "-m".into(),
        model("xlmr_rank"),
        "--query".into(),
        query.into(),
        "--json".into(),
    ];
    args.extend(
        same.iter()
            .map(|c| c["document"].as_str().unwrap().to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = frink(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let results = last_json_line(&out)["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), same.len());
    let scores: Vec<f64> = results
        .iter()
        .map(|r| r["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first");
    for r in &results {
        let i = r["index"].as_u64().unwrap() as usize;
        let want = same[i]["score"].as_f64().unwrap();
        assert!((r["relevance_score"].as_f64().unwrap() - want).abs() < 1e-3);
        assert_eq!(r["document"]["text"], same[i]["document"]);
    }
    let mut top = args.clone();
    top.extend(["--top-n", "1"]);
    let out = frink(&top);
    let best = last_json_line(&out)["results"].as_array().unwrap().clone();
    assert_eq!(best.len(), 1);
    assert_eq!(best[0]["index"], results[0]["index"]);

    let bert = model("bert");
    let out = frink(&["rerank", "-m", &bert, "--query", "q", "d"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no classifier head"),
        "{}",
        stderr(&out)
    );
    let out = frink(&["embed", "-m", &bert, "--dimensions", "8", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("Matryoshka"), "{}", stderr(&out));
    for cmd in [
        &["run", "-m", &bert, "hi"][..],
        &["logits", "-m", &bert, "--ids", "1,2", "-o", "/dev/null"],
    ] {
        let out = frink(cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        assert!(
            stderr(&out).contains("is an encoder (bert)"),
            "{}",
            stderr(&out)
        );
    }
    let long = "word ".repeat(400);
    let out = frink(&["embed", "-m", &bert, &long]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("context_length"), "{}", stderr(&out));
}

/// The HTTP APIs with the official clients (tests/encoders_e2e.py): an embedding model,
/// a reranker, concurrent requests with more inputs than `--queue` holds, and a generative
/// model asked to rerank.
#[test]
fn encoders_through_the_python_clients() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let dir = |f: &str| fixture(f).to_string_lossy().into_owned();
    for (family, mode) in [("bert", "embed"), ("xlmr_rank", "rerank")] {
        let srv = Server::start(&["-m", &model(family)]);
        run_client_script(
            &python,
            "encoders_e2e.py",
            &srv,
            &[mode, &dir(family)],
            "encoder checks passed",
        );
    }
    let srv = Server::start(&["-m", &model("bert"), "--queue", "4"]);
    run_client_script(
        &python,
        "encoders_e2e.py",
        &srv,
        &["queue"],
        "encoder checks passed",
    );
    drop(srv);
    let srv = Server::start(&[]);
    run_client_script(
        &python,
        "encoders_e2e.py",
        &srv,
        &["decoder"],
        "encoder checks passed",
    );
}

/// The catalog's real encoder, nomic-embed-text-v1.5 (nomic-bert: rotary positions,
/// SwiGLU, F16; fetched through the store), against `llama-embedding` on the same file
/// (tests/data/embeddings/encoder_reference.json, make_encoder_reference.py): cosine ≥
/// 0.999 for every text (measured: ≥ 0.9999992; llama.cpp's own flash-attention switch
/// moves it to 0.9999997). `--dimensions 256` (it is trained for Matryoshka) gives the
/// first 256 values renormalised.
#[test]
fn nomic_embed_text_matches_llama_embedding() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/embeddings/encoder_reference.json"
    );
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let mut args = vec!["embed", "-m", "nomic-embed-text-v1.5", "--json"];
    args.extend(cases.iter().map(|c| c["text"].as_str().unwrap()));
    let out = frink(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = last_json_line(&out);
    let got: Vec<Vec<f64>> = got["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    let worst = got
        .iter()
        .zip(cases)
        .map(|(g, c)| cosine(g, &floats(&c["embedding"])))
        .fold(1f64, f64::min);
    eprintln!("nomic-embed-text-v1.5: cosine to llama-embedding ≥ {worst:.7}");
    assert!(worst >= 0.999, "{worst}");
    let text = cases[0]["text"].as_str().unwrap();
    let out = frink(&[
        "embed",
        "-m",
        "nomic-embed-text-v1.5",
        "--dimensions",
        "256",
        "--json",
        text,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let short = floats(&last_json_line(&out)["embeddings"][0]);
    assert_eq!(short.len(), 256);
    let norm: f64 = short.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5);
    assert!(cosine(&short, &got[0][..256]) > 0.999_999);
}
