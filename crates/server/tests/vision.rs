//! Images through the HTTP APIs on the tiny Gemma 3 vision fixture
//! (crates/vision/tests/data/gemma3, transformers' reference): OpenAI `image_url` data
//! URIs, Ollama `images`, llama.cpp's `multimodal_data` give the reference's greedy
//! tokens, Anthropic `image` blocks and Responses `input_image` parts the same text; a follow-up turn reuses the image's cached rows and another image does not;
//! what cannot be served is a 400 naming its field.

mod common;

use std::path::PathBuf;

use common::{assert_openai_error, TestServer};
use serde_json::{json, Value};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/gemma3")
}

fn meta() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("meta.json")).unwrap()).unwrap()
}

fn b64(file: &str) -> String {
    base64::encode(std::fs::read(dir().join(file)).unwrap())
}

fn data_uri(file: &str) -> String {
    format!("data:image/png;base64,{}", b64(file))
}

/// The fixture served with its projector file (`set` changes the rest).
fn server(mmproj: bool, set: impl FnOnce(&mut frink_server::ServeConfig)) -> TestServer {
    let mut c = common::config_at("gemma3-vision", dir().join("model.gguf"));
    c.parallel = 2;
    if mmproj {
        c.mmproj = Some(dir().join("mmproj-model.gguf"));
    }
    set(&mut c);
    TestServer::start_with(c)
}

fn user(parts: Value) -> Value {
    json!({"role": "user", "content": parts})
}

fn openai_chat(srv: &TestServer, messages: Value, n: usize) -> Value {
    srv.post_ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "temperature": 0, "max_tokens": n}),
    )
}

fn image_part(file: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": data_uri(file)}})
}

