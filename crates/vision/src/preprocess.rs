//! Decoding and preprocessing images as the models' processors do (transformers' image
//! processors on Pillow): [`decode`] to 8-bit RGB, [`resize`] bit-exact with Pillow's
//! `Image.resize`, [`normalize`] to the encoder's channel-first floats.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, ImageReader, Limits};

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
    /// An aspect ratio past what the family's processor takes.
    #[error("the image is {width}×{height} pixels: sides more than {max}:1 apart")]
    AspectRatio { width: u32, height: u32, max: u32 },
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

/// Decodes an image file's bytes to 8-bit RGB as transformers' `convert_to_rgb` (the
/// slow processors' `do_convert_rgb`) makes it from `PIL.Image.open`: the format is told by
/// the bytes' signature (PNG, JPEG, WebP, or a GIF's first frame); grey is replicated;
/// an image with transparency (an alpha channel, or a PNG/GIF transparent colour) is
/// composited onto opaque white ([`over_white`]), not merely stripped of its alpha as
/// `Image.convert("RGB")` would (transformers 5.24 `image_transforms.convert_to_rgb`).
///
/// 16-bit PNGs are reduced as Pillow 13 opens them: RGB, RGBA and grey+alpha keep each
/// sample's high byte (`RGB;16B` unpacking); 16-bit grey opens as mode `I;16`, whose
/// conversion to RGB clamps values above 255 to 255 (so a full-range 16-bit grey image
/// comes out mostly white, as it does for transformers).
///
/// PNG, GIF and WebP (lossless and lossy) come out byte for byte as Pillow's
/// (tests/preprocess.rs); JPEG goes through zune-jpeg, not Pillow's libjpeg-turbo, and may
/// differ by a few levels (up to 3 on the test photo, in about a quarter of its bytes).
///
/// The size in the header is checked against `max_pixels` before any pixel is decoded,
/// and the decoder's allocations are bounded by it (`image::Limits`), so a hostile file
/// costs nothing; damaged or random bytes are an error, never a panic.
///
/// Errors: [`ImageError::Format`] (not one of the four formats; names the format when
/// `image` knows it), [`ImageError::TooLarge`] (`width × height > max_pixels`),
/// [`ImageError::Empty`] (a zero width or height), [`ImageError::Decode`].
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<RgbImage, ImageError> {
    let (width, height) = dimensions(bytes, max_pixels)?;
    let mut r = reader(bytes)?;
    if r.format() == Some(ImageFormat::Jpeg) && !jpeg_has_scan_end(bytes) {
        // zune-jpeg fills what is missing with grey; Pillow refuses ("image file is
        // truncated"), and a 700-byte header would buy a full-size encode.
        return Err(ImageError::Decode(
            "the JPEG data is truncated (no end of image after its scan)".into(),
        ));
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    // The decoded image at 16 bits × 4 channels, and room for the decoder's own buffers.
    limits.max_alloc = Some(u64::from(width) * u64::from(height) * 8 + (64 << 20));
    r.limits(limits);
    let img = r.decode().map_err(|e| ImageError::Decode(e.to_string()))?;
    if (img.width(), img.height()) != (width, height) {
        return Err(ImageError::Decode(format!(
            "the header says {width}×{height} pixels, the data {}×{}",
            img.width(),
            img.height()
        )));
    }
    Ok(RgbImage {
        width,
        height,
        data: to_rgb(img),
    })
}

/// Whether a JPEG file holds its end-of-image marker after its first scan: the segments
/// before the scan are walked by their lengths (an EXIF thumbnail's own markers inside
/// them do not count), then `FF D9` is looked for in what follows (inside entropy-coded
/// data every `FF` byte is followed by `00` or a restart marker, so it is the marker).
fn jpeg_has_scan_end(bytes: &[u8]) -> bool {
    let mut i = 2; // past SOI
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xFF {
            return false;
        }
        let m = bytes[i + 1];
        match m {
            0xFF => i += 1, // fill byte
            0x01 | 0xD0..=0xD7 => i += 2,
            _ => {
                let len = usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]));
                if m == 0xDA {
                    let scan = (i + 2 + len).min(bytes.len());
                    return bytes[scan..].windows(2).any(|w| w == [0xFF, 0xD9]);
                }
                i += 2 + len;
            }
        }
    }
    false
}

