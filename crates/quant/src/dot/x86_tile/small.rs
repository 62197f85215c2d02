//! Small-batch tile kernels (3 to 8 activation rows: the decode step of a continuous
//! batching server) for the five legacy formats on AVX-512 VNNI, with 512-bit vectors.
//!
//! The lanes of one 512-bit accumulator hold `Q` consecutive blocks of one weight row
//! against each of `16 / Q` activation rows (lane `q + Q * r`: block `Q * p + q`,
//! activation row `r`; `Q = 2` for 5..=8 rows, `Q = 4` for 3 or 4 rows). Per group `p`
//! of `Q` blocks and dword `j` of the blocks:
//!
//! - the weight side is `Q` dwords (`j` of each block, decoded to unsigned values)
//!   broadcast to every row's lanes, one load: the weight row is decoded once per call
//!   into that interleaved layout (a single permute per group, no transpose);
//! - the activation side (prepared once per call, shared by every weight row) holds
//!   dword `j` of block `Q * p + q` of row `r` in lane `q + Q * r`;
//!
//! so eight `vpdpbusd` give the `16` exact block sums of the group, with no horizontal
//! sums. Two weight rows share every activation load.
//!
//! The `f32` tail is the scalar one on 16 lanes: `block_sym` / `block_min` (the same
//! products in the same order, no FMA), block `b` added into the accumulator that holds
//! lane `b % 8` (accumulator `(b % 8) / Q`, lane `b % Q + Q * r`), and at the end the
//! fixed lane tree `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))` formed with
//! in-lane swaps, left operands on the left. A partial last group is added under a lane
//! mask. Every result therefore has the bits of `dot_scalar`.
//!
//! Safety: the functions are reached only through [`tile_kernel`], which
//! `super::super::kernel` hands out only for `Isa::Avx512Vnni` after run-time detection.
//! The entry point checks every length (`geometry`) before any raw-pointer read.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::vnni::{decode, prep_act};
use super::{f16x8, AGroup};
use super::{geometry, has_min, wb, AB, AZERO, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::dot::TileFn;
use crate::GgmlType;

/// Weight-row pairs ahead that [`small_path`] prefetches.
const PREFETCH_PAIRS: usize = 2;

/// Prepared data of one call: the activation side (`aq` per group and dword, `ad`,
/// `aoff`, `ays` per group, 16 lanes each) and the weight side of two weight rows
/// (`wq`: per group `8 * Q` dwords, `wd`/`wm`: widened scales and mins per block).
#[derive(Default)]
struct Bufs {
    aq: Vec<[u32; 16]>,
    ad: Vec<[f32; 16]>,
    aoff: Vec<[i32; 16]>,
    ays: Vec<[f32; 16]>,
    wq: Vec<u32>,
    wd: Vec<f32>,
    wm: Vec<f32>,
    /// What the activation side was prepared from: the format, `Q`, the row count and a
    /// copy of the activation bytes. The preparation is a pure function of these, so the next call
    /// with the same ones (the next tile of the same matrix product) reuses it.
    prepared_for: Option<(u8, usize, usize)>,
    prepared_acts: Vec<u8>,
}

thread_local! {
    /// Reused buffers, so a call allocates only when it needs more room than any earlier
    /// call on this thread.
    static BUFS: RefCell<Bufs> = RefCell::new(Bufs::default());
}

/// `Q` dwords at `p` repeated over the 16 lanes.
///
/// # Safety
/// `4 * Q` readable bytes at `p`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn bcast<const Q: usize>(p: *const u32) -> __m512i {
    // SAFETY: `4 * Q` readable bytes (caller).
    unsafe {
        match Q {
            2 => _mm512_set1_epi64(p.cast::<i64>().read_unaligned()),
            _ => _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())),
        }
    }
}

