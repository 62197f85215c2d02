//! Several models behind one `frink serve` (the real binary over HTTP): loaded on demand
//! by the request's `model`, unloaded by keep-alive or to make room, managed through
//! Ollama's and llama-server's endpoints. Each test has its own store (`FRINK_HOME`: links
//! to the three catalog models) and server; tests run one at a time (a lock).

mod common;

use std::path::{Path, PathBuf};

use common::http::{Client, Server, NO_M};
use common::serve::{lock, openai_venv, run_client_script};
use common::{frink, last_json_line};
use serde_json::{json, Value};

const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

/// A `FRINK_HOME` whose store holds links to the catalog models (pulled on first use).
fn home() -> tempfile::TempDir {
    for name in MODELS {
        let out = frink(&["pull", name]);
        assert!(
            out.status.success(),
            "pull {name}: {}",
            common::stderr(&out)
        );
    }
    let listed = last_json_line(&frink(&["list", "--json"]));
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("models");
    std::fs::create_dir_all(&store).unwrap();
    for m in listed.as_array().unwrap() {
        if !MODELS.contains(&m["name"].as_str().unwrap()) {
            continue;
        }
        let path = PathBuf::from(m["path"].as_str().unwrap());
        std::os::unix::fs::symlink(&path, store.join(path.file_name().unwrap())).unwrap();
    }
    dir
}

/// Every file under `dir` (names and sizes), to show nothing was written or removed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p.clone());
            }
            out.push((p, meta.len()));
        }
    }
    out.sort();
    out
}

