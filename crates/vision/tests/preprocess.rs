//! frink's image decoding, resizing and normalisation against Pillow 13 and transformers 5.24
//! (tests/data/preprocess, made by its make_reference.py), and hostile inputs.

use frink_vision::preprocess::{decode, normalize, resize, Filter, ImageError, RgbImage};
use serde_json::Value;
use sha2::{Digest, Sha256};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/preprocess");

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/reference.json")).unwrap())
        .unwrap()
}

fn file(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}/{name}")).unwrap()
}

/// Standard base64 (the reference's byte strings).
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(val).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The resize inputs, as make_reference.py computes them.
fn pattern(w: usize, h: usize) -> RgbImage {
    let mut data = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                data.push(((37 * x + 91 * y + 53 * c + 7 * ((x * y) % 17)) % 256) as u8);
            }
        }
    }
    RgbImage {
        width: w as u32,
        height: h as u32,
        data,
    }
}

fn filter(name: &str) -> Filter {
    match name {
        "nearest" => Filter::Nearest,
        "bilinear" => Filter::Bilinear,
        "bicubic" => Filter::Bicubic,
        "lanczos" => Filter::Lanczos,
        f => panic!("filter {f}"),
    }
}

/// Every case (up and down, non-integer ratios, one axis, both pass orders, the same size)
/// and filter gives Pillow's bytes exactly; the inputs decode to the pattern.
#[test]
fn resize_is_pillows() {
    let r = reference();
    let cases = r["resize"].as_array().unwrap();
    assert_eq!(cases.len(), 18 * 4);
    for c in cases {
        let n = |k: &str, i: usize| c[k][i].as_u64().unwrap() as usize;
        let input = decode(&file(c["input"].as_str().unwrap()), 1 << 20).unwrap();
        assert_eq!(input, pattern(n("in", 0), n("in", 1)), "{}", c["input"]);
        let (ow, oh) = (n("out", 0) as u32, n("out", 1) as u32);
        let out = resize(&input, ow, oh, filter(c["filter"].as_str().unwrap()));
        assert_eq!((out.width, out.height), (ow, oh));
        assert_eq!(out.data.len(), (ow * oh * 3) as usize);
        if let Some(b) = c["bytes"].as_str() {
            let want = base64(b);
            let diff = (want.iter().zip(&out.data)).position(|(a, b)| a != b);
            assert_eq!(diff, None, "first differing byte, {c}");
        }
        assert_eq!(sha256(&out.data), c["sha256"].as_str().unwrap(), "{c}");
    }
}

/// Each format and pixel layout decodes to transformers' `convert_to_rgb` of Pillow's image:
/// PNG, GIF and WebP (lossless and lossy) byte for byte (alpha composited onto white, 16-bit
/// reduced as Pillow does), JPEG within a few levels (zune-jpeg, not libjpeg-turbo).
#[test]
fn decode_is_transformers() {
    let r = reference();
    let cases = r["decode"].as_array().unwrap();
    assert_eq!(cases.len(), 16);
    for c in cases {
        let name = c["file"].as_str().unwrap();
        let img = decode(&file(name), 1 << 20).unwrap_or_else(|e| panic!("{name}: {e}"));
        let size = [u64::from(img.width), u64::from(img.height)];
        assert_eq!(c["size"], serde_json::json!(size), "{name}");
        let want = base64(c["rgb"].as_str().unwrap());
        assert_eq!(img.data.len(), want.len(), "{name}");
        let worst = (want.iter().zip(&img.data))
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        let off = (want.iter().zip(&img.data)).filter(|(a, b)| a != b).count();
        if c["lossy"].as_bool().unwrap() {
            assert!(
                worst <= LOSSY_LEVELS,
                "{name}: {off} bytes off, by up to {worst}"
            );
        } else {
            assert_eq!(worst, 0, "{name}: {off} bytes off, by up to {worst}");
        }
    }
}

/// How far a JPEG may decode from Pillow's libjpeg-turbo (measured: 320 of the colour test
/// photo's 1,173 bytes off, by up to 3; 18 of the grey one's, by 1).
const LOSSY_LEVELS: u8 = 3;

