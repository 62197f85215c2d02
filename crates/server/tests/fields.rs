//! The server's request fields over HTTP (in-process, smollm2-135m): malformed requests,
//! every field OpenAI's and llama.cpp's APIs define honoured, refused or informational
//! (docs/server.md's table), penalties, probabilities and the template's variables. Tests
//! run one at a time (a lock), each with its own server.

mod common;

use common::{chat, lock, message, TestServer};
use serde_json::{json, Value};

#[test]
fn malformed_requests_get_4xx_and_the_server_keeps_serving() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |c| {
        c.ctx = 64;
    });
    let long = "word ".repeat(200);
    let bad: Vec<(&str, String)> = vec![
        ("/v1/chat/completions", "{".into()),
        ("/v1/chat/completions", "not json".into()),
        ("/v1/chat/completions", "[1, 2]".into()),
        ("/v1/chat/completions", "".into()),
        ("/v1/chat/completions", json!({}).to_string()),
        ("/v1/chat/completions", json!({"messages": []}).to_string()),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}).to_string(),
        ),
        ("/v1/chat/completions", json!({"messages": [1]}).to_string()),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "hi"}]}).to_string(),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 5}]}).to_string(),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"max_tokens": 0})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"max_tokens": -5})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"max_tokens": "ten"})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"max_tokens": 1.5})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"temperature": -1})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"temperature": "hot"})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"top_p": 2})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"stop": 5})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"stop": ["a", 1]})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"stream": "yes"})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"seed": "x"})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"n": 0})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"logprobs": true, "top_logprobs": 50})).to_string(),
        ),
        (
            "/v1/chat/completions",
            chat("hi", json!({"stream_options": 1})).to_string(),
        ),
        ("/v1/chat/completions", chat(&long, json!({})).to_string()),
        ("/v1/completions", json!({"prompt": long}).to_string()),
        ("/v1/completions", json!({"prompt": 12}).to_string()),
        (
            "/v1/completions",
            json!({"prompt": [1, 999999999]}).to_string(),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": "many"}).to_string(),
        ),
        ("/tokenize", json!({"content": 3}).to_string()),
    ];
    assert_eq!(bad.len(), 31);
    for (path, body) in &bad {
        let r = srv.post_raw(path, body.as_bytes());
        assert!(
            (400..500).contains(&r.status),
            "{path} {body:.80}: {} {}",
            r.status,
            r.text()
        );
        let e = r.json();
        let err = &e["error"];
        assert!(err["message"].is_string(), "{e}");
        assert_eq!(err["type"], "invalid_request_error", "{e}");
        assert!(
            err.get("param").is_some() && err.get("code").is_some(),
            "{e}"
        );
    }
    // The too-long prompt names both lengths.
    let r = srv.post_raw(
        "/v1/completions",
        json!({"prompt": long}).to_string().as_bytes(),
    );
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("201") && msg.contains("64"), "{msg}");
    // A wrong method and an unknown path: 405 and 404, with the same error shape.
    for (method, path, status) in [
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
        ("GET", "/v1/nothing", 404),
    ] {
        let r = srv.request(method, path, None);
        assert_eq!(r.status, status, "{method} {path}: {}", r.text());
        assert_eq!(
            r.json()["error"]["type"],
            "invalid_request_error",
            "{}",
            r.text()
        );
    }
    // Unknown fields are ignored; the next valid request succeeds.
    let v = srv.post_ok(
        "/v1/chat/completions",
        &chat(
            "Hi",
            json!({"max_tokens": 3, "some_new_field": {"x": 1}, "model": "anything"}),
        ),
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
}

