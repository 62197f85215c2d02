//! [`Session`]: one sequence over a loaded model, with its state (KV cache, recurrent state).

use frink_models::{KvType, Logits, Model, ModelError, SeqState};

/// Default prefill chunk: prompt rows evaluated per forward call (llama.cpp's default
/// `n_ubatch` is 512).
pub const DEFAULT_BATCH: usize = 512;

/// One sequence: the model, a KV cache sized for `n_ctx` positions, and the prefill chunk.
pub struct Session<'m> {
    model: &'m Model,
    cache: SeqState,
    n_batch: usize,
}

impl<'m> Session<'m> {
    /// A session with an empty cache of `n_ctx` positions of `kv_type`.
    pub fn new(model: &'m Model, n_ctx: usize, kv_type: KvType) -> Session<'m> {
        Session {
            model,
            cache: SeqState::new(&model.config, n_ctx, kv_type),
            n_batch: DEFAULT_BATCH,
        }
    }

    /// Sets the prefill chunk size (rows per forward call; at least 1).
    pub fn with_batch(mut self, n_batch: usize) -> Self {
        self.n_batch = n_batch.max(1);
        self
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.cache.n_past()
    }

    /// Size of the cache in positions.
    pub fn n_ctx(&self) -> usize {
        self.cache.n_ctx
    }

    /// The KV cache (read-only, for tests and statistics).
    pub fn cache(&self) -> &SeqState {
        &self.cache
    }

    /// Forgets the state after position `n`, as far as it can
    /// ([`SeqState::truncate`]: a recurrent state is kept whole or cleared); returns the
    /// positions kept, from which the caller evaluates again.
    pub fn truncate(&mut self, n: usize) -> usize {
        self.cache.truncate(n)
    }

    /// Evaluates `tokens` after what the cache holds, in chunks of at most `n_batch` rows,
    /// and returns the requested logits (`Last`: `n_vocab` values of the final token;
    /// `All`: one row per token; `From(i)`: rows of tokens `i..`; `Hidden`: every token's
    /// hidden state, `n_embd` values each).
    ///
    /// Errors: [`ModelError::ContextFull`] before anything is written when the tokens do
    /// not fit; [`ModelError::TokenOutOfRange`].
    pub fn eval(&mut self, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        // Checked for the whole call before the first chunk writes to the cache.
        self.model.check_input(&self.cache, tokens)?;
        let mut out = Vec::new();
        for (ci, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let want = logits.piece(ci * self.n_batch, chunk.len(), tokens.len());
            let rows = self.model.forward(&mut self.cache, chunk, want)?;
            // The first rows are kept as they are: a decode step's logits (0.6-1 MB for
            // a 150k-260k vocabulary) are not copied once more.
            if out.is_empty() {
                out = rows;
            } else {
                out.extend_from_slice(&rows);
            }
        }
        Ok(out)
    }
}

/// `n_ctx` positions, or `n_seq × n_ctx` of several sequences.
fn positions(n_seq: usize, n_ctx: usize) -> String {
    if n_seq == 1 {
        format!("{n_ctx} positions")
    } else {
        format!("{n_seq} × {n_ctx} positions")
    }
}

/// The bytes of `field` (`MemTotal`, `MemAvailable`, …) of Linux's /proc/meminfo, which
/// gives kibibytes; `None` where it cannot be read.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a context whose KV caches cannot fit: `n_seq` sequences of `n_ctx` positions of
/// `model` with elements of `kv_type`, before anything is allocated (without it a huge
/// `--ctx` aborts the process in the allocator). The bound is the machine's memory
/// (`MemTotal` of /proc/meminfo; where that cannot be read, only the arithmetic is checked).
///
/// Errors: a message naming the sizes and `what` (the flag that set them).
pub fn check_kv_memory(
    config: &frink_models::ModelConfig,
    n_ctx: usize,
    n_seq: usize,
    kv_type: KvType,
    what: &str,
) -> Result<(), String> {
    let need = SeqState::kv_bytes(config, n_ctx, kv_type).and_then(|b| b.checked_mul(n_seq));
    let total = meminfo_bytes("MemTotal").and_then(|b| usize::try_from(b).ok());
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    match (need, total) {
        (None, _) => Err(format!(
            "{what}: a KV cache of {} is larger than any machine's memory",
            positions(n_seq, n_ctx)
        )),
        (Some(need), Some(total)) if need > total => Err(format!(
            "{what}: a KV cache of {} needs {:.1} GiB, more than this machine's {:.1} GiB",
            positions(n_seq, n_ctx),
            gib(need),
            gib(total)
        )),
        _ => Ok(()),
    }
}
