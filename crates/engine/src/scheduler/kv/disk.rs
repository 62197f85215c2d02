//! The prefix cache's disk tier (`--cache-disk DIR --cache-disk-size BYTES`): a full
//! block that leaves the memory cache (its block handed to another sequence) is written
//! to `DIR/<model>/<key>.blk` under the same content key (its tokens, its parent's key,
//! the adapters: [`crate::kv_blocks::block_hash`]), and a prompt whose next blocks' keys
//! are on disk reads them back instead of evaluating them. The folder is named by the
//! model's fingerprint and the KV type ([`crate::state_file::model_fingerprint`]), so a
//! block is only ever read by the model and cache type that wrote it; files survive a
//! restart. The oldest files go first past the size limit. A block file carries a magic,
//! its key and a SHA-256 of the folder's name (the fingerprint and the KV types) and the
//! rest: a damaged or foreign file, one copied from another model's or KV type's folder
//! included, is a miss (and is deleted), never a wrong answer.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::KvManager;

const MAGIC: &[u8; 8] = b"FRINKBLK";

/// The files of one model's disk tier and their use order.
pub(crate) struct DiskTier {
    dir: PathBuf,
    /// The folder's name, hashed into every file's checksum.
    identity: String,
    max_bytes: u64,
    /// Key → (file bytes, use tick).
    index: HashMap<u64, (u64, u64)>,
    /// Use tick → key, oldest first.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
}

impl DiskTier {
    /// The tier in `root/identity` (made if missing), with the block files already there
    /// indexed (oldest by modification time first) and trimmed to `max_bytes`.
    pub(crate) fn open(root: &Path, identity: &str, max_bytes: u64) -> std::io::Result<DiskTier> {
        let dir = root.join(identity);
        std::fs::create_dir_all(&dir)?;
        let mut found: Vec<(std::time::SystemTime, u64, u64)> = Vec::new();
        for e in std::fs::read_dir(&dir)?.flatten() {
            let name = e.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".blk")) else {
                continue;
            };
            let (Ok(key), Ok(meta)) = (u64::from_str_radix(hex, 16), e.metadata()) else {
                continue;
            };
            let t = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            found.push((t, key, meta.len()));
        }
        found.sort();
        let mut tier = DiskTier {
            dir,
            identity: identity.to_string(),
            max_bytes,
            index: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            bytes: 0,
        };
        for (_, key, len) in found {
            tier.note(key, len);
        }
        tier.trim();
        Ok(tier)
    }

    fn path(&self, key: u64) -> PathBuf {
        self.dir.join(format!("{key:016x}.blk"))
    }

    /// Records `key`'s file of `len` bytes as the most recently used.
    fn note(&mut self, key: u64, len: u64) {
        if let Some((old, t)) = self.index.remove(&key) {
            self.lru.remove(&t);
            self.bytes -= old;
        }
        self.tick += 1;
        self.index.insert(key, (len, self.tick));
        self.lru.insert(self.tick, key);
        self.bytes += len;
    }

    pub(crate) fn forget(&mut self, key: u64) {
        if let Some((len, t)) = self.index.remove(&key) {
            self.lru.remove(&t);
            self.bytes -= len;
        }
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Deletes the oldest files while the tier holds more than its limit.
    fn trim(&mut self) {
        while self.bytes > self.max_bytes {
            let Some((_, &key)) = self.lru.iter().next() else {
                break;
            };
            self.forget(key);
        }
    }

    /// Whether a block of `key` is on disk.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.index.contains_key(&key)
    }

    /// The SHA-256 of this tier's identity, then `body` (magic, key, payload).
    fn checksum(&self, body: &[u8]) -> [u8; 32] {
        Sha256::new()
            .chain_update(self.identity.as_bytes())
            .chain_update(body)
            .finalize()
            .into()
    }

    /// Bytes of its files.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Writes the block of `key` (a failure to write is logged and the block forgotten:
    /// it is evaluated again when needed).
    pub(crate) fn write(&mut self, key: u64, payload: &[u8]) {
        if self.contains(key) {
            self.note(key, self.index[&key].0);
            return;
        }
        let mut bytes = Vec::with_capacity(payload.len() + 48);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&key.to_le_bytes());
        bytes.extend_from_slice(payload);
        let sum = self.checksum(&bytes);
        bytes.extend_from_slice(&sum);
        let path = self.path(key);
        match crate::safe_fs::write_replacing(&path, &bytes) {
            Ok(()) => {
                self.note(key, bytes.len() as u64);
                self.trim();
            }
            Err(e) => tracing::warn!("cache disk: cannot write {}: {e}", path.display()),
        }
    }

    /// The payload of `key`'s block (`len` bytes), or `None` (the file is gone, damaged
    /// or of another length: it is deleted).
    pub(crate) fn read(&mut self, key: u64, len: usize) -> Option<Vec<u8>> {
        // A regular file of exactly the block's size (no link followed, nothing larger
        // read).
        let bytes = crate::safe_fs::read_regular(&self.path(key), len + 48).ok();
        let ok = bytes.as_ref().is_some_and(|b| {
            b.len() == len + 48
                && &b[..8] == MAGIC
                && b[8..16] == key.to_le_bytes()
                && self.checksum(&b[..len + 16]).as_slice() == &b[len + 16..]
        });
        if !ok {
            self.forget(key);
            return None;
        }
        self.note(key, (len + 48) as u64);
        bytes.map(|b| b[16..16 + len].to_vec())
    }
}

