//! Times a speculative verification step on a real model: one sequence with a `ctx`-token
//! history evaluates its token and `k` proposals in one forward pass, every row's logits
//! wanted (`Logits::All`, as verification needs) and, for comparison, only the last row's
//! (a prefill chunk of the same size).
//!
//! Run: `cargo run --release -p frink-models --example verify_step -- MODEL.gguf [ctx]
//! [threads]`. Prints, for 1 to 8 rows, the median step time of each and its ratio to a
//! one-row step: what `Adaptive::choose` in frink-engine weighs proposals against.

use std::time::Instant;

use frink_models::{pool, KvType, Logits, Model, SeqState};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: verify_step MODEL.gguf [ctx] [threads]");
    let ctx: usize = args.next().map_or(400, |s| s.parse().expect("ctx"));
    let threads: usize = args.next().map_or(2, |s| s.parse().expect("threads"));
    pool::set_threads(threads);
    let model = Model::load(&path).expect("load");
    let n_vocab = model.config.n_vocab as u32;
    let steps = 12;
    let mut cache = SeqState::new(&model.config, ctx + 16, KvType::F16);
    let toks: Vec<u32> = (0..ctx as u32).map(|i| (i * 7919) % n_vocab).collect();
    model
        .forward(&mut cache, &toks, Logits::None)
        .expect("prefill");
    let mut base = 0.0;
    for rows in 1..=8usize {
        let mut med = [0.0f64; 2];
        for (w, want) in [Logits::All, Logits::Last].into_iter().enumerate() {
            let mut times = Vec::new();
            for step in 0..steps {
                let batch: Vec<u32> = (0..rows as u32)
                    .map(|r| (r * 31 + step as u32 * 17 + 5) * 2_654_435_761 % n_vocab)
                    .collect();
                let t = Instant::now();
                model.forward(&mut cache, &batch, want).expect("step");
                times.push(t.elapsed().as_secs_f64());
                cache.truncate(ctx);
            }
            times.sort_by(f64::total_cmp);
            med[w] = times[steps / 2];
        }
        if rows == 1 {
            base = med[0];
        }
        println!(
            "rows {rows}  all logits {:6.2} ms ({:.2}x one row)  last only {:6.2} ms",
            med[0] * 1e3,
            med[0] / base,
            med[1] * 1e3
        );
    }
}
