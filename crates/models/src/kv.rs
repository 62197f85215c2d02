//! The KV cache's storage: per attention layer, the keys and values of every position of
//! one sequence (held in a [`crate::SeqState`]).

use half::f16;

pub use crate::kv_type::{CacheType, KvType, CACHE_BLOCK};

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
    /// bfloat16 bits.
    BF16(Vec<u16>),
    /// ggml blocks of a quantized [`CacheType`], `ty.unit_bytes()` bytes per 32 elements.
    Quant(CacheType, Vec<u8>),
}

impl KvStore {
    pub(crate) fn new(ty: CacheType, len: usize) -> KvStore {
        match ty {
            CacheType::F16 => KvStore::F16(vec![f16::ZERO; len]),
            CacheType::F32 => KvStore::F32(vec![0.0; len]),
            CacheType::BF16 => KvStore::BF16(vec![0; len]),
            q => KvStore::Quant(q, vec![0; len / CACHE_BLOCK * q.unit_bytes()]),
        }
    }

    /// Its element type.
    pub fn cache_type(&self) -> CacheType {
        match self {
            KvStore::F16(_) => CacheType::F16,
            KvStore::F32(_) => CacheType::F32,
            KvStore::BF16(_) => CacheType::BF16,
            KvStore::Quant(t, _) => *t,
        }
    }

    /// The byte range of elements `at .. at + n` in its bytes (whole blocks for a
    /// quantized type: `at` and `n` multiples of 32).
    fn byte_range(&self, at: usize, n: usize) -> std::ops::Range<usize> {
        let t = self.cache_type();
        if t.is_quantized() {
            assert!(
                at.is_multiple_of(CACHE_BLOCK) && n.is_multiple_of(CACHE_BLOCK),
                "a {t} cache is read and written in whole blocks"
            );
            let b = t.unit_bytes();
            at / CACHE_BLOCK * b..(at + n) / CACHE_BLOCK * b
        } else {
            let b = t.unit_bytes();
            at * b..(at + n) * b
        }
    }

    /// Copies `src`'s first `len` elements (same element type, checked by the caller; for
    /// a quantized type `len` is whole blocks: whole rows are copied).
    pub(crate) fn copy_from(&mut self, src: &KvStore, len: usize) {
        match (self, src) {
            (KvStore::F16(d), KvStore::F16(s)) => d[..len].copy_from_slice(&s[..len]),
            (KvStore::F32(d), KvStore::F32(s)) => d[..len].copy_from_slice(&s[..len]),
            (KvStore::BF16(d), KvStore::BF16(s)) => d[..len].copy_from_slice(&s[..len]),
            (KvStore::Quant(t, d), KvStore::Quant(u, s)) if t == u => {
                let n = len / CACHE_BLOCK * t.unit_bytes();
                d[..n].copy_from_slice(&s[..n]);
            }
            _ => panic!("copy_prefix: caches of different element types"),
        }
    }

