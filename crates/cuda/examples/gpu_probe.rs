//! What one GPU does with frink's kernels: its read bandwidth (the decode bound), the cost
//! of a kernel launch, and the quantized products at real matrix shapes (GB/s of weights
//! read, as a fraction of that bandwidth). Prints one JSON object.
//!
//! Run: `cargo run --release -p frink-cuda --example gpu_probe [-- GPU_INDEX]` (on a
//! machine with a GPU; `benches/gpu_check.sh` runs it there).

use std::time::Instant;

use frink_cuda::device::{Arg, Context};
use frink_cuda::ffi::Nvrtc;
use frink_cuda::kernels::{MATVEC, OPTIONS};
use frink_cuda::nvrtc::compile;
use serde_json::json;

fn main() {
    let index: usize = std::env::args()
        .nth(1)
        .map_or(0, |s| s.parse().expect("GPU index"));
    let out = match probe(index) {
        Ok(v) => v,
        Err(e) => json!({"error": e}),
    };
    println!("{out}");
}

fn probe(index: usize) -> Result<serde_json::Value, String> {
    let ctx = Context::new(index).map_err(|e| e.to_string())?;
    let nvrtc = Nvrtc::open().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let cubin = compile(&nvrtc, MATVEC.name, MATVEC.text, ctx.gpu.cc, OPTIONS, None)
        .map_err(|e| e.to_string())?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let m = ctx.load(&cubin.image).map_err(|e| e.to_string())?;
    let sms = ctx.gpu.sms.max(1) as u32;

    // Read bandwidth of a 4 GiB buffer (16-byte loads, 8 blocks of 256 threads per SM).
    let bytes: usize = 4 << 30;
    let src = ctx.alloc(bytes).map_err(|e| e.to_string())?;
    let (grid, block) = (8 * sms, 256u32);
    let sink = ctx
        .alloc(grid as usize * block as usize * 16)
        .map_err(|e| e.to_string())?;
    let read = |reps: usize| -> Result<f64, String> {
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: src holds bytes / 16 words, sink one word per thread.
            unsafe {
                m.function("read_bandwidth")
                    .map_err(|e| e.to_string())?
                    .launch(
                        (grid, 1, 1),
                        (block, 1, 1),
                        0,
                        &[
                            Arg::Ptr(src.ptr()),
                            Arg::U64((bytes / 16) as u64),
                            Arg::Ptr(sink.ptr()),
                        ],
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        ctx.sync().map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64())
    };
    read(2)?;
    let secs = read(10)?;
    let bandwidth = (bytes as f64 * 10.0) / secs;

    // Launch cost: 2,000 launches of the smallest product, back to back.
    let w = ctx.alloc(34).map_err(|e| e.to_string())?;
    let a = ctx.alloc(34).map_err(|e| e.to_string())?;
    let y = ctx.alloc(4).map_err(|e| e.to_string())?;
    let launch = |n: usize| -> Result<f64, String> {
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: one row of one Q8_0 block, one activation block, one output.
            unsafe {
                m.function("mv_q8_0")
                    .map_err(|e| e.to_string())?
                    .launch(
                        (1, 1, 1),
                        (32, 1, 1),
                        0,
                        &[
                            Arg::Ptr(w.ptr()),
                            Arg::Ptr(a.ptr()),
                            Arg::Ptr(y.ptr()),
                            Arg::I32(1),
                            Arg::I32(1),
                        ],
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        ctx.sync().map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64() / n as f64)
    };
    launch(100)?;
    let launch_us = launch(2000)? * 1e6;

    // Products at Llama-3.1-8B's shapes (one activation row), weights random bytes (the
    // time does not depend on the values).
    let mut products = Vec::new();
    for (kernel, bb, per, ab, rows, cols) in [
        ("mv_q4_0", 18usize, 32usize, 34usize, 14336usize, 4096usize),
        ("mv_q8_0", 34, 32, 34, 14336, 4096),
        ("mv_q4_k", 144, 256, 292, 14336, 4096),
        ("mv_q6_k", 210, 256, 292, 4096, 14336),
    ] {
        let nb = cols / per;
        let wbytes = rows * nb * bb;
        let wd = ctx.alloc(wbytes).map_err(|e| e.to_string())?;
        let ad = ctx.alloc(nb * ab).map_err(|e| e.to_string())?;
        let yd = ctx.alloc(rows * 4).map_err(|e| e.to_string())?;
        let run = |reps: usize| -> Result<f64, String> {
            let t = Instant::now();
            for _ in 0..reps {
                // SAFETY: wd holds rows x nb blocks, ad nb activation blocks, yd rows floats.
                unsafe {
                    m.function(kernel)
                        .map_err(|e| e.to_string())?
                        .launch(
                            ((rows as u32).div_ceil(4), 1, 1),
                            (32, 1, 1),
                            0,
                            &[
                                Arg::Ptr(wd.ptr()),
                                Arg::Ptr(ad.ptr()),
                                Arg::Ptr(yd.ptr()),
                                Arg::I32(rows as i32),
                                Arg::I32(nb as i32),
                            ],
                        )
                        .map_err(|e| e.to_string())?;
                }
            }
            ctx.sync().map_err(|e| e.to_string())?;
            Ok(t.elapsed().as_secs_f64() / reps as f64)
        };
        run(5)?;
        let s = run(50)?;
        products.push(json!({
            "kernel": kernel, "rows": rows, "cols": cols,
            "us": s * 1e6, "gb_per_s": wbytes as f64 / s / 1e9,
            "fraction_of_bandwidth": wbytes as f64 / s / bandwidth,
        }));
    }
    Ok(json!({
        "gpu": ctx.gpu.name,
        "compute_capability": format!("{}.{}", ctx.gpu.cc.0, ctx.gpu.cc.1),
        "nvrtc": format!("{}.{}", nvrtc.version().0, nvrtc.version().1),
        "compile_ms": compile_ms,
        "read_bandwidth_gb_per_s": bandwidth / 1e9,
        "launch_us": launch_us,
        "products": products,
    }))
}
