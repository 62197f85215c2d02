//! Where attention's kernels read cached keys and values: the stored elements
//! ([`KvData`]: f32, f16, bf16 or ggml blocks), the rows of one head through a block table
//! ([`KvRows`]), and reading eight elements at once as f32 (`load8`) with exactly the
//! bits of the scalar element ([`KvRows::get`]): an f16 or bf16 element widens exactly,
//! and a block element's `d · q` (an 11-bit scale times an integer of at most 8 bits) is
//! exact in f32; Q4_1 and Q5_1 add their minimum after, as ggml does.

use half::f16;

use crate::kv::{CacheType, CACHE_BLOCK};
use frink_quant::grids::KVALUES_IQ4NL;

/// The stored elements of a KV cache (or any row-major matrix).
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    /// Single precision (`--kv-type f32`).
    F32(&'a [f32]),
    /// Half precision (llama.cpp's default cache type), widened exactly when read.
    F16(&'a [f16]),
    /// bfloat16 bits, widened exactly when read (`bits << 16`).
    BF16(&'a [u16]),
    /// ggml blocks of a quantized cache type (32 elements per block, layouts in
    /// frink-quant's `legacy` and `iquants` modules); element `i` is lane `i % 32` of block
    /// `i / 32`, dequantized exactly as ggml's `dequantize_row_*` does. The kernels'
    /// vector paths need rows and heads that start on a block (start and stride
    /// multiples of 32).
    Quant(CacheType, &'a [u8]),
}

/// The storage kinds, as the vector kernels' const parameter ([`with_kind`]).
pub(super) const F32: u8 = 0;
pub(super) const F16: u8 = 1;
pub(super) const BF16: u8 = 2;
pub(super) const Q8_0: u8 = 3;
pub(super) const Q4_0: u8 = 4;
pub(super) const Q4_1: u8 = 5;
pub(super) const Q5_0: u8 = 6;
pub(super) const Q5_1: u8 = 7;
pub(super) const IQ4_NL: u8 = 8;

/// The kind of `data`.
pub(super) fn kind_of(data: &KvData<'_>) -> u8 {
    match data {
        KvData::F32(_) => F32,
        KvData::F16(_) => F16,
        KvData::BF16(_) => BF16,
        KvData::Quant(t, _) => match t {
            CacheType::Q8_0 => Q8_0,
            CacheType::Q4_0 => Q4_0,
            CacheType::Q4_1 => Q4_1,
            CacheType::Q5_0 => Q5_0,
            CacheType::Q5_1 => Q5_1,
            CacheType::IQ4_NL => IQ4_NL,
            // A float type never comes in blocks ([`crate::kv::KvStore::head_rows`]).
            CacheType::F32 | CacheType::F16 | CacheType::BF16 => {
                unreachable!("{t} stored as blocks")
            }
        },
    }
}

/// Bytes of one 32-element block of kind `K` (0 for the float kinds), ggml-common.h's
/// `block_*` sizes (checked against frink-gguf's type table by a test).
pub(super) const fn block_bytes(k: u8) -> usize {
    match k {
        Q8_0 => 34,
        Q4_0 | IQ4_NL => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 0,
    }
}

/// Bytes of one element of a float kind `K`.
const fn elem_bytes(k: u8) -> usize {
    match k {
        F32 => 4,
        _ => 2,
    }
}

/// Runs `$body` with the const `$k` set to the kind of `$data`: one monomorphised kernel
/// per storage kind.
macro_rules! with_kind {
    ($data:expr, $k:ident => $body:expr) => {{
        use $crate::kernels::kv_rows as kinds;
        match kinds::kind_of(&$data) {
            kinds::F32 => {
                const $k: u8 = kinds::F32;
                $body
            }
            kinds::F16 => {
                const $k: u8 = kinds::F16;
                $body
            }
            kinds::BF16 => {
                const $k: u8 = kinds::BF16;
                $body
            }
            kinds::Q8_0 => {
                const $k: u8 = kinds::Q8_0;
                $body
            }
            kinds::Q4_0 => {
                const $k: u8 = kinds::Q4_0;
                $body
            }
            kinds::Q4_1 => {
                const $k: u8 = kinds::Q4_1;
                $body
            }
            kinds::Q5_0 => {
                const $k: u8 = kinds::Q5_0;
                $body
            }
            kinds::Q5_1 => {
                const $k: u8 = kinds::Q5_1;
                $body
            }
            _ => {
                const $k: u8 = kinds::IQ4_NL;
                $body
            }
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(super) use with_kind;

/// Rows of one head in a KV cache (or any row-major matrix): row `t` is the elements
/// from [`KvRows::row_start`]`(t)` on (as many as the kernel's head size). Its physical row
/// is `r = phys(first + t)`: the position itself in a contiguous cache, or through a
/// block table in a block pool (`crate::kv::KvPool`: position `p` is physical row
/// `blocks[p / 16] · 16 + p % 16`). Physical rows are grouped in layout blocks of
/// `2^shift` rows; row `r` starts at `start + (r - r % 2^shift) · stride + (r % 2^shift) ·
/// row`. A plain matrix has `shift = 0` (row `r` at `start + r · stride`); a KV cache
/// layer keeps each head's rows of a 16-position block together
/// (`crate::kv::KvStore::head_rows`).
#[derive(Clone, Copy, Debug)]
pub struct KvRows<'a> {
    /// The stored elements.
    pub data: KvData<'a>,
    /// Element index of physical row 0's first element.
    pub start: usize,
    /// Elements per row from one layout block to the next (a block of `2^shift` rows
    /// spans `2^shift · stride` elements).
    pub stride: usize,
    /// Elements from one row to the next inside a layout block (unused when `shift` is 0).
    pub row: usize,
    /// `log2` of the rows per layout block: 0, or `crate::kv::KV_BLOCK_SHIFT`.
    pub shift: u32,
    /// The block table of a pooled cache, if any.
    pub blocks: Option<&'a [u32]>,
    /// The position of row 0: row `t` is position `first + t`.
    pub first: usize,
    /// Whether the kernels prefetch rows [`PREFETCH_KEYS`] ahead ([`KvRows::prefetched`]).
    pub prefetch: bool,
}

impl<'a> KvRows<'a> {
    /// Row-major rows of `data`: row `t` is the elements from `start + t · stride` on.
    pub fn new(data: KvData<'a>, start: usize, stride: usize) -> KvRows<'a> {
        KvRows {
            data,
            start,
            stride,
            row: stride,
            shift: 0,
            blocks: None,
            first: 0,
            prefetch: false,
        }
    }

    /// Consecutive rows of `width` values of an f32 slice.
    pub fn contiguous(v: &'a [f32], width: usize) -> KvRows<'a> {
        KvRows::new(KvData::F32(v), 0, width)
    }

    /// These rows grouped in layout blocks of `2^shift` rows (`shift` at most
    /// `crate::kv::KV_BLOCK_SHIFT`, so a pool block holds whole layout blocks), `row`
    /// elements apart inside a block (see [`KvRows`]).
    pub fn in_blocks(self, shift: u32, row: usize) -> KvRows<'a> {
        assert!(
            shift <= crate::kv::KV_BLOCK_SHIFT,
            "layout blocks of 2^{shift} rows"
        );
        KvRows { shift, row, ..self }
    }

    /// These rows, which the kernels prefetch [`PREFETCH_KEYS`] rows ahead: for rows read
    /// from memory (a decode step's keys and values), where the prefetch instructions
    /// pay; rows read again while still in cache (a prefill's later query heads) only pay
    /// for them (measured: smollm2-135m pp512 4-5% slower with prefetching throughout).
    pub fn prefetched(self) -> KvRows<'a> {
        KvRows {
            prefetch: true,
            ..self
        }
    }

    /// These rows from position `first` on (row `t` is position `first + t`), through the
    /// block table `blocks` of a pooled cache or, without one, at the position itself.
    pub fn starting_at(self, blocks: Option<&'a [u32]>, first: usize) -> KvRows<'a> {
        KvRows {
            blocks,
            first,
            ..self
        }
    }

    /// Prefetches the first [`PREFETCH_KEYS`] rows of `range` (`width` elements each):
    /// the rows that the kernels' own prefetching, that many rows ahead of the row they
    /// read, never reaches. A decode task reads a KV head's rows once, from memory.
    pub fn prefetch_first(&self, range: std::ops::Range<usize>, width: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let base = raw(self);
            for t in range.start..range.end.min(range.start + PREFETCH_KEYS) {
                let i = self.row_start(t);
                with_kind!(self.data, K => prefetch_elems::<K>(base, i, width))
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (range, width);
    }

    /// The physical row of row `t`.
    #[inline(always)]
    fn phys(&self, t: usize) -> usize {
        match self.blocks {
            None => self.first + t,
            Some(b) => crate::kv::pool_row(b, self.first + t),
        }
    }

    /// Element index of physical row `r`'s first element.
    #[inline(always)]
    fn phys_start(&self, r: usize) -> usize {
        let within = r & ((1 << self.shift) - 1);
        self.start + (r - within) * self.stride + within * self.row
    }

    /// Element index of row `t`'s first element.
    #[inline(always)]
    pub fn row_start(&self, t: usize) -> usize {
        self.phys_start(self.phys(t))
    }

    /// Rows `range` in runs whose rows lie a fixed step apart: `(rows, element index of
    /// the run's first row, step)`, the same starts as [`KvRows::row_start`] gives. A run
    /// ends with its layout block or, through a block table, its pool block; a plain
    /// matrix is one run. The kernels walk a run by adding the step instead of working
    /// out every row's place.
    #[inline(always)]
    pub(super) fn runs(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, usize, usize)> + '_ {
        let (seg, step) = match (self.shift, self.blocks) {
            (0, None) => (usize::MAX, self.stride),
            (0, Some(_)) => (crate::kv::KV_BLOCK, self.stride),
            (s, _) => (1 << s, self.row),
        };
        let mut t = range.start;
        std::iter::from_fn(move || {
            if t >= range.end {
                return None;
            }
            let left = range.end - t;
            let len = match seg {
                usize::MAX => left,
                seg => (seg - (self.first + t) % seg).min(left),
            };
            let run = (t..t + len, self.row_start(t), step);
            t += len;
            Some(run)
        })
    }

    pub(super) fn len(&self) -> usize {
        match self.data {
            KvData::F32(s) => s.len(),
            KvData::F16(s) => s.len(),
            KvData::BF16(s) => s.len(),
            KvData::Quant(t, s) => s.len() / t.unit_bytes() * CACHE_BLOCK,
        }
    }

    /// Panics unless rows `range` of `width` elements lie inside the data (through the
    /// block table: every block the range touches, up to its last row). A row's start
    /// grows with its physical row (a layout block's rows come before the next block's),
    /// so the last physical row bounds them all.
    pub(super) fn check(&self, range: &std::ops::Range<usize>, width: usize, what: &str) {
        use crate::kv::KV_BLOCK;
        if range.is_empty() {
            return;
        }
        let last = range.end - 1;
        let top = match self.blocks {
            None => self.first + last,
            Some(b) => {
                let (p0, p1) = (self.first + range.start, self.first + last);
                let (b0, b1) = (p0 / KV_BLOCK, p1 / KV_BLOCK);
                assert!(b1 < b.len(), "{what}: rows {range:?} pass the block table");
                let top = b[b0..=b1].iter().max().copied().unwrap_or(0) as usize;
                top * KV_BLOCK + KV_BLOCK - 1
            }
        };
        let end = self.phys_start(top) + width;
        assert!(end <= self.len(), "{what}: rows {range:?} pass the data");
    }

    /// Element `e` of row `t`, as f32.
    #[inline(always)]
    pub(super) fn get(&self, t: usize, e: usize) -> f32 {
        let i = self.row_start(t) + e;
        match self.data {
            KvData::F32(s) => s[i],
            KvData::F16(s) => s[i].to_f32(),
            KvData::BF16(s) => f32::from_bits(u32::from(s[i]) << 16),
            KvData::Quant(t, s) => {
                let n = t.unit_bytes();
                block_elem(t, &s[i / CACHE_BLOCK * n..][..n], i % CACHE_BLOCK)
            }
        }
    }
}

/// Element `j` of the 32-element ggml block `b` of type `t`, dequantized as ggml-quants.c's
/// `dequantize_row_*` does (the same operations in the same order: `(q - 8) · d`,
/// `q · d + m`, `d · level`).
#[inline(always)]
fn block_elem(t: CacheType, b: &[u8], j: usize) -> f32 {
    let h = |at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    let nibble = |qs: usize| match j < 16 {
        true => b[qs + j] & 0x0F,
        false => b[qs + j - 16] >> 4,
    };
    let fifth = |qh: usize| {
        let bits = u32::from_le_bytes([b[qh], b[qh + 1], b[qh + 2], b[qh + 3]]);
        ((bits >> j & 1) as u8) << 4
    };
    match t {
        CacheType::Q8_0 => h(0) * (b[2 + j] as i8) as f32,
        CacheType::Q4_0 => (i32::from(nibble(2)) - 8) as f32 * h(0),
        CacheType::Q4_1 => f32::from(nibble(4)) * h(0) + h(2),
        CacheType::Q5_0 => (i32::from(nibble(6) | fifth(2)) - 16) as f32 * h(0),
        CacheType::Q5_1 => f32::from(nibble(8) | fifth(4)) * h(0) + h(2),
        CacheType::IQ4_NL => h(0) * f32::from(KVALUES_IQ4NL[usize::from(nibble(2))]),
        CacheType::F32 | CacheType::F16 | CacheType::BF16 => unreachable!("{t} stored as blocks"),
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx2_f16c() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// Elements `i .. i + 8` of the data at `base` (of kind `K`) as f32, with the bits of
/// [`KvRows::get`]; for a block kind `i` is a multiple of 8, so the eight lie in one block.
///
/// # Safety
/// Those eight elements readable at `base` (for a block kind: their block's bytes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn load8<const K: u8>(base: *const u8, i: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: eight elements readable (caller); a block's fields (at most 8 bytes of
    // quants from `qs + j % 16`, 16 bytes of `qs`) lie inside its bytes.
    unsafe {
        let b = base.add(i / 32 * block_bytes(K));
        let j = i % 32;
        let half =
            |at: usize| f16::from_bits(u16::from_le_bytes([*b.add(at), *b.add(at + 1)])).to_f32();
        // The 4-bit quants of elements j .. j + 8 (low nibbles of `qs[j..]` for j < 16,
        // high nibbles of `qs[j - 16..]` above), one per 32-bit lane.
        let nibbles = |qs: usize| {
            let bytes = _mm_loadl_epi64(b.add(qs + j % 16).cast());
            let bytes = if j < 16 {
                bytes
            } else {
                _mm_srli_epi16(bytes, 4)
            };
            _mm_and_si128(bytes, _mm_set1_epi8(0x0F))
        };
        // Their fifth bits (bit `j + l` of the `u32` at `qh`), as 16 or 0.
        let fifth = |qh: usize| {
            let bits = (b.add(qh).cast::<u32>().read_unaligned() >> j) & 0xFF;
            let l = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let one = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(bits as i32), l),
                _mm256_set1_epi32(1),
            );
            _mm256_slli_epi32(one, 4)
        };
        let scaled = |q: __m256i, d: f32| _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(d));
        let shifted = |q: __m256i, d: f32, m: f32| _mm256_add_ps(scaled(q, d), _mm256_set1_ps(m));
        match K {
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(base.add(i * 2).cast())),
            BF16 => {
                let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(base.add(i * 2).cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
            }
            Q8_0 => {
                let q = _mm_loadl_epi64(b.add(2 + j).cast());
                _mm256_mul_ps(
                    _mm256_set1_ps(half(0)),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                )
            }
            Q4_0 => {
                let q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(nibbles(2)), _mm256_set1_epi32(8));
                scaled(q, half(0))
            }
            Q4_1 => shifted(_mm256_cvtepu8_epi32(nibbles(4)), half(0), half(2)),
            Q5_0 => {
                let q = _mm256_or_si256(_mm256_cvtepu8_epi32(nibbles(6)), fifth(2));
                scaled(_mm256_sub_epi32(q, _mm256_set1_epi32(16)), half(0))
            }
            Q5_1 => {
                let q = _mm256_or_si256(_mm256_cvtepu8_epi32(nibbles(8)), fifth(4));
                shifted(q, half(0), half(2))
            }
            IQ4_NL => {
                let levels = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
                let q = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(levels, nibbles(2)));
                _mm256_mul_ps(_mm256_set1_ps(half(0)), _mm256_cvtepi32_ps(q))
            }
            _ => _mm256_loadu_ps(base.add(i * 4).cast()),
        }
    }
}

/// Key rows ahead that the kernels prefetch. A KV cache keeps one head's rows together
/// only for a block of 16 positions (`crate::kv::KvLayer`: 4 KiB in OLMoE's f16 cache);
/// the next block's rows are every other head's block further on, and the hardware
/// prefetchers, which follow streams within a page, fetch nothing across that jump.
/// Measured on OLMoE (16 heads of 128) at 4096 cached positions: tg64 18.4-19.6 t/s
/// without these prefetches, 26.5-29.3 with them (32 rows ahead: the same). In the
/// position-major layout before it (a head's rows a whole cache row apart), one core read
/// 5.4 GB/s of keys without prefetching and 10 with it.
pub(super) const PREFETCH_KEYS: usize = 16;

/// Prefetches the bytes of elements `i .. i + n` of the data at `base` (of kind `K`).
/// A prefetch never faults and reads nothing architecturally, so the range may be
/// anywhere.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_elems<const K: u8>(base: *const u8, i: usize, n: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let (from, to) = match block_bytes(K) {
        0 => (elem_bytes(K) * i, elem_bytes(K) * (i + n)),
        bb => (i / 32 * bb, (i + n).div_ceil(32) * bb),
    };
    for line in from / 64..to.div_ceil(64) {
        // SAFETY: a prefetch is a hint; the pointer is only computed (wrapping).
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(64 * line).cast())
        };
    }
}

