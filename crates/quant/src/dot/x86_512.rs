//! 512-bit AVX-512 (F/BW/VL/VNNI) kernels for Q4_K, Q6_K (the K-quants of a Q4_K_M file)
//! and Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: the decode path and the prefill path.
//!
//! Every element has the bits of the scalar twin (`scalar::q4_k` etc.): the integers of
//! each (super-)block are those the twin defines, computed in another order (integer sums
//! are exact), and the `f32` tail is the same formula per block, added into lane `b % 8`
//! in block order and combined by [`super::Lanes::finish`]'s tree.
//!
//! **Decode** (a few activation rows: one sequence, or a continuous-batching step of up to
//! eight): each weight row is read once from memory, 64 values per register; for up to
//! three rows the weight rows are read as four distant streams side by side, each with
//! software prefetch 1 KiB ahead (the hardware prefetchers stop at 4 KiB page boundaries:
//! the bandwidth probe reads 20 GB/s plainly, 31 GB/s this way, on two threads here).
//! - Q4_K: the 128 quant bytes are two registers whose low and high nibbles are the
//!   chunks `[0|2]`, `[1|3]`, `[4|6]`, `[5|7]` (32 values each); the activation row is
//!   stored once per call in that order. `vpdpbusd` sums of four values (|.| <= 7680) are
//!   packed to i16 pairs (`vpackssdw`) and scaled by `vpmaddwd` with the chunks' 6-bit
//!   scales; the mins term `summ = Σ m_j (bsum_2j + bsum_2j+1)` is one `madd` of eight
//!   i16 pairs.
//! - Q6_K: the 128 low-nibble bytes and 64 high-bit bytes give four registers of 64
//!   values in the activation's order (`u = low | high << 4`, 0..63: four-value sums
//!   <= 32256 fit i16); the offset `-32 Σ_g s_g bsum_g` enters through one `vpdpwssd`.
//! - The legacy formats: a group of eight blocks is four registers (4-bit formats: the
//!   low and high halves of four blocks; Q8_0: two blocks, made unsigned by `x + 128`),
//!   the accumulators start at `-c Σy` (the values' offset), the min formats add
//!   `(m_w d_x) Σy`.
//!
//! The eight (super-)blocks of a group are reduced together, then the tail runs on eight
//! lanes.
//!
//! **Prefill** (more rows, and every product of more than one or two rows on packed
//! groups: `super::pack`): the tile's weight rows are prepared in blocks of 16 rows whose
//! 32-bit lanes are the rows (from stored rows, or from two packed groups of eight), each
//! just before the activation rows meet it ([`tile_with`]); each dword of an activation
//! row is broadcast, so `vpdpbusd` accumulates one scale group's exact dot product for 16
//! weight rows at once, `vpmulld` scales it and the tail runs on 16 rows, with the twin's
//! eight lanes summed one at a time. What each activation block contributes besides its
//! quants (bsum pair sums, `Σy`, scales) is prepared once per matrix product and shared
//! by every format reading the rows: [`super::KExtra`] beside the stored Q8_K rows, and
//! the Q8_0 rows copied with theirs into register-block order
//! ([`super::interleave_q8_0`]).
//!
//! Safety: the kernels are reached only through [`tile_kernel`] and [`tile_prep_kernel`],
//! which `super::kernel` calls only for [`super::Isa::Avx512Vnni`] after run-time
//! detection. Lengths are checked once per call before any raw-pointer read; each
//! `unsafe` block states the bound it relies on.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::pack::{
    Legacy, Packed, GROUP, Q4K_BYTES, Q4K_DMIN, Q4K_MINS, Q4K_QS, Q4K_SCALES, Q6K_BYTES, Q6K_D,
    Q6K_QH, Q6K_SCALES,
};
use super::x86::hsum8x8;
use super::x86_tile::{f16x8, lane_mask, legacy_type};
use super::{interleave_q8_0, tile_row_groups, KExtra, Lanes, TileFn, TilePrepFn, TileSink, LI};
use crate::GgmlType;

/// Format codes of the const-generic kernels.
const Q4_K: u8 = 12;
const Q6_K: u8 = 14;

/// Bytes per weight super-block.
const fn kwb(f: u8) -> usize {
    if f == Q4_K {
        144
    } else {
        210
    }
}

/// Bytes per Q8_K activation block: `d` (f32), 256 quants, 16 bsums (i16).
const KAB: usize = 292;

/// How far ahead of the current super-block each weight stream is prefetched, in bytes.
/// Measured on qwen2.5-1.5b Q4_K_M tg64 (2 threads, t/s), with [`STREAMS`] = 4: 512:
/// 24.7, 1024: 26.0, 2048: 25.7, 4096: 25.4; one stream: 512: 16.5, 1024: 18.1, 2048:
/// 20.2, 4096: 21.0, 8192: 20.8; without prefetch (the 256-bit kernel): 13.4.
const PREFETCH: usize = 1024;

/// [`PREFETCH`] of the legacy formats' decode path (Q4_0 .. Q8_0 groups of eight
/// blocks). Measured on an AMD EPYC Zen 5 VM, qwen2.5-1.5b tg128 (2 threads, t/s, three
/// alternating rounds, noisy machine): Q4_0 1024: 32.1 30.8 33.1, 2048: 34.6 31.7 32.6;
/// Q8_0 1024: 18.7 16.1 16.5, 2048: 22.3 19.2 15.2.
const LPREFETCH: usize = 2048;

/// One prepared activation super-block: the quants in the order the weight registers
/// hold their values (Q4_K: chunks 0,2,1,3,4,6,5,7; Q6_K: as stored), the 16 bsums, their
/// eight pair sums `bsum_2j + bsum_2j+1` (|.| ≤ 4096: i16), and the scale.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct KAct {
    q: [u8; 256],
    bs: [i16; 16],
    pairs: [i16; 8],
}

const KACT_ZERO: KAct = KAct {
    q: [0; 256],
    bs: [0; 16],
    pairs: [0; 8],
};

thread_local! {
    /// Prepared activation rows (super-blocks, then per row and group of eight the
    /// scales), reused across calls on this thread.
    static ABUF: RefCell<(Vec<KAct>, Vec<[f32; 8]>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `x86_tile`'s length check (the K-quant format codes are the same here): `(weight row
/// bytes, activation row bytes, super-blocks per row)`.
use super::x86_tile::k_geometry as geometry;

/// Source chunk (32 quants) of each 32-byte slot of a prepared Q4_K activation block.
const Q4K_ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// Fills `prep` (`nb` blocks per row) and `dx` (`nb.div_ceil(8)` groups per row) from the
/// `n_a` raw Q8_K rows of `acts`.
fn prepare<const F: u8>(
    acts: &[u8],
    n_a: usize,
    nb: usize,
    prep: &mut Vec<KAct>,
    dx: &mut Vec<[f32; 8]>,
) {
    let ng = nb.div_ceil(8);
    prep.clear();
    prep.resize(n_a * nb, KACT_ZERO);
    dx.clear();
    dx.resize(n_a * ng, [0.0; 8]);
    for (r, row) in acts.chunks_exact(nb * KAB).enumerate().take(n_a) {
        for (b, a) in row.chunks_exact(KAB).enumerate() {
            let p = &mut prep[r * nb + b];
            for (slot, dst) in p.q.chunks_exact_mut(32).enumerate() {
                let c = if F == Q4_K { Q4K_ORDER[slot] } else { slot };
                dst.copy_from_slice(&a[4 + 32 * c..4 + 32 * c + 32]);
            }
            for (i, v) in p.bs.iter_mut().enumerate() {
                *v = i16::from_le_bytes([a[260 + 2 * i], a[261 + 2 * i]]);
            }
            for j in 0..8 {
                p.pairs[j] = p.bs[2 * j] + p.bs[2 * j + 1];
            }
            dx[r * ng + b / 8][b % 8] = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        }
    }
}

/// i16 lane indices for `_mm512_permutexvar_epi16` giving the scales of the decode path's
/// packed products: `vpackssdw` of two registers' `vpdpbusd` sums puts, in each 128-bit
/// lane `L`, four sums of the first register's lane `L` then four of the second's, so the
/// scale vector repeats, per lane, the first's group scale four times then the second's:
/// `pair(L) = (a, b)` gives lanes `8L..8L+4` element `a`, `8L+4..8L+8` element `b`.
const fn packed_idx(pair: [(u16, u16); 4]) -> [u16; 32] {
    let mut v = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        let (a, b) = pair[i / 8];
        v[i] = if i % 8 < 4 { a } else { b };
        i += 1;
    }
    v
}

/// Q4_K: registers `[c0|c2] [c1|c3]` and `[c4|c6] [c5|c7]` (32-value chunks: lanes 0,1 of
/// a register are its first chunk, 2,3 its second).
const Q4K_SCALE_IDX: [[u16; 32]; 2] = [
    packed_idx([(0, 1), (0, 1), (2, 3), (2, 3)]),
    packed_idx([(4, 5), (4, 5), (6, 7), (6, 7)]),
];
/// Q6_K: registers of values `0..64`, `64..128` and `128..192`, `192..256` (lane `L` of
/// register `k`: group `4k + L`).
const Q6K_SCALE_IDX: [[u16; 32]; 2] = [
    packed_idx([(0, 4), (1, 5), (2, 6), (3, 7)]),
    packed_idx([(8, 12), (9, 13), (10, 14), (11, 15)]),
];

/// The Q4_K scales and mins from the 12 bytes in the low lanes of `x` (words w0, w1, w2):
/// bytes 0..8 the scales, 8..16 the mins, as the scalar `kquants::scale_min_k4` gives
/// them: `[w0 & 0x3f.., (w2 & 0x0f..) | ((w0 >> 6) & 0x03..) << 4]` and
/// `[w1 & 0x3f.., ((w2 >> 4) & 0x0f..) | ((w1 >> 6) & 0x03..) << 4]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
fn k4_scales_mins(x: __m128i) -> __m128i {
    let lo = _mm_and_si128(x, _mm_set1_epi8(0x3f)); // [sc_lo, m_lo, ..]
    let w2 = _mm_shuffle_epi32::<0b10_10_10_10>(x); // [w2, w2, ..]
    let w2 = _mm_srlv_epi32(w2, _mm_setr_epi32(0, 4, 0, 0));
    let top = _mm_and_si128(_mm_srli_epi32::<2>(x), _mm_set1_epi8(0x30)); // [(w0>>6)&3 <<4, ..]
    let hi = _mm_ternarylogic_epi32::<A_AND_C_OR_B>(w2, top, _mm_set1_epi8(0x0f));
    _mm_unpacklo_epi32(lo, hi) // [sc_lo, sc_hi, m_lo, m_hi]
}

/// `_mm512_ternarylogic_epi32` immediate of `(a & c) | b`.
const A_AND_C_OR_B: i32 = {
    let mut imm = 0;
    let mut i = 0;
    while i < 8 {
        let (a, b, c) = ((i >> 2) & 1, (i >> 1) & 1, i & 1);
        if (a & c) | b != 0 {
            imm |= 1 << i;
        }
        i += 1;
    }
    imm
};

#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn idx_vec(idx: &[u16; 32]) -> __m512i {
    // SAFETY: `idx` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// One weight super-block decoded into four registers of 64 unsigned values and their
/// four i16 scale registers, plus the extra term's i16 coefficients (Q4_K: the eight mins
/// in the low 128 bits; Q6_K: the 16 scales × −32 in the low 256 bits).
///
/// # Safety
/// `kwb(F)` readable bytes at `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn decode<const F: u8>(
    w: *const u8,
    sidx: &[__m512i; 2],
) -> ([__m512i; 4], [__m512i; 2], __m512i) {
    let m4 = _mm512_set1_epi8(0x0F);
    if F == Q4_K {
        // SAFETY: the quants are bytes 16..144, the scales 4..16 (the 16-byte load
        // reads four quant bytes too, unused).
        let (q0, q1, x) = unsafe {
            (
                _mm512_loadu_si512(w.add(16).cast()),
                _mm512_loadu_si512(w.add(80).cast()),
                _mm_loadu_si128(w.add(4).cast()),
            )
        };
        let u = [
            _mm512_and_si512(q0, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4),
            _mm512_and_si512(q1, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
        ];
        // The eight 6-bit scales then the eight mins, as i16 (the scalar `k4_scales`
        // on the words w0, w1, w2 of the 12 bytes, two words per step).
        let sm = _mm256_cvtepu8_epi16(k4_scales_mins(x));
        let sc = _mm512_castsi256_si512(sm);
        let s = sidx.map(|i| _mm512_permutexvar_epi16(i, sc));
        (
            u,
            s,
            _mm512_zextsi128_si512(_mm256_extracti128_si256::<1>(sm)),
        )
    } else {
        // SAFETY: low bits at 0..128, high bits at 128..192, scales at 192..208.
        let (ql0, ql1, qh, sc8) = unsafe {
            (
                _mm512_loadu_si512(w.cast()),
                _mm512_loadu_si512(w.add(64).cast()),
                _mm512_loadu_si512(w.add(128).cast()),
                _mm_loadu_si128(w.add(192).cast()),
            )
        };
        let m30 = _mm512_set1_epi8(0x30);
        // High bits of values 0..32 | 32..64 (shift 0 | 2 → bits 4,5) and of 64..96 |
        // 96..128 (shift 4 | 6), per 16-bit word.
        let shl = _mm512_setr_epi64(
            4 * 0x0001_0001_0001_0001,
            4 * 0x0001_0001_0001_0001,
            4 * 0x0001_0001_0001_0001,
            4 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
        );
        let shr = _mm512_setr_epi64(
            0,
            0,
            0,
            0,
            2 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
            2 * 0x0001_0001_0001_0001,
        );
        let mut u = [_mm512_setzero_si512(); 4];
        for (n, ql) in [ql0, ql1].into_iter().enumerate() {
            let h = if n == 0 {
                _mm512_shuffle_i64x2::<0b01_00_01_00>(qh, qh)
            } else {
                _mm512_shuffle_i64x2::<0b11_10_11_10>(qh, qh)
            };
            let hl = _mm512_and_si512(_mm512_sllv_epi16(h, shl), m30);
            let hh = _mm512_and_si512(_mm512_srlv_epi16(h, shr), m30);
            u[2 * n] = _mm512_ternarylogic_epi32::<A_AND_C_OR_B>(ql, hl, m4);
            u[2 * n + 1] =
                _mm512_ternarylogic_epi32::<A_AND_C_OR_B>(_mm512_srli_epi16::<4>(ql), hh, m4);
        }
        let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        let s = sidx.map(|i| _mm512_permutexvar_epi16(i, sc));
        let off = _mm512_slli_epi16::<5>(_mm512_sub_epi16(_mm512_setzero_si512(), sc));
        (u, s, off)
    }
}

/// The decode path: `R` (1..=3) activation rows against every weight row, each weight
/// super-block decoded once for all rows. The weight rows are split into [`STREAMS`]
/// contiguous parts read side by side (row `i` of every part in turn): several distant
/// sequential streams, each prefetched, keep more memory requests in flight than one
/// (the bandwidth probe: 31 GB/s with four streams, 24 with one, two threads).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn gemv<const F: u8, const R: usize>(
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    out: &mut [f32],
) {
    let (wrb, _ab, nb) = geometry(F, ws, n_w, acts, n_a, out);
    assert_eq!(n_a, R, "gemv: {R} activation rows");
    ABUF.with_borrow_mut(|(prep, dxs)| {
        prepare::<F>(acts, n_a, nb, prep, dxs);
        let k = RowsCtx {
            prep,
            dxs,
            nb,
            sidx: if F == Q4_K {
                &Q4K_SCALE_IDX
            } else {
                &Q6K_SCALE_IDX
            }
            .map(|i| idx_vec(&i)),
            last_mask: lane_mask(nb % 8),
        };
        let row = |i: usize| {
            // SAFETY: row `i < n_w` of `wrb` bytes lies inside `ws` (geometry).
            unsafe { ws.as_ptr().add(i * wrb) }
        };
        stream_rows(n_w, R, |rows| {
            let mut put = |q: usize, res: [f32; R]| {
                for (r, v) in res.into_iter().enumerate() {
                    out[r * n_w + rows[q]] = v;
                }
            };
            if let Ok(rs) = <[usize; STREAMS]>::try_from(rows) {
                // SAFETY: every row is `< n_w`, so `nb` super-blocks are readable at each.
                let res = unsafe { rows_block::<F, STREAMS, R>(&k, rs.map(row)) };
                res.into_iter().enumerate().for_each(|(q, v)| put(q, v));
            } else {
                // SAFETY: as above.
                put(0, unsafe { rows_block::<F, 1, R>(&k, [row(rows[0])]) }[0]);
            }
        });
    });
}

