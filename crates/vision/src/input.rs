//! From an image file's bytes to the language model's rows: decoding, the family's
//! preprocessing, the projector's encoder ([`frink_models::vision::VisionModel`]), and the
//! image's place in the prompt ([`frink_engine::image`]).

use std::sync::Arc;

use frink_engine::image::{EncodedImage, PromptImage};
use frink_models::vision::{Projector, VisionModel};
use frink_models::ModelConfig;
use sha2::{Digest, Sha256};

use crate::preprocess::{crop, decode, normalize, resize, Filter, ImageError, RgbImage};

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
        vm.config.projector.image_token(),
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
            "the projector file is for {} models ({} projector), the model is {}",
            p.language_models().join(", "),
            p.name(),
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

/// What an image file becomes before the encoder: its encoder inputs and their layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Pixels {
    /// The encoder's inputs, each normalised and channel-first `[3][size][size]`: one for
    /// Gemma 3; for Idefics3 the tiles row by row, then the global view (the processor's
    /// order); for Qwen2.5-VL the image at its resized size, `[3][H][W]`.
    pub frames: Vec<Vec<f32>>,
    /// Idefics3: the tiles' grid, `(rows, cols)` (`(0, 0)` when the image is not split);
    /// Qwen2.5-VL: the merged patches' grid, `H` and `W` over the merged patch's side.
    pub grid: (usize, usize),
}

/// How `vm`'s family spells an image of `grid` (`(rows, cols)` of tiles, [`Pixels::grid`])
/// in the prompt text, one image token per row of the language model
/// ([`EncodedImage::text`]).
pub fn image_text(vm: &VisionModel, grid: (usize, usize)) -> String {
    let n = vm.config.tokens_per_image();
    let token = vm.config.projector.image_token();
    match vm.config.projector {
        // transformers `Gemma3Processor.full_image_sequence`.
        Projector::Gemma3 => format!("\n\n<start_of_image>{}<end_of_image>\n\n", token.repeat(n)),
        // transformers `Idefics3Processor.replace_image_token` (llama.cpp `mtmd.cpp`
        // `MTMD_SLICE_TMPL_IDEFICS3` lays tiles out the same way).
        Projector::Idefics3 => {
            let run = token.repeat(n);
            let global =
                format!("<fake_token_around_image><global-img>{run}<fake_token_around_image>");
            let (rows, cols) = grid;
            if rows * cols == 0 {
                return global;
            }
            let mut s = String::new();
            for r in 1..=rows {
                for c in 1..=cols {
                    s.push_str(&format!("<fake_token_around_image><row_{r}_col_{c}>{run}"));
                }
                s.push('\n');
            }
            s.push('\n');
            s.push_str(&global);
            s
        }
        // transformers `Qwen2_5_VLProcessor` (the template's `<|image_pad|>` repeated once
        // per merged patch; llama.cpp `mtmd.cpp` writes the same markers).
        Projector::Qwen25vl => format!(
            "<|vision_start|>{}<|vision_end|>",
            token.repeat(grid.0 * grid.1)
        ),
    }
}

/// The encoder inputs `vm`'s family's processor makes of the image file `bytes`:
/// - Gemma 3 (transformers `Gemma3ImageProcessor` without pan and scan): a bilinear
///   resize to the encoder's square size;
/// - Idefics3 ([`idefics3_frames`]): tiles of the encoder's size and a global view;
///
/// then ×1/255 and the file's mean and standard deviation.
///
/// Errors: those of [`decode`] (unknown format, damaged data, more than `max_pixels`).
pub fn pixels(vm: &VisionModel, bytes: &[u8], max_pixels: u64) -> Result<Pixels, ImageError> {
    let c = &vm.config;
    let img = decode(bytes, max_pixels)?;
    let s = c.image_size as u32;
    let (frames, grid) = match c.projector {
        Projector::Gemma3 => (vec![resize(&img, s, s, Filter::Bilinear)], (0, 0)),
        Projector::Idefics3 => idefics3_frames(&img, c.longest_edge as u32, s),
        Projector::Qwen25vl => {
            let (w, h) = native_size(vm, img.width, img.height)?;
            let unit = c.merged_patch();
            let grid = (h as usize / unit, w as usize / unit);
            (vec![resize(&img, w, h, Filter::Bicubic)], grid)
        }
    };
    Ok(Pixels {
        frames: frames
            .iter()
            .map(|f| normalize(f, 1.0 / 255.0, c.mean, c.std))
            .collect(),
        grid,
    })
}

/// The most pixels per side Idefics3's processor resizes to (transformers
/// `image_processing_idefics3.MAX_IMAGE_SIZE`).
const IDEFICS3_MAX_SIDE: u32 = 4096;

