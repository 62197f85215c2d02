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
