//! The tiny Gemma 3 vision fixture (tests/data/gemma3, made by its make_fixture.py with
//! transformers in fp32 as the reference): frink's preprocessing equals the processor's
//! pixel values, its projector's rows and the language model's logits with the image in
//! the prompt equal transformers', and the prompt's ids equal the processor's.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use frink_engine::image::{image_prompt, is_image_key, EncodedImage, IMAGE_MARKER};
use frink_models::vision::VisionModel;
use frink_models::{KvType, Logits, Model, SeqState, Sequence};
use frink_testdata::{read_f32, rel_max_diff};
use frink_tokenizer::{ChatMessage, Tokenizer};
use frink_vision::input::{encode_image, pixels, DEFAULT_MAX_PIXELS};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma3")
}

fn meta() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("meta.json")).unwrap()).unwrap()
}

fn vision() -> VisionModel {
    VisionModel::load(dir().join("mmproj-model.gguf")).expect("projector file")
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Decoding, Pillow's bilinear resize and the normalisation give the processor's pixel
/// values bit for bit for PNGs, native size or resized, with alpha.
#[test]
fn pixels_equal_the_processors() {
    let vm = vision();
    for name in ["native.png", "odd.png", "rgba.png"] {
        let bytes = std::fs::read(dir().join(name)).unwrap();
        let px = pixels(&vm, &bytes, DEFAULT_MAX_PIXELS).unwrap();
        let stem = name.split('.').next().unwrap();
        let want = read_f32(&dir().join(format!("{stem}.pixels.bin")));
        assert_eq!((px.frames.len(), px.grid), (1, (0, 0)));
        let err = max_abs(&px.frames[0], &want);
        assert!(err == 0.0, "{name}: max |Δ| {err}");
    }
}

/// A JPEG decodes to Pillow's (libjpeg's) bytes within the decoders' rounding.
#[test]
fn a_jpeg_decodes_close_to_pillows() {
    let bytes = std::fs::read(dir().join("photo.jpg")).unwrap();
    let img = frink_vision::preprocess::decode(&bytes, DEFAULT_MAX_PIXELS).unwrap();
    let want = std::fs::read(dir().join("photo.rgb")).unwrap();
    assert_eq!((img.width, img.height), (40, 40));
    let worst = img
        .data
        .iter()
        .zip(&want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    // Measured: 3 levels at most on this file (zune-jpeg against libjpeg-turbo).
    assert!(worst <= 4, "JPEG decoders differ by {worst} levels");
}

/// The projector's rows for the processor's pixels equal transformers'
/// `get_image_features` (the fixture's projection holds F16 values, as the converter
/// stores them, so the file and the reference hold the same weights).
#[test]
fn image_rows_equal_transformers() {
    let vm = vision();
    assert_eq!(vm.config.tokens_per_image(), 16);
    for stem in ["native", "odd", "rgba", "photo"] {
        let px = read_f32(&dir().join(format!("{stem}.pixels.bin")));
        let rows = vm.encode(&px).unwrap();
        let want = read_f32(&dir().join(format!("{stem}.embeds.bin")));
        let err = rel_max_diff(&rows, &want);
        // Measured 2.6e-7 to 3.6e-7.
        assert!(err <= 1e-5, "{stem}: rel max diff {err}");
        eprintln!("{stem}: rows rel max diff {err:.2e}");
    }
}

/// The prompt of one user message with the images before its text, as `frink run`
/// and the servers build it.
fn prompt_for(
    tok: &Tokenizer,
    vm: &VisionModel,
    files: &[&str],
    text: &str,
) -> (Vec<u32>, Vec<frink_engine::image::PromptImage>) {
    let images: Vec<EncodedImage> = files
        .iter()
        .map(|f| {
            encode_image(
                vm,
                &std::fs::read(dir().join(f)).unwrap(),
                DEFAULT_MAX_PIXELS,
            )
            .unwrap()
        })
        .collect();
    let content = format!("{}{text}", IMAGE_MARKER.repeat(files.len()));
    let p = tok
        .apply_template(None, &[ChatMessage::new("user", content)], true)
        .unwrap();
    let special = p.template_ranges();
    image_prompt(
        tok,
        &p.text,
        &special,
        vm.config.projector.image_token(),
        &images,
        vm.bidirectional(),
    )
    .unwrap()
}

/// Each reference prompt: frink's ids equal the processor's (image rows where its image
/// tokens are), and the logits of every position with the images in place equal
/// transformers' within 1e-5 relative; attending causally over an image's rows instead
/// (the mask transformers and llama.cpp do not use for Gemma 3) is far outside that.
#[test]
fn prompts_and_logits_equal_transformers() {
    let m = meta();
    let model = Model::load(dir().join("model.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let vm = vision();
    let image_id = m["special_token_ids"]["<image_soft_token>"]
        .as_u64()
        .unwrap() as u32;
    for key in ["native", "odd", "two"] {
        let p = &m["prompts"][key];
        let files: Vec<&str> = p["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let (prompt, images) = prompt_for(&tok, &vm, &files, p["text"].as_str().unwrap());
        let as_ids: Vec<u32> = prompt
            .iter()
            .map(|&t| if is_image_key(t) { image_id } else { t })
            .collect();
        let want: Vec<u32> = p["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(as_ids, want, "{key}: prompt ids");
        assert_eq!(images.len(), files.len());
        let got = common::logits(&model, &prompt, &images, Some(true));
        let reference = read_f32(&dir().join(format!("{key}.logits.bin")));
        let err = rel_max_diff(&got, &reference);
        // Measured 8.9e-7 to 1.1e-6; a causal mask over the image gives 0.75 to 0.95.
        assert!(err <= 1e-5, "{key}: logits rel max diff {err}");
        let causal = common::logits(&model, &prompt, &images, Some(false));
        let err_causal = rel_max_diff(&causal, &reference);
        assert!(
            err_causal > 1e-2,
            "{key}: causal image rows stay within {err_causal}"
        );
        eprintln!("{key}: rel max diff {err:.2e} (causal over the image: {err_causal:.2e})");
    }
}

/// A different image gives different rows and different keys; the same pixels in
/// another file the same.
#[test]
fn image_keys_follow_the_pixels() {
    let vm = vision();
    let read = |f: &str| std::fs::read(dir().join(f)).unwrap();
    let a = encode_image(&vm, &read("native.png"), DEFAULT_MAX_PIXELS).unwrap();
    let b = encode_image(&vm, &read("odd.png"), DEFAULT_MAX_PIXELS).unwrap();
    assert_ne!(a.hash, b.hash);
    assert_ne!(a.rows, b.rows);
    // native.png re-encoded as a PNG of another compression level: same pixels.
    let img = image::load_from_memory(&read("native.png")).unwrap();
    let mut other = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut other),
        image::ImageFormat::Png,
    )
    .unwrap();
    let c = encode_image(&vm, &other, DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!(a.hash, c.hash);
    assert_eq!(Arc::strong_count(&c.rows), 1);
}

/// The two-image prompt evaluated in one call, in pieces that end at the images' edges
/// (a prefill cut into chunks), and beside another sequence in one batch: the same bits.
#[test]
fn pieces_and_batches_give_the_same_bits() {
    let model = Model::load(dir().join("model.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let vm = vision();
    let (prompt, images) = prompt_for(&tok, &vm, &["native.png", "odd.png"], "Compare them.");
    let whole = common::logits(&model, &prompt, &images, Some(true));
    let n_vocab = model.config.n_vocab;
    let last = &whole[whole.len() - n_vocab..];
    let d = model.config.n_embd;
    let ids = frink_engine::image::model_ids(&prompt, 0);
    // Cut before the first image, between the images, and inside the text after them.
    let (a, b) = (images[0].at, images[1].at);
    let cuts = [0, a, b, b + images[1].n() + 3, prompt.len()];
    assert_eq!(in_pieces(&model, &ids, &images, &cuts), last, "in pieces");
    // Beside a text-only sequence in one batch.
    let other: Vec<u32> = (3..40).collect();
    let rows = frink_engine::image::embd_rows(&images, 0, prompt.len(), d);
    let (mut s1, mut s2) = (
        SeqState::new(&model.config, 256, KvType::F32),
        SeqState::new(&model.config, 256, KvType::F32),
    );
    let mut seqs = [
        Sequence {
            state: &mut s2,
            tokens: &other,
            logits: Logits::Last,
            lora: None,
            embd: &[],
            rope_shift: 0,
            token_types: &[],
        },
        Sequence {
            state: &mut s1,
            tokens: &ids,
            logits: Logits::Last,
            lora: None,
            embd: &rows,
            rope_shift: 0,
            token_types: &[],
        },
    ];
    let outs = model.forward_batch(&mut seqs).unwrap();
    assert_eq!(outs[1], last, "in a batch");
    // A piece that ends inside a two-way image cannot see its later rows: refused by the
    // scheduler's chunking (frink_engine::image::chunk_end), so here it must differ.
    let split = in_pieces(&model, &ids, &images, &[0, a + 5, prompt.len()]);
    assert_ne!(split, last, "a cut image's rows must not see the same keys");
}

/// The last row's logits of `ids` (with `images`' rows) evaluated in the pieces between
/// `cuts`, one call each.
fn in_pieces(
    model: &Model,
    ids: &[u32],
    images: &[frink_engine::image::PromptImage],
    cuts: &[usize],
) -> Vec<f32> {
    let mut state = SeqState::new(&model.config, 256, KvType::F32);
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let rows = frink_engine::image::embd_rows(images, w[0], w[1] - w[0], model.config.n_embd);
        let mut seqs = [Sequence {
            state: &mut state,
            tokens: &ids[w[0]..w[1]],
            logits: Logits::Last,
            lora: None,
            embd: &rows,
            rope_shift: 0,
            token_types: &[],
        }];
        out = model.forward_batch(&mut seqs).unwrap().pop().unwrap();
    }
    out
}

/// The projector file with one change, loaded from memory.
fn changed(edit: impl FnOnce(&mut frink_gguf::GgufWriter)) -> frink_models::Result<VisionModel> {
    let f = frink_gguf::GgufFile::open(dir().join("mmproj-model.gguf")).unwrap();
    let mut w = frink_gguf::GgufWriter::from_file(&f).unwrap();
    edit(&mut w);
    VisionModel::from_gguf(frink_gguf::GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
}

/// Every tensor is accounted for, and what the file asks for that frink does not do is
/// refused by name: a tensor nothing reads, another projector type, another activation.
#[test]
fn a_projector_file_is_refused_by_name() {
    use frink_gguf::{GgmlType, MetaValue};
    let err = changed(|w| {
        w.add_tensor("mm.extra.weight", GgmlType::F32, &[4], vec![0u8; 16])
            .unwrap();
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("mm.extra.weight"), "{err}");
    let err = changed(|w| {
        w.add_metadata("clip.projector_type", MetaValue::String("pixtral".into()));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("pixtral") && err.contains("gemma3, idefics3"),
        "{err}"
    );
    let err = changed(|w| {
        w.add_metadata("clip.use_gelu", MetaValue::Bool(false));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("clip.use_gelu"), "{err}");
    // The language model is not a projector file.
    let err = VisionModel::load(dir().join("model.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("clip"), "{err}");
}
