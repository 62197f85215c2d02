//! `-m hf:ORG/REPO` end to end through the `frink` binary, against a local stand-in of
//! the Hugging Face hub (`HF_ENDPOINT`; frink_testdata::hub) serving a tiny fixture model
//! split into three shards: `frink pull` fetches all shards, `frink run` loads them and
//! gives the ids the unsplit file gives, `frink list` and `frink show` see it, `frink rm`
//! removes it.

use std::process::{Command, Output};

use frink_testdata::hub::{HubStandIn, Repo};

fn frink(args: &[&str], home: &std::path::Path, endpoint: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frink"))
        .args(args)
        .env("FRINK_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("FRINK_MODEL")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_sharded_hub_model_is_pulled_loaded_listed_shown_and_removed() {
    let Some(fixture) = frink_testdata::require("fixtures/tiny/llama", "hf: models") else {
        return;
    };
    let whole = fixture.join("model.gguf");
    let file = frink_gguf::GgufFile::open(&whole).unwrap();
    let shards = frink_testdata::split_gguf(&file, "tiny-F32", 3);
    let hub = HubStandIn::start(vec![(
        "org/tiny",
        Repo {
            files: shards.clone(),
            ..Repo::default()
        },
    )]);
    let home = tempfile::tempdir().unwrap();
    let (h, e) = (home.path(), hub.endpoint.as_str());
    // No Q4_K_M file: the repository's one GGUF model (its first shard) is taken.
    let path = ok(&frink(&["pull", "hf:org/tiny"], h, e));
    assert!(
        path.trim()
            .ends_with("hf/org/tiny/tiny-F32-00001-of-00003.gguf"),
        "{path}"
    );
    for (name, bytes) in &shards {
        assert_eq!(
            &std::fs::read(h.join("models/hf/org/tiny").join(name)).unwrap(),
            bytes
        );
    }
    let run = |m: &str| {
        let out = frink(
            &[
                "run",
                "-m",
                m,
                "--raw",
                "--greedy",
                "-n",
                "6",
                "--prompt-ids",
                "1,2,3",
                "--json",
            ],
            h,
            e,
        );
        let text = ok(&out);
        let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        v["ids"].clone()
    };
    assert_eq!(run("hf:org/tiny"), run(whole.to_str().unwrap()));
    let list = ok(&frink(&["list", "--json"], h, e));
    assert!(
        list.contains("hf:org/tiny/tiny-F32-00001-of-00003.gguf"),
        "{list}"
    );
    let show: serde_json::Value =
        serde_json::from_str(ok(&frink(&["show", "hf:org/tiny"], h, e)).trim()).unwrap();
    assert_eq!(show["details"]["family"], "llama");
    assert_eq!(show["details"]["quantization_level"], "F32");
    ok(&frink(
        &["rm", "hf:org/tiny/tiny-F32-00001-of-00003.gguf"],
        h,
        e,
    ));
    assert!(!h
        .join("models/hf/org/tiny/tiny-F32-00002-of-00003.gguf")
        .exists());
    // An unknown repository is a clear error naming it.
    let out = frink(&["pull", "hf:org/none"], h, e);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("org/none") && err.contains("404"), "{err}");
}

/// A vision repository (the tiny Gemma 3 vision fixture, with an F16-named and a Q8_0-named
/// projector file): `frink run -m hf:… --image` fetches the F16 projector beside the model
/// and gives the processor's prompt ids; a run without images asks nothing more of the
/// hub; `--no-mmproj` with an image is refused, naming `--mmproj`.
#[test]
fn a_hub_vision_model_brings_its_projector() {
    let d =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/gemma3");
    let read = |f: &str| std::fs::read(d.join(f)).unwrap();
    let hub = HubStandIn::start(vec![(
        "org/vision",
        Repo {
            files: vec![
                ("vision-F32.gguf".into(), read("model.gguf")),
                ("mmproj-vision-f16.gguf".into(), read("mmproj-model.gguf")),
                ("mmproj-vision-Q8_0.gguf".into(), b"not this one".to_vec()),
            ],
            ..Repo::default()
        },
    )]);
    let home = tempfile::tempdir().unwrap();
    let (h, e) = (home.path(), hub.endpoint.as_str());
    let image = d.join("native.png");
    let image = image.to_str().unwrap();
    let plain = ok(&frink(
        &["run", "-m", "hf:org/vision", "--greedy", "-n", "1", "hi"],
        h,
        e,
    ));
    assert!(!plain.is_empty());
    let repo = h.join("models/hf/org/vision");
    assert!(
        !repo.join("mmproj-vision-f16.gguf").exists(),
        "fetched without an image"
    );
    let meta: serde_json::Value = serde_json::from_slice(&read("meta.json")).unwrap();
    let p = &meta["prompts"]["native"];
    let run = ok(&frink(
        &[
            "run",
            "-m",
            "hf:org/vision",
            "--image",
            image,
            "--greedy",
            "-n",
            "2",
            "--json",
            p["text"].as_str().unwrap(),
        ],
        h,
        e,
    ));
    let v: serde_json::Value = serde_json::from_str(run.lines().last().unwrap()).unwrap();
    assert_eq!(v["prompt_ids"], p["input_ids"]);
    assert!(repo.join("mmproj-vision-f16.gguf").is_file());
    assert!(!repo.join("mmproj-vision-Q8_0.gguf").exists());
    // The store's projector is used again without a listing.
    let listings = |hub: &HubStandIn| {
        hub.seen()
            .iter()
            .filter(|s| s.path.contains("/tree/"))
            .count()
    };
    let before = listings(&hub);
    ok(&frink(
        &[
            "run",
            "-m",
            "hf:org/vision/vision-F32.gguf",
            "--image",
            image,
            "-n",
            "1",
            "hi",
        ],
        h,
        e,
    ));
    assert_eq!(listings(&hub), before);
    let out = frink(
        &[
            "run",
            "-m",
            "hf:org/vision",
            "--no-mmproj",
            "--image",
            image,
            "-n",
            "1",
            "hi",
        ],
        h,
        e,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mmproj"));
}