impl KvManager {
    /// Bytes of one block of the main group in every layer that keeps its rows there.
    fn block_payload_len(&self) -> usize {
        let n = frink_models::KV_BLOCK;
        (0..self.pool.layers.len())
            .filter(|&il| !self.pool.in_window_group(il))
            .filter_map(|il| self.pool.layers[il].as_ref())
            .map(|l| {
                let row = self.pool.kv_type.row_bytes(l.k_dim, l.v_dim);
                row.unwrap_or(0) * n
            })
            .sum()
    }

    /// Writes the cached blocks just evicted from memory to the disk tier (before their
    /// new holder writes into them).
    pub(super) fn spill(&mut self) {
        let evicted = self.blocks.take_evicted();
        if evicted.is_empty() || self.disk.is_none() {
            return;
        }
        for (b, key) in evicted {
            let mut out = Vec::with_capacity(self.block_payload_len());
            for (il, l) in self.pool.layers.iter().enumerate() {
                if let Some(l) = l.as_ref().filter(|_| !self.pool.in_window_group(il)) {
                    l.save_rows(Some(&[b]), 0, frink_models::KV_BLOCK, &mut out);
                }
            }
            if let Some(d) = self.disk.as_mut() {
                d.write(key, &out);
            }
        }
        self.publish_disk();
    }

    /// How many of `keys` (consecutive block keys, after a memory hit) the disk tier
    /// holds or memory still caches, from the first, when the disk tier holds any of
    /// them (memory alone is the caller's hit).
    pub(super) fn disk_hits(&self, keys: &[u64]) -> usize {
        let Some(d) = &self.disk else {
            return 0;
        };
        let n = keys
            .iter()
            .take_while(|&&k| d.contains(k) || self.blocks.lookup(k).is_some())
            .count();
        match keys[..n].iter().any(|&k| d.contains(k)) {
            true => n,
            false => 0,
        }
    }

    /// Appends the blocks of `keys` to `table`: each one memory still caches (held), else
    /// read from disk into a new block entered in the memory cache under its key (counted
    /// in `frink_cache_disk_hits_total`); stops at the first that is neither, cannot be
    /// read or cannot be placed.
    pub(super) fn load_disk_blocks(&mut self, keys: &[u64], table: &mut Vec<u32>) {
        let len = self.block_payload_len();
        let mut loaded = 0;
        for &key in keys {
            if let Some(b) = self.blocks.lookup(key) {
                self.blocks.retain(b);
                table.push(b);
                continue;
            }
            let Some(payload) = self.disk.as_mut().and_then(|d| d.read(key, len)) else {
                break;
            };
            let pool = &self.pool;
            let rows = |il| match pool.in_window_group(il) {
                true => 0,
                false => frink_models::KV_BLOCK,
            };
            if !frink_models::state_io::finite(pool, rows, &payload) {
                if let Some(d) = self.disk.as_mut() {
                    d.forget(key);
                }
                break;
            }
            let Some(b) = self.alloc_block(false) else {
                break;
            };
            let mut at = 0;
            for il in 0..self.pool.layers.len() {
                if self.pool.layers[il].is_some() && !self.pool.in_window_group(il) {
                    at += self.pool.layer_mut(il).load_rows(
                        Some(&[b]),
                        0,
                        frink_models::KV_BLOCK,
                        &payload[at..],
                    );
                }
            }
            self.blocks.register(b, key);
            table.push(b);
            loaded += 1;
        }
        self.shared
            .cache_disk_hits
            .fetch_add(loaded as u64, std::sync::atomic::Ordering::Relaxed);
        self.publish_disk();
    }

    /// Publishes the tier's size (`frink_cache_disk_bytes`).
    pub(super) fn publish_disk(&self) {
        if let Some(d) = &self.disk {
            self.shared
                .cache_disk_bytes
                .store(d.bytes(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}
