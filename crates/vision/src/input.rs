//! From an image file's bytes to the language model's rows: decoding, the family's
//! preprocessing, the projector's encoder ([`frink_models::vision::VisionModel`]), and the
//! image's place in the prompt ([`frink_engine::image`]).

use std::sync::Arc;

use frink_engine::image::{EncodedImage, ImageText, PromptImage};
use frink_models::vision::{Projector, VisionModel};
use frink_models::ModelConfig;
use sha2::{Digest, Sha256};

use crate::preprocess::{decode, normalize, resize, Filter, ImageError};

/// The most pixels an image may have before it is decoded (`--image-max-pixels`'s
/// default): 4096 × 4096, far past what any processor keeps (Gemma 3 reads 896 × 896).
/// Decoding one takes at most 128 MiB (16-bit RGBA) plus its 8-bit copy (64 MiB).
pub const DEFAULT_MAX_PIXELS: u64 = 4096 * 4096;

/// The projector file at `path`, loaded and checked against the language model `lm`
/// ([`check_pair`]).
///
/// Errors: a message naming the file and what does not fit.
pub fn load_projector(path: &std::path::Path, lm: &ModelConfig) -> Result<VisionModel, String> {
    let vm = VisionModel::load(path)
        .map_err(|e| format!("cannot load the projector file {}: {e}", path.display()))?;
    check_pair(&vm, lm).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(vm)
}

/// The prompt values and images of a rendered prompt `text` (`special`: its byte ranges
/// parsed for special tokens) with `images` at its markers, as `vm`'s family places and
/// attends to them ([`frink_engine::image::image_prompt`]).
///
/// Errors: those of `image_prompt`.
pub fn prompt(
    vm: &VisionModel,
    tok: &frink_tokenizer::Tokenizer,
    text: &str,
    special: &[std::ops::Range<usize>],
    images: &[EncodedImage],
) -> Result<(Vec<u32>, Vec<PromptImage>), String> {
    frink_engine::image::image_prompt(
        tok,
        text,
        special,
        &image_text(vm),
        images,
        vm.bidirectional(),
    )
}

/// Checks that the projector `vm` makes rows for the language model `lm`: its
/// architecture among the projector's and its width the same.
///
/// Errors: a message naming both.
pub fn check_pair(vm: &VisionModel, lm: &ModelConfig) -> Result<(), String> {
    let p = vm.config.projector;
    if !p.language_models().contains(&lm.arch.name) {
        return Err(format!(
            "the projector file is for {} models ({:?} projector), the model is {}",
            p.language_models().join(", "),
            p,
            lm.arch.name
        ));
    }
    if vm.config.n_embd_out != lm.n_embd {
        return Err(format!(
            "the projector makes rows of {} values (clip.vision.projection_dim), the model's \
             width is {}",
            vm.config.n_embd_out, lm.n_embd
        ));
    }
    Ok(())
}

/// How `vm`'s family spells an image in the prompt text.
pub fn image_text(vm: &VisionModel) -> ImageText {
    let (before, token, after) = vm.config.projector.image_text();
    ImageText {
        before: before.into(),
        token: token.into(),
        after: after.into(),
        n: vm.config.tokens_per_image(),
    }
}

/// The normalised pixels `vm`'s encoder reads for the image file `bytes`, as the family's
/// processor makes them (Gemma 3: transformers `Gemma3ImageProcessor` without pan and scan:
/// a bilinear resize to the encoder's square size, ×1/255, then the mean and standard
/// deviation of the file), channel-first `[3][size][size]`.
///
/// Errors: those of [`decode`] (unknown format, damaged data, more than `max_pixels`).
pub fn pixels(vm: &VisionModel, bytes: &[u8], max_pixels: u64) -> Result<Vec<f32>, ImageError> {
    let c = &vm.config;
    let img = decode(bytes, max_pixels)?;
    match c.projector {
        Projector::Gemma3 => {
            let s = c.image_size as u32;
            let img = resize(&img, s, s, Filter::Bilinear);
            Ok(normalize(&img, 1.0 / 255.0, c.mean, c.std))
        }
    }
}

/// The rows of the image file `bytes` for the language model, and the hash that
/// identifies it in the prefix cache (SHA-256 of its normalised pixels: the same picture
/// in another file format or name is the same image).
///
/// Errors: those of [`pixels`]; the encoder's, as [`ImageError::Encode`].
pub fn encode_image(
    vm: &VisionModel,
    bytes: &[u8],
    max_pixels: u64,
) -> Result<EncodedImage, ImageError> {
    let px = pixels(vm, bytes, max_pixels)?;
    let mut h = Sha256::new();
    for v in &px {
        h.update(v.to_le_bytes());
    }
    let rows = vm
        .encode(&px)
        .map_err(|e| ImageError::Encode(e.to_string()))?;
    Ok(EncodedImage {
        rows: Arc::new(rows),
        hash: h.finalize().into(),
    })
}