/// Weight streams of the decode path (qwen2.5-1.5b Q4_K_M tg64, 2 threads: 1 stream
/// 21.0 t/s, 2: 24.4, 4: 26.0, 8: 24.4).
const STREAMS: usize = 4;

/// Activation rows up to which the decode path reads [`STREAMS`] weight streams; above,
/// a step is bound by its arithmetic rather than by memory, and one stream keeps the
/// per-row state small.
const STREAM_ROWS: usize = 3;

/// Visits the weight rows `0..n_w` as the decode path reads them: for `r <=`
/// [`STREAM_ROWS`] activation rows, row `i` of each of [`STREAMS`] contiguous parts
/// together (`visit` gets [`STREAMS`] rows), the rows the last part lacks one by one;
/// above, every row alone, in order.
fn stream_rows(n_w: usize, r: usize, mut visit: impl FnMut(&[usize])) {
    if r > STREAM_ROWS {
        (0..n_w).for_each(|i| visit(&[i]));
        return;
    }
    let per = n_w.div_ceil(STREAMS);
    // Rows `i` of the parts that have one: all STREAMS parts for `i < full`.
    let full = n_w.saturating_sub((STREAMS - 1) * per);
    for i in 0..per {
        if i < full {
            visit(&std::array::from_fn::<usize, STREAMS, _>(|q| q * per + i));
        } else {
            for q in (0..STREAMS).filter(|q| q * per + i < n_w) {
                visit(&[q * per + i]);
            }
        }
    }
}

/// What the decode path's row blocks share: the prepared activation rows, their scales,
/// the super-blocks per row, the scale-permutation indices and the partial group's mask.
struct RowsCtx<'a> {
    prep: &'a [KAct],
    dxs: &'a [[f32; 8]],
    nb: usize,
    sidx: [__m512i; 2],
    last_mask: __m256,
}

/// `Q` weight rows (at `w`) against the `R` prepared activation rows: `res[q][r]`.
///
/// # Safety
/// `k.nb` super-blocks of `F` readable at each `w[q]`; `k.prep` and `k.dxs` prepared for
/// `R` rows of `k.nb` super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn rows_block<const F: u8, const Q: usize, const R: usize>(
    k: &RowsCtx<'_>,
    w: [*const u8; Q],
) -> [[f32; R]; Q] {
    let nb = k.nb;
    let ng = nb.div_ceil(8);
    let mut acc = [[_mm256_setzero_ps(); R]; Q];
    for g in 0..ng {
        let n = (nb - 8 * g).min(8);
        let mut t = [[[_mm256_setzero_si256(); 8]; R]; Q];
        let mut m = [[[_mm_setzero_si128(); 8]; R]; Q];
        for j in 0..n {
            let b = 8 * g + j;
            for q in 0..Q {
                // SAFETY: super-block `b < nb` of row `q` is readable (caller).
                let wb = unsafe { w[q].add(b * kwb(F)) };
                let pf = wb.wrapping_add(PREFETCH);
                // A prefetch never faults, whatever the address.
                for line in 0..kwb(F).div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * line).cast());
                }
                // SAFETY: as above.
                let (u, s, extra) = unsafe { decode::<F>(wb, &k.sidx) };
                for r in 0..R {
                    let a = &k.prep[r * nb + b];
                    // SAFETY: `a.q` is 256 readable bytes.
                    let y: [__m512i; 4] = std::array::from_fn(|c| unsafe {
                        _mm512_loadu_si512(a.q.as_ptr().add(64 * c).cast())
                    });
                    // Four-value sums (|.| <= 4 * 63 * 128: i16), packed in pairs of
                    // registers and scaled by `vpmaddwd`.
                    let d: [__m512i; 4] = std::array::from_fn(|c| {
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[c], y[c])
                    });
                    let p01 = _mm512_packs_epi32(d[0], d[1]);
                    let p23 = _mm512_packs_epi32(d[2], d[3]);
                    let mut v = _mm512_dpwssd_epi32(_mm512_madd_epi16(p01, s[0]), p23, s[1]);
                    if F == Q4_K {
                        // SAFETY: `pairs` is 16 readable bytes.
                        let p = unsafe { _mm_loadu_si128(a.pairs.as_ptr().cast()) };
                        m[q][r][j] = _mm_madd_epi16(_mm512_castsi512_si128(extra), p);
                    } else {
                        // SAFETY: `bs` is 32 readable bytes.
                        let bs = unsafe { _mm256_loadu_si256(a.bs.as_ptr().cast()) };
                        v = _mm512_dpwssd_epi32(v, extra, _mm512_zextsi256_si512(bs));
                    }
                    t[q][r][j] = _mm256_add_epi32(
                        _mm512_castsi512_si256(v),
                        _mm512_extracti64x4_epi64::<1>(v),
                    );
                }
            }
        }
        for q in 0..Q {
            // SAFETY: super-blocks `8g..8g+n` of row `q` are readable (caller).
            let (dw, dmin) = unsafe {
                let wg = w[q].add(8 * g * kwb(F));
                if F == Q4_K {
                    (f16x8(wg, kwb(F), 0, n), f16x8(wg, kwb(F), 2, n))
                } else {
                    (f16x8(wg, kwb(F), 208, n), _mm256_setzero_ps())
                }
            };
            for r in 0..R {
                // SAFETY: `dxs` holds `ng` groups per row (caller).
                let dx = unsafe { _mm256_loadu_ps(k.dxs[r * ng + g].as_ptr()) };
                let sumi = _mm256_cvtepi32_ps(hsum8x8(&t[q][r]));
                let mut v = _mm256_mul_ps(_mm256_mul_ps(dx, dw), sumi);
                if F == Q4_K {
                    let summ = _mm256_cvtepi32_ps(hsum4x8(&m[q][r]));
                    v = _mm256_sub_ps(v, _mm256_mul_ps(_mm256_mul_ps(dx, dmin), summ));
                }
                acc[q][r] = if n == 8 {
                    _mm256_add_ps(acc[q][r], v)
                } else {
                    _mm256_blendv_ps(acc[q][r], _mm256_add_ps(acc[q][r], v), k.last_mask)
                };
            }
        }
    }
    acc.map(|a| {
        a.map(|v| {
            let mut l = Lanes::default();
            // SAFETY: `l.0` is 8 f32s.
            unsafe { _mm256_storeu_ps(l.0.as_mut_ptr(), v) };
            l.finish()
        })
    })
}

