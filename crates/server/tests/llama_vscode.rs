//! The requests llama.vscode sends (its `src/llama-server.ts`), replayed against frink and
//! compared with what llama-server answered to the same requests
//! (`tests/data/llama_vscode.json`, made by `tests/data/llama_vscode_gen.py` with the
//! llama.cpp anchor on qwen2.5-coder-0.5b): the cache warm-up (`n_predict: 0`, `samplers:
//! []`), FIM with `samplers: ["top_k", "top_p", "infill"]`, `n_indent` and
//! `t_max_predict_ms`, and the chat edit (`samplers: "edkypmxt"`, `max_tokens: -1`). Then
//! llama.cpp's native `/completion`, streamed answers, `GET /props`.

mod common;

use common::{lock, TestServer};
use serde_json::{json, Value};

fn cases() -> Vec<Value> {
    frink_testdata::read_cases(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama_vscode.json"),
    )
}

fn server() -> TestServer {
    TestServer::start("qwen2.5-coder-0.5b", |c| {
        c.ctx = 4096;
        c.parallel = 1;
    })
}

/// Every replayed request succeeds. Where llama-server answered the same for every seed
/// (the infill sampler left one candidate at each step, or the chat edit at temperature 0),
/// frink answers that text with the same prompt length and stop type; where it did not, the
/// answer keeps `n_indent`'s rule. (llama-server reports `tokens_predicted: 1` for the
/// warm-up, the token it drew and dropped; frink draws none.)
#[test]
fn llama_vscode_requests_do_what_llama_server_does() {
    let _l = lock();
    let srv = server();
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let path = case["path"].as_str().unwrap();
        let mut body = case["request"].clone();
        body["seed"] = json!(1);
        let want = &case["answer"];
        if path == "/v1/chat/completions" {
            // llama.vscode sends it; this llama-server refuses it, frink accepts it.
            body["dry_penalty_last_n"] = json!(-1);
            let got = srv.post_ok(path, &body);
            let ch = &got["choices"][0];
            assert_eq!(ch["message"]["content"], want["content"], "{name}: {got}");
            assert_eq!(ch["finish_reason"], want["finish_reason"], "{name}");
            assert_eq!(
                got["usage"]["completion_tokens"], want["completion_tokens"],
                "{name}"
            );
            // As sent, sampling at 0.8 with no limit: it runs until the model stops.
            body["temperature"] = json!(0.8);
            let got = srv.post_ok(path, &body);
            assert_eq!(got["choices"][0]["finish_reason"], "stop", "{name}: {got}");
            continue;
        }
        let got = srv.post_ok(path, &body);
        assert_eq!(
            got["tokens_evaluated"], want["tokens_evaluated"],
            "{name}: {got}"
        );
        if name == "warmup" {
            assert_eq!(got["content"], "", "{got}");
            assert_eq!(got["tokens_predicted"], 0, "{got}");
            continue;
        }
        let content = got["content"].as_str().unwrap();
        if case["deterministic"] == true {
            assert_eq!(content, want["content"], "{name}: {got}");
            assert_eq!(got["stop_type"], want["stop_type"], "{name}");
        }
        if let Some(n) = body["n_indent"].as_u64() {
            for line in content.split('\n').skip(1) {
                let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
                assert!(
                    indent >= n as usize || line.trim().is_empty(),
                    "{name}: a line indented {indent} < {n}: {content:?}"
                );
            }
        }
    }
}

/// `t_max_predict_ms`: once a newline is written and the time is up, the answer ends
/// (`stop_type: "limit"`): with 1 ms, nothing but whitespace follows the first newline;
/// without it the same request writes on past it.
#[test]
fn t_max_predict_ms_ends_the_answer_after_a_newline() {
    let _l = lock();
    let srv = server();
    let body = json!({"input_prefix": "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        ",
                      "input_suffix": "\n", "n_predict": 64, "temperature": 0, "t_max_predict_ms": 1});
    let got = srv.post_ok("/infill", &body);
    let content = got["content"].as_str().unwrap();
    let nl = content
        .find('\n')
        .unwrap_or_else(|| panic!("no newline: {got}"));
    assert!(content[nl..].trim().is_empty(), "{got}");
    assert_eq!(got["stop_type"], "limit", "{got}");
    let mut free = body.clone();
    free.as_object_mut().unwrap().remove("t_max_predict_ms");
    let got = srv.post_ok("/infill", &free);
    let content = got["content"].as_str().unwrap();
    let nl = content.find('\n').unwrap();
    assert!(!content[nl..].trim().is_empty(), "{got}");
}

