//! `frink serve --context-shift` end to end on the catalog models: with `--ctx 256`, 768
//! greedy tokens complete (every log-probability finite, no token repeated more than 8
//! times in a row) and `/metrics` counts the shifts; without the flag (the default) the
//! answer ends at the context with `length`. A model whose cache cannot be shifted is
//! refused at start, naming why.

mod common;

use common::http::Server;
use common::serve::lock;
use serde_json::{json, Value};

const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

fn complete(srv: &Server, n: usize) -> Value {
    srv.post_ok(
        "/completion",
        &json!({
            "prompt": "The history of the printing press",
            "n_predict": n,
            "temperature": 0,
            "ignore_eos": true,
            "return_tokens": true,
            "n_probs": 1,
        }),
    )
}

/// The longest run of one token.
fn longest_run(ids: &[u64]) -> usize {
    let (mut best, mut run) = (0, 0);
    for (i, id) in ids.iter().enumerate() {
        run = if i > 0 && ids[i - 1] == *id {
            run + 1
        } else {
            1
        };
        best = best.max(run);
    }
    best
}

#[test]
fn long_generations_shift_the_context_on_every_catalog_model() {
    let _g = lock();
    for model in MODELS {
        let srv = Server::start(&[
            "-m",
            model,
            "--ctx",
            "256",
            "--parallel",
            "1",
            "--context-shift",
        ]);
        let r = complete(&srv, 768);
        let ids: Vec<u64> = r["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(ids.len(), 768, "{model}: {}", r["stop_type"]);
        assert_eq!(r["stop_type"], "limit", "{model}");
        // llama.cpp's flag for an answer that went past the context.
        assert_eq!(r["truncated"], true, "{model}");
        let probs = r["completion_probabilities"].as_array().unwrap();
        assert_eq!(probs.len(), 768, "{model}");
        for p in probs {
            let lp = p["logprob"].as_f64();
            assert!(lp.is_some_and(f64::is_finite), "{model}: {p}");
        }
        let run = longest_run(&ids);
        let shifts = srv.metric("frink_context_shifts_total");
        eprintln!("{model}: 768 tokens, {shifts} shifts, longest run of one token {run}");
        assert!(run <= 8, "{model}: a token repeated {run} times in a row");
        assert!(shifts >= 4.0, "{model}: {shifts} shifts");
    }
}

#[test]
fn without_the_flag_the_answer_ends_at_the_context() {
    let _g = lock();
    let srv = Server::start(&["--ctx", "256", "--parallel", "1"]);
    let r = complete(&srv, 768);
    let n = r["tokens"].as_array().unwrap().len();
    let prompt = r["tokens_evaluated"].as_u64().unwrap() as usize;
    assert_eq!(
        prompt + n,
        257,
        "the context's last token is sampled, not evaluated"
    );
    assert_eq!(r["stop_type"], "limit");
    assert_eq!(r["truncated"], false);
    assert_eq!(srv.metric("frink_context_shifts_total"), 0.0);
}

#[test]
fn a_model_whose_cache_cannot_shift_is_refused_at_start() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/mamba", "context shift refused") else {
        return;
    };
    let m = dir.join("model.gguf");
    let out = common::frink(&[
        "serve",
        "--port",
        "0",
        "-m",
        m.to_str().unwrap(),
        "--context-shift",
    ]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--context-shift") && err.contains("recurrent"),
        "{err}"
    );
}

/// Ollama's `num_ctx` is the context a request shifts at, and `num_keep` the prompt
/// tokens each shift keeps (after the BOS): the number of shifts shows both.
#[test]
fn ollama_num_ctx_and_num_keep_decide_the_shifts() {
    let _g = lock();
    let srv = Server::start(&["--ctx", "256", "--parallel", "1", "--context-shift"]);
    let mut before = 0.0;
    for num_keep in [5i64, -1] {
        let r = srv.post_ok(
            "/api/generate",
            &json!({
                "model": "smollm2-135m",
                "prompt": "Write a very long story about a dragon.",
                "stream": false,
                "options": {"num_ctx": 128, "num_keep": num_keep, "num_predict": 400, "temperature": 0},
            }),
        );
        let shifts = srv.metric("frink_context_shifts_total") - before;
        before += shifts;
        let (prompt, n) = (
            r["prompt_eval_count"].as_u64().unwrap() as usize,
            r["eval_count"].as_u64().unwrap() as usize,
        );
        eprintln!("num_keep {num_keep}: prompt {prompt}, {n} tokens, {shifts} shifts");
        if r["done_reason"] != "length" {
            // The model ended its answer first (a machine whose kernels round otherwise).
            continue;
        }
        assert_eq!(n, 400);
        // smollm2's prompts start with its BOS, which every shift keeps besides num_keep.
        let keep = if num_keep < 0 {
            prompt
        } else {
            num_keep as usize + 1
        };
        let discard = (128 - keep) / 2;
        let want = (prompt + n - 1 - 128).div_ceil(discard);
        assert_eq!(shifts as usize, want, "num_keep {num_keep}");
    }
}
