//! The tiny Qwen2.5-VL vision fixture (tests/data/qwen25vl, made by its make_fixture.py with
//! transformers in fp32 as the reference): frink's resize rule and pixels equal the
//! processor's, its encoder's rows (2D RoPE, window attention, the merger) equal
//! transformers' `get_image_features`, its multimodal RoPE positions equal `get_rope_index`,
//! and the language model's logits and greedy tokens with the images in the prompt equal
//! transformers'.
//!
//! The converter writes neither the window size nor the pixel limits: frink reads the
//! file's as llama.cpp does (windows of 112 pixels, which cover every fixture image, so
//! every layer attends over the whole image: `<image>.embeds_full.bin`, `greedy_full_attention`)
//! and the tests that compare with transformers' windows of 16 pixels and its `max_pixels`
//! of 2304 set those on the loaded config.

mod common;

use std::path::{Path, PathBuf};

use frink_engine::image::{model_ids, rope_shift, PromptImage};
use frink_models::rope::mrope_positions;
use frink_models::vision::{Projector, VisionModel};
use frink_models::Model;
use frink_testdata::{read_f32, rel_max_diff};
use frink_tokenizer::Tokenizer;
use frink_vision::input::{layout, pixels, smart_resize, DEFAULT_MAX_PIXELS};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen25vl")
}

fn meta() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("meta.json")).unwrap()).unwrap()
}

/// The projector file as loaded (`window`: transformers' 16-pixel windows and pixel limit
/// set on it, else the file's defaults).
fn vision(window: bool) -> VisionModel {
    let mut vm = VisionModel::load(dir().join("mmproj-model.gguf")).expect("projector file");
    if window {
        let m = meta();
        vm.config.window_size = 16;
        vm.config.max_pixels = m["max_pixels"].as_u64().unwrap() as usize;
    }
    vm
}

fn nums(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    nums(v).into_iter().map(|x| x as u32).collect()
}

/// The file's hyperparameters as the converter wrote them, and frink's defaults for what
/// it does not write.
#[test]
fn the_projector_file_reads_as_qwen25vl() {
    let vm = vision(false);
    let c = &vm.config;
    assert_eq!(c.projector, Projector::Qwen25vl);
    assert_eq!((c.patch_size, c.n_merge, c.n_wa_pattern), (4, 2, 2));
    assert_eq!((c.window_size, c.min_pixels), (112, 4 * 64));
    assert_eq!(c.max_pixels, 4096 * 64);
    assert!(!vm.bidirectional());
    let model = Model::load(dir().join("model.gguf")).unwrap();
    assert_eq!(model.config.arch.name, "qwen2vl");
    assert_eq!(model.config.rope_sections, Some([2, 3, 3, 0]));
}

/// `smart_resize` gives the processor's sizes on every branch (rounded, scaled down past
/// `max_pixels`, scaled up under `min_pixels`), Python's half-to-even rounding included.
#[test]
fn the_resize_rule_is_the_processors() {
    let m = meta();
    let (min, max) = (
        m["min_pixels"].as_u64().unwrap(),
        m["max_pixels"].as_u64().unwrap(),
    );
    for case in m["smart_resize"].as_array().unwrap() {
        let [h, w, h2, w2] = <[usize; 4]>::try_from(nums(case)).unwrap();
        let got = smart_resize((h as u32, w as u32), 8, (min, max)).unwrap();
        assert_eq!(got, (h2 as u32, w2 as u32), "{h}×{w}");
    }
    assert!(smart_resize((1, 300), 8, (min, max)).is_err(), "past 200:1");
}

