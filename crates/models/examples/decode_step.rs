//! Times one batched decode step (continuous batching) against a single-sequence step on a
//! real model: `n` sequences, each with a `ctx`-token history, decode one token together.
//!
//! Run: `cargo run --release -p frink-models --example decode_step -- MODEL.gguf [ctx] [threads]`.
//! Prints, for 1, 2, 4 and 8 sequences, the step time (best and median of the steps) and
//! the aggregate tokens/s, and the scaling over one sequence (the server's 8-stream figure
//! is bounded by it). `FRINK_N=8` times only that many sequences (for a profiler),
//! `FRINK_STEPS` sets the timed steps (24), `FRINK_NCTX=1024` sizes the caches like a
//! server's slots.

use std::time::Instant;

use frink_models::{pool, KvType, Logits, Model, SeqState, Sequence};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: decode_step MODEL.gguf [ctx] [threads]");
    let ctx: usize = args.next().map_or(100, |s| s.parse().expect("ctx"));
    let threads: usize = args.next().map_or(2, |s| s.parse().expect("threads"));
    pool::set_threads(threads);
    let model = Model::load(&path).expect("load");
    let n_vocab = model.config.n_vocab as u32;
    let steps: usize = std::env::var("FRINK_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut base = 0.0;
    // `FRINK_NCTX=1024`: caches sized like a server's slots (default: just large enough).
    let n_ctx: usize = std::env::var("FRINK_NCTX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // `FRINK_N=8` times only that many sequences (for a profiler).
    let only: Option<usize> = std::env::var("FRINK_N").ok().and_then(|v| v.parse().ok());
    let sizes: Vec<usize> = only.map_or(vec![1, 2, 4, 8], |n| vec![n]);
    for n in sizes {
        let mut caches: Vec<SeqState> = (0..n)
            .map(|_| SeqState::new(&model.config, n_ctx.max(ctx + steps + 1), KvType::F16))
            .collect();
        // Each sequence's own history (different tokens per sequence).
        for (s, cache) in caches.iter_mut().enumerate() {
            let toks: Vec<u32> = (0..ctx as u32)
                .map(|i| (i * 7919 + s as u32 * 104_729) % n_vocab)
                .collect();
            model.forward(cache, &toks, Logits::None).expect("prefill");
        }
        let mut times = Vec::new();
        for step in 0..steps {
            let toks: Vec<[u32; 1]> = (0..n)
                .map(|s| [((step * 31 + s * 17) as u32 * 2_654_435_761) % n_vocab])
                .collect();
            let mut seqs: Vec<Sequence> = caches
                .iter_mut()
                .zip(&toks)
                .map(|(cache, t)| Sequence {
                    state: cache,
                    tokens: t,
                    logits: Logits::Last,
                    lora: None,
                    embd: &[],
                    rope_shift: 0,
                    token_types: &[],
                })
                .collect();
            let t = Instant::now();
            model.forward_batch(&mut seqs).expect("step");
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let (best, med) = (times[0], times[times.len() / 2]);
        if n == 1 {
            base = med;
        }
        println!(
            "n={n}  step best {:6.2} ms  median {:6.2} ms  {:7.1} t/s  scaling {:.2}x",
            best * 1e3,
            med * 1e3,
            n as f64 / med,
            n as f64 * base / med
        );
    }
}