/// Idefics3's tiles (transformers `Idefics3ImageProcessorPil`, with image splitting; every
/// resize Lanczos on 8-bit pixels):
/// 1. the longest side to `longest` (the other by the aspect ratio, truncated, then made
///    even; both at most 4096);
/// 2. each side up to a multiple of `tile` (the height from the new width and the aspect
///    ratio when the image is wide, and the other way round);
/// 3. when larger than one tile: its tiles row by row, then the whole resized to one tile
///    (the global view); else the image itself, ungridded.
///
/// Returns the frames and the grid `(rows, cols)` (`(0, 0)` when not split).
pub fn idefics3_frames(img: &RgbImage, longest: u32, tile: u32) -> (Vec<RgbImage>, (usize, usize)) {
    let ((w1, h1), (w2, h2)) = idefics3_sizes(img.width, img.height, longest, tile);
    let img = resize(img, w1, h1, Filter::Lanczos);
    let img = resize(&img, w2, h2, Filter::Lanczos);
    // 3. `split_images`.
    let grid = idefics3_grid((w2, h2), tile);
    if grid == (0, 0) {
        return (vec![img], grid);
    }
    let (rows, cols) = grid;
    let mut frames = Vec::with_capacity(rows * cols + 1);
    for r in 0..rows as u32 {
        for c in 0..cols as u32 {
            frames.push(crop(&img, c * tile, r * tile, tile, tile));
        }
    }
    frames.push(resize(&img, tile, tile, Filter::Lanczos));
    (frames, grid)
}

/// The sizes of [`idefics3_frames`]' first two resizes for an image of `w × h`: steps 1
/// and 2, in pixels.
fn idefics3_sizes(w: u32, h: u32, longest: u32, tile: u32) -> ((u32, u32), (u32, u32)) {
    let (w, h) = (w as f64, h as f64);
    let longest = longest as f64;
    // 1. `_resize_output_size_rescale_to_max_len`, then `..._scale_below_upper_bound`.
    let even = |v: f64| {
        let v = v as i64;
        v + v % 2
    };
    let (w1, h1) = match w >= h {
        true => (longest as i64, even(longest / (w / h))),
        false => (even(longest * (w / h)), longest as i64),
    };
    let (mut w1, mut h1) = (w1.max(1), h1.max(1));
    let (max, a) = (IDEFICS3_MAX_SIDE as i64, w1 as f64 / h1 as f64);
    if w1 >= h1 && w1 > max {
        (w1, h1) = (max, ((max as f64 / a) as i64).max(1));
    } else if h1 > w1 && h1 > max {
        (w1, h1) = (((max as f64 * a) as i64).max(1), max);
    }
    let (w1, h1) = (w1 as u32, h1 as u32);
    // 2. `resize_for_vision_encoder`.
    let t = tile as f64;
    let up = |v: f64| ((v / t).ceil() * t) as u32;
    let a1 = w1 as f64 / h1 as f64;
    let (w2, h2) = match w1 >= h1 {
        true => {
            let w2 = up(w1 as f64);
            (w2, up((w2 as f64 / a1) as i64 as f64))
        }
        false => {
            let h2 = up(h1 as f64);
            (up((h2 as f64 * a1) as i64 as f64), h2)
        }
    };
    ((w1, h1), (w2.max(tile), h2.max(tile)))
}

/// The tiles' grid `(rows, cols)` of an image resized to `(w, h)` (multiples of `tile`);
/// `(0, 0)` when it is one tile, which is not split.
fn idefics3_grid((w, h): (u32, u32), tile: u32) -> (usize, usize) {
    if w <= tile && h <= tile {
        return (0, 0);
    }
    ((h / tile) as usize, (w / tile) as usize)
}

/// The most a side may exceed the other (transformers Qwen2-VL `smart_resize`).
const MAX_ASPECT: u32 = 200;

/// The size `(width, height)` a native-size encoder's processor resizes a `width × height`
/// image to ([`smart_resize`] with the projector's merged patch and pixel limits).
///
/// Errors: [`ImageError::AspectRatio`] past 200:1.
pub fn native_size(vm: &VisionModel, width: u32, height: u32) -> Result<(u32, u32), ImageError> {
    let c = &vm.config;
    let (h, w) = smart_resize(
        (height, width),
        c.merged_patch() as u32,
        (c.min_pixels as u64, c.max_pixels as u64),
    )?;
    Ok((w, h))
}

