//! What the server tests share: one server at a time, and a chat request's shape.

use std::sync::Mutex;

use serde_json::{json, Value};

/// Serializes the tests of one test file (each starts a server using both cores).
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds [`ONE_AT_A_TIME`] (a test that panicked before does not poison it).
pub fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A chat request of one user message with `extra`'s fields added.
pub fn chat(content: &str, extra: Value) -> Value {
    let mut v = json!({"model": "x", "messages": [{"role": "user", "content": content}]});
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    v
}

/// A chat answer's message text.
pub fn message(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no message in {v}"))
        .to_string()
}
