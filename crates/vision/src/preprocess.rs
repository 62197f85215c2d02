//! Decoding and preprocessing images as the models' processors do (transformers' image
//! processors on Pillow): [`decode`] to 8-bit RGB, [`resize`] bit-exact with Pillow's
//! `Image.resize`, [`normalize`] to the encoder's channel-first floats.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, Limits};

/// Everything that can go wrong turning bytes into an encoder's input.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Not a format frink decodes (named when it is known).
    #[error("not an image in a supported format (PNG, JPEG, WebP, GIF){0}")]
    Format(String),
    /// More pixels than allowed, or none.
    #[error(
        "the image is {width}×{height} pixels; at most {max} pixels are taken (--image-max-pixels)"
    )]
    TooLarge { width: u32, height: u32, max: u64 },
    /// A zero-sized image.
    #[error("the image is {width}×{height} pixels")]
    Empty { width: u32, height: u32 },
    /// The decoder failed (damaged or truncated data).
    #[error("the image cannot be decoded: {0}")]
    Decode(String),
    /// The vision encoder failed on the pixels.
    #[error("the image cannot be encoded: {0}")]
    Encode(String),
}

/// An 8-bit RGB image: `height` rows of `width` pixels of 3 bytes, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

/// Decodes an image file's bytes (PNG, JPEG, WebP, or a GIF's first frame, told by their
/// signature) to 8-bit RGB as transformers' `convert_to_rgb` makes it: grey replicated,
/// transparency composited onto white ([`over_white`]). (16-bit images are reduced to 8
/// bits by rounding; Pillow's own reduction may differ by one.)
///
/// The size in the header is checked against `max_pixels` before any pixel is decoded,
/// and the decoder's allocations are bounded by it, so a hostile file costs nothing.
///
/// Errors: [`ImageError::Format`], [`ImageError::TooLarge`], [`ImageError::Empty`],
/// [`ImageError::Decode`].
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<RgbImage, ImageError> {
    let reader = || -> Result<ImageReader<Cursor<&[u8]>>, ImageError> {
        let r = ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| ImageError::Decode(e.to_string()))?;
        match r.format() {
            Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => {
                Ok(r)
            }
            Some(f) => Err(ImageError::Format(format!(": {f:?}"))),
            None => Err(ImageError::Format(String::new())),
        }
    };
    let (width, height) = reader()?
        .into_dimensions()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { width, height });
    }
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(ImageError::TooLarge {
            width,
            height,
            max: max_pixels,
        });
    }
    let mut r = reader()?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    // The decoded image at 16 bits × 4 channels, and room for the decoder's own buffers.
    limits.max_alloc = Some(u64::from(width) * u64::from(height) * 8 + (64 << 20));
    r.limits(limits);
    let img = r.decode().map_err(|e| ImageError::Decode(e.to_string()))?;
    // Each step frees what it read (`into_*` moves an image already in that layout), so
    // the peak is the decoded image and one 8-bit copy.
    let data = if img.color().has_alpha() {
        let rgba = img.into_rgba8();
        let mut out = Vec::with_capacity(rgba.len() / 4 * 3);
        rgba.pixels().for_each(|p| out.extend(over_white(p.0)));
        out
    } else {
        img.into_rgb8().into_raw()
    };
    Ok(RgbImage {
        width,
        height,
        data,
    })
}

/// An RGBA pixel composited onto opaque white as transformers' `convert_to_rgb` does it
/// (Pillow's `Image.alpha_composite` of the image over a white background, then the
/// alpha dropped), in Pillow's integer arithmetic (`src/libImaging/AlphaComposite.c`:
/// 7 fraction bits, divisions by 255 as `((a >> 8) + a) >> 8`).
fn over_white([r, g, b, a]: [u8; 4]) -> [u8; 3] {
    if a == 0 {
        return [255; 3];
    }
    const BITS: u32 = 7;
    let div255 = |v: u32| ((v >> 8) + v) >> 8;
    let a = u32::from(a);
    let out_a255 = a * 255 + 255 * (255 - a);
    let coef1 = a * 255 * 255 * (1 << BITS) / out_a255;
    let coef2 = 255 * (1 << BITS) - coef1;
    let mix = |c: u8| (div255(u32::from(c) * coef1 + 255 * coef2 + (0x80 << BITS)) >> BITS) as u8;
    [mix(r), mix(g), mix(b)]
}

/// Pillow's resampling filters (`Image.Resampling`): their kernel and support, in input
/// pixels at scale 1 (Pillow `src/libImaging/Resample.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Triangle, support 1.
    Bilinear,
    /// Keys cubic with a = −0.5, support 2.
    Bicubic,
    /// Lanczos-3, support 3.
    Lanczos,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => (1.0 - x).max(0.0),
            Filter::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if x < 3.0 {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let px = x * std::f64::consts::PI;
        px.sin() / px
    }
}

