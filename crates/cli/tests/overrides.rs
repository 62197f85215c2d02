//! `--override-kv` and the RoPE flags (`--rope-scaling`, `--rope-freq-base`, `--yarn-*`):
//! each gives bitwise the logits of the same change written into the file with the GGUF
//! writer, changes them at all, and a value the metadata reader would refuse is refused
//! naming the key.

mod common;

use std::path::{Path, PathBuf};

use common::{frink, last_json_line, stderr};
use frink_gguf::{GgufFile, GgufWriter, MetaValue};

/// Flags, and the keys that write the same change into the file.
type Case<'a> = (Vec<&'a str>, Vec<(&'a str, MetaValue)>);

const IDS: &str = "1,5,9,200,31,7,64,3,77,12,40,41,42,43,44,45";

fn logits(model: &Path, flags: &[&str], out: &Path) -> Vec<u8> {
    let mut args = vec!["logits", "-m", model.to_str().unwrap(), "--kv-type", "f32"];
    args.extend(flags);
    args.extend(["--ids", IDS, "--output", out.to_str().unwrap()]);
    let o = frink(&args);
    assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
    std::fs::read(out).unwrap()
}

/// `model` rewritten with `keys` set, as a file in `dir`.
fn rewritten(model: &Path, keys: &[(&str, MetaValue)], dir: &Path, name: &str) -> PathBuf {
    let f = GgufFile::open(model).unwrap();
    let mut w = GgufWriter::from_file(&f).unwrap();
    for (k, v) in keys {
        w.add_metadata(*k, v.clone());
    }
    let path = dir.join(name);
    w.write_to_file(&path).unwrap();
    path
}

#[test]
fn overrides_equal_the_same_change_in_the_file() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama", "overrides") else {
        return;
    };
    let model = dir.join("model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l.bin");
    let plain = logits(&model, &[], &out);
    let f32v = MetaValue::F32;
    let cases: Vec<Case> = vec![
        (
            vec!["--rope-freq-base", "500000"],
            vec![("llama.rope.freq_base", f32v(500000.0))],
        ),
        (
            vec!["--override-kv", "llama.rope.freq_base=float:500000"],
            vec![("llama.rope.freq_base", f32v(500000.0))],
        ),
        // The RoPE flag wins over a key set both ways (llama.cpp's context parameters
        // override the metadata).
        (
            vec![
                "--override-kv",
                "llama.rope.freq_base=float:1000",
                "--rope-freq-base",
                "500000",
            ],
            vec![("llama.rope.freq_base", f32v(500000.0))],
        ),
        (
            vec!["--rope-scaling", "linear", "--rope-scale", "4"],
            vec![
                (
                    "llama.rope.scaling.type",
                    MetaValue::String("linear".into()),
                ),
                ("llama.rope.scaling.factor", f32v(4.0)),
            ],
        ),
        (
            vec!["--rope-scaling", "linear", "--rope-freq-scale", "0.25"],
            vec![
                (
                    "llama.rope.scaling.type",
                    MetaValue::String("linear".into()),
                ),
                ("llama.rope.scaling.factor", f32v(4.0)),
            ],
        ),
        (
            vec![
                "--rope-scaling",
                "yarn",
                "--rope-scale",
                "8",
                "--yarn-orig-ctx",
                "4",
                "--yarn-beta-fast",
                "16",
                "--yarn-attn-factor",
                "1.5",
            ],
            vec![
                ("llama.rope.scaling.type", MetaValue::String("yarn".into())),
                ("llama.rope.scaling.factor", f32v(8.0)),
                (
                    "llama.rope.scaling.original_context_length",
                    MetaValue::U32(4),
                ),
                ("llama.rope.scaling.yarn_beta_fast", f32v(16.0)),
                ("llama.rope.scaling.yarn_attn_factor", f32v(1.5)),
            ],
        ),
    ];
    for (i, (flags, keys)) in cases.iter().enumerate() {
        let variant = rewritten(&model, keys, tmp.path(), &format!("v{i}.gguf"));
        let from_file = logits(&variant, &[], &out);
        let from_flags = logits(&model, flags, &out);
        assert!(
            from_flags == from_file,
            "{flags:?}: differs from the rewritten file"
        );
        assert!(from_flags != plain, "{flags:?}: changed nothing");
    }
}

