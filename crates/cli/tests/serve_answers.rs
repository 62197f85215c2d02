//! `frink serve`'s answers through the official clients and the answer readers (the real
//! binary over HTTP): the `openai` and `ollama` Python packages, structured output, tool
//! calls in every format, reasoning, embeddings and Ollama's API. Tests run one at a time
//! (a lock), each with its own server.

mod common;

use common::http::Server;
use common::serve::{lock, openai_venv, run_client_script};
use common::{frink, last_json_line, stderr};
use serde_json::{json, Value};
#[test]
fn openai_python_client_end_to_end() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let srv = Server::start(&[]);
    run_client_script(&python, "openai_e2e.py", &srv, &[], "checks passed");
}

/// Structured output with the official `openai` client (tests/structured_e2e.py) on two
/// catalog models, one with a 49k and one with a 152k vocabulary: 33 JSON schemas of
/// real-world shapes and 7 grammars (4 Lark, 3 GBNF), each greedy and with three seeds;
/// every answer that ends with `stop` parses and validates (`jsonschema`) or matches, at
/// least 95% end with `stop` (measured: 160 of 160 on both; 144 of 148 before JSON
/// whitespace was bounded), and unsupported schema features, GBNF token references,
/// malformed grammars and `response_format`s are 400s naming the field. Before
/// constrained decoding, these requests got 200 and free text.
#[test]
fn structured_output_with_the_openai_client() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    for model in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let srv = Server::start(&["-m", model, "--parallel", "4"]);
        eprintln!("{model}:");
        run_client_script(
            &python,
            "structured_e2e.py",
            &srv,
            &[model],
            "structured checks passed",
        );
    }
}

/// Tool calling with the official `openai` client on qwen2.5-coder-0.5b (its template
/// teaches Hermes `<tool_call>` calls; tests/tools_e2e.py): a two-turn tool loop streamed
/// and not, streamed deltas equal to the whole `tool_calls`, and `tool_choice: "required"`
/// or a named function giving a call whose arguments validate against the tool's schema in
/// each of 100 sampled runs (measured: 100 of 100; before, `tools` was refused with a 400).
#[test]
fn tool_calls_with_the_openai_client() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let model = "qwen2.5-coder-0.5b";
    let srv = Server::start(&["-m", model, "--parallel", "4"]);
    run_client_script(
        &python,
        "tools_e2e.py",
        &srv,
        &[model],
        "tool checks passed",
    );
}

/// Anthropic's Messages API with the official `anthropic` client on qwen2.5-coder-0.5b
/// (tests/anthropic_e2e.py), the key given as `x-api-key`: a message with a system
/// prompt, the same greedy text and token count as `/v1/chat/completions` for the same
/// conversation, the streamed events reassembled to it, `count_tokens` equal to the prompt
/// `/v1/chat/completions` reports, a stop sequence reported by name, a prefill continued,
/// a tool loop (`tool_choice` `any` and named, streamed calls equal to whole ones, a
/// `tool_result` answered in text), `output_config.format` held to its schema, and errors
/// (an image block, a wrong key) in Anthropic's shape. Before, every route was a 404.
#[test]
fn anthropic_python_client_end_to_end() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let model = "qwen2.5-coder-0.5b";
    let srv = Server::start(&["-m", model, "--api-key", "sekrit"]);
    run_client_script(&python, "anthropic_e2e.py", &srv, &[model], "checks passed");
}

/// OpenAI's Responses API with the official `openai` client on qwen2.5-coder-0.5b
/// (tests/responses_e2e.py): a plain response with the same greedy text and token counts
/// as `/v1/chat/completions`, the stream read by the SDK's own accumulator (which checks
/// every item's identity) to the same text, `text.format` held to a JSON schema, a
/// function-call loop continued with `previous_response_id` equal to the chat endpoint's
/// answer for the same history, retrieval, deletion (then a 404, also as a
/// `previous_response_id`), `store: false`, cancel, and refusals by name. Before, every
/// route was a 404.
#[test]
fn responses_with_the_openai_client() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let model = "qwen2.5-coder-0.5b";
    let srv = Server::start(&["-m", model]);
    run_client_script(&python, "responses_e2e.py", &srv, &[model], "checks passed");
}

