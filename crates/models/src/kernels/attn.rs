//! Attention's inner kernels over cached keys and values read in place (f16, f32 or Q8_0
//! blocks): scores of up to four query rows against a run of key rows, and weighted sums
//! of value rows for up to four query rows. Every element has the bits of the scalar rule
//! whatever the number of rows sharing a call and however the cache stores the rows: the
//! f16 → f32 widening is exact, and so is a Q8_0 element's `d · q` (an 11-bit scale times
//! an 8-bit integer fits f32's 24 bits), so reading either in place equals widening to f32
//! first.

use half::f16;

use crate::kv::{Q8_0_BLOCK, Q8_0_BLOCK_BYTES};

#[cfg(target_arch = "x86_64")]
use super::math::exp8_avx2;
use super::math::fast_exp;
#[cfg(target_arch = "x86_64")]
use super::sum_lanes_avx2;

/// The stored elements of a KV cache (or any row-major matrix).
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    /// Single precision (`--kv-type f32`).
    F32(&'a [f32]),
    /// Half precision (llama.cpp's default cache type), widened exactly when read.
    F16(&'a [f16]),
    /// ggml Q8_0 blocks (34 bytes per 32 elements: f16 `d`, then 32 `i8`); element `i`
    /// is `d · q` of block `i / 32`, lane `i % 32`. The kernels' vector paths need rows
    /// and heads that start on a block (start and stride multiples of 32).
    Q8_0(&'a [u8]),
}

/// The storage kinds, as the vector kernels' const parameter.
const F32: u8 = 0;
const F16: u8 = 1;
const Q8: u8 = 2;

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
                match self.data {
                    KvData::F32(_) => prefetch_elems::<F32>(base, i, width),
                    KvData::F16(_) => prefetch_elems::<F16>(base, i, width),
                    KvData::Q8_0(_) => prefetch_elems::<Q8>(base, i, width),
                }
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
    fn runs(
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

    fn len(&self) -> usize {
        match self.data {
            KvData::F32(s) => s.len(),
            KvData::F16(s) => s.len(),
            KvData::Q8_0(s) => s.len() / Q8_0_BLOCK_BYTES * Q8_0_BLOCK,
        }
    }

    /// Panics unless rows `range` of `width` elements lie inside the data (through the
    /// block table: every block the range touches, up to its last row). A row's start
    /// grows with its physical row (a layout block's rows come before the next block's),
    /// so the last physical row bounds them all.
    fn check(&self, range: &std::ops::Range<usize>, width: usize, what: &str) {
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
    fn get(&self, t: usize, e: usize) -> f32 {
        let i = self.row_start(t) + e;
        match self.data {
            KvData::F32(s) => s[i],
            KvData::F16(s) => s[i].to_f32(),
            KvData::Q8_0(s) => {
                let b = &s[i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES..][..Q8_0_BLOCK_BYTES];
                f16::from_le_bytes([b[0], b[1]]).to_f32() * (b[2 + i % Q8_0_BLOCK] as i8) as f32
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_f16c() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// Elements `i .. i + 8` of the data at `base` (of kind `K`) as f32; for Q8_0 `i` is a
/// multiple of 8, so the eight lie in one block.
///
/// # Safety
/// Those eight elements readable at `base`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn load8<const K: u8>(base: *const u8, i: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: eight elements readable (caller); a Q8_0 block's scale and lanes are inside
    // its 34 bytes.
    unsafe {
        match K {
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(base.add(i * 2).cast())),
            Q8 => {
                let b = base.add(i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES);
                let d = f16::from_bits(u16::from_le_bytes([*b, *b.add(1)])).to_f32();
                let q = _mm_loadl_epi64(b.add(2 + i % Q8_0_BLOCK).cast());
                _mm256_mul_ps(
                    _mm256_set1_ps(d),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                )
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
const PREFETCH_KEYS: usize = 16;

/// Keys per block of [`weighted_sum_multi_avx2`]: each block's value rows (a few KiB)
/// stay in L1 while the passes over its output elements read them again.
const VALUE_BLOCK: usize = 64;

/// Prefetches the bytes of elements `i .. i + n` of the data at `base` (of kind `K`).
/// A prefetch never faults and reads nothing architecturally, so the range may be
/// anywhere.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_elems<const K: u8>(base: *const u8, i: usize, n: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let (from, to) = match K {
        F16 => (2 * i, 2 * (i + n)),
        Q8 => (
            i / Q8_0_BLOCK * Q8_0_BLOCK_BYTES,
            (i + n).div_ceil(Q8_0_BLOCK) * Q8_0_BLOCK_BYTES,
        ),
        _ => (4 * i, 4 * (i + n)),
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
fn raw(rows: &KvRows<'_>) -> *const u8 {
    match rows.data {
        KvData::F32(s) => s.as_ptr().cast(),
        KvData::F16(s) => s.as_ptr().cast(),
        KvData::Q8_0(s) => s.as_ptr(),
    }
}

/// Whether the vector kernels can read `rows` (Q8_0: every row on a block start).
#[cfg(target_arch = "x86_64")]
fn vector_ok(rows: &KvRows<'_>) -> bool {
    let on_block = |n: usize| n.is_multiple_of(Q8_0_BLOCK);
    !matches!(rows.data, KvData::Q8_0(_))
        || (on_block(rows.start)
            && on_block(rows.stride)
            && (rows.shift == 0 || on_block(rows.row)))
}

/// Scores of `R` query rows against a run of key rows: `out_r[t]` = the dot product of
/// `q_r` with key row `t` of `keys` for every `t` in `range` (`hd = q_r.len()` elements a
/// row), each with exactly the bits of [`super::dot`] on the widened key. AVX2 + F16C
/// where available ([`dot_multi_keys_portable`] is the twin).
///
/// Panics if a row of `out` is shorter than `range.end`, the query rows differ in length,
/// or the key rows pass the end of `keys`.
#[inline]
pub fn dot_multi_keys<const R: usize>(
    q: [&[f32]; R],
    keys: KvRows<'_>,
    range: std::ops::Range<usize>,
    out: [&mut [f32]; R],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() && vector_ok(&keys) {
        // SAFETY: AVX2 and F16C are available (checked above).
        #[allow(unsafe_code)]
        return unsafe {
            match keys.data {
                KvData::F16(_) => dot_multi_keys_avx2::<R, F16>(q, keys, range, out),
                KvData::F32(_) => dot_multi_keys_avx2::<R, F32>(q, keys, range, out),
                KvData::Q8_0(_) => dot_multi_keys_avx2::<R, Q8>(q, keys, range, out),
            }
        };
    }
    dot_multi_keys_portable(q, keys, range, out)
}

fn check_keys<const R: usize>(
    q: &[&[f32]; R],
    keys: &KvRows<'_>,
    range: &std::ops::Range<usize>,
    out: &[&mut [f32]; R],
) -> usize {
    let hd = q.first().map_or(0, |r| r.len());
    for r in 0..R {
        assert_eq!(q[r].len(), hd, "dot_multi_keys: query lengths");
        assert!(
            range.is_empty() || out[r].len() >= range.end,
            "dot_multi_keys: score rows"
        );
    }
    keys.check(range, hd, "dot_multi_keys");
    hd
}

/// [`dot_multi_keys`] with AVX2: lane `l` of one 256-bit accumulator per query row takes
/// elements `l, l+8, …` (a multiply, then an add: never fused), the lanes combined in
/// `dot`'s tree, then the tail.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn dot_multi_keys_avx2<const R: usize, const K: u8>(
    q: [&[f32]; R],
    keys: KvRows<'_>,
    range: std::ops::Range<usize>,
    out: [&mut [f32]; R],
) {
    let hd = check_keys(&q, &keys, &range, &out);
    // Keys at once: enough independent sums (U · R) to cover an add's latency without
    // running out of registers (measured per key, one core: R = 1 of 128 elements 9.1 ns
    // one key at a time, 7.7 two, 6.2 four; R = 4 of 64, a prefill's, fastest at two: 16%
    // less time than one, three 5% more than two, four 35% more).
    if R <= 2 {
        score_runs::<R, K, 4>(q, keys, range, out, hd)
    } else {
        score_runs::<R, K, 2>(q, keys, range, out, hd)
    }
}

/// [`dot_multi_keys_avx2`] over the runs of `range`, `U` keys at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn score_runs<const R: usize, const K: u8, const U: usize>(
    q: [&[f32]; R],
    keys: KvRows<'_>,
    range: std::ops::Range<usize>,
    mut out: [&mut [f32]; R],
    hd: usize,
) {
    let base = raw(&keys);
    let end = range.end;
    let prefetch = |t: usize| {
        if keys.prefetch && t + PREFETCH_KEYS < end {
            prefetch_elems::<K>(base, keys.row_start(t + PREFETCH_KEYS), hd);
        }
    };
    for (rows, mut row, step) in keys.runs(range) {
        let mut t = rows.start;
        while t + U <= rows.end {
            (t..t + U).for_each(prefetch);
            // SAFETY: rows t..t+U lie inside the data (checked above).
            #[allow(unsafe_code)]
            unsafe {
                score_keys::<R, K, U>(
                    &q,
                    &keys,
                    t,
                    std::array::from_fn(|u| row + u * step),
                    &mut out,
                )
            };
            t += U;
            row += U * step;
        }
        while t < rows.end {
            prefetch(t);
            // SAFETY: row t lies inside the data (checked above).
            #[allow(unsafe_code)]
            unsafe {
                score_keys::<R, K, 1>(&q, &keys, t, [row], &mut out)
            };
            t += 1;
            row += step;
        }
    }
}

/// Scores of `dot_multi_keys_avx2`'s `R` query rows against the `U` keys `t .. t + U`,
/// whose elements start at `rows[u]` of `keys`' data: `U · R` independent sums (each in
/// `dot`'s order), so that the adds of one do not wait on another's. One key at a time
/// left each score a chain of dependent adds: smollm2-135m's prefill spent 22% of its
/// time in these scores.
///
/// # Safety
/// AVX2 and F16C available; the `U` rows' first `hd` elements readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn score_keys<const R: usize, const K: u8, const U: usize>(
    q: &[&[f32]; R],
    keys: &KvRows<'_>,
    t: usize,
    rows: [usize; U],
    out: &mut [&mut [f32]; R],
) {
    use std::arch::x86_64::*;
    let base = raw(keys);
    let hd = q.first().map_or(0, |r| r.len());
    let n8 = hd / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); R]; U];
    let mut c = 0;
    while c < n8 {
        // SAFETY: c + 8 <= hd: each row's elements c..c+8 are readable (caller) and lie
        // inside every query row (length hd).
        unsafe {
            let kc: [__m256; U] = std::array::from_fn(|u| load8::<K>(base, rows[u] + c));
            for (r, qr) in q.iter().enumerate() {
                let qc = _mm256_loadu_ps(qr.as_ptr().add(c));
                for u in 0..U {
                    acc[u][r] = _mm256_add_ps(acc[u][r], _mm256_mul_ps(qc, kc[u]));
                }
            }
        }
        c += 8;
    }
    for (u, acc) in acc.iter().enumerate() {
        for r in 0..R {
            let mut s = sum_lanes_avx2(acc[r]);
            for (i, &qi) in q[r].iter().enumerate().skip(n8) {
                s += qi * keys.get(t + u, i);
            }
            out[r][t + u] = s;
        }
    }
}

/// [`dot_multi_keys`] compiled for the baseline ISA: per row the lanes, products, sums and
/// final combination of [`super::dot_portable`].
pub fn dot_multi_keys_portable<const R: usize>(
    q: [&[f32]; R],
    keys: KvRows<'_>,
    range: std::ops::Range<usize>,
    out: [&mut [f32]; R],
) {
    let hd = check_keys(&q, &keys, &range, &out);
    let n8 = hd / 8 * 8;
    for t in range {
        let mut acc = [[0f32; 8]; R];
        for c in (0..n8).step_by(8) {
            for l in 0..8 {
                let k = keys.get(t, c + l);
                for (a, qr) in acc.iter_mut().zip(&q) {
                    a[l] += qr[c + l] * k;
                }
            }
        }
        for r in 0..R {
            let a = &acc[r];
            let mut s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
            for (i, &qi) in q[r].iter().enumerate().skip(n8) {
                s += qi * keys.get(t, i);
            }
            out[r][t] = s;
        }
    }
}

/// Weighted sums of value rows for `R` query rows: `o_r[e] += p_r[t] · v[t][e]` for the
/// keys `t` in `keys`, in key order (`hd = o_r.len()` elements a value row). Each element
/// gets exactly the bits of calling [`super::axpy`] once per key in key order on the
/// widened value row; the outputs stay in registers across keys. AVX2 + F16C where
/// available ([`weighted_sum_multi_portable`] is the twin).
///
/// Panics if a row of `p` is shorter than `keys.end`, the output rows differ in length,
/// or the value rows pass the end of `v`.
#[inline]
pub fn weighted_sum_multi<const R: usize>(
    o: [&mut [f32]; R],
    p: [&[f32]; R],
    v: KvRows<'_>,
    keys: std::ops::Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() && vector_ok(&v) {
        // SAFETY: AVX2 and F16C are available (checked above).
        #[allow(unsafe_code)]
        return unsafe {
            match v.data {
                KvData::F16(_) => weighted_sum_multi_avx2::<R, F16>(o, p, v, keys),
                KvData::F32(_) => weighted_sum_multi_avx2::<R, F32>(o, p, v, keys),
                KvData::Q8_0(_) => weighted_sum_multi_avx2::<R, Q8>(o, p, v, keys),
            }
        };
    }
    weighted_sum_multi_portable(o, p, v, keys)
}

fn check_values<const R: usize>(
    o: &[&mut [f32]; R],
    p: &[&[f32]; R],
    v: &KvRows<'_>,
    keys: &std::ops::Range<usize>,
) -> usize {
    let hd = o.first().map_or(0, |r| r.len());
    for r in 0..R {
        assert_eq!(o[r].len(), hd, "weighted_sum_multi: output lengths");
        assert!(
            keys.is_empty() || p[r].len() >= keys.end,
            "weighted_sum_multi: scores"
        );
    }
    v.check(keys, hd, "weighted_sum_multi");
    hd
}

/// [`weighted_sum_multi`] with AVX2: the keys in blocks of [`VALUE_BLOCK`], and per block
/// `8 · A` outputs per row at a time held in `A` registers across the block's keys (a
/// multiply, then an add per key: never fused), then 16 at a time, the tail elements as
/// the portable code does them. Every element still sums its keys in key order; the first
/// pass over a block prefetches whole value rows [`PREFETCH_KEYS`] ahead, so the later
/// passes read them from L1. Each register's sum waits on its previous add, so a pass
/// keeps enough of them (`A · R`) to cover that latency: one row summed 16 outputs at a
/// time took 4.8 ns a key (128 elements, one core), 64 at a time 4.0 (the f16 widening
/// then limits it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn weighted_sum_multi_avx2<const R: usize, const K: u8>(
    mut o: [&mut [f32]; R],
    p: [&[f32]; R],
    v: KvRows<'_>,
    keys: std::ops::Range<usize>,
) {
    let hd = check_values(&o, &p, &v, &keys);
    let n16 = hd / 16 * 16;
    for k0 in keys.clone().step_by(VALUE_BLOCK) {
        let block = k0..(k0 + VALUE_BLOCK).min(keys.end);
        let mut e0 = 0;
        // SAFETY (every pass): its elements lie inside hd = o[r].len(); for t in keys,
        // t < p[r].len() and row t's first hd elements lie inside the data (checked
        // above).
        #[allow(unsafe_code)]
        unsafe {
            if R == 1 {
                while e0 + 64 <= hd {
                    value_pass::<R, K, 8>(&mut o, &p, &v, &block, keys.end, e0, hd);
                    e0 += 64;
                }
            } else if R == 2 {
                while e0 + 32 <= hd {
                    value_pass::<R, K, 4>(&mut o, &p, &v, &block, keys.end, e0, hd);
                    e0 += 32;
                }
            }
            while e0 < n16 {
                value_pass::<R, K, 2>(&mut o, &p, &v, &block, keys.end, e0, hd);
                e0 += 16;
            }
        }
        for e in n16..hd {
            for (or, pr) in o.iter_mut().zip(&p) {
                let mut a = or[e];
                for t in block.clone() {
                    a += pr[t] * v.get(t, e);
                }
                or[e] = a;
            }
        }
    }
}

/// One pass of [`weighted_sum_multi_avx2`]: outputs `e0 .. e0 + 8 · A` of each row summed
/// over the keys `block` (prefetching rows ahead, up to `end`, on a block's first pass).
///
/// # Safety
/// AVX2 and F16C available; `e0 + 8 · A <= hd`, every output row `hd` long, every score
/// row covering `block`, and the block's rows' first `hd` elements readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn value_pass<const R: usize, const K: u8, const A: usize>(
    o: &mut [&mut [f32]; R],
    p: &[&[f32]; R],
    v: &KvRows<'_>,
    block: &std::ops::Range<usize>,
    end: usize,
    e0: usize,
    hd: usize,
) {
    use std::arch::x86_64::*;
    let base = raw(v);
    // SAFETY: the caller's bounds.
    unsafe {
        let mut acc: [[__m256; A]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|j| _mm256_loadu_ps(o[r].as_ptr().add(e0 + 8 * j)))
        });
        // The block's first pass fetches the rows ahead; the later ones find them.
        let prefetch = v.prefetch && e0 == 0;
        for (rows, row, step) in v.runs(block.clone()) {
            let mut i = row + e0;
            for t in rows {
                if prefetch && t + PREFETCH_KEYS < end {
                    prefetch_elems::<K>(base, v.row_start(t + PREFETCH_KEYS), hd);
                }
                let vs: [__m256; A] = std::array::from_fn(|j| load8::<K>(base, i + 8 * j));
                for (a, pr) in acc.iter_mut().zip(p) {
                    let pt = _mm256_set1_ps(*pr.get_unchecked(t));
                    for j in 0..A {
                        a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(pt, vs[j]));
                    }
                }
                i += step;
            }
        }
        for (a, or) in acc.iter().zip(o.iter_mut()) {
            for (j, a) in a.iter().enumerate() {
                _mm256_storeu_ps(or.as_mut_ptr().add(e0 + 8 * j), *a);
            }
        }
    }
}