/// `normalize` gives transformers' float32 `rescale` then `normalize` bit for bit.
#[test]
fn normalize_is_transformers() {
    let r = reference();
    for c in r["normalize"].as_array().unwrap() {
        let f3 =
            |k: &str| -> [f32; 3] { std::array::from_fn(|i| c[k][i].as_f64().unwrap() as f32) };
        let img = pattern(
            c["size"][0].as_u64().unwrap() as usize,
            c["size"][1].as_u64().unwrap() as usize,
        );
        let got = normalize(&img, c["rescale"].as_f64().unwrap(), f3("mean"), f3("std"));
        let want: Vec<u32> = (c["f32_bits"].as_array().unwrap().iter())
            .map(|b| b.as_u64().unwrap() as u32)
            .collect();
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{c}");
    }
}

/// A file through decode, resize (bilinear) and normalize is Gemma3ImageProcessorPil's
/// `pixel_values`, bit for bit.
#[test]
fn pipeline_is_gemma3_processor() {
    let r = reference();
    for c in r["processor"].as_array().unwrap() {
        let f3 =
            |k: &str| -> [f32; 3] { std::array::from_fn(|i| c[k][i].as_f64().unwrap() as f32) };
        let size = c["size"].as_u64().unwrap() as u32;
        let img = decode(&file(c["file"].as_str().unwrap()), 1 << 20).unwrap();
        let img = resize(&img, size, size, Filter::Bilinear);
        let px = normalize(&img, c["rescale"].as_f64().unwrap(), f3("mean"), f3("std"));
        let first: Vec<f32> = (c["first"].as_array().unwrap().iter())
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(px[..8], first[..], "{}", c["file"]);
        let bytes: Vec<u8> = px.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(sha256(&bytes), c["sha256_f32le"].as_str().unwrap());
    }
}

/// A PNG of `w × h` (its header as written, the pixels as `image` encodes them).
fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(w, h, image::Rgb([1, 2, 3]));
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// PNG's CRC-32 (of a chunk's type and data).
fn crc32(bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |mut c, &b| {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        c
    })
}

/// Garbage, unknown formats, zero sizes and images past the pixel limit are typed errors,
/// refused before their pixels are decoded.
#[test]
fn hostile_images_are_refused() {
    assert!(matches!(decode(b"", 1 << 20), Err(ImageError::Format(_))));
    assert!(matches!(
        decode(b"hello, not an image", 1 << 20),
        Err(ImageError::Format(_))
    ));
    let good = png(64, 48);
    assert_eq!(decode(&good, 1 << 20).unwrap().data.len(), 64 * 48 * 3);
    match decode(&good, 1000) {
        Err(
            e @ ImageError::TooLarge {
                width: 64,
                height: 48,
                max: 1000,
            },
        ) => assert!(e.to_string().contains("64×48") && e.to_string().contains("1000")),
        r => panic!("{r:?}"),
    }
    // Exactly at the limit is taken.
    assert!(decode(&good, 64 * 48).is_ok());
    // A header claiming 100000 × 100000 pixels with no data behind it (its CRC right).
    let mut huge = good.clone();
    let claim = |huge: &mut Vec<u8>, side: u32| {
        huge[16..20].copy_from_slice(&side.to_be_bytes());
        huge[20..24].copy_from_slice(&side.to_be_bytes());
        let crc = crc32(&huge[12..29]);
        huge[29..33].copy_from_slice(&crc.to_be_bytes());
    };
    claim(&mut huge, 100_000);
    assert!(matches!(
        decode(&huge, frink_vision::input::DEFAULT_MAX_PIXELS),
        Err(ImageError::TooLarge { .. })
    ));
    // Within the limit by its header, but no data behind it (the decoder's allocation is
    // bounded, and the missing data is an error).
    claim(&mut huge, 4000);
    assert!(decode(&huge, frink_vision::input::DEFAULT_MAX_PIXELS).is_err());
    // A GIF whose logical screen is 0 × 0.
    let mut gif = file("decode.gif");
    gif[6..10].fill(0);
    assert!(decode(&gif, 1 << 20).is_err());
    // A TIFF (told by its signature) is an image, but not one of the formats taken.
    match decode(b"II*\0\x08\0\0\0rest of a tiff", 1 << 20) {
        Err(ImageError::Format(f)) => assert!(f.contains("Tiff"), "{f}"),
        r => panic!("{r:?}"),
    }
}

