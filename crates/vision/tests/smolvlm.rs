//! The tiny SmolVLM (Idefics3) vision fixture (tests/data/smolvlm, made by its
//! make_fixture.py with transformers in fp32 as the reference): frink's tiles equal the
//! processor's pixel values, its projector's rows (pixel shuffle, linear map) and the
//! language model's logits with the image in the prompt equal transformers', and the
//! prompt's ids (each tile's markers and rows) equal the processor's.

mod common;

use std::path::{Path, PathBuf};

use frink_engine::image::{model_ids, PromptImage};
use frink_models::vision::{Projector, VisionModel};
use frink_models::Model;
use frink_testdata::{read_f32, rel_max_diff};
use frink_tokenizer::Tokenizer;
use frink_vision::input::{pixels, DEFAULT_MAX_PIXELS};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/smolvlm")
}

fn meta() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("meta.json")).unwrap()).unwrap()
}

fn vision() -> VisionModel {
    VisionModel::load(dir().join("mmproj-model.gguf")).expect("projector file")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The file's hyperparameters as the converter wrote them.
#[test]
fn the_projector_file_reads_as_idefics3() {
    let vm = vision();
    let c = &vm.config;
    assert_eq!(c.projector, Projector::Idefics3);
    assert_eq!((c.image_size, c.patch_size, c.n_merge), (32, 4, 2));
    assert_eq!((c.longest_edge, c.tokens_per_image()), (64, 16));
    assert!(!vm.bidirectional());
}

/// Decoding, the three Lanczos resizes, the tiles, the global view and the normalisation
/// give the processor's pixel values bit for bit, and its grid, for a square image
/// (2 × 2 tiles), a wide one (1 × 2) and a tall one (2 × 1).
#[test]
fn tiles_equal_the_processors() {
    let vm = vision();
    let m = meta();
    for name in ["square.png", "wide.png", "tall.png"] {
        let bytes = std::fs::read(dir().join(name)).unwrap();
        let px = pixels(&vm, &bytes, DEFAULT_MAX_PIXELS).unwrap();
        let rec = &m["images"][name];
        let grid = (
            rec["rows"].as_u64().unwrap() as usize,
            rec["cols"].as_u64().unwrap() as usize,
        );
        assert_eq!(px.grid, grid, "{name}: grid");
        assert_eq!(px.frames.len(), grid.0 * grid.1 + 1, "{name}: frames");
        let stem = name.split('.').next().unwrap();
        let want = read_f32(&dir().join(format!("{stem}.pixels.bin")));
        let got: Vec<f32> = px.frames.concat();
        assert_eq!(got.len(), want.len(), "{name}");
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(worst == 0.0, "{name}: max |Δ| {worst}");
    }
}

/// The rows of each tile and the global view, from the processor's pixels, equal
/// transformers' `get_image_features` (pixel shuffle and `mm.model.fc`).
#[test]
fn image_rows_equal_transformers() {
    let vm = vision();
    let side = vm.config.image_size;
    for stem in ["square", "wide", "tall"] {
        let px = read_f32(&dir().join(format!("{stem}.pixels.bin")));
        let rows: Vec<f32> = px
            .chunks_exact(3 * side * side)
            .flat_map(|f| vm.encode(f).unwrap())
            .collect();
        let want = read_f32(&dir().join(format!("{stem}.embeds.bin")));
        let err = rel_max_diff(&rows, &want);
        // Measured 4.5e-7 to 4.8e-7; the shuffle transposed (column offset outer) gives
        // 0.45.
        assert!(err <= 1e-5, "{stem}: rel max diff {err}");
        eprintln!("{stem}: rows rel max diff {err:.2e}");
    }
}

/// A reference prompt through frink's image placement ([`common::prompt_for`]).
fn prompt_for(tok: &Tokenizer, vm: &VisionModel, p: &Value) -> (Vec<u32>, Vec<PromptImage>) {
    common::prompt_for(tok, vm, &dir(), p, "<image>")
}

/// Each reference prompt (one image of 2 × 2 tiles, one of 1 × 2, two images): frink's
/// ids equal the processor's, with a piece of rows per tile and per global view, and the
/// logits of every position equal transformers' within 1e-5 relative.
#[test]
fn prompts_and_logits_equal_transformers() {
    let m = meta();
    let model = Model::load(dir().join("model.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let vm = vision();
    let image_id = m["special_token_ids"]["<image>"].as_u64().unwrap() as u32;
    for (key, pieces) in [("square", 5), ("wide", 3), ("two", 3 + 5)] {
        let p = &m["prompts"][key];
        let (prompt, images) = prompt_for(&tok, &vm, p);
        assert_eq!(
            model_ids(&prompt, image_id),
            ids(&p["input_ids"]),
            "{key}: ids"
        );
        assert_eq!(images.len(), pieces, "{key}: pieces of rows");
        let got = common::logits(&model, &prompt, &images, None);
        let reference = read_f32(&dir().join(format!("{key}.logits.bin")));
        let err = rel_max_diff(&got, &reference);
        // Measured 1.1e-6 to 1.8e-6; the shuffle transposed gives 0.68.
        assert!(err <= 1e-5, "{key}: logits rel max diff {err}");
        eprintln!("{key}: logits rel max diff {err:.2e}");
        assert_eq!(
            common::greedy(&model, &prompt, &images, 8, prompt.len()),
            ids(&p["greedy"]),
            "{key}"
        );
    }
}

/// The layout known from an image's size alone (before decoding: the server counts the
/// prompt with it) is the one its pixels get, for sizes that give every grid, extreme
/// aspect ratios and images no larger than one tile.
#[test]
fn the_layout_from_the_header_is_the_pixels_layout() {
    let vm = vision();
    let c = &vm.config;
    for (w, h) in [
        (48, 48),
        (70, 21),
        (23, 50),
        (1, 1),
        (2, 2),
        (32, 32),
        (33, 97),
        (1, 4000),
        (4000, 1),
        (64, 63),
    ] {
        let img = frink_vision::preprocess::RgbImage {
            width: w,
            height: h,
            data: vec![128; (w * h * 3) as usize],
        };
        let (frames, grid) =
            frink_vision::input::idefics3_frames(&img, c.longest_edge as u32, c.image_size as u32);
        assert_eq!(
            frink_vision::input::layout(&vm, w, h).unwrap(),
            (frames.len(), grid),
            "{w}×{h}"
        );
        assert!(frames.iter().all(|f| f.width == 32 && f.height == 32));
    }
}

/// A projector file whose sizes would make an image's work or memory absurd, or its rows
/// NaN, is refused at load naming the key (an attacker's 2 MB file with 1-pixel patches
/// made the server allocate 256 GiB and abort).
#[test]
fn absurd_projector_sizes_are_refused_at_load() {
    use frink_gguf::MetaValue;
    let changed = |edit: &dyn Fn(&mut frink_gguf::GgufWriter)| {
        let f = frink_gguf::GgufFile::open(dir().join("mmproj-model.gguf")).unwrap();
        let mut w = frink_gguf::GgufWriter::from_file(&f).unwrap();
        edit(&mut w);
        VisionModel::from_gguf(frink_gguf::GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let cases: [(&str, MetaValue, &str); 5] = [
        (
            "clip.vision.image_size",
            MetaValue::U32(8192),
            "clip.vision.image_size",
        ),
        (
            "clip.vision.patch_size",
            MetaValue::U32(0),
            "clip.vision.patch_size",
        ),
        (
            "clip.vision.preproc_image_size",
            MetaValue::U32(1 << 20),
            "clip.vision.preproc_image_size",
        ),
        (
            "clip.vision.attention.layer_norm_epsilon",
            MetaValue::F32(f32::NAN),
            "layer_norm_epsilon",
        ),
        (
            "clip.vision.image_size",
            MetaValue::U32(4096),
            "clip.vision.patch_size",
        ),
    ];
    for (key, value, named) in cases {
        let err = changed(&|w| {
            w.add_metadata(key, value.clone());
        });
        assert!(err.contains(named), "{key}: {err:?}");
    }
    let err = changed(&|w| {
        w.add_metadata(
            "clip.vision.image_std",
            MetaValue::Array(frink_gguf::MetaArray::F32(vec![0.5, 0.0, 0.5])),
        );
    });
    assert!(err.contains("clip.vision.image_std"), "{err:?}");
}
