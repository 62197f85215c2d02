//! The KV cache's storage: per attention layer, the keys and values of every position of
//! one sequence (held in a [`crate::SeqState`]).

use half::f16;

/// Element type of the KV cache (`--kv-type`, llama.cpp's `-ctk`/`-ctv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half precision, llama.cpp's default (`type_k = type_v = GGML_TYPE_F16`).
    #[default]
    F16,
    /// Single precision (what the tiny fixtures' references used).
    F32,
    /// ggml's Q8_0 blocks (32 values: an f16 scale and 32 int8, 34 bytes; llama.cpp
    /// `-ctk q8_0 -ctv q8_0`), written by [`frink_quant::dot::quantize_row_q8_0`]
    /// (bit-exact with ggml's `quantize_row_q8_0_ref`) and read in place by the attention
    /// kernels (`d · q`, exact in f32).
    Q8_0,
}

/// Values per Q8_0 block, and its bytes (ggml-common.h `block_q8_0`: `ggml_half d` then
/// `int8_t qs[32]`; the same as frink-gguf's `GgmlType::Q8_0` row, checked by a test):
/// constants, for the attention kernels' inner loops.
pub const Q8_0_BLOCK: usize = 32;
pub const Q8_0_BLOCK_BYTES: usize = 34;

impl KvType {
    /// Bytes `n` elements take (`n` a multiple of 32 for Q8_0).
    pub fn bytes(self, n: usize) -> Option<usize> {
        match self {
            KvType::F16 => n.checked_mul(2),
            KvType::F32 => n.checked_mul(4),
            KvType::Q8_0 => (n / Q8_0_BLOCK).checked_mul(Q8_0_BLOCK_BYTES),
        }
    }

    /// Its name as `--kv-type` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Whether elements are stored quantized (Q8_0), not as floats.
    pub fn is_quantized(self) -> bool {
        self == KvType::Q8_0
    }

    /// The Walsh–Hadamard block that rotates queries and keys of head size `hd_k` before
    /// a quantized cache stores the keys, as llama.cpp does since PR #21038
    /// (src/llama-kv-cache.cpp `attn_rot_k`, `build_input_k_rot`): for a quantized type
    /// and `hd_k` a multiple of 64, the largest power of two from 64 up that divides it;
    /// else none. The rotation spreads a head's outlier channels over its blocks (Qwen2's
    /// key biases: the Q8_0 cache's perplexity cost on qwen2.5-coder-0.5b falls from 7.8%
    /// to 3.6%) and leaves every score unchanged in exact arithmetic.
    pub fn key_rotation(self, hd_k: usize) -> Option<usize> {
        if !self.is_quantized() || hd_k == 0 || !hd_k.is_multiple_of(64) {
            return None;
        }
        Some(1 << hd_k.trailing_zeros())
    }

    /// The block that rotates values of head size `hd_v` before a quantized cache stores
    /// them, and rotates the attention output back: 64 where `hd_v` is a multiple of 64
    /// (llama.cpp `attn_rot_v`, `build_input_v_rot`: the smallest block measured best).
    pub fn value_rotation(self, hd_v: usize) -> Option<usize> {
        (self.is_quantized() && hd_v > 0 && hd_v.is_multiple_of(64)).then_some(64)
    }