/// The sums of the four i32 lanes of each of eight vectors, as one vector (element `k` =
/// the sum of `v[k]`).
#[target_feature(enable = "avx2")]
#[inline]
fn hsum4x8(v: &[__m128i; 8]) -> __m256i {
    let a01 = _mm_hadd_epi32(v[0], v[1]);
    let a23 = _mm_hadd_epi32(v[2], v[3]);
    let a45 = _mm_hadd_epi32(v[4], v[5]);
    let a67 = _mm_hadd_epi32(v[6], v[7]);
    _mm256_set_m128i(_mm_hadd_epi32(a45, a67), _mm_hadd_epi32(a01, a23))
}

// ---------------------------------------------------------------------------------------
// The legacy formats' decode path (Q4_0, Q5_0, Q8_0: 32 values and one f16 scale per
// block; the scalar twins `scalar::q4_0` etc.): per group of eight blocks, four
// registers of unsigned values, `vpdpbusd` with the activation values prepared in the
// same order, the accumulators starting at `-c Σy` of each block (the values' offset:
// 8, 16 or, for Q8_0 made unsigned by `x + 128`, 128), a reduction to eight block sums,
// and `block_sym` on eight lanes.
//
// Registers: Q4_0/Q5_0: `[lo0 | lo1 | lo2 | lo3]`, `[hi0 | .. | hi3]` for blocks 0..4 and
// the same for 4..8 (lo = values 0..16 of a block, hi = 16..32; 128-bit lane `L` = block
// `4h + L`); Q8_0: blocks `p` and `p + 4` in the halves of register `p`.

// The legacy format codes, block sizes, min formats and value offsets of `x86_tile`.
use super::x86_tile::{has_min as lmin, offset as loff, wb as lwb, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Byte offsets of the 16 nibble bytes and (5-bit formats) of the 32 high bits.
const fn lqs_at(f: u8) -> usize {
    match f {
        Q4_0 => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        _ => 8,
    }
}

const fn lqh_at(f: u8) -> usize {
    if f == Q5_0 {
        2
    } else {
        4
    }
}

/// Bytes per Q8_0 activation block.
const LAB: usize = 34;

/// One activation row's group of eight blocks, prepared for the legacy decode path.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct LAct {
    y: [[u8; 64]; 4],
    init: [[i32; 16]; 4],
    d: [f32; 8],
    /// `Σy` of each block, as f32 (exact), for the formats with a min.
    ys: [f32; 8],
}

const LACT_ZERO: LAct = LAct {
    y: [[0; 64]; 4],
    init: [[0; 16]; 4],
    d: [0.0; 8],
    ys: [0.0; 8],
};

thread_local! {
    /// Prepared legacy activation groups, reused across calls on this thread.
    static LBUF: RefCell<Vec<LAct>> = const { RefCell::new(Vec::new()) };
}

/// Fills `prep` (`nb.div_ceil(8)` groups per row) from the `n_a` raw Q8_0 rows of `acts`.
fn lprepare<const F: u8>(acts: &[u8], n_a: usize, nb: usize, prep: &mut Vec<LAct>) {
    let ng = nb.div_ceil(8);
    prep.clear();
    prep.resize(n_a * ng, LACT_ZERO);
    for (r, row) in acts.chunks_exact(nb * LAB).enumerate().take(n_a) {
        for (b, a) in row.chunks_exact(LAB).enumerate() {
            let p = &mut prep[r * ng + b / 8];
            let k = b % 8;
            let y = &a[2..34];
            let ysum: i32 = y.iter().map(|&v| i32::from(v as i8)).sum();
            if F == Q8_0 {
                let (reg, half) = (k % 4, k / 4);
                p.y[reg][32 * half..32 * half + 32].copy_from_slice(y);
                p.init[reg][8 * half] = -loff(F) * ysum;
            } else {
                let (h, lane) = (k / 4, k % 4);
                p.y[2 * h][16 * lane..16 * lane + 16].copy_from_slice(&y[..16]);
                p.y[2 * h + 1][16 * lane..16 * lane + 16].copy_from_slice(&y[16..]);
                p.init[h][4 * lane] = -loff(F) * ysum;
            }
            p.d[k] = half::f16::from_bits(u16::from_le_bytes([a[0], a[1]])).to_f32();
            p.ys[k] = ysum as f32;
        }
    }
}

/// The four value registers of the `n` (1..=8) blocks of `F` at `w` (missing blocks zero).
///
/// # Safety
/// `n` blocks readable at `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn ldecode<const F: u8>(w: *const u8, n: usize) -> [__m512i; 4] {
    let blk = |k: usize| w.wrapping_add(k * lwb(F));
    if F == Q8_0 {
        let q = |k: usize| {
            if k < n {
                // SAFETY: block `k < n` is readable; its quants are bytes 2..34.
                unsafe { _mm256_loadu_si256(blk(k).add(2).cast()) }
            } else {
                _mm256_setzero_si256()
            }
        };
        let flip = _mm512_set1_epi8(-128);
        std::array::from_fn(|p| {
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q(p)), q(p + 4));
            // Missing blocks stay zero: their init and scale are zero, and the lanes are
            // masked out of the sum.
            _mm512_xor_si512(v, flip)
        })
    } else {
        let qs_at = lqs_at(F);
        let q = |k: usize| {
            if k < n {
                // SAFETY: block `k < n` is readable; its 16 quant bytes start at `qs_at`.
                unsafe { _mm_loadu_si128(blk(k).add(qs_at).cast()) }
            } else {
                _mm_setzero_si128()
            }
        };
        let four = |k0: usize| {
            let v = _mm512_castsi128_si512(q(k0));
            let v = _mm512_inserti32x4::<1>(v, q(k0 + 1));
            let v = _mm512_inserti32x4::<2>(v, q(k0 + 2));
            _mm512_inserti32x4::<3>(v, q(k0 + 3))
        };
        let (a, b) = (four(0), four(4));
        // SAFETY: `n` blocks readable at `w` (caller).
        unsafe { lnibbles::<F>(a, b, w, n) }
    }
}

/// Words (16-bit) of a full group of eight legacy blocks of `F` (every block size is even).
const fn lgw(f: u8) -> usize {
    4 * lwb(f)
}

/// The mask of the words of register `j` (words `32j..32j + 32` of a group) that lie in
/// a full group of `F`: loads under it never read past the group.
const fn lgmask(f: u8, j: usize) -> u32 {
    let w = lgw(f);
    if w >= 32 * (j + 1) {
        u32::MAX
    } else if w <= 32 * j {
        0
    } else {
        (1u32 << (w - 32 * j)) - 1
    }
}

/// `vpermt2w` indices that gather, from a pair of word registers starting at word `base`
/// of a group, the 8 quant words (16 nibble bytes) of blocks `k0..k0 + 4` of a 4-bit
/// legacy format into 128-bit lanes `0..4` (the order [`ldecode`] builds with inserts).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn lquant_idx<const F: u8>(k0: usize, base: usize) -> __m512i {
    let idx: [i16; 32] = std::array::from_fn(|e| {
        let (lane, i) = (e / 8, e % 8);
        ((k0 + lane) * lwb(F) / 2 + lqs_at(F) / 2 + i - base) as i16
    });
    // SAFETY: `idx` is 64 readable bytes; unaligned loads are allowed.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// The four value registers (as [`ldecode`]'s) and the eight f16 scales (words 0..8 of
/// the second result; words 8..16: the eight mins of the formats with one) of a full
/// group of eight blocks of `F` at `w`: the group is read as word registers under masks
/// ([`lgmask`]) and the quants and scales are gathered by `vpermt2w` (AVX512BW), with no
/// branch per block and no `vpgatherdd` (microcoded, and the decode loop's costliest
/// instruction on an AMD Zen 5: 17% of a Q4_0 decode step's samples). Reads no byte
/// outside the group.
///
/// # Safety
/// Eight blocks of `F` readable at `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn ldecode_full<const F: u8>(w: *const u8, idx: &LIdx) -> ([__m512i; 4], __m512i) {
    // SAFETY: the masks cover only words of the group, which the caller makes readable;
    // masked-out words are never accessed (AVX-512 masked loads suppress faults).
    let v: [__m512i; 4] = std::array::from_fn(|j| unsafe {
        if lgmask(F, j) == 0 {
            _mm512_setzero_si512()
        } else {
            _mm512_maskz_loadu_epi16(lgmask(F, j), w.add(64 * j).cast())
        }
    });
    // Scale (and min) words of blocks 0..8: below word 64 from `v[0..2]`, above from
    // `v[2..4]` (Q8_0's last three), merged under `idx.s_hi`.
    let lo = _mm512_permutex2var_epi16(v[0], idx.s, v[1]);
    let s = if idx.s_hi == 0 {
        lo
    } else {
        let hi = _mm512_permutex2var_epi16(v[2], idx.s, v[3]);
        _mm512_mask_mov_epi16(lo, idx.s_hi, hi)
    };
    if F == Q8_0 {
        // SAFETY: the group's eight blocks are readable (caller).
        return (unsafe { ldecode::<F>(w, 8) }, s);
    }
    let a = _mm512_permutex2var_epi16(v[0], idx.q[0], v[1]);
    let b = _mm512_permutex2var_epi16(v[1], idx.q[1], v[2]);
    // SAFETY: the group's eight blocks are readable (caller).
    (unsafe { lnibbles::<F>(a, b, w, 8) }, s)
}

/// The four value registers of a 4-bit or 5-bit legacy format's group from `a` and `b`,
/// the nibble bytes of blocks `0..4` and `4..8` (128-bit lane `L`: block `4h + L`): their
/// low and high nibbles, and for Q5_0/Q5_1 the fifth bits (bit `i` of a block's `qh` is
/// value `i`'s, 0x10 in its byte) of the `n` (1..=8) blocks at `w`; missing blocks add none.
///
/// # Safety
/// `n` blocks readable at `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn lnibbles<const F: u8>(a: __m512i, b: __m512i, w: *const u8, n: usize) -> [__m512i; 4] {
    let m4 = _mm512_set1_epi8(0x0F);
    let mut u = [
        _mm512_and_si512(a, m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(a), m4),
        _mm512_and_si512(b, m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(b), m4),
    ];
    if matches!(F, Q5_0 | Q5_1) {
        let qh = |k: usize| -> u64 {
            if k < n {
                // SAFETY: block `k < n` is readable; qh is 4 bytes at `lqh_at`.
                u64::from(unsafe { w.add(k * lwb(F) + lqh_at(F)).cast::<u32>().read_unaligned() })
            } else {
                0
            }
        };
        let sixteen = _mm512_set1_epi8(0x10);
        for half in 0..2 {
            let (mut lo, mut hi) = (0u64, 0u64);
            for l in 0..4 {
                let h = qh(4 * half + l);
                lo |= (h & 0xFFFF) << (16 * l);
                hi |= (h >> 16) << (16 * l);
            }
            u[2 * half] = _mm512_or_si512(u[2 * half], _mm512_maskz_mov_epi8(lo, sixteen));
            u[2 * half + 1] = _mm512_or_si512(u[2 * half + 1], _mm512_maskz_mov_epi8(hi, sixteen));
        }
    }
    u
}

