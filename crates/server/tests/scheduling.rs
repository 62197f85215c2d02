//! The scheduler seen over HTTP (in-process, smollm2-135m): disconnects free their slot,
//! prompts longer than the pool are 400s, stop strings never reach the client, a shared
//! prefix and `n` choices reuse the prompt without changing the answer, and vLLM's
//! metrics. Tests run one at a time (a lock), each with its own server.

mod common;

use std::time::{Duration, Instant};

use common::{chat, lock, message, stream_text, TestServer};
use serde_json::{json, Value};

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |_| {});
    let mut s = srv.stream(
        "/v1/chat/completions",
        &chat(
            "Count from one to one thousand.",
            json!({"max_tokens": 2000, "stream": true, "ignore_eos": true}),
        ),
    );
    assert_eq!(s.status, 200);
    for _ in 0..5 {
        assert!(s.next_data().is_some());
    }
    assert_eq!(srv.metric("frink_slots_busy"), 1.0);
    let t0 = Instant::now();
    drop(s);
    while srv.metric("frink_slots_busy") > 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the slot is still busy 5 s after the client left"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let freed = t0.elapsed();
    eprintln!(
        "slot freed {:.1} ms after the client disconnected",
        freed.as_secs_f64() * 1e3
    );
    assert_eq!(srv.metric("frink_requests_cancelled_total"), 1.0);
    // The server goes on serving.
    let v = srv.post_ok(
        "/v1/chat/completions",
        &chat("Hi", json!({"max_tokens": 4})),
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
}

/// A prompt or embedding input within `--ctx` but as long as the KV pool (`--kv-size`)
/// could never run: a 400 `context_length_exceeded` naming the pool, before anything is
/// queued; a prompt that fits still runs.
#[test]
fn a_prompt_longer_than_the_kv_pool_is_a_400() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |c| {
        c.ctx = 512;
        c.kv_size = 64;
    });
    let long = "word ".repeat(200); // 201 tokens
    for (path, body, param) in [
        ("/v1/completions", json!({"prompt": long}), "prompt"),
        ("/v1/embeddings", json!({"input": long}), "input"),
    ] {
        let r = srv.post_raw(path, body.to_string().as_bytes());
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["code"], "context_length_exceeded", "{e}");
        assert_eq!(e["param"], param, "{e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains("201 tokens") && msg.contains("KV pool of 64 positions"),
            "{msg}"
        );
    }
    let v = srv.post_ok(
        "/v1/completions",
        &json!({"prompt": "Once upon", "max_tokens": 4}),
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
}

#[test]
fn stop_strings_never_reach_the_client() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |_| {});
    let base = json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 24});
    let full = srv.post_ok("/v1/completions", &base);
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the greedy answer, spanning tokens.
    let stop = text.trim_start()[3..8].to_string();
    let at = text.find(&stop).unwrap();
    let mut body = base.clone();
    body["stop"] = json!([stop, "never-appears"]);
    let v = srv.post_ok("/v1/completions", &body);
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), &text[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let (chunks, done) = srv.stream("/v1/completions", &body).collect();
    assert!(done);
    let (streamed, finish) = stream_text(&chunks);
    assert_eq!(streamed, &text[..at]);
    assert_eq!(finish.as_deref(), Some("stop"));
}

#[test]
fn a_shared_prompt_prefix_is_reused_without_changing_the_answer() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |c| {
        c.parallel = 1;
    });
    let turn1 = json!({"messages": [
        {"role": "system", "content": "You are a helpful assistant who answers briefly."},
        {"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 16});
    let a = srv.post_ok("/v1/chat/completions", &turn1);
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let mut turn2 = turn1.clone();
    let msgs = turn2["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": message(&a)}));
    msgs.push(json!({"role": "user", "content": "And of Italy?"}));
    let b = srv.post_ok("/v1/chat/completions", &turn2);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= prompt1,
        "reused {cached} of turn 1's {prompt1} tokens"
    );
    // After an unrelated prompt took the only slot, the conversation's full blocks are
    // still in the prefix cache: whole blocks of 16 positions are reused.
    srv.post_ok(
        "/v1/completions",
        &json!({"prompt": "Zebras", "max_tokens": 2}),
    );
    let again = srv.post_ok("/v1/chat/completions", &turn2);
    let from_cache = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt2 = b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        from_cache.is_multiple_of(16) && from_cache >= prompt1 / 16 * 16 && from_cache < prompt2,
        "{from_cache} of {prompt2} from the prefix cache"
    );
    assert_eq!(message(&again), message(&b));
    assert_eq!(
        srv.metric("frink_prompt_tokens_cached_total"),
        (cached + from_cache) as f64
    );
    // The same request on a cold server.
    drop(srv);
    let srv = TestServer::start("smollm2-135m", |c| {
        c.parallel = 1;
    });
    let cold = srv.post_ok("/v1/chat/completions", &turn2);
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(message(&cold), message(&b));
}