    /// Whether a cache of this type can hold the keys and values of every attention
    /// layer of `config` (Q8_0: every head a whole number of 32-value blocks, as llama.cpp
    /// requires of a quantized cache; layers may differ in head sizes: Gemma 4).
    ///
    /// Errors: a message naming the sizes.
    pub fn check_heads(self, config: &crate::ModelConfig) -> Result<(), String> {
        for a in config
            .plan
            .layers
            .iter()
            .filter_map(|l| l.mixer.attention())
        {
            let (hd_k, hd_v) = (a.geometry.head_dim_k, a.geometry.head_dim_v);
            if self.is_quantized()
                && (!hd_k.is_multiple_of(Q8_0_BLOCK) || !hd_v.is_multiple_of(Q8_0_BLOCK))
            {
                return Err(format!(
                    "--kv-type q8_0 needs head sizes that are multiples of 32 (this model's are {hd_k} and {hd_v})"
                ));
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [KvType::F16, KvType::F32, KvType::Q8_0]
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown KV cache type {s:?} (expected f16, f32 or q8_0)"))
    }
}

/// Positions per block of a [`KvPool`] (vLLM's default block size): a sequence's
/// positions `16i .. 16i + 16` live in the pool block its block table names at `i`. Also
/// the layout block of every KV cache layer ([`KvLayer`]).
pub const KV_BLOCK: usize = 1 << KV_BLOCK_SHIFT;

/// `log2` of [`KV_BLOCK`].
pub const KV_BLOCK_SHIFT: u32 = 4;

/// The row of a [`KvPool`] layer that holds position `p` of a sequence whose block table
/// is `blocks`: row `p % 16` of block `blocks[p / 16]`.
///
/// # Panics
/// If `blocks` has no block for `p`.
#[inline(always)]
pub(crate) fn pool_row(blocks: &[u32], p: usize) -> usize {
    blocks[p / KV_BLOCK] as usize * KV_BLOCK + p % KV_BLOCK
}

/// Storage of one layer's keys or values: `n_ctx` rows of `dim` elements.
#[derive(Clone, Debug, PartialEq)]
pub enum KvStore {
    F16(Vec<f16>),
    F32(Vec<f32>),
    /// Q8_0 blocks, 34 bytes per 32 elements.
    Q8_0(Vec<u8>),
}

impl KvStore {
    pub(crate) fn new(kv_type: KvType, len: usize) -> KvStore {
        match kv_type {
            KvType::F16 => KvStore::F16(vec![f16::ZERO; len]),
            KvType::F32 => KvStore::F32(vec![0.0; len]),
            KvType::Q8_0 => KvStore::Q8_0(vec![0; len / Q8_0_BLOCK * Q8_0_BLOCK_BYTES]),
        }
    }

    /// Copies `src`'s first `len` elements (same element type, checked by the caller; for
    /// Q8_0 `len` is whole blocks: whole rows are copied).
    pub(crate) fn copy_from(&mut self, src: &KvStore, len: usize) {
        match (self, src) {
            (KvStore::F16(d), KvStore::F16(s)) => d[..len].copy_from_slice(&s[..len]),
            (KvStore::F32(d), KvStore::F32(s)) => d[..len].copy_from_slice(&s[..len]),
            (KvStore::Q8_0(d), KvStore::Q8_0(s)) => {
                let n = len / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                d[..n].copy_from_slice(&s[..n]);
            }
            _ => panic!("copy_prefix: caches of different element types"),
        }
    }

    /// Stores `src` at element offset `at` (rounded to f16 for an f16 cache; quantized for
    /// a Q8_0 one, where `at` and `src.len()` are whole blocks: whole rows are written).
    pub fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvStore::F16(v) => {
                // F16C where available; round to nearest even either way.
                use half::slice::HalfFloatSliceExt;
                v[at..at + src.len()].convert_from_f32_slice(src);
            }
            KvStore::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            KvStore::Q8_0(v) => {
                assert!(
                    at.is_multiple_of(Q8_0_BLOCK),
                    "a Q8_0 cache is written in whole blocks"
                );
                let b0 = at / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                let nb = src.len() / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                frink_quant::dot::quantize_row_q8_0(src, &mut v[b0..b0 + nb])
                    .expect("whole Q8_0 blocks (the head sizes were checked)");
            }
        }
    }