    /// Stores `src` at element offset `at` (rounded to f16 or bf16 for a half cache;
    /// quantized for a block one, where `at` and `src.len()` are whole blocks: whole rows
    /// are written).
    pub fn write(&mut self, at: usize, src: &[f32]) {
        let range = self.byte_range(at, src.len());
        match self {
            KvStore::F16(v) => {
                // F16C where available; round to nearest even either way.
                use half::slice::HalfFloatSliceExt;
                v[at..at + src.len()].convert_from_f32_slice(src);
            }
            KvStore::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            KvStore::BF16(v) => {
                for (d, &x) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = frink_quant::quantize::bf16_bits(x);
                }
            }
            KvStore::Quant(t, v) => {
                frink_quant::quantize::quantize_for_cache(t.ggml(), src, &mut v[range])
                    .expect("whole blocks (the head sizes were checked)")
            }
        }
    }

    /// Reads `out.len()` elements from element offset `at` as f32 (for a quantized cache,
    /// `at` and the length are whole blocks): what [`KvStore::write`] stored, dequantized.
    pub fn read(&self, at: usize, out: &mut [f32]) {
        let range = self.byte_range(at, out.len());
        match self {
            KvStore::F16(v) => {
                use half::slice::HalfFloatSliceExt;
                v[at..at + out.len()].convert_to_f32_slice(out);
            }
            KvStore::F32(v) => out.copy_from_slice(&v[at..at + out.len()]),
            KvStore::BF16(v) => {
                let n = out.len();
                for (o, &b) in out.iter_mut().zip(&v[at..at + n]) {
                    *o = f32::from_bits(u32::from(b) << 16);
                }
            }
            KvStore::Quant(t, v) => frink_quant::dequantize(t.ggml(), &v[range], out)
                .expect("whole blocks (the head sizes were checked)"),
        }
    }

    /// Appends the stored bytes of `n` elements from element offset `at` (a quantized
    /// type: whole blocks) to `out`, little-endian: what [`KvStore::set_raw`] takes back.
    pub fn raw(&self, at: usize, n: usize, out: &mut Vec<u8>) {
        match self {
            KvStore::F16(v) => {
                out.extend(v[at..at + n].iter().flat_map(|x| x.to_bits().to_le_bytes()))
            }
            KvStore::F32(v) => out.extend(v[at..at + n].iter().flat_map(|x| x.to_le_bytes())),
            KvStore::BF16(v) => out.extend(v[at..at + n].iter().flat_map(|x| x.to_le_bytes())),
            KvStore::Quant(_, v) => out.extend_from_slice(&v[self.byte_range(at, n)]),
        }
    }

    /// Stores `n` elements at element offset `at` from `src` as [`KvStore::raw`] wrote
    /// them; returns the bytes taken.
    ///
    /// Panics if `src` is shorter than `n` elements' bytes.
    pub fn set_raw(&mut self, at: usize, n: usize, src: &[u8]) -> usize {
        let range = self.byte_range(at, n);
        let len = range.len();
        match self {
            KvStore::F16(v) => {
                for (d, s) in v[at..at + n].iter_mut().zip(src[..len].chunks_exact(2)) {
                    *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]]));
                }
            }
            KvStore::F32(v) => {
                for (d, s) in v[at..at + n].iter_mut().zip(src[..len].chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            }
            KvStore::BF16(v) => {
                for (d, s) in v[at..at + n].iter_mut().zip(src[..len].chunks_exact(2)) {
                    *d = u16::from_le_bytes([s[0], s[1]]);
                }
            }
            KvStore::Quant(_, v) => v[range].copy_from_slice(&src[..len]),
        }
        len
    }

    /// Copies elements `src .. src + n` to `dst ..` (no overlap; for a quantized type
    /// whole blocks).
    fn copy_within(&mut self, src: usize, dst: usize, n: usize) {
        let from = self.byte_range(src, n);
        let to = self.byte_range(dst, n).start;
        match self {
            KvStore::F16(v) => v.copy_within(src..src + n, dst),
            KvStore::F32(v) => v.copy_within(src..src + n, dst),
            KvStore::BF16(v) => v.copy_within(src..src + n, dst),
            KvStore::Quant(_, v) => v.copy_within(from, to),
        }
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        match self {
            KvStore::F16(v) => v.len() * 2,
            KvStore::F32(v) => v.len() * 4,
            KvStore::BF16(v) => v.len() * 2,
            KvStore::Quant(_, v) => v.len(),
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
            KvStore::BF16(v) => KvData::BF16(v),
            KvStore::Quant(t, v) => KvData::Quant(*t, v),
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
    /// elements of `kv_type` (keys of `kv_type.k`, values of `kv_type.v`) in `heads` KV
    /// heads, zeroed.
    pub fn new(
        kv_type: KvType,
        rows: usize,
        (k_dim, v_dim): (usize, usize),
        heads: usize,
    ) -> KvLayer {
        let rows = Self::rows_for(rows);
        KvLayer {
            k: KvStore::new(kv_type.k, rows * k_dim),
            v: KvStore::new(kv_type.v, rows * v_dim),
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
}
