//! `frink serve`'s request fields end to end (the real binary over HTTP): malformed
//! requests, every field OpenAI's and llama.cpp's APIs define honoured, refused or
//! informational (docs/server.md's table), logit bias, penalties and chat template
//! variables. Tests run one at a time (a lock), each with its own server.

mod common;

use common::http::Server;
use common::serve::{chat, lock, message};
use common::{frink, last_json_line, stderr};
use serde_json::{json, Value};

/// `logit_bias` and `--logit-bias`: banning (-100) the first token of the greedy answer
/// changes the answer, and banning every token of it keeps all of them out, the same
/// through `frink run` and `frink serve`; llama.cpp's pair form with `false` is the same
/// ban; ids outside the vocabulary and biases out of range are 400s.
#[test]
fn logit_bias_bans_tokens_in_run_and_serve() {
    let _l = lock();
    let prompt = "Name three colours.";
    let run = |extra: &[String]| -> Value {
        let mut args: Vec<String> = ["run", "--json", "--greedy", "-t", "2", "-n", "16"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend_from_slice(extra);
        args.push(prompt.to_string());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = frink(&refs);
        assert!(out.status.success(), "{}", stderr(&out));
        last_json_line(&out)
    };
    let ids = |v: &Value| -> Vec<u64> {
        v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let plain = run(&[]);
    let a = ids(&plain);
    let first = a[0];
    let one = run(&["--logit-bias".into(), format!("{first}=-100")]);
    assert_ne!(one["text"], plain["text"]);
    assert!(!ids(&one).contains(&first));
    let mut every: Vec<u64> = a.clone();
    every.sort_unstable();
    every.dedup();
    let flags: Vec<String> = every
        .iter()
        .flat_map(|id| ["--logit-bias".to_string(), format!("{id}=-100")])
        .collect();
    let all = run(&flags);
    assert!(
        ids(&all).iter().all(|t| !every.contains(t)),
        "{all} contains a banned token of {every:?}"
    );
    let bad = frink(&["run", "--logit-bias", "99999999=-100", "-n", "1", prompt]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("outside the vocabulary"),
        "{}",
        stderr(&bad)
    );

    let srv = Server::start(&[]);
    let ask = |bias: Value| {
        srv.post_ok(
            "/v1/chat/completions",
            &chat(
                prompt,
                json!({"temperature": 0, "max_tokens": 16, "logit_bias": bias}),
            ),
        )
    };
    assert_eq!(message(&ask(json!({}))), plain["text"].as_str().unwrap());
    let ban_first = json!({ first.to_string(): -100 });
    assert_eq!(message(&ask(ban_first)), one["text"].as_str().unwrap());
    assert_eq!(
        message(&ask(json!([[first, false]]))),
        one["text"].as_str().unwrap()
    );
    let ban_all: serde_json::Map<String, Value> = every
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    assert_eq!(
        message(&ask(Value::Object(ban_all))),
        all["text"].as_str().unwrap()
    );
    for bias in [
        json!({"99999999": -100}),
        json!({"abc": 1}),
        json!({ first.to_string(): 101 }),
        json!({ first.to_string(): "x" }),
        json!([[first]]),
        json!(5),
    ] {
        let r = srv.post_raw(
            "/v1/chat/completions",
            chat(prompt, json!({"logit_bias": bias}))
                .to_string()
                .as_bytes(),
        );
        assert_eq!(r.status, 400, "{bias}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], "logit_bias");
    }
}

/// `--chat-template` replaces the file's template and `--chat-template-kwargs` sets its
/// variables; a request's `chat_template_kwargs` adds to and overrides them (the prompt the
/// server counts grows with each variable set).
#[test]
fn chat_template_and_its_kwargs_shape_the_prompt() {
    let _l = lock();
    let template = "Q: {{ messages[-1].content }}{% if flag %} FLAG{% endif %}{% if more %} MORE{% endif %}\nA:";
    let srv = Server::start(&[
        "--chat-template",
        template,
        "--chat-template-kwargs",
        r#"{"flag": false}"#,
    ]);
    let prompt_tokens = |extra: Value| srv.chat_prompt_tokens(&extra);
    let plain = prompt_tokens(json!({}));
    let flag = prompt_tokens(json!({"chat_template_kwargs": {"flag": true}}));
    let both = prompt_tokens(json!({"chat_template_kwargs": {"flag": true, "more": true}}));
    assert!(plain < flag && flag < both, "{plain} {flag} {both}");
    let r = srv.post_raw(
        "/v1/chat/completions",
        chat("hi", json!({"chat_template_kwargs": [1]}))
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 400);
    // The same through `frink run`: the prompt is the rendered text, tokenized.
    let run = frink(&[
        "run",
        "--json",
        "--greedy",
        "-n",
        "1",
        "--chat-template",
        template,
        "--chat-template-kwargs",
        r#"{"flag": true}"#,
        "hi",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let ids = last_json_line(&run)["prompt_ids"].clone();
    // (`trim_blocks`, as in Jinja2: the newline after `{% endif %}` goes.)
    let tok = frink(&["tokenize", "--json", "Q: hi FLAGA:"]);
    assert_eq!(ids, last_json_line(&tok), "{}", stderr(&tok));
    assert_eq!(ids.as_array().unwrap().len() as u64, flag);
}
