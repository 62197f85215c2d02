//! What the server tests share: one server at a time, and a chat request's shape.

use std::sync::Mutex;

/// Serializes the tests of one test file (each starts a server using both cores).
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds [`ONE_AT_A_TIME`] (a test that panicked before does not poison it).
pub fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[allow(unused_imports)] // each test binary uses its own subset
pub use frink_testdata::http::{chat, message};

/// A virtualenv with the official `openai`, `ollama` and `anthropic` packages (made once
/// under the target directory),
/// or `None` after a visible notice when pip cannot install it (a failure under CI=true).
pub fn openai_venv() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let python = dir.join("bin/python");
    let has = |p: &std::path::Path| {
        std::process::Command::new(p)
            .args(["-c", "import openai, jsonschema, ollama, anthropic"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has(&python) {
        return Some(python);
    }
    let run = |cmd: &mut std::process::Command| {
        cmd.output()
            .map(|o| {
                (
                    o.status.success(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                )
            })
            .unwrap_or_else(|e| (false, e.to_string()))
    };
    let (ok, err) = run(std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir));
    let (ok, err) = if ok {
        run(std::process::Command::new(dir.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "openai",
            "jsonschema",
            "ollama",
            "anthropic",
        ]))
    } else {
        (ok, err)
    };
    if ok && has(&python) {
        return Some(python);
    }
    let msg = format!(
        "cannot install the openai, jsonschema, ollama and anthropic packages into {}: {err}",
        dir.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    frink_testdata::skipped("the openai, ollama and anthropic client tests", &msg);
    None
}

/// Runs `tests/<script>` with the venv's `python`, the server's base URL and `args`;
/// asserts it succeeds and prints `marker`.
pub fn run_client_script(
    python: &std::path::Path,
    script: &str,
    srv: &super::http::Client,
    args: &[&str],
    marker: &str,
) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = std::process::Command::new(python)
        .arg(path)
        .arg(format!("http://127.0.0.1:{}/v1", srv.port))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    eprint!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed");
    assert!(text.contains(marker), "{script}: no {marker:?}");
}