    /// Reads `out.len()` elements from element offset `at` as f32 (for a Q8_0 cache, `at`
    /// and the length are whole blocks): what [`KvStore::write`] stored, dequantized.
    pub fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            KvStore::F16(v) => {
                use half::slice::HalfFloatSliceExt;
                v[at..at + out.len()].convert_to_f32_slice(out);
            }
            KvStore::F32(v) => out.copy_from_slice(&v[at..at + out.len()]),
            KvStore::Q8_0(v) => {
                assert!(
                    at.is_multiple_of(Q8_0_BLOCK),
                    "a Q8_0 cache is read in whole blocks"
                );
                let b0 = at / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                let nb = out.len() / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                frink_quant::dequantize(frink_gguf::GgmlType::Q8_0, &v[b0..b0 + nb], out)
                    .expect("whole Q8_0 blocks (the head sizes were checked)");
            }
        }
    }

    /// Appends the stored bytes of `n` elements from element offset `at` (Q8_0: whole
    /// blocks) to `out`, little-endian: what [`KvStore::set_raw`] takes back.
    pub fn raw(&self, at: usize, n: usize, out: &mut Vec<u8>) {
        match self {
            KvStore::F16(v) => {
                out.extend(v[at..at + n].iter().flat_map(|x| x.to_bits().to_le_bytes()))
            }
            KvStore::F32(v) => out.extend(v[at..at + n].iter().flat_map(|x| x.to_le_bytes())),
            KvStore::Q8_0(v) => {
                let b = |i: usize| i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                out.extend_from_slice(&v[b(at)..b(at + n)]);
            }
        }
    }

    /// Stores `n` elements at element offset `at` from `src` as [`KvStore::raw`] wrote
    /// them; returns the bytes taken.
    ///
    /// Panics if `src` is shorter than `n` elements' bytes.
    pub fn set_raw(&mut self, at: usize, n: usize, src: &[u8]) -> usize {
        match self {
            KvStore::F16(v) => {
                for (d, s) in v[at..at + n].iter_mut().zip(src[..2 * n].chunks_exact(2)) {
                    *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]]));
                }
                2 * n
            }
            KvStore::F32(v) => {
                for (d, s) in v[at..at + n].iter_mut().zip(src[..4 * n].chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
                4 * n
            }
            KvStore::Q8_0(v) => {
                let b = |i: usize| i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                let len = b(at + n) - b(at);
                v[b(at)..b(at + n)].copy_from_slice(&src[..len]);
                len
            }
        }
    }

    /// Copies elements `src .. src + n` to `dst ..` (no overlap; for Q8_0 whole blocks).
    fn copy_within(&mut self, src: usize, dst: usize, n: usize) {
        match self {
            KvStore::F16(v) => v.copy_within(src..src + n, dst),
            KvStore::F32(v) => v.copy_within(src..src + n, dst),
            KvStore::Q8_0(v) => {
                let b = |i: usize| i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
                v.copy_within(b(src)..b(src + n), b(dst))
            }
        }
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        match self {
            KvStore::F16(v) => v.len() * 2,
            KvStore::F32(v) => v.len() * 4,
            KvStore::Q8_0(v) => v.len(),
        }
    }

    /// The rows of KV head `h` (of `hd` elements; `dim` elements per position over all
    /// heads), in place, in the layout of a [`KvLayer`]: physical row `r` of head `h` starts
    /// at element `(r - r % 16) · dim + h · 16 · hd + (r % 16) · hd`.
    pub fn head_rows(&self, h: usize, hd: usize, dim: usize) -> crate::kernels::KvRows<'_> {
        use crate::kernels::{KvData, KvRows};
        let data = match self {
            KvStore::F16(v) => KvData::F16(v),
            KvStore::F32(v) => KvData::F32(v),
            KvStore::Q8_0(v) => KvData::Q8_0(v),
        };
        KvRows::new(data, h * KV_BLOCK * hd, dim).in_blocks(KV_BLOCK_SHIFT, hd)
    }
}

/// Keys and values of one layer, for a whole number of [`KV_BLOCK`]-position blocks.
/// Physical row `r` is position `r` (a contiguous cache) or a row of a [`KvPool`] block
/// (block `r / 16`); each block of 16 rows keeps each KV head's rows together, heads in
/// order ([`KvStore::head_rows`]): a head's keys at consecutive positions are one stream
/// in memory. Position-major rows put every other head of a position between two rows of
/// one head (4 KiB apart in OLMoE's f16 cache), where the hardware prefetchers fetch
/// nothing ahead: a decode step's attention over OLMoE's 16 heads x 4096 positions read
/// 10-16 GB/s on two cores, against 27-30 in this layout (with the prefetches of
/// `crate::kernels::attn`; a scratch harness of that shape).
#[derive(Clone, Debug, PartialEq)]
pub struct KvLayer {
    pub k: KvStore,
    pub v: KvStore,
    /// Elements per position: `n_head_kv · head_dim_k` keys, `n_head_kv · head_dim_v`
    /// values of this layer ([`crate::plan::Mixer::kv_dims`]; layers may differ: Gemma 4).
    pub k_dim: usize,
    pub v_dim: usize,
    /// KV heads (`n_head_kv`): a head's keys are `k_dim / heads` elements.
    pub heads: usize,
}