/// The `vpermt2w` indices of [`ldecode_full`] for one format, made once per matrix product.
struct LIdx {
    /// Quants of blocks 0..4 (from registers 0, 1) and 4..8 (from registers 1, 2).
    q: [__m512i; 2],
    /// Scale of block `k` in word `k`, min in word `8 + k` (mod 64: see `s_hi`).
    s: __m512i,
    /// The words of `s` taken from registers 2, 3 (their group word is 64 or more).
    s_hi: u32,
}

impl LIdx {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
    fn new<const F: u8>() -> LIdx {
        let word = |e: usize| -> usize {
            let k = e % 8;
            // Scale at byte 0 of a block, min (Q4_1, Q5_1) at byte 2; words 16.. unused.
            if e < 8 || (e < 16 && lmin(F)) {
                k * lwb(F) / 2 + e / 8
            } else {
                0
            }
        };
        let s: [i16; 32] = std::array::from_fn(|e| (word(e) % 64) as i16);
        let s_hi = (0..32).fold(0u32, |m, e| m | (u32::from(word(e) >= 64) << e));
        // The quants of a 4-bit format's blocks 4..8 end below word 96 (at most
        // 7 * 12 + 4 + 8 = 96 for Q5_1), so registers 1 and 2 hold them.
        let q = if F == Q8_0 {
            [_mm512_setzero_si512(); 2]
        } else {
            [lquant_idx::<F>(0, 0), lquant_idx::<F>(4, 32)]
        };
        LIdx {
            q,
            // SAFETY: `s` is 64 readable bytes.
            s: unsafe { _mm512_loadu_si512(s.as_ptr().cast()) },
            s_hi,
        }
    }
}

/// The per-block sums of four registers of two blocks each (register `p`: blocks `p` and
/// `p + 4`, eight lanes each), as eight lanes in block order.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn reduce_pairs(s: &[__m512i; 4]) -> __m256i {
    let ab = _mm512_add_epi32(
        _mm512_unpacklo_epi32(s[0], s[1]),
        _mm512_unpackhi_epi32(s[0], s[1]),
    );
    let cd = _mm512_add_epi32(
        _mm512_unpacklo_epi32(s[2], s[3]),
        _mm512_unpackhi_epi32(s[2], s[3]),
    );
    // Per 128-bit lane L: [a_L, b_L, c_L, d_L], each the sum of that lane's four dwords.
    let x = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    // Lanes 0|1 and 2|3 hold the halves of blocks 0..4 and 4..8.
    let y = _mm512_add_epi32(x, _mm512_shuffle_i64x2::<0b10_11_00_01>(x, x));
    _mm512_castsi512_si256(_mm512_shuffle_i64x2::<0b00_00_10_00>(y, y))
}

/// The per-block sums of two registers of four blocks each (128-bit lane `L` of register
/// `h`: block `4h + L`), as eight lanes in block order.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn reduce_quads(z: &[__m512i; 2]) -> __m256i {
    let s = _mm512_add_epi32(
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let t = _mm512_add_epi32(s, _mm512_shuffle_epi32::<0b01_00_11_10>(s));
    // Lane L: [block L, block 4 + L, ..]: the first two dwords of each lane.
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, t))
}

/// `Q` legacy weight rows (at `w`, `nb` blocks each) against `R` prepared activation rows
/// (`a[r]`: `nb.div_ceil(8)` groups): `res[q][r]`.
///
/// # Safety
/// `nb` blocks of `F` readable at each `w[q]`; each `a[r]` holds the groups. `idx` is
/// `LIdx::new::<F>()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn lrows_block<const F: u8, const Q: usize, const R: usize>(
    w: [*const u8; Q],
    a: [*const LAct; R],
    nb: usize,
    last_mask: __m256,
    idx: &LIdx,
) -> [[f32; R]; Q] {
    let ng = nb.div_ceil(8);
    let ld = |p: *const u8| {
        // SAFETY: every caller passes a 64-byte field of a prepared group.
        unsafe { _mm512_loadu_si512(p.cast()) }
    };
    let mut acc = [[_mm256_setzero_ps(); R]; Q];
    for g in 0..ng {
        let n = (nb - 8 * g).min(8);
        for q in 0..Q {
            let wg = w[q].wrapping_add(8 * g * lwb(F));
            let pf = wg.wrapping_add(LPREFETCH);
            // A prefetch never faults, whatever the address.
            for line in 0..(8 * lwb(F)).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * line).cast());
            }
            let (u, dw, mw) = if n == 8 {
                // SAFETY: blocks `8g..8g+8` of row `q` are readable (caller).
                let (u, s) = unsafe { ldecode_full::<F>(wg, idx) };
                let dw = _mm256_cvtph_ps(_mm512_castsi512_si128(s));
                let mw = if lmin(F) {
                    _mm256_cvtph_ps(_mm512_extracti32x4_epi32::<1>(s))
                } else {
                    _mm256_setzero_ps()
                };
                (u, dw, mw)
            } else {
                // The last, partial group: its scales (byte 0) and mins (byte 2) one by one.
                // SAFETY: blocks `8g..8g+n` of row `q` are readable (caller).
                let (u, dw) = unsafe { (ldecode::<F>(wg, n), f16x8(wg, lwb(F), 0, n)) };
                let mw = if lmin(F) {
                    // SAFETY: as above.
                    unsafe { f16x8(wg, lwb(F), 2, n) }
                } else {
                    _mm256_setzero_ps()
                };
                (u, dw, mw)
            };
            for r in 0..R {
                // SAFETY: group `g < ng` of row `r` (caller).
                let ag = unsafe { &*a[r].add(g) };
                let isum = if F == Q8_0 {
                    let t: [__m512i; 4] = std::array::from_fn(|p| {
                        _mm512_dpbusd_epi32(
                            ld(ag.init[p].as_ptr().cast()),
                            u[p],
                            ld(ag.y[p].as_ptr()),
                        )
                    });
                    reduce_pairs(&t)
                } else {
                    let t: [__m512i; 2] = std::array::from_fn(|h| {
                        let t = _mm512_dpbusd_epi32(
                            ld(ag.init[h].as_ptr().cast()),
                            u[2 * h],
                            ld(ag.y[2 * h].as_ptr()),
                        );
                        _mm512_dpbusd_epi32(t, u[2 * h + 1], ld(ag.y[2 * h + 1].as_ptr()))
                    });
                    reduce_quads(&t)
                };
                // SAFETY: `d` is 32 readable bytes.
                let dx = unsafe { _mm256_loadu_ps(ag.d.as_ptr()) };
                let mut v = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
                if lmin(F) {
                    // SAFETY: `ys` is 32 readable bytes.
                    let ys = unsafe { _mm256_loadu_ps(ag.ys.as_ptr()) };
                    v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(mw, dx), ys));
                }
                acc[q][r] = if n == 8 {
                    _mm256_add_ps(acc[q][r], v)
                } else {
                    _mm256_blendv_ps(acc[q][r], _mm256_add_ps(acc[q][r], v), last_mask)
                };
            }
        }
    }
    acc.map(|a| {
        a.map(|v| {
            let mut l = Lanes::default();
            // SAFETY: `l.0` is 8 f32s.
            unsafe { _mm256_storeu_ps(l.0.as_mut_ptr(), v) };
            l.finish()
        })
    })
}

/// The legacy decode path: `R` (1..=3) activation rows against every weight row, in
/// [`STREAMS`] streams as [`gemv`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn lgemv<const F: u8, const R: usize>(
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    out: &mut [f32],
) {
    assert!(n_w > 0 && n_a == R && out.len() == n_w * n_a, "tile shape");
    let (wrb, ab) = (ws.len() / n_w, acts.len() / n_a);
    let nb = wrb / lwb(F);
    assert!(
        wrb * n_w == ws.len() && ab * n_a == acts.len() && nb * lwb(F) == wrb && nb * LAB == ab,
        "tile lengths"
    );
    let ng = nb.div_ceil(8);
    let last_mask = lane_mask(nb % 8);
    let idx = LIdx::new::<F>();
    LBUF.with_borrow_mut(|prep| {
        lprepare::<F>(acts, n_a, nb, prep);
        let arows: [*const LAct; R] = std::array::from_fn(|r| prep[r * ng..].as_ptr());
        let row = |i: usize| {
            // SAFETY: row `i < n_w` of `wrb` bytes lies inside `ws` (checked above).
            unsafe { ws.as_ptr().add(i * wrb) }
        };
        stream_rows(n_w, R, |rows| {
            let mut put = |q: usize, res: [f32; R]| {
                for (r, v) in res.into_iter().enumerate() {
                    out[r * n_w + rows[q]] = v;
                }
            };
            if let Ok(rs) = <[usize; STREAMS]>::try_from(rows) {
                // SAFETY: every row is `< n_w`; `arows` hold `ng` groups each.
                let res = unsafe {
                    lrows_block::<F, STREAMS, R>(rs.map(row), arows, nb, last_mask, &idx)
                };
                res.into_iter().enumerate().for_each(|(q, v)| put(q, v));
            } else {
                // SAFETY: as above.
                put(
                    0,
                    unsafe { lrows_block::<F, 1, R>([row(rows[0])], arows, nb, last_mask, &idx) }
                        [0],
                );
            }
        });
    });
}

// ---------------------------------------------------------------------------------------
// The prefill path (4 or more activation rows).
//
// The weight rows of the tile are prepared in blocks of 16 rows, one at a time: for each
// super-block, register `j` (of 64) holds dword `j` of the 256 unsigned values of each of
// the 16 rows (lane = row), beside the rows' scales (i32 lanes), Q4_K mins (i16 pairs) and
// `d`/`dmin` (f32 lanes). An activation row is read as stored: dword `j` of its quants is
// broadcast to all lanes, so `vpdpbusd` accumulates one scale group's exact dot product
// for 16 weight rows at once, `vpmulld` scales it, and the `f32` tail runs on the 16 rows;
// the eight lanes of each (weight row, activation row) accumulator of the scalar twin are
// summed one at a time by [`lanes_tree`] (super-block `b` into lane `b % 8`, in block
// order) and combined by the same tree. No horizontal sum, no activation layout.

/// Weight rows per prepared block (one per 32-bit lane).
const WROWS: usize = 16;

/// One super-block of a block of 16 weight rows, prepared.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct WBlock {
    /// `q[j][row]`: dword `j` of the row's 256 unsigned values (natural order).
    q: [[u32; WROWS]; 64],
    /// `sc[g][row]`: the scale of group `g` (Q4_K: 8 groups of 32, Q6_K: 16 of 16).
    sc: [[i32; WROWS]; 16],
    /// `mins[q][row]`: Q4_K mins `2q` and `2q + 1` as an i16 pair.
    mins: [[u32; WROWS]; 4],
    d: [f32; WROWS],
    dmin: [f32; WROWS],
}

const WBLOCK_ZERO: WBlock = WBlock {
    q: [[0; WROWS]; 64],
    sc: [[0; WROWS]; 16],
    mins: [[0; WROWS]; 4],
    d: [0.0; WROWS],
    dmin: [0.0; WROWS],
};

