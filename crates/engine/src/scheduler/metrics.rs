//! The scheduler's counters and histograms: what it shares with the handle's
//! [`Scheduler::metrics`], and what the worker publishes after each step.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::worker::*;

/// Fixed-bucket latency histogram (seconds), in Prometheus' cumulative form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Number of observations at or below each bound of [`Histogram::BOUNDS`].
    pub counts: Vec<u64>,
    /// Number of observations.
    pub count: u64,
    /// Sum of the observations, in seconds.
    pub sum: f64,
}

impl Histogram {
    /// Upper bounds of the buckets, in seconds (`+Inf` is `count`).
    pub const BOUNDS: [f64; 12] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];

    pub(super) fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; Self::BOUNDS.len()];
        }
        for (c, &b) in self.counts.iter_mut().zip(Self::BOUNDS.iter()) {
            if secs <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

/// A snapshot of the scheduler's counters (for `/metrics`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Requests accepted into the queue.
    pub requests_total: u64,
    /// Requests that ran to `Done`.
    pub requests_finished: u64,
    /// Requests dropped because their client went away, or cancelled at shutdown.
    pub requests_cancelled: u64,
    /// Requests refused because the queue was full.
    pub requests_rejected: u64,
    /// Requests that ended in an error (`Event::Failed` other than a shutdown's: an
    /// evaluation that failed, a grammar the answer could not follow, a prompt refused at
    /// admission).
    pub requests_failed: u64,
    /// Tokens sampled.
    pub tokens_generated: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, tokens reused from a slot's cache.
    pub prompt_tokens_cached: u64,
    /// Requests that continued from a checkpoint of a recurrent state.
    pub checkpoints_restored: u64,
    /// Forward passes run (one per step: every active sequence's rows together).
    pub forward_steps: u64,
    /// Checkpoints held, and their bytes.
    pub checkpoints: usize,
    pub checkpoint_bytes: usize,
    /// Requests waiting in the queue.
    pub queue_depth: usize,
    /// Slots running a request.
    pub slots_busy: usize,
    /// Slots in all.
    pub slots_total: usize,
    /// KV cache positions held by running requests.
    pub kv_positions_used: usize,
    /// KV cache positions in all (the pool's blocks × [`frink_models::KV_BLOCK`]).
    pub kv_positions_total: usize,
    /// Blocks of the KV pool.
    pub kv_blocks_total: usize,
    /// Blocks running sequences hold.
    pub kv_blocks_used: usize,
    /// Blocks that keep reusable tokens and are not running sequences': the prefix
    /// cache's, idle slots' conversations.
    pub kv_blocks_cached: usize,
    /// Blocks of the pool's window group (0: none; sliding-window layers' rows,
    /// [`frink_models::KvPool::with_window_group`]).
    pub kv_window_blocks_total: usize,
    /// Window-group blocks some slot holds (running or idle).
    pub kv_window_blocks_held: usize,
    /// Bytes of the pool's keys and values (both groups).
    pub kv_bytes: usize,
    /// Sequences preempted (their blocks given to older ones, evaluated again later).
    pub preemptions: u64,
    /// Context shifts: generations that reached the context and dropped their oldest
    /// tokens to go on (`--context-shift`).
    pub context_shifts: u64,
    /// Blocks read back from the prefix cache's disk tier, and the bytes it holds.
    pub cache_disk_hits: u64,
    pub cache_disk_bytes: u64,
    /// Forward-pass time spent on prompt rows, in seconds (a mixed step is split by rows).
    pub prefill_seconds: f64,
    /// Forward-pass time spent on decode rows, in seconds.
    pub decode_seconds: f64,
    /// Time constrained tokens spent computing their grammar's mask and committing to it,
    /// in seconds (`llguidance`'s part of a step, outside the forward pass).
    pub grammar_seconds: f64,
    /// Tokens sampled under a grammar.
    pub grammar_tokens: u64,
    /// Speculation: tokens proposed and verified, and of those the ones accepted.
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    /// Time from arrival to the first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of one request.
    pub token_latency: Histogram,
}

/// State shared between the scheduler thread and its handle.
#[derive(Default)]
pub(super) struct Shared {
    /// Slot operations for the worker ([`super::slots`]); it takes the receiver.
    pub(super) slot_ops: std::sync::Mutex<Option<std::sync::mpsc::Receiver<super::slots::SlotOp>>>,
    pub(super) requests_total: AtomicU64,
    pub(super) requests_finished: AtomicU64,
    pub(super) requests_cancelled: AtomicU64,
    pub(super) requests_rejected: AtomicU64,
    pub(super) requests_failed: AtomicU64,
    pub(super) tokens_generated: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) prompt_tokens_cached: AtomicU64,
    pub(super) checkpoints_restored: AtomicU64,
    pub(super) forward_steps: AtomicU64,
    pub(super) checkpoints: AtomicUsize,
    pub(super) checkpoint_bytes: AtomicUsize,
    pub(super) queued: AtomicUsize,
    pub(super) slots_busy: AtomicUsize,
    pub(super) kv_used: AtomicUsize,
    pub(super) kv_blocks_total: AtomicUsize,
    pub(super) kv_blocks_used: AtomicUsize,
    pub(super) kv_blocks_cached: AtomicUsize,
    pub(super) kv_window_blocks_total: AtomicUsize,
    pub(super) kv_window_blocks_held: AtomicUsize,
    pub(super) kv_bytes: AtomicUsize,
    pub(super) preemptions: AtomicU64,
    pub(super) context_shifts: AtomicU64,
    pub(super) cache_disk_hits: AtomicU64,
    pub(super) cache_disk_bytes: AtomicU64,
    /// Prefill and decode time, in nanoseconds.
    pub(super) prefill_ns: AtomicU64,
    pub(super) decode_ns: AtomicU64,
    /// Time constrained tokens spent in their grammar's mask and commit, in nanoseconds,
    /// and how many tokens that was.
    pub(super) grammar_ns: AtomicU64,
    pub(super) grammar_tokens: AtomicU64,
    pub(super) spec_proposed: AtomicU64,
    pub(super) spec_accepted: AtomicU64,
    pub(super) histograms: Mutex<(Histogram, Histogram)>,
    /// Refuse queued requests and cancel running ones (shutdown).
    pub(super) cancel_all: AtomicBool,
}

impl Worker<'_> {
    /// Updates the busy-slot gauge, the KV positions running requests hold, the pool's
    /// block counts and the waiting jobs.
    pub(super) fn publish_busy(&self) {
        self.shared.slots_busy.store(self.busy(), Ordering::SeqCst);
        let running: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| self.jobs[i].is_some())
            .collect();
        // Used: the blocks of running sequences (vLLM's usage); cached: the rest that is
        // not free (the prefix cache's blocks nobody holds, idle slots' conversations).
        let (used, blocks) = self.kv.held_by(&running);
        self.shared.kv_used.store(used, Ordering::Relaxed);
        self.kv.publish_blocks(blocks);
    }
}