/// The error with which `frink serve --models-config` of `text` refuses to start.
fn config_refused(home: &Path, text: &str) -> String {
    let cfg = home.join("refused.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = frink(&[
        "serve",
        "--port",
        "0",
        "--models-config",
        cfg.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{text}");
    common::stderr(&out)
}

fn serve_without_m(home: &Path, args: &[&str]) -> Server {
    let mut all = vec![NO_M];
    all.extend_from_slice(args);
    Server::start_env(&all, &[("FRINK_HOME", home.to_str().unwrap())])
}

/// A greedy chat answer of `model` (status 200 asserted).
fn greedy(c: &Client, model: &str, ask: &str) -> String {
    let v = c.post_ok(
        "/v1/chat/completions",
        &json!({"model": model, "messages": [{"role": "user", "content": ask}],
                "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(v["model"], model);
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The acceptance run with the official `ollama` client (tests/ollama_models_e2e.py): chat
/// with smollm2-135m, then qwen2.5-coder-0.5b, embed with gemma3-270m, each loading on
/// first use; `ps` with expiry times; `keep_alive: 0` unloading; `create` from a stored
/// model with a system prompt and `temperature: 0` answering exactly as the explicit
/// request does (and not as without the system prompt); `copy`, `delete`; path-like names
/// refused on every endpoint that takes one, with the store unchanged. Before, `ps` listed
/// the one model, `keep_alive` was ignored and create/copy/delete were 404s.
#[test]
fn ollama_client_manages_several_models() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let home = home();
    let before = snapshot(&home.path().join("models"));
    let srv = serve_without_m(home.path(), &[]);
    assert_eq!(srv.request("GET", "/health", None).status, 200);
    run_client_script(&python, "ollama_models_e2e.py", &srv, &[], "checks passed");
    assert_eq!(snapshot(&home.path().join("models")), before);
    assert_eq!(srv.metric("frink_model_load_failures_total"), 0.0);
}

/// The `openai` client choosing models by name: on a server without -m each model by its
/// name, an unknown one a 404 in OpenAI's shape, none a 400 naming `model`; on a server
/// with -m, a placeholder name reaches the -m model (tests/openai_models_e2e.py).
#[test]
fn openai_client_chooses_models_by_name() {
    let _l = lock();
    let Some(python) = openai_venv() else {
        return;
    };
    let home = home();
    let srv = serve_without_m(home.path(), &[]);
    run_client_script(
        &python,
        "openai_models_e2e.py",
        &srv,
        &["router"],
        "checks passed",
    );
    drop(srv);
    let srv = Server::start_env(
        &["-m", "smollm2-135m"],
        &[("FRINK_HOME", home.path().to_str().unwrap())],
    );
    run_client_script(
        &python,
        "openai_models_e2e.py",
        &srv,
        &["single"],
        "checks passed",
    );
}

/// With a memory budget that holds one model (`--max-memory 550M` (576.7 MB): smollm2-135m counts
/// 122 MB, qwen2.5-coder-0.5b 504 MB with these settings), requests that alternate between
/// the two all succeed, each switch a counted reload; 16 concurrent clients spread over
/// both all get their whole greedy answer (the one each gets alone): a model is never
/// unloaded under a running request. Before, the model named was ignored.
#[test]
fn a_budget_of_one_model_alternates_and_serves_concurrent_clients() {
    let _l = lock();
    let home = home();
    let srv = serve_without_m(
        home.path(),
        &["--max-memory", "550M", "--ctx", "512", "--parallel", "2"],
    );
    let pair = ["smollm2-135m", "qwen2.5-coder-0.5b"];
    let mut alone = Vec::new();
    for (i, model) in pair.iter().cycle().take(4).enumerate() {
        let a = greedy(&srv, model, "Name a fruit.");
        assert!(!a.is_empty());
        if i < 2 {
            alone.push(a);
        } else {
            assert_eq!(a, alone[i % 2], "{model} answers as before its reload");
        }
        assert_eq!(srv.metric("frink_models_loaded"), 1.0);
    }
    assert_eq!(srv.metric("frink_model_loads_total"), 4.0);
    assert_eq!(srv.metric("frink_model_unloads_total"), 3.0);
    let asks: Vec<String> = (0..16)
        .map(|i| format!("Count to {}.", i % 4 + 2))
        .collect();
    let handles: Vec<_> = asks
        .iter()
        .enumerate()
        .map(|(i, ask)| {
            let (port, ask, model) = (srv.port, ask.clone(), pair[i % 2]);
            std::thread::spawn(move || greedy(&Client::new(port), model, &ask))
        })
        .collect();
    let answers: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a, &greedy(&srv, pair[i % 2], &asks[i]), "client {i}");
    }
    assert!(srv.metric("frink_model_loads_total") >= 5.0);
}

/// One model's answers through a server without -m are bitwise those of a server started
/// with `-m` for it: greedy, seeded, and streamed.
#[test]
fn answers_equal_a_single_model_server() {
    let _l = lock();
    let home = home();
    let model = "qwen2.5-coder-0.5b";
    let env = [("FRINK_HOME", home.path().to_str().unwrap())];
    let asks = [
        json!({"temperature": 0, "max_tokens": 24}),
        json!({"temperature": 0.9, "seed": 42, "max_tokens": 24}),
        json!({"temperature": 0.7, "top_k": 20, "seed": 7, "max_tokens": 24, "stream": true}),
    ];
    let answers = |srv: &Server| -> Vec<String> {
        asks.iter()
            .map(|extra| {
                let mut body = json!({"model": model,
                    "messages": [{"role": "user", "content": "Write a haiku about rust."}]});
                for (k, v) in extra.as_object().unwrap() {
                    body[k] = v.clone();
                }
                if extra["stream"] == true {
                    common::http::stream_text(
                        &srv.stream("/v1/chat/completions", &body).collect().0,
                    )
                    .0
                } else {
                    srv.post_ok("/v1/chat/completions", &body)["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap()
                        .to_string()
                }
            })
            .collect()
    };
    let single = answers(&Server::start_env(&["-m", model], &env));
    let many = answers(&serve_without_m(home.path(), &[]));
    assert_eq!(single, many);
    assert_ne!(single[0], single[1], "sampling changed the answer");
}

/// Names that look like paths are refused on every endpoint that takes a model name, and
/// nothing in the store or beside it changes; llama-server's `/models/load` and
/// `/models/unload` work by name, and while one model loads `/health` and another model's
/// requests are answered.
#[test]
fn path_like_names_are_refused_everywhere() {
    let _l = lock();
    let home = home();
    let srv = serve_without_m(home.path(), &[]);
    let before = snapshot(home.path());
    let bad = "../models/../../etc/passwd";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let posts = [
        (
            "/v1/chat/completions",
            json!({"model": bad, "messages": msgs}),
        ),
        ("/v1/completions", json!({"model": bad, "prompt": "hi"})),
        ("/v1/embeddings", json!({"model": bad, "input": "hi"})),
        (
            "/v1/messages",
            json!({"model": bad, "messages": msgs, "max_tokens": 4}),
        ),
        ("/v1/responses", json!({"model": bad, "input": "hi"})),
        ("/api/chat", json!({"model": bad, "messages": msgs})),
        ("/api/generate", json!({"model": bad, "prompt": "hi"})),
        ("/api/generate", json!({"model": bad, "keep_alive": 0})),
        ("/api/embed", json!({"model": bad, "input": "hi"})),
        ("/api/show", json!({"model": bad})),
        (
            "/api/copy",
            json!({"source": "smollm2-135m", "destination": bad}),
        ),
        ("/api/copy", json!({"source": bad, "destination": "x"})),
        ("/api/create", json!({"model": bad, "from": "smollm2-135m"})),
        ("/api/create", json!({"model": "x", "from": bad})),
        ("/models/load", json!({"model": bad})),
        ("/models/unload", json!({"model": bad})),
        (
            "/infill",
            json!({"model": bad, "input_prefix": "a", "input_suffix": "b"}),
        ),
        ("/completion", json!({"model": bad, "prompt": "hi"})),
        ("/tokenize", json!({"model": bad, "content": "hi"})),
    ];
    for (path, body) in &posts {
        let r = srv.request("POST", path, Some(&body.to_string()));
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(r.text().contains("path"), "{path}: {}", r.text());
    }
    let r = srv.request(
        "DELETE",
        "/api/delete",
        Some(&json!({"model": bad}).to_string()),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = srv.request("GET", "/props?model=..%2F..%2Fetc%2Fpasswd", None);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(snapshot(home.path()), before);

    let load = |path: &str| srv.request("POST", path, Some(r#"{"model": "smollm2-135m"}"#));
    assert_eq!(load("/models/load").json(), json!({"success": true}));
    let models: Value = srv.request("GET", "/models", None).json();
    let status = |m: &Value| {
        m["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == "smollm2-135m")
            .unwrap()["status"]["value"]
            .clone()
    };
    assert_eq!(status(&models), "loaded");
    // While another model loads, /health and the loaded model answer.
    let port = srv.port;
    let loading = std::thread::spawn(move || {
        Client::new(port).request(
            "POST",
            "/models/load",
            Some(r#"{"model": "qwen2.5-coder-0.5b"}"#),
        )
    });
    let t0 = std::time::Instant::now();
    let mut slowest = std::time::Duration::ZERO;
    let mut answered = 0;
    while !loading.is_finished() && t0.elapsed() < std::time::Duration::from_secs(60) {
        let t = std::time::Instant::now();
        assert_eq!(srv.request("GET", "/health", None).status, 200);
        slowest = slowest.max(t.elapsed());
        assert!(!greedy(&srv, "smollm2-135m", "Hi").is_empty());
        answered += 1;
    }
    eprintln!("during the load: {answered} answers, /health at most {slowest:?}");
    assert!(
        slowest < std::time::Duration::from_millis(500),
        "/health took {slowest:?} during a load"
    );
    assert_eq!(loading.join().unwrap().status, 200);
    assert_eq!(load("/models/unload").json(), json!({"success": true}));
    assert_eq!(
        status(&srv.request("GET", "/models", None).json()),
        "unloaded"
    );
    assert_eq!(srv.metric("frink_models_loaded"), 1.0);
}

/// `--models-config`: a model of its own name with its own settings (here a context of 64
/// and one slot) beside the same file under its store name with the server's (4096, 4):
/// a prompt of about 100 tokens is refused naming 64 by the one and answered by the other;
/// each has its own engine (two loads). An unknown key ends the server naming it.
#[test]
fn models_config_gives_a_model_its_own_settings() {
    let _l = lock();
    let home = home();
    let cfg = home.path().join("models.toml");
    std::fs::write(
        &cfg,
        "[models.tiny-ctx]\nmodel = \"smollm2-135m\"\nctx = 64\nparallel = 1\nkeep_alive = \"1h\"\n",
    )
    .unwrap();
    let srv = serve_without_m(home.path(), &["--models-config", cfg.to_str().unwrap()]);
    let ids: Vec<String> = srv.request("GET", "/v1/models", None).json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.contains(&"tiny-ctx".to_string()), "{ids:?}");
    let long = "word ".repeat(100);
    let r = srv.request(
        "POST",
        "/v1/chat/completions",
        Some(
            &json!({"model": "tiny-ctx", "messages": [{"role": "user", "content": long}]})
                .to_string(),
        ),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("64"), "{}", r.text());
    assert!(!greedy(&srv, "smollm2-135m", &long).is_empty());
    assert_eq!(srv.metric("frink_model_loads_total"), 2.0);
    let text = srv.request("GET", "/metrics", None).text();
    assert!(
        text.contains("frink_slots_total{model_name=\"tiny-ctx\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("frink_slots_total{model_name=\"smollm2-135m\"} 4"),
        "{text}"
    );

    let err = config_refused(
        home.path(),
        "[models.x]\nmodel = \"smollm2-135m\"\ncontext = 64\n",
    );
    assert!(
        err.contains("unknown field `context`") && err.contains("line 3"),
        "{err}"
    );
}

/// A configured model's KV cache type is checked against its heads when it loads, as `-m`'s
/// is at start (an attacker helper found the scheduler panicking on the first request and
/// the model answering 503 ever after): every request gets the error naming the type and
/// the head size, and the server's other models answer.
#[test]
fn a_configured_cache_type_the_heads_cannot_hold_is_refused_at_load() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama", "models-config KV type") else {
        return;
    };
    let _l = lock();
    let home = home();
    let cfg = home.path().join("models.toml");
    let model = dir.join("model.gguf");
    std::fs::write(
        &cfg,
        format!(
            "[models.q4]\nmodel = {:?}\nctx = 64\nkv_type = \"q4_0\"\n",
            model.to_str().unwrap()
        ),
    )
    .unwrap();
    let srv = serve_without_m(home.path(), &["--models-config", cfg.to_str().unwrap()]);
    for _ in 0..2 {
        let r = srv.request(
            "POST",
            "/v1/completions",
            Some(&json!({"model": "q4", "prompt": "Hello", "max_tokens": 4}).to_string()),
        );
        assert_ne!(r.status, 200, "{}", r.text());
        assert!(
            r.text()
                .contains("KV cache type q4_0 for the keys needs heads that are multiples of 32"),
            "{}",
            r.text()
        );
    }
    assert!(!greedy(&srv, "smollm2-135m", "Hello").is_empty());
}

/// What an attacker helper found, each refused or bounded: a created model may not take a
/// stored model's `:latest` name or an empty one, nor hold parameters its requests would
/// refuse (a wrong type, an unknown name, a value out of range); a body that is not JSON
/// is answered as such on a server without -m; `/api/*` errors keep Ollama's shape; an
/// absurd keep-alive is reported as Ollama's "never"; a `--models-config` value beyond
/// the flag's bound ends the server at start.
#[test]
fn management_requests_cannot_take_or_break_models() {
    let _l = lock();
    let home = home();
    let srv = serve_without_m(home.path(), &[]);
    let post = |path: &str, body: Value| srv.request("POST", path, Some(&body.to_string()));
    for name in ["smollm2-135m:latest:latest", "smollm2-135m", ":latest"] {
        let r = post(
            "/api/create",
            json!({"model": name, "from": "smollm2-135m", "system": "HIJACKED", "stream": false}),
        );
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        assert!(r.json()["error"].is_string(), "{}", r.text());
    }
    for params in [
        json!({"temperature": "x"}),
        json!({"bogus": 1}),
        json!({"temperature": -1}),
        json!({"top_p": 7}),
    ] {
        let r = post(
            "/api/create",
            json!({"model": "broken", "from": "smollm2-135m", "parameters": params, "stream": false}),
        );
        assert_eq!(r.status, 400, "{params}: {}", r.text());
        assert!(r.text().contains("parameters"), "{}", r.text());
    }
    let tags = srv.request("GET", "/api/tags", None).json();
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"broken") && !names.contains(&""),
        "{names:?}"
    );
    let show = post("/api/show", json!({"model": "smollm2-135m:latest"})).json();
    assert!(show.get("system").is_none(), "{show}");

    let r = srv.post_raw("/v1/chat/completions", b"{");
    assert_eq!(r.status, 400);
    assert!(r.text().contains("JSON"), "{}", r.text());
    // A model file's upload is refused by name before it is read.
    let r = srv.post_raw("/api/blobs/sha256:00", b"GGUF");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("files"), "{}", r.text());
    let r = srv.request("POST", "/api/delete", Some("{}"));
    assert_eq!(r.status, 405);
    assert!(r.json()["error"].is_string(), "{}", r.text());

    let r = post(
        "/api/generate",
        json!({"model": "smollm2-135m", "keep_alive": "9999999999h"}),
    );
    assert_eq!(r.json()["done_reason"], "load");
    let ps = srv.request("GET", "/api/ps", None).json();
    let expires = ps["models"][0]["expires_at"].as_str().unwrap().to_string();
    assert!(expires.starts_with("23"), "{expires}");

    let err = config_refused(
        home.path(),
        "[models.b]\nmodel = \"smollm2-135m\"\nkv_size = 4294967296\n",
    );
    assert!(err.contains("kv_size"), "{err}");
}
