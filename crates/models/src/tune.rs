//! Choosing the decode path per machine by measuring it.
//!
//! A decode step streams every weight once, so its speed is the memory system's, and what
//! reads fastest differs between machines: the weights repacked at load (eight rows
//! interleaved, one contiguous run per thread, [`frink_quant::dot::pack`]) or read as
//! stored from the file's mapping (four streams per thread), and, for the packed copies,
//! the cache hint of the kernels' software prefetch. Measured with the same binary (two
//! threads, a Qwen2.5-1.5B-shaped Q4_K_M file, decode steps alternating in one process):
//! on an AMD Zen 5 VM the packed copies with `prefetchnta` were the fastest; on an Intel
//! Xeon VM (Sapphire Rapids class) the same path ran at 0.48 of the stored layout's speed
//! for one sequence, the packed copies with `prefetcht1` at 0.91, and for four sequences
//! at 0.89 and 1.34 (the stored layout's one-row kernels do not batch). So frink measures:
//! [`Model::calibrate`] times a few real decode steps of the loaded model under each
//! candidate [`DecodePath`], alternating them round by round, and the caller keeps the
//! fastest (and caches it per CPU and file shape; `frink` does under `$FRINK_HOME`).
//! Every path gives the same bits.

use std::time::{Duration, Instant};

use frink_quant::dot::pack::{set_prefetch_hint, PrefetchHint};

use crate::{KvType, Logits, Model, Result, SeqState, Sequence};

/// How decode steps read the weight matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodePath {
    /// The stored rows, read from the file's mapping (llama.cpp's `--no-repack`).
    Stored,
    /// The copies repacked at load, the group kernels prefetching with this hint.
    Packed(PrefetchHint),
}

impl DecodePath {
    /// Every path on a machine with packed kernels.
    pub const ALL: [DecodePath; 4] = [
        DecodePath::Stored,
        DecodePath::Packed(PrefetchHint::Nta),
        DecodePath::Packed(PrefetchHint::T0),
        DecodePath::Packed(PrefetchHint::T1),
    ];

    /// Its name: `stored`, `packed/nta`, `packed/t0`, `packed/t1`.
    pub fn name(self) -> String {
        match self {
            DecodePath::Stored => "stored".into(),
            DecodePath::Packed(h) => format!("packed/{}", h.name()),
        }
    }

    /// The path named `s` ([`DecodePath::name`]).
    pub fn parse(s: &str) -> Option<DecodePath> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// What [`Model::calibrate`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// Each candidate and its median step time (seconds), in the order tried.
    pub timings: Vec<(DecodePath, f64)>,
    /// The fastest candidate.
    pub best: DecodePath,
    /// Sequences per step.
    pub seqs: usize,
    /// Timed rounds (one step of each candidate per round).
    pub rounds: usize,
}

impl Calibration {
    /// One line for a log: `stored 43.2 ms, packed/nta 90.5 ms, … -> stored`.
    pub fn summary(&self) -> String {
        let each: Vec<String> = self
            .timings
            .iter()
            .map(|(p, t)| format!("{} {:.1} ms", p.name(), t * 1e3))
            .collect();
        format!("{} -> {}", each.join(", "), self.best.name())
    }
}

/// Positions each calibration sequence holds before the timed steps.
const CONTEXT: usize = 16;

/// Rounds of calibration: at least [`MIN_ROUNDS`] timed ones (after one untimed round
/// that brings every path's pages in), then more until [`BUDGET`] is spent, at most
/// [`MAX_ROUNDS`].
const MIN_ROUNDS: usize = 3;
const MAX_ROUNDS: usize = 9;
const BUDGET: Duration = Duration::from_millis(1500);

