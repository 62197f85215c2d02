//! frink's image decoding and resizing against Pillow (tests/data/preprocess, made by its
//! make_reference.py), and hostile inputs.

use frink_vision::preprocess::{decode, resize, Filter, ImageError, RgbImage};
use sha2::{Digest, Sha256};

/// The inputs make_reference.py resizes.
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

/// Every case (up and down, non-integer ratios, both pass orders) and filter gives
/// Pillow's bytes exactly.
#[test]
fn resize_is_pillows() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/preprocess/resize.json"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 30);
    for c in cases {
        let n = |k: &str, i: usize| c[k][i].as_u64().unwrap() as usize;
        let filter = match c["filter"].as_str().unwrap() {
            "bilinear" => Filter::Bilinear,
            "bicubic" => Filter::Bicubic,
            _ => Filter::Lanczos,
        };
        let out = resize(
            &pattern(n("in", 0), n("in", 1)),
            n("out", 0) as u32,
            n("out", 1) as u32,
            filter,
        );
        let got = format!("{:x}", Sha256::digest(&out.data));
        assert_eq!(got, c["sha256"].as_str().unwrap(), "{c}");
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

/// Garbage, truncated files, unknown formats and images past the pixel limit are typed
/// errors, refused before their pixels are decoded.
#[test]
fn hostile_images_are_refused() {
    assert!(matches!(decode(b"", 1 << 20), Err(ImageError::Format(_))));
    assert!(matches!(
        decode(b"hello, not an image", 1 << 20),
        Err(ImageError::Format(_))
    ));
    let good = png(64, 48);
    assert_eq!(decode(&good, 1 << 20).unwrap().data.len(), 64 * 48 * 3);
    for cut in [8, 20, 40, good.len() - 10] {
        assert!(decode(&good[..cut], 1 << 20).is_err(), "truncated at {cut}");
    }
    match decode(&good, 1000) {
        Err(ImageError::TooLarge {
            width: 64,
            height: 48,
            max: 1000,
        }) => {}
        r => panic!("{r:?}"),
    }
    // A header claiming 100000 × 100000 pixels with no data behind it.
    let mut huge = good.clone();
    huge[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    huge[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    assert!(decode(&huge, frink_vision::input::DEFAULT_MAX_PIXELS).is_err());
    // A TIFF (told by its signature) is an image, but not one of the formats taken.
    match decode(b"II*\0\x08\0\0\0rest of a tiff", 1 << 20) {
        Err(ImageError::Format(f)) => assert!(f.contains("Tiff"), "{f}"),
        r => panic!("{r:?}"),
    }
}