impl KvLayer {
    /// Rows a layer keeps for `n` positions: whole [`KV_BLOCK`]s.
    pub fn rows_for(n: usize) -> usize {
        n.div_ceil(KV_BLOCK) * KV_BLOCK
    }

    /// Rows for `rows` positions ([`KvLayer::rows_for`]) of `dims = (k_dim, v_dim)`
    /// elements of `kv_type` in `heads` KV heads, zeroed.
    pub fn new(
        kv_type: KvType,
        rows: usize,
        (k_dim, v_dim): (usize, usize),
        heads: usize,
    ) -> KvLayer {
        let rows = Self::rows_for(rows);
        KvLayer {
            k: KvStore::new(kv_type, rows * k_dim),
            v: KvStore::new(kv_type, rows * v_dim),
            k_dim,
            v_dim,
            heads: heads.max(1),
        }
    }

    /// KV head `h`'s keys, in place ([`KvStore::head_rows`]).
    pub fn key_rows(&self, h: usize) -> crate::kernels::KvRows<'_> {
        self.k.head_rows(h, self.k_dim / self.heads, self.k_dim)
    }

    /// KV head `h`'s values, in place ([`KvStore::head_rows`]).
    pub fn value_rows(&self, h: usize) -> crate::kernels::KvRows<'_> {
        self.v.head_rows(h, self.v_dim / self.heads, self.v_dim)
    }

    /// Writes the keys `k` and values `v` of consecutive logical positions `p0 ..` (rows
    /// of its `k_dim` / `v_dim`), each head's part at its place: through `blocks` (a block
    /// table of [`KV_BLOCK`]-position blocks) or, without one, at the position itself. A
    /// row gets the same bits wherever it is stored.
    ///
    /// # Panics
    /// If a position has no block in `blocks` or passes the storage.
    pub(crate) fn write_rows(&mut self, blocks: Option<&[u32]>, p0: usize, k: &[f32], v: &[f32]) {
        let n = k.len() / self.k_dim.max(1);
        let heads = self.heads;
        for (store, dim, src) in [(&mut self.k, self.k_dim, k), (&mut self.v, self.v_dim, v)] {
            let hd = dim / heads;
            for h in 0..heads {
                for i in 0..n {
                    let at = store
                        .head_rows(h, hd, dim)
                        .starting_at(blocks, p0)
                        .row_start(i);
                    store.write(at, &src[i * dim + h * hd..][..hd]);
                }
            }
        }
    }

    /// Reads the keys and values of `n` consecutive logical positions `p0 ..` (rows of
    /// `k_dim` / `v_dim`, as f32) through `blocks` or, without one, at the positions:
    /// the inverse of [`KvLayer::write_rows`] (exact for f32 and f16, the dequantized
    /// blocks for Q8_0).
    ///
    /// # Panics
    /// If a position has no block in `blocks` or passes the storage.
    pub fn read_rows(&self, blocks: Option<&[u32]>, p0: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let heads = self.heads;
        let mut out = [vec![0.0; n * self.k_dim], vec![0.0; n * self.v_dim]];
        for ((store, dim), dst) in [(&self.k, self.k_dim), (&self.v, self.v_dim)]
            .into_iter()
            .zip(out.iter_mut())
        {
            let hd = dim / heads;
            for h in 0..heads {
                let rows = store.head_rows(h, hd, dim).starting_at(blocks, p0);
                for i in 0..n {
                    store.read(rows.row_start(i), &mut dst[i * dim + h * hd..][..hd]);
                }
            }
        }
        let [k, v] = out;
        (k, v)
    }

    /// Appends the stored bytes of positions `p0 .. p0 + n` (keys then values, each head's
    /// rows in order) to `out` ([`KvStore::raw`]).
    pub fn save_rows(&self, blocks: Option<&[u32]>, p0: usize, n: usize, out: &mut Vec<u8>) {
        for (store, dim) in [(&self.k, self.k_dim), (&self.v, self.v_dim)] {
            let hd = dim / self.heads;
            for h in 0..self.heads {
                let rows = store.head_rows(h, hd, dim).starting_at(blocks, p0);
                for i in 0..n {
                    store.raw(rows.row_start(i), hd, out);
                }
            }
        }
    }

    /// Stores positions `p0 .. p0 + n` from bytes [`KvLayer::save_rows`] wrote; returns
    /// the bytes taken.
    ///
    /// Panics if `src` is short or a position has no block.
    pub fn load_rows(&mut self, blocks: Option<&[u32]>, p0: usize, n: usize, src: &[u8]) -> usize {
        let mut at = 0;
        let heads = self.heads;
        for (store, dim) in [(&mut self.k, self.k_dim), (&mut self.v, self.v_dim)] {
            let hd = dim / heads;
            for h in 0..heads {
                for i in 0..n {
                    let start = store
                        .head_rows(h, hd, dim)
                        .starting_at(blocks, p0)
                        .row_start(i);
                    at += store.set_raw(start, hd, &src[at..]);
                }
            }
        }
        at
    }

    /// Copies the first `n` physical rows of `src` (a layer of the same shape and type):
    /// whole blocks, so any rows after them up to the block's end come along.
    pub(crate) fn copy_prefix(&mut self, src: &KvLayer, n: usize) {
        let rows = Self::rows_for(n);
        self.k.copy_from(&src.k, rows * self.k_dim);
        self.v.copy_from(&src.v, rows * self.v_dim);
    }

    /// Copies rows `src .. src + n` to rows `dst .. dst + n`, both inside one block each.
    ///
    /// # Panics
    /// If a run leaves its block.
    pub(crate) fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        if n == 0 {
            return;
        }
        assert!(
            src % KV_BLOCK + n <= KV_BLOCK && dst % KV_BLOCK + n <= KV_BLOCK,
            "copy_rows: a run of {n} rows leaves its block"
        );
        let heads = self.heads;
        for (store, dim) in [(&mut self.k, self.k_dim), (&mut self.v, self.v_dim)] {
            let hd = dim / heads;
            for h in 0..heads {
                let rows = store.head_rows(h, hd, dim);
                let (from, to) = (rows.row_start(src), rows.row_start(dst));
                store.copy_within(from, to, n * hd);
            }
        }
    }
}