/// The same image and prompt through llama.cpp's `/completion` (`multimodal_data`, ids
/// returned), OpenAI's chat (a data URI) and Ollama's chat (base64) give transformers'
/// greedy tokens, and the same text on each.
#[test]
fn every_api_gives_the_reference_tokens() {
    let _l = common::lock();
    let m = meta();
    let srv = server(true, |_| {});
    for key in ["native", "odd"] {
        let p = &m["prompts"][key];
        let file = p["images"][0].as_str().unwrap();
        let text = p["text"].as_str().unwrap();
        let want: Vec<u64> = p["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        // llama.cpp: the rendered template with its marker where the image goes.
        let rendered = p["rendered"].as_str().unwrap().replacen("<s>", "", 1);
        let prompt = rendered.replacen("<start_of_image>", "<__media__>", 1);
        let native = srv.post_ok(
            "/completion",
            &json!({"prompt": {"prompt_string": prompt, "multimodal_data": [b64(file)]},
                    "temperature": 0, "n_predict": 8, "return_tokens": true}),
        );
        let got: Vec<u64> = native["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let n = got.len().min(want.len());
        assert!(n >= 2, "{key}: {got:?}");
        assert_eq!(got[..n], want[..n], "{key}: /completion tokens");
        let content = native["content"].as_str().unwrap().to_string();
        let oa = openai_chat(
            &srv,
            json!([user(
                json!([image_part(file), {"type": "text", "text": text}])
            )]),
            8,
        );
        assert_eq!(common::message(&oa), content, "{key}: OpenAI chat");
        let ol = srv.post_ok(
            "/api/chat",
            &json!({"model": "gemma3-vision", "stream": false, "options": {"temperature": 0, "num_predict": 8},
                    "messages": [{"role": "user", "content": text, "images": [b64(file)]}]}),
        );
        assert_eq!(
            ol["message"]["content"].as_str().unwrap(),
            content,
            "{key}: Ollama chat"
        );
        let gen = srv.post_ok(
            "/api/generate",
            &json!({"model": "gemma3-vision", "stream": false, "options": {"temperature": 0, "num_predict": 8},
                    "prompt": text, "images": [b64(file)]}),
        );
        assert_eq!(
            gen["response"].as_str().unwrap(),
            content,
            "{key}: Ollama generate"
        );
        let an = srv.post_ok(
            "/v1/messages",
            &json!({"model": "gemma3-vision", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(file)}},
                {"type": "text", "text": text}]}]}),
        );
        assert_eq!(
            an["content"][0]["text"].as_str().unwrap(),
            content,
            "{key}: Anthropic messages"
        );
        let rs = srv.post_ok(
            "/v1/responses",
            &json!({"model": "gemma3-vision", "max_output_tokens": 8, "temperature": 0, "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": data_uri(file)}, {"type": "input_text", "text": text}]}]}),
        );
        let said = rs["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(said, content, "{key}: Responses {rs}");
    }
    // Two images in one message.
    let p = &m["prompts"]["two"];
    let two = openai_chat(
        &srv,
        json!([user(
            json!([image_part("native.png"), image_part("odd.png"), {"type": "text", "text": p["text"]}])
        )]),
        8,
    );
    assert_eq!(
        two["usage"]["prompt_tokens"],
        json!(p["input_ids"].as_array().unwrap().len())
    );
    // The models list says the model takes images.
    let models = srv.request("GET", "/v1/models", None).json();
    assert!(
        models["data"][0]["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("vision")),
        "{models}"
    );
    let props = srv.request("GET", "/props", None).json();
    assert_eq!(props["modalities"]["vision"], json!(true), "{props}");
    let show = srv.post_ok("/api/show", &json!({"model": "gemma3-vision"}));
    assert!(
        show["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("vision")),
        "{show}"
    );
}

/// A second turn about the same image reuses the cached image rows; the same turn with
/// another image reuses nothing past the text before the image.
#[test]
fn a_follow_up_turn_reuses_the_images_rows() {
    let _l = common::lock();
    let srv = server(true, |c| c.parallel = 1);
    let first = |file: &str| {
        user(json!([image_part(file), {"type": "text", "text": "What is in this picture?"}]))
    };
    let a = openai_chat(&srv, json!([first("native.png")]), 4);
    let answer = common::message(&a);
    let turn2 = |file: &str| json!([first(file), {"role": "assistant", "content": answer}, {"role": "user", "content": "And the colours?"}]);
    let b = openai_chat(&srv, turn2("native.png"), 4);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The image's 16 rows start at position 9 and end at 25.
    assert!(cached >= 25, "cached {cached}: {b}");
    let c = openai_chat(&srv, turn2("odd.png"), 4);
    let cached = c["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached <= 9,
        "another image reused {cached} cached positions: {c}"
    );
}

/// What cannot be served is a 400 naming the field: images for a model served without a
/// projector file, a URL without --allow-image-urls, an image past --image-max-pixels,
/// bytes that are not an image, and the image marker typed in text.
#[test]
fn images_that_cannot_be_served_are_refused() {
    let _l = common::lock();
    let ask = |srv: &TestServer, part: Value| {
        srv.request(
            "POST",
            "/v1/chat/completions",
            Some(&json!({"messages": [user(json!([part, {"type": "text", "text": "hi"}]))], "max_tokens": 1}).to_string()),
        )
    };
    {
        let srv = server(false, |_| {});
        let props = srv.request("GET", "/props", None).json();
        assert_eq!(props["modalities"]["vision"], json!(false), "{props}");
        let r = ask(&srv, image_part("native.png"));
        let msg = assert_openai_error(&r, 400);
        assert!(
            msg.contains("does not take images") && msg.contains("--mmproj"),
            "{msg}"
        );
        let r = srv.request(
            "POST",
            "/api/chat",
            Some(&json!({"model": "gemma3-vision", "stream": false,
                         "messages": [{"role": "user", "content": "hi", "images": [b64("native.png")]}]}).to_string()),
        );
        assert_eq!(r.status, 400, "{}", r.text());
    }
    let srv = server(true, |c| c.image_max_pixels = 32 * 32);
    let url = json!({"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}});
    let r = ask(&srv, url);
    let msg = assert_openai_error(&r, 400);
    assert!(msg.contains("--allow-image-urls"), "{msg}");
    assert_eq!(
        r.json()["error"]["param"],
        json!("messages[0].content[0].image_url")
    );
    let msg = assert_openai_error(&ask(&srv, image_part("odd.png")), 400);
    assert!(msg.contains("45×29") && msg.contains("1024"), "{msg}");
    let junk = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}});
    let msg = assert_openai_error(&ask(&srv, junk), 400);
    assert!(msg.contains("not an image"), "{msg}");
    let marker = json!({"type": "text", "text": "look <__media__> here"});
    assert_openai_error(&ask(&srv, marker), 400);
    // The native size passes the limit.
    assert_eq!(ask(&srv, image_part("native.png")).status, 200);
}