/// [`weighted_sum_multi`] compiled for the baseline ISA.
pub fn weighted_sum_multi_portable<const R: usize>(
    mut o: [&mut [f32]; R],
    p: [&[f32]; R],
    v: KvRows<'_>,
    keys: std::ops::Range<usize>,
) {
    check_values(&o, &p, &v, &keys);
    for (or, pr) in o.iter_mut().zip(&p) {
        for t in keys.clone() {
            for (e, a) in or.iter_mut().enumerate() {
                *a += pr[t] * v.get(t, e);
            }
        }
    }
}

/// Softmax of `x` in place with an optional extra logit that joins the max and the sum but
/// gets no output (an attention sink: llama.cpp `ggml_soft_max_ext` with sinks,
/// transformers `eager_attention_forward` of GptOss).
///
/// The rule, whatever the ISA: `m` = the max of `x` (and the sink); `e_i = fast_exp(x_i − m)`
/// ([`fast_exp`]); the sum of the `e_i` in eight lanes (lane `l` takes `i ≡ l mod 8` of the
/// whole groups of eight, in order), combined as `dot`'s lanes are, then the tail in
/// order, then the sink's `fast_exp(s − m)`; each `e_i` times `1 / sum`. AVX2 where
/// available ([`softmax_with_sink_portable`] is the twin).
pub fn softmax_with_sink(x: &mut [f32], sink: Option<f32>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above).
        #[allow(unsafe_code)]
        return unsafe { softmax_with_sink_avx2(x, sink) };
    }
    softmax_with_sink_portable(x, sink)
}