/// The base pointer of `rows`' data.
#[cfg(target_arch = "x86_64")]
pub(super) fn raw(rows: &KvRows<'_>) -> *const u8 {
    match rows.data {
        KvData::F32(s) => s.as_ptr().cast(),
        KvData::F16(s) => s.as_ptr().cast(),
        KvData::BF16(s) => s.as_ptr().cast(),
        KvData::Quant(_, s) => s.as_ptr(),
    }
}

/// Whether the vector kernels can read `rows` (blocks: every row on a block start).
#[cfg(target_arch = "x86_64")]
pub(super) fn vector_ok(rows: &KvRows<'_>) -> bool {
    let on_block = |n: usize| n.is_multiple_of(CACHE_BLOCK);
    !matches!(rows.data, KvData::Quant(..))
        || (on_block(rows.start)
            && on_block(rows.stride)
            && (rows.shift == 0 || on_block(rows.row)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block sizes the kernels step by are ggml's, as frink-gguf's type table records
    /// them, and every cache type's kind reads back its type.
    #[test]
    fn block_sizes_are_ggmls() {
        for t in CacheType::ALL.into_iter().filter(|t| t.is_quantized()) {
            let k = kind_of(&KvData::Quant(t, &[]));
            assert_eq!(block_bytes(k), t.ggml().type_size(), "{t}");
            assert_eq!(t.ggml().block_size(), CACHE_BLOCK);
        }
    }

    /// A block element read in place is frink-quant's dequantized value, bit for bit
    /// (which the attention kernels' vector loads then match: their own test), for every
    /// quantized cache type, on values with outliers and on an all-zero block.
    #[test]
    fn block_elements_are_the_dequantized_values() {
        let mut rnd = crate::kernels::test_rng(0x51ed_2701_9e37_79b9u64);
        let mut x: Vec<f32> = (0..32 * 40).map(|_| rnd() * 3.0).collect();
        x[100] = 90.0;
        x[32 * 7..32 * 8].fill(0.0);
        for t in CacheType::ALL.into_iter().filter(|t| t.is_quantized()) {
            let mut b = vec![0u8; t.bytes(x.len()).unwrap()];
            frink_quant::quantize::quantize_for_cache(t.ggml(), &x, &mut b).unwrap();
            let mut want = vec![0f32; x.len()];
            frink_quant::dequantize(t.ggml(), &b, &mut want).unwrap();
            let rows = KvRows::new(KvData::Quant(t, &b), 0, 64);
            for (i, w) in want.iter().enumerate() {
                let got = rows.get(i / 64, i % 64);
                assert_eq!(got.to_bits(), w.to_bits(), "{t} element {i}");
            }
        }
    }
}
