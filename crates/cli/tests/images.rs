//! `frink run --mmproj --image` on the tiny Gemma 3 vision fixture
//! (crates/vision/tests/data/gemma3, transformers' reference): the processor's prompt ids
//! and transformers' greedy tokens, the same answer from a raw prompt with llama.cpp's
//! marker, and the refusals.

mod common;

use std::path::PathBuf;

use common::{frink, last_json_line, stderr};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/gemma3")
}

fn path(f: &str) -> String {
    dir().join(f).to_string_lossy().into_owned()
}

fn meta() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("meta.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// One image and two images before the text: the processor's ids, transformers' tokens
/// (up to where transformers' generation stopped).
#[test]
fn run_with_images_gives_the_reference() {
    let m = meta();
    let (model, mmproj) = (path("model.gguf"), path("mmproj-model.gguf"));
    for key in ["native", "odd", "two"] {
        let p = &m["prompts"][key];
        let mut args = vec![
            "run", "-m", &model, "--mmproj", &mmproj, "--json", "--greedy", "-n", "8", "-t", "2",
        ];
        let files: Vec<String> = p["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| path(f.as_str().unwrap()))
            .collect();
        for f in &files {
            args.extend(["--image", f.as_str()]);
        }
        args.push(p["text"].as_str().unwrap());
        let out = frink(&args);
        assert!(out.status.success(), "{key}: {}", stderr(&out));
        let j = last_json_line(&out);
        assert_eq!(
            ids(&j["prompt_ids"]),
            ids(&p["input_ids"]),
            "{key}: prompt ids"
        );
        let (got, want) = (ids(&j["ids"]), ids(&p["greedy"]));
        let n = got.len().min(want.len());
        assert!(
            n >= 2 && got[..n] == want[..n],
            "{key}: {got:?} vs {want:?}"
        );
    }
}

/// A raw prompt with `<__media__>` where the image goes gives the chat's ids.
#[test]
fn a_raw_prompt_places_the_image_at_its_marker() {
    let m = meta();
    let p = &m["prompts"]["native"];
    let raw = p["rendered"]
        .as_str()
        .unwrap()
        .replacen("<s>", "", 1)
        .replacen("<start_of_image>", "<__media__>", 1);
    let (model, mmproj, image) = (
        path("model.gguf"),
        path("mmproj-model.gguf"),
        path("native.png"),
    );
    let out = frink(&[
        "run",
        "-m",
        &model,
        "--mmproj",
        &mmproj,
        "--image",
        &image,
        "--raw",
        "--parse-special",
        "--json",
        "--greedy",
        "-n",
        "4",
        "-t",
        "2",
        &raw,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        ids(&last_json_line(&out)["prompt_ids"]),
        ids(&p["input_ids"])
    );
    // With --mmproj but no image, a prompt is what it was: ids, or text with the marker as
    // text (an attacker found both refused for want of an image).
    for prompt in [&["--prompt-ids", "1,2,3"][..], &["say <__media__>"][..]] {
        let args = [
            &[
                "run", "-m", &model, "--mmproj", &mmproj, "-n", "1", "-t", "2",
            ][..],
            prompt,
        ]
        .concat();
        let out = frink(&args);
        assert!(out.status.success(), "{prompt:?}: {}", stderr(&out));
    }
}

/// `--image` without `--mmproj`, a projector with a model of another architecture, and a
/// file that is not an image are errors that say so.
#[test]
fn what_cannot_run_is_refused() {
    let (model, mmproj, image) = (
        path("model.gguf"),
        path("mmproj-model.gguf"),
        path("native.png"),
    );
    let out = frink(&["run", "-m", &model, "--image", &image, "-n", "1", "hi"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--mmproj"), "{}", stderr(&out));
    let out = frink(&[
        "run",
        "-m",
        &model,
        "--mmproj",
        &mmproj,
        "--image",
        &path("meta.json"),
        "-n",
        "1",
        "hi",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not an image"), "{}", stderr(&out));
    // A server's projector belongs to its -m model.
    let out = frink(&["serve", "--mmproj", &mmproj, "--port", "0"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-m"), "{}", stderr(&out));
    // The projector file given as the model, and the model as the projector.
    let out = frink(&[
        "run", "-m", &model, "--mmproj", &model, "--image", &image, "-n", "1", "hi",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("clip"), "{}", stderr(&out));
}

/// `frink chat` with `/image FILE` answers as `frink run --image` does; a missing file
/// is an error that keeps the chat going.
#[test]
fn chat_takes_an_image_for_the_next_message() {
    let (model, mmproj, image) = (
        path("model.gguf"),
        path("mmproj-model.gguf"),
        path("native.png"),
    );
    let common = [
        "-m", &model, "--mmproj", &mmproj, "--greedy", "-n", "8", "-t", "2",
    ];
    let run = frink(
        &[
            &["run"][..],
            &common,
            &["--image", &image, "What is in this picture?"],
        ]
        .concat(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let script = format!("/image {image}\nWhat is in this picture?\n/image nope.png\n/bye\n");
    let chat = common::frink_with_stdin(&[&["chat"][..], &common].concat(), script.as_bytes());
    assert!(chat.status.success(), "{}", stderr(&chat));
    let answer = String::from_utf8_lossy(&run.stdout).trim_end().to_string();
    let said = String::from_utf8_lossy(&chat.stdout);
    assert!(said.contains(&answer), "chat said {said:?}, run {answer:?}");
    assert!(stderr(&chat).contains("nope.png"), "{}", stderr(&chat));
}

/// The tiny SmolVLM (Idefics3) fixture: a raw prompt with llama.cpp's marker where the
/// processor's `<image>` is gives the processor's ids (each tile's markers and rows) and
/// transformers' greedy tokens. Through the chat template (SmolVLM's reads only typed
/// contents: frink gives it a text part holding the image's place, as llama.cpp does) the
/// prompt holds every row and the user's text.
#[test]
fn smolvlm_tiles_through_run() {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/smolvlm");
    let at = |f: &str| d.join(f).to_string_lossy().into_owned();
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("meta.json")).unwrap()).unwrap();
    let (model, mmproj) = (at("model.gguf"), at("mmproj-model.gguf"));
    let p = &m["prompts"]["square"];
    let raw = p["rendered"]
        .as_str()
        .unwrap()
        .replace("<image>", "<__media__>");
    let image = at("square.png");
    let common = [
        "run", "-m", &model, "--mmproj", &mmproj, "--image", &image, "--json", "--greedy", "-n",
        "8", "-t", "2",
    ];
    let out = frink(&[&common[..], &["--raw", "--parse-special", &raw]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let j = last_json_line(&out);
    assert_eq!(ids(&j["prompt_ids"]), ids(&p["input_ids"]));
    assert_eq!(ids(&j["ids"]), ids(&p["greedy"]));
    let out = frink(&[&common[..], &[p["text"].as_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let chat = ids(&last_json_line(&out)["prompt_ids"]);
    let image_id = m["special_token_ids"]["<image>"].as_u64().unwrap();
    let rows = |v: &[u64]| v.iter().filter(|&&t| t == image_id).count();
    assert_eq!(rows(&chat), rows(&ids(&p["input_ids"])));
    // One token more than the processor's: the space after "User:" (typed text content).
    assert_eq!(chat.len(), p["input_ids"].as_array().unwrap().len() + 1);
    // Rows past the context are counted from the header, before encoding.
    let out = frink(&[&common[..], &["--ctx", "64", "hi"]].concat());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("take 80 positions"),
        "{}",
        stderr(&out)
    );
}

/// `frink bench --mmproj --image` times an image's preprocessing and encoding apart and
/// reports its layout (SmolVLM's square fixture image: 2 × 2 tiles and a global view).
#[test]
fn bench_times_an_image() {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/smolvlm");
    let at = |f: &str| d.join(f).to_string_lossy().into_owned();
    let (model, mmproj, image) = (at("model.gguf"), at("mmproj-model.gguf"), at("square.png"));
    let out = frink(&[
        "bench", "-m", &model, "--mmproj", &mmproj, "--image", &image, "-r", "2", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &j[0];
    assert_eq!(
        (r["frames"].as_u64(), r["rows"].as_u64()),
        (Some(5), Some(80))
    );
    assert_eq!(r["samples_encode_ms"].as_array().unwrap().len(), 2);
    assert!(r["encode_ms"].as_f64().unwrap() > 0.0);
    let out = frink(&["bench", "-m", &model, "--mmproj", &mmproj]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--image"), "{}", stderr(&out));
}

/// A chat message typed with the image marker is refused (it took an image's place in a
/// later turn and broke every turn after, an attacker found), and the chat goes on.
#[test]
fn chat_refuses_a_typed_image_marker() {
    let (model, mmproj, image) = (
        path("model.gguf"),
        path("mmproj-model.gguf"),
        path("native.png"),
    );
    let script = format!("hello <__media__> world\n/image {image}\ndescribe\n/bye\n");
    let chat = common::frink_with_stdin(
        &[
            "chat", "-m", &model, "--mmproj", &mmproj, "--greedy", "-n", "2", "-t", "2",
        ],
        script.as_bytes(),
    );
    assert!(chat.status.success(), "{}", stderr(&chat));
    let err = stderr(&chat);
    assert!(err.contains("marks an image's place"), "{err}");
    assert!(!err.contains("place(s)"), "{err}");
}

/// The tiny Qwen2.5-VL fixture through `frink run`: two images before the text through the
/// chat template give the processor's ids and transformers' greedy tokens (its
/// `greedy_full_attention`: frink reads the file's windows as llama.cpp does, 112 pixels,
/// covering every fixture image; llama-mtmd-cli gives the same tokens on these files), the
/// text after each image at positions shifted back by its grid; `frink bench` times one.
#[test]
fn qwen25vl_through_run() {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/qwen25vl");
    let at = |f: &str| d.join(f).to_string_lossy().into_owned();
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("meta.json")).unwrap()).unwrap();
    let (model, mmproj) = (at("model.gguf"), at("mmproj-model.gguf"));
    let p = &m["prompts"]["two"];
    let (wide, square) = (at("wide.png"), at("square.png"));
    let out = frink(&[
        "run",
        "-m",
        &model,
        "--mmproj",
        &mmproj,
        "--image",
        &wide,
        "--image",
        &square,
        "--json",
        "--greedy",
        "-n",
        "8",
        "-t",
        "2",
        p["text"].as_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j = last_json_line(&out);
    assert_eq!(ids(&j["prompt_ids"]), ids(&p["input_ids"]));
    assert_eq!(ids(&j["ids"]), ids(&p["greedy_full_attention"]));
    let out = frink(&[
        "bench", "-m", &model, "--mmproj", &mmproj, "--image", &square, "--json", "-r", "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(
        (b[0]["frames"].as_u64(), b[0]["rows"].as_u64()),
        (Some(1), Some(36))
    );
    // The image's 36 rows fit --ctx 80 but the prompt with its text does not: refused
    // before the image is encoded (an attacker's large image was encoded first).
    let words = "word ".repeat(60);
    let out = frink(&[
        "run", "-m", &model, "--mmproj", &mmproj, "--image", &square, "--ctx", "80", "-n", "2",
        &words,
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("longer than the context of 80"), "{err}");
    assert!(
        !err.contains("encoded in"),
        "encoded before refusing: {err}"
    );
}
