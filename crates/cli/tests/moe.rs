//! Mixture-of-experts from the command line: `--expert-budget` changes no token,
//! `run --stats` reports selections and cache misses, `inspect-plan` counts selections and
//! plans residency within the budget.

mod common;

use common::{frink, frink_with_stdin, last_json_line, stderr};

fn moe_file() -> Option<String> {
    let q = frink_testdata::require("fixtures/quant/Q4_K_M/qwen2_moe.gguf", "moe cli")?;
    Some(q.to_str().unwrap().to_string())
}

#[test]
fn budget_keeps_tokens_and_stats_show_misses() {
    let Some(m) = moe_file() else {
        return;
    };
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", &m, "--raw", "--greedy", "-n", "12", "--json"];
        args.extend_from_slice(extra);
        args.push("Once upon a time");
        let out = frink(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        out
    };
    let free = last_json_line(&run(&[]))["ids"].clone();
    // One layer's expert is 110592 or 127488 bytes here: 200K holds one and a half.
    let bounded = run(&["--expert-budget", "200K", "--stats"]);
    assert_eq!(last_json_line(&bounded)["ids"], free);
    let err = stderr(&bounded);
    assert!(err.contains("expert selections per layer"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("expert cache:"))
        .unwrap();
    let num = |key: &str| -> u64 {
        let at = line.find(key).unwrap_or_else(|| panic!("{line}"));
        line[..at]
            .split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(num(" misses") > 0, "{line}");
    let peak: u64 = line
        .rsplit("peak ")
        .next()
        .unwrap()
        .trim_end_matches(')')
        .parse()
        .unwrap();
    assert!(peak <= 200 * 1024, "{line}");
    // A budget below one expert is refused by name.
    let out = frink(&["run", "-m", &m, "--expert-budget", "1K", "-n", "1", "x"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("expert budget"), "{}", stderr(&out));
}

#[test]
fn inspect_plan_counts_and_plans() {
    let Some(m) = moe_file() else {
        return;
    };
    let out = frink_with_stdin(
        &[
            "inspect-plan",
            "-m",
            &m,
            "--prompt-file",
            "-",
            "--expert-budget",
            "300K",
        ],
        b"The quick brown fox jumps over the lazy dog.",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = last_json_line(&out);
    let n = v["prompt_tokens"].as_u64().unwrap();
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for l in layers {
        // Every token picks two experts per layer.
        let sum: u64 = l["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert_eq!(sum, 2 * n, "{l}");
    }
    let resident = v["resident_bytes"].as_u64().unwrap();
    assert!(resident > 0 && resident <= 300 * 1024, "{v}");
    assert!(v["resident_selections"].as_u64() <= v["selections"].as_u64());
}
