//! `frink run` end to end on the default model (smollm2-135m, fetched through the store):
//! the `--json` contract, seeds, stop strings, the token budget and the context limit.

mod common;

use common::{frink, frink_with_stdin, last_json_line, stderr};
use serde_json::Value;

fn json_run(args: &[&str]) -> Value {
    let mut all = vec!["run", "--json", "-t", "2"];
    all.extend_from_slice(args);
    let out = frink(&all);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    last_json_line(&out)
}

#[test]
fn json_output_has_the_contract_fields() {
    let v = json_run(&["--greedy", "--raw", "-n", "8", "The capital of France is"]);
    // Token ids of the golden capital_fr case (golden/smollm2-135m/generate.json); the
    // first generated token is llama.cpp's " Paris" (7042).
    assert_eq!(
        v["prompt_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    assert_eq!(v["ids"][0], 7042);
    assert_eq!(v["ids"].as_array().unwrap().len(), 8);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["text"].as_str().unwrap().starts_with(" Paris"), "{v}");
    let t = &v["timings"];
    for k in ["load_ms", "prompt_ms", "first_token_ms", "gen_ms"] {
        assert!(t[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {t}");
    }
    assert_eq!(t["prompt_tokens"], 5);
    // The first token is reported apart from the steady state.
    assert_eq!(t["gen_tokens"], 7);
}

#[test]
fn chat_answers_and_stops_at_end_of_turn() {
    // The golden chat_system case (golden/smollm2-135m/generate.json): llama.cpp answers
    // "The primary colors are: red, blue, and yellow." and ends the turn; its first steps
    // have margins of 1.2 to 6.7 logits, so the opening does not hinge on a near-tie.
    let v = json_run(&[
        "--greedy",
        "-n",
        "64",
        "--system",
        "You are a concise assistant.",
        "Name three primary colors.",
    ]);
    assert_eq!(v["finish_reason"], "stop", "{v}");
    // The end-of-turn token (<|im_end|> = 2) ends the ids and is not in the text.
    assert_eq!(v["ids"].as_array().unwrap().last().unwrap(), 2);
    let text = v["text"].as_str().unwrap();
    assert!(text.starts_with("The primary colors are"), "{text}");
    assert!(!text.contains("<|im_end|>"), "{text}");
    // The chat template was applied: the prompt starts with <|im_start|> (id 1).
    assert_eq!(v["prompt_ids"][0], 1);
}

#[test]
fn same_seed_same_tokens_and_different_seed_differs() {
    let args = [
        "--seed",
        "42",
        "--temp",
        "1.5",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "-n",
        "24",
        "--raw",
        "Once upon a time",
    ];
    let a = json_run(&args);
    let b = json_run(&args);
    assert_eq!(a["ids"], b["ids"]);
    let mut other = args;
    other[1] = "43";
    let c = json_run(&other);
    assert_ne!(
        a["ids"], c["ids"],
        "seeds 42 and 43 gave the same 24 tokens at temperature 1.5"
    );
}

#[test]
fn stop_string_ends_generation_and_is_not_shown() {
    let free = json_run(&["--greedy", "--raw", "-n", "12", "The capital of France is"]);
    let text = free["text"].as_str().unwrap();
    // Greedy text starts " Paris.\n\n…"; stop at the period.
    assert!(text.starts_with(" Paris."), "{text}");
    let stopped = json_run(&[
        "--greedy",
        "--raw",
        "-n",
        "12",
        "--stop",
        ".",
        "The capital of France is",
    ]);
    assert_eq!(stopped["text"], " Paris");
    assert_eq!(stopped["finish_reason"], "stop");
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let out = frink(&[
        "run",
        "--raw",
        "--ctx",
        "4",
        "-t",
        "2",
        "one two three four five six seven",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("the prompt is 7 tokens, longer than the context of 4 tokens (--ctx)"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    // Generation that reaches the context stops there with finish_reason "length".
    let v = json_run(&[
        "--greedy",
        "--raw",
        "--ctx",
        "12",
        "The capital of France is",
    ]);
    assert_eq!(v["finish_reason"], "length");
    assert_eq!(v["ids"].as_array().unwrap().len(), 12 - 5 + 1);
}

/// `frink chat`: two turns from standard input. The second answer depends on the first
/// turn: asked alone, the same question gets a different answer. (Which words a 135M model
/// picks hinges on near-ties, so the test compares, it does not expect a text.)
#[test]
fn chat_keeps_the_conversation() {
    let chat = |input: &[u8]| -> Vec<String> {
        let out = frink_with_stdin(
            &["chat", "--greedy", "-n", "24", "--stop", "\n", "-t", "2"],
            input,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let two = chat(b"My favourite colour is green.\nWhat is my favourite colour?\n");
    let alone = chat(b"What is my favourite colour?\n");
    assert_eq!(two.len(), 2, "{two:?}");
    assert_eq!(alone.len(), 1, "{alone:?}");
    assert!(two.iter().all(|a| !a.trim().is_empty()), "{two:?}");
    assert_ne!(two[1], alone[0], "the second turn ignored the first");
}

/// A message the context cannot hold is refused with both lengths and left out of the
/// conversation, which goes on (it ended the chat); commands are not sent to the model;
/// `/load` gives back what `/save` wrote.
#[test]
fn chat_refuses_an_overflowing_message_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.json");
    let long = "colour ".repeat(200);
    // A """ block is a message even when it starts with `/` (it ran as a command).
    let input = format!(
        "/set system Be brief.\n{long}\nSay hi.\n\"\"\"/set system pwned\"\"\"\n/help\n/save {0}\n/clear\n/load {0}\n/save {0}\n",
        file.display()
    );
    let out = frink_with_stdin(
        &["chat", "--greedy", "-n", "4", "-c", "128", "-t", "2"],
        input.as_bytes(),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("128") && err.contains("the message was not sent"),
        "{err}"
    );
    assert!(err.contains("/set parameter NAME VALUE"), "/help: {err}");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["system"], "Be brief.");
    let msgs = saved["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4, "{saved}");
    assert_eq!(msgs[0]["content"], "Say hi.");
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(msgs[2]["content"], "/set system pwned");
}

/// `--json-schema`, `--regex` and `--grammar` constrain the answer (JSON that satisfies
/// the schema, greedy and sampled; text matching the regex or Lark grammar, ending with
/// `stop`), a GBNF file too; a GBNF token reference, a schema keyword that cannot be
/// enforced and two constraints at once are refused.
#[test]
fn json_schema_regex_and_grammar_flags_constrain_the_answer() {
    let schema = r#"{"type":"object","properties":{"colour":{"enum":["red","green","blue"]},"count":{"type":"integer","minimum":1,"maximum":9}},"required":["colour","count"],"additionalProperties":false}"#;
    for seed in ["--greedy", "--seed=4"] {
        let v = json_run(&[
            seed,
            "-n",
            "60",
            "--json-schema",
            schema,
            "Pick a colour and a count.",
        ]);
        assert_eq!(v["finish_reason"], "stop", "{v}");
        let a: Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
        assert!(
            ["red", "green", "blue"].contains(&a["colour"].as_str().unwrap()),
            "{a}"
        );
        assert!((1..=9).contains(&a["count"].as_i64().unwrap()), "{a}");
        assert_eq!(a.as_object().unwrap().len(), 2);
    }
    let dir = tempfile::tempdir().unwrap();
    let schema_file = dir.path().join("s.json");
    std::fs::write(&schema_file, schema).unwrap();
    let v = json_run(&[
        "--greedy",
        "-n",
        "60",
        "--json-schema",
        schema_file.to_str().unwrap(),
        "Pick.",
    ]);
    assert!(
        serde_json::from_str::<Value>(v["text"].as_str().unwrap()).is_ok(),
        "{v}"
    );

    let v = json_run(&[
        "--greedy",
        "-n",
        "30",
        "--regex",
        "(yes|no)\\.",
        "Is the sky blue?",
    ]);
    assert!(
        ["yes.", "no."].contains(&v["text"].as_str().unwrap()),
        "{v}"
    );
    assert_eq!(v["finish_reason"], "stop");

    let lark = dir.path().join("g.lark");
    std::fs::write(
        &lark,
        "%llguidance {}\nstart: \"The answer is \" /[0-9]{1,2}/ \".\"\n",
    )
    .unwrap();
    let v = json_run(&[
        "--greedy",
        "-n",
        "30",
        "--grammar",
        lark.to_str().unwrap(),
        "What is 2+2?",
    ]);
    let text = v["text"].as_str().unwrap();
    assert!(
        text.starts_with("The answer is ") && text.ends_with('.'),
        "{v}"
    );

    let gbnf = dir.path().join("g.gbnf");
    std::fs::write(&gbnf, "root ::= (\"yes\" | \"no\") \"!\"\n").unwrap();
    let v = json_run(&[
        "--greedy",
        "-n",
        "10",
        "--grammar",
        gbnf.to_str().unwrap(),
        "Is it?",
    ]);
    assert!(
        ["yes!", "no!"].contains(&v["text"].as_str().unwrap()),
        "{v}"
    );
    std::fs::write(&gbnf, "root ::= <think> [a-z]*\n").unwrap();
    let out = frink(&["run", "-n", "4", "--grammar", gbnf.to_str().unwrap(), "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("token references"),
        "{}",
        stderr(&out)
    );
    let out = frink(&[
        "run",
        "-n",
        "4",
        "--json-schema",
        r#"{"type":"array","uniqueItems":true}"#,
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("uniqueItems"), "{}", stderr(&out));
    let out = frink(&[
        "run",
        "-n",
        "4",
        "--json-schema",
        "{}",
        "--regex",
        "a",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A context no machine holds is refused before anything is allocated, naming the flag
/// (before the check: `--ctx 999999999999` aborted with "memory allocation of
/// 63999999999936 bytes failed", exit 134).
#[test]
fn a_context_larger_than_memory_is_refused_naming_the_flag() {
    let Some(root) = frink_testdata::require("fixtures/tiny", "KV memory check") else {
        return;
    };
    let m = root.join("llama").join("model.gguf");
    let m = m.to_str().unwrap();
    for (args, flag) in [
        (
            vec![
                "run",
                "-m",
                m,
                "--raw",
                "--greedy",
                "-n",
                "2",
                "--prompt-ids",
                "1,2,3",
                "--ctx",
                "2000000000",
            ],
            "--ctx",
        ),
        (
            vec![
                "serve",
                "--port",
                "0",
                "-m",
                m,
                "--ctx",
                "99999999",
                "--parallel",
                "64",
            ],
            "--parallel 64 × --ctx 99999999 (the KV pool's default size)",
        ),
        (
            vec!["bench", "-m", m, "-p", "999999999999", "-n", "1", "-r", "1"],
            "-d + -p + -n",
        ),
    ] {
        let out = frink(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("error: {flag}: a KV cache of")) && err.contains("GiB"),
            "{args:?}: {err}"
        );
        // Refused from the file's metadata before the server listens or loads.
        assert!(!err.contains("listening"), "{args:?}: {err}");
    }
}

/// `--kv-type q8_0` on a model whose heads are not whole 32-value blocks (the tiny
/// fixtures' 16) is refused at load, naming the sizes (llama.cpp refuses the same).
#[test]
fn a_q8_0_cache_on_heads_of_16_is_refused() {
    let Some(root) = frink_testdata::require("fixtures/tiny", "q8_0 KV refusal") else {
        return;
    };
    let m = root.join("llama").join("model.gguf");
    let out = frink(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--kv-type",
        "q8_0",
        "--raw",
        "-n",
        "1",
        "--prompt-ids",
        "1,2",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "KV cache type q8_0 for the keys needs heads that are multiples of 32 values \
             (this model's key heads are 16)"
        ),
        "{err}"
    );
}

/// The draft model's heads are checked against the KV cache type too (an attacker helper
/// found `run` aborting in the scheduler): mistral's heads of 32 take a q4_0 cache, its
/// llama draft's of 16 do not, and the error names the draft.
#[test]
fn a_draft_model_whose_heads_cannot_hold_the_cache_type_is_refused() {
    let Some(root) = frink_testdata::require("fixtures/tiny", "draft KV refusal") else {
        return;
    };
    let (m, d) = (
        root.join("mistral/model.gguf"),
        root.join("llama/model.gguf"),
    );
    let out = frink(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-md",
        d.to_str().unwrap(),
        "--spec",
        "draft",
        "--kv-type",
        "q4_0",
        "--raw",
        "-n",
        "4",
        "Hello world",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the draft model") && err.contains("multiples of 32 values"),
        "{err}"
    );
}

/// `--draft-model` (also llama.cpp's `-md`): `run` and `chat` with smollm2 drafting for
/// itself give the tokens of `--spec off`, greedy and seeded, and its proposals are
/// taken (`speculation` in `--json`), every one under `--spec-sampling rejection`; a
/// draft model of another vocabulary, `--spec draft` without one, `--spec ngram` with one
/// and an unknown `--spec-sampling` are refused naming the flag.
#[test]
fn a_draft_model_changes_no_token() {
    let prompt = "Write a list of the numbers from one to twenty in words.";
    for sampling in [&["--greedy"][..], &["--seed", "7", "--temp", "0.8"][..]] {
        let run = |extra: &[&str]| {
            let mut a = sampling.to_vec();
            a.extend_from_slice(&["-n", "48"]);
            a.extend_from_slice(extra);
            a.push(prompt);
            json_run(&a)
        };
        let off = run(&["--spec", "off"]);
        let drafted = run(&["-md", "smollm2-135m"]);
        assert_eq!(drafted["ids"], off["ids"], "{sampling:?}");
        assert_eq!(off["speculation"]["proposed"], 0);
        let s = &drafted["speculation"];
        eprintln!("{sampling:?}: {s}");
        assert!(s["accepted"].as_u64().unwrap() > 0, "{sampling:?}: {s}");
    }
    // Rejection sampling with a draft sampling the model's own chain takes every
    // proposal.
    let rejection = json_run(&[
        "--seed",
        "7",
        "--temp",
        "0.8",
        "-n",
        "48",
        "-md",
        "smollm2-135m",
        "--spec-sampling",
        "rejection",
        prompt,
    ]);
    let s = &rejection["speculation"];
    assert!(s["proposed"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["accepted"], s["proposed"], "rejection sampling: {s}");
    let chat = |extra: &[&str]| {
        let mut a = vec!["chat", "--greedy", "-n", "24", "--stop", "\n", "-t", "2"];
        a.extend_from_slice(extra);
        let out = frink_with_stdin(
            &a,
            b"My favourite colour is green.\nWhat is my favourite colour?\n",
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        chat(&["--draft-model", "smollm2-135m"]),
        chat(&["--spec", "off"])
    );
    for (args, want) in [
        (&["-md", "qwen2.5-coder-0.5b"][..], "same vocabulary"),
        (&["--spec", "draft"][..], "--draft-model"),
        (
            &["--spec", "ngram", "-md", "smollm2-135m"][..],
            "--spec draft",
        ),
        (&["--spec-sampling", "typical"][..], "--spec-sampling"),
    ] {
        let mut a = vec!["run", "-n", "2"];
        a.extend_from_slice(args);
        a.push("x");
        let out = frink(&a);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
    }
}

/// Starts `frink run` on a long answer (4,000 tokens past end of generation: about 20 s on
/// two cores) with its standard output piped, and waits for its first `bytes` bytes.
fn long_run(bytes: usize) -> (std::process::Child, std::process::ChildStdout) {
    use std::io::Read;
    let mut child = common::spawn(&[
        "run",
        "--greedy",
        "--ignore-eos",
        "-n",
        "4000",
        "-t",
        "2",
        "Write a very long essay about the sea.",
    ]);
    drop(child.stdin.take());
    let mut stdout = child.stdout.take().unwrap();
    let mut got = vec![0u8; bytes];
    stdout.read_exact(&mut got).unwrap();
    (child, stdout)
}

/// Waits for `child` at most `limit`; its exit status, stderr and the time it took.
fn wait_within(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> (std::process::ExitStatus, String, std::time::Duration) {
    use std::io::Read;
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("still running {limit:?} after");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err, t0.elapsed())
}

/// `frink run … | head -c 50`: the reader going away ends generation at once, quietly, with
/// exit 0 (measured: about 0.1 s after the close; before, a panic on the final newline after
/// the whole 4,000-token answer, ~20 s).
#[test]
fn a_closed_stdout_stops_generation_at_once_and_quietly() {
    let (child, stdout) = long_run(50);
    drop(stdout);
    let (status, err, took) = wait_within(child, std::time::Duration::from_secs(15));
    assert!(status.success(), "{status}: {err}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

/// Ctrl+C during `frink run`: the answer stops at the next token, the timing line is
/// printed, exit 0.
#[test]
fn sigint_stops_generation_and_prints_the_timing_line() {
    let (child, mut stdout) = long_run(50);
    let status = std::process::Command::new("kill")
        .args(["-s", "INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).map(|_| rest)
    });
    let (status, err, took) = wait_within(child, std::time::Duration::from_secs(15));
    assert!(status.success(), "{status}: {err}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    assert!(err.contains("more tokens in"), "the timing line: {err}");
    assert!(reader.join().unwrap().is_ok());
}
