//! `frink serve` with other models and features (the real binary over HTTP): recurrent
//! and newest families beside each other, checkpoints, LoRA adapters per request,
//! predicted outputs and a draft model, each giving the answers it gives alone or
//! without speculation. Tests run one at a time (a lock), each with its own server.

mod common;

use std::time::Duration;

use common::http::Server;
use common::serve::{chat, lock, message};
use common::{frink, last_json_line, stderr};
use serde_json::{json, Value};
/// `/v1/completions` with each of `bodies` at once from its own client, request `i` started
/// `3 · i` ms after the first (so that some prefill beside others' decoding); the answers
/// in order.
fn post_staggered(srv: &Server, bodies: Vec<Value>) -> Vec<Value> {
    let handles: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let port = srv.port;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(3 * i as u64));
                common::http::Client::new(port).post_ok("/v1/completions", &b)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The recurrent families through the server (`frink_testdata::RECURRENT_FIXTURES`): 8
/// concurrent sampled requests of 160 to 300 tokens, started 3 ms apart so that some
/// prefill beside others' decoding, give each exactly the text it gives alone; a follow-up that extends a
/// finished request's prompt reuses the slot's whole state and answers as on a cold slot.
#[test]
fn recurrent_models_serve_concurrent_requests_as_alone() {
    let _l = lock();
    for name in frink_testdata::RECURRENT_FIXTURES {
        let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{name}"), name) else {
            return;
        };
        let path = dir.join("model.gguf");
        let srv = Server::start(&[
            "-m",
            path.to_str().unwrap(),
            "--parallel",
            "8",
            "--ctx",
            "256",
        ]);
        let body = |i: usize| {
            json!({"prompt": format!("This License {i} applies to any program"),
                   "temperature": 0.9, "seed": 7 + i, "max_tokens": 160 + 20 * i, "ignore_eos": true})
        };
        let alone: Vec<String> = (0..8)
            .map(|i| srv.post_ok("/v1/completions", &body(i))["choices"][0]["text"].to_string())
            .collect();
        let together = post_staggered(&srv, (0..8).map(body).collect());
        for (i, v) in together.iter().enumerate() {
            let text = v["choices"][0]["text"].to_string();
            assert_eq!(text, alone[i], "{name}: request {i}");
        }
        // A follow-up extending a finished request's prompt (as token ids: the slot then
        // holds exactly them, the one sampled token not yet evaluated) reuses the whole
        // state.
        let ids: Vec<u32> = (0..20).map(|i| 40 + 7 * i).collect();
        srv.post_ok(
            "/v1/completions",
            &json!({"prompt": ids, "temperature": 0, "max_tokens": 1}),
        );
        let longer: Vec<u32> = ids.iter().copied().chain([51, 52, 53]).collect();
        let follow = json!({"prompt": longer, "temperature": 0, "max_tokens": 8});
        let warm = srv.post_ok("/v1/completions", &follow);
        let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        drop(srv);
        let cold_srv = Server::start(&["-m", path.to_str().unwrap(), "--parallel", "1"]);
        let cold = cold_srv.post_ok("/v1/completions", &follow);
        eprintln!("{name}: the follow-up reused {cached} tokens");
        assert!(
            cached > 0,
            "{name}: the finished conversation's state was not reused"
        );
        assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            warm["choices"][0]["text"], cold["choices"][0]["text"],
            "{name}"
        );
    }
}

