//! Fill-in-the-middle against llama-server: `tests/data/infill.json` holds llama-server's
//! greedy `/infill` answers on qwen2.5-coder-0.5b (the llama.cpp anchor, `-c 4096 -np 1`;
//! a plain prefix and suffix, a started middle, repository context in `input_extra`, an
//! empty suffix). frink's `/infill` gives the same tokens from a prompt of the same length;
//! `suffix` on `/v1/completions` and Ollama's `/api/generate` the same text; a model
//! without FIM tokens is a 400 that says so.

mod common;

use serde_json::Value;

fn cases() -> Vec<Value> {
    frink_testdata::read_cases(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/data/infill.json"),
    )
}

/// `frink run --fim-prefix … --fim-suffix … [MIDDLE]` builds the same prompt and gives the
/// same tokens as llama-server's `/infill`.
#[test]
fn run_fills_in_the_middle() {
    for case in cases() {
        let req = &case["request"];
        if req.get("input_extra").is_some() {
            continue;
        }
        let n = req["n_predict"].to_string();
        let mut args = vec![
            "run",
            "-m",
            "qwen2.5-coder-0.5b",
            "--json",
            "--greedy",
            "-t",
            "2",
            "-n",
            &n,
            "--fim-prefix",
            req["input_prefix"].as_str().unwrap(),
            "--fim-suffix",
            req["input_suffix"].as_str().unwrap(),
        ];
        if let Some(middle) = req["prompt"].as_str() {
            args.push(middle);
        }
        let out = common::frink(&args);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let v = common::last_json_line(&out);
        let name = &case["name"];
        assert_eq!(v["ids"], case["tokens"], "{name}");
        assert_eq!(
            v["prompt_ids"].as_array().unwrap().len() as u64,
            case["tokens_evaluated"].as_u64().unwrap(),
            "{name}"
        );
    }
}
