//! `frink quantize` against llama-quantize: `tests/data/quantize/llama_quantize_digests.json`
//! holds, for the tiny fixtures whose rows are whole 256-value blocks (llama_q256 and
//! qwen2_moe_q256) and every mix frink makes (and four option sets: `--pure`,
//! `--leave-output-tensor`, `--output-tensor-type`/`--token-embedding-type`,
//! `--tensor-type`), the type and the SHA-256 of each tensor's data in the anchor's
//! llama-quantize output, and of the whole file (made by `benches/quantize_compare.py
//! --digests`). frink's output must be that file, byte for byte; and what it refuses it
//! refuses by name.

mod common;

use common::{frink, stderr};
use sha2::{Digest, Sha256};

fn digests(path: &std::path::Path) -> Vec<(String, u32, String)> {
    let f = frink_gguf::GgufFile::open(path).unwrap();
    f.tensors()
        .map(|t| {
            let h = Sha256::digest(t.data);
            let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
            (t.info.name.clone(), t.info.ggml_type.id(), hex)
        })
        .collect()
}

#[test]
fn every_mix_gives_llama_quantizes_tensors() {
    let want: serde_json::Value =
        serde_json::from_str(include_str!("data/quantize/llama_quantize_digests.json")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (fixture, mixes) in want.as_object().unwrap() {
        let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{fixture}"), "quantize")
        else {
            return;
        };
        let input = dir.join("model.gguf");
        for (spec, tensors) in mixes.as_object().unwrap() {
            let out = tmp.path().join("q.gguf");
            let (mix, opts) = spec.split_once(' ').unwrap_or((spec, ""));
            let mut args = vec![
                "quantize",
                input.to_str().unwrap(),
                out.to_str().unwrap(),
                mix,
            ];
            args.extend(opts.split_whitespace());
            let o = frink(&args);
            assert!(o.status.success(), "{fixture} {spec}: {}", stderr(&o));
            let got = digests(&out);
            let whole = Sha256::digest(std::fs::read(&out).unwrap());
            let whole: String = whole.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(
                whole,
                tensors[""][1].as_str().unwrap(),
                "{fixture} {spec}: the file"
            );
            assert_eq!(
                got.len() + 1,
                tensors.as_object().unwrap().len(),
                "{fixture} {spec}"
            );
            for (name, ty, hash) in got {
                let w = &tensors[&name];
                assert_eq!(
                    u64::from(ty),
                    w[0].as_u64().unwrap(),
                    "{fixture} {spec}: {name}'s type"
                );
                assert_eq!(
                    hash,
                    w[1].as_str().unwrap(),
                    "{fixture} {spec}: {name}'s bytes"
                );
            }
            let f = frink_gguf::GgufFile::open(&out).unwrap();
            let ft = f.get("general.file_type").and_then(|v| v.as_u32()).unwrap();
            assert_eq!(
                frink_gguf::file_type_name(u64::from(ft)),
                Some(mix),
                "{spec}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 44);
}

#[test]
fn what_it_cannot_make_is_refused_by_name() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_q256", "quantize refusals") else {
        return;
    };
    let input = dir.join("model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let q8 = tmp.path().join("q8.gguf");
    assert!(frink(&[
        "quantize",
        input.to_str().unwrap(),
        q8.to_str().unwrap(),
        "Q8_0"
    ])
    .status
    .success());
    let out = tmp.path().join("out.gguf");
    let (i, o, q) = (
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        q8.to_str().unwrap(),
    );
    for (args, want) in [
        (
            vec![q, o, "Q4_K_M"],
            "requantizing from Q8_0 is refused without --allow-requantize",
        ),
        (
            vec![i, o, "IQ2_XS"],
            "IQ2_XS: frink cannot make this mix yet",
        ),
        (vec![i, o, "Q9_K"], "unknown quantization type"),
        (vec![i, o, "Q2_K_S"], "need an importance matrix"),
        (
            vec![i, o, "Q4_K_M", "--imatrix", "x.dat"],
            "does not read importance matrices yet",
        ),
        (vec![i, i, "Q4_K_M"], "is the input"),
    ] {
        let mut a = vec!["quantize"];
        a.extend(args);
        let r = frink(&a);
        assert_eq!(r.status.code(), Some(1), "{a:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(want), "{a:?}: {}", stderr(&r));
        assert!(!out.exists(), "{a:?} left an output");
    }
    // With --allow-requantize the Q8_0 file is quantized from its dequantized values.
    let r = frink(&["quantize", "--allow-requantize", q, o, "Q4_K_M"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(frink_gguf::GgufFile::open(&out).is_ok());
}