/// The newest families (Gemma 4: per-layer embeddings, layers reading an earlier layer's
/// keys and values, a window of 8; Llama 4: chunks of 8, NoPE, experts on the inputs)
/// through the server: 8 concurrent sampled requests that share a 40-token prompt prefix
/// (its blocks shared between the slots) and differ after it, started 3 ms apart, give
/// each exactly the tokens it gives alone on a fresh server; a request that repeats one's
/// prompt afterwards reuses the prefix (`cached_tokens` > 0) and answers as alone.
#[test]
fn newest_families_serve_concurrent_requests_with_a_shared_prefix_as_alone() {
    let _l = lock();
    for name in ["gemma4", "llama4"] {
        let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{name}"), name) else {
            return;
        };
        let path = dir.join("model.gguf");
        let args = [
            "-m",
            path.to_str().unwrap(),
            "--parallel",
            "8",
            "--ctx",
            "256",
        ];
        let prefix: Vec<u32> = (0..40).map(|i| 3 + (i * 37) % 300).collect();
        let body = |i: usize| {
            let prompt: Vec<u32> = prefix.iter().copied().chain([5 + i as u32, 7, 9]).collect();
            json!({"prompt": prompt, "temperature": 0.9, "seed": 7 + i,
                   "max_tokens": 100 + 10 * i, "ignore_eos": true})
        };
        let text = |v: &Value| v["choices"][0]["text"].to_string();
        let alone: Vec<String> = (0..8)
            .map(|i| {
                let srv = Server::start(&args);
                text(&srv.post_ok("/v1/completions", &body(i)))
            })
            .collect();
        let srv = Server::start(&args);
        let mut reused = 0;
        for (i, v) in post_staggered(&srv, (0..8).map(body).collect())
            .iter()
            .enumerate()
        {
            reused += v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            assert_eq!(text(v), alone[i], "{name}: request {i}");
        }
        let again = srv.post_ok("/v1/completions", &body(3));
        let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        eprintln!(
            "{name}: 8 concurrent requests reused {reused} prompt tokens; a repeat reused {cached}"
        );
        assert!(cached >= 32, "{name}: the prefix was not reused ({cached})");
        assert_eq!(text(&again), alone[3], "{name}: the repeat");
    }
}

/// Checkpoints of recurrent states: a three-turn exchange (turn 1; turn 1 with its last
/// part edited; turn 1 again) on each recurrent fixture gives every turn the tokens of a
/// cold server, reusing a checkpoint where one applies (`cached_tokens` > 0) and never
/// past the point where the prompts diverge.
#[test]
fn checkpoints_reuse_recurrent_prefixes_without_changing_answers() {
    let _l = lock();
    for name in frink_testdata::RECURRENT_FIXTURES {
        let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{name}"), name) else {
            return;
        };
        let path = dir.join("model.gguf");
        let m = path.to_str().unwrap();
        let warm = Server::start(&["-m", m, "--parallel", "1", "--checkpoint-interval", "8"]);
        let cold = Server::start(&["-m", m, "--parallel", "1", "--ctx-checkpoints", "0"]);
        let turn1: Vec<u32> = (0..40).map(|i| 3 + (i * 37) % 300).collect();
        // The last part edited: the prompts agree on their first 30 tokens.
        let diverge = 30;
        let mut turn2 = turn1[..diverge].to_vec();
        turn2.extend((0..10).map(|i| 5 + (i * 11) % 290));
        for (turn, prompt) in [(1, &turn1), (2, &turn2), (3, &turn1)] {
            let body = json!({"prompt": prompt, "temperature": 0.8, "seed": 42, "max_tokens": 16});
            let got = warm.post_ok("/v1/completions", &body);
            // The cold server's slot holds an unrelated prompt first: nothing to reuse.
            cold.post_ok(
                "/v1/completions",
                &json!({"prompt": [300, 301], "max_tokens": 1}),
            );
            let want = cold.post_ok("/v1/completions", &body);
            assert_eq!(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
            let cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap() as usize;
            eprintln!("{name}: turn {turn} reused {cached} tokens");
            match turn {
                1 => assert_eq!(cached, 0),
                _ => assert!(
                    cached > 0 && cached <= diverge,
                    "{name} turn {turn}: {cached} cached tokens (divergence at {diverge})"
                ),
            }
            assert_eq!(
                got["choices"][0]["text"], want["choices"][0]["text"],
                "{name} turn {turn}"
            );
        }
        assert!(warm.metric("frink_checkpoints_restored_total") >= 2.0);
        assert!(warm.metric("frink_checkpoint_bytes") > 0.0);
    }
}

/// Two random adapters for smollm2-135m (rank 8 on attn_q, attn_v and ffn_down of every
/// layer), written into `dir`: (a, b).
fn smollm2_adapters(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let pulled = frink(&["pull", "smollm2-135m"]);
    assert!(pulled.status.success(), "{}", stderr(&pulled));
    let base_path = String::from_utf8_lossy(&pulled.stdout).trim().to_string();
    let base = frink_gguf::GgufFile::open(&base_path).unwrap();
    let targets = ["attn_q.weight", "attn_v.weight", "ffn_down.weight"];
    let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
    frink_testdata::write_lora(&base, &targets, 8, 16.0, 0.05, 1, &a);
    frink_testdata::write_lora(&base, &targets, 8, 16.0, 0.05, 2, &b);
    (a, b)
}

