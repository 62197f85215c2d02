//! `frink serve --slot-save-path` end to end: a slot saved after a 4,000-token prompt and
//! restored into a new server process continues with the tokens the first process gives
//! (greedy and seeded), reports the reuse in `tokens_cached` and evaluates almost nothing
//! of the prompt (below 5% of a cold server's prompt time); the same for a recurrent
//! fixture. States of another model, KV type or adapter set are refused naming the
//! difference, as are paths for file names.

mod common;

use common::http::Server;
use common::serve::lock;
use serde_json::{json, Value};

/// `POST /completion` with `prompt` (a string or ids), its answer's ids, cached tokens and
/// prompt time (ms, and tokens evaluated).
fn complete(
    srv: &Server,
    prompt: &Value,
    seed: Option<u64>,
    n: usize,
) -> (Vec<u64>, u64, (f64, u64)) {
    let mut body =
        json!({"prompt": prompt, "n_predict": n, "return_tokens": true, "ignore_eos": true});
    match seed {
        Some(s) => {
            body["seed"] = json!(s);
            body["temperature"] = json!(0.8);
        }
        None => body["temperature"] = json!(0),
    }
    let r = srv.post_ok("/completion", &body);
    let ids = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    (
        ids,
        r["tokens_cached"].as_u64().unwrap(),
        (
            r["timings"]["prompt_ms"].as_f64().unwrap(),
            r["timings"]["prompt_n"].as_u64().unwrap(),
        ),
    )
}

fn slot(srv: &Server, id: usize, action: &str, file: &str) -> (u16, Value) {
    let r = srv.request(
        "POST",
        &format!("/slots/{id}?action={action}"),
        Some(&json!({"filename": file}).to_string()),
    );
    (r.status, r.json())
}

/// The conversation of one model: its first turn, saved; its next turn in the same
/// process (greedy, then seeded from the restored first turn), in a new process after a
/// restore, and in a cold process. `timed`: the prompt time after the restore must be
/// below 5% of the cold one (on a tiny fixture a request's fixed costs are most of it:
/// there the evaluated tokens are counted instead).
fn conversation(args: &[&str], first: Value, dir: &str, timed: bool) {
    let mut all = vec!["--ctx", "8192", "--parallel", "1", "--slot-save-path", dir];
    all.extend(args);
    let a = Server::start(&all);
    let (answer, _, _) = complete(&a, &first, None, 16);
    let (st, v) = slot(&a, 0, "save", "conv.bin");
    assert_eq!(st, 200, "{v}");
    let saved = v["n_saved"].as_u64().unwrap();
    // The next turn's prompt: the first turn, its answer, more.
    let next: Value = match &first {
        Value::String(s) => {
            let text = a.post_ok("/detokenize", &json!({"tokens": answer}))["content"]
                .as_str()
                .unwrap()
                .to_string();
            json!(format!("{s}{text} And after that,"))
        }
        Value::Array(ids) => {
            let mut ids = ids.clone();
            ids.extend(answer.iter().map(|&x| json!(x)));
            ids.extend(ids[1..9].to_vec());
            Value::Array(ids)
        }
        _ => unreachable!(),
    };
    let (greedy, _, _) = complete(&a, &next, None, 24);
    assert_eq!(slot(&a, 0, "restore", "conv.bin").0, 200);
    let (seeded, _, _) = complete(&a, &next, Some(42), 24);
    drop(a);

    let b = Server::start(&all);
    let (st, v) = slot(&b, 0, "restore", "conv.bin");
    assert_eq!((st, v["n_restored"].as_u64()), (200, Some(saved)), "{v}");
    let (g, cached, (warm_ms, warm_n)) = complete(&b, &next, None, 24);
    assert_eq!(g, greedy, "greedy continuation after the restart");
    assert!(cached >= saved - 16, "cached {cached} of {saved}");
    assert_eq!(slot(&b, 0, "restore", "conv.bin").0, 200);
    let (s, _, _) = complete(&b, &next, Some(42), 24);
    assert_eq!(s, seeded, "seeded continuation after the restart");
    drop(b);

    let c = Server::start(&all);
    let (g, cold_cached, (cold_ms, cold_n)) = complete(&c, &next, None, 24);
    assert_eq!((g, cold_cached), (greedy, 0));
    eprintln!(
        "{args:?}: {saved} tokens saved, {cached} reused; prompt {warm_ms:.1} ms ({warm_n} \
         tokens) after the restore, {cold_ms:.1} ms ({cold_n} tokens) cold ({:.1}%)",
        100.0 * warm_ms / cold_ms
    );
    assert!(
        warm_n * 20 < cold_n,
        "{warm_n} tokens evaluated against {cold_n} cold"
    );
    if timed {
        assert!(
            warm_ms < 0.05 * cold_ms,
            "{warm_ms} ms against {cold_ms} ms cold"
        );
    }
}

