//! Tile kernels for the five legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on x86-64, in
//! two instantiations of one macro: AVX2 (`maddubs + madd`) and AVX-512 VNNI (256-bit
//! `vpdpbusd`, which also lets Q8_0 use the unsigned-by-signed product).
//!
//! Both compute, per block, the integer the scalar twin defines, through the identity
//! `sum (u - c) * y = sum u * y - c * sum y` (exact in `i32`): `u` is the weight value
//! made unsigned (Q4_0: `q`, c = 8; Q5_0: `q`, c = 16; Q8_0 on VNNI: `x + 128`, c = 128;
//! Q4_1/Q5_1: `q`, no offset, but `sum y` feeds the min term), and `c * sum y` is
//! prepared once per activation row. The block value is then `block_sym` or
//! `block_min` (same `f32` operations, no FMA), added into lane `b % 8`, and the lanes
//! are combined in the scalar tree: the bits of `dot_scalar`.
//!
//! - Decode (`n_a < 4`: one sequence, or a decode step of two or three): per weight row,
//!   eight blocks at a time: decode once into registers, then for each activation row one
//!   product per block, a transposing horizontal sum to eight block sums, the `f32` tail
//!   on eight lanes at once (monomorphised per row count). Lengths are checked once per
//!   call; the loop reads through raw pointers.
//! - Prefill (`n_a >= 4`): the weight rows of the tile are decoded once per call and
//!   the activation rows once per chunk of rows, both into a transposed layout (groups
//!   of eight blocks; vector `j` holds bytes `4j..4j+4` of each of the eight blocks), so
//!   eight products give the eight block sums with no horizontal sums. A register
//!   block of `RW` weight rows by `RA` activation rows reuses every load; the activation
//!   rows are split so that no padded row is computed (`row_blocks`: 4 = 2 + 2).
//! - Small batches on AVX-512 VNNI (legacy formats, 3 to 8 rows): the `small` submodule
//!   (512-bit lanes of `Q` blocks by `16 / Q` rows, weight dwords broadcast; its
//!   `tile_kernel` wraps this file's VNNI one).
//!
//! A partial last group (blocks not a multiple of eight) is padded with zero blocks and
//! added under a lane mask, so padded lanes are never touched (adding `+0.0` would turn
//! a `-0.0` lane positive).
//!
//! Safety: each instantiation's functions are reached only through its `tile_kernel`,
//! which `super::kernel` hands out only after the ISA was detected at run time
//! (`Isa::is_available`). The entry points check every length before any raw-pointer
//! read; each `unsafe` block states the bound it relies on.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::x86::hsum8x8;
use super::Lanes;
use crate::GgmlType;

mod small;
pub(super) use small::tile_kernel as small_tile_kernel;

/// Format codes for the const-generic kernels (ggml's type ids; `x86_512` and `x86_pack`
/// use them too).
pub(super) const Q4_0: u8 = 2;
pub(super) const Q4_1: u8 = 3;
pub(super) const Q5_0: u8 = 6;
pub(super) const Q5_1: u8 = 7;
pub(super) const Q8_0: u8 = 8;

/// The type of format code `f`.
pub(super) const fn legacy_type(f: u8) -> GgmlType {
    match f {
        Q4_0 => GgmlType::Q4_0,
        Q4_1 => GgmlType::Q4_1,
        Q5_0 => GgmlType::Q5_0,
        Q5_1 => GgmlType::Q5_1,
        _ => GgmlType::Q8_0,
    }
}

/// Bytes per weight block.
pub(super) const fn wb(f: u8) -> usize {
    match f {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Whether the format has a min (`block_min`) rather than an offset (`block_sym`).
pub(super) const fn has_min(f: u8) -> bool {
    matches!(f, Q4_1 | Q5_1)
}

/// The offset `c` subtracted from the unsigned weight values.
pub(super) const fn offset(f: u8) -> i32 {
    match f {
        Q4_0 => 8,
        Q5_0 => 16,
        Q8_0 => 128,
        _ => 0,
    }
}

/// Bytes per Q8_0 activation block.
const AB: usize = 34;

/// A group of eight weight blocks, transposed: `q[j]` lane `k` = bytes `4j..4j+4` of
/// block `k` (unsigned values), `d`/`m` the widened scales and mins (zero when padded).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct WGroup {
    q: [[u32; 8]; 8],
    d: [f32; 8],
    m: [f32; 8],
}

/// Per activation row and group of eight blocks: the widened scales, `c * sum y` per
/// block (offset formats) and `sum y` as `f32` (min formats); for the prefill path also
/// the transposed quants.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct AGroup {
    q: [[u32; 8]; 8],
    d: [f32; 8],
    off: [i32; 8],
    ys: [f32; 8],
}

const WZERO: WGroup = WGroup {
    q: [[0; 8]; 8],
    d: [0.0; 8],
    m: [0.0; 8],
};

const AZERO: AGroup = AGroup {
    q: [[0; 8]; 8],
    d: [0.0; 8],
    off: [0; 8],
    ys: [0.0; 8],
};

thread_local! {
    /// Reused prepared-data buffers (weights, activations), so a call allocates only
    /// when it needs more room than any earlier call on this thread.
    static BUFS: RefCell<(Vec<WGroup>, Vec<AGroup>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Activation rows prepared per chunk in the prefill path.
const A_CHUNK: usize = 48;

/// Checks the lengths once and returns `(weight row bytes, activation row bytes, blocks
/// per row)`. `super::DotKernel::dot_tile` has already checked them; this repeats the
/// check so the raw-pointer loops below rely only on this function.
fn geometry(
    f: u8,
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    out: &[f32],
) -> (usize, usize, usize) {
    assert!(n_w > 0 && n_a > 0 && out.len() == n_w * n_a, "tile shape");
    let (wrb, ab) = (ws.len() / n_w, acts.len() / n_a);
    let nb = wrb / wb(f);
    assert!(
        wrb * n_w == ws.len() && ab * n_a == acts.len() && nb * wb(f) == wrb && nb * AB == ab,
        "tile lengths"
    );
    (wrb, ab, nb)
}

/// The lane mask of the first `n` lanes (all lanes for `n = 0`, meaning a full group).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn lane_mask(n: usize) -> __m256 {
    let n = if n == 0 { 8 } else { n as i32 };
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx))
}

/// The 8x8 transpose of 32-bit lanes: lane `k` of result `j` is lane `j` of `v[k]`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
    let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
    let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// Eight f16 values at byte `at` of the first `n` (1..=8) `stride`-byte blocks from `p`,
/// widened; lanes `n..8` are zero.
///
/// # Safety
/// The first `n` blocks must be readable at `p`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn f16x8(p: *const u8, stride: usize, at: usize, n: usize) -> __m256 {
    let mut h = [0u16; 8];
    for (k, h) in h.iter_mut().enumerate().take(n) {
        // SAFETY: block `k < n` is readable (caller) and `at + 2 <= stride`.
        *h = unsafe { p.add(k * stride + at).cast::<u16>().read_unaligned() };
    }
    // SAFETY: `h` is 16 readable bytes.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr().cast()) })
}

