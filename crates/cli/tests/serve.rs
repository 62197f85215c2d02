//! `frink serve` end to end: the real binary on a loopback port with smollm2-135m (fetched
//! through the store), spoken to over real HTTP: answers equal to `frink run`, batching
//! and prefix reuse without changing tokens, load, disconnects, limits, keys, metrics and
//! start-up failures. Tests run one at a time (a lock), each with its own server, so
//! timings are not disturbed by another test's server.

mod common;

use std::time::{Duration, Instant};

use common::http::{stream_text, Server};
use common::serve::{chat, lock, message};
use common::{frink, last_json_line, stderr};
use serde_json::{json, Value};
#[test]
fn greedy_answers_equal_frink_run_greedy() {
    let _l = lock();
    let srv = Server::start(&[]);
    // Chat: the template applied to one user message, as `frink run` does.
    let prompt = "Why is the sky blue?";
    let run = frink(&["run", "--json", "--greedy", "-t", "2", "-n", "48", prompt]);
    assert!(run.status.success(), "{}", stderr(&run));
    let want = last_json_line(&run);
    let got = srv.post_ok(
        "/v1/chat/completions",
        &chat(prompt, json!({"temperature": 0, "max_tokens": 48})),
    );
    assert_eq!(message(&got), want["text"].as_str().unwrap());
    assert_eq!(
        got["choices"][0]["finish_reason"], want["finish_reason"],
        "{got}"
    );
    let usage = &got["usage"];
    assert_eq!(
        usage["prompt_tokens"],
        want["prompt_ids"].as_array().unwrap().len()
    );
    assert_eq!(
        usage["completion_tokens"],
        want["ids"].as_array().unwrap().len()
    );
    assert_eq!(got["object"], "chat.completion");

    // The same finishing rule: `ignore_eos` never samples the end of the turn (here at
    // about 10 tokens) in both, to the budget.
    let run = frink(&[
        "run",
        "--json",
        "--greedy",
        "--ignore-eos",
        "-t",
        "2",
        "-n",
        "40",
        "Hi",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let want = last_json_line(&run);
    let got = srv.post_ok(
        "/v1/chat/completions",
        &chat(
            "Hi",
            json!({"temperature": 0, "max_tokens": 40, "ignore_eos": true}),
        ),
    );
    assert_eq!(want["ids"].as_array().unwrap().len(), 40, "{want}");
    assert_eq!(want["finish_reason"], "length");
    assert_eq!(got["usage"]["completion_tokens"], 40, "{got}");
    assert_eq!(got["choices"][0]["finish_reason"], "length");
    assert_eq!(message(&got), want["text"].as_str().unwrap());

    // Plain completion: the raw prompt, as `frink run --raw`.
    let run = frink(&[
        "run",
        "--json",
        "--greedy",
        "--raw",
        "-t",
        "2",
        "-n",
        "24",
        "The capital of France is",
    ]);
    let want = last_json_line(&run);
    let got = srv.post_ok(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 24}),
    );
    assert_eq!(
        got["choices"][0]["text"].as_str().unwrap(),
        want["text"].as_str().unwrap()
    );
    assert_eq!(got["choices"][0]["finish_reason"], "length");
    assert_eq!(got["usage"]["completion_tokens"], 24);
    assert_eq!(got["object"], "text_completion");
}