#[test]
fn override_kv_reaches_the_tokenizer() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama", "overrides tokenizer") else {
        return;
    };
    let model = dir.join("model.gguf");
    let prompt_ids = |flags: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            model.to_str().unwrap(),
            "--raw",
            "--json",
            "-n",
            "1",
        ];
        args.extend(flags);
        args.extend(["--greedy", "hello"]);
        let o = frink(&args);
        assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
        last_json_line(&o)["prompt_ids"].clone()
    };
    let with = prompt_ids(&["--override-kv", "tokenizer.ggml.add_bos_token=bool:true"]);
    let without = prompt_ids(&["--override-kv", "tokenizer.ggml.add_bos_token=bool:false"]);
    let bos = GgufFile::open(&model)
        .unwrap()
        .get("tokenizer.ggml.bos_token_id")
        .and_then(|v| v.as_u64())
        .unwrap();
    assert_eq!(with[0].as_u64(), Some(bos), "{with}");
    assert_eq!(
        with.as_array().unwrap()[1..],
        without.as_array().unwrap()[..],
        "{with} vs {without}"
    );
}

#[test]
fn bad_overrides_are_refused_naming_the_key() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama", "overrides refused") else {
        return;
    };
    let model = dir.join("model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l.bin");
    let cases: [(&[&str], &str); 7] = [
        // The file holds an integer there.
        (
            &["--override-kv", "llama.context_length=float:1.5"],
            "llama.context_length",
        ),
        (
            &["--override-kv", "llama.block_count=int:-1"],
            "llama.block_count",
        ),
        // Validated as the metadata is: a base that is not positive.
        (&["--rope-freq-base", "0"], "llama.rope.freq_base"),
        (
            &["--rope-scaling", "yarn", "--rope-scale", "4"],
            "original_context_length",
        ),
        (
            &["--rope-scale", "2", "--rope-freq-scale", "0.5"],
            "--rope-freq-scale",
        ),
        (&["--rope-scale", "-2"], "--rope-scale"),
        (
            &["--override-kv", "llama.rope.freq_base=double:1"],
            "double",
        ),
    ];
    for (flags, named) in cases {
        let mut args = vec!["logits", "-m", model.to_str().unwrap()];
        args.extend(flags);
        args.extend(["--ids", "1,2", "--output", out.to_str().unwrap()]);
        let o = frink(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{flags:?} was accepted");
        assert!(err.contains(named), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
}

#[test]
fn rope_flags_are_refused_where_no_layer_rotates() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/mamba", "overrides no rope") else {
        return;
    };
    let model = dir.join("model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l.bin");
    let o = frink(&[
        "logits",
        "-m",
        model.to_str().unwrap(),
        "--rope-freq-base",
        "20000",
        "--ids",
        "1,2",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("rotary"), "{}", stderr(&o));
}

/// llama.cpp's `-ctk`/`-ctv`: the same type for both is `--kv-type`'s cache (the same
/// logits); keys and values of different types are a cache of its own (logits unlike
/// either); an unknown name is refused naming the flag.
#[test]
fn cache_type_flags_are_kv_type_or_refused() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/qwen3", "cache types") else {
        return;
    };
    let model = dir.join("model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l.bin");
    let run = |flags: &[&str]| {
        let mut args = vec!["logits", "-m", model.to_str().unwrap()];
        args.extend(flags);
        args.extend(["--ids", IDS, "--output", out.to_str().unwrap()]);
        let o = frink(&args);
        let logits = std::fs::read(&out).unwrap_or_default();
        let _ = std::fs::remove_file(&out);
        (o.status.code(), stderr(&o), logits)
    };
    let (_, _, q8) = run(&["--kv-type", "q8_0"]);
    let (_, _, q4) = run(&["--kv-type", "q4_0"]);
    let (_, _, f16) = run(&[]);
    let (code, err, both) = run(&["-ctk", "q8_0", "-ctv", "q8_0"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(both == q8 && both != f16 && q4 != q8 && q4 != f16);
    let (code, err, q4s) = run(&["--cache-type-v", "q4_0", "--cache-type-k", "q4_0"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(q4s == q4);
    let (code, err, mixed) = run(&["-ctk", "q8_0"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!mixed.is_empty() && mixed != q8 && mixed != f16);
    let (code, err, _) = run(&["-ctv", "q9"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--cache-type-v q9: unknown KV cache type"),
        "{err}"
    );
}