/// K-quant format codes.
const Q2_K: u8 = 10;
const Q3_K: u8 = 11;
const Q4_K: u8 = 12;
const Q5_K: u8 = 13;
const Q6_K: u8 = 14;

/// Bytes per K-quant weight super-block.
const fn kwb(f: u8) -> usize {
    match f {
        Q2_K => 84,
        Q3_K => 110,
        Q4_K => 144,
        Q5_K => 176,
        _ => 210,
    }
}

/// Whether the K format has mins (`block_k_min`) rather than an offset (`block_k`).
const fn k_min(f: u8) -> bool {
    matches!(f, Q2_K | Q4_K | Q5_K)
}

/// Bytes per Q8_K activation block.
const KAB: usize = 292;

/// One prepared K-quant weight super-block: the eight 32-value chunks transposed (as
/// `WGroup::q`), `s0`/`s1` the scales of the low/high 16 values of each chunk (lane
/// `c` = chunk `c`), `c` the 16 i16 coefficients of the activation bsums.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct WSb {
    q: [[u32; 8]; 8],
    s0: [i32; 8],
    s1: [i32; 8],
    c: [i16; 16],
}

/// One prepared Q8_K activation super-block: transposed quants and the 16 bsums.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct ASb {
    q: [[u32; 8]; 8],
    bs: [i16; 16],
}

const WSB_ZERO: WSb = WSb {
    q: [[0; 8]; 8],
    s0: [0; 8],
    s1: [0; 8],
    c: [0; 16],
};

const ASB_ZERO: ASb = ASb {
    q: [[0; 8]; 8],
    bs: [0; 16],
};

/// Per group of eight super-blocks: the widened scales of the weight (`d`, `dmin`) or
/// of the activation (`d` only).
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct KScales {
    d: [f32; 8],
    dmin: [f32; 8],
}

const KS_ZERO: KScales = KScales {
    d: [0.0; 8],
    dmin: [0.0; 8],
};

/// Prepared K-quant buffers: weights, weight scales, activations, activation scales.
type KBufs = (Vec<WSb>, Vec<KScales>, Vec<ASb>, Vec<KScales>);

thread_local! {
    /// Reused prepared K-quant buffers.
    static KBUFS: RefCell<KBufs> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}

/// As [`geometry`] for the K-quants.
pub(super) fn k_geometry(
    f: u8,
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    out: &[f32],
) -> (usize, usize, usize) {
    assert!(n_w > 0 && n_a > 0 && out.len() == n_w * n_a, "tile shape");
    let (wrb, ab) = (ws.len() / n_w, acts.len() / n_a);
    let nb = wrb / kwb(f);
    assert!(
        wrb * n_w == ws.len() && ab * n_a == acts.len() && nb * kwb(f) == wrb && nb * KAB == ab,
        "tile lengths"
    );
    (wrb, ab, nb)
}

/// The Q4_K/Q5_K 6-bit scales and mins of the 12 bytes at `p`, as eight bytes each.
///
/// # Safety
/// 12 readable bytes at `p`.
#[inline(always)]
unsafe fn k4_scales(p: *const u8) -> (u64, u64) {
    // SAFETY: 12 readable bytes (caller).
    let (w0, w1, w2) = unsafe {
        (
            p.cast::<u32>().read_unaligned(),
            p.add(4).cast::<u32>().read_unaligned(),
            p.add(8).cast::<u32>().read_unaligned(),
        )
    };
    let sc_lo = w0 & 0x3f3f_3f3f;
    let m_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let m_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(m_lo) | (u64::from(m_hi) << 32),
    )
}

/// Eight f16 values, each at byte `at` of `n` (1..=8) consecutive `stride`-byte blocks,
/// widened; also eight f32 values at byte `at32` of the blocks at `a` (activation
/// scales). Lanes `n..8` are zero.
///
/// # Safety
/// The first `n` blocks must be readable at `p`.
#[inline(always)]
unsafe fn f32x8_at(p: *const u8, stride: usize, at: usize, n: usize) -> [f32; 8] {
    let mut v = [0f32; 8];
    for (k, v) in v.iter_mut().enumerate().take(n) {
        // SAFETY: block `k < n` is readable (caller), `at + 4 <= stride`.
        *v = unsafe { p.add(k * stride + at).cast::<f32>().read_unaligned() };
    }
    v
}

/// The register blocks of `n` activation rows for a register block of `ra` rows:
/// `(first row, width)` with width `ra` or 2. With `ra = 3` a remainder of one row is
/// taken as two blocks of two (4 rows: 2 + 2, not 3 + 3 with two padded rows) and a
/// remainder of two as one block of two, so no padded row is computed (except `n = 1`).
fn row_blocks(n: usize, ra: usize) -> impl Iterator<Item = (usize, usize)> {
    let (full, tail, n_tail) = match (ra, n % ra) {
        (3, 1) if n >= 4 => (n / 3 - 1, [2, 2], 2),
        (3, 2) => (n / 3, [2, 0], 1),
        (_, 0) => (n / ra, [0, 0], 0),
        _ => (n / ra, [ra, 0], 1),
    };
    let widths = std::iter::repeat_n(ra, full).chain(tail.into_iter().take(n_tail));
    widths.scan(0, |at, w| {
        let start = *at;
        *at += w;
        Some((start, w))
    })
}

/// The prepared K-quant data of one chunk, for `k_run_rows`.
#[derive(Clone, Copy)]
struct KPrep<'a> {
    wp: &'a [WSb],
    wsp: &'a [KScales],
    ap: &'a [ASb],
    asp: &'a [KScales],
    nb: usize,
    n_w: usize,
    na: usize,
    ra: usize,
    r0: usize,
}

