//! `frink perplexity --kl-divergence-base FILE [--kl-divergence]` on the tiny llama fixture
//! (f32 weights), against llama-perplexity's own file:
//! `tests/data/kld/llama-perplexity-llama_q256.kld` is the anchor's
//! `llama-perplexity -m fixtures/tiny/llama_q256/model.gguf -f golden/corpus/gpl3.txt
//! -c 128 -b 128 -t 2 --chunks 4 --kl-divergence-base FILE` (perplexity 1444.29).

mod common;

use common::{frink, last_json_line, stderr};

/// The tiny llama fixture, and the corpus's first 4,000 bytes in a temporary folder.
struct Setup {
    model: String,
    text: String,
    corpus_text: String,
    tmp: tempfile::TempDir,
}

fn setup() -> Option<Setup> {
    let dir = frink_testdata::require("fixtures/tiny/llama_q256", "kl-divergence")?;
    let corpus = frink_testdata::require("golden/corpus/gpl3.txt", "kl-divergence")?;
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("short.txt");
    let corpus_text = std::fs::read_to_string(&corpus).unwrap();
    std::fs::write(&text, &corpus_text[..4000]).unwrap();
    Some(Setup {
        model: dir.join("model.gguf").to_str().unwrap().to_string(),
        text: text.to_str().unwrap().to_string(),
        corpus_text,
        tmp,
    })
}

/// Asserts that `frink args` fails with a message containing `says`, without a panic.
fn refused(args: &[&str], says: &str) {
    let o = frink(args);
    let e = stderr(&o);
    assert!(!o.status.success() && e.contains(says), "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{e}");
}

fn llama_base() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kld/llama-perplexity-llama_q256.kld")
}

fn kld(model: &str, base: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "perplexity",
        "-m",
        model,
        "--kl-divergence-base",
        base,
        "--kl-divergence",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = frink(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    last_json_line(&o)
}

/// llama-perplexity's file read by frink: the same perplexity for the base and for
/// frink's run (measured 1444.2876 against 1444.2875) and a divergence of nothing (the
/// engines compute the same logits on f32 weights: mean 1.4e-7, largest 7e-6 nats, from
/// the file's 16-bit log-probabilities); a quantized KV cache moves it (q4_0 keys and
/// values: mean 0.031 nats, the top token the base's for 70% of tokens).
#[test]
fn reads_llama_perplexitys_file() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama_q256", "kl-divergence") else {
        return;
    };
    let model = dir.join("model.gguf");
    let (model, base) = (model.to_str().unwrap(), llama_base());
    let j = kld(model, base.to_str().unwrap(), &[]);
    assert_eq!(j["n_tokens"], 4 * 63);
    let (ppl, ppl_base) = (j["ppl"].as_f64().unwrap(), j["ppl_base"].as_f64().unwrap());
    assert!((ppl_base - 1444.29).abs() < 0.01, "{j}");
    assert!((ppl / ppl_base - 1.0).abs() < 1e-5, "{j}");
    assert!(j["kld"].as_f64().unwrap() < 1e-6, "{j}");
    assert!(j["kld_max"].as_f64().unwrap() < 1e-4, "{j}");
    assert_eq!(j["same_top"], 1.0);
    let q = kld(
        model,
        base.to_str().unwrap(),
        &["-ctk", "q4_0", "-ctv", "q4_0"],
    );
    assert!(q["kld"].as_f64().unwrap() > 1e-2, "{q}");
    assert!(q["same_top"].as_f64().unwrap() < 0.9, "{q}");
}