/// `ignore_eos` with llama.cpp's meaning: end-of-generation tokens are never sampled, in
/// `frink run --ignore-eos` and the server alike. llama-server (the anchor, greedy, 12
/// tokens) answers "Say just: yes" on qwen2.5-coder-0.5b with "Yes. I'm ready to help you.
/// How can I"; frink's first nine tokens are those (the tenth is a near tie: "What");
/// before, frink sampled the end of turn and went on: "Yes.<|im_end|>\n<|im_end|>…".
#[test]
fn ignore_eos_never_samples_the_end_of_turn() {
    let _l = lock();
    let srv = Server::start(&["-m", "qwen2.5-coder-0.5b"]);
    let got = srv.post_ok(
        "/v1/chat/completions",
        &chat(
            "Say just: yes",
            json!({"temperature": 0, "max_tokens": 12, "ignore_eos": true}),
        ),
    );
    let text = message(&got);
    assert!(text.starts_with("Yes. I'm ready to help you."), "{text:?}");
    assert!(!text.contains("<|im_"), "{text:?}");
    assert_eq!(got["usage"]["completion_tokens"], 12);
    let run = frink(&[
        "run",
        "-m",
        "qwen2.5-coder-0.5b",
        "--json",
        "--greedy",
        "--ignore-eos",
        "-n",
        "12",
        "Say just: yes",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(last_json_line(&run)["text"].as_str().unwrap(), text);
}

#[test]
fn one_request_alone_and_among_seven_others_gives_identical_tokens() {
    let _l = lock();
    let srv = Server::start(&["--parallel", "8"]);
    // Sampled (not greedy) with a seed, with log-probabilities: every token's bits.
    let probe = chat(
        "Write a short poem about the sea.",
        json!({"temperature": 0.9, "seed": 1234, "max_tokens": 40, "logprobs": true, "top_logprobs": 3}),
    );
    let alone = srv.post_ok("/v1/chat/completions", &probe);
    let alone_lp = alone["choices"][0]["logprobs"].clone();
    assert_eq!(
        alone_lp["content"].as_array().map(Vec::len),
        Some(alone["usage"]["completion_tokens"].as_u64().unwrap() as usize)
            .filter(|_| alone["choices"][0]["finish_reason"] == "length"),
        "one logprob entry per generated token: {alone}"
    );

    // Seven others already decoding (and prefilling) when the probe arrives.
    let others: Vec<_> = (0..7)
        .map(|i| {
            let port = srv.port;
            std::thread::spawn(move || {
                let srv = common::http::Client::new(port);
                let body = chat(
                    &format!("Tell me fact number {i} about {}.", ["cats", "rivers", "stars", "bread", "trains", "snow", "music"][i]),
                    json!({"temperature": 0.7, "seed": i, "max_tokens": 40 + 8 * i, "stream": i % 2 == 0}),
                );
                srv.complete("/v1/chat/completions", &body)
            })
        })
        .collect();
    // Until at least two run (at most 10 s: on a loaded machine the requests' threads
    // start late; 300 ms fixed was once too short beside a llama-perplexity run).
    let start = std::time::Instant::now();
    let mut busy = srv.metric("frink_slots_busy");
    while busy < 2.0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
        busy = srv.metric("frink_slots_busy");
    }
    let together = srv.post_ok("/v1/chat/completions", &probe);
    for h in others {
        let (text, finish) = h.join().unwrap();
        assert!(finish.is_some() && !text.is_empty());
    }
    eprintln!("slots busy when the probe was sent: {busy}");
    assert!(
        busy >= 2.0,
        "the probe ran beside others ({busy} slots busy)"
    );
    assert_eq!(message(&together), message(&alone));
    assert_eq!(together["choices"][0]["logprobs"], alone_lp);
    // The same counts; among the others the probe may find its chat template's tokens in
    // a busy slot and copy them (prompt_tokens_details.cached_tokens), the tokens equal.
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(together["usage"][k], alone["usage"][k], "{k}");
    }
}

#[test]
fn health_answers_while_a_long_prompt_is_prefilled() {
    let _l = lock();
    let srv = Server::start(&[]);
    // About 2,000 prompt tokens (as ids: exactly 2,000, evaluated in chunks).
    let ids: Vec<u32> = (0..2000).map(|i| 1000 + (i * 37) % 20000).collect();
    let port = srv.port;
    let long = std::thread::spawn(move || {
        let t0 = Instant::now();
        let c = common::http::Client::new(port);
        let v = c.post_ok(
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 1, "temperature": 0}),
        );
        (v, t0.elapsed())
    });
    // Wait until the request occupies a slot, then probe /health during the prefill.
    let t0 = Instant::now();
    while srv.metric("frink_slots_busy") < 1.0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut worst = Duration::ZERO;
    let mut probes = 0;
    while !long.is_finished() {
        let t = Instant::now();
        let r = srv.request("GET", "/health", None);
        let dt = t.elapsed();
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!({"status": "ok"}));
        worst = worst.max(dt);
        probes += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let (v, took) = long.join().unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 2000);
    eprintln!(
        "/health during a 2,000-token prefill ({:.2} s): worst latency {:.1} ms over {probes} probes",
        took.as_secs_f64(),
        worst.as_secs_f64() * 1e3
    );
    assert!(probes >= 3, "the prefill was too short to probe ({probes})");
    assert!(worst < Duration::from_secs(2), "{worst:?}");
}