/// A block table entry whose block was given back: a windowed layer's positions that
/// every later query is too far from to see ([`KvPool`]'s window group).
pub const EVICTED: u32 = u32::MAX;

/// Rows per forward step that a sequence's windowed layers are sized for
/// ([`window_blocks`]): [`crate::SeqState::new`]'s ring and the scheduler's window group.
/// 256 rather than llama.cpp's 512 (its SWA cache is `n_swa · n_seq + n_ubatch`): with
/// 512, gemma3-270m's 15 windowed layers of 18 (window 512) would hold 1,040 positions
/// each and an 8k context 27% of the full-attention layout; with 256, 24.6%. A longer
/// step of one sequence is split ([`crate::Model::forward`]; the same bits, as every
/// row's are in any batch).
pub const WINDOW_STEP: usize = 256;

/// Blocks that a windowed layer of window `window` needs at most to evaluate up to `step`
/// new rows after any position: the rows `p + 1 - window .. p + step` that a step at `p`
/// writes and reads, `window - 1 + step` positions, span at most
/// `ceil((window - 1 + step) / 16) + 1` blocks.
pub fn window_blocks(window: usize, step: usize) -> usize {
    (window.saturating_sub(1) + step).div_ceil(KV_BLOCK) + 1
}

/// The keys and values of every attention layer for `n_blocks` blocks of [`KV_BLOCK`]
/// positions, shared by the sequences whose states hold block tables into it
/// ([`crate::SeqState::pooled`]; vLLM's PagedAttention block pool, llama.cpp's unified KV
/// cache). The forward pass of such sequences takes the pool
/// ([`crate::Model::forward_batch_in`]); which blocks a sequence owns is its caller's
/// bookkeeping.
///
/// With a window group ([`KvPool::with_window_group`]), the layers with a sliding window
/// keep their rows in `n_window_blocks` blocks of their own, named by each sequence's
/// second table ([`crate::SeqState::window_table`]), so the blocks that fall out of a
/// sequence's window can go back to the pool while its full-attention blocks stay
/// (vLLM's sliding-window KV cache manager, llama.cpp's `llama_kv_cache_iswa`).
#[derive(Clone, Debug, PartialEq)]
pub struct KvPool {
    pub kv_type: KvType,
    /// Blocks of the main group (every attention layer without a window group).
    pub n_blocks: usize,
    /// Blocks of the window group (0: none; windowed layers live in the main group).
    pub n_window_blocks: usize,
    /// Per layer of the plan: whether its rows live in the window group.
    windowed: Vec<bool>,
    /// Per layer of the plan: its keys and values (`None` for a layer without attention).
    pub layers: Vec<Option<KvLayer>>,
}

