//! Running the `frink` binary from integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

/// Runs `frink ARGS` with `stdin` (or an empty standard input) and no RUST_LOG/FRINK_MODEL
/// from the caller's environment.
pub fn frink_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = spawn(args);
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Starts `frink ARGS` with its three streams piped and no RUST_LOG/FRINK_MODEL from the
/// caller's environment (for a test that reads or closes them as it runs).
pub fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_frink"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("FRINK_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run frink")
}

/// Runs `frink ARGS` with an empty standard input.
pub fn frink(args: &[&str]) -> Output {
    frink_with_stdin(args, b"")
}

/// Standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON value on the last line of standard output (CONTRACT.md `--json`).
pub fn last_json_line(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {last:?}"))
}
pub mod http;
pub mod serve;