#[test]
fn load_64_requests_from_16_clients_complete_in_full() {
    let _l = lock();
    let srv = Server::start(&["--parallel", "8"]);
    let t0 = Instant::now();
    let topics = [
        "the moon", "a dog", "coffee", "rain", "a robot", "the sea", "chess", "bees",
    ];
    let clients: Vec<_> = (0..16)
        .map(|c| {
            let port = srv.port;
            std::thread::spawn(move || {
                let client = common::http::Client::new(port);
                let mut tokens = 0u64;
                for r in 0..4 {
                    let i = c * 4 + r;
                    let n = [4, 16, 32, 48][i % 4];
                    let stream = i % 2 == 0;
                    let topic = topics[i % topics.len()];
                    let prompt = format!("{} Tell me about {topic}.", "Please be brief. ".repeat(i % 5 * 10));
                    let body = if i % 3 == 0 {
                        json!({"prompt": prompt, "max_tokens": n, "stream": stream, "seed": i, "ignore_eos": true,
                               "stream_options": {"include_usage": true}})
                    } else {
                        chat(&prompt, json!({"max_tokens": n, "stream": stream, "seed": i, "ignore_eos": true,
                                             "stream_options": {"include_usage": true}}))
                    };
                    let path = if i % 3 == 0 { "/v1/completions" } else { "/v1/chat/completions" };
                    if stream {
                        let s = client.stream(path, &body);
                        assert_eq!(s.status, 200);
                        let (chunks, done_last) = s.collect();
                        assert!(done_last, "request {i}: the stream did not end with [DONE]");
                        let (_, finish) = stream_text(&chunks);
                        assert_eq!(finish.as_deref(), Some("length"), "request {i}");
                        let usage = &chunks.last().unwrap()["usage"];
                        assert_eq!(usage["completion_tokens"], n, "request {i}: {usage}");
                    } else {
                        let v = client.post_ok(path, &body);
                        assert_eq!(v["choices"][0]["finish_reason"], "length", "request {i}");
                        assert_eq!(v["usage"]["completion_tokens"], n, "request {i}");
                    }
                    tokens += n as u64;
                }
                tokens
            })
        })
        .collect();
    let tokens: u64 = clients.into_iter().map(|h| h.join().unwrap()).sum();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "64 requests from 16 clients: {tokens} tokens in {secs:.1} s ({:.1} generated t/s aggregate)",
        tokens as f64 / secs
    );
    assert_eq!(srv.metric("frink_requests_finished_total"), 64.0);
    assert_eq!(srv.metric("frink_tokens_generated_total"), tokens as f64);
    assert_eq!(srv.metric("frink_slots_busy"), 0.0);
    assert_eq!(srv.metric("frink_queue_depth"), 0.0);
}