thread_local! {
    /// Prepared weight blocks, reused across calls on this thread.
    static TBUF: RefCell<Vec<WBlock>> = const { RefCell::new(Vec::new()) };
}

/// Activation rows of the register block.
const RA: usize = super::TILE_RA;

/// Sums the per-block values of `R` activation rows the way the scalar twin does (block
/// `b` into lane `b % 8`, in block order, each lane from zero), then combines each row's
/// eight lanes by [`super::Lanes::finish`]'s tree. `block(b)` is block `b`'s values
/// (16 weight rows per register). The lanes are summed one after another (blocks `j`,
/// `j + 8`, ...), so `R` accumulators are live instead of `8R`: with `8R` (64 for
/// `R = 8`) the array lived on the stack and its zeroing alone took 10% of a Q4_0 prefill
/// (perf, AMD Zen 5).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
fn lanes_tree<const R: usize>(
    nb: usize,
    mut block: impl FnMut(usize) -> [__m512; R],
) -> [__m512i; R] {
    let add = |x: [__m512; R], y: [__m512; R]| -> [__m512; R] {
        std::array::from_fn(|r| _mm512_add_ps(x[r], y[r]))
    };
    // The tree `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))` built as the lanes
    // come, in one loop (so `block` is inlined once, not eight times: unrolled, it was
    // called per block instead).
    let zero = [_mm512_setzero_ps(); R];
    let (mut pair, mut quad, mut half) = (zero, zero, zero);
    for j in 0..8 {
        let mut acc = zero;
        let mut b = j;
        while b < nb {
            let v = block(b);
            for r in 0..R {
                acc[r] = _mm512_add_ps(acc[r], v[r]);
            }
            b += 8;
        }
        pair = if j % 2 == 0 { acc } else { add(pair, acc) };
        match j {
            1 => quad = pair,
            3 => quad = add(quad, pair),
            5 => half = pair,
            7 => half = add(half, pair),
            _ => {}
        }
    }
    add(quad, half).map(|v| _mm512_castps_si512(v))
}

/// Prepares super-block `b` of the weight rows `rows` (at most [`WROWS`]; missing rows
/// are zero) of `ws` (`wrb` bytes per row).
///
/// # Safety
/// Every row in `rows` holds `nb > b` super-blocks of `F` in `ws`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn prep_block<const F: u8>(
    ws: &[u8],
    wrb: usize,
    rows: std::ops::Range<usize>,
    b: usize,
    sidx: &[__m512i; 2],
    out: &mut WBlock,
) {
    if rows.len() < WROWS {
        // The lanes of missing rows are never stored; zeroed so no stale values remain.
        *out = WBLOCK_ZERO;
    }
    // Each row's 256 values in natural order (Q4_K's registers hold chunks [0|2] [1|3]
    // [4|6] [5|7]), then dword `j` of every row gathered into `q[j]`.
    let mut vals = [[0u8; 256]; WROWS];
    let order: [usize; 8] = if F == Q4_K {
        [0, 2, 1, 3, 4, 6, 5, 7]
    } else {
        [0, 1, 2, 3, 4, 5, 6, 7]
    };
    for (l, i) in rows.clone().enumerate() {
        let w = &ws[i * wrb + b * kwb(F)..][..kwb(F)];
        // SAFETY: `w` is one whole super-block.
        let (u, _, _) = unsafe { decode::<F>(w.as_ptr(), sidx) };
        for (h, &c) in order.iter().enumerate() {
            let v = if h % 2 == 0 {
                _mm512_castsi512_si256(u[h / 2])
            } else {
                _mm512_extracti64x4_epi64::<1>(u[h / 2])
            };
            // SAFETY: `vals[l][32c..32c+32]` is 32 writable bytes.
            unsafe { _mm256_storeu_si256(vals[l][32 * c..].as_mut_ptr().cast(), v) };
        }
    }
    let row_at = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(256),
    );
    for (j, q) in out.q.iter_mut().enumerate() {
        let idx = _mm512_add_epi32(row_at, _mm512_set1_epi32(4 * j as i32));
        // SAFETY: every offset `256 l + 4 j + 4 <= 4096` lies inside `vals`; `q` is 64
        // writable bytes.
        unsafe {
            let v = _mm512_i32gather_epi32::<1>(idx, vals.as_ptr().cast());
            _mm512_storeu_si512(q.as_mut_ptr().cast(), v);
        }
    }
    for (l, i) in rows.enumerate() {
        let w = &ws[i * wrb + b * kwb(F)..][..kwb(F)];
        let f16 = |at: usize| half::f16::from_bits(u16::from_le_bytes([w[at], w[at + 1]])).to_f32();
        if F == Q4_K {
            let (sc, mn) = crate::dot::k4_scales_mins(&w[4..16]);
            for (dst, &v) in out.sc.iter_mut().zip(&sc) {
                dst[l] = i32::from(v);
            }
            for q in 0..4 {
                out.mins[q][l] = u32::from(mn[2 * q]) | (u32::from(mn[2 * q + 1]) << 16);
            }
            out.d[l] = f16(0);
            out.dmin[l] = f16(2);
        } else {
            for g in 0..16 {
                out.sc[g][l] = i32::from(w[192 + g] as i8);
            }
            out.d[l] = f16(208);
        }
    }
}

/// A block of 16 prepared weight rows (`w`: `nb` super-blocks) against `R` activation
/// rows (`a[r]`: raw Q8_K rows, `e[r]`: their extras): `res[r]` lane `row`.
///
/// # Safety
/// `w` addresses `nb` blocks, each `a[r]` `nb` Q8_K blocks, each `e[r]` `nb` extras.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn block_rows<const F: u8, const R: usize>(
    w: *const WBlock,
    a: [*const u8; R],
    e: [*const KExtra; R],
    nb: usize,
) -> [__m512i; R] {
    let ld = |p: *const u32| {
        // SAFETY: every caller passes a 64-byte row of a prepared block.
        unsafe { _mm512_loadu_si512(p.cast()) }
    };
    // Groups per super-block and dwords per group.
    let (ngr, per) = if F == Q4_K { (8, 8) } else { (16, 4) };
    lanes_tree::<R>(nb, |b| {
        // SAFETY: block `b < nb` (caller).
        let wb = unsafe { &*w.add(b) };
        // SAFETY: as above, for the activation rows.
        let (ab, eb) = unsafe { (a.map(|p| p.add(b * KAB)), e.map(|p| &*p.add(b))) };
        let mut s = [_mm512_setzero_si512(); R];
        for g in 0..ngr {
            let mut d: [__m512i; R] = std::array::from_fn(|r| {
                if F == Q4_K {
                    _mm512_setzero_si512()
                } else {
                    _mm512_set1_epi32(eb[r].init[g])
                }
            });
            for jj in 0..per {
                let j = g * per + jj;
                let wv = ld(wb.q[j].as_ptr());
                for r in 0..R {
                    // SAFETY: dword `j` of the quants is at byte 4 + 4j of the block.
                    let y = unsafe { ab[r].add(4 + 4 * j).cast::<i32>().read_unaligned() };
                    d[r] = _mm512_dpbusd_epi32(d[r], wv, _mm512_set1_epi32(y));
                }
            }
            let sc = ld(wb.sc[g].as_ptr().cast());
            for r in 0..R {
                s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(d[r], sc));
            }
        }
        let dw = _mm512_loadu_ps(wb.d.as_ptr());
        std::array::from_fn(|r| {
            let dx = _mm512_set1_ps(eb[r].d);
            let v = _mm512_mul_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(s[r]));
            if F != Q4_K {
                return v;
            }
            let mut m = _mm512_setzero_si512();
            for q in 0..4 {
                let mq = ld(wb.mins[q].as_ptr());
                m = _mm512_dpwssd_epi32(m, mq, _mm512_set1_epi32(eb[r].pairs[q] as i32));
            }
            let dm = _mm512_loadu_ps(wb.dmin.as_ptr());
            _mm512_sub_ps(
                v,
                _mm512_mul_ps(_mm512_mul_ps(dx, dm), _mm512_cvtepi32_ps(m)),
            )
        })
    })
}

/// The prefill path as a contiguous tile (`dot_tile`): the activation extras computed
/// here, the results stored in `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn tile<const F: u8>(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
    let ex = KRows::<F>::prepared(acts, n_a);
    tile_prepared::<F>(ws, n_w, acts, n_a, &ex, &mut |r, i, v| {
        out[r * n_w + i..][..v.len()].copy_from_slice(v)
    });
}

/// The format family of a prefill tile: its prepared block of 16 weight rows, its
/// activation rows' extras and block bytes, and the products of one prepared block with
/// `R` activation rows ([`block_rows`] for the K-quants, [`lblock_rows`] for the legacy
/// formats). [`tile_with`] is the one body both run in.
trait TileRows {
    type Blk: Copy;
    /// What [`super::ActPrep`] holds for this family (`KExtra` per Q8_K block, or the
    /// legacy layout's bytes).
    type Prep: Clone;
    /// The activation rows as [`Self::rows`] reads them (raw pointers into the rows and
    /// their preparation, checked by [`Self::src`]).
    type Src: Copy;
    /// A prepared block with every lane zero.
    const ZERO: Self::Blk;
    /// `n_a` activation rows (`acts`, back to back) prepared.
    fn prepared(acts: &[u8], n_a: usize) -> Vec<Self::Prep>;
    /// The rows `acts` (`n_a` rows of `nb` blocks) and their preparation `prep` as
    /// [`Self::rows`] reads them.
    ///
    /// # Panics
    /// If the lengths do not match.
    fn src(acts: &[u8], n_a: usize, nb: usize, prep: &[Self::Prep]) -> Self::Src;
    /// Register block `(r0, R)` of [`super::tile_row_groups`] against 16 prepared weight
    /// rows (`w`: `nb` blocks): `res[r]` lane `row`.
    ///
    /// # Safety
    /// `src` from [`Self::src`] with the same `nb`, `r0 + R` within its rows; `w`
    /// addresses `nb` blocks; AVX-512 F/BW/VL + VNNI detected.
    unsafe fn rows<const R: usize>(
        w: *const Self::Blk,
        src: Self::Src,
        r0: usize,
        nb: usize,
    ) -> [__m512i; R];
    /// Bytes of one packed block (eight rows, `super::pack`).
    const PACKED: usize;
    /// A block of 16 rows prepared from packed blocks `pa` (rows 0..8) and `pb` (8..16).
    ///
    /// # Safety
    /// Each pointer addresses [`Self::PACKED`] readable bytes; AVX-512 detected.
    unsafe fn prep_packed(pa: *const u8, pb: *const u8, out: &mut Self::Blk);
}

/// [`KRows`]' activation rows: raw Q8_K rows (`ab` bytes each) and their extras.
#[derive(Clone, Copy)]
struct KSrc {
    acts: *const u8,
    ab: usize,
    ex: *const KExtra,
}

/// The K-quants' tile family (format `F`: Q4_K, Q6_K).
struct KRows<const F: u8>;