#[test]
fn a_restored_conversation_continues_bitwise_in_a_new_process() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // About 4,000 tokens of text.
    let text: String = (0..340)
        .map(|i| format!("Item {i} of the ledger was checked twice. "))
        .collect();
    conversation(&["-m", "smollm2-135m"], json!(text), d, true);
    if let Some(m) = frink_testdata::require("fixtures/tiny/mamba", "slots recurrent") {
        let ids: Vec<u32> = frink_testdata::spread_ids(256, 3, 4000);
        let m = m.join("model.gguf");
        conversation(&["-m", m.to_str().unwrap()], json!(ids), d, false);
    }
}

#[test]
fn other_models_kv_types_adapters_and_paths_are_refused() {
    let _g = lock();
    let Some(fx) = frink_testdata::require("fixtures/tiny/llama_lora", "slots refused") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let model = fx.join("model.gguf");
    let adapter = fx.join("adapter.gguf");
    let m = model.to_str().unwrap();
    let ids = json!([1, 2, 3, 4, 5, 6, 7, 8]);
    let a = Server::start(&["-m", m, "--slot-save-path", d, "--parallel", "1"]);
    complete(&a, &ids, None, 4);
    assert_eq!(slot(&a, 0, "save", "s.bin").0, 200);
    for (bad, why) in [
        ("../s.bin", "file name"),
        ("/tmp/s.bin", "file name"),
        ("", "file name"),
    ] {
        let (st, v) = slot(&a, 0, "save", bad);
        assert_eq!(st, 400, "{bad}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{v}");
    }
    let (st, v) = slot(&a, 0, "restore", "missing.bin");
    assert_eq!(st, 400, "{v}");
    drop(a);
    let refused = |args: &[&str], want: &str| {
        let mut all = vec!["--slot-save-path", d, "--parallel", "1"];
        all.extend(args);
        let s = Server::start(&all);
        let (st, v) = slot(&s, 0, "restore", "s.bin");
        assert_eq!(st, 400, "{args:?}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{args:?}: {msg}");
    };
    refused(&["-m", m, "--kv-type", "f32"], "KV cache type f16, not f32");
    refused(
        &["-m", m, "--lora", adapter.to_str().unwrap()],
        "LoRA adapters no adapters, not adapter.gguf at 1",
    );
    refused(&["-m", "smollm2-135m"], "another model");
    refused(&["-m", m, "--rope-freq-base", "5000"], "another model");
    // Without --slot-save-path, save and restore are not offered.
    let s = Server::start(&["-m", m, "--parallel", "1"]);
    assert_eq!(slot(&s, 0, "save", "s.bin").0, 501);
}

/// `frink run --prompt-cache FILE`: the second run reuses the first's prompt and answers
/// the same; a state of another KV type and a damaged file are refused.
#[test]
fn run_prompt_cache_reuses_and_refuses() {
    let Some(fx) = frink_testdata::require("fixtures/tiny/llama", "prompt cache") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("p.bin");
    let (m, c) = (fx.join("model.gguf"), cache.to_str().unwrap().to_string());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            m.to_str().unwrap(),
            "--json",
            "-n",
            "6",
            "--greedy",
            "--prompt-ids",
            "1,5,9,200,31,7,64,3,77,12",
            "--prompt-cache",
            &c,
        ];
        args.extend(extra);
        common::frink(&args)
    };
    let first = run(&[]);
    assert!(first.status.success(), "{}", common::stderr(&first));
    let a = common::last_json_line(&first);
    assert_eq!(a["timings"]["cached_tokens"], 0);
    let second = run(&[]);
    let b = common::last_json_line(&second);
    assert_eq!(b["ids"], a["ids"]);
    assert_eq!(
        b["timings"]["cached_tokens"], 9,
        "all but the last prompt token"
    );
    let other = run(&["--kv-type", "f32"]);
    assert_eq!(other.status.code(), Some(1));
    assert!(
        common::stderr(&other).contains("KV cache type f16, not f32"),
        "{}",
        common::stderr(&other)
    );
    let mut bytes = std::fs::read(&cache).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&cache, &bytes).unwrap();
    let damaged = run(&[]);
    let err = common::stderr(&damaged);
    assert_eq!(damaged.status.code(), Some(1), "{err}");
    assert!(
        err.contains("damaged") && !err.contains("panicked"),
        "{err}"
    );
}

/// `--cache-disk` on a model whose blocks alone cannot be reused is refused at start,
/// naming why.
#[test]
fn cache_disk_is_refused_where_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    for (fixture, why) in [("gemma3", "sliding-window"), ("mamba", "recurrent")] {
        let Some(fx) = frink_testdata::require(&format!("fixtures/tiny/{fixture}"), "cache disk")
        else {
            return;
        };
        let m = fx.join("model.gguf");
        let out = common::frink(&[
            "serve",
            "--port",
            "0",
            "-m",
            m.to_str().unwrap(),
            "--cache-disk",
            dir.path().to_str().unwrap(),
        ]);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{fixture}: {err}");
        assert!(
            err.contains("--cache-disk") && err.contains(why),
            "{fixture}: {err}"
        );
    }
}
