//! `frink quantize` against llama-quantize: `tests/data/quantize/llama_quantize_digests.json`
//! holds, for the tiny fixtures whose rows are whole 256-value blocks (llama_q256 and
//! qwen2_moe_q256) and every mix llama-quantize makes without an importance matrix (and
//! four option sets: `--pure`, `--leave-output-tensor`,
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
    assert!(n == 54 || n == 0, "{n}");
}

/// With an importance matrix (llama-imatrix's, on the fixtures, 4 chunks of 128 tokens of
/// the golden corpus; GGUF, and for llama_q256 also its legacy `.dat`): every mix's (the
/// IQ1, IQ2 and IQ3 ones included)
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
    assert!(n == 60 || n == 0, "{n}");
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
            "quantization in the IQ2_XS mix needs an importance matrix",
        ),
        (vec![i, o, "Q9_K"], "unknown quantization type"),
        (vec![i, o, "Q2_K_S"], "needs an importance matrix"),
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

fn sha256_file(p: &std::path::Path) -> String {
    let h = Sha256::digest(std::fs::read(p).unwrap());
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// `--keep-split`: llama_q256 split as `llama-gguf-split --split --split-max-tensors 8`
/// splits it (rebuilt here with frink's writer; the shards' SHA-256 are gguf-split's), then
/// quantized shard by shard. Each output shard is llama-quantize's `--keep-split` one byte
/// for byte (Q4_K_M, and Q3_K_M, whose attention-V rule counts tensors in the split
/// order); without `--keep-split` the split input gives one file.
#[test]
fn keep_split_gives_llama_quantizes_shards() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_q256", "keep-split") else {
        return;
    };
    let whole = frink_gguf::GgufFile::open(dir.join("model.gguf")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let infos = whole.tensor_infos();
    let shards: Vec<&[frink_gguf::TensorInfo]> = infos.chunks(8).collect();
    for (i, part) in shards.iter().enumerate() {
        let mut w = frink_gguf::GgufWriter::new();
        if i == 0 {
            for (k, v) in whole.metadata() {
                w.add_metadata(k.clone(), v.clone());
            }
        }
        // gguf-split's order: it sets split.count last (a placeholder first, replaced).
        w.add_metadata("split.no", frink_gguf::MetaValue::U16(i as u16));
        w.add_metadata(
            "split.tensors.count",
            frink_gguf::MetaValue::I32(infos.len() as i32),
        );
        w.add_metadata(
            "split.count",
            frink_gguf::MetaValue::U16(shards.len() as u16),
        );
        for t in *part {
            let data = whole.tensor(&t.name).unwrap().data.to_vec();
            w.add_tensor(t.name.clone(), t.ggml_type, &t.shape, data)
                .unwrap();
        }
        let p = tmp.path().join(format!("in-{:05}-of-00003.gguf", i + 1));
        w.write_to_file(&p).unwrap();
    }
    let input_digests = [
        "194bdf621883459a0968f23d8462dba4f1d61e9793e804dc19da2f1f92b94fec",
        "c630efdee47c4d2fb3f684cb015b10bc29f9decb829e8b84ffe2ea5342996e0c",
        "9290df91058bc4a30800bb4dc9ae6ccd18e29850130761d6266cbe8668bd7e46",
    ];
    for (i, want) in input_digests.iter().enumerate() {
        let p = tmp.path().join(format!("in-{:05}-of-00003.gguf", i + 1));
        assert_eq!(
            &sha256_file(&p),
            want,
            "input shard {} is not gguf-split's",
            i + 1
        );
    }
    let first = tmp.path().join("in-00001-of-00003.gguf");
    let want = [
        (
            "Q4_K_M",
            [
                "86ce9da4e9c392a0945a6b4450c951ff7f071ae7b390dbef35f4da9f99b0abb9",
                "9b72d59d0a7c2b649f7f1ddac6720392fc358a1174c78ec2f97833e2c96d3d23",
                "e604c20049ec1ccd2b647514f0f8fa6430948021078c7e8a8a28e24b1798b228",
            ],
        ),
        (
            "Q3_K_M",
            [
                "1c80c1c299e888c42580828b6b38a14dd26b55331bf374b0936e6bd575778ad0",
                "4d9a8e3507a1c5ca074d9a996f3814b0f9e3faf50e25c333b3f34b10c1ea6b9b",
                "e7c7d146826572faa00bf88b34227bec37fa1c0e4ca44148c113b08758bea317",
            ],
        ),
    ];
    for (mix, shards) in want {
        let out = tmp.path().join(format!("out-{mix}"));
        let r = frink(&[
            "quantize",
            "--keep-split",
            first.to_str().unwrap(),
            out.to_str().unwrap(),
            mix,
        ]);
        assert!(r.status.success(), "{}", stderr(&r));
        for (i, want) in shards.iter().enumerate() {
            let p = tmp
                .path()
                .join(format!("out-{mix}-{:05}-of-00003.gguf", i + 1));
            assert_eq!(&sha256_file(&p), want, "{mix} shard {}", i + 1);
        }
    }
    // Without --keep-split: one file, the same as from the unsplit model.
    let (a, b) = (tmp.path().join("a.gguf"), tmp.path().join("b.gguf"));
    for (input, out) in [(first.as_path(), &a), (&dir.join("model.gguf"), &b)] {
        let r = frink(&[
            "quantize",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "Q4_K_M",
        ]);
        assert!(r.status.success(), "{}", stderr(&r));
    }
    assert_eq!(sha256_file(&a), sha256_file(&b));
}

