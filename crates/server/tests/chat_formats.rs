//! Chat answers read by format over HTTP (in-process, smollm2-135m with other templates):
//! `<think>` reasoning, llama 3's JSON calls, calls cut by `max_tokens`, every tool-call
//! format round-tripped, and Ollama's refusals. Tests run one at a time (a lock), each
//! with its own server.

mod common;

use common::{chat, lock, message, TestServer};
use serde_json::{json, Value};

/// Reasoning separated into `reasoning_content`, whole and streamed, for a template that
/// teaches `<think>` (here one given with `--chat-template`, the answer held to the shape
/// `<think>…</think>…` by a grammar so that smollm2 writes one): the thinking never reaches
/// `content`, the streamed deltas reassemble to the whole answer's fields, and
/// `reasoning_format: "none"` keeps the text inline.
#[test]
fn think_blocks_go_to_reasoning_content() {
    let _l = lock();
    let template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant (may <think> first):";
    let srv = TestServer::start("smollm2-135m", |c| {
        c.chat_template = Some(template.to_string());
    });
    let grammar = "%llguidance {}\nstart: \"<think>\" /[a-z ]{3,20}/ \"</think>\" /[a-z ]{3,20}/";
    let body = |extra: Value| {
        let mut b = chat(
            "Why is the sky blue?",
            json!({"temperature": 0, "max_tokens": 40, "grammar": grammar}),
        );
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let whole = srv.post_ok("/v1/chat/completions", &body(json!({})));
    let m = &whole["choices"][0]["message"];
    let thinking = m["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("{whole}"));
    let content = m["content"].as_str().unwrap();
    assert!(!thinking.is_empty() && !content.is_empty(), "{whole}");
    assert!(
        !content.contains("think") && !thinking.contains('<'),
        "{whole}"
    );
    let inline = srv.post_ok(
        "/v1/chat/completions",
        &body(json!({"reasoning_format": "none"})),
    );
    // Inline, the same text; split, the answer's leading whitespace after `</think>` goes.
    let text = message(&inline);
    let rest = text
        .strip_prefix(&format!("<think>{thinking}</think>"))
        .unwrap_or_else(|| panic!("{inline}"));
    assert_eq!(rest.trim_start(), content, "{inline}");
    let (chunks, done) = srv
        .stream("/v1/chat/completions", &body(json!({"stream": true})))
        .collect();
    assert!(done);
    let (mut r, mut c) = (String::new(), String::new());
    for ch in &chunks {
        for x in ch["choices"].as_array().unwrap() {
            r.push_str(x["delta"]["reasoning_content"].as_str().unwrap_or(""));
            c.push_str(x["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    assert_eq!((r.as_str(), c.as_str()), (thinking, content));
}

/// A Llama 3.1 template (given with `--chat-template-file`) makes frink read and enforce
/// its JSON call format, `{"name", "parameters"}`: a required call comes back as
/// `tool_calls` with the schema's arguments, whatever the model (smollm2 here).
#[test]
fn llama3_template_calls_are_json_with_parameters() {
    let _l = lock();
    let template = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tokenizer/tests/data/templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
    let srv = TestServer::start("smollm2-135m", |c| {
        c.chat_template = Some(std::fs::read_to_string(&template).unwrap());
    });
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": false}}}]);
    let got = srv.post_ok(
        "/v1/chat/completions",
        &chat(
            "What is the weather in Paris?",
            json!({"tools": tools, "tool_choice": "required", "temperature": 0, "max_tokens": 60}),
        ),
    );
    let c = &got["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{got}");
    let call = &c["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"]
            .as_str()
            .is_some_and(|s| s.chars().count() <= 20),
        "{got}"
    );
}

/// An answer cut by `max_tokens` in the middle of its calls reports `finish_reason:
/// "length"` (as llama-server does), not `"tool_calls"`: the calls that were whole come
/// back, the cut one is dropped (never left as markup in the content; before, it stayed
/// there as `<|tool_call>…`), whole and streamed. With one call allowed the
/// answer ends after it, `"tool_calls"`. (smollm2 under Gemma 4's template and the grammar
/// of `tool_choice: "required"`, greedy: a call, then the next one cut at 40 tokens.) A
/// required call without tools, absent or an empty list, is a 400.
#[test]
fn calls_cut_by_max_tokens_finish_with_length() {
    let _l = lock();
    let template = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tokenizer/tests/data/templates/google-gemma-4-31B-it.jinja");
    let srv = TestServer::start("smollm2-135m", |c| {
        c.chat_template = Some(std::fs::read_to_string(&template).unwrap());
    });
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"]}}}]);
    let body = |parallel: bool, stream: bool| {
        chat(
            "What is the weather in Paris?",
            json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": parallel,
                   "temperature": 0, "max_tokens": 40, "stream": stream}),
        )
    };
    let got = srv.post_ok("/v1/chat/completions", &body(true, false));
    let c = &got["choices"][0];
    assert_eq!(c["finish_reason"], "length", "{got}");
    assert_eq!(got["usage"]["completion_tokens"], 40, "{got}");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{got}");
    assert!(
        c["message"]["content"]
            .as_str()
            .is_none_or(|t| !t.contains("<|tool_call>")),
        "the cut call is not in the content: {got}"
    );
    let (chunks, done) = srv
        .stream("/v1/chat/completions", &body(true, true))
        .collect();
    assert!(done);
    let (streamed, finish) = streamed_calls(&chunks);
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(streamed.len(), calls.len());
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.contains("<|tool_call>"), "{text:?}");
    let one = srv.post_ok("/v1/chat/completions", &body(false, false));
    assert_eq!(one["choices"][0]["finish_reason"], "tool_calls", "{one}");
    assert_eq!(
        one["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // A required call with no tools (absent or an empty list) is a 400 naming the field.
    for extra in [
        json!({"tool_choice": "required"}),
        json!({"tools": [], "tool_choice": "required"}),
    ] {
        let r = srv.post_raw(
            "/v1/chat/completions",
            chat("Hi", extra.clone()).to_string().as_bytes(),
        );
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        assert!(
            r.text().contains("'tool_choice' requires 'tools'"),
            "{}",
            r.text()
        );
    }
}

/// Every tool format frink reads, end to end through `frink serve` with the family's real
/// template (`--chat-template-file`; the model is smollm2, which knows none of them, so the
/// grammar of `tool_choice: "required"` writes the call): the answer comes back as
/// `tool_calls` whose arguments validate against the schema, streamed deltas reassemble to
/// the same call, and `frink inspect`'s format name is the one detected. (Markers that are
/// control tokens in the family's own vocabulary are plain text in smollm2's; the
/// control-token path is tests in crates/server/tests/tool_grammars.rs.)
#[test]
fn every_tool_format_round_trips_through_the_server() {
    let _l = lock();
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/data/templates");
    // (gpt-oss's template, like transformers, needs a description to render a tool.)
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"]}}}]);
    for file in [
        "Qwen3-Coder.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "openai-gpt-oss-120b.jinja",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "ibm-granite-granite-3.3-2B-Instruct.jinja",
        "google-gemma-4-31B-it.jinja",
    ] {
        let path = dir.join(file);
        let srv = TestServer::start("smollm2-135m", |c| {
            c.chat_template = Some(std::fs::read_to_string(&path).unwrap());
        });
        let body = |stream: bool| {
            chat(
                "What is the weather in Paris?",
                json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                       "parallel_tool_calls": false, "temperature": 0, "max_tokens": 120, "stream": stream}),
            )
        };
        let got = srv.post_ok("/v1/chat/completions", &body(false));
        let c = &got["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{file}: {got}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{file}: {got}");
        let arguments = call["function"]["arguments"].as_str().unwrap();
        let args: Value = serde_json::from_str(arguments).unwrap();
        let city = args["city"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: {got}"));
        assert!((1..=12).contains(&city.chars().count()), "{file}: {got}");
        assert!(
            args["unit"] == "celsius" || args["unit"] == "fahrenheit",
            "{file}: {got}"
        );
        let (chunks, done) = srv.stream("/v1/chat/completions", &body(true)).collect();
        assert!(done, "{file}");
        let (calls, finish) = streamed_calls(&chunks);
        assert_eq!(finish.as_deref(), Some("tool_calls"), "{file}");
        assert_eq!(calls.len(), 1, "{file}: {chunks:?}");
        assert!(!calls[0].1.is_empty(), "{file}: empty id");
        assert_eq!(
            (calls[0].2.as_str(), calls[0].3.as_str()),
            ("get_weather", arguments),
            "{file}: streamed call differs from the whole one"
        );
        eprintln!("{file}: {arguments}");
    }
}

/// Ollama's error shape and the refusals of what frink does not implement, over raw HTTP.
#[test]
fn ollama_endpoints_refuse_what_they_cannot_honour() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |_| {});
    for (path, body, needle) in [
        (
            "/api/chat",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}),
            "images",
        ),
        (
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "template": "{{ .Prompt }}"}),
            "template",
        ),
        (
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "context": [1, 2]}),
            "context",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"tfs_z": 0.5}}),
            "tfs_z",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"mirostat": 2}}),
            "mirostat",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": 4}}),
            "num_ctx",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": "hi"}),
            "messages",
        ),
        // `raw` and `suffix` bypass the template, and so the thinking `think` asks for.
        (
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "raw": true, "think": true}),
            "think",
        ),
        (
            "/api/embed",
            json!({"model": "m", "input": "hi", "dimensions": 3}),
            "dimensions",
        ),
    ] {
        let r = srv.request("POST", path, Some(&body.to_string()));
        let v = r.json();
        assert_eq!(r.status, 400, "{path} {body}: {v}");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("not Ollama's shape: {v}"));
        assert!(msg.contains(needle), "{path} {body}: {msg}");
    }
    // `think` on a model whose template has no thinking (smollm2's), as Ollama refuses it.
    let r = srv.request(
        "POST",
        "/api/chat",
        Some(
            &json!({"model": "m", "think": true, "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        ),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("think"));
    // A request naming no work: Ollama's load answer.
    let v = srv.post_ok("/api/generate", &json!({"model": "m"}));
    assert_eq!(
        (v["done"].clone(), v["done_reason"].clone()),
        (json!(true), json!("load"))
    );
    // num_ctx bounds the answer: prompt plus answer fit it.
    let v = srv.post_ok(
        "/api/chat",
        &json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": "Tell me a story."}],
                "options": {"num_ctx": 40, "temperature": 0}}),
    );
    let total = v["prompt_eval_count"].as_u64().unwrap() + v["eval_count"].as_u64().unwrap();
    assert!(total <= 40 && v["done_reason"] == "length", "{v}");
}

/// A streamed tool call reassembled: (index, id, name, arguments).
type StreamedCall = (u64, String, String, String);

/// The tool calls of a streamed answer reassembled from their deltas, by index, and the
/// last finish reason.
fn streamed_calls(chunks: &[Value]) -> (Vec<StreamedCall>, Option<String>) {
    let mut calls: Vec<StreamedCall> = Vec::new();
    let mut finish = None;
    for ch in chunks {
        for c in ch["choices"].as_array().into_iter().flatten() {
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
            for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let k = d["index"].as_u64().unwrap();
                if !calls.iter().any(|c| c.0 == k) {
                    calls.push((k, String::new(), String::new(), String::new()));
                }
                let e = calls.iter_mut().find(|c| c.0 == k).unwrap();
                e.1.push_str(d["id"].as_str().unwrap_or(""));
                e.2.push_str(d["function"]["name"].as_str().unwrap_or(""));
                e.3.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
    }
    (calls, finish)
}

/// A tool whose `parameters` schema cannot be compiled is a 400 on `tools` naming that
/// tool's schema and why, under `required` and `auto` alike (it was a 400 on
/// `tool_choice` saying only that the grammar of calls failed).
#[test]
fn a_tool_schema_that_cannot_compile_is_named() {
    let _l = lock();
    let template = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../tokenizer/tests/data/templates/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    );
    let srv = TestServer::start("smollm2-135m", |c| {
        c.chat_template = Some(std::fs::read_to_string(&template).unwrap());
    });
    // (The template reads each tool's description and properties.)
    let ok = json!({"type": "function", "function": {"name": "ok", "description": "d",
                    "parameters": {"type": "object", "properties": {}}}});
    let bad = json!({"type": "function", "function": {"name": "f", "description": "d",
                     "parameters": {"type": "bogus", "properties": {}}}});
    for choice in ["required", "auto"] {
        let body = chat(
            "hi",
            json!({"tools": [ok, bad], "tool_choice": choice, "max_tokens": 4}),
        );
        let r = srv.request("POST", "/v1/chat/completions", Some(&body.to_string()));
        assert_eq!(r.status, 400, "{choice}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], "tools", "{choice}: {e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains("tools[1].function.parameters") && msg.contains("bogus"),
            "{choice}: {msg}"
        );
    }
}