impl Model {
    /// Makes decode steps read the weights by `path`: the packed copies (which
    /// [`Model::set_repack`] must have made; a matrix without one is read as stored) with
    /// that prefetch hint, or the stored rows (the copies kept until dropped). The hint
    /// is the process's ([`set_prefetch_hint`]). Results are the same bits either way.
    pub fn set_decode_path(&self, path: DecodePath) {
        use std::sync::atomic::Ordering;
        match path {
            DecodePath::Stored => self.packed_active.store(false, Ordering::Relaxed),
            DecodePath::Packed(h) => {
                set_prefetch_hint(h);
                self.packed_active.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The path decode steps read the weights by now.
    pub fn decode_path(&self) -> DecodePath {
        use std::sync::atomic::Ordering;
        if self.packed_active.load(Ordering::Relaxed) && self.repacked_bytes() > 0 {
            DecodePath::Packed(frink_quant::dot::pack::prefetch_hint())
        } else {
            DecodePath::Stored
        }
    }

    /// Times decode steps of `seqs` sequences (each with [`CONTEXT`] positions) under each
    /// of `candidates`, one step of each per round in turn, and returns the median step
    /// time of each and the fastest. Leaves the fastest path set
    /// ([`Model::set_decode_path`]). The packed candidates need the packed copies (else
    /// they are not tried); a single candidate is returned untimed.
    ///
    /// Costs `(1 + rounds) × candidates` decode steps (rounds: at least 3, more while
    /// under 1.5 s, at most 9) and the KV cache of `seqs` short sequences; while the
    /// stored candidate runs, the stored pages of packed matrices come back into memory
    /// (the caller releases them, [`Model::release_stored`], or drops the copies).
    ///
    /// Errors: a decode step's error.
    pub fn calibrate(&self, candidates: &[DecodePath], seqs: usize) -> Result<Calibration> {
        let packed = self.repacked_bytes() > 0;
        let tried: Vec<DecodePath> = candidates
            .iter()
            .copied()
            .filter(|p| packed || *p == DecodePath::Stored)
            .collect();
        let seqs = seqs.max(1);
        if tried.len() <= 1 {
            let best = tried.first().copied().unwrap_or(DecodePath::Stored);
            self.set_decode_path(best);
            return Ok(Calibration {
                timings: Vec::new(),
                best,
                seqs,
                rounds: 0,
            });
        }
        let n_vocab = self.config.n_vocab.max(1) as u32;
        // Every candidate steps the same sequences, one position per step: a round's
        // candidates see contexts one apart (negligible beside the weights).
        let n_ctx = CONTEXT + (MAX_ROUNDS + 1) * tried.len() + 1;
        let mut states: Vec<SeqState> = (0..seqs)
            .map(|_| SeqState::new(&self.config, n_ctx, KvType::F16))
            .collect();
        for (s, st) in states.iter_mut().enumerate() {
            let toks: Vec<u32> = (0..CONTEXT as u32 - 1)
                .map(|i| (i * 7919 + s as u32 * 104_729 + 1) % n_vocab)
                .collect();
            self.forward(st, &toks, Logits::None)?;
        }
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); tried.len()];
        let t0 = Instant::now();
        let mut step = 0u32;
        let mut rounds = 0;
        while rounds < MAX_ROUNDS && (rounds < MIN_ROUNDS || t0.elapsed() < BUDGET) {
            for (c, &path) in tried.iter().enumerate() {
                self.set_decode_path(path);
                let toks: Vec<[u32; 1]> = (0..seqs as u32)
                    .map(|s| [step.wrapping_mul(2_654_435_761).wrapping_add(s) % n_vocab])
                    .collect();
                step += 1;
                let mut batch: Vec<Sequence> = states
                    .iter_mut()
                    .zip(&toks)
                    .map(|(state, t)| Sequence {
                        state,
                        tokens: t,
                        logits: Logits::Last,
                        lora: None,
                        embd: &[],
                        rope_shift: 0,
                        token_types: &[],
                    })
                    .collect();
                let t = Instant::now();
                self.forward_batch(&mut batch)?;
                // The first round brings every path's pages in: not timed.
                if step > tried.len() as u32 {
                    times[c].push(t.elapsed().as_secs_f64());
                }
            }
            if step > tried.len() as u32 {
                rounds += 1;
            }
        }
        let timings: Vec<(DecodePath, f64)> = tried
            .iter()
            .zip(times.iter_mut())
            .map(|(&p, t)| {
                t.sort_by(f64::total_cmp);
                (p, t.get(t.len() / 2).copied().unwrap_or(f64::INFINITY))
            })
            .collect();
        let best = timings
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(DecodePath::Stored, |t| t.0);
        self.set_decode_path(best);
        Ok(Calibration {
            timings,
            best,
            seqs,
            rounds,
        })
    }
}