/// CONTRACT.md (HTTP): every field OpenAI's or llama.cpp's API defines is honoured, refused
/// with a 400 naming it, or informational. Each refused field with a value that asks for
/// something is a 400 with `param` = the field (before this list existed, every one of
/// them was a 200 with an unconstrained answer); with its neutral value, and each
/// informational field with any value, the answer is the plain greedy one. docs/server.md's
/// table names every field.
#[test]
fn every_defined_request_field_is_honoured_refused_or_informational() {
    use frink_server::api::{Defined, Treatment, FIELDS};
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/server.md"),
    )
    .unwrap();
    for f in FIELDS {
        assert!(
            readme.contains(&format!("`{}`", f.name)),
            "docs/server.md's field table lacks `{}`",
            f.name
        );
    }
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |_| {});
    let base = |defined: Defined| -> (&'static str, Value) {
        if defined == Defined::Completions {
            (
                "/v1/completions",
                json!({"prompt": "The sky is", "temperature": 0, "max_tokens": 8}),
            )
        } else {
            (
                "/v1/chat/completions",
                chat(
                    "Why is the sky blue?",
                    json!({"temperature": 0, "max_tokens": 8}),
                ),
            )
        }
    };
    let text = |v: &Value| -> String {
        let c = &v["choices"][0];
        c["message"]["content"]
            .as_str()
            .or(c["text"].as_str())
            .unwrap_or_else(|| panic!("no text in {v}"))
            .to_string()
    };
    let mut plain = std::collections::HashMap::new();
    for d in [Defined::Chat, Defined::Completions] {
        let (path, body) = base(d);
        plain.insert(path, text(&srv.post_ok(path, &body)));
    }
    let (mut refused, mut informational) = (0, 0);
    for f in FIELDS {
        let (path, body) = base(f.defined);
        let with = |v: &Value| {
            let mut b = body.clone();
            b[f.name] = v.clone();
            b
        };
        match f.treatment {
            Treatment::Honoured => {}
            Treatment::Refused { .. } => {
                refused += 1;
                let (bad, neutral) = refused_sample(f.name);
                let r = srv.post_raw(path, with(&bad).to_string().as_bytes());
                assert_eq!(r.status, 400, "{} = {bad}: {}", f.name, r.text());
                let e = r.json();
                assert_eq!(e["error"]["param"], f.name, "{e}");
                assert_eq!(e["error"]["code"], "unsupported_field", "{e}");
                if let Some(n) = neutral {
                    let got = srv.post_ok(path, &with(&n));
                    assert_eq!(text(&got), plain[path], "{} = {n}", f.name);
                }
            }
            Treatment::Informational => {
                informational += 1;
                let v = informational_sample(f.name);
                let got = srv.post_ok(path, &with(&v));
                assert_eq!(text(&got), plain[path], "{} = {v}", f.name);
            }
        }
    }
    eprintln!("{refused} refused and {informational} informational fields checked");
    assert!(refused >= 21 && informational >= 15);
}

/// llama.cpp's `repeat_last_n` is honoured (0 turns the penalty off: the plain answer; 64
/// penalizes, and the answer changes) and `n_probs` alone asks for log-probabilities on
/// both endpoints.
#[test]
fn repeat_last_n_and_n_probs_are_honoured() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |_| {});
    let prompt = "Write the word apple ten times.";
    let ask = |extra: Value| {
        let mut e = json!({"temperature": 0, "max_tokens": 24});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        message(&srv.post_ok("/v1/chat/completions", &chat(prompt, e)))
    };
    let plain = ask(json!({}));
    assert_eq!(
        ask(json!({"repeat_penalty": 1.5, "repeat_last_n": 0})),
        plain
    );
    assert_ne!(
        ask(json!({"repeat_penalty": 1.5, "repeat_last_n": 64})),
        plain
    );
    let r = srv.post_raw(
        "/v1/chat/completions",
        chat(prompt, json!({"repeat_last_n": -2}))
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 400);
    let got = srv.post_ok(
        "/v1/chat/completions",
        &chat(
            prompt,
            json!({"temperature": 0, "max_tokens": 4, "n_probs": 2}),
        ),
    );
    let lp = &got["choices"][0]["logprobs"]["content"];
    assert_eq!(lp.as_array().map(Vec::len), Some(4), "{got}");
    assert_eq!(
        lp[0]["top_logprobs"].as_array().map(Vec::len),
        Some(2),
        "{got}"
    );
    let got = srv.post_ok(
        "/v1/completions",
        &json!({"prompt": "The sky is", "temperature": 0, "max_tokens": 4, "n_probs": 2}),
    );
    assert!(got["choices"][0]["logprobs"].is_object(), "{got}");
}

