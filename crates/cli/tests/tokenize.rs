//! `frink tokenize` / `frink detokenize` end to end against the golden files: ids and texts
//! as llama.cpp recorded them, standard input read byte for byte, CONTRACT.md's boolean flag
//! spellings, and the error contract.

mod common;

use std::process::Output;

use serde_json::Value;

const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

/// Runs frink with `stdin` piped in (or an empty standard input).
fn frink(args: &[&str], stdin: Option<&[u8]>) -> Output {
    common::frink_with_stdin(args, stdin.unwrap_or(b""))
}

fn last_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("JSON last line")
}

fn golden(model: &str, file: &str, test: &str) -> Option<Value> {
    let path = frink_testdata::require(&format!("golden/{model}/{file}"), test)?;
    Some(serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
}

fn flag(name: &str, on: bool) -> String {
    format!("--{name}={on}")
}

/// A sample of every model's tokenize.json cases (all flag combinations, whitespace and
/// special-token texts) through the binary, the text given on standard input.
#[test]
fn tokenize_gives_the_golden_ids_from_stdin() {
    for model in MODELS {
        let Some(g) = golden(
            model,
            "tokenize.json",
            "tokenize_gives_the_golden_ids_from_stdin",
        ) else {
            return;
        };
        let cases = g["cases"].as_array().unwrap();
        let mut n = 0;
        for c in cases.iter().step_by(5) {
            let add = c["add_special"].as_bool().unwrap();
            let parse = c["parse_special"].as_bool().unwrap();
            let text = c["text"].as_str().unwrap();
            let out = frink(
                &[
                    "tokenize",
                    "-m",
                    model,
                    &flag("add-special", add),
                    &flag("parse-special", parse),
                    "--json",
                    "-",
                ],
                Some(text.as_bytes()),
            );
            assert_eq!(
                last_json(&out),
                c["ids"],
                "{model} {text:?} add={add} parse={parse}"
            );
            n += 1;
        }
        eprintln!("{model}: {n} tokenize.json cases through `frink tokenize -`");
    }
}

#[test]
fn tokenize_flags_follow_the_contract() {
    let Some(g) = golden(
        "gemma3-270m",
        "tokenize.json",
        "tokenize_flags_follow_the_contract",
    ) else {
        return;
    };
    let hello = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"] == "Hello world" && c["add_special"] == true)
        .expect("golden case");
    // Default add-special is the model's rule (gemma adds BOS); `=false` turns it off.
    let with = last_json(&frink(
        &["tokenize", "-m", "gemma3-270m", "--json", "Hello world"],
        None,
    ));
    assert_eq!(with, hello["ids"]);
    let without = last_json(&frink(
        &[
            "tokenize",
            "-m",
            "gemma3-270m",
            "--add-special=false",
            "--json",
            "Hello world",
        ],
        None,
    ));
    assert_eq!(
        without.as_array().unwrap()[..],
        with.as_array().unwrap()[1..]
    );
    // A bare `--parse-special` is true, and never swallows the following TEXT.
    let parsed = last_json(&frink(
        &["tokenize", "--parse-special", "--json", "<|im_start|>"],
        None,
    ));
    assert_eq!(parsed, serde_json::json!([1]));
    let literal = last_json(&frink(&["tokenize", "--json", "<|im_start|>"], None));
    assert!(literal.as_array().unwrap().len() > 1, "{literal}");
    // Standard input keeps its trailing newline; a TEXT may start with '-'.
    let lf = last_json(&frink(&["tokenize", "--json", "-"], Some(b"Hi\n")));
    let no_lf = last_json(&frink(&["tokenize", "--json", "Hi"], None));
    assert_eq!(
        lf.as_array().unwrap().len(),
        no_lf.as_array().unwrap().len() + 1
    );
    let dash = last_json(&frink(&["tokenize", "--json", "-5"], None));
    assert_eq!(dash.as_array().unwrap().len(), 2);
    // Bytes that are not UTF-8 are tokenized as llama.cpp tokenizes them (ids from
    // llama_tokenize: SentencePiece keeps the bytes, byte-level BPE reads U+FFFD per bad byte).
    let spm = last_json(&frink(
        &["tokenize", "-m", "gemma3-270m", "--json", "-"],
        Some(b"\xf0\x9f\x98A"),
    ));
    assert_eq!(spm, serde_json::json!([2, 478, 397, 390, 303]));
    let bpe = last_json(&frink(&["tokenize", "--json", "-"], Some(b"\xf0\x9f\x98A")));
    assert_eq!(bpe, serde_json::json!([24211, 24211, 24211, 49]));
    // Without --json: one `id "piece"` line per token.
    let out = frink(&["tokenize", "Hello world"], None);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "  19556 \"Hello\"\n    905 \" world\"\n"
    );
    // `--parse-special true` is two positionals: bad usage, exit 2.
    let bad = frink(&["tokenize", "--parse-special", "true", "x"], None);
    assert_eq!(bad.status.code(), Some(2));
    eprintln!("tokenize: 11 flag and input checks");
}

#[test]
fn detokenize_gives_the_golden_generated_text() {
    for model in MODELS {
        let Some(g) = golden(
            model,
            "generate.json",
            "detokenize_gives_the_golden_generated_text",
        ) else {
            return;
        };
        let cases = g["cases"].as_array().unwrap();
        for c in cases.iter().step_by(3) {
            let ids: Vec<String> = c["generated_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.to_string())
                .collect();
            let mut args = vec!["detokenize", "-m", model, "--json"];
            args.extend(ids.iter().map(String::as_str));
            let v = last_json(&frink(&args, None));
            assert_eq!(v["text"], c["generated_text"], "{model} {}", c["name"]);
            // Without --json the bytes themselves (not a terminal: no newline added).
            let raw = frink(
                &args[..args.len()]
                    .iter()
                    .filter(|a| **a != "--json")
                    .copied()
                    .collect::<Vec<_>>(),
                None,
            );
            assert_eq!(
                String::from_utf8_lossy(&raw.stdout),
                c["generated_text"].as_str().unwrap()
            );
        }
        eprintln!(
            "{model}: {} generations through `frink detokenize`",
            cases.len().div_ceil(3)
        );
    }
}

#[test]
fn bad_ids_and_models_fail_with_one_error_line() {
    let out = frink(&["detokenize", "1", "999999"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("999999"),
        "{err}"
    );
    let out = frink(&["detokenize", "x"], None);
    assert_eq!(out.status.code(), Some(1));
    let out = frink(&["tokenize", "-m", "/nonexistent/model.gguf", "hi"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
    let out = frink(&["detokenize"], None);
    assert_eq!(out.status.code(), Some(2));
    eprintln!("tokenize/detokenize: 4 error cases");
}
