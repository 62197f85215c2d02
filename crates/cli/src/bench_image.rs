//! `frink bench --mmproj FILE --image IMG…`: each image's preprocessing (decoding,
//! resizing, tiles, normalisation) and encoding (the projector file's encoder, every
//! frame) timed apart: one warm-up, then `-r` timed repetitions, reported as mean ±
//! sample standard deviation in milliseconds (a table, or `--json`).

use std::time::Instant;

use anyhow::{bail, Result};
use frink_models::Model;
use serde_json::json;

use crate::bench::{mean_std, BenchArgs};

/// Runs the image benchmark of `args` on `model`'s projector file.
///
/// Errors: no `--image`, the projector file's or an image's own.
pub fn run(args: &BenchArgs, model: &Model) -> Result<()> {
    let img = &args.images;
    if img.image.is_empty() {
        bail!("frink bench with --mmproj times images: give one or more --image FILE");
    }
    let Some(vm) = img.load(model, &args.model.model, true)? else {
        bail!("--image needs --mmproj");
    };
    let threads = frink_models::pool::threads();
    let mut results = Vec::new();
    if !args.json {
        outln!(
            "| image | size | frames | rows | preprocess ms | encode ms | ms per frame | threads |"
        );
        outln!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    }
    for path in &img.image {
        let bytes = crate::images::read_image(path)?;
        let (width, height) = frink_vision::preprocess::dimensions(&bytes, img.image_max_pixels)?;
        let (mut pre, mut enc) = (Vec::new(), Vec::new());
        let mut layout = (0, 0);
        for rep in 0..=args.repetitions.max(1) {
            let t0 = Instant::now();
            let px = frink_vision::input::pixels(&vm, &bytes, img.image_max_pixels)?;
            let t1 = Instant::now();
            frink_vision::input::encode_pixels(&vm, &px)?;
            let t2 = Instant::now();
            layout = (px.frames.len(), px.rows(&vm));
            if rep > 0 {
                pre.push((t1 - t0).as_secs_f64() * 1e3);
                enc.push((t2 - t1).as_secs_f64() * 1e3);
            }
        }
        let ((pre_ms, pre_sd), (enc_ms, enc_sd)) = (mean_std(&pre), mean_std(&enc));
        let (frames, rows) = layout;
        let name = path.display().to_string();
        if !args.json {
            outln!(
                "| {name} | {}×{} | {frames} | {rows} | {pre_ms:.1} ± {pre_sd:.1} | {enc_ms:.1} ± {enc_sd:.1} | {:.1} | {threads} |",
                width,
                height,
                enc_ms / frames as f64
            );
        }
        results.push(json!({
            "image": name,
            "width": width,
            "height": height,
            "frames": frames,
            "rows": rows,
            "n_threads": threads,
            "preprocess_ms": pre_ms,
            "preprocess_ms_stddev": pre_sd,
            "encode_ms": enc_ms,
            "encode_ms_stddev": enc_sd,
            "encode_ms_per_frame": enc_ms / frames as f64,
            "samples_preprocess_ms": pre,
            "samples_encode_ms": enc,
        }));
    }
    if args.json {
        outln!("{}", serde_json::Value::Array(results));
    }
    Ok(())
}