#[test]
fn queue_limit_api_key_and_small_endpoints() {
    let _l = lock();
    let mut srv = Server::start(&["--parallel", "1", "--queue", "1", "--api-key", "sekrit"]);
    let auth = [("Authorization", "Bearer sekrit")];
    // /health needs no key; everything else does.
    assert_eq!(srv.request("GET", "/health", None).status, 200);
    let r = srv.request("GET", "/v1/models", None);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = srv.request_with(
        "GET",
        "/v1/models",
        None,
        &[("Authorization", "Bearer wrong")],
    );
    assert_eq!(r.status, 401);
    let models = srv.request_with("GET", "/v1/models", None, &auth).json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "smollm2-135m");

    let toks = srv
        .request_with(
            "POST",
            "/tokenize",
            Some(r#"{"content": "Hello world"}"#),
            &auth,
        )
        .json();
    let ids = toks["tokens"].as_array().unwrap().clone();
    assert!(!ids.is_empty());
    let body = json!({ "tokens": ids }).to_string();
    let text = srv
        .request_with("POST", "/detokenize", Some(&body), &auth)
        .json();
    assert_eq!(text["content"], "Hello world");

    // One slot busy, one request queued: the next is refused with 503. (3,000 tokens: longer
    // than the 5 s shutdown grace below at any speed this model reaches on two threads.)
    let long =
        json!({"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": true}).to_string();
    let port = srv.port;
    let mut running = Vec::new();
    for gauge in [
        "frink_slots_busy{model_name=\"smollm2-135m\"} 1",
        "frink_queue_depth{model_name=\"smollm2-135m\"} 1",
    ] {
        let long = long.clone();
        running.push(std::thread::spawn(move || {
            common::http::Client::new(port)
                .request_with(
                    "POST",
                    "/v1/completions",
                    Some(&long),
                    &[("Authorization", "Bearer sekrit")],
                )
                .status
        }));
        let t0 = Instant::now();
        while !srv
            .request_with("GET", "/metrics", None, &auth)
            .text()
            .lines()
            .any(|l| l == gauge)
        {
            assert!(t0.elapsed() < Duration::from_secs(10), "no {gauge}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let r = srv.request_with("POST", "/v1/completions", Some(&long), &auth);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "queue_full");
    let metrics = srv.request_with("GET", "/metrics", None, &auth).text();
    for name in [
        "frink_requests_total",
        "frink_tokens_generated_total",
        "frink_prompt_tokens_total",
        "frink_requests_active",
        "frink_queue_depth",
        "frink_slots_busy",
        "frink_time_to_first_token_seconds_bucket",
        "frink_token_latency_seconds_count",
    ] {
        assert!(metrics.contains(name), "{name} missing: {metrics}");
    }

    // SIGTERM: in-flight requests are cancelled after the grace period; exit status 0.
    let status = srv
        .terminate(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}: {}", srv.log.lock().unwrap());
    // The running request is cut at the end of the grace and the queued one refused: 503
    // answers (an OpenAI-shaped error, not a dropped connection or a 500).
    let codes: Vec<u16> = running.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(codes.iter().all(|&c| c == 200 || c == 503), "{codes:?}");
    assert!(codes.contains(&503), "{codes:?}");
}

#[test]
fn frink_environment_variables_configure_the_server() {
    let _l = lock();
    let srv = Server::start_env(
        &[],
        &[
            ("FRINK_PARALLEL", "3"),
            ("FRINK_API_KEY", "k2"),
            ("FRINK_CTX", "128"),
        ],
    );
    assert_eq!(srv.request("GET", "/metrics", None).status, 401);
    let slots = srv.metric_with("frink_slots_total", &[("Authorization", "Bearer k2")]);
    assert_eq!(slots, 3.0);
    let long = json!({"prompt": "word ".repeat(200)}).to_string();
    let r = srv.request_with(
        "POST",
        "/v1/completions",
        Some(&long),
        &[("Authorization", "Bearer k2")],
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("128"), "{}", r.text());
}

/// Not a timed test: aggregate generated tokens/s of 8 concurrent streams vs 1
/// (`cargo test --release -p frink --test serve -- --ignored --nocapture`).
#[test]
#[ignore]
fn throughput_one_stream_vs_eight() {
    let _l = lock();
    let srv = Server::start(&["--parallel", "8"]);
    let body = |i: usize| {
        chat(
            &format!("Write a story about the number {i}."),
            json!({"temperature": 0, "max_tokens": 128, "ignore_eos": true}),
        )
    };
    srv.post_ok("/v1/chat/completions", &body(99)); // warm up
    let t0 = Instant::now();
    srv.post_ok("/v1/chat/completions", &body(0));
    let one = 128.0 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let hs: Vec<_> = (0..8)
        .map(|i| {
            let port = srv.port;
            std::thread::spawn(move || {
                common::http::Client::new(port).post_ok("/v1/chat/completions", &body(i))
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let eight = 8.0 * 128.0 / t0.elapsed().as_secs_f64();
    eprintln!(
        "1 stream: {one:.1} t/s; 8 streams: {eight:.1} t/s aggregate ({:.2}x)",
        eight / one
    );
}

#[test]
fn a_model_that_fails_to_load_ends_the_server_with_an_error() {
    let _l = lock();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"not a model").unwrap();
    let out = frink(&["serve", "--port", "0", "-m", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("error: cannot load"),
        "{}",
        stderr(&out)
    );
}

/// The hostile-metadata cases of the issue that asked for their validation, each on a tiny
/// fixture: `frink run` and `frink serve` both exit 1 at load with the same error line,
/// and it names the key. (Before the validation: block_count aborted allocating 1.7 TB,
/// expert_used_count panicked, the NaN/0 values ran and gave NaN or other logits.)
#[test]
fn hostile_metadata_ends_run_and_serve_with_the_same_error_naming_the_key() {
    use frink_gguf::{GgufFile, GgufWriter, MetaValue};
    let Some(root) = frink_testdata::require("fixtures/tiny", "hostile metadata at startup") else {
        return;
    };
    let _l = lock();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("llama", "llama.block_count", MetaValue::U32((1 << 31) - 1)),
        ("llama", "llama.feed_forward_length", MetaValue::U32(7)),
        ("llama", "llama.rope.freq_base", MetaValue::F32(f32::NAN)),
        (
            "llama",
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(0.0),
        ),
        ("llama", "llama.rope.dimension_count", MetaValue::U32(0)),
        (
            "qwen2_moe",
            "qwen2moe.expert_shared_feed_forward_length",
            MetaValue::U32(7),
        ),
        (
            "deepseek_v3",
            "deepseek2.expert_used_count",
            MetaValue::U32(7),
        ),
        (
            "deepseek_v3",
            "deepseek2.expert_weights_scale",
            MetaValue::F32(f32::INFINITY),
        ),
        (
            "deepseek_v2",
            "deepseek2.expert_shared_count",
            MetaValue::U32(3),
        ),
        (
            "gemma3",
            "gemma3.attention.sliding_window",
            MetaValue::U32(0),
        ),
        ("gemma3", "gemma3.rope.scaling.factor", MetaValue::F32(-1.0)),
    ];
    for (fixture, key, value) in cases {
        let file = GgufFile::read(root.join(fixture).join("model.gguf")).unwrap();
        let mut w = GgufWriter::from_file(&file).unwrap();
        w.add_metadata(key.to_string(), value.clone());
        let path = dir.path().join(format!("{key}.gguf"));
        std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
        let m = path.to_str().unwrap();
        let error_line = |out: &std::process::Output| -> String {
            let err = stderr(out);
            assert_eq!(out.status.code(), Some(1), "{key} = {value}: {err}");
            err.lines()
                .find(|l| l.starts_with("error:"))
                .unwrap_or_else(|| panic!("{key} = {value}: no error line: {err}"))
                .to_string()
        };
        let run = error_line(&frink(&[
            "run",
            "-m",
            m,
            "--raw",
            "--greedy",
            "-n",
            "2",
            "--prompt-ids",
            "1,2,3",
        ]));
        let serve = error_line(&frink(&["serve", "--port", "0", "-m", m]));
        eprintln!("{key} = {value}: {run}");
        assert!(run.contains(key), "{key} = {value}: {run}");
        assert_eq!(run, serve, "{key} = {value}: run and serve differ");
    }
    // A key this file's layers never use (every qwen2moe layer is a mixture of experts,
    // whose width is `expert_feed_forward_length`): the same tokens, nothing allocated by it
    // (before the validation: an abort allocating its scratch).
    let original = root.join("qwen2_moe").join("model.gguf");
    let file = GgufFile::read(&original).unwrap();
    let mut w = GgufWriter::from_file(&file).unwrap();
    w.add_metadata(
        "qwen2moe.feed_forward_length".to_string(),
        MetaValue::U32((1 << 31) - 1),
    );
    let path = dir.path().join("unused.gguf");
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    let tokens = |m: &std::path::Path| {
        let out = frink(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "--raw",
            "--greedy",
            "-n",
            "4",
            "--prompt-ids",
            "1,2,3",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    assert_eq!(tokens(&original), tokens(&path));
}

/// `--log-format json`: one line per request once its answer has left, with its status,
/// client, total time and, for a completion, the model, tokens and timings (20 requests:
/// `/health`, whole and streamed chat completions, a completion, a 404, a 400); never the
/// prompt's text. The
/// start-up banner names the model, the context and the slots.
#[test]
fn each_request_is_logged_with_its_status_tokens_and_timings() {
    let _l = lock();
    let srv = Server::start(&["--log-format", "json", "--parallel", "2", "--ctx", "1024"]);
    assert_eq!(srv.request("GET", "/health", None).status, 200);
    let secret = "ultramarine-aardvark";
    for i in 0..16 {
        let mut body = chat(
            &format!("{secret} {i}"),
            json!({"temperature": 0, "max_tokens": 4 + i % 3}),
        );
        if i % 2 == 1 {
            body["stream"] = true.into();
            let _ = srv.stream("/v1/chat/completions", &body).collect();
        } else {
            srv.post_ok("/v1/chat/completions", &body);
        }
    }
    let r = srv.request("GET", "/no-such-route", None);
    assert_eq!(r.status, 404);
    let r = srv.post_raw("/v1/chat/completions", b"{");
    assert_eq!(r.status, 400);
    srv.post_ok(
        "/v1/completions",
        &json!({"prompt": "The sky", "max_tokens": 3}),
    );
    // The last line is written when its body has left: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let log = srv.log.lock().unwrap().clone();
        let lines: Vec<Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["method"].is_string())
            .collect();
        if lines.iter().filter(|v| v["path"] != "/health").count() >= 19
            || Instant::now() > deadline
        {
            break (log, lines);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (log, lines) = lines;
    assert!(!log.contains(secret), "a prompt's text was logged");
    assert!(
        log.contains("model smollm2-135m")
            && log.contains("context 1024 tokens")
            && log.contains("2 slots"),
        "{log}"
    );
    let chats: Vec<&Value> = lines
        .iter()
        .filter(|v| v["path"] == "/v1/chat/completions" && v["status"] == 200)
        .collect();
    assert_eq!(chats.len(), 16, "{log}");
    for (i, v) in chats.iter().enumerate() {
        assert_eq!(v["method"], "POST");
        assert_eq!(v["model"], "x", "{v}");
        assert!(v["prompt_tokens"].as_u64().unwrap() > 5, "{v}");
        let n = v["completion_tokens"].as_u64().unwrap();
        assert!((1..=6).contains(&n), "{i}: {v}");
        assert!(v["first_token_ms"].as_f64().unwrap() > 0.0, "{v}");
        assert!(
            v["total_ms"].as_f64().unwrap() >= v["first_token_ms"].as_f64().unwrap(),
            "{v}"
        );
        assert!(
            v["client"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{v}"
        );
    }
    let status = |path: &str, code: u64| {
        lines
            .iter()
            .any(|v| v["path"] == path && v["status"] == code)
    };
    assert!(
        status("/no-such-route", 404) && status("/v1/chat/completions", 400),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["path"] == "/v1/completions" && v["completion_tokens"] == 3),
        "{log}"
    );
    assert!(status("/health", 200), "{log}");
}

/// Ollama's endpoints log their tokens too, and `--log-prompts` adds the rendered prompt
/// and the answer's text to each line (the test above: never without it).
#[test]
fn log_prompts_adds_the_texts_and_ollama_requests_count_their_tokens() {
    let _l = lock();
    let srv = Server::start(&["--log-format", "json", "--log-prompts"]);
    let secret = "ultramarine-aardvark";
    let v = srv.post_ok(
        "/v1/chat/completions",
        &chat(secret, json!({"temperature": 0, "max_tokens": 5})),
    );
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let o = srv.post_ok(
        "/api/generate",
        &json!({"model": "x", "prompt": format!("{secret} again"), "stream": false,
                "options": {"temperature": 0, "num_predict": 4}}),
    );
    assert_eq!(o["eval_count"], 4);
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let lines: Vec<Value> = srv
            .log
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["method"] == "POST")
            .collect();
        if lines.len() >= 2 || Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(lines.len(), 2, "{lines:?}");
    let prompt = lines[0]["prompt"].as_str().unwrap();
    // The rendered prompt: the template's markers around the message.
    assert!(
        prompt.contains(secret) && prompt.contains("<|im_start|>"),
        "{prompt}"
    );
    assert!(
        lines[0]["answer"].as_str().unwrap().starts_with(&answer),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1]["path"], "/api/generate");
    assert_eq!(lines[1]["completion_tokens"], 4, "{}", lines[1]);
    assert!(
        lines[1]["prompt_tokens"].as_u64().unwrap() > 3,
        "{}",
        lines[1]
    );
    assert_eq!(
        lines[1]["answer"].as_str().unwrap(),
        o["response"].as_str().unwrap()
    );
    assert!(lines[1]["prompt"].as_str().unwrap().contains("again"));
}

/// `--log-prompts` with an image in the prompt: the rendered text around it and one marker
/// for its rows (the line's prompt was empty: the image's keys are not token ids).
#[test]
fn log_prompts_show_an_images_place() {
    let _l = lock();
    let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/qwen25vl");
    let at = |f: &str| d.join(f).to_string_lossy().into_owned();
    let (model, mmproj) = (at("model.gguf"), at("mmproj-model.gguf"));
    let srv = Server::start(&[
        "-m",
        &model,
        "--mmproj",
        &mmproj,
        "--log-format",
        "json",
        "--log-prompts",
    ]);
    let image = base64::encode(std::fs::read(d.join("square.png")).unwrap());
    srv.post_ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}},
            {"type": "text", "text": "periwinkle"}]}], "max_tokens": 2}),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let line = srv
            .log
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["method"] == "POST");
        if line.is_some() || Instant::now() > deadline {
            break line.expect("a log line for the request");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let prompt = line["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<|vision_start|>[image: 36 rows]<|vision_end|>periwinkle"),
        "{prompt}"
    );
}
