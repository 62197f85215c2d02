//! A bounded cache of routed-expert weights, for mixture-of-experts models whose experts
//! do not fit in memory (`--expert-budget`).
//!
//! Without a budget, experts are read from the file mapping like every other weight and
//! the OS keeps whatever it likes resident. With one, each routed expert's matrix is copied
//! out of the mapping into this cache when a token first selects it, the mapped pages it
//! came from are released ([`frink_gguf::GgufFile::release`]), and the least recently used
//! matrices are dropped so that the cache never holds more than the budget. While one
//! chosen expert computes, the next chosen expert of the step is read in on another thread
//! (prefetch). The bytes are the file's bytes, so results are bit-identical with and
//! without a budget. The matrices of the expert computing (and of the one prefetched) stay
//! alive while in use even if evicted meanwhile: the budget bounds what the cache keeps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use frink_gguf::GgufFile;

use crate::kernels::Matrix;

/// Hits, misses and residency of an [`ExpertCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Expert matrices found in the cache.
    pub hits: u64,
    /// Expert matrices read from the file.
    pub misses: u64,
    /// Bytes held now.
    pub resident_bytes: usize,
    /// The most bytes ever held at once (never above the budget).
    pub peak_bytes: usize,
    /// The budget.
    pub budget: usize,
}

/// An expert matrix's key: (tensor index, byte offset in the tensor).
type Key = (usize, usize);

#[derive(Default)]
struct Inner {
    /// Key → (bytes, last use).
    map: HashMap<Key, (Arc<[u8]>, u64)>,
    tick: u64,
    stats: CacheStats,
}

/// An LRU cache of expert matrices holding at most `budget` bytes.
pub struct ExpertCache {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ExpertCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl ExpertCache {
    /// An empty cache of `budget` bytes.
    pub fn new(budget: usize) -> ExpertCache {
        ExpertCache {
            inner: Mutex::new(Inner {
                stats: CacheStats {
                    budget,
                    ..CacheStats::default()
                },
                ..Inner::default()
            }),
        }
    }

    /// The bytes of expert matrix `m` of `file`: from the cache, or copied from the file
    /// (then the mapped pages are released and least recently used matrices are evicted
    /// until the new one fits). A matrix larger than the whole budget is refused by
    /// [`crate::Model::set_expert_budget`] before any call.
    pub fn get(&self, file: &GgufFile, m: &Matrix) -> Arc<[u8]> {
        let key = (m.tensor, m.offset);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.tick += 1;
        let tick = g.tick;
        if let Some((bytes, last)) = g.map.get_mut(&key) {
            *last = tick;
            let bytes = Arc::clone(bytes);
            g.stats.hits += 1;
            return bytes;
        }
        g.stats.misses += 1;
        let len = m.rows * m.row_bytes;
        let t = file.tensor_at(m.tensor);
        let bytes: Arc<[u8]> = Arc::from(&t.data[m.offset..m.offset + len]);
        let start = file.data_offset() as usize + t.info.offset as usize + m.offset;
        // Releasing is advice; a failure only leaves the pages resident.
        let _ = file.release(start..start + len);
        while g.stats.resident_bytes + len > g.stats.budget && !g.map.is_empty() {
            let oldest = g
                .map
                .iter()
                .min_by_key(|(_, (_, last))| *last)
                .map(|(k, _)| *k)
                .expect("non-empty");
            if let Some((old, _)) = g.map.remove(&oldest) {
                g.stats.resident_bytes -= old.len();
            }
        }
        g.stats.resident_bytes += len;
        g.stats.peak_bytes = g.stats.peak_bytes.max(g.stats.resident_bytes);
        g.map.insert(key, (Arc::clone(&bytes), tick));
        bytes
    }

    /// Current counters.
    pub fn stats(&self) -> CacheStats {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).stats
    }
}
