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
//! - Decode (`n_a < 4`): per weight row, eight blocks at a time: decode, one product
//!   per block, a transposing horizontal sum to eight block sums, the `f32` tail on
//!   eight lanes at once. Lengths are checked once per call; the loop reads through raw
//!   pointers.
//! - Prefill (`n_a >= 4`): the weight rows of the tile are decoded once per call and
//!   the activation rows once per chunk of rows, both into a transposed layout (groups
//!   of eight blocks; vector `j` holds bytes `4j..4j+4` of each of the eight blocks), so
//!   eight products give the eight block sums with no horizontal sums. A register
//!   block of `RW` weight rows by `RA` activation rows reuses every load.
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

use super::Lanes;
use crate::GgmlType;

/// Format codes for the const-generic kernels.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

/// Bytes per weight block.
const fn wb(f: u8) -> usize {
    match f {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Whether the format has a min (`block_min`) rather than an offset (`block_sym`).
const fn has_min(f: u8) -> bool {
    matches!(f, Q4_1 | Q5_1)
}

/// The offset `c` subtracted from the unsigned weight values.
const fn offset(f: u8) -> i32 {
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
fn geometry(f: u8, ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &[f32]) -> (usize, usize, usize) {
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
fn lane_mask(n: usize) -> __m256 {
    let n = if n == 0 { 8 } else { n as i32 };
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx))
}

/// Lane `i` of the result is the sum of the eight lanes of `v[i]` (exact in `i32`).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn hsum8x8(v: &[__m256i; 8]) -> __m256i {
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s45 = _mm256_hadd_epi32(v[4], v[5]);
    let s67 = _mm256_hadd_epi32(v[6], v[7]);
    let s0123 = _mm256_hadd_epi32(s01, s23);
    let s4567 = _mm256_hadd_epi32(s45, s67);
    let lo = _mm256_permute2x128_si256::<0x20>(s0123, s4567);
    let hi = _mm256_permute2x128_si256::<0x31>(s0123, s4567);
    _mm256_add_epi32(lo, hi)
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
unsafe fn f16x8(p: *const u8, stride: usize, at: usize, n: usize) -> __m256 {
    let mut h = [0u16; 8];
    for (k, h) in h.iter_mut().enumerate().take(n) {
        // SAFETY: block `k < n` is readable (caller) and `at + 2 <= stride`.
        *h = unsafe { p.add(k * stride + at).cast::<u16>().read_unaligned() };
    }
    // SAFETY: `h` is 16 readable bytes.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr().cast()) })
}

/// Generates one ISA's legacy tile kernels. `$feat` is the target-feature list, `dp` the
/// product `acc + sum of 4 (u * y)` per i32 lane (`u` unsigned, `y` signed bytes), `hi5`
/// the Q5 high-bit bytes (0x10 where bit `i` of `qh` is set), `$q8` whether Q8_0 is
/// supported (needs a product without i16 saturation), `$rw`/`$ra` the register block.
macro_rules! legacy_isa {
    ($m:ident, $feat:literal, $q8:expr, $rw:expr, $ra:expr,
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
            unsafe fn decode<const F: u8>(p: *const u8) -> __m256i {
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
            unsafe fn prep_act<const F: u8, const T: bool>(a: *const u8, nb: usize, g: usize, out: &mut AGroup) {
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
                let (dx, ys) = unsafe { (_mm256_loadu_ps(a.d.as_ptr()), _mm256_loadu_ps(a.ys.as_ptr())) };
                let v = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
                if has_min(F) {
                    _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(mw, dx), ys))
                } else {
                    v
                }
            }

            /// `acc + v` in the lanes of `mask`, `acc` elsewhere.
            #[target_feature(enable = $feat)]
            #[inline]
            fn add_masked(acc: __m256, v: __m256, mask: __m256) -> __m256 {
                _mm256_blendv_ps(acc, _mm256_add_ps(acc, v), mask)
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
            fn rows_path<const F: u8>(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
                let (wrb, ab, nb) = geometry(F, ws, n_w, acts, n_a, out);
                let ng = nb.div_ceil(8);
                let tail = nb % 8;
                let last_mask = lane_mask(tail);
                let mut prep = vec![AZERO; ng];
                for r in 0..n_a {
                    let a = acts[r * ab..][..ab].as_ptr();
                    for (g, p) in prep.iter_mut().enumerate() {
                        // SAFETY: `a` is a whole row of `nb` blocks (geometry); `8g < nb`.
                        unsafe { prep_act::<F, false>(a, nb, g, p) };
                    }
                    for i in 0..n_w {
                        // SAFETY: row `i < n_w` of `wrb` bytes lies inside `ws` (geometry).
                        let w = unsafe { ws.as_ptr().add(i * wrb) };
                        let mut acc = _mm256_setzero_ps();
                        for (g, p) in prep.iter().enumerate() {
                            let n = (nb - 8 * g).min(8);
                            // SAFETY: blocks `8g..8g+n` of both rows are in bounds.
                            let (wg, ag) = unsafe { (w.add(8 * g * wb(F)), a.add(8 * g * AB)) };
                            let mut s = [_mm256_setzero_si256(); 8];
                            for (k, s) in s.iter_mut().enumerate().take(n) {
                                // SAFETY: block `k < n` of each row is readable.
                                *s = unsafe {
                                    let y = _mm256_loadu_si256(ag.add(k * AB + 2).cast());
                                    dp(_mm256_setzero_si256(), decode::<F>(wg.add(k * wb(F))), y)
                                };
                            }
                            let mut isum = hsum8x8(&s);
                            if !has_min(F) {
                                // SAFETY: `off` is 32 readable bytes.
                                let off = unsafe { _mm256_loadu_si256(p.off.as_ptr().cast()) };
                                isum = _mm256_sub_epi32(isum, off);
                            }
                            // SAFETY: `n` blocks readable at `wg`.
                            let (dw, mw) = unsafe {
                                let dw = f16x8(wg, wb(F), 0, n);
                                (dw, if has_min(F) { f16x8(wg, wb(F), 2, n) } else { dw })
                            };
                            let v = values::<F>(dw, mw, p, isum);
                            acc = if n == 8 { _mm256_add_ps(acc, v) } else { add_masked(acc, v, last_mask) };
                        }
                        out[r * n_w + i] = finish(acc);
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
                        let (dw, mw) = unsafe { (_mm256_loadu_ps(wg[i].d.as_ptr()), _mm256_loadu_ps(wg[i].m.as_ptr())) };
                        for r in 0..RA {
                            let mut isum = s[i][r];
                            if !has_min(F) {
                                // SAFETY: `off` is 32 readable bytes.
                                let off = unsafe { _mm256_loadu_si256(ag[r].off.as_ptr().cast()) };
                                isum = _mm256_sub_epi32(isum, off);
                            }
                            let v = values::<F>(dw, mw, ag[r], isum);
                            acc[i][r] = if full { _mm256_add_ps(acc[i][r], v) } else { add_masked(acc[i][r], v, last_mask) };
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
            fn tile_path<const F: u8>(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
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
                        for ra in (0..na).step_by(RA) {
                            // Rows past the end repeat the last row; their results are dropped.
                            let a: [*const AGroup; RA] =
                                std::array::from_fn(|k| ap[(ra + k).min(na - 1) * ng..].as_ptr());
                            for i0 in (0..n_w).step_by(RW) {
                                let w: [*const WGroup; RW] =
                                    std::array::from_fn(|k| wp[(i0 + k).min(n_w - 1) * ng..].as_ptr());
                                let mut res = [[0f32; RA]; RW];
                                // SAFETY: each pointer starts a run of `ng` prepared groups
                                // of one row (the slices above hold `ng` per row).
                                unsafe { micro::<F, RW, RA>(w, a, ng, last_mask, &mut res) };
                                for (k, res) in res.iter().enumerate().take(n_w - i0) {
                                    for (rr, v) in res.iter().enumerate().take(na - ra) {
                                        out[(r0 + ra + rr) * n_w + i0 + k] = *v;
                                    }
                                }
                            }
                        }
                    }
                });
            }

            /// Either path, by the number of activation rows.
            #[target_feature(enable = $feat)]
            fn tile<const F: u8>(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
                if n_w == 0 || n_a == 0 {
                    return;
                }
                if n_a < 4 {
                    rows_path::<F>(ws, n_w, acts, n_a, out)
                } else {
                    tile_path::<F>(ws, n_w, acts, n_a, out)
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
    dp | acc,
    u,
    y | _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
    ),
    hi5 | qh | {
        let x = _mm256_set1_epi32(qh as i32);
        let shuf = _mm256_setr_epi64x(
            0x0000_0000_0000_0000,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        );
        let x = _mm256_shuffle_epi8(x, shuf);
        let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_or_si256(x, others), _mm256_set1_epi64x(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
);

legacy_isa!(
    vnni,
    "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    true,
    4,
    3,
    dp | acc,
    u,
    y | _mm256_dpbusd_epi32(acc, u, y),
    hi5 | qh | _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10))
);