/// OpenAI's `reasoning_effort` (and the Responses API's `reasoning.effort`, Anthropic's
/// `output_config.effort`) reaches a template that reads `reasoning_effort` as that
/// variable, changing the prompt; on a template without it, each is a 400 naming it.
/// Before, `reasoning_effort` was refused on every template.
#[test]
fn reasoning_effort_is_the_templates_variable() {
    let _l = lock();
    let template =
        "Q: {{ messages[-1].content }} effort={{ reasoning_effort | default('none') }}\nA:";
    let srv = TestServer::start("smollm2-135m", |c| {
        c.chat_template = Some(template.to_string());
    });
    let prompt_tokens = |extra: Value| srv.chat_prompt_tokens(&extra);
    let none = prompt_tokens(json!({}));
    let long = prompt_tokens(json!({"reasoning_effort": "extraordinarily thorough please"}));
    assert!(long > none + 2, "{none} {long}");
    let resp = srv.post_ok(
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 1, "store": false,
                "reasoning": {"effort": "extraordinarily thorough please"}}),
    );
    assert_eq!(resp["usage"]["input_tokens"], long, "{resp}");
    drop(srv);
    let plain = TestServer::start("smollm2-135m", |_| {});
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            chat("hi", json!({"reasoning_effort": "high", "max_tokens": 1})),
            "reasoning_effort",
        ),
        // (named as the Responses API names it)
        (
            "/v1/responses",
            json!({"input": "hi", "reasoning": {"effort": "high"}}),
            "reasoning.effort",
        ),
        // The same switches as template variables, refused alike (they were ignored).
        (
            "/v1/chat/completions",
            chat(
                "hi",
                json!({"chat_template_kwargs": {"enable_thinking": true}}),
            ),
            "chat_template_kwargs",
        ),
        (
            "/v1/chat/completions",
            chat(
                "hi",
                json!({"chat_template_kwargs": {"reasoning_effort": "high"}}),
            ),
            "chat_template_kwargs",
        ),
    ] {
        let r = plain.post_raw(path, body.to_string().as_bytes());
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{path}");
    }
    // Turning thinking off where there is none asks nothing.
    let off = chat(
        "hi",
        json!({"max_tokens": 1, "chat_template_kwargs": {"enable_thinking": false}}),
    );
    plain.post_ok("/v1/chat/completions", &off);
    let r = plain.post_raw(
        "/v1/messages",
        json!({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
               "output_config": {"effort": "high"}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("reasoning effort"));
}

/// A value of each refused field that asks for something frink cannot do, and the value
/// that changes nothing (where the field has one).
fn refused_sample(name: &str) -> (Value, Option<Value>) {
    let (bad, neutral) = match name {
        "functions" => (json!([{"name": "f", "parameters": {}}]), Some(json!([]))),
        "function_call" => (json!({"name": "f"}), Some(json!("auto"))),
        "audio" => (json!({"voice": "alloy", "format": "wav"}), None),
        "modalities" => (json!(["text", "audio"]), Some(json!(["text"]))),
        "verbosity" => (json!("low"), None),
        "web_search_options" => (json!({}), None),
        "best_of" => (json!(3), Some(json!(1))),
        "echo" => (json!(true), Some(json!(false))),
        "dynatemp_range" => (json!(0.5), Some(json!(0))),
        "typical_p" => (json!(0.5), Some(json!(1.0))),
        "dry_multiplier" => (json!(0.8), Some(json!(0.0))),
        "xtc_probability" => (json!(0.5), Some(json!(0))),
        "mirostat" => (json!(2), Some(json!(0))),
        "top_n_sigma" => (json!(1.5), Some(json!(-1))),
        "min_keep" => (json!(5), Some(json!(1))),
        "image_data" => (json!([{"data": "", "id": 1}]), Some(json!([]))),
        "multimodal_data" => (json!(["aGk="]), Some(json!([]))),
        "return_tokens" => (json!(true), Some(json!(false))),
        "post_sampling_probs" => (json!(true), Some(json!(false))),
        "response_fields" => (json!(["content"]), Some(json!([]))),
        "return_progress" => (json!(true), Some(json!(false))),
        other => panic!("no test value for the refused field {other}: add one here"),
    };
    (bad, neutral)
}

/// A plausible value of each informational field.
fn informational_sample(name: &str) -> Value {
    match name {
        "model" => json!("some-other-name"),
        "user" => json!("user-1"),
        "metadata" => json!({"k": "v"}),
        "store" => json!(false),
        "service_tier" => json!("auto"),
        "prompt_cache_key" => json!("key"),
        "safety_identifier" => json!("sid"),
        "cache_prompt" => json!(false),
        "id_slot" => json!(3),
        "timings_per_token" => json!(true),
        "dynatemp_exponent" => json!(2.0),
        "dry_base" => json!(2.0),
        "dry_allowed_length" => json!(3),
        "dry_penalty_last_n" => json!(32),
        "dry_sequence_breakers" => json!(["\n"]),
        "mirostat_tau" => json!(4.0),
        "mirostat_eta" => json!(0.2),
        "xtc_threshold" => json!(0.2),
        other => panic!("no test value for the informational field {other}: add one here"),
    }
}

/// An error about a field of a translated request (Anthropic's, the Responses API's) names
/// the field as the client sent it, not the chat field it became (they were named
/// `stop`, `response_format`, `reasoning_effort`).
#[test]
fn translated_requests_errors_name_the_fields_sent() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |_| {});
    let anthropic = |extra: Value| {
        let mut b = json!({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = srv.post_raw("/v1/messages", b.to_string().as_bytes());
        assert_eq!(r.status, 400, "{}", r.text());
        r.json()["error"]["message"].as_str().unwrap().to_string()
    };
    let msg = anthropic(json!({"stop_sequences": 5}));
    assert!(
        msg.contains("'stop_sequences'") && !msg.contains("'stop'"),
        "{msg}"
    );
    let msg = anthropic(json!({"output_config": {"format": {"type": "json_schema", "schema": 5}}}));
    assert!(!msg.contains("response_format"), "{msg}");
    for (body, param) in [
        (
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": 5}}}),
            "text.format",
        ),
        (
            json!({"input": "hi", "reasoning": {"effort": 5}}),
            "reasoning.effort",
        ),
    ] {
        let r = srv.post_raw("/v1/responses", body.to_string().as_bytes());
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.text());
    }
}