/// Outputs that a rename would wrongly replace, outputs that are inputs, and inputs that
/// are not models or hold values that are not finite: each refused by name, before any
/// work, leaving every file as it was and no temporary file behind.
#[test]
fn hostile_paths_and_inputs_are_refused() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_q256", "hostile quantize") else {
        return;
    };
    let model = dir.join("model.gguf");
    let m = model.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    // A copy named like a temporary file, and a FIFO and a folder as outputs.
    std::fs::copy(&model, t("in.gguf.part")).unwrap();
    let fifo = t("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::create_dir(t("dir")).unwrap();
    // A model with one infinite weight.
    let whole = frink_gguf::GgufFile::open(&model).unwrap();
    let mut w = frink_gguf::GgufWriter::new();
    for (k, v) in whole.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for (i, ti) in whole.tensor_infos().iter().enumerate() {
        let mut data = whole.tensor(&ti.name).unwrap().data.to_vec();
        if i == 3 {
            data[8..12].copy_from_slice(&f32::INFINITY.to_le_bytes());
        }
        w.add_tensor(ti.name.clone(), ti.ggml_type, &ti.shape, data)
            .unwrap();
    }
    w.write_to_file(t("inf.gguf")).unwrap();
    let imatrix = data_dir().join("imatrix-llama_q256.gguf");
    let (part, inf, imx) = (
        t("in.gguf.part"),
        t("inf.gguf"),
        imatrix.to_str().unwrap().to_string(),
    );
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let o = s(&t("o.gguf"));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![m.into(), s(&fifo), "Q8_0".into()],
            "not a regular file",
        ),
        (
            vec![m.into(), s(&t("dir")), "Q8_0".into()],
            "not a regular file",
        ),
        (vec![s(&part), s(&part), "Q8_0".into()], "is the input"),
        (
            vec![m.into(), s(&t("nodir/o.gguf")), "Q8_0".into()],
            "does not exist",
        ),
        (vec![s(&inf), o.clone(), "Q8_0".into()], "holds inf"),
        (
            vec![imx.clone(), o.clone(), "Q8_0".into()],
            "not a model file",
        ),
        (
            vec![
                "--imatrix".into(),
                "/dev/zero".into(),
                m.into(),
                o.clone(),
                "Q4_K_M".into(),
            ],
            "not a regular file",
        ),
    ];
    for (args, want) in cases {
        let mut a = vec!["quantize"];
        a.extend(args.iter().map(String::as_str));
        let r = frink(&a);
        assert_eq!(r.status.code(), Some(1), "{a:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(want), "{a:?}: {}", stderr(&r));
    }
    // Quantizing the copy named *.gguf.part works and leaves it whole.
    let r = frink(&["quantize", &s(&part), &s(&t("q8.gguf")), "Q8_0"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(
        std::fs::metadata(&part).unwrap().len(),
        std::fs::metadata(&model).unwrap().len()
    );
    // imatrix: its output may not be the model.
    let corpus = frink_testdata::require("golden/corpus/gpl3.txt", "hostile imatrix").unwrap();
    let r = frink(&[
        "imatrix",
        "-m",
        &s(&part),
        "-f",
        corpus.to_str().unwrap(),
        "-o",
        &s(&part),
    ]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("is the input"), "{}", stderr(&r));
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part") && n != "in.gguf.part")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(!t("o.gguf").exists());
}