/// A base file frink writes holds llama-perplexity's layout (its size from the header's
/// sizes), gives the perplexity the run printed, and reads back as a divergence of
/// nothing; `-f` with other text, `-c` of another size, a truncated copy, a folder and
/// another model's file are refused with a message, and a failed write leaves no file.
#[test]
fn writes_a_file_it_reads_back_and_refuses_damaged_ones() {
    let Some(Setup {
        model,
        text,
        corpus_text,
        tmp,
    }) = setup()
    else {
        return;
    };
    let (model, text) = (model.as_str(), std::path::Path::new(&text));
    let base = tmp.path().join("base.kld");
    let b = base.to_str().unwrap();
    let o = frink(&[
        "perplexity",
        "-m",
        model,
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
        "--json",
        "--kl-divergence-base",
        b,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = last_json_line(&o);
    let n_chunk = run["n_chunks"].as_u64().unwrap();
    assert!(n_chunk >= 2, "{run}");
    // Header 20 bytes, the tokens, then 63 rows a chunk of 2·⌈512/2⌉ + 4 u16.
    let want = 20 + n_chunk * 128 * 4 + n_chunk * 63 * 516 * 2;
    assert_eq!(std::fs::metadata(&base).unwrap().len(), want);
    let j = kld(model, b, &["-f", text.to_str().unwrap(), "-c", "128"]);
    assert!(j["kld"].as_f64().unwrap() < 1e-6, "{j}");
    let (ppl, printed) = (
        j["ppl_base"].as_f64().unwrap(),
        run["ppl"].as_f64().unwrap(),
    );
    assert!((ppl / printed - 1.0).abs() < 1e-4, "{ppl} vs {printed}");

    let kl_refused = |file: &str, extra: &[&str], says: &str| {
        let mut args = vec![
            "perplexity",
            "-m",
            model,
            "--kl-divergence",
            "--kl-divergence-base",
            file,
        ];
        args.extend_from_slice(extra);
        refused(&args, says);
    };
    kl_refused(b, &["-c", "64"], "saved with chunks of 128");
    let other = tmp.path().join("other.txt");
    std::fs::write(&other, &corpus_text[4000..8000]).unwrap();
    kl_refused(
        b,
        &["-f", other.to_str().unwrap()],
        "does not hold the tokens",
    );
    let cut = tmp.path().join("cut.kld");
    let bytes = std::fs::read(&base).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    kl_refused(cut.to_str().unwrap(), &[], "makes");
    std::fs::write(&cut, &bytes[..12]).unwrap();
    kl_refused(cut.to_str().unwrap(), &[], "shorter than");
    kl_refused(tmp.path().to_str().unwrap(), &[], "not a regular file");
    if let Some(other_model) = frink_testdata::require("fixtures/tiny/qwen2", "kl-divergence") {
        let m = other_model.join("model.gguf");
        let o = frink(&[
            "perplexity",
            "-m",
            m.to_str().unwrap(),
            "--kl-divergence",
            "--kl-divergence-base",
            b,
        ]);
        let e = stderr(&o);
        assert!(!o.status.success() && e.contains("vocabulary"), "{e}");
    }
    // Writing into a folder that does not exist fails before the evaluation, leaving
    // nothing behind.
    let nowhere = tmp.path().join("no/such/base.kld");
    refused(
        &[
            "perplexity",
            "-m",
            model,
            "-f",
            text.to_str().unwrap(),
            "-c",
            "128",
            "--kl-divergence-base",
            nowhere.to_str().unwrap(),
        ],
        "does not exist",
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".part"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// What an attacker tried (each refused with a message, promptly, no file replaced): a
/// symbolic link as the output (the rename would have replaced the link), the text read
/// from standard input as the output, a trailing `/`, a FIFO with no writer as the base
/// (opening it would wait forever), rows whose scale is NaN or whose log-probabilities
/// pass 0 (which gave a KL divergence of 0 or 1e26 with success), and chunks longer than
/// the model's context (a sparse file claiming 2^20-token chunks took 5 GB).
#[test]
fn hostile_bases_and_outputs_are_refused() {
    let Some(Setup {
        model, text, tmp, ..
    }) = setup()
    else {
        return;
    };
    let (model, text) = (model.as_str(), text.as_str());
    let write = |out: &str, says: &str| {
        refused(
            &[
                "perplexity",
                "-m",
                model,
                "-f",
                text,
                "-c",
                "128",
                "--kl-divergence-base",
                out,
            ],
            says,
        )
    };
    let real = tmp.path().join("real.kld");
    std::fs::write(&real, b"keep").unwrap();
    let link = tmp.path().join("link.kld");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    write(link.to_str().unwrap(), "symbolic link");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&real).unwrap(), b"keep");
    write(&format!("{}/", real.display()), "names a folder");
    // Standard input redirected from the text itself.
    let sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "\"$FRINK\" perplexity -m {model} -f - -c 128 --kl-divergence-base {text} < {text}"
        ))
        .env("FRINK", env!("CARGO_BIN_EXE_frink"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&sh.stderr);
    assert!(!sh.status.success() && e.contains("is the input"), "{e}");
    assert!(!std::fs::read(text).unwrap().starts_with(b"_logits_"));

    let kl = |base: &str, says: &str| {
        refused(
            &[
                "perplexity",
                "-m",
                model,
                "--kl-divergence",
                "--kl-divergence-base",
                base,
            ],
            says,
        )
    };
    let fifo = tmp.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    kl(fifo.to_str().unwrap(), "not a regular file");

    let good = std::fs::read(llama_base()).unwrap();
    // The first row's scale (after the header and 4 · 128 tokens).
    let row0 = 20 + 4 * 128 * 4;
    let bad = tmp.path().join("bad.kld");
    let mut nan = good.clone();
    nan[row0..row0 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&bad, &nan).unwrap();
    kl(bad.to_str().unwrap(), "not a row of log-probabilities");
    let mut high = good.clone();
    high[row0 + 4..row0 + 8].copy_from_slice(&50f32.to_le_bytes());
    std::fs::write(&bad, &high).unwrap();
    kl(bad.to_str().unwrap(), "not a row of log-probabilities");
    // Chunks of 2^20 tokens (the fixture's context is 256), as a sparse file.
    let mut long = good[..20].to_vec();
    long[8..12].copy_from_slice(&(1i32 << 20).to_le_bytes());
    long[16..20].copy_from_slice(&1i32.to_le_bytes());
    let f = std::fs::File::create(&bad).unwrap();
    std::io::Write::write_all(&mut &f, &long).unwrap();
    f.set_len(20 + (1 << 20) * 4 + ((1 << 19) - 1) * 516 * 2)
        .unwrap();
    kl(bad.to_str().unwrap(), "longer than this model's context");
}