/// Qwen2-VL's processor's size rule (transformers `image_processing_qwen2_vl.smart_resize`):
/// each side rounded to a multiple of `factor` (half to even, as Python rounds); past
/// `max` pixels both sides scaled down by `√(h·w / max)` and floored to multiples (at least
/// one `factor`); under `min` pixels scaled up by `√(min / (h·w))` and ceiled. `(height,
/// width)` in and out.
///
/// Errors: [`ImageError::AspectRatio`] past 200:1; [`ImageError::Empty`] for a zero side.
pub fn smart_resize(
    (h, w): (u32, u32),
    factor: u32,
    (min, max): (u64, u64),
) -> Result<(u32, u32), ImageError> {
    if h == 0 || w == 0 {
        return Err(ImageError::Empty {
            width: w,
            height: h,
        });
    }
    if h.max(w) as f64 / h.min(w) as f64 > MAX_ASPECT as f64 {
        return Err(ImageError::AspectRatio {
            width: w,
            height: h,
            max: MAX_ASPECT,
        });
    }
    let (hf, wf, f) = (h as f64, w as f64, factor as f64);
    let round = |v: f64| (v / f).round_ties_even() * f;
    let (mut hb, mut wb) = (round(hf), round(wf));
    if hb * wb > max as f64 {
        let beta = (hf * wf / max as f64).sqrt();
        hb = f.max((hf / beta / f).floor() * f);
        wb = f.max((wf / beta / f).floor() * f);
    } else if hb * wb < min as f64 {
        let beta = (min as f64 / (hf * wf)).sqrt();
        hb = (hf * beta / f).ceil() * f;
        wb = (wf * beta / f).ceil() * f;
    }
    Ok((hb as u32, wb as u32))
}

/// The layout an image of `width × height` pixels takes under `vm`, known from its
/// header before any pixel is decoded: its encoder inputs (frames) and its tiles' grid
/// ([`Pixels::grid`]).
///
/// Errors: those of [`native_size`].
pub fn layout(
    vm: &VisionModel,
    width: u32,
    height: u32,
) -> Result<(usize, (usize, usize)), ImageError> {
    let c = &vm.config;
    Ok(match c.projector {
        Projector::Gemma3 => (1, (0, 0)),
        Projector::Qwen25vl => {
            let (w, h) = native_size(vm, width, height)?;
            let unit = c.merged_patch() as u32;
            (1, ((h / unit) as usize, (w / unit) as usize))
        }
        Projector::Idefics3 => {
            let tile = c.image_size as u32;
            let (_, size2) = idefics3_sizes(width, height, c.longest_edge as u32, tile);
            let (rows, cols) = idefics3_grid(size2, tile);
            (rows * cols + 1, (rows, cols))
        }
    })
}

/// The rows of the image file `bytes` for the language model, its text in the prompt,
/// and the hash that identifies it in the prefix cache ([`encode_pixels`]).
///
/// Errors: those of [`pixels`] and [`encode_pixels`].
pub fn encode_image(
    vm: &VisionModel,
    bytes: &[u8],
    max_pixels: u64,
) -> Result<EncodedImage, ImageError> {
    encode_pixels(vm, &pixels(vm, bytes, max_pixels)?)
}

impl Pixels {
    /// The rows these frames give the language model under `vm`.
    pub fn rows(&self, vm: &VisionModel) -> usize {
        rows_of(vm, self.frames.len(), self.grid)
    }
}

/// The rows an image of `frames` encoder inputs and grid `grid` ([`layout`]) gives the
/// language model under `vm`.
pub fn rows_of(vm: &VisionModel, frames: usize, grid: (usize, usize)) -> usize {
    match vm.config.projector.native_size() {
        true => grid.0 * grid.1,
        false => frames * vm.config.tokens_per_image(),
    }
}

/// The rows of preprocessed frames `px` for the language model (each frame's, in order),
/// the image's text in the prompt, and the hash that identifies it in the prefix cache
/// (SHA-256 of its layout and normalised pixels: the same picture in another file format
/// or name is the same image; the same values in another shape are not).
///
/// Errors: the encoder's, as [`ImageError::Encode`].
pub fn encode_pixels(vm: &VisionModel, px: &Pixels) -> Result<EncodedImage, ImageError> {
    let mut h = Sha256::new();
    // The layout first: the same pixel values in another shape are another image (a
    // black 64×16 and a black 32×32 image normalise to the same 3,072 values).
    h.update((px.frames.len() as u64).to_le_bytes());
    for dim in [px.grid.0, px.grid.1] {
        h.update((dim as u64).to_le_bytes());
    }
    for f in &px.frames {
        h.update((f.len() as u64).to_le_bytes());
        for v in f {
            h.update(v.to_le_bytes());
        }
    }
    let mut rows = Vec::with_capacity(px.rows(vm) * vm.config.n_embd_out);
    let native = vm.config.projector.native_size();
    let (gh, gw) = px.grid;
    let frames: Vec<&[f32]> = px.frames.iter().map(Vec::as_slice).collect();
    let r = match (native, &frames[..]) {
        (true, [f]) => vm.encode_native(f, gh, gw),
        (true, _) => Err(frink_models::ModelError::Unsupported(format!(
            "{} frames for a native-size encoder",
            frames.len()
        ))),
        (false, _) => vm.encode_frames(&frames),
    };
    rows.extend(r.map_err(|e| ImageError::Encode(e.to_string()))?);
    Ok(EncodedImage {
        rows: Arc::new(rows),
        hash: h.finalize().into(),
        text: image_text(vm, px.grid),
        grid: native.then_some(px.grid),
    })
}