/// The max of `x` and the sink (NaN ignored, as `f32::max` does).
#[inline(always)]
fn softmax_max(x: &[f32], sink: Option<f32>) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let mut max = lanes.into_iter().fold(f32::NEG_INFINITY, f32::max);
    for &v in chunks.remainder() {
        max = max.max(v);
    }
    sink.map_or(max, |s| max.max(s))
}

/// `x_i · inv` for every element, and the sink's share of the sum added last.
#[inline(always)]
fn softmax_finish(x: &mut [f32], mut sum: f32, sink: Option<f32>, max: f32) {
    if let Some(s) = sink {
        sum += fast_exp(s - max);
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn softmax_with_sink_avx2(x: &mut [f32], sink: Option<f32>) {
    use std::arch::x86_64::*;
    let max = softmax_max(x, sink);
    let n8 = x.len() / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    let m = _mm256_set1_ps(max);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n8 <= x.len().
        #[allow(unsafe_code)]
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let e = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(p), m));
            _mm256_storeu_ps(p, e);
            acc = _mm256_add_ps(acc, e);
        }
        i += 8;
    }
    let mut sum = sum_lanes_avx2(acc);
    for v in &mut x[n8..] {
        *v = fast_exp(*v - max);
        sum += *v;
    }
    softmax_finish(x, sum, sink, max);
}