impl<const F: u8> TileRows for KRows<F> {
    type Blk = WBlock;
    type Prep = KExtra;
    type Src = KSrc;
    const ZERO: WBlock = WBLOCK_ZERO;
    fn prepared(acts: &[u8], _: usize) -> Vec<KExtra> {
        acts.chunks_exact(KAB).map(KExtra::of).collect()
    }
    fn src(acts: &[u8], n_a: usize, nb: usize, prep: &[KExtra]) -> KSrc {
        assert!(
            acts.len() == n_a * nb * KAB && prep.len() == n_a * nb,
            "tile activations"
        );
        KSrc {
            acts: acts.as_ptr(),
            ab: nb * KAB,
            ex: prep.as_ptr(),
        }
    }
    #[inline(always)]
    unsafe fn rows<const R: usize>(
        w: *const WBlock,
        src: KSrc,
        r0: usize,
        nb: usize,
    ) -> [__m512i; R] {
        let rr: [usize; R] = std::array::from_fn(|q| r0 + q);
        // SAFETY: rows `r0 .. r0 + R` are within `src` (caller), each `ab` bytes and `nb`
        // extras; the caller's bounds and ISA for the rest.
        unsafe {
            let a = rr.map(|r| src.acts.add(r * src.ab));
            let e = rr.map(|r| src.ex.add(r * nb));
            block_rows::<F, R>(w, a, e, nb)
        }
    }
    const PACKED: usize = if F == Q4_K { Q4K_BYTES } else { Q6K_BYTES };
    #[inline(always)]
    unsafe fn prep_packed(pa: *const u8, pb: *const u8, out: &mut WBlock) {
        // SAFETY: the caller's bounds and ISA.
        unsafe { kprep_packed::<F>(pa, pb, out) }
    }
}

/// The legacy formats' tile family (format `F`: Q4_0 .. Q8_0).
struct LRows<const F: u8>;

impl<const F: u8> TileRows for LRows<F> {
    type Blk = LBlock;
    type Prep = u8;
    type Src = *const u8;
    const ZERO: LBlock = LBLOCK_ZERO;
    fn prepared(acts: &[u8], n_a: usize) -> Vec<u8> {
        interleave_q8_0(acts, n_a)
    }
    fn src(acts: &[u8], n_a: usize, nb: usize, prep: &[u8]) -> *const u8 {
        assert!(
            acts.len() == n_a * nb * LAB && prep.len() == n_a * nb * LI,
            "tile activations"
        );
        prep.as_ptr()
    }
    #[inline(always)]
    unsafe fn rows<const R: usize>(
        w: *const LBlock,
        src: *const u8,
        r0: usize,
        nb: usize,
    ) -> [__m512i; R] {
        // SAFETY: register block (r0, R) starts `r0 * nb * LI` bytes in (`interleave_q8_0`);
        // the caller's bounds and ISA.
        unsafe { lblock_rows::<F, R>(w, src.add(r0 * nb * LI), nb) }
    }
    const PACKED: usize = Legacy::of(legacy_type(F)).bytes;
    #[inline(always)]
    unsafe fn prep_packed(pa: *const u8, pb: *const u8, out: &mut LBlock) {
        // SAFETY: the caller's bounds and ISA.
        unsafe { lprep_packed::<F>(pa, pb, out) }
    }
}

/// The prefill path: `n_w` weight rows of `nb` (super-)blocks, prepared by `prep(k, b,
/// out)` (block `b` of weight rows `16k..16k + 16` into `out`; missing rows' lanes zero or
/// anything finite: they are never stored), against every activation row (`acts`: raw
/// rows of `T::AB`-byte blocks; `ex`: their extras, one per block), results to `sink`.
/// Each block of 16 rows is prepared into `wp` just before every activation row meets it,
/// so it stays in cache (`nb` blocks), then the activation rows go through in register
/// blocks of [`RA`], 4, 2 and 1. The one body of the stored and packed tiles of both
/// families.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn tile_with<T: TileRows>(
    wp: &mut Vec<T::Blk>,
    n_w: usize,
    nb: usize,
    n_a: usize,
    src: T::Src,
    sink: &mut TileSink<'_>,
    mut prep: impl FnMut(usize, usize, &mut T::Blk),
) {
    assert!(n_w > 0 && n_a > 0 && nb > 0, "tile shape");
    if wp.len() < nb {
        wp.resize(nb, T::ZERO);
    }
    let mut lanes = [0f32; WROWS];
    let mut store = |r: usize, k: usize, v: __m512i| {
        // SAFETY: `lanes` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), v) };
        let i0 = k * WROWS;
        sink(r, i0, &lanes[..(n_w - i0).min(WROWS)]);
    };
    for k in 0..n_w.div_ceil(WROWS) {
        for (b, out) in wp[..nb].iter_mut().enumerate() {
            prep(k, b, out);
        }
        let w = wp.as_ptr();
        for (r0, g) in tile_row_groups(n_a) {
            macro_rules! run {
                ($n:expr) => {{
                    // SAFETY: `w` holds `nb` prepared blocks; `src` was checked for `n_a`
                    // rows of `nb` blocks (the caller, `T::src`) and `r0 + $n <= n_a`;
                    // the ISA is this function's.
                    let res = unsafe { T::rows::<$n>(w, src, r0, nb) };
                    for (q, v) in res.into_iter().enumerate() {
                        store(r0 + q, k, v);
                    }
                }};
            }
            match g {
                RA => run!(RA),
                4 => run!(4),
                2 => run!(2),
                _ => run!(1),
            }
        }
    }
}

/// The K-quant prefill path on stored rows (`ws`: `n_w` rows): every weight row against
/// every activation row (`ex`: the rows' extras, one per super-block), results to `sink`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn tile_prepared<const F: u8>(
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    ex: &[KExtra],
    sink: &mut TileSink<'_>,
) {
    assert!(n_w > 0, "tile shape");
    let wrb = ws.len() / n_w;
    let nb = wrb / kwb(F);
    assert!(wrb * n_w == ws.len() && nb * kwb(F) == wrb, "tile lengths");
    let sidx = if F == Q4_K {
        &Q4K_SCALE_IDX
    } else {
        &Q6K_SCALE_IDX
    }
    .map(|i| idx_vec(&i));
    TBUF.with_borrow_mut(|wp| {
        let src = KRows::<F>::src(acts, n_a, nb, ex);
        tile_with::<KRows<F>>(wp, n_w, nb, n_a, src, sink, |k, b, out| {
            let rows = k * WROWS..((k + 1) * WROWS).min(n_w);
            // SAFETY: every row `< n_w` holds `nb` super-blocks (checked above).
            unsafe { prep_block::<F>(ws, wrb, rows, b, &sidx, out) };
        })
    });
}

// ---------------------------------------------------------------------------------------
// The legacy formats' prefill path: as the K-quants' (lanes = 16 weight rows, activation
// dwords broadcast), one 32-value block per scale: eight `vpdpbusd` from `-c Σy`, then
// `block_sym` on the 16 rows.

/// One block of a block of 16 legacy weight rows, prepared.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct LBlock {
    /// `q[j][row]`: dword `j` of the row's 32 unsigned values.
    q: [[u32; WROWS]; 8],
    d: [f32; WROWS],
    /// The formats with a min: the rows' mins.
    m: [f32; WROWS],
}

const LBLOCK_ZERO: LBlock = LBlock {
    q: [[0; WROWS]; 8],
    d: [0.0; WROWS],
    m: [0.0; WROWS],
};

thread_local! {
    /// Prepared legacy weight blocks, reused across calls on this thread.
    static LTBUF: RefCell<Vec<LBlock>> = const { RefCell::new(Vec::new()) };
}

/// Stored bytes of a missing weight row of a partial block of 16 (its lanes are never
/// stored).
static LZERO_ROW: [u8; 34] = [0; 34];

/// The 16 bytes at `off` of 16 weight blocks (`w[l]`: row `l`'s block), transposed:
/// lane `l` of register `j` is dword `j` of row `l`. The rows are loaded four to a
/// register (`[row r | row r + 4 | row r + 8 | row r + 12]`, `r` = 0..4) and each
/// 128-bit chunk `c` transposed 4 × 4, which puts rows `4c..4c + 4` in lanes `4c..4c + 4`.
///
/// # Safety
/// Each `w[l] + off` addresses 16 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn ltranspose16(w: &[*const u8; WROWS], off: usize) -> [__m512i; 4] {
    let z: [__m512i; 4] = std::array::from_fn(|r| {
        // SAFETY: 16 readable bytes at each `w[l] + off` (caller).
        let ld = |l: usize| unsafe { _mm_loadu_si128(w[l].add(off).cast()) };
        let v = _mm512_castsi128_si512(ld(r));
        let v = _mm512_inserti32x4::<1>(v, ld(r + 4));
        let v = _mm512_inserti32x4::<2>(v, ld(r + 8));
        _mm512_inserti32x4::<3>(v, ld(r + 12))
    });
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// The f16 at byte `off` of 16 weight blocks, widened exactly (lane `l`: row `l`).
///
/// # Safety
/// Each `w[l] + off` addresses 2 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn lf16x16(w: &[*const u8; WROWS], off: usize) -> __m512 {
    // SAFETY: 2 readable bytes at each `w[l] + off` (caller).
    let h: [u16; WROWS] =
        std::array::from_fn(|l| unsafe { w[l].add(off).cast::<u16>().read_unaligned() });
    // SAFETY: `h` is 32 readable bytes.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(h.as_ptr().cast()) })
}

/// One block of 16 legacy weight rows (`w[l]`: row `l`'s stored block) prepared: `q[j]`
/// lane `l` is dword `j` of row `l`'s 32 unsigned values (`q + c`: values `4j..4j + 4`
/// of the twin's order), `d`/`m` the rows' scales and mins widened. The 4-bit formats'
/// dword `j < 4` is the low nibbles of stored dword `j`, dword `j + 4` its high nibbles;
/// the 5-bit formats add bit `4j + t` of the row's high bits as bit 4 of byte `t` of
/// dword `j` (its value is `4j + t`, or `16 + 4(j - 4) + t`, the same bit, for `j >= 4`);
/// Q8_0 flips the sign bits (`x + 128`).
///
/// # Safety
/// Each `w[l]` addresses one whole stored block of `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn lprep_block<const F: u8>(w: &[*const u8; WROWS], out: &mut LBlock) {
    let mut q = [_mm512_setzero_si512(); 8];
    if F == Q8_0 {
        let sign = _mm512_set1_epi8(-128);
        // SAFETY: a Q8_0 block's quants are its bytes 2..34 (caller).
        let (lo, hi) = unsafe { (ltranspose16(w, 2), ltranspose16(w, 18)) };
        for j in 0..4 {
            q[j] = _mm512_xor_si512(lo[j], sign);
            q[j + 4] = _mm512_xor_si512(hi[j], sign);
        }
    } else {
        let m4 = _mm512_set1_epi8(0x0F);
        // SAFETY: the 16 nibble bytes lie at `lqs_at(F)` of the block (caller).
        let t = unsafe { ltranspose16(w, lqs_at(F)) };
        for j in 0..4 {
            q[j] = _mm512_and_si512(t[j], m4);
            q[j + 4] = _mm512_and_si512(_mm512_srli_epi32::<4>(t[j]), m4);
        }
        if matches!(F, Q5_0 | Q5_1) {
            // SAFETY: the 32 high bits lie at `lqh_at(F)` of the block (caller).
            let h: [u32; WROWS] = std::array::from_fn(|l| unsafe {
                w[l].add(lqh_at(F)).cast::<u32>().read_unaligned()
            });
            // SAFETY: `h` is 64 readable bytes.
            let h = unsafe { _mm512_loadu_si512(h.as_ptr().cast()) };
            let bit = |x: __m512i, m: i32| _mm512_and_si512(x, _mm512_set1_epi32(m));
            for (j, qj) in q.iter_mut().enumerate() {
                let x = _mm512_srlv_epi32(h, _mm512_set1_epi32(4 * j as i32));
                // Bit t of x to bit 4 of byte t.
                let hb = _mm512_or_si512(
                    _mm512_or_si512(
                        _mm512_slli_epi32::<4>(bit(x, 1)),
                        _mm512_slli_epi32::<11>(bit(x, 2)),
                    ),
                    _mm512_or_si512(
                        _mm512_slli_epi32::<18>(bit(x, 4)),
                        _mm512_slli_epi32::<25>(bit(x, 8)),
                    ),
                );
                *qj = _mm512_or_si512(*qj, hb);
            }
        }
    }
    for (j, qj) in q.into_iter().enumerate() {
        // SAFETY: `out.q[j]` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(out.q[j].as_mut_ptr().cast(), qj) };
    }
    // SAFETY: the scale is the block's first f16, the min (if any) its second (caller).
    unsafe {
        _mm512_storeu_ps(out.d.as_mut_ptr(), lf16x16(w, 0));
        if lmin(F) {
            _mm512_storeu_ps(out.m.as_mut_ptr(), lf16x16(w, 2));
        }
    }
}