/// The weight group of blocks `Q * p .. Q * p + Q` (zero past `nb`), interleaved: dword
/// `j * Q + q` = dword `j` of block `Q * p + q`, into the `8 * Q` dwords at `out`.
///
/// # Safety
/// `nb` blocks of `wb(F)` bytes readable at `w`, `Q * p < nb`, `8 * Q` writable dwords at
/// `out`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn prep_w_group<const F: u8, const Q: usize>(
    w: *const u8,
    nb: usize,
    p: usize,
    out: *mut u32,
) {
    let u: [__m256i; Q] = std::array::from_fn(|q| {
        let b = Q * p + q;
        if b < nb {
            // SAFETY: block `b < nb` is readable (caller).
            unsafe { decode::<F>(w.add(b * wb(F))) }
        } else {
            _mm256_setzero_si256()
        }
    });
    // SAFETY (stores): `8 * Q` dwords writable at `out` (caller).
    unsafe {
        if Q == 2 {
            let idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            let v = _mm512_permutex2var_epi32(
                _mm512_castsi256_si512(u[0]),
                idx,
                _mm512_castsi256_si512(u[1]),
            );
            _mm512_storeu_si512(out.cast(), v);
        } else {
            let z01 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(u[0]), u[1]);
            let z23 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(u[2]), u[3]);
            let lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
            let hi = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
            _mm512_storeu_si512(out.cast(), _mm512_permutex2var_epi32(z01, lo, z23));
            _mm512_storeu_si512(out.add(16).cast(), _mm512_permutex2var_epi32(z01, hi, z23));
        }
    }
}

/// Prepares weight row `w` (`nb` blocks, `np` groups of `Q`): interleaved quants into
/// `q` (`8 * Q * np` dwords), scales and mins into `d`, `m` (`8 * nb.div_ceil(8)` each).
///
/// # Safety
/// `nb` blocks readable at `w`; the slices as long as stated.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn prep_w_row<const F: u8, const Q: usize>(
    w: *const u8,
    nb: usize,
    q: &mut [u32],
    d: &mut [f32],
    m: &mut [f32],
) {
    let np = nb.div_ceil(Q);
    assert!(q.len() >= 8 * Q * np && d.len() >= 8 * nb.div_ceil(8) && m.len() >= d.len());
    for p in 0..np {
        // SAFETY: `Q * p < nb`; group `p` has `8 * Q` dwords in `q` (asserted).
        unsafe { prep_w_group::<F, Q>(w, nb, p, q.as_mut_ptr().add(8 * Q * p)) };
    }
    for g in 0..nb.div_ceil(8) {
        let n = (nb - 8 * g).min(8);
        // SAFETY: blocks `8g..8g+n` are readable; scales at 0..2, mins at 2..4; the
        // stores are 8 f32s at `8g`, inside `d` and `m` (asserted).
        unsafe {
            let wg = w.add(8 * g * wb(F));
            _mm256_storeu_ps(d.as_mut_ptr().add(8 * g), f16x8(wg, wb(F), 0, n));
            if has_min(F) {
                _mm256_storeu_ps(m.as_mut_ptr().add(8 * g), f16x8(wg, wb(F), 2, n));
            }
        }
    }
}

/// Two prepared weight rows against the prepared activations: the lane accumulators
/// (`8 / Q` vectors per weight row, see the module doc).
///
/// # Safety
/// `wq[i]` holds `8 * Q * np` dwords, `wd[i]`/`wm[i]` `Q * np` floats; `aq` `8 * np`
/// vectors, `ad`/`aoff`/`ays` `np` vectors.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn micro<const F: u8, const Q: usize>(
    wq: [*const u32; 2],
    wd: [*const f32; 2],
    wm: [*const f32; 2],
    b: &Bufs,
    np: usize,
    last_mask: __mmask16,
) -> [[__m512; 4]; 2] {
    let bcast_ps = |p: *const f32| {
        // SAFETY: `Q` readable floats at `p` (the caller's bounds).
        unsafe { _mm512_castsi512_ps(bcast::<Q>(p.cast())) }
    };
    let mut acc = [[_mm512_setzero_ps(); 4]; 2];
    let per = 8 / Q;
    for g in 0..np.div_ceil(per) {
        // `pp` runs over a constant range (no early exit), so the loop unrolls and every
        // accumulator stays in a register.
        for pp in 0..per {
            let p = g * per + pp;
            if p < np {
                // Two chains per weight row (even and odd dwords) halve the latency.
                let mut s = [[_mm512_setzero_si512(); 2]; 2];
                for j in 0..8 {
                    // SAFETY: `p < np`: vector `8p + j` of `aq` and `Q` dwords at
                    // `8Qp + Qj` of each `wq[i]` are readable (caller).
                    unsafe {
                        let a = _mm512_loadu_si512(b.aq.as_ptr().add(8 * p + j).cast());
                        for i in 0..2 {
                            let w = bcast::<Q>(wq[i].add(8 * Q * p + Q * j));
                            s[i][j % 2] = _mm512_dpbusd_epi32(s[i][j % 2], w, a);
                        }
                    }
                }
                // SAFETY: `p < np` vectors in each activation buffer (caller).
                let (dx, off, ys) = unsafe {
                    (
                        _mm512_loadu_ps(b.ad.as_ptr().add(p).cast()),
                        _mm512_loadu_si512(b.aoff.as_ptr().add(p).cast()),
                        _mm512_loadu_ps(b.ays.as_ptr().add(p).cast()),
                    )
                };
                for i in 0..2 {
                    // SAFETY: `Q` floats at `Qp` of `wd[i]` / `wm[i]` (caller).
                    let dw = bcast_ps(unsafe { wd[i].add(Q * p) });
                    let isum = _mm512_add_epi32(s[i][0], s[i][1]);
                    let isum = if has_min(F) {
                        isum
                    } else {
                        _mm512_sub_epi32(isum, off)
                    };
                    let mut v = _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum));
                    if has_min(F) {
                        // SAFETY: as for `dw`.
                        let mw = bcast_ps(unsafe { wm[i].add(Q * p) });
                        v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(mw, dx), ys));
                    }
                    acc[i][pp] = if p + 1 < np {
                        _mm512_add_ps(acc[i][pp], v)
                    } else {
                        _mm512_mask_add_ps(acc[i][pp], last_mask, acc[i][pp], v)
                    };
                }
            }
        }
    }
    acc
}