/// llama.cpp's native `/completion`: the same greedy text as `/v1/completions`, the
/// stream's pieces reassembling to it with a last line that has `stop: true` and the
/// counts, `n_probs` as `completion_probabilities`, a stop string named in
/// `stopping_word`; `/infill` streams alike; unknown samplers are a 400; `/props` reports
/// the server.
#[test]
fn native_completion_streams_and_props() {
    let _l = lock();
    let srv = server();
    let body = json!({"prompt": "def add(a, b):\n", "n_predict": 16, "temperature": 0});
    let whole = srv.post_ok("/completion", &body);
    let v1 = srv.post_ok(
        "/v1/completions",
        &json!({"prompt": "def add(a, b):\n", "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(whole["content"], v1["choices"][0]["text"], "{whole}");
    assert_eq!(whole["tokens_predicted"], 16);
    assert_eq!(whole["stop_type"], "limit");
    for path in ["/completion", "/infill"] {
        let mut b = body.clone();
        if path == "/infill" {
            b = json!({"input_prefix": "def add(a, b):\n", "input_suffix": "\n", "n_predict": 16,
                       "temperature": 0});
        }
        let plain = srv.post_ok(path, &b);
        b["stream"] = json!(true);
        let (chunks, _) = srv.stream(path, &b).collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["content"].as_str())
            .collect();
        assert_eq!(text, plain["content"].as_str().unwrap(), "{path}");
        let last = chunks.last().unwrap();
        assert_eq!(last["stop"], true, "{path}: {last}");
        assert_eq!(last["tokens_predicted"], plain["tokens_predicted"]);
        assert!(chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["stop"] == false));
    }
    // llama.cpp's precedence: n_predict first, max_tokens only without it.
    for (fields, n) in [
        (json!({"n_predict": 3, "max_tokens": -1}), 3),
        (json!({"n_predict": 0, "max_tokens": 5}), 0),
        (json!({"max_tokens": 2}), 2),
    ] {
        let mut b = json!({"prompt": "def add(a, b):\n", "temperature": 0});
        for (k, v) in fields.as_object().unwrap() {
            b[k] = v.clone();
        }
        let got = srv.post_ok("/completion", &b);
        assert_eq!(got["tokens_predicted"], n, "{fields}: {got}");
    }
    let probs = srv.post_ok(
        "/completion",
        &json!({"prompt": "The capital of France is", "n_predict": 3, "temperature": 0, "n_probs": 2}),
    );
    let p = probs["completion_probabilities"].as_array().unwrap();
    assert_eq!(p.len(), 3, "{probs}");
    assert_eq!(p[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(p[0]["top_logprobs"][0]["id"], p[0]["id"], "{probs}");
    let stopped = srv.post_ok(
        "/completion",
        &json!({"prompt": "Count: 1, 2, 3,", "n_predict": 32, "temperature": 0, "stop": [" 6"]}),
    );
    assert_eq!(stopped["stop_type"], "word", "{stopped}");
    assert_eq!(stopped["stopping_word"], " 6");
    let r = srv.request(
        "POST",
        "/completion",
        Some(&json!({"prompt": "x", "samplers": ["top_k", "mirostat"]}).to_string()),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "samplers");
    let props = srv.request("GET", "/props", None).json();
    assert_eq!(props["total_slots"], 1, "{props}");
    assert_eq!(props["default_generation_settings"]["n_ctx"], 4096);
    assert!(props["chat_template"]
        .as_str()
        .unwrap()
        .contains("im_start"));
}