/// `log2(c / 8)` for format `f`'s offset `c` ([`loff`]: 8, 16 or 128), the shift that
/// turns the prepared `-8 Σy` into `-c Σy` (0 for the min formats, whose `c` is 0).
const fn loff_shift(f: u8) -> i32 {
    let c = loff(f);
    assert!(
        c == 0 || (c % 8 == 0 && (c / 8).count_ones() == 1),
        "offset 8 << k"
    );
    if c == 0 {
        0
    } else {
        (c / 8).trailing_zeros() as i32
    }
}

/// A block of 16 prepared legacy weight rows (`w`: `nb` blocks) against the `R`
/// activation rows of one register block of [`interleave_q8_0`]'s layout (`a`: its first
/// byte): `res[r]` lane `row`.
///
/// Per block and row: `-c Σy` is the prepared `-8 Σy` shifted by `log2(c / 8)` (equal
/// to the product in two's complement), `Σy` for the min formats that value shifted back
/// arithmetically and negated (exact: a multiple of 8); then the twin's `block_sym` /
/// `block_min` operations.
///
/// # Safety
/// `w` addresses `nb` blocks; `a` the `nb * R * LI` bytes of a register block of `R` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn lblock_rows<const F: u8, const R: usize>(
    w: *const LBlock,
    a: *const u8,
    nb: usize,
) -> [__m512i; R] {
    lanes_tree::<R>(nb, |b| {
        // SAFETY: block `b < nb` (caller).
        let wb = unsafe { &*w.add(b) };
        // SAFETY: as above: block `b` of the register block is `R * LI` bytes at
        // `b * R * LI`: the rows' quants, then their (scale, -8 Σy) pairs.
        let ab = unsafe { a.add(b * R * LI) };
        let ex = |r: usize, at: usize| {
            // SAFETY: row `r < R`'s extras are 8 bytes at `32 R + 8 r` of the block.
            unsafe { ab.add(32 * R + 8 * r + at).cast::<i32>().read_unaligned() }
        };
        let n8: [__m512i; R] = std::array::from_fn(|r| _mm512_set1_epi32(ex(r, 4)));
        // Two accumulators per row (even and odd dwords), added at the end (exact in
        // `i32`): chains of four `vpdpbusd` instead of eight.
        let mut d: [[__m512i; R]; 2] = [
            n8.map(|v| {
                if loff(F) == 0 {
                    _mm512_setzero_si512()
                } else {
                    _mm512_sll_epi32(v, _mm_cvtsi32_si128(const { loff_shift(F) }))
                }
            }),
            [_mm512_setzero_si512(); R],
        ];
        for j in 0..8 {
            // SAFETY: `q[j]` is 64 readable bytes.
            let wv = unsafe { _mm512_loadu_si512(wb.q[j].as_ptr().cast()) };
            for (r, dr) in d[j % 2].iter_mut().enumerate() {
                // SAFETY: dword `j` of row `r`'s quants is at byte `32 r + 4 j`.
                let y = unsafe { ab.add(32 * r + 4 * j).cast::<i32>().read_unaligned() };
                *dr = _mm512_dpbusd_epi32(*dr, wv, _mm512_set1_epi32(y));
            }
        }
        let d: [__m512i; R] = std::array::from_fn(|r| _mm512_add_epi32(d[0][r], d[1][r]));
        let dw = _mm512_loadu_ps(wb.d.as_ptr());
        let mw = _mm512_loadu_ps(wb.m.as_ptr());
        std::array::from_fn(|r| {
            let dx = _mm512_set1_ps(f32::from_bits(ex(r, 0) as u32));
            let v = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(d[r]));
            if !lmin(F) {
                return v;
            }
            let ysum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_srai_epi32::<3>(n8[r]));
            let ys = _mm512_cvtepi32_ps(ysum);
            _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(mw, dx), ys))
        })
    })
}

/// The legacy prefill path on stored rows (`ws`: `n_w` rows) against `n_a` activation
/// rows (`acts`) prepared as `prep` ([`interleave_q8_0`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn ltile_prepared<const F: u8>(
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    prep: &[u8],
    sink: &mut TileSink<'_>,
) {
    assert!(n_w > 0, "tile shape");
    let wrb = ws.len() / n_w;
    let nb = wrb / lwb(F);
    assert!(wrb * n_w == ws.len() && nb * lwb(F) == wrb, "tile lengths");
    LTBUF.with_borrow_mut(|wp| {
        let src = LRows::<F>::src(acts, n_a, nb, prep);
        tile_with::<LRows<F>>(wp, n_w, nb, n_a, src, sink, |k, b, out| {
            let rows = k * WROWS..((k + 1) * WROWS).min(n_w);
            let mut w = [LZERO_ROW.as_ptr(); WROWS];
            for (l, i) in rows.enumerate() {
                w[l] = ws[i * wrb + b * lwb(F)..][..lwb(F)].as_ptr();
            }
            // SAFETY: each `w[l]` is one whole stored block (a row's, or LZERO_ROW: 34 bytes,
            // no legacy block is longer).
            unsafe { lprep_block::<F>(&w, out) };
        })
    });
}

/// The 32 bytes at `off` of the packed blocks `pa` (rows 0..8) and `pb` (rows 8..16) as
/// one register: a packed 32-byte field holds eight rows' dwords in row order, so the
/// pair is 16 row lanes.
///
/// # Safety
/// 32 readable bytes at `pa + off` and `pb + off`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn packed_pair32(pa: *const u8, pb: *const u8, off: usize) -> __m512i {
    // SAFETY: the caller's bounds.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(pa.add(off).cast())),
            _mm256_loadu_si256(pb.add(off).cast()),
        )
    }
}

/// The 16 bytes at `off` of `pa` and of `pb` side by side (eight rows' f16 scales, or
/// byte pairs, of each block).
///
/// # Safety
/// 16 readable bytes at `pa + off` and `pb + off`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn packed_pair16(pa: *const u8, pb: *const u8, off: usize) -> __m256i {
    // SAFETY: the caller's bounds.
    unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(pa.add(off).cast())),
            _mm_loadu_si128(pb.add(off).cast()),
        )
    }
}

/// One block of 16 packed legacy weight rows prepared as [`lprep_block`] prepares stored
/// ones, from the packed blocks `pa` (rows 0..8) and `pb` (rows 8..16) of
/// `super::pack`'s layout, whose 32-byte fields already hold eight rows' dwords in row
/// order: step `s` of both is one register, which for the 4-bit formats is dword `s`
/// (low nibbles) and `s + 4` (high nibbles), for Q8_0 dword `s`; the packed high bits'
/// bit `j` of byte `t` is the fifth bit of byte `t` of dword `j`.
///
/// # Safety
/// `pa` and `pb` each address one whole packed block of `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn lprep_packed<const F: u8>(pa: *const u8, pb: *const u8, out: &mut LBlock) {
    let l = const { Legacy::of(legacy_type(F)) };
    // SAFETY: every offset below is a field of both packed blocks (caller).
    let two = |off: usize| unsafe { packed_pair32(pa, pb, off) };
    // SAFETY: as above, 16 bytes of f16 per block.
    let f16s = |off: usize| _mm512_cvtph_ps(unsafe { packed_pair16(pa, pb, off) });
    let mut q = [_mm512_setzero_si512(); 8];
    if F == Q8_0 {
        let sign = _mm512_set1_epi8(-128);
        for (s, qs) in q.iter_mut().enumerate() {
            *qs = _mm512_xor_si512(two(l.qs + 32 * s), sign);
        }
    } else {
        let m4 = _mm512_set1_epi8(0x0F);
        for s in 0..4 {
            let v = two(l.qs + 32 * s);
            q[s] = _mm512_and_si512(v, m4);
            q[s + 4] = _mm512_and_si512(_mm512_srli_epi32::<4>(v), m4);
        }
        if let Some(h) = l.qh {
            let h = two(h);
            let one = _mm512_set1_epi8(1);
            for (j, qj) in q.iter_mut().enumerate() {
                let bit = _mm512_and_si512(_mm512_srl_epi32(h, _mm_cvtsi32_si128(j as i32)), one);
                *qj = _mm512_or_si512(*qj, _mm512_slli_epi32::<4>(bit));
            }
        }
    }
    for (j, qj) in q.into_iter().enumerate() {
        // SAFETY: `out.q[j]` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(out.q[j].as_mut_ptr().cast(), qj) };
    }
    // SAFETY: `out.d` and `out.m` are 64 writable bytes each.
    unsafe {
        _mm512_storeu_ps(out.d.as_mut_ptr(), f16s(0));
        if let Some(m) = l.m {
            _mm512_storeu_ps(out.m.as_mut_ptr(), f16s(m));
        }
    }
}

/// Zero bytes standing for the packed block of a missing second group of a block of 16
/// rows (as long as the longest packed block, Q6_K's; its lanes are never stored).
static ZERO_PACKED: [u8; Q6K_BYTES] = [0; Q6K_BYTES];

/// The tile on packed groups `g0 .. g0 + n_g` of `p` (rows clipped to `p.rows()`) against
/// `n_a` raw activation rows with their preparation `prep` (made here when empty):
/// `sink(r, i, values)` as [`Packed::dot_groups`]. Two groups make one block of 16 rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn tile_packed<T: TileRows>(
    wp: &mut Vec<T::Blk>,
    p: &Packed,
    g0: usize,
    n_g: usize,
    acts: &[u8],
    n_a: usize,
    prep: &[T::Prep],
    sink: &mut TileSink<'_>,
) {
    let (pb, nb) = p.geometry();
    let data = p.data();
    assert!(
        pb == T::PACKED && (g0 + n_g) * nb * pb <= data.len(),
        "packed groups"
    );
    let n_w = ((g0 + n_g) * GROUP).min(p.rows()) - g0 * GROUP;
    let own: Vec<T::Prep>;
    let prep = if prep.is_empty() {
        own = T::prepared(acts, n_a);
        &own
    } else {
        prep
    };
    let src = T::src(acts, n_a, nb, prep);
    tile_with::<T>(wp, n_w, nb, n_a, src, sink, |k, b, out| {
        let block = |g: usize| {
            if g < g0 + n_g {
                data[(g * nb + b) * pb..][..pb].as_ptr()
            } else {
                ZERO_PACKED.as_ptr()
            }
        };
        let g = g0 + 2 * k;
        // SAFETY: each pointer is one whole packed block (of the matrix, or zeros); the
        // ISA is this function's.
        unsafe { T::prep_packed(block(g), block(g + 1), out) };
    });
}