/// The lane tree of every activation row: lane `Q * r` of the result.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn finish<const Q: usize>(acc: &[__m512; 4]) -> __m512 {
    let pair = |a: __m512| _mm512_add_ps(a, _mm512_permute_ps::<0xB1>(a));
    if Q == 2 {
        // Lane 2r of `pair(acc[k])` is l(2k) + l(2k+1).
        _mm512_add_ps(
            _mm512_add_ps(pair(acc[0]), pair(acc[1])),
            _mm512_add_ps(pair(acc[2]), pair(acc[3])),
        )
    } else {
        // Lane 4r of `quad(acc[k])` is (l(4k) + l(4k+1)) + (l(4k+2) + l(4k+3)).
        let quad = |a: __m512| {
            let x = pair(a);
            _mm512_add_ps(x, _mm512_permute_ps::<0x4E>(x))
        };
        _mm512_add_ps(quad(acc[0]), quad(acc[1]))
    }
}

/// Prepares the activation side of `n_a` rows (`ab` bytes each, `nb` blocks) into `b`'s
/// `aq`, `ad`, `aoff` and `ays` (see the module doc).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn prep_acts<const F: u8, const Q: usize>(
    b: &mut Bufs,
    acts: &[u8],
    n_a: usize,
    ab: usize,
    nb: usize,
) {
    let (np, ng) = (nb.div_ceil(Q), nb.div_ceil(8));
    b.aq.clear();
    b.aq.resize(8 * np, [0; 16]);
    b.ad.clear();
    b.ad.resize(np, [0.0; 16]);
    b.aoff.clear();
    b.aoff.resize(np, [0; 16]);
    b.ays.clear();
    b.ays.resize(np, [0.0; 16]);
    let mut grp: AGroup = AZERO;
    for r in 0..n_a {
        let row = &acts[r * ab..][..ab];
        for g in 0..ng {
            // SAFETY: `row` is a whole row of `nb` blocks (geometry); `8g < nb`.
            unsafe { prep_act::<F, false>(row.as_ptr(), nb, g, &mut grp) };
            for k in 0..(nb - 8 * g).min(8) {
                let blk = 8 * g + k;
                let (p, lane) = (blk / Q, blk % Q + Q * r);
                b.ad[p][lane] = grp.d[k];
                b.aoff[p][lane] = grp.off[k];
                b.ays[p][lane] = grp.ys[k];
                let qs = &row[blk * AB + 2..][..32];
                for (j, c) in qs.chunks_exact(4).enumerate() {
                    b.aq[8 * p + j][lane] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }
}

/// The small-batch path: `n_a * Q <= 16` activation rows.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn small_path<const F: u8, const Q: usize>(
    ws: &[u8],
    n_w: usize,
    acts: &[u8],
    n_a: usize,
    out: &mut [f32],
) {
    let (wrb, ab, nb) = geometry(F, ws, n_w, acts, n_a, out);
    assert!(n_a * Q <= 16, "small_path: {n_a} rows of {Q} blocks");
    let np = nb.div_ceil(Q);
    let ng = nb.div_ceil(8);
    let rem = nb - (np - 1) * Q;
    let last_mask = (0..16).fold(0u16, |m, l| m | (u16::from(l % Q < rem) << l));
    BUFS.with_borrow_mut(|b| {
        let acts = &acts[..n_a * ab];
        if b.prepared_for != Some((F, Q, n_a)) || b.prepared_acts[..] != *acts {
            prep_acts::<F, Q>(b, acts, n_a, ab, nb);
            b.prepared_for = Some((F, Q, n_a));
            b.prepared_acts.clear();
            b.prepared_acts.extend_from_slice(acts);
        }
        let (qn, dn) = (8 * Q * np, 8 * ng);
        b.wq.clear();
        b.wq.resize(2 * qn, 0);
        b.wd.clear();
        b.wd.resize(2 * dn, 0.0);
        b.wm.clear();
        b.wm.resize(2 * dn, 0.0);
        for i0 in (0..n_w).step_by(2) {
            let two = i0 + 1 < n_w;
            // The weight rows PREFETCH_PAIRS pairs ahead, while this pair computes: the
            // rows stream from memory and nothing else hides their latency (measured:
            // a third of this path's time stalled on the first loads of each row).
            let ahead = (i0 + 2 * PREFETCH_PAIRS) * wrb;
            let end = (ahead + 2 * wrb).min(ws.len());
            for off in (ahead..end).step_by(64) {
                // SAFETY: `off < ws.len()`: the address is inside `ws` (and a prefetch
                // never faults anyway).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ws.as_ptr().add(off).cast()) };
            }
            for s in 0..1 + usize::from(two) {
                let w = &ws[(i0 + s) * wrb..][..wrb];
                // SAFETY: `w` is a whole row of `nb` blocks; the slices are `qn` / `dn` long.
                unsafe {
                    prep_w_row::<F, Q>(
                        w.as_ptr(),
                        nb,
                        &mut b.wq[s * qn..][..qn],
                        &mut b.wd[s * dn..][..dn],
                        &mut b.wm[s * dn..][..dn],
                    )
                };
            }
            // A lone last row is computed twice; the copy is dropped.
            let s1 = usize::from(two);
            let wq = [b.wq.as_ptr(), b.wq[s1 * qn..].as_ptr()];
            let wd = [b.wd.as_ptr(), b.wd[s1 * dn..].as_ptr()];
            let wm = [b.wm.as_ptr(), b.wm[s1 * dn..].as_ptr()];
            // SAFETY: each weight pointer starts `qn` dwords or `dn >= Q * np` floats; the
            // activation buffers hold `8 * np` and `np` vectors.
            let acc = unsafe { micro::<F, Q>(wq, wd, wm, b, np, last_mask) };
            for (s, acc) in acc.iter().enumerate().take(1 + s1) {
                let mut lanes = [0f32; 16];
                // SAFETY: `lanes` is 16 f32s.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), finish::<Q>(acc)) };
                for r in 0..n_a {
                    out[r * n_w + i0 + s] = lanes[Q * r];
                }
            }
        }
    });
}

/// Small batches on the small-batch path, anything else on the VNNI tile kernel.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile<const F: u8>(ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
    if n_w == 0 || n_a == 0 {
        return;
    }
    match n_a {
        3 | 4 => small_path::<F, 4>(ws, n_w, acts, n_a, out),
        5..=8 => small_path::<F, 2>(ws, n_w, acts, n_a, out),
        _ => super::vnni::tile::<F>(ws, n_w, acts, n_a, out),
    }
}

/// The AVX-512 VNNI tile kernel for `ty`: the small-batch path for the legacy formats,
/// otherwise `super::vnni`'s. Callers must have checked that the ISA is available.
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
        T::Q8_0 => |w, nw, a, na, out| {
            // SAFETY: handed out only after run-time detection (module doc).
            unsafe { tile::<Q8_0>(w, nw, a, na, out) }
        },
        _ => return super::vnni::tile_kernel(ty),
    })
}
