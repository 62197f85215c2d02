//! Times `DotKernel::dot_tile` on real model shapes with random data (single thread).
//!
//! - Decode (`n_a = 1`): whole matrices, tiles of `FRINK_NW` (default 32) weight rows, reported as GB/s of
//!   weight bytes read.
//! - Prefill (`n_a = 512`): tiles of `FRINK_NW` (default 32) weight rows by 512 activation rows (the caller's
//!   shape), reported as GOP/s (`2 * rows * cols * n_a / time`).
//!
//! Run: `cargo run --release -p frink-quant --example tile_speed [filter]`. Each figure is
//! the best of several repetitions (the CPU may be shared).

use std::hint::black_box;
use std::time::Instant;

use frink_gguf::GgmlType;
use frink_quant::dot::{best_kernel, kernel, quantize_activation, DotKernel, Isa};
use half::f16;

/// xorshift bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Byte offsets of the f16 scales in a block of `ty` (set to finite values).
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        _ => &[],
    }
}

fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut w = bytes(rows * rb, 0x1234_5678 ^ (rows * cols) as u64);
    for blk in w.chunks_exact_mut(ty.type_size()) {
        for &at in scale_fields(ty) {
            blk[at..at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        }
    }
    w
}

fn acts(ty: GgmlType, n_a: usize, cols: usize) -> Vec<u8> {
    let act_ty = best_kernel(ty).unwrap().act_type();
    let ab = act_ty.row_bytes(cols as u64).unwrap() as usize;
    let x: Vec<f32> = bytes(n_a * cols, 99)
        .iter()
        .map(|&b| (f32::from(b) - 128.0) / 64.0)
        .collect();
    let mut a = vec![0u8; n_a * ab];
    for (x, a) in x.chunks_exact(cols).zip(a.chunks_exact_mut(ab)) {
        quantize_activation(act_ty, x, a).unwrap();
    }
    a
}

/// The kernel to time: the best one, or the ISA named by `FRINK_ISA` (`avx2`, `vnni`,
/// `scalar`; the packed layout's kernels too).
fn pick(ty: GgmlType) -> DotKernel {
    match isa() {
        Some(isa) => kernel(ty, isa).unwrap(),
        None => best_kernel(ty).unwrap(),
    }
}

/// The ISA named by `FRINK_ISA`, if any.
fn isa() -> Option<Isa> {
    match std::env::var("FRINK_ISA").as_deref() {
        Ok("avx2") => Some(Isa::Avx2),
        Ok("vnni") => Some(Isa::Avx512Vnni),
        Ok("scalar") => Some(Isa::Scalar),
        _ => None,
    }
}

