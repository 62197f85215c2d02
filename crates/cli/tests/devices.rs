//! `--device` and `frink devices` on whatever machine runs the tests: `frink devices`
//! describes the driver, NVRTC and the GPUs (or where it looked for them); `--device cuda`
//! exits 1 with one clear error line (no GPU, no driver, or, with a GPU, that models do not
//! run there yet); `--device auto` runs on the CPU.

mod common;

use common::{frink, last_json_line, stderr};

#[test]
fn devices_lists_what_it_found_or_where_it_looked() {
    let out = frink(&["devices", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = last_json_line(&out);
    for k in ["driver", "nvrtc"] {
        assert!(
            v[k]["path"].is_string()
                || v[k]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("looked in")),
            "{k}: {v}"
        );
    }
    assert!(v["gpus"].is_array(), "{v}");
    let text = frink(&["devices"]);
    assert!(text.status.success());
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(
        t.contains("driver:") && t.contains("NVRTC:") && t.contains("GPU"),
        "{t}"
    );
}

#[test]
fn device_cuda_is_a_clear_error_and_auto_runs() {
    let out = frink(&[
        "run", "--device", "cuda", "--raw", "--greedy", "-n", "2", "Hi",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    let line = e.lines().last().unwrap_or_default();
    assert!(line.starts_with("error: --device cuda:0:"), "{e}");
    assert!(
        line.contains("not found")
            || line.contains("do not run on GPUs yet")
            || line.contains("sees no GPU"),
        "{e}"
    );
    let out = frink(&["run", "--device", "cuda:nope", "-n", "2", "Hi"]);
    assert_eq!(out.status.code(), Some(2));
    let out = frink(&[
        "run", "--device", "auto", "--raw", "--greedy", "-n", "2", "--json", "Hi",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        last_json_line(&out)["ids"].as_array().map(Vec::len),
        Some(2)
    );
}