/// Fixed-point fraction bits of Pillow's 8-bit resampling (`PRECISION_BITS` = 32 − 8 − 2).
const PRECISION_BITS: u32 = 22;

/// One output pixel's window over the input line: its first input index and its
/// fixed-point weights.
struct Window {
    first: usize,
    weights: Vec<i32>,
}

/// The windows of a pass from `in_size` to `out_size` pixels (Pillow's
/// `precompute_coeffs` then `normalize_coeffs_8bpc`): each output pixel's centre in the
/// input, the filter widened by the downscale factor, weights normalised to sum 1 in
/// double precision, then rounded to fixed point.
fn windows(in_size: usize, out_size: usize, filter: Filter) -> Vec<Window> {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's (int) casts: truncation toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let ws: Vec<f64> = (xmin..xmax)
                .map(|x| filter.weight((x as f64 - center + 0.5) * ss))
                .collect();
            let total: f64 = ws.iter().sum();
            let one = f64::from(1u32 << PRECISION_BITS);
            let weights = ws
                .iter()
                .map(|&w| {
                    let w = if total != 0.0 { w / total } else { w };
                    if w < 0.0 {
                        (w * one - 0.5) as i32
                    } else {
                        (w * one + 0.5) as i32
                    }
                })
                .collect();
            Window {
                first: xmin,
                weights,
            }
        })
        .collect()
}

/// Pillow's `clip8`: a fixed-point sum to a byte.
fn clip8(v: i64) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `img` resized to `width × height` exactly as Pillow's `Image.resize((width, height),
/// filter)` on an 8-bit RGB image: two one-dimensional passes (one skipped when its size
/// does not change), each output byte a fixed-point weighted sum rounded once, the
/// intermediate image in bytes (Pillow `src/libImaging/Resample.c`). The pass that leaves
/// the smaller intermediate image goes first, the horizontal one on a tie (measured on
/// Pillow 13: 45×29 → 32×32 horizontal first, 20×40 → 32×32 vertical first, 20×40 → 40×80
/// horizontal first; the other order changes up to a level per byte).
pub fn resize(img: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    let (iw, ih) = (img.width as usize, img.height as usize);
    let (ow, oh) = (width as usize, height as usize);
    let horizontal_first = ow * ih <= iw * oh;
    let mut cur = img.data.clone();
    let (mut cw, mut ch) = (iw, ih);
    for horizontal in [horizontal_first, !horizontal_first] {
        if horizontal && ow != cw {
            cur = pass(&cur, (cw, ch), ow, true, filter);
            cw = ow;
        } else if !horizontal && oh != ch {
            cur = pass(&cur, (cw, ch), oh, false, filter);
            ch = oh;
        }
    }
    RgbImage {
        width,
        height,
        data: cur,
    }
}

/// One pass of [`resize`] over `data` (`w × h` RGB): its rows to `out` pixels
/// (`horizontal`) or its columns to `out` pixels.
fn pass(
    data: &[u8],
    (w, h): (usize, usize),
    out: usize,
    horizontal: bool,
    filter: Filter,
) -> Vec<u8> {
    let (len, lines, step) = match horizontal {
        true => (w, h, 3),
        false => (h, w, 3 * w),
    };
    let wins = windows(len, out, filter);
    let (ow, oh) = if horizontal { (out, h) } else { (w, out) };
    let mut dst = vec![0u8; ow * oh * 3];
    for line in 0..lines {
        for (o, win) in wins.iter().enumerate() {
            for c in 0..3 {
                // Element k of this line, channel c.
                let at = |k: usize| match horizontal {
                    true => line * w * 3 + k * step + c,
                    false => k * step + line * 3 + c,
                };
                let mut s: i64 = 1 << (PRECISION_BITS - 1);
                for (k, &wt) in win.weights.iter().enumerate() {
                    s += i64::from(data[at(win.first + k)]) * i64::from(wt);
                }
                let d = match horizontal {
                    true => (line * ow + o) * 3 + c,
                    false => (o * ow + line) * 3 + c,
                };
                dst[d] = clip8(s);
            }
        }
    }
    dst
}

/// The encoder's input from `img`: channel-first `[3][height][width]` values
/// `(x · rescale − mean[c]) / std[c]` in f32, the order and precision of transformers'
/// `rescale` then `normalize` on a float32 array.
pub fn normalize(img: &RgbImage, rescale: f32, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let n = img.width as usize * img.height as usize;
    let mut out = vec![0f32; 3 * n];
    for (i, px) in img.data.chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * n + i] = (f32::from(px[c]) * rescale - mean[c]) / std[c];
        }
    }
    out
}