/// The processor's `pixel_values` rows (merge groups, then `[channel][frame][y][x]`) of a
/// channel-first `[3][h][w]` frame.
fn as_patch_rows(frame: &[f32], (h, w): (usize, usize)) -> Vec<f32> {
    let (p, m) = (4, 2);
    let (gh, gw) = (h / p / m, w / p / m);
    let mut out = Vec::new();
    for gy in 0..gh {
        for gx in 0..gw {
            for q in 0..m * m {
                let (py, px) = (gy * m + q / m, gx * m + q % m);
                for ch in 0..3 {
                    for _frame in 0..2 {
                        for y in 0..p {
                            let at = ch * h * w + (py * p + y) * w + px * p;
                            out.extend_from_slice(&frame[at..at + p]);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The channel-first `[3][h][w]` frame of the processor's `pixel_values` (its first frame).
fn frame_of(rows: &[f32], (h, w): (usize, usize)) -> Vec<f32> {
    let (p, m) = (4, 2);
    let gw = w / p / m;
    let mut out = vec![0f32; 3 * h * w];
    for (r, row) in rows.chunks_exact(3 * 2 * p * p).enumerate() {
        let (g, q) = (r / (m * m), r % (m * m));
        let (py, px) = ((g / gw) * m + q / m, (g % gw) * m + q % m);
        for ch in 0..3 {
            for y in 0..p {
                let src = &row[(ch * 2 * p + y) * p..][..p];
                let at = ch * h * w + (py * p + y) * w + px * p;
                out[at..at + p].copy_from_slice(src);
            }
        }
    }
    out
}

fn hw(v: &Value) -> (usize, usize) {
    let v = nums(v);
    (v[0], v[1])
}

/// Decoding, the bicubic resize to multiples of 8 and the normalisation give the
/// processor's pixel values for images kept, rounded and scaled down, with its grid.
#[test]
fn pixels_equal_the_processors() {
    let vm = vision(true);
    let m = meta();
    for name in ["square.png", "odd.png", "wide.png", "big.png"] {
        let rec = &m["images"][name];
        let bytes = std::fs::read(dir().join(name)).unwrap();
        let px = pixels(&vm, &bytes, DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!(px.grid, hw(&rec["merged_hw"]), "{name}: grid");
        let (h, w) = hw(&rec["resized_hw"]);
        assert_eq!(px.frames.len(), 1);
        let got = as_patch_rows(&px.frames[0], (h, w));
        let stem = name.split('.').next().unwrap();
        let want = read_f32(&dir().join(format!("{stem}.pixels.bin")));
        assert_eq!(got.len(), want.len(), "{name}");
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        // Measured 0 (Pillow's bicubic on 8-bit pixels, reproduced).
        assert!(worst == 0.0, "{name}: max |Δ| {worst}");
        assert_eq!(layout(&vm, w as u32, h as u32).unwrap().1, px.grid);
    }
}

/// The rows of each image, from the processor's pixels, equal transformers'
/// `get_image_features` with its 16-pixel windows, and with every layer over the whole
/// image (the file's default windows of 112 pixels, as llama.cpp reads it).
#[test]
fn image_rows_equal_transformers() {
    let m = meta();
    for (window, file) in [(true, "embeds"), (false, "embeds_full")] {
        let vm = vision(window);
        for stem in ["square", "odd", "wide", "big"] {
            let rec = &m["images"][format!("{stem}.png")];
            let (h, w) = hw(&rec["resized_hw"]);
            let (gh, gw) = hw(&rec["merged_hw"]);
            let px = read_f32(&dir().join(format!("{stem}.pixels.bin")));
            let rows = vm.encode_native(&frame_of(&px, (h, w)), gh, gw).unwrap();
            let want = read_f32(&dir().join(format!("{stem}.{file}.bin")));
            let err = rel_max_diff(&rows, &want);
            // Measured 5.0e-7 to 6.9e-7; windows and full attention differ by 0.39 to 0.68.
            assert!(err <= 1e-5, "{stem} ({file}): rel max diff {err}");
            eprintln!("{stem} ({file}): rows rel max diff {err:.2e}");
        }
    }
}

/// A reference prompt through frink's image placement ([`common::prompt_for`]).
fn prompt_for(tok: &Tokenizer, vm: &VisionModel, p: &Value) -> (Vec<u32>, Vec<PromptImage>) {
    common::prompt_for(
        tok,
        vm,
        &dir(),
        p,
        "<|vision_start|><|image_pad|><|vision_end|>",
    )
}

/// The positions of a prompt's rows from its images' grids ([`mrope_positions`]).
fn positions(prompt: &[u32], images: &[PromptImage]) -> Vec<[usize; 3]> {
    let spans: Vec<_> = images
        .iter()
        .map(|im| (im.at, im.n(), im.grid.unwrap()))
        .collect();
    mrope_positions(0, prompt.len(), 0, &spans).unwrap()
}

/// Each reference prompt (one image of 6 × 6 merged patches, one of 7 × 5, two images):
/// frink's ids and multimodal RoPE positions equal the processor's and `get_rope_index`'s,
/// the logits of every position equal transformers' within 1e-5 relative, and the greedy
/// tokens (decoded one step at a time, each at its cache row less the images' shift) equal
/// `generate`'s.
#[test]
fn prompts_positions_and_logits_equal_transformers() {
    let m = meta();
    let model = Model::load(dir().join("model.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let vm = vision(true);
    let image_id = m["special_token_ids"]["<|image_pad|>"].as_u64().unwrap() as u32;
    for key in ["square", "odd", "two"] {
        let p = &m["prompts"][key];
        let (prompt, images) = prompt_for(&tok, &vm, p);
        assert_eq!(
            model_ids(&prompt, image_id),
            ids(&p["input_ids"]),
            "{key}: ids"
        );
        let pos = positions(&prompt, &images);
        for axis in 0..3 {
            let want = nums(&p["position_ids"][axis]);
            let got: Vec<usize> = pos.iter().map(|q| q[axis]).collect();
            assert_eq!(got, want, "{key}: axis {axis}");
        }
        let shift = rope_shift(&images, prompt.len());
        assert_eq!(-(shift as i64), p["rope_deltas"].as_i64().unwrap(), "{key}");
        let got = common::logits(&model, &prompt, &images, None);
        let reference = read_f32(&dir().join(format!("{key}.logits.bin")));
        let err = rel_max_diff(&got, &reference);
        // Measured 1.2e-6 to 1.4e-6; plain positions give 0.72 to 1.03 on the last row.
        assert!(err <= 1e-5, "{key}: logits rel max diff {err}");
        eprintln!("{key}: logits rel max diff {err:.2e}");
        assert_eq!(
            common::greedy(&model, &prompt, &images, 8, prompt.len()),
            ids(&p["greedy"]),
            "{key}"
        );
    }
}

/// A prompt evaluated in pieces that cut its images (each piece's rows placed by their
/// row in the image, the shift of the images before it carried) gives the tokens of one
/// call; the same rows at plain positions do not.
#[test]
fn pieces_through_images_give_the_tokens_of_one_call() {
    let m = meta();
    let model = Model::load(dir().join("model.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let vm = vision(true);
    let p = &m["prompts"]["two"];
    let (prompt, images) = prompt_for(&tok, &vm, p);
    let whole = common::greedy(&model, &prompt, &images, 8, prompt.len());
    for chunk in [7, 16, 50] {
        assert_eq!(
            common::greedy(&model, &prompt, &images, 8, chunk),
            whole,
            "chunk {chunk}"
        );
    }
    // Without grids the rows take plain positions: the logits move (0.72 on the last row
    // in transformers).
    let plain: Vec<PromptImage> = images
        .iter()
        .map(|im| PromptImage {
            grid: None,
            ..im.clone()
        })
        .collect();
    let a = common::logits(&model, &prompt, &images, None);
    let b = common::logits(&model, &prompt, &plain, None);
    let err = rel_max_diff(&b, &a);
    assert!(
        err > 0.1,
        "plain positions changed the logits by only {err}"
    );
}

/// Text alone on the multimodal-RoPE model is plain RoPE: the three axes are equal, so
/// the logits are those of the positions' plain rotation, bit for bit, whatever the
/// sections.
#[test]
fn text_alone_takes_plain_rope() {
    let model = Model::load(dir().join("model.gguf")).unwrap();
    let ids: Vec<u32> = (1..40).collect();
    let a = common::logits(&model, &ids, &[], None);
    let pos = mrope_positions(0, ids.len(), 0, &[]).unwrap();
    assert!(pos.iter().enumerate().all(|(i, p)| *p == [i; 3]));
    let mut plain = Model::load(dir().join("model.gguf")).unwrap();
    plain.config.rope_sections = None;
    let b = common::logits(&plain, &ids, &[], None);
    assert_eq!(a, b);
}

/// `file` with `key` set to `value` (or dropped, for `None`), loaded by `load`: its error.
fn edited<T>(
    file: &str,
    key: &str,
    value: Option<frink_gguf::MetaValue>,
    load: impl Fn(frink_gguf::GgufFile) -> Result<T, frink_models::ModelError>,
) -> String {
    let f = frink_gguf::GgufFile::open(file).unwrap();
    let mut w = frink_gguf::GgufWriter::new();
    w.set_version(f.version());
    for (k, v) in f.metadata().iter().filter(|(k, _)| k != key) {
        w.add_metadata(k.clone(), v.clone());
    }
    if let Some(v) = value {
        w.add_metadata(key, v);
    }
    for t in f.tensors() {
        let i = &t.info;
        w.add_tensor(i.name.clone(), i.ggml_type, &i.shape, t.data.to_vec())
            .unwrap();
    }
    let bytes = w.to_bytes().unwrap();
    load(frink_gguf::GgufFile::from_bytes(bytes).unwrap())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

/// A projector file whose limits would make an image's work absurd or its windows empty,
/// and a language model without its sections (or sections on an architecture without
/// multimodal RoPE, which would be rotated wrongly), are refused at load naming the key.
#[test]
fn what_cannot_be_read_is_refused_at_load() {
    use frink_gguf::{MetaArray, MetaValue};
    let mmproj = dir().join("mmproj-model.gguf");
    let mmproj = mmproj.to_str().unwrap();
    let vision = VisionModel::from_gguf;
    for (key, value, named) in [
        (
            "clip.vision.image_max_pixels",
            Some(MetaValue::U32(1 << 30)),
            "image_max_pixels",
        ),
        (
            "clip.vision.image_min_pixels",
            Some(MetaValue::U32(1 << 20)),
            "image_min_pixels",
        ),
        (
            "clip.vision.window_size",
            Some(MetaValue::U32(2)),
            "clip.vision.window_size",
        ),
        ("clip.vision.n_wa_pattern", None, "clip.vision.n_wa_pattern"),
        (
            "clip.vision.n_wa_pattern",
            Some(MetaValue::U32(9)),
            "clip.vision.n_wa_pattern",
        ),
        ("clip.use_silu", None, "clip.use_silu"),
        (
            "clip.use_gelu",
            Some(MetaValue::Bool(true)),
            "both clip.use_silu and clip.use_gelu",
        ),
        (
            "clip.vision.spatial_merge_size",
            Some(MetaValue::U32(1)),
            "spatial_merge_size",
        ),
        (
            "clip.vision.spatial_merge_size",
            Some(MetaValue::U32(3)),
            "spatial_merge_size",
        ),
    ] {
        let err = edited(mmproj, key, value, vision);
        assert!(err.contains(named), "{key}: {err:?}");
    }
    let model = dir().join("model.gguf");
    let model = model.to_str().unwrap();
    let err = edited(
        model,
        "qwen2vl.rope.dimension_sections",
        None,
        Model::from_gguf,
    );
    assert!(err.contains("qwen2vl.rope.dimension_sections"), "{err:?}");
    let bad = MetaValue::Array(MetaArray::I32(vec![2, 3, -3, 0]));
    let err = edited(
        model,
        "qwen2vl.rope.dimension_sections",
        Some(bad),
        Model::from_gguf,
    );
    assert!(err.contains("qwen2vl.rope.dimension_sections"), "{err:?}");
    let llama = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/smolvlm/model.gguf");
    let sections = MetaValue::Array(MetaArray::I32(vec![2, 3, 3, 0]));
    let err = edited(
        llama.to_str().unwrap(),
        "llama.rope.dimension_sections",
        Some(sections),
        Model::from_gguf,
    );
    assert!(
        err.contains("multimodal RoPE (llama.rope.dimension_sections)"),
        "{err:?}"
    );
}

/// The same normalised values in another shape are another image in the prefix cache (a
/// black 64×16 and a black 32×32 image both normalise to 3,072 equal values and take 16
/// rows: an attacker found the second reusing the first's cached rows and positions).
#[test]
fn images_of_the_same_values_and_another_shape_are_apart() {
    let vm = vision(false);
    let black = |h: usize, w: usize| frink_vision::input::Pixels {
        frames: vec![vec![-1.7; 3 * h * w]],
        grid: (h / 8, w / 8),
    };
    let wide = frink_vision::input::encode_pixels(&vm, &black(16, 64)).unwrap();
    let square = frink_vision::input::encode_pixels(&vm, &black(32, 32)).unwrap();
    assert_eq!(wide.text, square.text, "the same number of image tokens");
    assert_ne!(wide.hash, square.hash);
    assert_eq!((wide.grid, square.grid), (Some((2, 8)), Some((4, 4))));
    let again = frink_vision::input::encode_pixels(&vm, &black(16, 64)).unwrap();
    assert_eq!(wide.hash, again.hash);
}