impl KvPool {
    /// A pool of `n_blocks` blocks for every attention layer of the model described by
    /// `config`.
    pub fn new(config: &crate::ModelConfig, n_blocks: usize, kv_type: KvType) -> KvPool {
        Self::with_window_group(config, n_blocks, 0, kv_type)
    }

    /// A pool of `n_blocks` blocks for the layers without a sliding window and
    /// `n_window_blocks` for those with one (0, or a model without windowed layers: one
    /// group of `n_blocks` for all).
    pub fn with_window_group(
        config: &crate::ModelConfig,
        n_blocks: usize,
        n_window_blocks: usize,
        kv_type: KvType,
    ) -> KvPool {
        let n_window_blocks = if config.plan.window() > 0 {
            n_window_blocks
        } else {
            0
        };
        let windowed: Vec<bool> = config
            .plan
            .layers
            .iter()
            .map(|l| n_window_blocks > 0 && l.mixer.window() > 0)
            .collect();
        KvPool {
            kv_type,
            n_blocks,
            n_window_blocks,
            layers: config
                .plan
                .layers
                .iter()
                .zip(&windowed)
                .map(|(l, &w)| {
                    let rows = KV_BLOCK * if w { n_window_blocks } else { n_blocks };
                    l.mixer
                        .kv_dims(config.n_head_kv)
                        .map(|dims| KvLayer::new(kv_type, rows, dims, config.n_head_kv))
                })
                .collect(),
            windowed,
        }
    }

    /// Whether layer `il`'s rows live in the window group (named by a sequence's window
    /// table, not its main one).
    pub fn in_window_group(&self, il: usize) -> bool {
        self.windowed[il]
    }

    /// Bytes one block takes over all layers (what [`KvPool::new`] allocates per block),
    /// or `None` when that does not fit a `usize`.
    pub fn block_bytes(config: &crate::ModelConfig, kv_type: KvType) -> Option<usize> {
        crate::SeqState::kv_bytes(config, KV_BLOCK, kv_type)
    }

