//! Times every decode path ([`frink_models::tune::DecodePath`]) on a real model, as
//! `frink` does once per CPU and file shape, several times over (to see how stable the
//! choice is on a noisy machine).
//!
//! Run: `cargo run --release -p frink-models --example decode_paths -- MODEL.gguf [seqs]
//! [threads] [repeats]` (defaults 1, 2, 3). Prints each calibration's median step times
//! and the fastest path.

use frink_models::tune::DecodePath;
use frink_models::{pool, Model};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: decode_paths MODEL.gguf [seqs] [threads] [repeats]");
    let seqs: usize = args.next().map_or(1, |s| s.parse().expect("seqs"));
    let threads: usize = args.next().map_or(2, |s| s.parse().expect("threads"));
    let repeats: usize = args.next().map_or(3, |s| s.parse().expect("repeats"));
    pool::set_threads(threads);
    let model = Model::load(&path).expect("load");
    for r in 0..repeats {
        let c = model.calibrate(&DecodePath::ALL, seqs).expect("calibrate");
        println!("{r}: {seqs} seqs, {} rounds: {}", c.rounds, c.summary());
    }
}