/// A reader of `bytes` in one of the four formats.
fn reader(bytes: &[u8]) -> Result<ImageReader<Cursor<&[u8]>>, ImageError> {
    let r = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    match r.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => Ok(r),
        Some(f) => Err(ImageError::Format(format!(": {f:?}"))),
        None => Err(ImageError::Format(String::new())),
    }
}

/// The width and height in the header of the image file `bytes`, checked as [`decode`]
/// checks them, without decoding a pixel.
///
/// Errors: those of [`decode`] but [`ImageError::Decode`] of the pixel data.
pub fn dimensions(bytes: &[u8], max_pixels: u64) -> Result<(u32, u32), ImageError> {
    let (width, height) = reader(bytes)?
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
    Ok((width, height))
}

/// A decoded image's pixels as Pillow and transformers make them RGB (see [`decode`]).
/// Each arm consumes the decoded buffer, so the peak is it and the 8-bit RGB copy.
fn to_rgb(img: DynamicImage) -> Vec<u8> {
    let hi = |v: u16| (v >> 8) as u8;
    match img {
        DynamicImage::ImageRgb8(i) => i.into_raw(),
        DynamicImage::ImageLuma8(i) => i.into_raw().into_iter().flat_map(|v| [v; 3]).collect(),
        DynamicImage::ImageLumaA8(i) => (i.into_raw().chunks_exact(2))
            .flat_map(|p| over_white([p[0], p[0], p[0], p[1]]))
            .collect(),
        DynamicImage::ImageRgba8(i) => (i.into_raw().chunks_exact(4))
            .flat_map(|p| over_white([p[0], p[1], p[2], p[3]]))
            .collect(),
        DynamicImage::ImageRgb16(i) => i.into_raw().into_iter().map(hi).collect(),
        DynamicImage::ImageRgba16(i) => (i.into_raw().chunks_exact(4))
            .flat_map(|p| over_white([hi(p[0]), hi(p[1]), hi(p[2]), hi(p[3])]))
            .collect(),
        // Pillow's `I;16` to `RGB`: each value clamped to 0..=255.
        DynamicImage::ImageLuma16(i) => (i.into_raw().into_iter())
            .flat_map(|v| [v.min(255) as u8; 3])
            .collect(),
        // Pillow opens 16-bit grey+alpha PNGs as 8-bit RGBA from the high bytes.
        DynamicImage::ImageLumaA16(i) => (i.into_raw().chunks_exact(2))
            .flat_map(|p| over_white([hi(p[0]), hi(p[0]), hi(p[0]), hi(p[1])]))
            .collect(),
        // Nothing the four decoders make today; the `image` crate's own conversion.
        other if other.color().has_alpha() => (other.into_rgba8().into_raw().chunks_exact(4))
            .flat_map(|p| over_white([p[0], p[1], p[2], p[3]]))
            .collect(),
        other => other.into_rgb8().into_raw(),
    }
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

/// Pillow's resampling filters (`Image.Resampling`) for 8-bit RGB. The convolution filters'
/// kernels and supports (in input pixels at scale 1, widened by the downscale factor) are
/// Pillow's `src/libImaging/Resample.c`; nearest is its affine scaling
/// (`src/libImaging/Geometry.c`, `ImagingScaleAffine`, called from `_imaging.c`'s `_resize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// The input pixel under each output pixel's centre, no blending.
    Nearest,
    /// Triangle, support 1.
    Bilinear,
    /// Keys cubic with a = −0.5, support 2.
    Bicubic,
    /// Lanczos-3 (windowed sinc), support 3.
    Lanczos,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Nearest => 0.0,
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The kernel at `x` input pixels (scaled) from the centre, as Pillow evaluates it.
    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Nearest => 0.0,
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            // Pillow's window is [-3, 3): not symmetric at its ends.
            Filter::Lanczos if (-3.0..3.0).contains(&x) => sinc(x) * sinc(x / 3.0),
            Filter::Lanczos => 0.0,
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
/// double precision, then rounded half away from zero to fixed point.
fn windows(in_size: usize, out_size: usize, filter: Filter) -> Vec<Window> {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ss = 1.0 / filterscale;
    let one = f64::from(1u32 << PRECISION_BITS);
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // C's (int) casts: truncation toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64).max(0) as usize;
            let ws: Vec<f64> = (xmin..xmax)
                .map(|x| filter.weight((x as f64 - center + 0.5) * ss))
                .collect();
            let total: f64 = ws.iter().sum();
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

/// Pillow's `clip8`: a fixed-point sum (with its rounding half already added) to a byte.
fn clip8(v: i64) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `img` resized to `width × height` exactly as Pillow 13's `Image.resize((width, height),
/// filter)` on an 8-bit RGB image (bit-exact, tests/preprocess.rs).
///
/// The convolution filters run two one-dimensional passes (Pillow `src/libImaging/Resample.c`,
/// `ImagingResampleInner`): a pass whose size does not change is skipped; each output byte
/// is a fixed-point (22 fraction bits) weighted sum rounded once, and the intermediate
/// image is bytes, so the order matters. Pillow 13 goes horizontal first unless the height
/// shrinks by more than twice as many pixels as the width
/// (`out_h < in_h && in_h − out_h > 2·(in_w − out_w)`, Pillow PR #9549; the rule fits all
/// of 3,100 random cases measured on Pillow 13.0.0). The same size returns a copy.
///
/// A zero `width` or `height` gives an empty image (and an empty input a black one).
///
/// Panics if `img.data` is not `img.width × img.height × 3` bytes.
pub fn resize(img: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    let (iw, ih) = (img.width as usize, img.height as usize);
    let (ow, oh) = (width as usize, height as usize);
    assert_eq!(img.data.len(), iw * ih * 3, "an RGB image of {iw}×{ih}");
    if (iw, ih) == (ow, oh) {
        return img.clone();
    }
    if iw == 0 || ih == 0 || ow == 0 || oh == 0 {
        return RgbImage {
            width,
            height,
            data: vec![0; ow * oh * 3],
        };
    }
    if filter == Filter::Nearest {
        return nearest(img, width, height);
    }
    let vertical_first = oh < ih && (ih - oh) as i64 > 2 * (iw as i64 - ow as i64);
    let mut cur = img.data.clone();
    let (mut cw, mut ch) = (iw, ih);
    for horizontal in [!vertical_first, vertical_first] {
        if horizontal && ow != cw {
            cur = horizontal_pass(&cur, (cw, ch), ow, filter);
            cw = ow;
        } else if !horizontal && oh != ch {
            cur = vertical_pass(&cur, (cw, ch), oh, filter);
            ch = oh;
        }
    }
    RgbImage {
        width,
        height,
        data: cur,
    }
}

/// The rows of `data` (`w × h` RGB) resampled to `out` pixels each.
fn horizontal_pass(data: &[u8], (w, h): (usize, usize), out: usize, filter: Filter) -> Vec<u8> {
    let wins = windows(w, out, filter);
    let mut dst = Vec::with_capacity(out * h * 3);
    for row in data.chunks_exact(w * 3).take(h) {
        for win in &wins {
            let mut s = [1i64 << (PRECISION_BITS - 1); 3];
            let px = row[win.first * 3..].chunks_exact(3);
            for (p, &wt) in px.zip(&win.weights) {
                for c in 0..3 {
                    s[c] += i64::from(p[c]) * i64::from(wt);
                }
            }
            dst.extend(s.map(clip8));
        }
    }
    dst
}

/// The columns of `data` (`w × h` RGB) resampled to `out` pixels each.
fn vertical_pass(data: &[u8], (w, h): (usize, usize), out: usize, filter: Filter) -> Vec<u8> {
    let wins = windows(h, out, filter);
    let stride = w * 3;
    let mut dst = Vec::with_capacity(stride * out);
    let mut acc = vec![0i64; stride];
    for win in &wins {
        acc.fill(1 << (PRECISION_BITS - 1));
        for (k, &wt) in win.weights.iter().enumerate() {
            let y = win.first + k;
            let row = &data[y * stride..(y + 1) * stride];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += i64::from(v) * i64::from(wt);
            }
        }
        dst.extend(acc.iter().map(|&a| clip8(a)));
    }
    dst
}

/// Pillow's nearest-neighbour resize (`ImagingScaleAffine`): the source coordinate starts
/// at half a step and grows by `in / out` per output pixel, accumulated in double
/// precision and truncated; a coordinate past the input (never, in practice) leaves the
/// pixel black as Pillow's fill does.
fn nearest(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    let (iw, ih) = (img.width as usize, img.height as usize);
    let (ow, oh) = (width as usize, height as usize);
    let taps = |n_in: usize, n_out: usize| -> Vec<Option<usize>> {
        let step = n_in as f64 / n_out as f64;
        let mut at = step * 0.5;
        (0..n_out)
            .map(|_| {
                let i = at as usize;
                at += step;
                (i < n_in).then_some(i)
            })
            .collect()
    };
    let (xs, ys) = (taps(iw, ow), taps(ih, oh));
    let mut data = vec![0u8; ow * oh * 3];
    for (out_row, y) in data.chunks_exact_mut(ow * 3).zip(&ys) {
        let Some(y) = *y else { continue };
        let in_row = &img.data[y * iw * 3..(y + 1) * iw * 3];
        for (px, x) in out_row.chunks_exact_mut(3).zip(&xs) {
            if let Some(x) = *x {
                px.copy_from_slice(&in_row[x * 3..x * 3 + 3]);
            }
        }
    }
    RgbImage {
        width,
        height,
        data,
    }
}

/// The `width × height` region of `img` whose top-left pixel is `(x, y)`, clipped to the
/// image (numpy slicing, as transformers' processors crop).
pub fn crop(img: &RgbImage, x: u32, y: u32, width: u32, height: u32) -> RgbImage {
    let x0 = x.min(img.width) as usize;
    let y0 = y.min(img.height) as usize;
    let w = (width as usize).min(img.width as usize - x0);
    let h = (height as usize).min(img.height as usize - y0);
    let mut data = Vec::with_capacity(w * h * 3);
    for r in y0..y0 + h {
        let start = (r * img.width as usize + x0) * 3;
        data.extend_from_slice(&img.data[start..start + w * 3]);
    }
    RgbImage {
        width: w as u32,
        height: h as u32,
        data,
    }
}

/// The encoder's input from `img`: channel-first `[3][height][width]` f32 values
/// `(x · rescale − mean[c]) / std[c]` for each byte `x` of channel `c`, bit-exact with
/// transformers' slow (PIL backend) processors, `rescale` then `normalize`
/// (transformers 5.24 `image_transforms.rescale`: `x` as float64 times the float64
/// factor, then cast to float32; `image_transforms.normalize`: float32 subtraction of
/// `mean` and division by `std`, both as float32). The rescale factor is therefore taken
/// as f64 (a config's `rescale_factor`, usually 1/255); `mean` and `std` as f32, as
/// transformers casts them.
pub fn normalize(img: &RgbImage, rescale: f64, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let n = img.width as usize * img.height as usize;
    // Every byte value's result, per channel.
    let table: Vec<[f32; 256]> = (0..3)
        .map(|c| std::array::from_fn(|x| ((x as f64 * rescale) as f32 - mean[c]) / std[c]))
        .collect();
    let mut out = vec![0f32; 3 * n];
    for (i, px) in img.data.chunks_exact(3).take(n).enumerate() {
        for c in 0..3 {
            out[c * n + i] = table[c][usize::from(px[c])];
        }
    }
    out
}
