//! Images through the HTTP APIs on the tiny Qwen2.5-VL fixture
//! (crates/vision/tests/data/qwen25vl, transformers' reference; its rows take multimodal
//! RoPE positions in the language model): llama.cpp's `/completion`, OpenAI's and
//! Ollama's chats give transformers' greedy tokens, and a follow-up turn that reuses the
//! image's cached rows answers as a fresh server does.

mod common;

use std::path::PathBuf;

use common::TestServer;
use serde_json::{json, Value};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/qwen25vl")
}

fn meta() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("meta.json")).unwrap()).unwrap()
}

fn b64(file: &str) -> String {
    base64::encode(std::fs::read(dir().join(file)).unwrap())
}

fn server() -> TestServer {
    let mut c = common::config_at("qwen25vl", dir().join("model.gguf"));
    c.parallel = 1;
    c.mmproj = Some(dir().join("mmproj-model.gguf"));
    TestServer::start_with(c)
}

fn user_parts(files: &[&str], text: &str) -> Value {
    let mut parts: Vec<Value> = files
        .iter()
        .map(|f| {
            json!({"type": "image_url",
                   "image_url": {"url": format!("data:image/png;base64,{}", b64(f))}})
        })
        .collect();
    parts.push(json!({"type": "text", "text": text}));
    json!({"role": "user", "content": parts})
}

fn openai_chat(srv: &TestServer, messages: Value, n: usize) -> Value {
    srv.post_ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "temperature": 0, "max_tokens": n}),
    )
}

/// One image and two images before the text, through `/completion` (the processor's
/// rendered text with llama.cpp's marker), OpenAI's chat (data URIs) and Ollama's chat
/// (base64): the processor's prompt and transformers' greedy tokens on every API (its
/// `greedy_full_attention`: frink reads the file's windows as llama.cpp does, 112 pixels,
/// which cover every fixture image).
#[test]
fn qwen25vl_through_every_api() {
    let _l = common::lock();
    let m = meta();
    let srv = server();
    for key in ["square", "two"] {
        let p = &m["prompts"][key];
        let files: Vec<&str> = p["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let images: Vec<String> = files.iter().map(|f| b64(f)).collect();
        let rendered = p["rendered"]
            .as_str()
            .unwrap()
            .replace("<|vision_start|><|image_pad|><|vision_end|>", "<__media__>");
        let c = srv.post_ok(
            "/completion",
            &json!({"prompt": {"prompt_string": rendered, "multimodal_data": images},
                    "temperature": 0, "n_predict": 8, "return_tokens": true}),
        );
        assert_eq!(
            c["tokens"], p["greedy_full_attention"],
            "{key}: /completion"
        );
        let want = c["content"].as_str().unwrap().to_string();
        let text = p["text"].as_str().unwrap();
        let oa = openai_chat(&srv, json!([user_parts(&files, text)]), 8);
        assert_eq!(common::message(&oa), want, "{key}: OpenAI chat");
        assert_eq!(
            oa["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            p["input_ids"].as_array().unwrap().len(),
            "{key}: prompt tokens"
        );
        let ol = srv.post_ok(
            "/api/chat",
            &json!({"model": "qwen25vl", "stream": false,
                    "options": {"temperature": 0, "num_predict": 8},
                    "messages": [{"role": "user", "content": text, "images": images}]}),
        );
        assert_eq!(
            ol["message"]["content"].as_str().unwrap(),
            want,
            "{key}: Ollama chat"
        );
    }
}

/// A second turn about the same image reuses its cached rows (`cached_tokens` past the
/// image), and its answer, whose text after the image takes positions shifted back by the
/// image, is the one a fresh server gives with nothing cached.
#[test]
fn qwen25vl_follow_up_turn_reuses_the_image_and_answers_as_fresh() {
    let _l = common::lock();
    let first = user_parts(&["odd.png"], "Describe it.");
    let srv = server();
    let a = openai_chat(&srv, json!([first]), 6);
    let turn2 = json!([first, {"role": "assistant", "content": common::message(&a)},
                       {"role": "user", "content": "And the colours?"}]);
    let b = openai_chat(&srv, turn2.clone(), 6);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The image's 35 rows are positions 37 to 71 of the prompt.
    assert!(cached >= 72, "cached {cached}: {b}");
    drop(srv);
    let fresh = server();
    let c = openai_chat(&fresh, turn2, 6);
    assert_eq!(
        c["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(0)
    );
    assert_eq!(common::message(&b), common::message(&c));
}

/// A server with a projector file reads bodies past axum's 2 MB default (its own limit is
/// 24 MiB): a 3 MB image that is not an image is a JSON 400 naming the part, not a
/// plain-text 413 (an attacker's 3 MB phone photo was cut off).
#[test]
fn qwen25vl_bodies_past_2_mb_are_read() {
    let _l = common::lock();
    let srv = server();
    let noise = "QUFB".repeat(3 << 18); // 3 MiB of base64
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{noise}")}},
        {"type": "text", "text": "hi"}]}], "max_tokens": 2});
    let r = srv.request("POST", "/v1/chat/completions", Some(&body.to_string()));
    assert_eq!(r.status, 400, "{}", r.text());
    let body: Value = serde_json::from_str(&r.text()).unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("image"),
        "{body}"
    );
}
