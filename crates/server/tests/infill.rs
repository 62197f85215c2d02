//! Fill-in-the-middle against llama-server over HTTP (in-process): `tests/data/infill.json`
//! holds llama-server's greedy `/infill` answers on qwen2.5-coder-0.5b (the llama.cpp
//! anchor, `-c 4096 -np 1`; a plain prefix and suffix, a started middle, repository
//! context in `input_extra`, an empty suffix). frink's `/infill` gives the same tokens from
//! a prompt of the same length; `suffix` on `/v1/completions` and Ollama's `/api/generate`
//! the same text; a model without FIM tokens is a 400 that says so.

mod common;

use common::{lock, TestServer};
use serde_json::{json, Value};

fn cases() -> Vec<Value> {
    frink_testdata::read_cases(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/infill.json"),
    )
}

#[test]
fn infill_gives_llama_servers_tokens() {
    let _l = lock();
    let srv = TestServer::start("qwen2.5-coder-0.5b", |c| {
        c.ctx = 4096;
        c.parallel = 1;
    });
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let mut body = case["request"].clone();
        body["temperature"] = json!(0);
        body["return_tokens"] = json!(true);
        let got = srv.post_ok("/infill", &body);
        assert_eq!(
            got["tokens_evaluated"], case["tokens_evaluated"],
            "{name}: {got}"
        );
        assert_eq!(got["tokens"], case["tokens"], "{name}: {got}");
        assert_eq!(got["content"], case["content"], "{name}");
        assert_eq!(got["stop_type"], case["stop_type"], "{name}");

        // The same gap through the OpenAI and Ollama fields (no started middle or extra
        // files there: the prompt is the prefix).
        let req = &case["request"];
        let suffix = req["input_suffix"].as_str().unwrap();
        if req.get("prompt").is_some() || req.get("input_extra").is_some() || suffix.is_empty() {
            continue;
        }
        let n = req["n_predict"].clone();
        let v = srv.post_ok(
            "/v1/completions",
            &json!({"prompt": req["input_prefix"], "suffix": suffix, "max_tokens": n,
                    "temperature": 0}),
        );
        assert_eq!(v["choices"][0]["text"], case["content"], "{name}: {v}");
        assert_eq!(
            v["usage"]["prompt_tokens"], case["tokens_evaluated"],
            "{name}"
        );
        let o = srv.post_ok(
            "/api/generate",
            &json!({"model": "m", "prompt": req["input_prefix"], "suffix": suffix,
                    "stream": false, "options": {"temperature": 0, "num_predict": n}}),
        );
        assert_eq!(o["response"], case["content"], "{name}: {o}");
    }
    // Refused with the field named: a malformed input_extra, a suffix after token ids.
    let r = srv.request(
        "POST",
        "/infill",
        Some(&json!({"input_prefix": "a", "input_extra": [{"filename": "x"}]}).to_string()),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("input_extra"), "{}", r.text());
    let r = srv.request(
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": [1, 2, 3], "suffix": "x"}).to_string()),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn a_model_without_fim_tokens_is_refused_by_name() {
    let _l = lock();
    // SmolLM2's vocabulary has no FIM tokens.
    let srv = TestServer::start("smollm2-135m", |_| {});
    for (path, body) in [
        (
            "/infill",
            json!({"input_prefix": "def f(", "input_suffix": "\n"}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "def f(", "suffix": "\n", "max_tokens": 2}),
        ),
    ] {
        let r = srv.request("POST", path, Some(&body.to_string()));
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(
            r.text().contains("fill-in-the-middle"),
            "{path}: {}",
            r.text()
        );
    }
}

/// `n_probs` on `/infill` gives each token's alternatives, as on `/completion` (it was
/// ignored: no `completion_probabilities`).
#[test]
fn infill_reports_token_probabilities() {
    let _l = lock();
    let srv = TestServer::start("qwen2.5-coder-0.5b", |c| {
        c.ctx = 4096;
        c.parallel = 1;
    });
    let body = json!({"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n",
                      "n_predict": 3, "n_probs": 2, "temperature": 0});
    let v = srv.post_ok("/infill", &body);
    let probs = v["completion_probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("no completion_probabilities: {v}"));
    assert_eq!(
        probs.len() as u64,
        v["tokens_predicted"].as_u64().unwrap(),
        "{v}"
    );
    assert!(
        probs
            .iter()
            .all(|p| p["top_logprobs"].as_array().is_some_and(|a| a.len() == 2)),
        "{v}"
    );
    let plain = srv.post_ok("/infill", &json!({"input_prefix": "x", "n_predict": 1}));
    assert!(plain.get("completion_probabilities").is_none(), "{plain}");
}
