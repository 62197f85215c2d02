//! The KV cache's storage: per attention layer, the keys and values of every position of
//! one sequence (held in a [`crate::SeqState`]).

use half::f16;

/// Element type of the KV cache (`--kv-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half precision, llama.cpp's default (`type_k = type_v = GGML_TYPE_F16`).
    #[default]
    F16,
    /// Single precision (what the tiny fixtures' references used).
    F32,
}

impl KvType {
    /// Bytes of one element.
    pub fn element_bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }
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
    pub(crate) fn new(kv_type: KvType, len: usize) -> KvStore {
        match kv_type {
            KvType::F16 => KvStore::F16(vec![f16::ZERO; len]),
            KvType::F32 => KvStore::F32(vec![0.0; len]),
        }
    }

    /// Copies `src`'s first `len` elements (same element type, checked by the caller).
    pub(crate) fn copy_from(&mut self, src: &KvStore, len: usize) {
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
