//! The KV cache: per layer, the keys and values of every position of one sequence.

use half::f16;

use crate::config::ModelConfig;

/// Element type of the KV cache (`--kv-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half precision, llama.cpp's default (`type_k = type_v = GGML_TYPE_F16`).
    #[default]
    F16,
    /// Single precision (what the tiny fixtures' references used).
    F32,
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            _ => Err(format!("unknown KV cache type {s:?} (expected f16 or f32)")),
        }
    }
}

/// Storage of one layer's keys or values: `n_ctx` rows of `dim` elements.
#[derive(Clone, Debug, PartialEq)]
pub enum KvStore {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl KvStore {
    fn new(kv_type: KvType, len: usize) -> KvStore {
        match kv_type {
            KvType::F16 => KvStore::F16(vec![f16::ZERO; len]),
            KvType::F32 => KvStore::F32(vec![0.0; len]),
        }
    }

    /// Copies `src`'s first `len` elements (same element type, checked by the caller).
    fn copy_from(&mut self, src: &KvStore, len: usize) {
        match (self, src) {
            (KvStore::F16(d), KvStore::F16(s)) => d[..len].copy_from_slice(&s[..len]),
            (KvStore::F32(d), KvStore::F32(s)) => d[..len].copy_from_slice(&s[..len]),
            _ => panic!("copy_prefix: caches of different element types"),
        }
    }

    /// Stores `src` at element offset `at` (rounded to f16 for an f16 cache).
    pub fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvStore::F16(v) => {
                // F16C where available; round to nearest even either way.
                use half::slice::HalfFloatSliceExt;
                v[at..at + src.len()].convert_from_f32_slice(src);
            }
            KvStore::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }

    /// Rows of one head in place: row `t` starts at element `start + t · stride`.
    pub fn rows(&self, start: usize, stride: usize) -> crate::kernels::KvRows<'_> {
        use crate::kernels::{KvData, KvRows};
        let data = match self {
            KvStore::F16(v) => KvData::F16(v),
            KvStore::F32(v) => KvData::F32(v),
        };
        KvRows {
            data,
            start,
            stride,
        }
    }
}

/// Keys and values of one layer; row `p` holds position `p` (`k_dim`/`v_dim` wide).
#[derive(Clone, Debug, PartialEq)]
pub struct KvLayer {
    pub k: KvStore,
    pub v: KvStore,
}

/// The KV cache of one sequence, sized for `n_ctx` positions.
///
/// Memory: `n_layer · n_ctx · (k_dim + v_dim)` elements of 2 (f16) or 4 (f32) bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    pub kv_type: KvType,
    pub n_ctx: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub layers: Vec<KvLayer>,
    /// Positions `0..n_past` hold valid entries.
    pub n_past: usize,
}

impl KvCache {
    /// An empty cache for `n_ctx` positions of the model described by `config`.
    pub fn new(config: &ModelConfig, n_ctx: usize, kv_type: KvType) -> KvCache {
        let (k_dim, v_dim) = (config.k_dim(), config.v_dim());
        KvCache {
            kv_type,
            n_ctx,
            k_dim,
            v_dim,
            layers: (0..config.n_layer)
                .map(|_| KvLayer {
                    k: KvStore::new(kv_type, n_ctx * k_dim),
                    v: KvStore::new(kv_type, n_ctx * v_dim),
                })
                .collect(),
            n_past: 0,
        }
    }

    /// Makes this cache hold `src`'s first `n` positions (and nothing after them): their
    /// keys and values copied, `n_past = n`. Equal to evaluating the same `n` tokens here,
    /// bit for bit: a position's keys and values depend only on the tokens up to it
    /// ([`crate::Model::forward_batch`]).
    ///
    /// Panics if the caches differ in shape or element type, or `n` passes `src.n_past`
    /// or this cache's `n_ctx`.
    pub fn copy_prefix(&mut self, src: &KvCache, n: usize) {
        assert!(
            self.kv_type == src.kv_type
                && (self.k_dim, self.v_dim, self.layers.len())
                    == (src.k_dim, src.v_dim, src.layers.len()),
            "copy_prefix: caches of different shapes"
        );
        assert!(
            n <= src.n_past && n <= self.n_ctx,
            "copy_prefix: {n} positions"
        );
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            d.k.copy_from(&s.k, n * self.k_dim);
            d.v.copy_from(&s.v, n * self.v_dim);
        }
        self.n_past = n;
    }

    /// Forgets everything after position `n` (keeps `0..n`).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        let el = match self.kv_type {
            KvType::F16 => 2,
            KvType::F32 => 4,
        };
        self.layers.len() * self.n_ctx * (self.k_dim + self.v_dim) * el
    }
}
