//! Recording an importance matrix (llama.cpp tools/imatrix/imatrix.cpp
//! `collect_imatrix`): while [`record`] runs, every matrix product of a weight named
//! `blk.*` (and with `process_output`, the LM head) adds the rows entering it to that
//! weight's statistics ([`frink_quant::imatrix::Entry`]: Σ x² and Σ x per column, rows
//! seen), per expert for a stacked experts tensor.
//!
//! llama.cpp's rules, kept: a product of a plain (not per-expert) weight with fewer than
//! 16 rows is skipped (a decode step, not a prompt); expert products count each routed
//! row once for its expert. A weight read through several views (a fused tensor split
//! into its parts) is recorded once, through the view at its start.
//!
//! The recorder is installed on the calling thread: the forward pass calls every matrix
//! product from the thread that runs it ([`crate::kernels::matmul_many`] spreads only
//! the product's own tiles over the pool), so no other thread's model is recorded.

use std::cell::RefCell;
use std::collections::BTreeMap;

use frink_gguf::GgufFile;
use frink_quant::imatrix::{Entry, Imatrix};

use crate::kernels::Matrix;

/// Rows below which llama-imatrix ignores a plain weight's product.
const MIN_ROWS: usize = 16;

/// A weight whose inputs are recorded.
#[derive(Debug)]
struct Target {
    name: String,
    cols: usize,
    /// Experts stacked in the tensor (`ne2`; 1 for a plain matrix).
    n_mat: usize,
}

/// The statistics being recorded for one model.
#[derive(Debug, Default)]
pub struct Recorder {
    /// By tensor index in the model file.
    targets: Vec<Option<Target>>,
    entries: BTreeMap<usize, Entry>,
}

impl Recorder {
    /// A recorder for the weights of `file`: every `blk.*` matrix, and with
    /// `process_output` also `output.weight` (or the tied `token_embd.weight`), as
    /// llama-imatrix's `--process-output`.
    pub fn new(file: &GgufFile, process_output: bool) -> Recorder {
        let targets = file
            .tensor_infos()
            .iter()
            .map(|t| {
                let output = t.name == "output.weight" || t.name == "token_embd.weight";
                let wanted = t.name.starts_with("blk.") || (process_output && output);
                (wanted && t.shape.len() >= 2).then(|| Target {
                    name: t.name.clone(),
                    cols: t.shape[0] as usize,
                    n_mat: t.shape.get(2).copied().unwrap_or(1).max(1) as usize,
                })
            })
            .collect();
        Recorder {
            targets,
            entries: BTreeMap::new(),
        }
    }

    /// Adds `n` rows `x` entering the product with `w`.
    fn observe(&mut self, w: &Matrix, x: &[f32], n: usize) {
        let Some(Some(t)) = self.targets.get(w.tensor) else {
            return;
        };
        if w.cols != t.cols {
            return;
        }
        let mat = if t.n_mat > 1 {
            w.place()
        } else {
            if n < MIN_ROWS || w.offset != 0 {
                return;
            }
            0
        };
        if mat >= t.n_mat {
            return;
        }
        let (n_mat, cols) = (t.n_mat, t.cols);
        self.entries
            .entry(w.tensor)
            .or_insert_with(|| Entry::new(n_mat, cols))
            .add_rows(mat, &x[..n * cols]);
    }

    /// The statistics as an importance matrix of `chunk_count` chunks of `chunk_size`
    /// tokens of `datasets`. A plain weight with one count (`counts.len() == 1`), a
    /// stacked one with one per expert, as llama-imatrix writes them.
    pub fn finish(self, datasets: Vec<String>, chunk_count: u32, chunk_size: u32) -> Imatrix {
        let entries = self
            .entries
            .into_iter()
            .filter_map(|(i, e)| {
                let t = self.targets.get(i)?.as_ref()?;
                Some((t.name.clone(), e))
            })
            .collect();
        Imatrix {
            entries,
            datasets,
            chunk_count,
            chunk_size,
            legacy: false,
        }
    }
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Runs `f` with `recorder` installed on this thread, and gives it back with what it
/// recorded.
pub fn record<R>(recorder: Recorder, f: impl FnOnce() -> R) -> (R, Recorder) {
    struct Uninstall;
    impl Drop for Uninstall {
        fn drop(&mut self) {
            RECORDER.with(|r| r.borrow_mut().take());
        }
    }
    RECORDER.with(|r| *r.borrow_mut() = Some(recorder));
    let guard = Uninstall;
    let out = f();
    let recorder = RECORDER.with(|r| r.borrow_mut().take()).unwrap_or_default();
    drop(guard);
    (out, recorder)
}

/// Called by the matrix products: records `x` (`n` rows of `w.cols`) for `w` when a
/// recorder is installed on this thread.
#[inline]
pub(crate) fn observe(w: &Matrix, x: &[f32], n: usize) {
    RECORDER.with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            if let Some(rec) = r.as_mut() {
                rec.observe(w, x, n);
            }
        }
    });
}