/// Found by an attacker: more images than the context holds are refused before any is
/// decoded (12,000 of them took 23.6 s of encoding before the context refused them); a
/// part is read by its type (an `image_url` part with a stray `text` lost its image);
/// Ollama's `images` beside parts keep the parts; `;BASE64` is a data URI too.
#[test]
fn images_are_counted_and_read_by_type() {
    let _l = common::lock();
    let srv = server(true, |_| {});
    let many: Vec<Value> = (0..300).map(|_| image_part("native.png")).collect();
    let r = srv.request(
        "POST",
        "/v1/chat/completions",
        Some(&json!({"messages": [user(Value::Array(many))], "max_tokens": 1}).to_string()),
    );
    let msg = assert_openai_error(&r, 400);
    assert!(
        msg.contains("300 image(s) take at least 4800 positions"),
        "{msg}"
    );
    let tokens = |part: Value| {
        openai_chat(
            &srv,
            json!([user(json!([part, {"type": "text", "text": "hi"}]))]),
            1,
        )["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap()
    };
    let plain = tokens(image_part("native.png"));
    let stray = json!({"type": "image_url", "text": "ignored", "image_url": {"url": data_uri("native.png")}});
    assert_eq!(tokens(stray), plain);
    let upper = json!({"type": "image_url", "image_url": {"url": data_uri("native.png").replace(";base64", ";BASE64")}});
    assert_eq!(tokens(upper), plain);
    let audio = json!({"type": "input_audio", "text": "hello"});
    let r = srv.request(
        "POST",
        "/v1/chat/completions",
        Some(&json!({"messages": [user(json!([audio]))], "max_tokens": 1}).to_string()),
    );
    assert_openai_error(&r, 400);
    let ollama = |content: Value| {
        srv.post_ok(
            "/api/chat",
            &json!({"model": "gemma3-vision", "stream": false, "options": {"num_predict": 1},
                    "messages": [{"role": "user", "content": content, "images": [b64("native.png")]}]}),
        )["prompt_eval_count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        ollama(json!([{"type": "text", "text": "hi"}])),
        ollama(json!("hi"))
    );
    assert_eq!(ollama(json!("hi")), plain);
}

/// The tiny SmolVLM (Idefics3) fixture, an image split into 2 × 2 tiles and a global
/// view: llama.cpp's `/completion` with the processor's text gives transformers' greedy
/// tokens; OpenAI's and Ollama's chats give the text of the same prompt as frink's chat
/// renders it (SmolVLM's template reads typed contents: "User: " with a space before the
/// image, see docs/vision.md).
#[test]
fn smolvlm_tiles_through_every_api() {
    let _l = common::lock();
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/smolvlm");
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("meta.json")).unwrap()).unwrap();
    let mut c = common::config_at("smolvlm", d.join("model.gguf"));
    c.mmproj = Some(d.join("mmproj-model.gguf"));
    let srv = TestServer::start_with(c);
    let p = &m["prompts"]["square"];
    let image = base64::encode(std::fs::read(d.join("square.png")).unwrap());
    let completion = |prompt: String| {
        srv.post_ok(
            "/completion",
            &json!({"prompt": {"prompt_string": prompt, "multimodal_data": [image]},
                    "temperature": 0, "n_predict": 8, "return_tokens": true}),
        )
    };
    let rendered = p["rendered"].as_str().unwrap();
    let exact = completion(rendered.replacen("<image>", "<__media__>", 1));
    assert_eq!(exact["tokens"], p["greedy"]);
    let chat_text = completion(rendered.replacen("User:<image>", "User: <__media__>", 1));
    let want = chat_text["content"].as_str().unwrap();
    let text = p["text"].as_str().unwrap();
    let oa = openai_chat(
        &srv,
        json!([user(json!([
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}},
            {"type": "text", "text": text}
        ]))]),
        8,
    );
    assert_eq!(common::message(&oa), want, "OpenAI chat");
    let ol = srv.post_ok(
        "/api/chat",
        &json!({"model": "smolvlm", "stream": false, "options": {"temperature": 0, "num_predict": 8},
                "messages": [{"role": "user", "content": text, "images": [image]}]}),
    );
    assert_eq!(
        ol["message"]["content"].as_str().unwrap(),
        want,
        "Ollama chat"
    );
}

/// What an attacker found: a prompt whose text and images' markers pass the context was
/// refused only after every image was decoded and encoded (77 s for one 4096² image on a
/// real-size encoder); the whole prompt is now counted from the images' headers first. A
/// string content holding the image marker beside images is refused naming it (it took an
/// image's place).
#[test]
fn smolvlm_prompts_are_counted_before_images_are_decoded() {
    let _l = common::lock();
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vision/tests/data/smolvlm");
    let mut c = common::config_at("smolvlm", d.join("model.gguf"));
    c.mmproj = Some(d.join("mmproj-model.gguf"));
    let srv = TestServer::start_with(c);
    let uri = format!(
        "data:image/png;base64,{}",
        base64::encode(std::fs::read(d.join("square.png")).unwrap())
    );
    let part = json!({"type": "image_url", "image_url": {"url": uri}});
    let mut parts: Vec<Value> = (0..20).map(|_| part.clone()).collect();
    parts.push(json!({"type": "text", "text": "hi ".repeat(2000)}));
    let r = srv.request(
        "POST",
        "/v1/chat/completions",
        Some(&json!({"messages": [user(Value::Array(parts))], "max_tokens": 1}).to_string()),
    );
    let msg = assert_openai_error(&r, 400);
    assert!(
        msg.contains("the prompt with its 20 image(s) takes"),
        "{msg}"
    );
    let r = srv.request(
        "POST",
        "/v1/chat/completions",
        Some(
            &json!({"messages": [
                {"role": "user", "content": "look <__media__> here"},
                user(json!([part, {"type": "text", "text": "and this"}]))
            ], "max_tokens": 1})
            .to_string(),
        ),
    );
    let msg = assert_openai_error(&r, 400);
    assert!(msg.contains("messages[0].content"), "{msg}");
}
