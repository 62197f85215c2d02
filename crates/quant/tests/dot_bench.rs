//! Micro-benchmark of the dot kernels: ns per row, scalar vs SIMD, for rows 576 and 896
//! wide (legacy formats) and 2304 / 4864 wide (K-quants, which need multiples of 256).
//! Ignored by default: `cargo test --release -p frink-quant --test dot_bench -- --ignored
//! --nocapture`.

use std::hint::black_box;
use std::time::Instant;

use frink_gguf::GgmlType;
use frink_quant::dot::{kernel, quantize_activation, vec_dot_type, Isa};

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Weight rows with finite f16 scales (0x3C00 = 1.0 written over every 2-byte field that
/// could be a scale is not needed: random f16 bits may be inf/NaN, which does not change
/// the instruction count of integer kernels).
fn bench(ty: GgmlType, width: usize) {
    let act_ty = vec_dot_type(ty).unwrap();
    let rows = 256;
    let row_bytes = ty.row_bytes(width as u64).unwrap() as usize;
    let w = bytes(rows * row_bytes, 0x1234_5678 + width as u64);
    let x: Vec<f32> = bytes(width, 99)
        .iter()
        .map(|&b| f32::from(b) - 128.0)
        .collect();
    let mut a = vec![0u8; act_ty.row_bytes(width as u64).unwrap() as usize];
    quantize_activation(act_ty, &x, &mut a).unwrap();
    let mut line = format!("{ty:>5} x {width:>4}:");
    let mut scalar_ns = 0.0;
    for isa in Isa::available() {
        let k = kernel(ty, isa).unwrap();
        if k.isa() != isa {
            continue;
        }
        let reps = 200;
        let t = Instant::now();
        let mut s = 0f32;
        for _ in 0..reps {
            for r in w.chunks_exact(row_bytes) {
                s += k.dot(black_box(r), black_box(&a));
            }
        }
        black_box(s);
        let ns = t.elapsed().as_nanos() as f64 / (reps * rows) as f64;
        if isa == Isa::Scalar {
            scalar_ns = ns;
            line += &format!(" scalar {ns:8.1} ns/row");
        } else {
            line += &format!(" | {isa:?} {ns:7.1} ns/row ({:.1}x)", scalar_ns / ns);
        }
    }
    // One weight row against 8 activation rows at once (the prefill shape).
    let k = kernel(ty, Isa::best()).unwrap();
    let mut acts = Vec::new();
    for _ in 0..8 {
        acts.extend_from_slice(&a);
    }
    let mut out = [0f32; 8];
    let reps = 50;
    let t = Instant::now();
    for _ in 0..reps {
        for r in w.chunks_exact(row_bytes) {
            k.dot_rows(black_box(r), black_box(&acts), &mut out);
            black_box(&out);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / (reps * rows * 8) as f64;
    line += &format!(" | {:?} dot_rows x8 {ns:6.1} ns/row", k.isa());
    // A tile of 64 weight rows x 8 activation rows per call.
    let mut tile = vec![0f32; 64 * 8];
    let reps = 50;
    let t = Instant::now();
    for _ in 0..reps {
        for ws in w.chunks_exact(64 * row_bytes) {
            k.dot_tile(black_box(ws), 64, black_box(&acts), 8, &mut tile);
            black_box(&tile);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / (reps * rows * 8) as f64;
    line += &format!(" | dot_tile 64x8 {ns:6.1} ns/pair");
    eprintln!("{line}");
}

#[test]
#[ignore = "micro-benchmark; run with --ignored --nocapture"]
fn quantize_ns_per_row() {
    for (act_ty, width) in [
        (GgmlType::Q8_0, 576),
        (GgmlType::Q8_0, 896),
        (GgmlType::Q8_K, 2304),
        (GgmlType::Q8_K, 4864),
    ] {
        let x: Vec<f32> = bytes(width, 7)
            .iter()
            .map(|&b| f32::from(b) - 128.0)
            .collect();
        let mut a = vec![0u8; act_ty.row_bytes(width as u64).unwrap() as usize];
        let reps = 20_000;
        let t = Instant::now();
        for _ in 0..reps {
            quantize_activation(act_ty, black_box(&x), &mut a).unwrap();
            black_box(&a);
        }
        let ns = t.elapsed().as_nanos() as f64 / reps as f64;
        eprintln!("quantize {act_ty} x {width}: {ns:8.1} ns/row");
    }
}

#[test]
#[ignore = "micro-benchmark; run with --ignored --nocapture"]
fn dot_ns_per_row() {
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        for width in [576, 896] {
            bench(ty, width);
        }
    }
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        for width in [2304, 4864] {
            bench(ty, width);
        }
    }
}
