//! `frink verify` over every reference directory whose architecture frink implements: the
//! golden llama.cpp outputs of the three catalog models, the tiny fixtures (transformers'
//! fp32 logits) and the quantized fixtures (every ggml type in a real forward pass).
//! `verify` prints each check with its measured value; this test runs it and requires
//! exit 0 and the closing `N passed, 0 failed` line.

use std::process::Command;

fn verify(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_frink"))
        .arg("verify")
        .args(args)
        .output()
        .expect("run frink verify");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ frink verify {}\n{stdout}", args.join(" "));
    assert!(
        out.status.success(),
        "frink verify {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.ends_with(" passed, 0 failed"), "{last}");
    stdout
}

#[test]
fn tiny_fixtures_of_implemented_architectures() {
    let Some(root) = frink_testdata::require("fixtures/tiny", "verify tiny fixtures") else {
        return;
    };
    for name in [
        "llama",
        "llama_q256",
        "qwen2",
        "gemma3",
        "mistral",
        "qwen3",
        "gemma",
        "gemma2",
        "phi3",
        "granite",
        "olmo2",
        "stablelm",
        "starcoder2",
        "falcon",
        "bloom",
        "qwen2_moe",
        "qwen2_moe_q256",
        "qwen3_moe",
        "mixtral",
        "olmoe",
        "deepseek_v2",
        "deepseek_v3",
        "gpt_oss",
        "llama4",
        "gemma4",
    ]
    .into_iter()
    .chain(frink_testdata::RECURRENT_FIXTURES)
    {
        verify(&["--golden", root.join(name).to_str().unwrap()]);
    }
    // The LoRA fixture: its base model, and its adapter at each recorded scale.
    let out = verify(&["--golden", root.join("llama_lora").to_str().unwrap()]);
    for scale in ["1", "0.5"] {
        let line = format!("PASS logits with the adapter at scale {scale} vs transformers + PEFT");
        assert!(out.contains(&line), "{out}");
    }
}

#[test]
fn quantized_fixtures_every_type() {
    let Some(root) = frink_testdata::require("fixtures/quant", "verify quant fixtures") else {
        return;
    };
    let mut n = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        // The dense model and the mixture-of-experts one (compared up to the first
        // position whose experts differ from llama.cpp's recorded selection).
        for file in ["llama.gguf", "qwen2_moe.gguf"] {
            verify(&[
                "-m",
                dir.join(file).to_str().unwrap(),
                "--golden",
                dir.to_str().unwrap(),
            ]);
        }
        n += 1;
    }
    assert_eq!(n, 21, "quant fixture set changed");
}

#[test]
fn golden_catalog_models() {
    let Some(root) = frink_testdata::require("golden", "verify golden") else {
        return;
    };
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        verify(&["--golden", root.join(name).to_str().unwrap()]);
    }
}

/// `frink verify --intermediates`: each layer of the fixtures with recorded transformers
/// hidden states (crates/models/tests/data/hidden) is printed with its error and passes;
/// a file of another shape is an error naming the sizes.
#[test]
fn layer_outputs_against_transformers_hidden_states() {
    let Some(root) = frink_testdata::require("fixtures/tiny", "verify intermediates") else {
        return;
    };
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data/hidden");
    for (name, layers) in [
        ("llama", 2),
        ("qwen2", 2),
        ("qwen3", 3),
        ("gemma2", 4),
        ("gemma3", 6),
    ] {
        let file = data.join(format!("{name}.bin"));
        let out = verify(&[
            "--golden",
            root.join(name).to_str().unwrap(),
            "--intermediates",
            file.to_str().unwrap(),
        ]);
        assert_eq!(out.matches(" l_out: ").count(), layers, "{out}");
        assert!(out.contains(&format!(
            "PASS every layer's output vs transformers: {layers} layers"
        )));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_frink"))
        .args(["verify", "--golden"])
        .arg(root.join("llama"))
        .arg("--intermediates")
        .arg(data.join("gemma3.bin"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("2 layers × 24 tokens × 64 need 3072"), "{err}");
}

/// `frink logits --dump-intermediates`: the chosen names, layers and positions, one file
/// each with the index; an unknown name is refused naming the list.
#[test]
fn logits_dump_the_chosen_intermediates() {
    let Some(root) = frink_testdata::require("fixtures/tiny/qwen3", "dump intermediates") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let frink = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_frink"))
            .args(["logits", "-m"])
            .arg(root.join("model.gguf"))
            .args(["--ids", "1,5,9,30", "-o"])
            .arg(dir.path().join("logits.f32"))
            .args(extra)
            .output()
            .unwrap()
    };
    let dump = dir.path().join("dump");
    let out = frink(&[
        "--dump-intermediates",
        dump.to_str().unwrap(),
        "--dump-names",
        "attn_norm,l_out,result_norm",
        "--dump-layers",
        "1-2",
        "--dump-positions",
        "2-3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dump.join("index.json")).unwrap()).unwrap();
    let files: Vec<&str> = index
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["file"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            "attn_norm-1.f32",
            "l_out-1.f32",
            "attn_norm-2.f32",
            "l_out-2.f32",
            "result_norm.f32"
        ]
    );
    for r in index.as_array().unwrap() {
        let bytes = std::fs::metadata(dump.join(r["file"].as_str().unwrap()))
            .unwrap()
            .len();
        let rows = r["positions"].as_array().unwrap().len() as u64;
        assert_eq!(bytes, rows * r["width"].as_u64().unwrap() * 4, "{r}");
    }
    // result_norm: the logits' rows (all four), the others the chosen positions.
    assert_eq!(index[0]["positions"], serde_json::json!([2, 3]));
    let out = frink(&[
        "--dump-intermediates",
        dump.to_str().unwrap(),
        "--dump-names",
        "q",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("`q`") && err.contains("l_out"), "{err}");
}
