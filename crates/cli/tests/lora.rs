//! `--lora` and `--lora-scaled` on the command line, against the llama_lora fixture
//! (transformers + PEFT logits at adapter scales 1 and 0.5), and a malformed adapter's
//! error.

mod common;

use common::{frink, stderr};
use frink_testdata::{read_f32, read_meta, rel_max_diff};

#[test]
fn logits_with_adapters_match_transformers() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_lora", "lora cli") else {
        return;
    };
    let ids: Vec<String> = read_meta(&dir)["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let model = dir.join("model.gguf");
    let adapter = dir.join("adapter.gguf");
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("l.bin");
    let scaled = format!("{}:0.5", adapter.display());
    for (flags, reference) in [
        (
            vec!["--lora", adapter.to_str().unwrap()],
            "logits_hf_lora_scale1.bin",
        ),
        (
            vec!["--lora-scaled", &scaled],
            "logits_hf_lora_scale0.5.bin",
        ),
        // Loaded but not applied: the base model.
        (
            vec![
                "--lora",
                adapter.to_str().unwrap(),
                "--lora-init-without-apply",
            ],
            "logits_hf.bin",
        ),
    ] {
        let mut args = vec!["logits", "-m", model.to_str().unwrap(), "--kv-type", "f32"];
        args.extend(&flags);
        let joined = ids.join(",");
        args.extend(["--ids", &joined, "--output", file.to_str().unwrap()]);
        let o = frink(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let err = rel_max_diff(&read_f32(&file), &read_f32(&dir.join(reference)));
        eprintln!("{flags:?}: {err:.2e} against {reference}");
        assert!(err < 1e-4, "{flags:?}: {err}");
    }
    // An adapter that is not one (the base model itself): one error line naming the key.
    let o = frink(&[
        "logits",
        "-m",
        model.to_str().unwrap(),
        "--lora",
        model.to_str().unwrap(),
        "--ids",
        "1,2",
        "--output",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("general.type"), "{}", stderr(&o));
}

/// `inspect` on an adapter: its base architecture, alpha, rank and target matrices.
#[test]
fn inspect_describes_an_adapter() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_lora", "lora inspect") else {
        return;
    };
    let adapter = dir.join("adapter.gguf");
    let o = frink(&["inspect", adapter.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("LoRA adapter:  for llama, alpha 8, rank 4, 14 matrices: ffn_down.weight ×2"),
        "{text}"
    );
    let o = frink(&["inspect", adapter.to_str().unwrap(), "--json"]);
    let v = common::last_json_line(&o);
    assert_eq!(v["lora"]["alpha"], 8.0);
    assert_eq!(v["lora"]["ranks"], serde_json::json!([4]));
    assert_eq!(v["lora"]["targets"].as_array().unwrap().len(), 14);
    assert_eq!(v["lora"]["base_architecture"], "llama");
}