/// `frink run --greedy --raw` of `prompt` with `flags` (adapters), its text.
fn run_text(prompt: &str, n: &str, flags: &[&str]) -> String {
    let mut args = vec!["run", "--json", "--greedy", "--raw", "-t", "2", "-n", n];
    args.extend(flags);
    args.push(prompt);
    let out = frink(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    last_json_line(&out)["text"].as_str().unwrap().to_string()
}

/// LoRA in the server: 8 concurrent requests mixing adapter A, adapter B, both and none
/// give each its `frink run --lora…` answer and share their decode steps; the
/// `/lora-adapters` endpoints round-trip; a slot's cache is never reused across adapter
/// settings; loaded-but-not-applied, `lora: []` and scale 0 are the base model's answer.
#[test]
fn lora_adapters_per_request_in_one_batch() {
    let _l = lock();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = smollm2_adapters(tmp.path());
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    let a_half = format!("{a_s}:0.5");
    let b_07 = format!("{b_s}:0.7");
    // (request's lora, frink run's flags)
    let configs: [(Value, Vec<&str>); 4] = [
        (json!([]), vec![]),
        (json!([{"id": 0, "scale": 1.0}]), vec!["--lora", a_s]),
        (
            json!([{"id": 1, "scale": 0.7}]),
            vec!["--lora-scaled", &b_07],
        ),
        (
            json!([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.7}]),
            vec!["--lora", a_s, "--lora-scaled", &b_07],
        ),
    ];
    let prompts = ["The capital of France is", "Once upon a time"];
    let want: Vec<Vec<String>> = prompts
        .iter()
        .map(|p| configs.iter().map(|(_, f)| run_text(p, "16", f)).collect())
        .collect();
    assert_ne!(want[0][0], want[0][1], "adapter A changes the answer");
    assert_ne!(want[0][1], want[0][2], "A and B differ");

    let srv = Server::start(&[
        "--lora",
        a_s,
        "--lora",
        b_s,
        "--lora-init-without-apply",
        "--parallel",
        "8",
    ]);
    let listed = srv.request("GET", "/lora-adapters", None).json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(listed[0]["scale"], 0.0);
    assert_eq!(listed[1]["path"], b_s);
    let steps0 = srv.metric("frink_forward_steps_total");
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let port = srv.port;
            let body = json!({"prompt": prompts[i / 4], "temperature": 0, "max_tokens": 16,
                              "lora": configs[i % 4].0});
            std::thread::spawn(move || {
                let c = common::http::Client::new(port);
                c.post_ok("/v1/completions", &body)["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), want[i / 4][i % 4], "request {i}");
    }
    // 8 requests of 16 tokens: sharing their steps, far fewer than 128 passes.
    let steps = srv.metric("frink_forward_steps_total") - steps0;
    eprintln!("8 mixed-adapter requests of 16 tokens took {steps} forward passes");
    assert!(steps < 64.0, "{steps} forward passes");

    // Unknown ids are refused.
    let bad = srv.post_raw(
        "/v1/completions",
        json!({"prompt": "x", "lora": [{"id": 5, "scale": 1}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    let bad = srv.post_raw("/lora-adapters", b"[{\"id\": 2, \"scale\": 1}]");
    assert_eq!(bad.status, 400, "{}", bad.text());
    // POST sets the defaults (unnamed adapters to 0): a request without `lora` uses them.
    let set = srv
        .post_raw("/lora-adapters", b"[{\"id\": 0, \"scale\": 1.0}]")
        .json();
    assert_eq!(
        (set[0]["scale"].as_f64(), set[1]["scale"].as_f64()),
        (Some(1.0), Some(0.0))
    );
    let body = json!({"prompt": prompts[0], "temperature": 0, "max_tokens": 16});
    assert_eq!(
        srv.post_ok("/v1/completions", &body)["choices"][0]["text"],
        want[0][1]
    );
    drop(srv);

    // The prefix cache: one slot, the same prompt under each setting in turn.
    let srv = Server::start(&["--lora", a_s, "--parallel", "1"]);
    let half = run_text(prompts[0], "16", &["--lora-scaled", &a_half]);
    for (lora, expect) in [
        (json!([{"id": 0, "scale": 1.0}]), &want[0][1]),
        (json!([{"id": 0, "scale": 0.5}]), &half),
        (json!([]), &want[0][0]),
        (json!([{"id": 0, "scale": 0.0}]), &want[0][0]),
        (json!([{"id": 0, "scale": 1.0}]), &want[0][1]),
    ] {
        let body = json!({"prompt": prompts[0], "temperature": 0, "max_tokens": 16, "lora": lora});
        let got = srv.post_ok("/v1/completions", &body);
        assert_eq!(&got["choices"][0]["text"], expect, "lora {lora}");
    }
    // After POST changes the default scale, a request without `lora` follows it.
    srv.post_raw("/lora-adapters", b"[{\"id\": 0, \"scale\": 0.5}]");
    let body = json!({"prompt": prompts[0], "temperature": 0, "max_tokens": 16});
    assert_eq!(
        srv.post_ok("/v1/completions", &body)["choices"][0]["text"],
        half
    );
}

/// OpenAI's predicted outputs through the server (qwen2.5-coder-0.5b): a code edit with the
/// unchanged function as its prediction, a prediction that is the answer itself with a
/// short `max_tokens`, log-probabilities and a stop string inside the accepted run, and a
/// structured-output request whose prediction is half wrong give exactly the answers (text,
/// log-probabilities, finish reason, token counts) of the same requests without a
/// prediction, alone and beside three other streams; `usage` counts the prediction's
/// accepted and rejected tokens and `/metrics` the speculation. A `prediction` of another
/// type is a 400 naming it. The server proposes as many tokens as `--draft-max` allows
/// (`--spec-adaptive=false`): the counts asserted below must not depend on the machine's
/// step times (with the adaptive rule a loaded CI machine once proposed 1 token of the
/// half-wrong prediction, rejected, and then none).
#[test]
fn predicted_outputs_never_change_the_answer() {
    let _l = lock();
    let srv = Server::start(&[
        "-m",
        "qwen2.5-coder-0.5b",
        "--parallel",
        "4",
        "--spec-adaptive=false",
    ]);
    let function = "def area(width, height):\n    \"\"\"The area of a rectangle.\"\"\"\n    if width < 0 or height < 0:\n        raise ValueError(\"negative side\")\n    return width * height\n\n\ndef perimeter(width, height):\n    \"\"\"The perimeter of a rectangle.\"\"\"\n    if width < 0 or height < 0:\n        raise ValueError(\"negative side\")\n    return 2 * (width + height)\n";
    let edit = chat(
        &format!("Rename the parameter `width` to `w` in this code. Answer with the code only.\n\n```python\n{function}```"),
        json!({"temperature": 0, "max_tokens": 120, "logprobs": true, "top_logprobs": 2}),
    );
    let with = |body: &Value, extra: Value| {
        let mut b = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let same = |a: &Value, b: &Value, what: &str| {
        assert_eq!(message(a), message(b), "{what}: content");
        assert_eq!(
            a["choices"][0]["logprobs"], b["choices"][0]["logprobs"],
            "{what}: logprobs"
        );
        assert_eq!(
            a["choices"][0]["finish_reason"], b["choices"][0]["finish_reason"],
            "{what}"
        );
        for k in ["prompt_tokens", "completion_tokens"] {
            assert_eq!(a["usage"][k], b["usage"][k], "{what}: {k}");
        }
    };
    let details = |v: &Value| {
        let d = &v["usage"]["completion_tokens_details"];
        (
            d["accepted_prediction_tokens"].as_u64().unwrap(),
            d["rejected_prediction_tokens"].as_u64().unwrap(),
        )
    };
    let plain = srv.post_ok("/v1/chat/completions", &edit);
    assert_eq!(details(&plain), (0, 0), "no prediction: nothing counted");
    let predicted = |content: &str| json!({"prediction": {"type": "content", "content": content}});
    let code = format!("```python\n{function}```");
    let p = srv.post_ok("/v1/chat/completions", &with(&edit, predicted(&code)));
    same(&plain, &p, "the unchanged function predicted");
    let (acc, rej) = details(&p);
    eprintln!(
        "code edit: {} tokens, prediction accepted {acc} rejected {rej}",
        plain["usage"]["completion_tokens"]
    );
    assert!(acc >= 20, "most of the copied code is taken: {acc}");
    assert!(
        rej > 0,
        "the renamed parameter is not the prediction: {rej}"
    );

    // The answer itself as the prediction, with a budget shorter than an accepted run,
    // and with a stop string inside the accepted text.
    let answer = message(&plain);
    let short = with(&edit, json!({"max_tokens": 6}));
    let short_plain = srv.post_ok("/v1/chat/completions", &short);
    let short_p = srv.post_ok("/v1/chat/completions", &with(&short, predicted(&answer)));
    same(&short_plain, &short_p, "max_tokens inside a run");
    let stop_at = answer.find("return").expect("the answer returns something");
    let stopped = with(&edit, json!({"stop": ["return"]}));
    let stop_plain = srv.post_ok("/v1/chat/completions", &stopped);
    let stop_p = srv.post_ok("/v1/chat/completions", &with(&stopped, predicted(&answer)));
    same(&stop_plain, &stop_p, "a stop string inside a run");
    assert_eq!(message(&stop_p), answer[..stop_at]);
    assert_eq!(stop_p["choices"][0]["finish_reason"], "stop");

    // Structured output with a half-wrong prediction, beside three other streams.
    let schema = json!({"type": "json_schema", "json_schema": {"name": "rect", "schema": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "width": {"type": "integer"}, "height": {"type": "integer"}},
        "required": ["name", "width", "height"], "additionalProperties": false}}});
    let json_req = chat(
        "Describe a rectangle named door, 90 wide and 200 high, as JSON.",
        json!({"temperature": 0, "max_tokens": 60, "response_format": schema}),
    );
    let json_plain = srv.post_ok("/v1/chat/completions", &json_req);
    let text = message(&json_plain);
    serde_json::from_str::<Value>(&text).expect("valid JSON");
    let half = text.len() / 2;
    let wrong: String = text[half..]
        .chars()
        .map(|c| {
            if c.is_ascii_digit() {
                '7'
            } else if c.is_ascii_alphabetic() {
                'q'
            } else {
                c
            }
        })
        .collect();
    let half_wrong = format!("{}{wrong}", &text[..half]);
    // Alone, so that no other stream takes the step's proposal rows.
    let json_alone = srv.post_ok(
        "/v1/chat/completions",
        &with(&json_req, predicted(&half_wrong)),
    );
    same(
        &json_plain,
        &json_alone,
        "structured output, half-wrong prediction",
    );
    let (acc, rej) = details(&json_alone);
    eprintln!("structured: prediction accepted {acc} rejected {rej}");
    assert!(
        acc > 0 && rej > 0,
        "half wrong: {acc} accepted, {rej} rejected"
    );
    let others: Vec<_> = (0..3)
        .map(|i| {
            let port = srv.port;
            std::thread::spawn(move || {
                let c = common::http::Client::new(port);
                c.complete(
                    "/v1/chat/completions",
                    &chat(
                        &format!("Count from {i} to 40."),
                        json!({"temperature": 0.7, "seed": i, "max_tokens": 80}),
                    ),
                )
            })
        })
        .collect();
    let json_p = srv.post_ok(
        "/v1/chat/completions",
        &with(&json_req, predicted(&half_wrong)),
    );
    for h in others {
        assert!(h.join().unwrap().1.is_some());
    }
    same(&json_plain, &json_p, "the same beside three other streams");
    assert!(srv.metric("frink_spec_accepted_tokens_total") > 0.0);
    assert!(
        srv.metric("frink_spec_proposed_tokens_total")
            > srv.metric("frink_spec_accepted_tokens_total")
    );

    let bad = with(
        &edit,
        json!({"prediction": {"type": "audio", "content": "x"}}),
    );
    let r = srv.request("POST", "/v1/chat/completions", Some(&bad.to_string()));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "prediction");
}

/// `serve --draft-model` (smollm2 drafting for itself): four concurrent requests, greedy
/// and seeded, get the answers of a `--spec off` server, and `/metrics` counts the draft's
/// proposals taken.
#[test]
fn a_draft_model_serves_the_answers_of_no_speculation() {
    let _l = lock();
    let bodies: Vec<Value> = (0..4)
        .map(|i| {
            chat(
                &format!("List the first {} prime numbers in words.", 5 + i),
                json!({"temperature": if i % 2 == 0 { 0.0 } else { 0.8 }, "seed": i, "max_tokens": 48}),
            )
        })
        .collect();
    let answers = |args: &[&str]| {
        let srv = Server::start(args);
        let hs: Vec<_> = bodies
            .iter()
            .cloned()
            .map(|b| {
                let port = srv.port;
                std::thread::spawn(move || {
                    common::http::Client::new(port).post_ok("/v1/chat/completions", &b)
                })
            })
            .collect();
        let out: Vec<String> = hs
            .into_iter()
            .map(|h| message(&h.join().unwrap()))
            .collect();
        (out, srv.metric("frink_spec_accepted_tokens_total"))
    };
    let (off, none) = answers(&["--parallel", "4", "--spec", "off"]);
    let (drafted, accepted) = answers(&["--parallel", "4", "-md", "smollm2-135m"]);
    assert_eq!(drafted, off);
    assert_eq!(none, 0.0);
    eprintln!("draft proposals taken: {accepted}");
    assert!(accepted > 0.0);
}

/// Ollama's `/api/pull` streams its progress while the download runs (it sent every line
/// at the end): a hub model sent in 10 pieces 150 ms apart shows bytes growing, the first
/// of them well before the end.
#[test]
fn api_pull_streams_progress_as_it_downloads() {
    let _one = lock();
    use frink_testdata::hub::{HubStandIn, Repo, TRICKLE_GAP, TRICKLE_PIECES};
    let model = frink_store::Store::from_env()
        .unwrap()
        .resolve("smollm2-135m")
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let size = 1_000_000;
    let hub = HubStandIn::start(vec![(
        "org/slow",
        Repo {
            files: vec![("m-Q4_K_M.gguf".into(), vec![3u8; size])],
            trickle: true,
            ..Default::default()
        },
    )]);
    let srv = Server::start_env(
        &["-m", model.to_str().unwrap()],
        &[
            ("FRINK_HOME", home.path().to_str().unwrap()),
            ("HF_ENDPOINT", hub.endpoint.as_str()),
        ],
    );
    let t0 = std::time::Instant::now();
    let mut s = srv.stream("/api/pull", &json!({"model": "hf:org/slow"}));
    assert_eq!(s.status, 200);
    let mut lines: Vec<(Duration, Value)> = Vec::new();
    while let Some(l) = s.next_line() {
        lines.push((t0.elapsed(), serde_json::from_str(&l).unwrap()));
    }
    let statuses: Vec<&str> = lines
        .iter()
        .map(|(_, v)| v["status"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(statuses.first(), Some(&"pulling manifest"), "{statuses:?}");
    assert_eq!(
        &statuses[statuses.len() - 3..],
        ["verifying sha256 digest", "writing manifest", "success"]
    );
    let partial: Vec<(Duration, u64)> = lines
        .iter()
        .filter(|(_, v)| v["total"] == size)
        .map(|(t, v)| (*t, v["completed"].as_u64().unwrap()))
        .filter(|&(_, c)| c > 0 && c < size as u64)
        .collect();
    // 1.5 s of download, a line at most every 200 ms: several partial counts, growing.
    assert!(partial.len() >= 3, "{lines:?}");
    assert!(partial.windows(2).all(|w| w[0].1 < w[1].1), "{partial:?}");
    let end = lines.last().unwrap().0;
    let download = TRICKLE_GAP * TRICKLE_PIECES as u32;
    assert!(
        partial[0].0 + download / 2 < end,
        "the first progress line came at {:?}, the end at {end:?}",
        partial[0].0
    );
    assert!(home
        .path()
        .join("models/hf/org/slow/m-Q4_K_M.gguf")
        .is_file());
}
