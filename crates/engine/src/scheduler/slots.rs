//! Slot operations (llama.cpp's server: `GET /slots`, `POST /slots/{id}?action=save|
//! restore|erase`): a slot's keys and values saved to a state file
//! ([`crate::state_file`]), restored from one, or forgotten. They run on the scheduler's
//! thread between steps, on an idle slot. A restored slot holds the saved tokens as if
//! it had evaluated them: any request whose prompt starts with them reuses them
//! (whatever slot it names), and their full blocks enter the prefix cache.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use super::kv::RestoreError;
use super::worker::*;
use super::*;
use crate::state_file::{self, StateError, StateHeader};

/// What a slot operation does.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotAction {
    /// Write the slot's state to this file.
    Save(PathBuf),
    /// Replace the slot's state with this file's.
    Restore(PathBuf),
    /// Forget the slot's tokens (its blocks go back to the pool).
    Erase,
    /// Describe every slot (the slot number is ignored).
    List,
}

/// One slot, as `GET /slots` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotInfo {
    pub id: usize,
    /// The positions a request may use.
    pub n_ctx: usize,
    /// Whether a request runs in it.
    pub is_processing: bool,
    /// Tokens its cache holds (a finished request's stay until reused or reclaimed).
    pub n_tokens: usize,
}

/// What a slot operation did.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotReply {
    /// Tokens saved, bytes written, milliseconds.
    Saved {
        n_tokens: usize,
        n_bytes: usize,
        ms: f64,
    },
    /// Tokens restored, bytes read, milliseconds.
    Restored {
        n_tokens: usize,
        n_bytes: usize,
        ms: f64,
    },
    /// Tokens forgotten.
    Erased {
        n_tokens: usize,
    },
    List(Vec<SlotInfo>),
}

/// Why a slot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("there is no slot {id} (slots 0 to {last})")]
    NoSuchSlot { id: usize, last: usize },
    #[error("slot {0} is processing a request")]
    Busy(usize),
    /// The state could not be written (a server-side failure).
    #[error("{path}: {error}")]
    Io { path: String, error: String },
    /// The file to restore is missing, not a regular file or too large.
    #[error("{path}: {error}")]
    File { path: String, error: String },
    #[error("{path}: {error}")]
    State { path: String, error: StateError },
    #[error("{0}")]
    Pool(String),
    #[error("the scheduler has stopped")]
    Stopped,
}

/// A slot operation on its way to the scheduler's thread, with where its answer goes.
pub(super) struct SlotOp {
    pub(super) slot: usize,
    pub(super) action: SlotAction,
    pub(super) reply: mpsc::Sender<Result<SlotReply, SlotError>>,
}

impl Scheduler {
    /// Runs `action` on slot `slot` on the scheduler's thread (between steps) and waits
    /// for its answer (blocking: call it off an async runtime's threads).
    pub fn slot(&self, slot: usize, action: SlotAction) -> Result<SlotReply, SlotError> {
        let (reply, rx) = mpsc::channel();
        let sent = self.ctl.send(SlotOp {
            slot,
            action,
            reply,
        });
        if sent.is_err() {
            return Err(SlotError::Stopped);
        }
        // An idle worker waits for requests: it looks at its slot operations at least
        // every `IDLE_POLL`.
        rx.recv().unwrap_or(Err(SlotError::Stopped))
    }
}

/// Closes the slot operations ([`close`]) when dropped: held by the scheduler's thread,
/// so that a caller waiting for an answer gets [`SlotError::Stopped`] when the thread
/// ends, even by a panic, instead of waiting forever.
pub(super) struct CloseOnDrop(pub(super) std::sync::Arc<Shared>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        close(&self.0);
    }
}

/// No more slot operations are answered (the worker has ended, or is an encoder's, which
/// has no slots): operations waiting and later ones get [`SlotError::Stopped`].
pub(super) fn close(shared: &Shared) {
    shared
        .slot_ops
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
}