/// [`softmax_with_sink`] compiled for the baseline ISA.
pub fn softmax_with_sink_portable(x: &mut [f32], sink: Option<f32>) {
    let max = softmax_max(x, sink);
    let n8 = x.len() / 8 * 8;
    let mut a = [0f32; 8];
    for c in x[..n8].chunks_exact_mut(8) {
        for (l, v) in c.iter_mut().enumerate() {
            *v = fast_exp(*v - max);
            a[l] += *v;
        }
    }
    let mut sum = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for v in &mut x[n8..] {
        *v = fast_exp(*v - max);
        sum += *v;
    }
    softmax_finish(x, sum, sink, max);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{axpy, dot, test_rng};

    /// The multi-row kernels give the bits of `dot` and of `axpy` per key on the widened
    /// rows, on every build, for f32, f16 and Q8_0 rows, strided, contiguous and in a KV
    /// cache's head-major blocks (with and without a block table), for head sizes
    /// with and without a tail, and for 1 to 4 rows.
    #[test]
    fn attention_kernels_match_dot_and_axpy() {
        let mut rnd = test_rng(0x2545_f491_4f6c_dd1du64);
        // 9 keys: one short block; 200: several value blocks (the last one partial) and
        // rows prefetched ahead, up to the range's end.
        for (hd, n_keys, range) in [1, 8, 20, 32, 64, 72, 256]
            .into_iter()
            .flat_map(|hd| [(hd, 9usize, 2..7), (hd, 200, 3..VALUE_BLOCK * 2 + 17)])
        {
            let stride = hd * 3 + 5; // another head's elements between the rows
            let start = hd + 2;
            // A KV cache layer's layout: head 1 of 3 in blocks of 16 rows, in position
            // order and through a block table that reverses the blocks.
            let n_blocked = n_keys.div_ceil(16) * 16 * 3 * hd;
            let table: Vec<u32> = (0..n_keys.div_ceil(16) as u32).rev().collect();
            let n_raw = (start + n_keys * stride).max(n_blocked);
            let raw: Vec<f32> = (0..n_raw).map(|_| rnd() * 5.0).collect();
            let half: Vec<f16> = raw.iter().map(|&x| f16::from_f32(x)).collect();
            let q: Vec<Vec<f32>> = (0..4).map(|_| (0..hd).map(|_| rnd()).collect()).collect();
            let p: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..n_keys).map(|_| rnd().abs()).collect())
                .collect();
            // Q8_0 rows (heads of whole blocks): block-aligned (the vector path) and,
            // to exercise the fallback, starting 8 elements into a block.
            let (qstart, qstride) = (hd * 2, hd * 3 + 32);
            let n_q8 = (qstart + 8 + n_keys * qstride).max(n_blocked).div_ceil(32) * 32;
            let mut q8 = vec![0u8; n_q8 / 32 * 34];
            let src: Vec<f32> = (0..n_q8).map(|_| rnd() * 5.0).collect();
            frink_quant::dot::quantize_row_q8_0(&src, &mut q8).unwrap();
            let blocked = |data| {
                let rows = KvRows::new(data, 16 * hd, 3 * hd).in_blocks(4, hd);
                [rows, rows.starting_at(Some(&table[..]), 0)]
            };
            let mut layouts = vec![
                KvRows::new(KvData::F32(&raw), start, stride),
                KvRows::new(KvData::F16(&half), start, stride),
            ];
            layouts.extend(blocked(KvData::F32(&raw)));
            layouts.extend(blocked(KvData::F16(&half)));
            if hd % 32 == 0 {
                layouts.push(KvRows::new(KvData::Q8_0(&q8), qstart, qstride));
                layouts.push(KvRows::new(KvData::Q8_0(&q8), qstart + 8, qstride));
                layouts.extend(blocked(KvData::Q8_0(&q8)));
            }
            let layouts = layouts
                .into_iter()
                .flat_map(|rows| [rows, rows.prefetched()]);
            for rows in layouts {
                // The widened rows, contiguous: the reference's input.
                let wide: Vec<f32> = (0..n_keys)
                    .flat_map(|t| (0..hd).map(move |e| (t, e)))
                    .map(|(t, e)| rows.get(t, e))
                    .collect();
                let want_s: Vec<Vec<f32>> = q
                    .iter()
                    .map(|qr| {
                        (0..n_keys)
                            .map(|t| {
                                if range.contains(&t) {
                                    dot(qr, &wide[t * hd..(t + 1) * hd])
                                } else {
                                    -9.0
                                }
                            })
                            .collect()
                    })
                    .collect();
                let mut want_o = vec![vec![0.5f32; hd]; 4];
                for (r, o) in want_o.iter_mut().enumerate() {
                    for t in range.clone() {
                        axpy(o, p[r][t], &wide[t * hd..(t + 1) * hd]);
                    }
                }
                // Vector kernels in calls of 3 + 1 and of 2 + 2 rows (every unrolling: four
                // keys or 64 outputs at a time for one row, 32 for two, two or 16 for
                // more), then the portable twins.
                for mode in 0..3 {
                    let mut s = vec![vec![-9.0f32; n_keys]; 4];
                    let mut o = vec![vec![0.5f32; hd]; 4];
                    {
                        let [s0, s1, s2, s3] = &mut s[..] else {
                            unreachable!()
                        };
                        let [o0, o1, o2, o3] = &mut o[..] else {
                            unreachable!()
                        };
                        let (q0, q1, q2, q3) = (&q[0][..], &q[1][..], &q[2][..], &q[3][..]);
                        let (p0, p1, p2, p3) = (&p[0][..], &p[1][..], &p[2][..], &p[3][..]);
                        let r = range.clone();
                        if mode == 0 {
                            dot_multi_keys([q0, q1, q2], rows, r.clone(), [s0, s1, s2]);
                            dot_multi_keys([q3], rows, r.clone(), [s3]);
                            weighted_sum_multi([o0], [p0], rows, r.clone());
                            weighted_sum_multi([o1, o2, o3], [p1, p2, p3], rows, r.clone());
                        } else if mode == 1 {
                            dot_multi_keys([q0, q1], rows, r.clone(), [s0, s1]);
                            dot_multi_keys([q2, q3], rows, r.clone(), [s2, s3]);
                            weighted_sum_multi([o0, o1], [p0, p1], rows, r.clone());
                            weighted_sum_multi([o2, o3], [p2, p3], rows, r.clone());
                        } else {
                            dot_multi_keys_portable([q0, q1], rows, r.clone(), [s0, s1]);
                            dot_multi_keys_portable([q2, q3], rows, r.clone(), [s2, s3]);
                            weighted_sum_multi_portable(
                                [o0, o1, o2, o3],
                                [p0, p1, p2, p3],
                                rows,
                                r.clone(),
                            );
                        }
                    }
                    let bits = |v: &Vec<Vec<f32>>| -> Vec<u32> {
                        v.iter().flatten().map(|x| x.to_bits()).collect()
                    };
                    assert_eq!(bits(&s), bits(&want_s), "scores hd {hd} mode {mode}");
                    assert_eq!(bits(&o), bits(&want_o), "values hd {hd} mode {mode}");
                }
            }
        }
    }

    /// The softmax matches f64's within 1e-6 relative (measured 2.4e-7; leaving the sink
    /// out of the sum is off by more than 1e-1 on the short rows) and gives the twin's
    /// bits, with and without a sink, for lengths with and without a tail.
    #[test]
    fn softmax_matches_f64_and_its_twin() {
        let mut rnd = test_rng(0x9e37_79b9_7f4a_7c15u64);
        let mut worst = 0f64;
        for n in [1, 7, 8, 9, 64, 100, 1000] {
            for sink in [None, Some(1.5f32)] {
                let x: Vec<f32> = (0..n).map(|_| rnd() * 12.0).collect();
                let mut a = x.clone();
                let mut b = x.clone();
                softmax_with_sink(&mut a, sink);
                softmax_with_sink_portable(&mut b, sink);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "n {n} sink {sink:?}");
                let m = x
                    .iter()
                    .chain(sink.iter())
                    .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let den: f64 = x
                    .iter()
                    .chain(sink.iter())
                    .map(|&v| (v as f64 - m).exp())
                    .sum();
                for (got, &xi) in a.iter().zip(&x) {
                    let want = (xi as f64 - m).exp() / den;
                    let err = (*got as f64 - want).abs() / want.max(1e-3);
                    worst = worst.max(err);
                    assert!(err <= 1e-6, "n {n}: {got} vs {want}");
                }
            }
        }
        eprintln!("softmax: worst relative error {worst:e}");
    }

    /// Rows past the end of the data are refused, not read.
    #[test]
    #[should_panic(expected = "pass the data")]
    fn rows_past_the_data_panic() {
        let v = vec![0f32; 64];
        let rows = KvRows::contiguous(&v, 16);
        let mut o = [0f32; 16];
        weighted_sum_multi([&mut o[..]], [&[1.0; 8][..]], rows, 0..5);
    }
}
