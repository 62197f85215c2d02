//! The bookkeeping of a KV block pool ([`frink_models::KvPool`]): which blocks are free,
//! how many sequences hold each, and the prefix cache (vLLM's automatic prefix caching).
//!
//! A full block is keyed by [`block_hash`] of its parent block's key, its 16 tokens and
//! the extra keys that change its contents (the adapter set of the tokens; a LoRA's ids
//! and scales); a new sequence whose prompt starts with the same blocks takes them
//! instead of evaluating their tokens again (reference-counted, never copied). A block no
//! sequence holds any more stays cached (least recently released first out) until the
//! pool needs it. A block is written only while exactly one sequence holds it and it is
//! not cached: a sequence about to write into a block it shares gets a copy first
//! ([`BlockManager::needs_copy`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// The key of a full block: its parent's key (0 for the first block), its tokens and the
/// extra keys (std's SipHash with fixed keys: the same key in every process).
pub fn block_hash(parent: u64, tokens: &[u32], extra: &[(usize, u32)]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    extra.hash(&mut h);
    h.finish()
}

/// The keys of the full blocks of `tokens` (block `i`: tokens `16i .. 16i + 16`).
pub fn block_hashes(tokens: &[u32], extra: &[(usize, u32)]) -> Vec<u64> {
    let mut parent = 0;
    tokens
        .chunks_exact(frink_models::KV_BLOCK)
        .map(|b| {
            parent = block_hash(parent, b, extra);
            parent
        })
        .collect()
}

/// Counts of a pool's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks some sequence holds.
    pub used: usize,
    /// Blocks no sequence holds that keep a cached prefix.
    pub cached: usize,
}

/// Free blocks, reference counts and the prefix cache of a pool of `n` blocks.
#[derive(Debug)]
pub struct BlockManager {
    refs: Vec<u32>,
    /// The cache key of each block that has one.
    key: Vec<Option<u64>>,
    /// Cache key → the block holding it.
    cached: HashMap<u64, u32>,
    /// Free blocks without a key.
    free: Vec<u32>,
    /// Free blocks with a key, by release order (tick → block).
    lru: BTreeMap<u64, u32>,
    /// Each free keyed block's tick in `lru`.
    tick_of: Vec<u64>,
    tick: u64,
    /// Whether evicted cached blocks are recorded in `evicted` (a disk tier keeps them).
    spill: bool,
    /// Cached blocks handed out by [`BlockManager::alloc`] since the last
    /// [`BlockManager::take_evicted`]: (block, the key it held).
    evicted: Vec<(u32, u64)>,
}

impl BlockManager {
    /// A pool of `n` free blocks, nothing cached.
    pub fn new(n: usize) -> BlockManager {
        BlockManager {
            refs: vec![0; n],
            key: vec![None; n],
            cached: HashMap::new(),
            // Popped from the end: block 0 first.
            free: (0..n as u32).rev().collect(),
            lru: BTreeMap::new(),
            tick_of: vec![0; n],
            tick: 0,
            spill: false,
            evicted: Vec::new(),
        }
    }

    /// The same, recording the cached blocks [`BlockManager::alloc`] evicts, for their
    /// owner to save before it writes them ([`BlockManager::take_evicted`]).
    pub fn spilling(mut self) -> BlockManager {
        self.spill = true;
        self
    }

    /// The evicted blocks recorded since the last call, with the keys they held: their
    /// contents are still the key's until the caller writes into them.
    pub fn take_evicted(&mut self) -> Vec<(u32, u64)> {
        std::mem::take(&mut self.evicted)
    }

    /// Blocks that [`BlockManager::alloc`] can still hand out (free ones, then cached
    /// ones nobody holds).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks free of any key and holder.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// The counts.
    pub fn stats(&self) -> BlockStats {
        BlockStats {
            total: self.refs.len(),
            used: self.refs.iter().filter(|&&r| r > 0).count(),
            cached: self.lru.len(),
        }
    }