/// Generates one ISA's legacy tile kernels. `$feat` is the target-feature list, `dp` the
/// product `acc + sum of 4 (u * y)` per i32 lane (`u` unsigned, `y` signed bytes), `hi5`
/// the Q5 high-bit bytes (0x10 where bit `i` of `qh` is set), `$q8` whether Q8_0 is
/// supported (needs a product without i16 saturation), `$rw`/`$ra` the register block.
macro_rules! legacy_isa {
    ($m:ident, $feat:literal, $q8:expr, $rw:expr, $ra:expr, $krw:expr, $kra:expr,
     dp |$acc:ident, $u:ident, $y:ident| $dp:expr,
     hi5 |$qh:ident| $hi5:expr) => {
        pub(super) mod $m {
            use super::*;
            use crate::dot::TileFn;

            /// `acc + sum_{4 bytes} u * y` per i32 lane.
            #[target_feature(enable = $feat)]
            #[inline]
            fn dp($acc: __m256i, $u: __m256i, $y: __m256i) -> __m256i {
                $dp
            }

            /// 0x10 in byte `i` where bit `i` of `qh` is set.
            #[target_feature(enable = $feat)]
            #[inline]
            fn hi5($qh: u32) -> __m256i {
                $hi5
            }

            /// The 32 nibbles at `p` as bytes (low nibbles first).
            ///
            /// # Safety
            /// 16 readable bytes at `p`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn nibbles(p: *const u8) -> __m256i {
                // SAFETY: 16 readable bytes (caller).
                let t = unsafe { _mm_loadu_si128(p.cast()) };
                let v = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
                _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
            }

            /// The 32 unsigned weight values of the block at `p`.
            ///
            /// # Safety
            /// `wb(F)` readable bytes at `p`.
            #[target_feature(enable = $feat)]
            #[inline]
            pub(super) unsafe fn decode<const F: u8>(p: *const u8) -> __m256i {
                // SAFETY (all arms): every read lies inside the block's `wb(F)` bytes.
                unsafe {
                    match F {
                        Q4_0 => nibbles(p.add(2)),
                        Q4_1 => nibbles(p.add(4)),
                        Q5_0 => _mm256_or_si256(
                            nibbles(p.add(6)),
                            hi5(p.add(2).cast::<u32>().read_unaligned()),
                        ),
                        Q5_1 => _mm256_or_si256(
                            nibbles(p.add(8)),
                            hi5(p.add(4).cast::<u32>().read_unaligned()),
                        ),
                        _ => _mm256_xor_si256(
                            _mm256_loadu_si256(p.add(2).cast()),
                            _mm256_set1_epi8(-128),
                        ),
                    }
                }
            }

            /// Prepares group `g` of the activation row at `a` (`nb` blocks): scales,
            /// offsets, sums and (if `T`) the transposed quants.
            ///
            /// # Safety
            /// `nb` Q8_0 blocks readable at `a`, `g * 8 < nb`.
            #[target_feature(enable = $feat)]
            #[inline]
            pub(super) unsafe fn prep_act<const F: u8, const T: bool>(
                a: *const u8,
                nb: usize,
                g: usize,
                out: &mut AGroup,
            ) {
                let n = (nb - 8 * g).min(8);
                // SAFETY: blocks `8g..8g+n` are inside the row (caller).
                let a = unsafe { a.add(8 * g * AB) };
                let mut y = [_mm256_setzero_si256(); 8];
                for (k, y) in y.iter_mut().enumerate().take(n) {
                    // SAFETY: block `k < n` is readable; its quants are bytes 2..34.
                    *y = unsafe { _mm256_loadu_si256(a.add(k * AB + 2).cast()) };
                }
                let ones = _mm256_set1_epi8(1);
                let mut s = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    s[k] = dp(_mm256_setzero_si256(), ones, y[k]);
                }
                let ysum = hsum8x8(&s);
                // SAFETY: `n` blocks readable at `a`; the scale is bytes 0..2.
                let d = unsafe { f16x8(a, AB, 0, n) };
                // SAFETY (stores): each field is 32 bytes.
                unsafe {
                    _mm256_storeu_ps(out.d.as_mut_ptr(), d);
                    let off = _mm256_mullo_epi32(ysum, _mm256_set1_epi32(offset(F)));
                    _mm256_storeu_si256(out.off.as_mut_ptr().cast(), off);
                    _mm256_storeu_ps(out.ys.as_mut_ptr(), _mm256_cvtepi32_ps(ysum));
                    if T {
                        let t = transpose8(y);
                        for j in 0..8 {
                            _mm256_storeu_si256(out.q[j].as_mut_ptr().cast(), t[j]);
                        }
                    }
                }
            }

            /// Prepares group `g` of the weight row at `w` (`nb` blocks).
            ///
            /// # Safety
            /// `nb` blocks of `wb(F)` bytes readable at `w`, `g * 8 < nb`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn prep_w<const F: u8>(w: *const u8, nb: usize, g: usize, out: &mut WGroup) {
                let n = (nb - 8 * g).min(8);
                // SAFETY: blocks `8g..8g+n` are inside the row (caller).
                let w = unsafe { w.add(8 * g * wb(F)) };
                let mut u = [_mm256_setzero_si256(); 8];
                for (k, u) in u.iter_mut().enumerate().take(n) {
                    // SAFETY: block `k < n` is readable.
                    *u = unsafe { decode::<F>(w.add(k * wb(F))) };
                }
                let t = transpose8(u);
                // SAFETY: `n` blocks readable; scales at 0..2, mins at 2..4; stores are
                // into 32-byte fields.
                unsafe {
                    _mm256_storeu_ps(out.d.as_mut_ptr(), f16x8(w, wb(F), 0, n));
                    if has_min(F) {
                        _mm256_storeu_ps(out.m.as_mut_ptr(), f16x8(w, wb(F), 2, n));
                    }
                    for j in 0..8 {
                        _mm256_storeu_si256(out.q[j].as_mut_ptr().cast(), t[j]);
                    }
                }
            }

            /// The eight block values of one group: `block_sym` / `block_min` on eight
            /// lanes (`isum` already offset-corrected).
            #[target_feature(enable = $feat)]
            #[inline]
            fn values<const F: u8>(dw: __m256, mw: __m256, a: &AGroup, isum: __m256i) -> __m256 {
                // SAFETY: the fields are 32 readable bytes.
                let (dx, ys) = unsafe {
                    (
                        _mm256_loadu_ps(a.d.as_ptr()),
                        _mm256_loadu_ps(a.ys.as_ptr()),
                    )
                };
                let v = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
                if has_min(F) {
                    _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(mw, dx), ys))
                } else {
                    v
                }
            }

            /// A group's block values added into `acc`: every lane for a full group,
            /// else only the lanes of `mask` (a partial last group; `acc` elsewhere, so a
            /// `-0.0` lane stays negative).
            #[target_feature(enable = $feat)]
            #[inline]
            fn add_group(acc: __m256, v: __m256, full: bool, mask: __m256) -> __m256 {
                if full {
                    _mm256_add_ps(acc, v)
                } else {
                    _mm256_blendv_ps(acc, _mm256_add_ps(acc, v), mask)
                }
            }

            /// The eight lanes combined in the fixed tree.
            #[target_feature(enable = $feat)]
            #[inline]
            fn finish(acc: __m256) -> f32 {
                let mut l = Lanes::default();
                // SAFETY: `l.0` is 8 f32s.
                unsafe { _mm256_storeu_ps(l.0.as_mut_ptr(), acc) };
                l.finish()
            }

            /// Decode path: each activation row against every weight row, eight blocks
            /// at a time with horizontal sums.
            #[target_feature(enable = $feat)]
            fn rows_path<const F: u8, const R: usize>(
                ws: &[u8],
                n_w: usize,
                acts: &[u8],
                n_a: usize,
                out: &mut [f32],
            ) {
                let (wrb, ab, nb) = geometry(F, ws, n_w, acts, n_a, out);
                assert_eq!(n_a, R, "rows_path: {R} activation rows");
                let ng = nb.div_ceil(8);
                let tail = nb % 8;
                let last_mask = lane_mask(tail);
                // Activation-only terms of every row, once per call.
                let mut prep = vec![AZERO; ng * n_a];
                for r in 0..n_a {
                    let a = acts[r * ab..][..ab].as_ptr();
                    for (g, p) in prep[r * ng..(r + 1) * ng].iter_mut().enumerate() {
                        // SAFETY: `a` is a whole row of `nb` blocks (geometry); `8g < nb`.
                        unsafe { prep_act::<F, false>(a, nb, g, p) };
                    }
                }
                let mut acc = [_mm256_setzero_ps(); R];
                for i in 0..n_w {
                    // SAFETY: row `i < n_w` of `wrb` bytes lies inside `ws` (geometry).
                    let w = unsafe { ws.as_ptr().add(i * wrb) };
                    acc.iter_mut().for_each(|a| *a = _mm256_setzero_ps());
                    for g in 0..ng {
                        let n = (nb - 8 * g).min(8);
                        // SAFETY: blocks `8g..8g+n` of the weight row are in bounds.
                        let wg = unsafe { w.add(8 * g * wb(F)) };
                        // The group's weights, decoded once for every activation row.
                        let mut u = [_mm256_setzero_si256(); 8];
                        for (k, u) in u.iter_mut().enumerate().take(n) {
                            // SAFETY: block `k < n` of the group is readable.
                            *u = unsafe { decode::<F>(wg.add(k * wb(F))) };
                        }
                        // SAFETY: `n` blocks readable at `wg`.
                        let (dw, mw) = unsafe {
                            let dw = f16x8(wg, wb(F), 0, n);
                            (
                                dw,
                                if has_min(F) {
                                    f16x8(wg, wb(F), 2, n)
                                } else {
                                    dw
                                },
                            )
                        };
                        for (r, acc) in acc.iter_mut().enumerate() {
                            // SAFETY: row `r < n_a` has blocks `8g..8g+n` (geometry).
                            let ag = unsafe { acts.as_ptr().add(r * ab + 8 * g * AB) };
                            let p = &prep[r * ng + g];
                            let mut s = [_mm256_setzero_si256(); 8];
                            for (k, s) in s.iter_mut().enumerate().take(n) {
                                // SAFETY: block `k < n` of the activation row is readable.
                                *s = unsafe {
                                    let y = _mm256_loadu_si256(ag.add(k * AB + 2).cast());
                                    dp(_mm256_setzero_si256(), u[k], y)
                                };
                            }
                            let mut isum = hsum8x8(&s);
                            if !has_min(F) {
                                // SAFETY: `off` is 32 readable bytes.
                                let off = unsafe { _mm256_loadu_si256(p.off.as_ptr().cast()) };
                                isum = _mm256_sub_epi32(isum, off);
                            }
                            let v = values::<F>(dw, mw, p, isum);
                            *acc = add_group(*acc, v, n == 8, last_mask);
                        }
                    }
                    for (r, acc) in acc.iter().enumerate() {
                        out[r * n_w + i] = finish(*acc);
                    }
                }
            }

            /// The register block: `RW` prepared weight rows by `RA` prepared activation
            /// rows over `ng` groups, into `res[i][r]`.
            ///
            /// # Safety
            /// Each pointer must address `ng` consecutive prepared groups.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn micro<const F: u8, const RW: usize, const RA: usize>(
                w: [*const WGroup; RW],
                a: [*const AGroup; RA],
                ng: usize,
                last_mask: __m256,
                res: &mut [[f32; RA]; RW],
            ) {
                let mut acc = [[_mm256_setzero_ps(); RA]; RW];
                for g in 0..ng {
                    let mut s = [[_mm256_setzero_si256(); RA]; RW];
                    // SAFETY: `g < ng` groups are readable at every pointer (caller).
                    let (wg, ag) = unsafe { (w.map(|p| &*p.add(g)), a.map(|p| &*p.add(g))) };
                    for j in 0..8 {
                        let mut y = [_mm256_setzero_si256(); RA];
                        for r in 0..RA {
                            // SAFETY: `q[j]` is 32 readable bytes.
                            y[r] = unsafe { _mm256_loadu_si256(ag[r].q[j].as_ptr().cast()) };
                        }
                        for i in 0..RW {
                            // SAFETY: `q[j]` is 32 readable bytes.
                            let u = unsafe { _mm256_loadu_si256(wg[i].q[j].as_ptr().cast()) };
                            for r in 0..RA {
                                s[i][r] = dp(s[i][r], u, y[r]);
                            }
                        }
                    }
                    let full = g + 1 < ng;
                    for i in 0..RW {
                        // SAFETY: the fields are 32 readable bytes.
                        let (dw, mw) = unsafe {
                            (
                                _mm256_loadu_ps(wg[i].d.as_ptr()),
                                _mm256_loadu_ps(wg[i].m.as_ptr()),
                            )
                        };
                        for r in 0..RA {
                            let mut isum = s[i][r];
                            if !has_min(F) {
                                // SAFETY: `off` is 32 readable bytes.
                                let off = unsafe { _mm256_loadu_si256(ag[r].off.as_ptr().cast()) };
                                isum = _mm256_sub_epi32(isum, off);
                            }
                            let v = values::<F>(dw, mw, ag[r], isum);
                            acc[i][r] = add_group(acc[i][r], v, full, last_mask);
                        }
                    }
                }
                for i in 0..RW {
                    for r in 0..RA {
                        res[i][r] = finish(acc[i][r]);
                    }
                }
            }

            /// Prefill path: transposed prepared rows and register blocks.
            #[target_feature(enable = $feat)]
            fn tile_path<const F: u8>(
                ws: &[u8],
                n_w: usize,
                acts: &[u8],
                n_a: usize,
                out: &mut [f32],
            ) {
                const RW: usize = $rw;
                const RA: usize = $ra;
                let (wrb, ab, nb) = geometry(F, ws, n_w, acts, n_a, out);
                let ng = nb.div_ceil(8);
                let last_mask = lane_mask(nb % 8);
                BUFS.with_borrow_mut(|(wp, ap)| {
                    wp.clear();
                    wp.resize(n_w * ng, WZERO);
                    for i in 0..n_w {
                        let w = ws[i * wrb..][..wrb].as_ptr();
                        for g in 0..ng {
                            // SAFETY: `w` is a whole row of `nb` blocks; `8g < nb`.
                            unsafe { prep_w::<F>(w, nb, g, &mut wp[i * ng + g]) };
                        }
                    }
                    for r0 in (0..n_a).step_by(A_CHUNK) {
                        let na = (n_a - r0).min(A_CHUNK);
                        ap.clear();
                        ap.resize(na * ng, AZERO);
                        for r in 0..na {
                            let a = acts[(r0 + r) * ab..][..ab].as_ptr();
                            for g in 0..ng {
                                // SAFETY: `a` is a whole row of `nb` blocks; `8g < nb`.
                                unsafe { prep_act::<F, true>(a, nb, g, &mut ap[r * ng + g]) };
                            }
                        }
                        for (ra, width) in row_blocks(na, RA) {
                            if width == RA {
                                run_rows::<F, RW, RA>(wp, ap, ng, n_w, na, ra, r0, last_mask, out);
                            } else {
                                run_rows::<F, RW, 2>(wp, ap, ng, n_w, na, ra, r0, last_mask, out);
                            }
                        }
                    }
                });
            }

            /// Activation rows `ra .. ra + RB` of a chunk (starting at row `r0`) against
            /// every prepared weight row, register block by register block.
            #[target_feature(enable = $feat)]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            fn run_rows<const F: u8, const RW: usize, const RB: usize>(
                wp: &[WGroup],
                ap: &[AGroup],
                ng: usize,
                n_w: usize,
                na: usize,
                ra: usize,
                r0: usize,
                last_mask: __m256,
                out: &mut [f32],
            ) {
                assert!(wp.len() >= n_w * ng && ap.len() >= na * ng && ra < na);
                // Rows past the end repeat the last row; their results are dropped.
                let a: [*const AGroup; RB] =
                    std::array::from_fn(|k| ap[(ra + k).min(na - 1) * ng..].as_ptr());
                for i0 in (0..n_w).step_by(RW) {
                    let w: [*const WGroup; RW] =
                        std::array::from_fn(|k| wp[(i0 + k).min(n_w - 1) * ng..].as_ptr());
                    let mut res = [[0f32; RB]; RW];
                    // SAFETY: each pointer starts a run of `ng` prepared groups of one row
                    // (the slices hold `ng` per row, asserted above).
                    unsafe { micro::<F, RW, RB>(w, a, ng, last_mask, &mut res) };
                    for (k, res) in res.iter().enumerate().take(n_w - i0) {
                        for (rr, v) in res.iter().enumerate().take(na - ra) {
                            out[(r0 + ra + rr) * n_w + i0 + k] = *v;
                        }
                    }
                }
            }

            /// A decoded K-quant super-block: the eight 32-value chunks as unsigned bytes,
            /// the 16 group scales (i16, element order; a 32-value scale repeated twice)
            /// and the 16 bsum coefficients (i16).
            ///
            /// # Safety
            /// `kwb(F)` readable bytes at `p`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn kdecode<const F: u8>(p: *const u8) -> ([__m256i; 8], __m256i, __m256i) {
                let ld = |at: usize| {
                    // SAFETY: every caller's `at + 32 <= kwb(F)`.
                    unsafe { _mm256_loadu_si256(p.add(at).cast()) }
                };
                let m4 = _mm256_set1_epi8(0x0F);
                let mut u = [_mm256_setzero_si256(); 8];
                // Scale bytes repeated twice (the 32-value formats), as i16.
                let dup = |b: u64| {
                    let x = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(b as i64));
                    _mm256_set_m128i(_mm_unpackhi_epi16(x, x), _mm_unpacklo_epi16(x, x))
                };
                match F {
                    Q4_K | Q5_K => {
                        // SAFETY: the scales are bytes 4..16.
                        let (sc, mn) = unsafe { k4_scales(p.add(4)) };
                        let (qs, qh) = if F == Q4_K {
                            (16, None)
                        } else {
                            (48, Some(ld(16)))
                        };
                        for j in 0..4 {
                            let q = ld(qs + 32 * j);
                            let mut lo = _mm256_and_si256(q, m4);
                            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                            if let Some(qh) = qh {
                                let one = _mm256_set1_epi8(1);
                                let sh = _mm_cvtsi32_si128(2 * j as i32);
                                let h = _mm256_srl_epi16(qh, sh);
                                lo = _mm256_or_si256(
                                    lo,
                                    _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)),
                                );
                                let h = _mm256_srli_epi16::<1>(h);
                                hi = _mm256_or_si256(
                                    hi,
                                    _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)),
                                );
                            }
                            u[2 * j] = lo;
                            u[2 * j + 1] = hi;
                        }
                        (u, dup(sc), dup(mn))
                    }
                    Q6_K => {
                        let m2 = _mm256_set1_epi8(3);
                        for n in 0..2 {
                            let qh = ld(128 + 32 * n);
                            let ql0 = ld(64 * n);
                            let ql1 = ld(64 * n + 32);
                            let hs = [
                                qh,
                                _mm256_srli_epi16::<2>(qh),
                                _mm256_srli_epi16::<4>(qh),
                                _mm256_srli_epi16::<6>(qh),
                            ];
                            let ls = [
                                _mm256_and_si256(ql0, m4),
                                _mm256_and_si256(ql1, m4),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                            ];
                            for k in 0..4 {
                                let high = _mm256_slli_epi16::<4>(_mm256_and_si256(hs[k], m2));
                                u[4 * n + k] = _mm256_or_si256(ls[k], high);
                            }
                        }
                        // SAFETY: the scales are bytes 192..208.
                        let sc =
                            _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(p.add(192).cast()) });
                        (u, sc, _mm256_slli_epi16::<5>(sc))
                    }
                    Q3_K => {
                        let m2 = _mm256_set1_epi8(3);
                        let one = _mm256_set1_epi8(1);
                        let hm = ld(0);
                        for n in 0..2 {
                            let q = ld(32 + 32 * n);
                            for k in 0..4 {
                                let sh = _mm_cvtsi32_si128(2 * k as i32);
                                let low = _mm256_and_si256(_mm256_srl_epi16(q, sh), m2);
                                let hsh = _mm_cvtsi32_si128((4 * n + k) as i32);
                                let hb = _mm256_and_si256(_mm256_srl_epi16(hm, hsh), one);
                                u[4 * n + k] = _mm256_or_si256(low, _mm256_slli_epi16::<2>(hb));
                            }
                        }
                        // The 16 6-bit scales (low nibble + two high bits each), byte
                        // parallel within u32 words: the scalar `q3_k_scales`.
                        // SAFETY: the scales are bytes 96..108.
                        let (a0, a1, h) = unsafe {
                            (
                                p.add(96).cast::<u32>().read_unaligned(),
                                p.add(100).cast::<u32>().read_unaligned(),
                                p.add(104).cast::<u32>().read_unaligned(),
                            )
                        };
                        let (m4, m2) = (0x0f0f_0f0f_u32, 0x0303_0303_u32);
                        let b = _mm_setr_epi32(
                            ((a0 & m4) | ((h & m2) << 4)) as i32,
                            ((a1 & m4) | (((h >> 2) & m2) << 4)) as i32,
                            (((a0 >> 4) & m4) | (((h >> 4) & m2) << 4)) as i32,
                            (((a1 >> 4) & m4) | (((h >> 6) & m2) << 4)) as i32,
                        );
                        let sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(b), _mm256_set1_epi16(32));
                        (u, sc, _mm256_slli_epi16::<2>(sc))
                    }
                    _ => {
                        let m2 = _mm256_set1_epi8(3);
                        for n in 0..2 {
                            let q = ld(16 + 32 * n);
                            for k in 0..4 {
                                let sh = _mm_cvtsi32_si128(2 * k as i32);
                                u[4 * n + k] = _mm256_and_si256(_mm256_srl_epi16(q, sh), m2);
                            }
                        }
                        // SAFETY: the scales are bytes 0..16.
                        let b = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.cast()) });
                        let sc = _mm256_and_si256(b, _mm256_set1_epi16(15));
                        (u, sc, _mm256_srli_epi16::<4>(b))
                    }
                }
            }

            /// The scale vectors of the row kernel from the 16 group scales `sc`:
            /// `[g0 g2 g4 g6 | g1 g3 g5 g7]` and `[g8 .. g14 | g9 .. g15]` as i32.
            #[target_feature(enable = $feat)]
            #[inline]
            fn k_split(sc: __m256i) -> (__m256i, __m256i) {
                let even_odd = _mm256_setr_epi8(
                    0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13,
                    2, 3, 6, 7, 10, 11, 14, 15,
                );
                let s = _mm256_shuffle_epi8(sc, even_odd);
                (
                    _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s)),
                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(s)),
                )
            }

            /// The block values of one group of super-blocks: `block_k_min` or `block_k`
            /// on eight lanes.
            #[target_feature(enable = $feat)]
            #[inline]
            fn k_values<const F: u8>(
                ws: &KScales,
                dx: __m256,
                sumi: __m256i,
                summ: __m256i,
            ) -> __m256 {
                // SAFETY: the fields are 32 readable bytes.
                let (dw, dm) = unsafe {
                    (
                        _mm256_loadu_ps(ws.d.as_ptr()),
                        _mm256_loadu_ps(ws.dmin.as_ptr()),
                    )
                };
                let v = _mm256_mul_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(sumi));
                if k_min(F) {
                    _mm256_sub_ps(
                        v,
                        _mm256_mul_ps(_mm256_mul_ps(dx, dm), _mm256_cvtepi32_ps(summ)),
                    )
                } else {
                    v
                }
            }

            /// The weight scales of group `g` of the row at `w` (`nb` super-blocks).
            ///
            /// # Safety
            /// `nb` super-blocks readable at `w`, `8g < nb`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn k_wscales<const F: u8>(w: *const u8, nb: usize, g: usize) -> KScales {
                let n = (nb - 8 * g).min(8);
                let (at_d, at_m) = match F {
                    Q2_K => (80, 82),
                    Q3_K => (108, 0),
                    Q4_K | Q5_K => (0, 2),
                    _ => (208, 0),
                };
                let mut s = KS_ZERO;
                // SAFETY: super-blocks `8g..8g+n` are readable (caller); stores are into
                // 32-byte fields.
                unsafe {
                    let w = w.add(8 * g * kwb(F));
                    _mm256_storeu_ps(s.d.as_mut_ptr(), f16x8(w, kwb(F), at_d, n));
                    if k_min(F) {
                        _mm256_storeu_ps(s.dmin.as_mut_ptr(), f16x8(w, kwb(F), at_m, n));
                    }
                }
                s
            }

            /// K-quant decode path (`R` = 1 to 3 activation rows): per weight row and
            /// super-block, the weights are decoded once and multiplied with each
            /// activation row, so the rows share every weight load (the weights stream
            /// from memory once per call, not once per activation row). Per (weight row,
            /// activation row) the operations are those of one row alone.
            #[target_feature(enable = $feat)]
            fn k_rows_path<const F: u8, const R: usize>(
                ws: &[u8],
                n_w: usize,
                acts: &[u8],
                n_a: usize,
                out: &mut [f32],
            ) {
                let (wrb, ab, nb) = k_geometry(F, ws, n_w, acts, n_a, out);
                assert_eq!(n_a, R, "k_rows_path: {R} activation rows");
                let ng = nb.div_ceil(8);
                let last_mask = lane_mask(nb % 8);
                let rows: [*const u8; R] = std::array::from_fn(|r| acts[r * ab..][..ab].as_ptr());
                // Per row and group of eight super-blocks: the activation scales.
                let dxs: [Vec<[f32; 8]>; R] = std::array::from_fn(|r| {
                    (0..ng)
                        // SAFETY: super-blocks `8g..` of the row are readable; d at 0..4.
                        .map(|g| unsafe {
                            f32x8_at(rows[r].add(8 * g * KAB), KAB, 0, (nb - 8 * g).min(8))
                        })
                        .collect()
                });
                for i in 0..n_w {
                    // SAFETY: row `i < n_w` of `wrb` bytes lies inside `ws` (geometry).
                    let w = unsafe { ws.as_ptr().add(i * wrb) };
                    let mut acc = [_mm256_setzero_ps(); R];
                    for g in 0..ng {
                        let n = (nb - 8 * g).min(8);
                        let mut t = [[_mm256_setzero_si256(); 8]; R];
                        let mut m = [[_mm256_setzero_si256(); 8]; R];
                        for k in 0..n {
                            let b = 8 * g + k;
                            // SAFETY: super-block `b < nb` of the weight row is readable.
                            let (u, sc, c) = unsafe { kdecode::<F>(w.add(b * kwb(F))) };
                            let (sa, sb) = k_split(sc);
                            for r in 0..R {
                                // SAFETY: super-block `b < nb` of activation row `r`.
                                let ab_ = unsafe { rows[r].add(b * KAB) };
                                let mut p = [_mm256_setzero_si256(); 8];
                                for ch in 0..8 {
                                    // SAFETY: chunk `ch` of the quants is bytes 4+32ch..36+32ch.
                                    let y =
                                        unsafe { _mm256_loadu_si256(ab_.add(4 + 32 * ch).cast()) };
                                    p[ch] = dp(_mm256_setzero_si256(), u[ch], y);
                                }
                                let s0123 = _mm256_hadd_epi32(
                                    _mm256_hadd_epi32(p[0], p[1]),
                                    _mm256_hadd_epi32(p[2], p[3]),
                                );
                                let s4567 = _mm256_hadd_epi32(
                                    _mm256_hadd_epi32(p[4], p[5]),
                                    _mm256_hadd_epi32(p[6], p[7]),
                                );
                                let s = _mm256_add_epi32(
                                    _mm256_mullo_epi32(s0123, sa),
                                    _mm256_mullo_epi32(s4567, sb),
                                );
                                // SAFETY: the bsums are bytes 260..292.
                                let bs = unsafe { _mm256_loadu_si256(ab_.add(260).cast()) };
                                let cb = _mm256_madd_epi16(c, bs);
                                if k_min(F) {
                                    t[r][k] = s;
                                    m[r][k] = cb;
                                } else {
                                    t[r][k] = _mm256_sub_epi32(s, cb);
                                }
                            }
                        }
                        // SAFETY: `8g < nb` and the row at `w` is whole.
                        let wsc = unsafe { k_wscales::<F>(w, nb, g) };
                        for r in 0..R {
                            // SAFETY: `dxs[r][g]` is 32 readable bytes.
                            let dx = unsafe { _mm256_loadu_ps(dxs[r][g].as_ptr()) };
                            let v = k_values::<F>(&wsc, dx, hsum8x8(&t[r]), hsum8x8(&m[r]));
                            acc[r] = add_group(acc[r], v, n == 8, last_mask);
                        }
                    }
                    for r in 0..R {
                        out[r * n_w + i] = finish(acc[r]);
                    }
                }
            }

            /// The K-quant register block: `RW` prepared weight rows by `RA` prepared
            /// activation rows over `nb` super-blocks, into `res[i][r]`.
            ///
            /// # Safety
            /// `w[i]` must address `nb` prepared super-blocks, `wsc[i]` and `asc[r]`
            /// `nb.div_ceil(8)` scale groups, `a[r]` `nb` prepared super-blocks.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn k_micro<const F: u8, const RW: usize, const RA: usize>(
                w: [*const WSb; RW],
                wsc: [*const KScales; RW],
                a: [*const ASb; RA],
                asc: [*const KScales; RA],
                nb: usize,
                last_mask: __m256,
                res: &mut [[f32; RA]; RW],
            ) {
                let mut acc = [[_mm256_setzero_ps(); RA]; RW];
                let ng = nb.div_ceil(8);
                for g in 0..ng {
                    let n = (nb - 8 * g).min(8);
                    let mut t = [[[_mm256_setzero_si256(); 8]; RA]; RW];
                    let mut m = [[[_mm256_setzero_si256(); 8]; RA]; RW];
                    for k in 0..n {
                        let b = 8 * g + k;
                        // SAFETY: `b < nb` prepared super-blocks at every pointer (caller).
                        let (wb_, ab_) = unsafe { (w.map(|p| &*p.add(b)), a.map(|p| &*p.add(b))) };
                        let mut lo = [[_mm256_setzero_si256(); RA]; RW];
                        let mut hi = [[_mm256_setzero_si256(); RA]; RW];
                        for j in 0..8 {
                            let mut y = [_mm256_setzero_si256(); RA];
                            for r in 0..RA {
                                // SAFETY: `q[j]` is 32 readable bytes.
                                y[r] = unsafe { _mm256_loadu_si256(ab_[r].q[j].as_ptr().cast()) };
                            }
                            for i in 0..RW {
                                // SAFETY: `q[j]` is 32 readable bytes.
                                let u = unsafe { _mm256_loadu_si256(wb_[i].q[j].as_ptr().cast()) };
                                for r in 0..RA {
                                    if j < 4 {
                                        lo[i][r] = dp(lo[i][r], u, y[r]);
                                    } else {
                                        hi[i][r] = dp(hi[i][r], u, y[r]);
                                    }
                                }
                            }
                        }
                        for i in 0..RW {
                            // SAFETY: the fields are 32 readable bytes.
                            let (s0, s1, c) = unsafe {
                                (
                                    _mm256_loadu_si256(wb_[i].s0.as_ptr().cast()),
                                    _mm256_loadu_si256(wb_[i].s1.as_ptr().cast()),
                                    _mm256_loadu_si256(wb_[i].c.as_ptr().cast()),
                                )
                            };
                            for r in 0..RA {
                                let s = _mm256_add_epi32(
                                    _mm256_mullo_epi32(lo[i][r], s0),
                                    _mm256_mullo_epi32(hi[i][r], s1),
                                );
                                // SAFETY: `bs` is 32 readable bytes.
                                let bs = unsafe { _mm256_loadu_si256(ab_[r].bs.as_ptr().cast()) };
                                let cb = _mm256_madd_epi16(c, bs);
                                if k_min(F) {
                                    t[i][r][k] = s;
                                    m[i][r][k] = cb;
                                } else {
                                    t[i][r][k] = _mm256_sub_epi32(s, cb);
                                }
                            }
                        }
                    }
                    for i in 0..RW {
                        for r in 0..RA {
                            // SAFETY: `g < ng` scale groups at `wsc[i]` and `asc[r]`.
                            let (ws_, dx) = unsafe {
                                (
                                    &*wsc[i].add(g),
                                    _mm256_loadu_ps((*asc[r].add(g)).d.as_ptr()),
                                )
                            };
                            let v = k_values::<F>(ws_, dx, hsum8x8(&t[i][r]), hsum8x8(&m[i][r]));
                            acc[i][r] = add_group(acc[i][r], v, n == 8, last_mask);
                        }
                    }
                }
                for i in 0..RW {
                    for r in 0..RA {
                        res[i][r] = finish(acc[i][r]);
                    }
                }
            }

            /// K-quant prefill path: transposed prepared rows and register blocks.
            #[target_feature(enable = $feat)]
            fn k_tile_path<const F: u8>(
                ws: &[u8],
                n_w: usize,
                acts: &[u8],
                n_a: usize,
                out: &mut [f32],
            ) {
                const RW: usize = $krw;
                const RA: usize = $kra;
                let (wrb, ab, nb) = k_geometry(F, ws, n_w, acts, n_a, out);
                let ng = nb.div_ceil(8);
                let last_mask = lane_mask(nb % 8);
                KBUFS.with_borrow_mut(|(wp, wsp, ap, asp)| {
                    wp.clear();
                    wp.resize(n_w * nb, WSB_ZERO);
                    wsp.clear();
                    wsp.resize(n_w * ng, KS_ZERO);
                    for i in 0..n_w {
                        let w = ws[i * wrb..][..wrb].as_ptr();
                        for b in 0..nb {
                            // SAFETY: `w` is a whole row of `nb` super-blocks.
                            let (u, sc, c) = unsafe { kdecode::<F>(w.add(b * kwb(F))) };
                            let (sa, sb) = k_split(sc);
                            let t = transpose8(u);
                            let p = &mut wp[i * nb + b];
                            // SAFETY: every field stored is 32 bytes.
                            unsafe {
                                for j in 0..8 {
                                    _mm256_storeu_si256(p.q[j].as_mut_ptr().cast(), t[j]);
                                }
                                _mm256_storeu_si256(
                                    p.s0.as_mut_ptr().cast(),
                                    _mm256_permute2x128_si256::<0x20>(sa, sb),
                                );
                                _mm256_storeu_si256(
                                    p.s1.as_mut_ptr().cast(),
                                    _mm256_permute2x128_si256::<0x31>(sa, sb),
                                );
                                _mm256_storeu_si256(p.c.as_mut_ptr().cast(), c);
                            }
                        }
                        for g in 0..ng {
                            // SAFETY: `w` is a whole row; `8g < nb`.
                            wsp[i * ng + g] = unsafe { k_wscales::<F>(w, nb, g) };
                        }
                    }
                    for r0 in (0..n_a).step_by(A_CHUNK) {
                        let na = (n_a - r0).min(A_CHUNK);
                        ap.clear();
                        ap.resize(na * nb, ASB_ZERO);
                        asp.clear();
                        asp.resize(na * ng, KS_ZERO);
                        for r in 0..na {
                            let a = acts[(r0 + r) * ab..][..ab].as_ptr();
                            for b in 0..nb {
                                let p = &mut ap[r * nb + b];
                                // SAFETY: super-block `b < nb` of the row is readable:
                                // quants at 4..260, bsums at 260..292; stores are into
                                // 32-byte fields.
                                unsafe {
                                    let a = a.add(b * KAB);
                                    let y: [__m256i; 8] = std::array::from_fn(|c| {
                                        _mm256_loadu_si256(a.add(4 + 32 * c).cast())
                                    });
                                    let t = transpose8(y);
                                    for j in 0..8 {
                                        _mm256_storeu_si256(p.q[j].as_mut_ptr().cast(), t[j]);
                                    }
                                    _mm256_storeu_si256(
                                        p.bs.as_mut_ptr().cast(),
                                        _mm256_loadu_si256(a.add(260).cast()),
                                    );
                                }
                            }
                            for g in 0..ng {
                                // SAFETY: super-blocks `8g..` of the row are readable.
                                asp[r * ng + g].d = unsafe {
                                    f32x8_at(a.add(8 * g * KAB), KAB, 0, (nb - 8 * g).min(8))
                                };
                            }
                        }
                        for (ra, width) in row_blocks(na, RA) {
                            let p = KPrep {
                                wp,
                                wsp,
                                ap,
                                asp,
                                nb,
                                n_w,
                                na,
                                ra,
                                r0,
                            };
                            if width == RA {
                                k_run_rows::<F, RW, RA>(&p, last_mask, out);
                            } else {
                                k_run_rows::<F, RW, 2>(&p, last_mask, out);
                            }
                        }
                    }
                });
            }

            /// K-quant activation rows `p.ra .. p.ra + RB` of a chunk against every
            /// prepared weight row, register block by register block.
            #[target_feature(enable = $feat)]
            #[inline]
            fn k_run_rows<const F: u8, const RW: usize, const RB: usize>(
                p: &KPrep<'_>,
                last_mask: __m256,
                out: &mut [f32],
            ) {
                let KPrep {
                    wp,
                    wsp,
                    ap,
                    asp,
                    nb,
                    n_w,
                    na,
                    ra,
                    r0,
                } = *p;
                let ng = nb.div_ceil(8);
                assert!(
                    wp.len() >= n_w * nb
                        && wsp.len() >= n_w * ng
                        && ap.len() >= na * nb
                        && asp.len() >= na * ng
                        && ra < na
                );
                let rr: [usize; RB] = std::array::from_fn(|k| (ra + k).min(na - 1));
                let a = rr.map(|r| ap[r * nb..].as_ptr());
                let asc = rr.map(|r| asp[r * ng..].as_ptr());
                for i0 in (0..n_w).step_by(RW) {
                    let ii: [usize; RW] = std::array::from_fn(|k| (i0 + k).min(n_w - 1));
                    let w = ii.map(|i| wp[i * nb..].as_ptr());
                    let wsc = ii.map(|i| wsp[i * ng..].as_ptr());
                    let mut res = [[0f32; RB]; RW];
                    // SAFETY: each pointer starts the `nb` prepared super-blocks or `ng`
                    // scale groups of one row (asserted above).
                    unsafe { k_micro::<F, RW, RB>(w, wsc, a, asc, nb, last_mask, &mut res) };
                    for (k, res) in res.iter().enumerate().take(n_w - i0) {
                        for (q, v) in res.iter().enumerate().take(na - ra) {
                            out[(r0 + ra + q) * n_w + i0 + k] = *v;
                        }
                    }
                }
            }

            /// Either K-quant path, by the number of activation rows.
            #[target_feature(enable = $feat)]
            fn k_tile<const F: u8>(
                ws: &[u8],
                n_w: usize,
                acts: &[u8],
                n_a: usize,
                out: &mut [f32],
            ) {
                if n_w == 0 || n_a == 0 {
                    return;
                }
                match n_a {
                    1 => k_rows_path::<F, 1>(ws, n_w, acts, n_a, out),
                    2 => k_rows_path::<F, 2>(ws, n_w, acts, n_a, out),
                    3 => k_rows_path::<F, 3>(ws, n_w, acts, n_a, out),
                    _ => k_tile_path::<F>(ws, n_w, acts, n_a, out),
                }
            }

            /// Either path, by the number of activation rows.
            #[target_feature(enable = $feat)]
            pub(super) fn tile<const F: u8>(
                ws: &[u8],
                n_w: usize,
                acts: &[u8],
                n_a: usize,
                out: &mut [f32],
            ) {
                if n_w == 0 || n_a == 0 {
                    return;
                }
                match n_a {
                    1 => rows_path::<F, 1>(ws, n_w, acts, n_a, out),
                    2 => rows_path::<F, 2>(ws, n_w, acts, n_a, out),
                    3 => rows_path::<F, 3>(ws, n_w, acts, n_a, out),
                    _ => tile_path::<F>(ws, n_w, acts, n_a, out),
                }
            }

            /// The tile kernel for `ty`, if there is one here. Callers must have checked
            /// that this ISA is available.
            pub(in crate::dot) fn tile_kernel(ty: GgmlType) -> Option<TileFn> {
                use GgmlType as T;
                Some(match ty {
                    T::Q4_0 => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { tile::<Q4_0>(w, nw, a, na, out) }
                    },
                    T::Q4_1 => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { tile::<Q4_1>(w, nw, a, na, out) }
                    },
                    T::Q5_0 => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { tile::<Q5_0>(w, nw, a, na, out) }
                    },
                    T::Q5_1 => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { tile::<Q5_1>(w, nw, a, na, out) }
                    },
                    T::Q8_0 if $q8 => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { tile::<Q8_0>(w, nw, a, na, out) }
                    },
                    T::Q2_K => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { k_tile::<Q2_K>(w, nw, a, na, out) }
                    },
                    T::Q3_K => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { k_tile::<Q3_K>(w, nw, a, na, out) }
                    },
                    T::Q4_K => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { k_tile::<Q4_K>(w, nw, a, na, out) }
                    },
                    T::Q5_K => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { k_tile::<Q5_K>(w, nw, a, na, out) }
                    },
                    T::Q6_K => |w, nw, a, na, out| {
                        // SAFETY: handed out only after run-time detection (module doc).
                        unsafe { k_tile::<Q6_K>(w, nw, a, na, out) }
                    },
                    _ => return None,
                })
            }
        }
    };
}

legacy_isa!(
    avx2,
    "avx2,f16c",
    false,
    2,
    3,
    1,
    3,
    dp | acc,
    u,
    y | _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
    ),
    hi5 | qh | _mm256_and_si256(crate::dot::x86::bits32(qh), _mm256_set1_epi8(0x10))
);

legacy_isa!(
    vnni,
    "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    true,
    4,
    3,
    2,
    3,
    dp | acc,
    u,
    y | _mm256_dpbusd_epi32(acc, u, y),
    hi5 | qh | _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10))
);