/// `/v1/embeddings` and llama-server's `/embeddings`: 16 inputs in one request give the
/// vectors each gives alone (and `frink embed` gives), bit for bit: an embedding does not
/// depend on its batch; base64 holds the same floats; `dimensions` other than the model's
/// and an empty input are 400s naming the field.
#[test]
fn embeddings_are_batch_invariant_and_match_frink_embed() {
    let _l = lock();
    let srv = Server::start(&["--parallel", "8"]);
    let texts: Vec<String> = (0..16)
        .map(|i| {
            format!(
                "Sentence number {i} about {}.",
                ["cats", "rust", "rain", "chess"][i % 4]
            )
        })
        .collect();
    let all = srv.post_ok("/v1/embeddings", &json!({"model": "x", "input": texts}));
    let data = all["data"].as_array().unwrap();
    assert_eq!(data.len(), 16);
    assert!(all["usage"]["prompt_tokens"].as_u64().unwrap() > 16);
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(data[i]["index"], i);
        let one = srv.post_ok("/v1/embeddings", &json!({"input": t}));
        assert_eq!(
            one["data"][0]["embedding"], data[i]["embedding"],
            "input {i}"
        );
    }
    let cli = frink(&["embed", "--json", &texts[3]]);
    assert!(cli.status.success(), "{}", stderr(&cli));
    assert_eq!(last_json_line(&cli)["embeddings"][0], data[3]["embedding"]);
    // base64: the little-endian f32 bytes of the same vector.
    let b = srv.post_ok(
        "/v1/embeddings",
        &json!({"input": texts[3], "encoding_format": "base64"}),
    );
    let floats: Vec<Value> = data[3]["embedding"].as_array().unwrap().clone();
    let b64 = b["data"][0]["embedding"].as_str().unwrap();
    let bytes = decode_base64(b64);
    assert_eq!(bytes.len(), floats.len() * 4);
    for (k, f) in floats.iter().enumerate() {
        let x = f32::from_le_bytes(bytes[k * 4..k * 4 + 4].try_into().unwrap());
        assert_eq!(x as f64, f.as_f64().unwrap() as f32 as f64);
    }
    // llama-server's shape.
    let l = srv.post_ok("/embeddings", &json!({"content": texts[3]}));
    assert_eq!(l[0]["embedding"][0], data[3]["embedding"]);
    for (body, param) in [
        (json!({"input": "x", "dimensions": 7}), "dimensions"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input"),
        (json!({"model": "x"}), "input"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
    ] {
        let r = srv.request("POST", "/v1/embeddings", Some(&body.to_string()));
        let v = r.json();
        assert_eq!(r.status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
}

/// Standard base64 (with padding) decoded, for the test above.
fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    } as u32;
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk
            .iter()
            .map(|&c| if c == b'=' { 0 } else { val(c) })
            .fold(0u32, |acc, v| (acc << 6) | v);
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    out
}

/// Ollama's API with the official `ollama` Python client (tests/ollama_e2e.py) on
/// qwen2.5-coder-0.5b: chat streamed and not (greedy: the same answer as
/// /v1/chat/completions), generate (templated and raw), list, show, ps, embed and the
/// legacy embeddings, pull of a catalog name, `format` with a schema, a tool call with
/// object arguments and its result in the history, images refused.
#[test]
fn ollama_python_client_end_to_end() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let model = "qwen2.5-coder-0.5b";
    let srv = Server::start(&["-m", model, "--parallel", "2"]);
    run_client_script(
        &python,
        "ollama_e2e.py",
        &srv,
        &[model],
        "ollama checks passed",
    );
}

/// Images with the official `openai` and `ollama` Python clients (tests/vision_e2e.py) on
/// the tiny Qwen2.5-VL fixture: a data URI and base64 give llama.cpp `/completion`'s
/// answer (transformers' tokens), a second turn reuses the image's cached rows, two
/// images in one message, an image past `--image-max-pixels` and a URL without
/// `--allow-image-urls` refused; the same model without its projector file refuses images
/// naming the model.
#[test]
fn vision_python_clients_end_to_end() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/qwen25vl");
    let at = |f: &str| d.join(f).to_string_lossy().into_owned();
    let (model, mmproj, dir) = (at("model.gguf"), at("mmproj-model.gguf"), at(""));
    let srv = Server::start(&[
        "-m",
        &model,
        "--mmproj",
        &mmproj,
        "--image-max-pixels",
        "10000",
        "--parallel",
        "1",
    ]);
    run_client_script(
        &python,
        "vision_e2e.py",
        &srv,
        &[&dir],
        "vision checks passed",
    );
    drop(srv);
    let srv = Server::start(&["-m", &model]);
    run_client_script(
        &python,
        "vision_e2e.py",
        &srv,
        &[&dir, "--text-only"],
        "vision checks passed",
    );
}
