//! Speed of attention's inner kernels in a decode step's shape: 3 query heads sharing a
//! KV head of 64 dimensions, 100 cached f16 positions in rows of 192 (smollm2-135m), for 8
//! sequences x 30 layers x 3 KV heads. "cold" reads a different cache per (sequence,
//! layer), "hot" the same one again; the figure is per key (scores and value sums).
//!
//! Run: `cargo run --release -p frink-models --example attn_speed`.
use frink_models::kernels::{dot_multi_keys, weighted_sum_multi, KvData, KvRows};
use half::f16;
use std::time::Instant;
fn main() {
    let (hd, stride, keys, groups) = (64usize, 192usize, 100usize, 8 * 30 * 3);
    let layers: Vec<Vec<f16>> = (0..groups / 3)
        .map(|i| {
            (0..keys * stride)
                .map(|j| f16::from_f32(((i * 7 + j) % 13) as f32 * 0.1))
                .collect()
        })
        .collect();
    let q: Vec<Vec<f32>> = (0..3)
        .map(|r| (0..hd).map(|e| (r + e) as f32 * 0.01).collect())
        .collect();
    let mut s = vec![vec![0f32; keys]; 3];
    let mut o = vec![vec![0f32; hd]; 3];
    for pass in 0..6 {
        let hot = pass % 2 == 1;
        let t = Instant::now();
        for g in 0..groups {
            let layer = if hot { &layers[0] } else { &layers[g / 3] };
            let rows = KvRows::new(KvData::F16(layer), (g % 3) * hd, stride);
            let [s0, s1, s2] = &mut s[..] else {
                unreachable!()
            };
            dot_multi_keys(
                [&q[0][..], &q[1][..], &q[2][..]],
                rows,
                0..keys,
                [s0, s1, s2],
            );
            let [o0, o1, o2] = &mut o[..] else {
                unreachable!()
            };
            weighted_sum_multi(
                [o0, o1, o2],
                [&s[0][..], &s[1][..], &s[2][..]],
                rows,
                0..keys,
            );
        }
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{} {:.3} ms  {:.1} ns/key",
            if hot { "hot " } else { "cold" },
            dt * 1e3,
            dt * 1e9 / (groups * keys) as f64
        );
    }
}