    /// Bytes its keys and values take.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| l.k.bytes() + l.v.bytes())
            .sum()
    }

    /// Attention layer `il`'s keys and values. Panics if the layer has none.
    pub fn layer(&self, il: usize) -> &KvLayer {
        self.layers[il]
            .as_ref()
            .unwrap_or_else(|| panic!("layer {il} has no KV cache"))
    }

    /// [`KvPool::layer`], writable.
    pub fn layer_mut(&mut self, il: usize) -> &mut KvLayer {
        self.layers[il]
            .as_mut()
            .unwrap_or_else(|| panic!("layer {il} has no KV cache"))
    }

    /// Copies the first `n` positions of block `src` to block `dst` in every layer of the
    /// window group (`window_group`) or of the main group (the copy of a shared partial
    /// block a sequence is about to extend).
    pub fn copy_block(&mut self, window_group: bool, src: u32, dst: u32, n: usize) {
        let (s, d) = (src as usize * KV_BLOCK, dst as usize * KV_BLOCK);
        for (l, _) in self
            .layers
            .iter_mut()
            .zip(&self.windowed)
            .filter(|(_, &w)| w == window_group)
        {
            if let Some(l) = l {
                l.copy_rows(s, d, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout rule written out: element `e` of KV head `h` at physical row `r` of a
    /// layer of `heads` heads of `hd` elements.
    fn at(r: usize, h: usize, e: usize, hd: usize, heads: usize) -> usize {
        (r / 16) * 16 * heads * hd + h * 16 * hd + (r % 16) * hd + e
    }

    fn f32s(s: &KvStore) -> &[f32] {
        match s {
            KvStore::F32(v) => v,
            _ => unreachable!(),
        }
    }

    /// Rows land where the layout puts them (head-major inside each block of 16, written
    /// out above), through a block table or at their position; whole blocks are held;
    /// `copy_rows` and `copy_prefix` move every head's rows. A position-major store
    /// (head 1 of position 0 right after head 0) fails the first check.
    #[test]
    fn rows_are_head_major_in_blocks_of_16() {
        let (heads, hd_k, hd_v, n) = (3, 4, 2, 37);
        let k: Vec<f32> = (0..n * heads * hd_k).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..n * heads * hd_v).map(|i| -(i as f32)).collect();
        let table = [2u32, 0, 4, 1];
        for blocks in [None, Some(&table[..])] {
            let mut l = KvLayer::new(KvType::F32, 80, (heads * hd_k, heads * hd_v), heads);
            assert_eq!(l.k.bytes(), 80 * heads * hd_k * 4);
            l.write_rows(blocks, 3, &k[3 * heads * hd_k..], &v[3 * heads * hd_v..]);
            let phys = |p: usize| blocks.map_or(p, |b| pool_row(b, p));
            for p in 3..n {
                for h in 0..heads {
                    for e in 0..hd_k {
                        let want = k[p * heads * hd_k + h * hd_k + e];
                        assert_eq!(f32s(&l.k)[at(phys(p), h, e, hd_k, heads)], want);
                    }
                    for e in 0..hd_v {
                        let want = v[p * heads * hd_v + h * hd_v + e];
                        assert_eq!(f32s(&l.v)[at(phys(p), h, e, hd_v, heads)], want);
                    }
                }
            }
            // Rows 16..21 (block 1) copied to 69..74 (block 4); a prefix of 20 rows to a
            // fresh layer.
            let mut c = l.clone();
            c.copy_rows(16, 69, 5);
            let mut fresh = KvLayer::new(KvType::F32, 80, (heads * hd_k, heads * hd_v), heads);
            fresh.copy_prefix(&l, 20);
            for h in 0..heads {
                for e in 0..hd_k {
                    for i in 0..5 {
                        let (s, d) = (at(16 + i, h, e, hd_k, heads), at(69 + i, h, e, hd_k, heads));
                        assert_eq!(f32s(&c.k)[d], f32s(&l.k)[s]);
                    }
                    for r in 0..20 {
                        let i = at(r, h, e, hd_k, heads);
                        assert_eq!(f32s(&fresh.k)[i], f32s(&l.k)[i]);
                    }
                }
                for e in 0..hd_v {
                    let (s, d) = (at(20, h, e, hd_v, heads), at(73, h, e, hd_v, heads));
                    assert_eq!(f32s(&c.v)[d], f32s(&l.v)[s]);
                }
            }
        }
    }

    /// The Q8_0 block the KV cache and its kernels use is ggml's, as frink-gguf's type
    /// table records it.
    #[test]
    fn q8_0_block_is_ggmls() {
        let t = frink_gguf::GgmlType::Q8_0;
        assert_eq!(
            (super::Q8_0_BLOCK, super::Q8_0_BLOCK_BYTES),
            (t.block_size(), t.type_size())
        );
    }
}
