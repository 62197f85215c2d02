//! `--mmproj` and `--image` of `frink run`: the projector file, the images encoded, and
//! the prompt with their rows in place.

use std::ops::Range;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use frink_engine::image::{EncodedImage, PromptImage, IMAGE_MARKER};
use frink_models::vision::VisionModel;
use frink_models::Model;
use frink_tokenizer::Tokenizer;

/// Image input flags (CONTRACT.md).
#[derive(Args, Debug, Default)]
pub struct ImageArgs {
    /// The model's projector file (llama.cpp's `--mmproj`: the vision encoder and
    /// projector that its converter writes beside a vision model).
    #[arg(long = "mmproj", value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// An image for the prompt (PNG, JPEG, WebP, GIF's first frame); repeatable. Each goes
    /// where the prompt has `<__media__>`, or before the text when it has none. Needs
    /// `--mmproj`, or a `-m hf:ORG/REPO` model whose repository holds a projector file
    /// (fetched beside the model, as llama.cpp's `-hf` does).
    #[arg(long = "image", value_name = "FILE")]
    pub image: Vec<PathBuf>,
    /// Do not fetch the projector file of a `-m hf:…` model (llama.cpp's `--no-mmproj`).
    #[arg(long = "no-mmproj", conflicts_with = "mmproj")]
    pub no_mmproj: bool,
    /// The most pixels (width × height) an image may have.
    #[arg(long = "image-max-pixels", value_name = "N", default_value_t = frink_vision::input::DEFAULT_MAX_PIXELS)]
    pub image_max_pixels: u64,
}

/// The largest image file read (before its header is even looked at).
const MAX_IMAGE_FILE: u64 = 256 << 20;

impl ImageArgs {
    /// The projector file, checked against `model`: `--mmproj`'s, or, unless
    /// `--no-mmproj`, the one in the repository of a `-m hf:…` model (`model_arg`) when
    /// `fetch` (the command may take images: `--image` given, or `frink chat`); a failed
    /// fetch is an error when images were given and a warning otherwise.
    ///
    /// Errors: `--image` without a projector file; the file's own.
    pub fn load(&self, model: &Model, model_arg: &str, fetch: bool) -> Result<Option<VisionModel>> {
        let path = match fetch {
            true => projector_path(
                &self.mmproj,
                self.no_mmproj,
                model_arg,
                !self.image.is_empty(),
            )?,
            false => self.mmproj.clone(),
        };
        let Some(path) = path else {
            if !self.image.is_empty() {
                bail!(
                    "--image needs the model's projector file: --mmproj FILE (or -m hf:ORG/REPO \
                     whose repository holds an mmproj*.gguf)"
                );
            }
            return Ok(None);
        };
        frink_vision::input::load_projector(&path, &model.config)
            .map(Some)
            .map_err(anyhow::Error::msg)
    }

    /// Each `--image` read, decoded, preprocessed and encoded by `vm`, when their rows fit
    /// in `n_ctx` positions (counted from their headers before any is decoded).
    pub fn encode(&self, vm: &VisionModel, n_ctx: usize) -> Result<Vec<EncodedImage>> {
        self.encode_with(vm, self.image_max_pixels, n_ctx)
    }

    /// [`ImageArgs::encode`] with a pixel limit of `max_pixels`.
    ///
    /// Errors: an unreadable file, one that is not an image or too large, rows past
    /// `n_ctx`, the encoder's.
    pub fn encode_with(
        &self,
        vm: &VisionModel,
        max_pixels: u64,
        n_ctx: usize,
    ) -> Result<Vec<EncodedImage>> {
        self.encode_checked(vm, max_pixels, &|_| Ok(()), n_ctx)
    }

    /// [`ImageArgs::encode_with`] once `check` accepts the images' texts in the prompt
    /// (known from their headers: the caller counts the whole prompt with them), before
    /// any image is decoded.
    ///
    /// Errors: those of [`ImageArgs::encode_with`] and `check`'s.
    pub fn encode_checked(
        &self,
        vm: &VisionModel,
        max_pixels: u64,
        check: &dyn Fn(&[String]) -> Result<()>,
        n_ctx: usize,
    ) -> Result<Vec<EncodedImage>> {
        let mut files = Vec::with_capacity(self.image.len());
        let mut texts = Vec::with_capacity(self.image.len());
        let mut rows = 0usize;
        for path in &self.image {
            let bytes = read_image(path)?;
            let (w, h) = frink_vision::preprocess::dimensions(&bytes, max_pixels)
                .with_context(|| format!("image {}", path.display()))?;
            let (frames, grid) = frink_vision::input::layout(vm, w, h)
                .with_context(|| format!("image {}", path.display()))?;
            rows = rows.saturating_add(frink_vision::input::rows_of(vm, frames, grid));
            texts.push(frink_vision::input::image_text(vm, grid));
            files.push((path, bytes));
        }
        if rows > n_ctx {
            bail!("the images take {rows} positions, more than the context of {n_ctx} (--ctx)");
        }
        check(&texts)?;
        files
            .iter()
            .map(|(path, bytes)| {
                frink_vision::input::encode_image(vm, bytes, max_pixels)
                    .with_context(|| format!("image {}", path.display()))
            })
            .collect()
    }
}

/// The projector file of `-m model_arg`: `mmproj` (`--mmproj`) when given, else, unless
/// `no_mmproj`, the one in the repository of a `hf:` model, fetched into the store
/// ([`frink_store::Store::projector`]). A failed fetch is an error when `required` (images
/// were given) and otherwise a warning, the command going on without images.
///
/// Errors: the store's, when `required`.
pub fn projector_path(
    mmproj: &Option<PathBuf>,
    no_mmproj: bool,
    model_arg: &str,
    required: bool,
) -> Result<Option<PathBuf>> {
    if mmproj.is_some() || no_mmproj || !model_arg.starts_with("hf:") {
        return Ok(mmproj.clone());
    }
    match frink_store::Store::from_env().and_then(|s| s.projector(model_arg)) {
        Ok(p) => Ok(p),
        Err(e) if !required => {
            eprintln!("frink: no projector file for {model_arg} (images off): {e}");
            Ok(None)
        }
        Err(e) => Err(e).context("fetching the model's projector file"),
    }
}

/// The bytes of the image file `path`, refused past [`MAX_IMAGE_FILE`] before reading.
///
/// Errors: an unreadable or too large file, named.
pub fn read_image(path: &std::path::Path) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if len > MAX_IMAGE_FILE {
        bail!(
            "{}: {len} bytes, more than an image file may have ({MAX_IMAGE_FILE})",
            path.display()
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `text` with `n` image markers before it, unless it holds one already (where
/// llama-mtmd-cli places images).
pub fn marked(text: String, n: usize) -> String {
    match text.contains(IMAGE_MARKER) {
        true => text,
        false => format!("{}{text}", IMAGE_MARKER.repeat(n)),
    }
}

/// The prompt values and images of `text` (rendered; `special`: its byte ranges parsed
/// for special tokens) with `images` at its `<__media__>` markers.
pub fn prompt(
    tok: &Tokenizer,
    text: &str,
    special: &[Range<usize>],
    vm: &VisionModel,
    images: &[EncodedImage],
) -> Result<(Vec<u32>, Vec<PromptImage>)> {
    frink_vision::input::prompt(vm, tok, text, special, images)
        .map_err(|e| anyhow::anyhow!("images: {e}"))
}