/// Best seconds of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Weight rows per `dot_tile` call (`FRINK_NW`, default 32).
fn n_w() -> usize {
    std::env::var("FRINK_NW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// K-quant rows must be whole 256-value super-blocks: a shape given the other way round
/// (the same matrix, transposed) is swapped.
fn shape(ty: GgmlType, rows: usize, cols: usize) -> (usize, usize) {
    if !cols.is_multiple_of(ty.block_size()) {
        (cols, rows)
    } else {
        (rows, cols)
    }
}

fn decode(ty: GgmlType, rows: usize, cols: usize) {
    let nw = n_w();
    let (rows, cols) = shape(ty, rows, cols);
    let k = pick(ty);
    let w = weights(ty, rows, cols);
    let a = acts(ty, 1, cols);
    let rb = w.len() / rows;
    let mut out = vec![0f32; nw];
    let reps = (2_000_000_000 / w.len()).clamp(5, 200);
    let s = best(reps, || {
        for ws in w.chunks(nw * rb) {
            let n = ws.len() / rb;
            k.dot_tile(black_box(ws), n, black_box(&a), 1, &mut out[..n]);
            black_box(&out);
        }
    });
    println!(
        "decode  {:>5} {rows:>6}x{cols:<5} {:>7.1} MB  {:6.2} GB/s  ({:.3} ms)",
        format!("{ty}"),
        w.len() as f64 / 1e6,
        w.len() as f64 / s / 1e9,
        s * 1e3
    );
}

fn prefill(ty: GgmlType, rows: usize, cols: usize, n_a: usize) {
    let nw = n_w();
    let (rows, cols) = shape(ty, rows, cols);
    let k = pick(ty);
    let w = weights(ty, rows, cols);
    let a = acts(ty, n_a, cols);
    let rb = w.len() / rows;
    let mut out = vec![0f32; nw * n_a];
    // Small batches take well under a millisecond: more repetitions for a stable best.
    let reps = if n_a <= 16 { 40 } else { 3 };
    let s = best(reps, || {
        for ws in w.chunks(nw * rb) {
            let n = ws.len() / rb;
            k.dot_tile(black_box(ws), n, black_box(&a), n_a, &mut out[..n * n_a]);
            black_box(&out);
        }
    });
    let ops = 2.0 * rows as f64 * cols as f64 * n_a as f64;
    println!(
        "prefill {:>5} {rows:>6}x{cols:<5} n_a={n_a}  {:6.1} GOP/s  ({:.1} ms)",
        format!("{ty}"),
        ops / s / 1e9,
        s * 1e3
    );
}

/// The packed layout (`frink_quant::dot::pack`) on the same shapes: decode GB/s of the
/// stored bytes and products GOP/s for `n_a` activation rows, tasks of `FRINK_NW` rows.
fn packed(ty: GgmlType, rows: usize, cols: usize, n_a: usize) {
    use frink_quant::dot::pack::{Packed, GROUP};
    let (rows, cols) = shape(ty, rows, cols);
    let w = weights(ty, rows, cols);
    let p = Packed::new(ty, &w, rows, cols).unwrap();
    let a = acts(ty, n_a, cols);
    let prep = frink_quant::dot::best_kernel(ty).unwrap().prepare(&a, n_a);
    let per = (n_w() / GROUP).max(1);
    let reps = if n_a == 1 {
        (2_000_000_000 / w.len()).clamp(5, 200)
    } else if n_a <= 16 {
        40
    } else {
        3
    };
    let mut sum = 0f32;
    let isa = isa().unwrap_or_else(Isa::best);
    // `FRINK_PREFETCH=nta|t0|t1`: the group kernels' prefetch hint.
    let hint = std::env::var("FRINK_PREFETCH")
        .ok()
        .and_then(|h| frink_quant::dot::pack::PrefetchHint::parse(&h))
        .unwrap_or_else(frink_quant::dot::pack::prefetch_hint);
    let s = best(reps, || {
        let mut g = 0;
        while g < p.groups() {
            let n = per.min(p.groups() - g);
            p.dot_groups_on(
                isa,
                hint,
                g,
                n,
                black_box(&a),
                n_a,
                &prep,
                &mut |_, _, v| sum += v[0],
            );
            g += n;
        }
    });
    black_box(sum);
    if n_a == 1 {
        println!(
            "packed  {:>5} {rows:>6}x{cols:<5} {:>7.1} MB  {:6.2} GB/s  ({:.3} ms)",
            format!("{ty}"),
            w.len() as f64 / 1e6,
            w.len() as f64 / s / 1e9,
            s * 1e3
        );
    } else {
        let ops = 2.0 * rows as f64 * cols as f64 * n_a as f64;
        println!(
            "packed  {:>5} {rows:>6}x{cols:<5} n_a={n_a}  {:6.1} GOP/s  ({:.1} ms)",
            format!("{ty}"),
            ops / s / 1e9,
            s * 1e3
        );
    }
}

fn main() {
    use GgmlType as T;
    let filter = std::env::args().nth(1).unwrap_or_default();
    let want = |s: &str| filter.is_empty() || s.contains(&filter);
    let dec = [
        (T::Q5_0, 4864, 896),
        (T::Q8_0, 151936, 896),
        (T::Q4_K, 4864, 896),
        (T::Q6_K, 896, 4864),
        // qwen2.5-1.5b's shapes: rows of 6 super-blocks (n_embd 1536) and of 35 (n_ff 8960).
        (T::Q4_K, 1536, 1536),
        (T::Q4_K, 1536, 8960),
        (T::Q6_K, 1536, 8960),
        (T::Q4_1, 1536, 576),
        (T::Q4_0, 4864, 896),
        (T::Q5_1, 4864, 896),
        (T::Q5_K, 4864, 1024),
        (T::Q3_K, 4864, 1024),
        (T::Q2_K, 4864, 1024),
    ];
    for (ty, r, c) in dec {
        if want(&format!("decode {ty}")) {
            decode(ty, r, c);
        }
    }
    let pre = [
        (T::Q5_0, 2048, 640),
        (T::Q4_K, 2048, 640),
        (T::Q6_K, 640, 2048),
        (T::Q4_1, 1536, 576),
        (T::Q8_0, 896, 896),
        (T::Q4_0, 2048, 640),
        (T::Q5_1, 2048, 640),
        (T::Q5_K, 2048, 768),
        (T::Q3_K, 2048, 768),
        (T::Q2_K, 2048, 768),
    ];
    for (ty, r, c) in pre {
        if want(&format!("prefill {ty}")) {
            prefill(ty, r, c, 512);
        }
    }
    for (ty, r, c) in [
        (T::Q4_K, 896, 4864),
        (T::Q6_K, 896, 4864),
        (T::Q4_K, 1536, 1536),
        (T::Q4_K, 1536, 8960),
        (T::Q6_K, 1536, 8960),
        (T::Q4_0, 8960, 1536),
        (T::Q4_0, 1536, 8960),
        (T::Q4_1, 1536, 576),
        (T::Q5_0, 6912, 1152),
        (T::Q8_0, 8960, 1536),
    ] {
        if frink_quant::dot::pack::block_bytes(ty).is_some() && want(&format!("packed {ty}")) {
            for n_a in [1, 2, 4, 8, 512] {
                packed(ty, r, c, n_a);
            }
        }
    }
    // Small batches (continuous batching's decode steps): ideally the time of n_a = 1.
    for (ty, r, c) in [
        (T::Q4_1, 1536, 576),
        (T::Q5_0, 4864, 896),
        (T::Q4_K, 4864, 1024),
        (T::Q6_K, 896, 4864),
        (T::Q8_0, 4864, 896),
    ] {
        if want(&format!("batch {ty}")) {
            for n_a in [1, 2, 3, 4, 6, 8, 16] {
                prefill(ty, r, c, n_a);
            }
        }
    }
}
