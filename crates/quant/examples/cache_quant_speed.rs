//! Time of the KV cache quantizer against the plain file quantizer, per million values.
use frink_quant::quantize::{quantize, quantize_for_cache};
use frink_quant::GgmlType;
use std::time::Instant;

fn main() {
    let n = 1 << 20;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.618).sin() * (1.0 + (i % 7) as f32))
        .collect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ] {
        let mut out = vec![0u8; n / 32 * ty.type_size()];
        let t = Instant::now();
        quantize(ty, &x, &mut out).unwrap();
        let plain = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        quantize_for_cache(ty, &x, &mut out).unwrap();
        let cache = t.elapsed().as_secs_f64() * 1e3;
        println!("{ty}: plain {plain:.1} ms, cache {cache:.1} ms per 1M values");
    }
}