/// Every truncation of a file of each format, and random bytes behind each format's
/// signature, give an error or an image, never a panic.
#[test]
fn truncated_and_random_bytes_never_panic() {
    for name in [
        "decode-rgba.png",
        "decode-rgb16.png",
        "decode.gif",
        "decode-lossless.webp",
        "decode-lossy.webp",
        "decode.jpg",
    ] {
        let bytes = file(name);
        for cut in 0..bytes.len() {
            if let Ok(img) = decode(&bytes[..cut], 1 << 20) {
                assert_eq!(img.data.len(), (img.width * img.height * 3) as usize);
            }
        }
        // Flipped bytes past the signature.
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..200 {
            let mut b = bytes.clone();
            for _ in 0..1 + next() % 8 {
                let i = 12 + (next() as usize) % (b.len() - 12);
                b[i] = next() as u8;
            }
            if let Ok(img) = decode(&b, 1 << 20) {
                assert_eq!(img.data.len(), (img.width * img.height * 3) as usize);
            }
        }
        // Random bytes behind the signature.
        for len in [0, 1, 7, 30, 100, 1000, 5000] {
            let mut b = bytes[..12.min(bytes.len())].to_vec();
            b.extend((0..len).map(|_| next() as u8));
            let _ = decode(&b, 1 << 20);
        }
    }
}

/// A JPEG cut anywhere before its end-of-image marker is refused as truncated (zune-jpeg
/// decoded a 700-byte header as a full-size grey image, which Pillow refuses), the whole
/// file and one with bytes after its end decode; an EXIF-like segment holding a whole
/// thumbnail's markers does not make a truncated file pass.
#[test]
fn truncated_jpegs_are_refused() {
    let bytes = file("decode.jpg");
    assert!(decode(&bytes, 1 << 20).is_ok());
    let mut trailing = bytes.clone();
    trailing.extend_from_slice(b"trailing bytes");
    assert!(decode(&trailing, 1 << 20).is_ok());
    // Every cut fails: in the headers as a decoding error, past them as truncated.
    for cut in (20..bytes.len() - 2).step_by(7).chain([bytes.len() - 2]) {
        let r = decode(&bytes[..cut], 1 << 20);
        assert!(r.is_err(), "a JPEG cut at {cut} of {} decoded", bytes.len());
    }
    // Cut in the middle of the scan (after its `FF DA` marker).
    let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    let mid = (sos + bytes.len()) / 2;
    let half = decode(&bytes[..mid], 1 << 20).err().unwrap().to_string();
    assert!(half.contains("truncated"), "{half}");
    // An APP1 segment holding FF DA … FF D9 right after SOI, then the file cut mid-scan.
    let mut with_app1 = bytes[..2].to_vec();
    let payload = [0xFF, 0xDA, 0x00, 0x02, 0x11, 0xFF, 0xD9];
    with_app1.extend_from_slice(&[0xFF, 0xE1, 0x00, (payload.len() + 2) as u8]);
    with_app1.extend_from_slice(&payload);
    with_app1.extend_from_slice(&bytes[2..mid]);
    let err = decode(&with_app1, 1 << 20).err().map(|e| e.to_string());
    assert!(
        err.is_some_and(|e| e.contains("truncated")),
        "thumbnail markers passed"
    );
}

/// Resizing to and from one pixel, and to nothing, neither panics nor leaves the image's
/// size and its bytes apart.
#[test]
fn degenerate_sizes() {
    let img = pattern(5, 4);
    for f in [
        Filter::Nearest,
        Filter::Bilinear,
        Filter::Bicubic,
        Filter::Lanczos,
    ] {
        for (w, h) in [(1, 1), (0, 3), (3, 0), (0, 0), (1, 9), (9, 1)] {
            let out = resize(&img, w, h, f);
            assert_eq!(out.data.len(), (w * h * 3) as usize);
        }
        let one = resize(&pattern(1, 1), 3, 2, f);
        assert!(one.data.chunks(3).all(|p| p == &pattern(1, 1).data[..]));
    }
}