/// The tile on packed groups for `ty` (Q4_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), as
/// [`tile_packed`], reading the activation extras of `prep` (`ActPrep::k` or `::l`).
/// Callers must have detected [`super::Isa::Avx512Vnni`].
pub(super) fn packed_tile_kernel(ty: GgmlType) -> Option<PackedTileFn> {
    use GgmlType as T;
    macro_rules! k {
        ($f:expr) => {
            |p, g0, n, a, na, prep, sink| {
                // SAFETY: handed out only after run-time detection (module doc).
                TBUF.with_borrow_mut(|wp| unsafe {
                    tile_packed::<KRows<$f>>(wp, p, g0, n, a, na, &prep.k, sink)
                })
            }
        };
    }
    macro_rules! l {
        ($f:expr) => {
            |p, g0, n, a, na, prep, sink| {
                // SAFETY: handed out only after run-time detection (module doc).
                LTBUF.with_borrow_mut(|wp| unsafe {
                    tile_packed::<LRows<$f>>(wp, p, g0, n, a, na, &prep.l, sink)
                })
            }
        };
    }
    Some(match ty {
        T::Q4_K => k!(Q4_K),
        T::Q6_K => k!(Q6_K),
        T::Q4_0 => l!(Q4_0),
        T::Q4_1 => l!(Q4_1),
        T::Q5_0 => l!(Q5_0),
        T::Q5_1 => l!(Q5_1),
        T::Q8_0 => l!(Q8_0),
        _ => return None,
    })
}

/// The signature of [`packed_tile_kernel`]'s kernels.
pub(super) type PackedTileFn =
    fn(&Packed, usize, usize, &[u8], usize, &super::ActPrep, &mut TileSink<'_>);

/// One super-block of 16 packed K-quant rows prepared as [`prep_block`] prepares stored
/// ones, from the packed blocks `pa` (rows 0..8) and `pb` (rows 8..16) of `super::pack`'s
/// layout, whose fields already hold eight rows in row order: the quants of chunk `c`,
/// step `s` of both are one register whose low nibbles are dword `8c + s` and high
/// nibbles dword `8c + 4 + s` (Q6_K: plus bits `2s..2s + 2` of the chunk's two high-bit
/// halves as bits 4-5); Q4_K's u8 scales widened to i32 lanes and its mins pairs to i16
/// pairs; Q6_K's i8 scale pairs `(2c, 2c + 1)` split into two i32 lanes each.
///
/// # Safety
/// `pa` and `pb` each address one whole packed block of `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
#[inline]
unsafe fn kprep_packed<const F: u8>(pa: *const u8, pb: *const u8, out: &mut WBlock) {
    // SAFETY (whole body): every offset below is a field of both packed blocks (caller,
    // `super::pack`'s offsets); every store is to a 64-byte row of `out`.
    unsafe {
        let two = |off: usize| packed_pair32(pa, pb, off);
        let two16 = |off: usize| packed_pair16(pa, pb, off);
        let st =
            |dst: &mut [u32; WROWS], v: __m512i| _mm512_storeu_si512(dst.as_mut_ptr().cast(), v);
        let m4 = _mm512_set1_epi8(0x0F);
        if F == Q4_K {
            for c in 0..8 {
                for s in 0..4 {
                    let v = two(Q4K_QS + 128 * c + 32 * s);
                    st(&mut out.q[8 * c + s], _mm512_and_si512(v, m4));
                    st(
                        &mut out.q[8 * c + 4 + s],
                        _mm512_and_si512(_mm512_srli_epi32::<4>(v), m4),
                    );
                }
                let sc = _mm_unpacklo_epi64(
                    _mm_loadl_epi64(pa.add(Q4K_SCALES + 8 * c).cast()),
                    _mm_loadl_epi64(pb.add(Q4K_SCALES + 8 * c).cast()),
                );
                _mm512_storeu_si512(out.sc[c].as_mut_ptr().cast(), _mm512_cvtepu8_epi32(sc));
            }
            for (pair, m) in out.mins.iter_mut().enumerate() {
                st(m, _mm512_cvtepu8_epi16(two16(Q4K_MINS + 16 * pair)));
            }
            _mm512_storeu_ps(out.d.as_mut_ptr(), _mm512_cvtph_ps(two16(0)));
            _mm512_storeu_ps(out.dmin.as_mut_ptr(), _mm512_cvtph_ps(two16(Q4K_DMIN)));
        } else {
            let m3 = _mm512_set1_epi8(3);
            for c in 0..8 {
                let h = [two(Q6K_QH + 64 * c), two(Q6K_QH + 64 * c + 32)];
                for s in 0..4 {
                    let v = two(128 * c + 32 * s);
                    let high = |half: usize| {
                        let bits = _mm512_srlv_epi32(h[half], _mm512_set1_epi32(2 * s as i32));
                        _mm512_slli_epi32::<4>(_mm512_and_si512(bits, m3))
                    };
                    let lo = _mm512_or_si512(_mm512_and_si512(v, m4), high(0));
                    let hi =
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(v), m4), high(1));
                    st(&mut out.q[8 * c + s], lo);
                    st(&mut out.q[8 * c + 4 + s], hi);
                }
                // i16 lanes: (scale 2c, scale 2c + 1) of each row.
                let w = _mm512_cvtepi8_epi16(two16(Q6K_SCALES + 16 * c));
                let even = _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(w));
                _mm512_storeu_si512(out.sc[2 * c].as_mut_ptr().cast(), even);
                _mm512_storeu_si512(
                    out.sc[2 * c + 1].as_mut_ptr().cast(),
                    _mm512_srai_epi32::<16>(w),
                );
            }
            _mm512_storeu_ps(out.d.as_mut_ptr(), _mm512_cvtph_ps(two16(Q6K_D)));
        }
    }
}

/// The legacy prefill path as a contiguous tile (`dot_tile`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn ltile<const F: u8>(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
    let prep = LRows::<F>::prepared(acts, n_a);
    ltile_prepared::<F>(ws, n_w, acts, n_a, &prep, &mut |r, i, v| {
        out[r * n_w + i..][..v.len()].copy_from_slice(v)
    });
}

/// The prefill kernel on prepared activations for `ty` (Q4_K, Q6_K, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0). Callers must have detected [`super::Isa::Avx512Vnni`].
pub(super) fn tile_prep_kernel(ty: GgmlType) -> Option<TilePrepFn> {
    use GgmlType as T;
    Some(match ty {
        // SAFETY: handed out only after run-time detection (module doc).
        T::Q4_K => {
            |w, nw, a, na, p, sink| unsafe { tile_prepared::<Q4_K>(w, nw, a, na, &p.k, sink) }
        }
        // SAFETY: as above.
        T::Q6_K => {
            |w, nw, a, na, p, sink| unsafe { tile_prepared::<Q6_K>(w, nw, a, na, &p.k, sink) }
        }
        // SAFETY: as above.
        T::Q4_0 => {
            |w, nw, a, na, p, sink| unsafe { ltile_prepared::<Q4_0>(w, nw, a, na, &p.l, sink) }
        }
        // SAFETY: as above.
        T::Q4_1 => {
            |w, nw, a, na, p, sink| unsafe { ltile_prepared::<Q4_1>(w, nw, a, na, &p.l, sink) }
        }
        // SAFETY: as above.
        T::Q5_0 => {
            |w, nw, a, na, p, sink| unsafe { ltile_prepared::<Q5_0>(w, nw, a, na, &p.l, sink) }
        }
        // SAFETY: as above.
        T::Q5_1 => {
            |w, nw, a, na, p, sink| unsafe { ltile_prepared::<Q5_1>(w, nw, a, na, &p.l, sink) }
        }
        // SAFETY: as above.
        T::Q8_0 => {
            |w, nw, a, na, p, sink| unsafe { ltile_prepared::<Q8_0>(w, nw, a, na, &p.l, sink) }
        }
        _ => return None,
    })
}

/// The 512-bit tile kernel for `ty`: the K-quants' decode path for 1 to 8 activation
/// rows and prefill beyond; the legacy formats' decode path for 1 to 3 rows, `x86_tile`'s
/// small-batch kernels for 4 to 8, prefill beyond. Callers must have detected
/// [`super::Isa::Avx512Vnni`].
pub(super) fn tile_kernel(ty: GgmlType) -> Option<TileFn> {
    use GgmlType as T;
    macro_rules! legacy {
        ($f:expr, $t:expr) => {
            |w, nw, a, na, out| match na {
                // SAFETY: handed out only after run-time detection (module doc).
                1 => unsafe { lgemv::<$f, 1>(w, nw, a, na, out) },
                // SAFETY: as above.
                2 => unsafe { lgemv::<$f, 2>(w, nw, a, na, out) },
                // SAFETY: as above.
                3 => unsafe { lgemv::<$f, 3>(w, nw, a, na, out) },
                4..=8 => legacy_fallback($t)(w, nw, a, na, out),
                // SAFETY: as above.
                _ => unsafe { ltile::<$f>(w, nw, a, na, out) },
            }
        };
    }
    macro_rules! kquant {
        ($f:expr) => {
            |w, nw, a, na, out| match na {
                // SAFETY: handed out only after run-time detection (module doc).
                1 => unsafe { gemv::<$f, 1>(w, nw, a, na, out) },
                // SAFETY: as above.
                2 => unsafe { gemv::<$f, 2>(w, nw, a, na, out) },
                // SAFETY: as above.
                3 => unsafe { gemv::<$f, 3>(w, nw, a, na, out) },
                // SAFETY: as above.
                4 => unsafe { gemv::<$f, 4>(w, nw, a, na, out) },
                // SAFETY: as above.
                5 => unsafe { gemv::<$f, 5>(w, nw, a, na, out) },
                // SAFETY: as above.
                6 => unsafe { gemv::<$f, 6>(w, nw, a, na, out) },
                // SAFETY: as above.
                7 => unsafe { gemv::<$f, 7>(w, nw, a, na, out) },
                // SAFETY: as above.
                8 => unsafe { gemv::<$f, 8>(w, nw, a, na, out) },
                // SAFETY: as above.
                _ => unsafe { tile::<$f>(w, nw, a, na, out) },
            }
        };
    }
    Some(match ty {
        T::Q4_0 => legacy!(Q4_0, T::Q4_0),
        T::Q4_1 => legacy!(Q4_1, T::Q4_1),
        T::Q5_0 => legacy!(Q5_0, T::Q5_0),
        T::Q5_1 => legacy!(Q5_1, T::Q5_1),
        T::Q8_0 => legacy!(Q8_0, T::Q8_0),
        T::Q4_K => kquant!(Q4_K),
        T::Q6_K => kquant!(Q6_K),
        _ => return None,
    })
}

/// The 256-bit VNNI tile kernels of `x86_tile` for a legacy format (small batches,
/// prefill).
fn legacy_fallback(ty: GgmlType) -> TileFn {
    super::x86_tile::small_tile_kernel(ty)
        .or(super::x86_tile::vnni::tile_kernel(ty))
        .expect("x86_tile has every legacy format")
}