    /// A block for one sequence to write (held once, no key): a free one, else the least
    /// recently released cached one (its key forgotten); `None` when every block is held.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (&t, &b) = self.lru.iter().next()?;
                self.lru.remove(&t);
                if let Some(k) = self.key[b as usize].take() {
                    self.cached.remove(&k);
                    if self.spill {
                        self.evicted.push((b, k));
                    }
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// The cached block of key `key`, if any (taking nothing).
    pub fn lookup(&self, key: u64) -> Option<u32> {
        self.cached.get(&key).copied()
    }

    /// One more holder of block `b` (a cached block leaves the free list).
    pub fn retain(&mut self, b: u32) {
        let i = b as usize;
        if self.refs[i] == 0 {
            self.lru.remove(&self.tick_of[i]);
        }
        self.refs[i] += 1;
    }

    /// One holder fewer of block `b`; a block nobody holds becomes free (cached if it has
    /// a key).
    ///
    /// # Panics
    /// If nobody holds `b`.
    pub fn release(&mut self, b: u32) {
        let i = b as usize;
        assert!(self.refs[i] > 0, "release of free block {b}");
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            if self.key[i].is_some() {
                self.tick += 1;
                self.tick_of[i] = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Records that block `b` (full, held) holds the tokens of key `key`. A key another
    /// block already holds keeps that block (`b` stays uncached); a block keeps its first
    /// key.
    pub fn register(&mut self, b: u32, key: u64) {
        let i = b as usize;
        if self.key[i].is_some() || self.cached.contains_key(&key) {
            return;
        }
        self.key[i] = Some(key);
        self.cached.insert(key, b);
    }

    /// Whether a sequence holding block `b` must copy it before writing into it: others
    /// hold it too, or it is cached (its contents are a key's).
    pub fn needs_copy(&self, b: u32) -> bool {
        self.refs[b as usize] > 1 || self.key[b as usize].is_some()
    }

    /// Holders of block `b`.
    pub fn refs(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_counted_cached_and_evicted_least_recent_first() {
        let mut m = BlockManager::new(3);
        let (a, b, c) = (m.alloc().unwrap(), m.alloc().unwrap(), m.alloc().unwrap());
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(m.alloc(), None);
        m.register(a, 10);
        m.register(b, 11);
        assert!(m.needs_copy(a) && !m.needs_copy(c));
        // A second holder of c: shared, so copied before a write.
        m.retain(c);
        assert!(m.needs_copy(c));
        m.release(c);
        m.release(c);
        m.release(b);
        m.release(a);
        assert_eq!(
            m.stats(),
            BlockStats {
                total: 3,
                used: 0,
                cached: 2
            }
        );
        assert_eq!(m.lookup(10), Some(a));
        // c (uncached) goes first, then b (released before a).
        assert_eq!(m.alloc(), Some(c));
        assert_eq!(m.alloc(), Some(b));
        assert_eq!(m.lookup(11), None, "an evicted block forgets its key");
        assert_eq!(m.lookup(10), Some(a));
        // A hit takes the cached block back from the free list.
        m.retain(a);
        assert_eq!(m.available(), 0);
        // A key held elsewhere is not registered twice.
        m.register(c, 10);
        assert_eq!(m.lookup(10), Some(a));
        assert!(!m.needs_copy(c));
    }

    #[test]
    fn block_keys_chain_and_depend_on_every_input() {
        let t: Vec<u32> = (0..40).collect();
        let h = block_hashes(&t, &[]);
        assert_eq!(h.len(), 2);
        assert_eq!(h, block_hashes(&t[..32], &[]));
        let mut u = t.clone();
        u[3] = 99;
        let hu = block_hashes(&u, &[]);
        assert!(
            hu[0] != h[0] && hu[1] != h[1],
            "a changed token changes every later key"
        );
        assert!(
            block_hashes(&t, &[(0, 1.0f32.to_bits())])[0] != h[0],
            "extra keys"
        );
    }
}