/// `n` choices of one prompt: choice `i` is exactly the answer of the same request with
/// `n: 1` and seed `seed + i` (so the shared prompt evaluation, whose keys and values the
/// other choices copy, changes nothing), the choices differ, the answer is reproducible,
/// usage counts the prompt once and every choice's tokens, the prompt is evaluated once
/// (the other choices reuse all but its last token), streaming tags each chunk with its
/// choice, and `n` above `--parallel` is a 400.
#[test]
fn n_choices_share_the_prompt_and_equal_single_requests() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |c| {
        c.parallel = 4;
    });
    let ask = |extra: Value| {
        let mut e = json!({"temperature": 0.9, "max_tokens": 20, "seed": 40});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        srv.post_ok("/v1/chat/completions", &chat("Tell me a fun fact.", e))
    };
    let metrics = || -> std::collections::HashMap<String, f64> {
        srv.request("GET", "/metrics", None)
            .text()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                // One model: its series by name, without the `model_name` label.
                let (k, v) = l.rsplit_once(' ')?;
                let k = k.split('{').next()?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    };
    let m0 = metrics();
    let three = ask(json!({"n": 3}));
    let m1 = metrics();
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{three}");
    let texts: Vec<String> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            c["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    assert!(texts[0] != texts[1] && texts[1] != texts[2], "{texts:?}");
    let prompt_tokens = three["usage"]["prompt_tokens"].as_u64().unwrap();
    let evaluated = (m1["frink_prompt_tokens_total"] - m0["frink_prompt_tokens_total"])
        - (m1["frink_prompt_tokens_cached_total"] - m0["frink_prompt_tokens_cached_total"]);
    assert!(
        evaluated <= prompt_tokens as f64 + 2.0,
        "the prompt of {prompt_tokens} tokens was evaluated more than once: {evaluated}"
    );
    let mut completion = 0;
    for (i, t) in texts.iter().enumerate() {
        let one = ask(json!({"n": 1, "seed": 40 + i}));
        assert_eq!(&message(&one), t, "choice {i}");
        completion += one["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(
        three["usage"]["completion_tokens"].as_u64(),
        Some(completion)
    );
    assert_eq!(ask(json!({"n": 3}))["choices"], three["choices"]);

    let body = chat(
        "Tell me a fun fact.",
        json!({"temperature": 0.9, "max_tokens": 20, "seed": 40, "n": 3, "stream": true}),
    );
    let (events, done) = srv.stream("/v1/chat/completions", &body).collect();
    assert!(done);
    let mut streamed = vec![String::new(); 3];
    let mut finished = 0;
    for e in &events {
        for c in e["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
            finished += usize::from(!c["finish_reason"].is_null());
        }
    }
    assert_eq!(streamed, texts);
    assert_eq!(finished, 3);
    let r = srv.post_raw(
        "/v1/chat/completions",
        chat("hi", json!({"n": 5})).to_string().as_bytes(),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "n");
}

/// The vLLM metric names the Gateway API Inference Extension routes by: while one stream
/// runs, `vllm:num_requests_running` is 1 and `vllm:kv_cache_usage_perc` the pool blocks
/// it holds over all (`--parallel 2 --ctx 512`: 64 blocks of 16, a few percent); idle,
/// both are 0.
#[test]
fn vllm_metrics_report_running_requests_and_kv_use() {
    let _l = lock();
    let srv = TestServer::start("smollm2-135m", |c| {
        c.parallel = 2;
        c.ctx = 512;
    });
    assert_eq!(srv.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(srv.metric("vllm:kv_cache_usage_perc"), 0.0);
    let mut stream = srv.stream(
        "/v1/chat/completions",
        &chat(
            "Write a long story about a lighthouse.",
            json!({"stream": true, "max_tokens": 200, "ignore_eos": true, "temperature": 0}),
        ),
    );
    // Past the first tokens, the request holds its prompt and answer so far.
    for _ in 0..10 {
        stream.next_data();
    }
    let running = srv.metric("vllm:num_requests_running");
    let usage = srv.metric("vllm:kv_cache_usage_perc");
    assert_eq!(running, 1.0);
    assert!(usage > 0.0 && usage < 0.5, "kv usage {usage}");
    assert_eq!(srv.metric("vllm:num_requests_waiting"), 0.0);
    let (_, done) = stream.collect();
    assert!(done);
    assert_eq!(srv.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(srv.metric("vllm:kv_cache_usage_perc"), 0.0);
    let text = srv.request("GET", "/metrics", None).text();
    assert!(
        text.contains(
            "vllm:cache_config_info{model_name=\"smollm2-135m\",block_size=\"16\",num_gpu_blocks=\"64\""
        ),
        "{text}"
    );
}