impl Worker<'_> {
    /// Runs the slot operations that have arrived.
    pub(super) fn slot_ops(&mut self) {
        let ops: Vec<SlotOp> = match self.shared.slot_ops.lock() {
            Ok(rx) => rx.as_ref().map_or(Vec::new(), |rx| rx.try_iter().collect()),
            Err(_) => Vec::new(),
        };
        for op in ops {
            let r = self.slot_op(op.slot, op.action);
            let _ = op.reply.send(r);
        }
    }

    fn slot_op(&mut self, id: usize, action: SlotAction) -> Result<SlotReply, SlotError> {
        if action == SlotAction::List {
            let list = (0..self.jobs.len())
                .map(|i| SlotInfo {
                    id: i,
                    n_ctx: self.config.n_ctx,
                    is_processing: self.jobs[i].is_some(),
                    n_tokens: self.kv.n_past(i),
                })
                .collect();
            return Ok(SlotReply::List(list));
        }
        if id >= self.jobs.len() {
            return Err(SlotError::NoSuchSlot {
                id,
                last: self.jobs.len() - 1,
            });
        }
        if self.jobs[id].is_some() {
            return Err(SlotError::Busy(id));
        }
        match action {
            SlotAction::Save(path) => self.save_slot(id, path),
            SlotAction::Restore(path) => self.restore_slot(id, path),
            SlotAction::Erase => {
                let n_tokens = self.kv.n_past(id);
                self.kv.cut(id, 0);
                self.kv.publish_blocks(self.busy());
                Ok(SlotReply::Erased { n_tokens })
            }
            SlotAction::List => unreachable!("answered above"),
        }
    }

    /// What a state saved here now would say: this model, KV type and the adapters
    /// `lora` ((index, scale bits), the slot's or the model's defaults).
    fn header_here(
        &mut self,
        lora: &[(usize, u32)],
        extent: frink_models::state_io::Extent,
    ) -> StateHeader {
        let model = self.model;
        let fingerprint = self
            .fingerprint
            .get_or_insert_with(|| state_file::model_fingerprint(model))
            .clone();
        StateHeader {
            model: fingerprint,
            arch: model.config.arch.name.to_string(),
            kv_type: self.config.kv_type.name().to_string(),
            lora: lora
                .iter()
                .map(|&(i, bits)| (adapter_name(model, i), f32::from_bits(bits)))
                .collect(),
            extent,
        }
    }

    fn save_slot(&mut self, id: usize, path: PathBuf) -> Result<SlotReply, SlotError> {
        let t = Instant::now();
        let s = self.kv.save_state(id);
        let extent = s.extent;
        let header = self.header_here(&s.lora, extent);
        let bytes = state_file::encode(&header, &s.tokens, &s.payload);
        crate::safe_fs::write_replacing(&path, &bytes).map_err(|e| SlotError::Io {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        Ok(SlotReply::Saved {
            n_tokens: extent.n,
            n_bytes: bytes.len(),
            ms: t.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn restore_slot(&mut self, id: usize, path: PathBuf) -> Result<SlotReply, SlotError> {
        let t = Instant::now();
        let shown = path.display().to_string();
        // Bounded before anything is read: the longest state this model's slots hold; a
        // regular file only (no link followed, no FIFO or device read).
        let max = self.kv.max_state_bytes(id);
        let bytes = crate::safe_fs::read_regular(&path, max).map_err(|e| SlotError::File {
            path: shown.clone(),
            error: e.to_string(),
        })?;
        let state = |error| SlotError::State {
            path: shown.clone(),
            error,
        };
        let (saved, tokens, payload) = state_file::decode(&bytes).map_err(state)?;
        // The model's adapters at their default scales: what a state must have been
        // saved with.
        let lora = worker_lora(self.model);
        let here = self.header_here(&lora, saved.extent);
        saved.check(&here).map_err(state)?;
        if saved.extent.n > self.config.n_ctx {
            return Err(state(StateError::TooLong {
                n: saved.extent.n,
                n_ctx: self.config.n_ctx,
            }));
        }
        let idle = self.idle();
        self.placements += 1;
        self.kv
            .restore_state(
                id,
                (saved.extent, tokens, payload),
                lora,
                &idle,
                self.placements,
            )
            .map_err(|e| match e {
                // The pool is full: the server's condition, not the file's.
                RestoreError::Pool(e) => SlotError::Pool(e),
                RestoreError::State(e) => state(StateError::Payload(e)),
            })?;
        self.kv.publish_blocks(self.busy());
        Ok(SlotReply::Restored {
            n_tokens: saved.extent.n,
            n_bytes: bytes.len(),
            ms: t.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// The model's adapters at their default scales, as a slot's adapter key
/// ([`lora_key`]).
fn worker_lora(model: &frink_models::Model) -> Vec<(usize, u32)> {
    let set: Vec<(usize, f32)> = model.lora_scales.iter().copied().enumerate().collect();
    lora_key(&set)
}

/// Adapter `i`'s file name (what a state file records).
fn adapter_name(model: &frink_models::Model, i: usize) -> String {
    model
        .adapters
        .get(i)
        .map(|a| {
            let p = std::path::Path::new(&a.path);
            p.file_name()
                .map_or_else(|| a.path.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| format!("adapter {i}"))
}
