//! `frink quantize` against llama-quantize: `tests/data/quantize/llama_quantize_digests.json`
//! holds, for the tiny fixtures whose rows are whole 256-value blocks (llama_q256 and
//! qwen2_moe_q256) and every mix frink makes without an importance matrix (and four
//! option sets: `--pure`, `--leave-output-tensor`,
//! `--output-tensor-type`/`--token-embedding-type`, `--tensor-type`), the type and the SHA-256 of each tensor's data in the anchor's
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

/// Runs `frink quantize` for every fixture and spec of the digest file `want` (in
/// `cwd`, where the specs' `--imatrix` files are: their path is written into the file)
/// and checks each output against llama-quantize's. Returns how many it checked (0 when
/// the fixtures are absent).
fn check_digests(want: &str, cwd: &std::path::Path) -> usize {
    let want: serde_json::Value = serde_json::from_str(want).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (fixture, mixes) in want.as_object().unwrap() {
        let Some(dir) = frink_testdata::require(&format!("fixtures/tiny/{fixture}"), "quantize")
        else {
            return 0;
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
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_frink"))
                .args(&args)
                .current_dir(cwd)
                .output()
                .unwrap();
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
    checked
}

fn data_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quantize")
}

#[test]
fn every_mix_gives_llama_quantizes_tensors() {
    let n = check_digests(
        include_str!("data/quantize/llama_quantize_digests.json"),
        &data_dir(),
    );
    assert!(n == 50 || n == 0, "{n}");
}

/// With an importance matrix (llama-imatrix's, on the fixtures, 4 chunks of 128 tokens of
/// the golden corpus; GGUF, and for llama_q256 also its legacy `.dat`): every mix's
/// tensors and whole file (with the `quantize.imatrix.*` keys) are llama-quantize's,
/// including `Q2_K_S`, which needs one, the mixes whose first FFN-down layers change with
/// one (Q4_0, Q5_0, IQ4_NL, IQ4_XS), the MoE fixture's per-expert weights (some experts
/// never routed to), and `--include-weights`/`--exclude-weights`. Five more use the
/// matrices `frink imatrix` wrote (`imatrix-frink-*`, GGUF and `.dat`, the same text and
/// chunks): llama-quantize read them to make its files, so it reads frink's format.
#[test]
fn every_mix_with_an_imatrix_gives_llama_quantizes_tensors() {
    let n = check_digests(
        include_str!("data/quantize/llama_quantize_imatrix_digests.json"),
        &data_dir(),
    );
    assert!(n == 40 || n == 0, "{n}");
}

/// A damaged or mismatched importance matrix is refused by name, before any output.
#[test]
fn damaged_importance_matrices_are_refused() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_q256", "imatrix refusals") else {
        return;
    };
    let input = dir.join("model.gguf");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.gguf");
    let good = std::fs::read(data_dir().join("imatrix-llama_q256.dat")).unwrap();
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..good.len() / 2].to_vec(), "cut short"),
        (vec![0, 0, 0, 0], "entry count 0"),
        (
            b"GGUF\x03\0\0\0garbage".to_vec(),
            "not an importance matrix",
        ),
    ];
    let mut nan = good.clone();
    // The first entry's first value (after count, name length, name, ncall and nval).
    let len = i32::from_le_bytes(nan[4..8].try_into().unwrap()) as usize;
    let at = 8 + len + 8;
    nan[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    cases.push((nan, "holds NaN"));
    let mut huge = good.clone();
    huge[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
    cases.push((huge, "cut short"));
    let bad = tmp.path().join("bad.dat");
    for (bytes, want) in cases {
        std::fs::write(&bad, &bytes).unwrap();
        let r = frink(&[
            "quantize",
            "--imatrix",
            bad.to_str().unwrap(),
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "Q4_K_M",
        ]);
        assert_eq!(r.status.code(), Some(1), "{want}: {}", stderr(&r));
        assert!(stderr(&r).contains(want), "{want}: {}", stderr(&r));
        assert!(!out.exists());
    }
    // A matrix whose first entry has half its columns: refused by size, naming it.
    let nval_at = 8 + len + 4;
    let nval = i32::from_le_bytes(good[nval_at..nval_at + 4].try_into().unwrap()) as usize;
    let mut half = good[..nval_at].to_vec();
    half.extend((nval as i32 / 2).to_le_bytes());
    half.extend(&good[nval_at + 4..nval_at + 4 + nval * 2]);
    half.extend(&good[nval_at + 4 + nval * 4..]);
    std::fs::write(&bad, &half).unwrap();
    let r = frink(&[
        "quantize",
        "--imatrix",
        bad.to_str().unwrap(),
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "Q4_K_M",
    ]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("the importance matrix has"),
        "{}",
        stderr(&r)
    );
    assert!(!out.exists());
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
            vec![i, o, "Q4_K_M", "--include-weights", "attn"],
            "give --imatrix FILE",
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
