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
/// A JSON array of numbers as f64s (panics on anything else: a test's own data).
#[allow(dead_code)] // each test file uses its own part
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The cosine of two vectors.
#[allow(dead_code)]
pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

pub mod http;
pub mod serve;
