//! AVX2 kernels on the packed layout of `super::pack`: eight weight rows in the lanes of
//! every register, up to four activation rows per pass; and their AVX-512 VNNI twins
//! ([`rows_q4_k_512`], [`rows_q6_k_512`], [`rows_legacy_512`]), two steps of the eight
//! rows per 512-bit register and `dpbusd` in i32 (the same single stream of the group,
//! about half the instructions per weight byte).
//!
//! Per block and activation row, the integers are those of `super::scalar` (exact sums in
//! another order, which integers do not see):
//! - Q4_K: per chunk, `maddubs(u, y)` pair sums (each `|.| <= 15 * 128 * 2 = 3840`) are
//!   added in i16 over the chunk's four steps of two products (`<= 8 * 3840 = 30720 <
//!   2^15`), then multiplied by the chunk's scale as i16 pairs (`madd`, exact in i32);
//!   `summ = sum_p madd((min 2p, min 2p+1), (bsum pair 2p, bsum pair 2p+1))`, the
//!   activation's pair sums `|bsum_2j + bsum_2j+1| <= 4096`.
//! - Q6_K: the unsigned 6-bit values (`<= 63`: pair sums `<= 16128`) are added in i16 over
//!   two steps (`<= 32256 < 2^15`), then multiplied by the group's signed scale; the
//!   offset term `32 * sum_g sc_g * bsum_g` by `madd` of the scale pairs with the bsum
//!   pairs.
//!
//! The block value is `super::block_k_min` / `super::block_k` on eight lanes (the same
//! `f32` operations, no FMA), added into accumulator `b % 8`; the accumulators are
//! combined in `super::Lanes::finish`'s tree. So every lane has the bits of the scalar
//! kernel on its row.
//!
//! Safety: [`dot_groups`] is called only after `Isa::Avx2.is_available()` (AVX2 and F16C
//! detected at run time), with `wide` only after `Isa::Avx512Vnni.is_available()`, and
//! after `Packed::dot_groups` checked that the groups lie in the packed matrix and `acts`
//! holds `n_a` rows of `nb` Q8_K blocks; every pointer below is derived from those two
//! slices within those bounds.

use std::arch::x86_64::*;

use super::pack::{
    Legacy, Packed, PrefetchHint, GROUP, Q4K_DMIN, Q4K_MINS, Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_QH,
    Q6K_SCALES,
};
use super::x86_tile::{legacy_type, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::TileSink;
use crate::GgmlType;

/// Bytes of one Q8_K activation block: f32 d, 256 i8 quants, 16 i16 bsums.
const KAB: usize = 292;

/// Activation rows per pass over a group (registers: four rows' accumulators, the
/// weights and their decoded halves).
const RA: usize = 4;

/// Bytes of one Q8_0 activation block: f16 d, 32 i8 quants.
const LAB: usize = 34;

thread_local! {
    /// Per activation row and block, the sum of its quants (legacy formats).
    static YSUMS: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// See the module documentation: requires AVX2 + F16C and checked bounds; with `wide`
/// (AVX-512 F/BW/VL/VNNI detected as well) the 512-bit kernels run; the group kernels
/// prefetch with `hint`.
pub(super) fn dot_groups(
    p: &Packed,
    g0: usize,
    n_g: usize,
    acts: &[u8],
    n_a: usize,
    (wide, hint): (bool, PrefetchHint),
    sink: &mut TileSink<'_>,
) {
    let (pb, nb) = p.geometry();
    let data = p.data();
    let legacy = p.ty().block_size() == 32;
    let ab = nb * if legacy { LAB } else { KAB };
    assert!((g0 + n_g) * nb * pb <= data.len() && acts.len() == n_a * ab);
    let run: GroupFn = match hint {
        PrefetchHint::Nta => group_fn_of::<NTA>(p.ty(), wide),
        PrefetchHint::T0 => group_fn_of::<T0>(p.ty(), wide),
        PrefetchHint::T1 => group_fn_of::<T1>(p.ty(), wide),
    };
    YSUMS.with_borrow_mut(|ys| {
        ys.clear();
        if legacy {
            ys.resize(n_a * nb, 0);
            // SAFETY: AVX2 detected (module note); `acts` is `n_a * nb` Q8_0 blocks.
            let exact = unsafe { block_sums(acts, ys) };
            if !exact && p.ty() == GgmlType::Q8_0 {
                // A -128 activation quant (which ggml's Q8_0 quantizer never makes)
                // would overflow the sign trick: the scalar kernel instead.
                p.dot_groups_scalar(g0, n_g, acts, n_a, sink);
                return;
            }
        }
        // Activation rows per chunk: what stays in a core's L2 beside a group's weights
        // while every group of the call passes over them.
        let chunk = ((256 << 10) / ab.max(1)).max(RA) / RA * RA;
        for r0 in (0..n_a).step_by(chunk) {
            let na = chunk.min(n_a - r0);
            for g in g0..g0 + n_g {
                let valid = (p.rows() - g * GROUP).min(GROUP);
                let mut r = 0;
                while r < na {
                    let k = (na - r).min(RA);
                    let mut res = [[0f32; GROUP]; RA];
                    let rows: [usize; RA] = std::array::from_fn(|q| r0 + r + q.min(k - 1));
                    let sums =
                        rows.map(|q| ys.get(q * nb..).map_or(std::ptr::null(), <[i32]>::as_ptr));
                    // SAFETY: AVX2 + F16C were detected (module note); group `g` lies in
                    // `data`, rows `rows[q] < n_a` lie in `acts` (asserted above) and
                    // have `nb` block sums each (legacy formats).
                    unsafe {
                        run(
                            data.as_ptr().add(g * nb * pb),
                            nb,
                            rows.map(|q| acts.as_ptr().add(q * ab)),
                            sums,
                            k,
                            &mut res,
                        );
                    }
                    for (q, v) in res.iter().enumerate().take(k) {
                        sink(r0 + r + q, (g - g0) * GROUP, &v[..valid]);
                    }
                    r += k;
                }
            }
        }
    });
}

/// The group kernel for weight type `ty` (the 512-bit ones when `wide`) with prefetch hint
/// `H` ([`NTA`], [`T0`], [`T1`]).
fn group_fn_of<const H: u8>(ty: GgmlType, wide: bool) -> GroupFn {
    match ty {
        GgmlType::Q4_K if wide => group_q4_k_512::<H>,
        GgmlType::Q4_K => group_q4_k::<H>,
        GgmlType::Q6_K if wide => group_q6_k_512::<H>,
        GgmlType::Q6_K => group_q6_k::<H>,
        GgmlType::Q4_0 if wide => group_legacy_512::<H, Q4_0>,
        GgmlType::Q4_1 if wide => group_legacy_512::<H, Q4_1>,
        GgmlType::Q5_0 if wide => group_legacy_512::<H, Q5_0>,
        GgmlType::Q5_1 if wide => group_legacy_512::<H, Q5_1>,
        _ if wide => group_legacy_512::<H, Q8_0>,
        GgmlType::Q4_0 => group_legacy::<H, Q4_0>,
        GgmlType::Q4_1 => group_legacy::<H, Q4_1>,
        GgmlType::Q5_0 => group_legacy::<H, Q5_0>,
        GgmlType::Q5_1 => group_legacy::<H, Q5_1>,
        _ => group_legacy::<H, Q8_0>,
    }
}

/// The sum of each Q8_0 block's 32 quants of `acts` into `out` (one per block); whether
/// no quant is -128.
///
/// # Safety
/// AVX2; `acts` is `out.len()` whole Q8_0 blocks.
#[target_feature(enable = "avx2")]
unsafe fn block_sums(acts: &[u8], out: &mut [i32]) -> bool {
    assert_eq!(acts.len(), out.len() * LAB);
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi8(-128);
    let mut seen = _mm256_setzero_si256();
    for (blk, o) in acts.chunks_exact(LAB).zip(out.iter_mut()) {
        // SAFETY: the block's quants are bytes 2..34.
        let y = unsafe { _mm256_loadu_si256(blk.as_ptr().add(2).cast()) };
        seen = _mm256_or_si256(seen, _mm256_cmpeq_epi8(y, low));
        // |pair sums| <= 256: exact in i16, then in i32.
        let s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, y), ones16);
        let h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0x4E>(h));
        let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0xB1>(h));
        *o = _mm_cvtsi128_si32(h);
    }
    _mm256_movemask_epi8(seen) == 0
}

/// A group kernel: `nb` packed blocks at `w`, `k` (1..=4) activation rows at `a[..k]`
/// with their block sums at `ys[..k]` (legacy formats; null otherwise).
type GroupFn =
    unsafe fn(*const u8, usize, [*const u8; RA], [*const i32; RA], usize, &mut [[f32; GROUP]; RA]);

/// The row-count dispatch of a group kernel: `$f::<H, ..., R>` for `R = k`.
macro_rules! by_rows {
    ($f:ident $(, $c:ident)?; $w:ident, $nb:ident, $a:ident, $ys:ident, $k:ident, $res:ident) => {
        match $k {
            1 => $f::<H, $($c,)? 1>($w, $nb, [$a[0]], [$ys[0]], $res),
            2 => $f::<H, $($c,)? 2>($w, $nb, [$a[0], $a[1]], [$ys[0], $ys[1]], $res),
            3 => $f::<H, $($c,)? 3>($w, $nb, [$a[0], $a[1], $a[2]], [$ys[0], $ys[1], $ys[2]], $res),
            _ => $f::<H, $($c,)? 4>($w, $nb, $a, $ys, $res),
        }
    };
}

/// A [`GroupFn`] `$name` running `$rows` (generic over the prefetch hint `H`, and over the
/// legacy format `F` with `<F>`) on `k` rows through [`by_rows`].
macro_rules! group_fn {
    ($(#[$doc:meta])* $name:ident = $rows:ident) => {
        $(#[$doc])*
        unsafe fn $name<const H: u8>(
            w: *const u8,
            nb: usize,
            a: [*const u8; RA],
            ys: [*const i32; RA],
            k: usize,
            res: &mut [[f32; GROUP]; RA],
        ) {
            // SAFETY: the caller's bounds and ISA.
            unsafe { by_rows!($rows; w, nb, a, ys, k, res) }
        }
    };
    ($(#[$doc:meta])* $name:ident<F> = $rows:ident) => {
        $(#[$doc])*
        unsafe fn $name<const H: u8, const F: u8>(
            w: *const u8,
            nb: usize,
            a: [*const u8; RA],
            ys: [*const i32; RA],
            k: usize,
            res: &mut [[f32; GROUP]; RA],
        ) {
            // SAFETY: the caller's bounds and ISA.
            unsafe { by_rows!($rows, F; w, nb, a, ys, k, res) }
        }
    };
}

group_fn!(
    /// # Safety
    /// AVX2 + F16C; `nb` packed Q4_K blocks readable at `w`; `nb` Q8_K blocks at each
    /// `a[q]`.
    group_q4_k = rows_q4_k
);
group_fn!(
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI + AVX2 + F16C; as [`group_q4_k`] otherwise.
    group_q4_k_512 = rows_q4_k_512
);
group_fn!(
    /// # Safety
    /// AVX2 + F16C; `nb` packed Q6_K blocks readable at `w`; `nb` Q8_K blocks at each
    /// `a[q]`.
    group_q6_k = rows_q6_k
);
group_fn!(
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI + AVX2 + F16C; as [`group_q6_k`] otherwise.
    group_q6_k_512 = rows_q6_k_512
);
group_fn!(
    /// # Safety
    /// AVX2 + F16C; `nb` packed blocks of format `F` readable at `w`; `nb` Q8_0 blocks
    /// at each `a[q]` and their `nb` quant sums at each `ys[q]`.
    group_legacy<F> = rows_legacy
);
group_fn!(
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI + AVX2 + F16C; as [`group_legacy`] otherwise.
    group_legacy_512<F> = rows_legacy_512
);

/// `shuffle_epi8` control giving each row lane `(s, s)` as i16 from the u8 scales of
/// eight rows at bytes `base .. base + 8` of a register holding 16 bytes twice.
const fn dup_u8(base: i8) -> [i8; 32] {
    let mut c = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        let row = (i / 4) as i8; // lanes 0..4 in the low half, 4..8 in the high half
        c[i] = if i % 2 == 0 { base + row } else { -128 };
        i += 1;
    }
    c
}

/// `shuffle_epi8` control repeating i16 `half` (0 or 1) of each 32-bit lane twice.
const fn dup_i16(half: i8) -> [i8; 32] {
    let mut c = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        let lane = (i / 4) as i8 % 4;
        c[i] = 4 * lane + 2 * half + (i % 2) as i8;
        i += 1;
    }
    c
}

const SCALE_EVEN: [i8; 32] = dup_u8(0);
const SCALE_ODD: [i8; 32] = dup_u8(8);
const PAIR_LO: [i8; 32] = dup_i16(0);
const PAIR_HI: [i8; 32] = dup_i16(1);

#[inline(always)]
fn ctrl(c: &[i8; 32]) -> __m256i {
    // SAFETY: `c` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
}

/// The activation dword at `p`, broadcast to every lane.
///
/// # Safety
/// Four readable bytes at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bcast(p: *const u8) -> __m256i {
    // SAFETY: the caller's bound.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// Eight f16 at `p`, widened.
///
/// # Safety
/// 16 readable bytes at `p`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller's bound.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
}

/// The prefetch hints of the group kernels, as their const parameter `H`
/// ([`PrefetchHint`]): `prefetchnta`, `prefetcht0`, `prefetcht1`.
const NTA: u8 = 0;
const T0: u8 = 1;
const T1: u8 = 2;

/// Bytes ahead of the block being read that the packed kernels prefetch with hint `h` (the
/// K-quants an eighth of a block per chunk, the legacy formats a block's lines per
/// block); the hardware prefetchers stop at page boundaries. A decode step streams each
/// thread's groups as one run, so the distance sets how far ahead of its reads each core
/// asks.
///
/// `NTA`: 6144. Measured on an AMD Zen 5 VM, two threads, decode steps of the real-shape
/// files alternating between distances in one process (medians over 40 rounds of 8 steps,
/// ratio to the earlier two blocks: 2368 bytes for Q4_K, 3360 for Q6_K, 2048 for the
/// legacy formats): 4096 bytes Qwen2.5-1.5B Q4_K_M 1.06, Q4_0 1.06, OLMoE 1.02,
/// Gemma-3-1B 1.06; 6144 bytes 1.12, 1.09, 1.02, 1.05; 8192 bytes 1.15, 1.07, 1.00, 1.02.
/// (On a Zen 1 VM, one core, two blocks had read as fast as four.)
///
/// `T0`: 2048 and `T1`: 6144, measured on an Intel Xeon VM (Sapphire Rapids class, two
/// threads, decode steps alternating in one process, Qwen2.5-1.5B-shaped Q4_K_M, step
/// time relative to the stored layout's, one sequence / four): T0 1024 0.83, 1536 0.85,
/// 2048 0.84-0.93 / 1.27, 3072 0.82, 4096 0.78, 6144 0.80 / 1.22; T1 2048 0.87 / 1.29,
/// 4096 0.88, 6144 0.88-0.91 / 1.34, 8192 0.88; NTA 6144 0.48 / 0.89.
const fn prefetch_bytes(h: u8) -> usize {
    match h {
        T0 => 2048,
        _ => 6144,
    }
}

/// Prefetches the `len` bytes from `p` with hint `H`: one prefetch per 64 bytes from `p`,
/// no line arithmetic (with `len` a constant the loop unrolls to `ceil(len / 64)`
/// instructions). Over consecutive ranges every line is prefetched: a byte's line holds
/// one of its range's prefetched addresses or the next range's first. A prefetch never
/// faults, so the range may pass the matrix's end. Against exactly one prefetch per line,
/// found by dividing offsets (about ten instructions of arithmetic per block or chunk),
/// one core of an AMD Zen 5 VM decodes a cache-resident matrix faster (`tile_speed
/// packed`, one row, GB/s, three alternating runs): Q4_K 1536x8960 43.4-44.1 -> 51.2-53.1,
/// Q4_0 8960x1536 33.9-34.8 -> 40.5-41.5, Q8_0 48.6-50.7 -> 58.5-61.6, Q5_0 28.7-29.6 ->
/// 33.0-34.2, Q6_K 41.9-44.8 -> 44.1-44.7.
///
/// Which hint is fastest depends on the machine ([`PrefetchHint`]). Non-temporal
/// (`prefetchnta`): a decode step reads each weight once, so its lines need not displace
/// from L2 and L3 what the serial work between the parallel steps reads next (the KV
/// cache, norms, activations, scratch). Against `T0`, kernels alternating token by token
/// in one process (AMD Zen 5 VM, 2 threads, median token time over 384 tokens): OLMoE-1B-7B
/// Q4_K_M 18117 -> 17637, 17362 -> 16739 and 19149 -> 18925 us, Qwen2.5-1.5B Q4_K_M 24187
/// -> 23843, Q4_0 20876 -> 20314, Q8_0 24271 -> 24075, Gemma-3-1B 18212 -> 17741,
/// Llama-3.1-8B 100180 -> 98990, smollm2-135m 2176 -> 2137, qwen2.5-coder-0.5b 8714 ->
/// 8498; eight sequences' steps (Qwen2.5-1.5B Q4_K_M) 43842 -> 43774 and 42506 -> 41993
/// us. On an Intel Xeon VM (Sapphire Rapids class) the same hint halves the decode speed
/// (0.48 of the stored layout's, above; there a non-temporal line goes to L1 alone and is
/// gone before its use, and the L2 streamer is not trained by it), and `T1` (into L2) is
/// the fastest of the three.
#[inline(always)]
fn prefetch_span<const H: u8>(p: *const u8, len: usize) {
    let mut o = 0;
    while o < len {
        let a = p.wrapping_add(o).cast();
        // SAFETY: `_mm_prefetch` is a hint that reads no memory architecturally; the
        // pointer is only computed (wrapping), never dereferenced.
        unsafe {
            match H {
                NTA => _mm_prefetch::<_MM_HINT_NTA>(a),
                T0 => _mm_prefetch::<_MM_HINT_T0>(a),
                _ => _mm_prefetch::<_MM_HINT_T1>(a),
            }
        }
        o += 64;
    }
}

/// Prefetches chunk `c`'s eighth of the `pb`-byte block that lies [`prefetch_bytes`]`(H)`
/// after `p` (the K-quant kernels, one call per chunk; `pb` a multiple of 8).
#[inline(always)]
fn prefetch_chunk<const H: u8>(p: *const u8, pb: usize, c: usize) {
    prefetch_span::<H>(p.wrapping_add(prefetch_bytes(H) + c * (pb / 8)), pb / 8);
}

/// Adds block value `v` of block `b` into accumulator `b % 8` of each row.
#[target_feature(enable = "avx2")]
#[inline]
fn accumulate<const R: usize>(acc: &mut [[__m256; 8]; R], b: usize, v: [__m256; R]) {
    for r in 0..R {
        acc[r][b % 8] = _mm256_add_ps(acc[r][b % 8], v[r]);
    }
}

/// `Lanes::finish`'s tree on eight accumulators, lane by lane, into `out`.
#[target_feature(enable = "avx2")]
#[inline]
fn finish<const R: usize>(acc: &[[__m256; 8]; R], out: &mut [[f32; GROUP]; RA]) {
    for r in 0..R {
        let l = &acc[r];
        let t = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3])),
            _mm256_add_ps(_mm256_add_ps(l[4], l[5]), _mm256_add_ps(l[6], l[7])),
        );
        // SAFETY: `out[r]` is 8 writable f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), t) };
    }
}

/// Q4_K: `R` activation rows against one group.
///
/// # Safety
/// As [`group_q4_k`].
#[target_feature(enable = "avx2,f16c")]
unsafe fn rows_q4_k<const H: u8, const R: usize>(
    w: *const u8,
    nb: usize,
    a: [*const u8; R],
    _ys: [*const i32; R],
    res: &mut [[f32; GROUP]; RA],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let (even, odd) = (ctrl(&SCALE_EVEN), ctrl(&SCALE_ODD));
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY (whole body): block `b < nb` of the group and of each activation row
        // (caller); every offset below is inside its block.
        unsafe {
            let p = w.add(b * super::pack::Q4K_BYTES);
            let ab = a.map(|x| x.add(b * KAB));
            let mut sumi = [_mm256_setzero_si256(); R];
            for c in 0..8 {
                prefetch_chunk::<H>(p, super::pack::Q4K_BYTES, c);
                let mut s16 = [_mm256_setzero_si256(); R];
                for s in 0..4 {
                    let wv = _mm256_loadu_si256(p.add(Q4K_QS + (4 * c + s) * 32).cast());
                    let lo = _mm256_and_si256(wv, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m4);
                    for r in 0..R {
                        let y = ab[r].add(4 + 32 * c + 4 * s);
                        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(lo, bcast(y)));
                        s16[r] =
                            _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(hi, bcast(y.add(16))));
                    }
                }
                let scb = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    p.add(Q4K_SCALES + 16 * (c / 2)).cast(),
                ));
                let sc = _mm256_shuffle_epi8(scb, if c % 2 == 0 { even } else { odd });
                for r in 0..R {
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(s16[r], sc));
                }
            }
            accumulate(&mut acc, b, q4_k_values(p, ab, sumi));
        }
    }
    finish(&acc, res);
}

/// The values of one packed Q4_K block (at `p`) against `R` activation blocks (at
/// `ab[r]`), eight row lanes each, from each row's integer sums `sumi[r]` (`sum_c
/// scale_c * sum(q * y)` over the block's chunks): `dx * d * sumi - dx * dmin * summ`
/// (`super::block_k_min`'s operations), the mins term `summ` from the activation's pair
/// sums. Shared by [`rows_q4_k`] and [`rows_q4_k_512`].
///
/// # Safety
/// AVX2 + F16C; a packed Q4_K block readable at `p`, a Q8_K block at each `ab[r]`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn q4_k_values<const R: usize>(
    p: *const u8,
    ab: [*const u8; R],
    sumi: [__m256i; R],
) -> [__m256; R] {
    // SAFETY (whole body): every offset is inside the caller's blocks.
    unsafe {
        let d = f16x8(p);
        let dm = f16x8(p.add(Q4K_DMIN));
        let mn: [__m256i; 4] = std::array::from_fn(|q| {
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(Q4K_MINS + 16 * q).cast()))
        });
        std::array::from_fn(|r| {
            let x = ab[r];
            let pairs = _mm_hadd_epi16(
                _mm_loadu_si128(x.add(260).cast()),
                _mm_loadu_si128(x.add(276).cast()),
            );
            let summ = _mm256_add_epi32(
                _mm256_add_epi32(
                    _mm256_madd_epi16(mn[0], _mm256_broadcastd_epi32(pairs)),
                    _mm256_madd_epi16(
                        mn[1],
                        _mm256_broadcastd_epi32(_mm_shuffle_epi32::<0x55>(pairs)),
                    ),
                ),
                _mm256_add_epi32(
                    _mm256_madd_epi16(
                        mn[2],
                        _mm256_broadcastd_epi32(_mm_shuffle_epi32::<0xAA>(pairs)),
                    ),
                    _mm256_madd_epi16(
                        mn[3],
                        _mm256_broadcastd_epi32(_mm_shuffle_epi32::<0xFF>(pairs)),
                    ),
                ),
            );
            let dx = _mm256_set1_ps(x.cast::<f32>().read_unaligned());
            _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[r])),
                _mm256_mul_ps(_mm256_mul_ps(dx, dm), _mm256_cvtepi32_ps(summ)),
            )
        })
    }
}

/// The activation dwords (four values each) that the halves of a 64-byte load of a
/// chunk's nibbles meet (Q4_K, Q6_K and the nibble legacy formats): steps `(0, 1)` of the
/// low nibbles meet dwords `(0, 1)` of the chunk's 32 activation bytes, their high
/// nibbles `(4, 5)`; steps `(2, 3)` meet `(2, 3)` and `(6, 7)` (see the layout in
/// `super::pack`), as [`dword_pair`] indices in that order.
#[target_feature(enable = "avx512f")]
#[inline]
fn nibble_pairs() -> [__m512i; 4] {
    [(0, 1), (4, 5), (2, 3), (6, 7)].map(|(lo, hi)| dword_pair(lo, hi))
}

/// Q4_K on AVX-512 VNNI: `R` activation rows against one group, as [`rows_q4_k`] with
/// each 64-byte load holding two steps of the eight rows (lanes `0..8` the first, `8..16`
/// the second): `dpbusd` adds four products per lane in i32 (exact: `|.| <= 32 * 15 *
/// 128` per chunk), each chunk's sum times its scale (`mullo`, the same scale in both
/// halves; `|sumi| <= 8 * 63 * 61440 < 2^31`), the halves added at the block's end: the
/// integers of [`rows_q4_k`], so the same bits. Fewer instructions per weight byte than
/// the AVX2 kernel, from the same single stream of the group.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI + AVX2 + F16C; as [`group_q4_k`] otherwise.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn rows_q4_k_512<const H: u8, const R: usize>(
    w: *const u8,
    nb: usize,
    a: [*const u8; R],
    _ys: [*const i32; R],
    res: &mut [[f32; GROUP]; RA],
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let idx = nibble_pairs();
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY (whole body): block `b < nb` of the group and of each activation row
        // (caller); every offset below is inside its block.
        unsafe {
            let p = w.add(b * super::pack::Q4K_BYTES);
            let ab = a.map(|x| x.add(b * KAB));
            let mut sumi = [_mm512_setzero_si512(); R];
            for c in 0..8 {
                prefetch_chunk::<H>(p, super::pack::Q4K_BYTES, c);
                let q = p.add(Q4K_QS + 128 * c);
                let (w01, w23) = (
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(64).cast()),
                );
                let nib = [
                    _mm512_and_si512(w01, m4),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(w01), m4),
                    _mm512_and_si512(w23, m4),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(w23), m4),
                ];
                // Chunk c's eight row scales, in both halves.
                let sc = _mm512_cvtepu8_epi32(_mm_set1_epi64x(
                    p.add(Q4K_SCALES + 8 * c).cast::<i64>().read_unaligned(),
                ));
                for r in 0..R {
                    let y =
                        _mm512_castsi256_si512(_mm256_loadu_si256(ab[r].add(4 + 32 * c).cast()));
                    let mut s = _mm512_setzero_si512();
                    for (n, i) in nib.iter().zip(&idx) {
                        s = _mm512_dpbusd_epi32(s, *n, _mm512_permutexvar_epi32(*i, y));
                    }
                    sumi[r] = _mm512_add_epi32(sumi[r], _mm512_mullo_epi32(s, sc));
                }
            }
            let sumi = sumi.map(|s| fold_steps(s));
            accumulate(&mut acc, b, q4_k_values(p, ab, sumi));
        }
    }
    finish(&acc, res);
}

/// Q6_K: `R` activation rows against one group.
///
/// # Safety
/// As [`group_q6_k`].
#[target_feature(enable = "avx2,f16c")]
unsafe fn rows_q6_k<const H: u8, const R: usize>(
    w: *const u8,
    nb: usize,
    a: [*const u8; R],
    _ys: [*const i32; R],
    res: &mut [[f32; GROUP]; RA],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let (plo, phi) = (ctrl(&PAIR_LO), ctrl(&PAIR_HI));
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY (whole body): as in `rows_q4_k`.
        unsafe {
            let p = w.add(b * super::pack::Q6K_BYTES);
            let ab = a.map(|x| x.add(b * KAB));
            // The offset term first, in a pass of its own (fewer live registers in the
            // main loop).
            let mut sumi = q6_k_offsets(p, ab);
            for c in 0..8 {
                prefetch_chunk::<H>(p, super::pack::Q6K_BYTES, c);
                let qhl = _mm256_loadu_si256(p.add(Q6K_QH + 64 * c).cast());
                let qhh = _mm256_loadu_si256(p.add(Q6K_QH + 64 * c + 32).cast());
                let scp = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(Q6K_SCALES + 16 * c).cast()));
                let (slo, shi) = (_mm256_shuffle_epi8(scp, plo), _mm256_shuffle_epi8(scp, phi));
                for half in 0..2 {
                    let mut l16 = [_mm256_setzero_si256(); R];
                    let mut h16 = [_mm256_setzero_si256(); R];
                    for s in 2 * half..2 * half + 2 {
                        let wv = _mm256_loadu_si256(p.add((4 * c + s) * 32).cast());
                        let (hl, hh) = match s {
                            0 => (_mm256_slli_epi16::<4>(qhl), _mm256_slli_epi16::<4>(qhh)),
                            1 => (_mm256_slli_epi16::<2>(qhl), _mm256_slli_epi16::<2>(qhh)),
                            2 => (qhl, qhh),
                            _ => (_mm256_srli_epi16::<2>(qhl), _mm256_srli_epi16::<2>(qhh)),
                        };
                        let lo =
                            _mm256_or_si256(_mm256_and_si256(wv, m4), _mm256_and_si256(hl, m30));
                        let hi = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m4),
                            _mm256_and_si256(hh, m30),
                        );
                        for r in 0..R {
                            let y = ab[r].add(4 + 32 * c + 4 * s);
                            l16[r] = _mm256_add_epi16(l16[r], _mm256_maddubs_epi16(lo, bcast(y)));
                            h16[r] = _mm256_add_epi16(
                                h16[r],
                                _mm256_maddubs_epi16(hi, bcast(y.add(16))),
                            );
                        }
                    }
                    for r in 0..R {
                        sumi[r] = _mm256_add_epi32(
                            sumi[r],
                            _mm256_add_epi32(
                                _mm256_madd_epi16(l16[r], slo),
                                _mm256_madd_epi16(h16[r], shi),
                            ),
                        );
                    }
                }
            }
            accumulate(&mut acc, b, q6_k_values(p, ab, sumi));
        }
    }
    finish(&acc, res);
}

/// The offset term of one packed Q6_K block (at `p`) against `R` activation blocks (at
/// `ab[r]`), eight row lanes each: `-32 * sum_g scale_g * bsum_g` (the stored values are
/// `q - 32`), where the integer sums of [`rows_q6_k`] and [`rows_q6_k_512`] start.
///
/// # Safety
/// AVX2; a packed Q6_K block readable at `p`, a Q8_K block at each `ab[r]`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn q6_k_offsets<const R: usize>(p: *const u8, ab: [*const u8; R]) -> [__m256i; R] {
    let mut off = [_mm256_setzero_si256(); R];
    for c in 0..8 {
        // SAFETY: chunk `c`'s scales and bsums lie inside the caller's blocks.
        unsafe {
            let scp = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(Q6K_SCALES + 16 * c).cast()));
            for r in 0..R {
                let bs = bcast(ab[r].add(260 + 4 * c));
                off[r] = _mm256_add_epi32(off[r], _mm256_madd_epi16(scp, bs));
            }
        }
    }
    off.map(|o| _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(o)))
}

/// The values of one packed Q6_K block (at `p`) against `R` activation blocks, from each
/// row's integer sums `sumi[r]` (offset included): `dx * d * sumi` (`super::block_k`'s
/// operations).
///
/// # Safety
/// AVX2 + F16C; a packed Q6_K block readable at `p`, a Q8_K block at each `ab[r]`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn q6_k_values<const R: usize>(
    p: *const u8,
    ab: [*const u8; R],
    sumi: [__m256i; R],
) -> [__m256; R] {
    // SAFETY: `d` and each activation block's scale lie inside the caller's blocks.
    unsafe {
        let d = f16x8(p.add(Q6K_D));
        std::array::from_fn(|r| {
            let dx = _mm256_set1_ps(ab[r].cast::<f32>().read_unaligned());
            _mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[r]))
        })
    }
}

/// Q6_K on AVX-512 VNNI: `R` activation rows against one group, as [`rows_q6_k`] with each
/// 64-byte load of low nibbles holding two steps of the eight rows (lanes `0..8` the
/// first, `8..16` the second, as [`rows_q4_k_512`]); each half's high bits are shifted
/// into place per 16-bit lane (`sllv`/`srlv`: steps 0, 1, 2, 3 shift left 4, left 2, not,
/// right 2). Per chunk the first and the second 16 values (two scales per row) have an
/// accumulator each: `dpbusd` of the unsigned 6-bit values (`|.| <= 2 * 4 * 63 * 128` per
/// lane), times the scale (`mullo`), the halves added at the block's end, where the offset
/// term [`q6_k_offsets`] starts the sum: the integers of [`rows_q6_k`] (`|sumi| <= 8 * 2 *
/// 128 * 16 * 63 * 128 + 32 * 16 * 128 * 16 * 128 < 2^31`), so the same bits.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI + AVX2 + F16C; as [`group_q6_k`] otherwise.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn rows_q6_k_512<const H: u8, const R: usize>(
    w: *const u8,
    nb: usize,
    a: [*const u8; R],
    _ys: [*const i32; R],
    res: &mut [[f32; GROUP]; RA],
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let idx = nibble_pairs();
    // Per 16-bit lane: steps (0, 1) shift their high bits left by 4 and 2, steps (2, 3)
    // right by 0 and 2.
    let (left01, right23) = (halves16(4, 2), halves16(0, 2));
    // Each row's first (even lanes of the cvtepi8 scales) and second scale, in both halves.
    let (even, odd) = (
        _mm512_set_epi32(14, 12, 10, 8, 6, 4, 2, 0, 14, 12, 10, 8, 6, 4, 2, 0),
        _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 15, 13, 11, 9, 7, 5, 3, 1),
    );
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY (whole body): block `b < nb` of the group and of each activation row
        // (caller); every offset below is inside its block.
        unsafe {
            let p = w.add(b * super::pack::Q6K_BYTES);
            let ab = a.map(|x| x.add(b * KAB));
            let off = q6_k_offsets(p, ab);
            let mut sumi = [_mm512_setzero_si512(); R];
            for c in 0..8 {
                prefetch_chunk::<H>(p, super::pack::Q6K_BYTES, c);
                let q = p.add(128 * c);
                let (w01, w23) = (
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(64).cast()),
                );
                let qh = _mm512_loadu_si512(p.add(Q6K_QH + 64 * c).cast());
                // Each half's high bits in both 256-bit halves.
                let (h0, h1) = (
                    _mm512_shuffle_i64x2::<0x44>(qh, qh),
                    _mm512_shuffle_i64x2::<0xEE>(qh, qh),
                );
                let merge = |lo4: __m512i, hi2: __m512i| {
                    _mm512_or_si512(_mm512_and_si512(lo4, m4), _mm512_and_si512(hi2, m30))
                };
                // The first 16 values of the chunk (low nibbles) and the second (high).
                let first = [
                    merge(w01, _mm512_sllv_epi16(h0, left01)),
                    merge(w23, _mm512_srlv_epi16(h0, right23)),
                ];
                let second = [
                    merge(_mm512_srli_epi16::<4>(w01), _mm512_sllv_epi16(h1, left01)),
                    merge(_mm512_srli_epi16::<4>(w23), _mm512_srlv_epi16(h1, right23)),
                ];
                let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(Q6K_SCALES + 16 * c).cast()));
                let (sc0, sc1) = (
                    _mm512_permutexvar_epi32(even, sc),
                    _mm512_permutexvar_epi32(odd, sc),
                );
                for r in 0..R {
                    let y =
                        _mm512_castsi256_si512(_mm256_loadu_si256(ab[r].add(4 + 32 * c).cast()));
                    // Dword pairs: first 16 values (0, 1), (2, 3); second (4, 5), (6, 7).
                    let s0 = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(
                            _mm512_setzero_si512(),
                            first[0],
                            _mm512_permutexvar_epi32(idx[0], y),
                        ),
                        first[1],
                        _mm512_permutexvar_epi32(idx[2], y),
                    );
                    let s1 = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(
                            _mm512_setzero_si512(),
                            second[0],
                            _mm512_permutexvar_epi32(idx[1], y),
                        ),
                        second[1],
                        _mm512_permutexvar_epi32(idx[3], y),
                    );
                    sumi[r] = _mm512_add_epi32(
                        sumi[r],
                        _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1)),
                    );
                }
            }
            let sumi: [__m256i; R] =
                std::array::from_fn(|r| _mm256_add_epi32(off[r], fold_steps(sumi[r])));
            accumulate(&mut acc, b, q6_k_values(p, ab, sumi));
        }
    }
    finish(&acc, res);
}

/// The f16 activation scale at `p`, widened and broadcast.
///
/// # Safety
/// Two readable bytes at `p`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn f16_bcast(p: *const u8) -> __m256 {
    // SAFETY: the caller's bound.
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// A legacy format (`F`): `R` activation rows against one group. Integers per block and
/// row: 4-bit values (`<= 15`) with the activation dword pair of a step summed in i16
/// over the block's four steps (`<= 4 * 2 * 15 * 128 * 2 = 30720`); 5-bit values (`<= 31`)
/// in two i16 sums, one per half (`<= 4 * 31 * 128 * 2 = 31744` each); Q8_0 by the sign
/// trick (`maddubs(|w|, sign(y, w))`, pair sums `<= 128 * 127 * 2`, exact as long as no
/// activation quant is -128: [`dot_groups`] checks) widened per step. The offset `c *
/// sum y` (Q4_0, Q5_0) comes from the activation's block sums, as does the min term.
///
/// # Safety
/// As [`group_legacy`].
#[target_feature(enable = "avx2,f16c")]
unsafe fn rows_legacy<const H: u8, const F: u8, const R: usize>(
    w: *const u8,
    nb: usize,
    a: [*const u8; R],
    ys: [*const i32; R],
    res: &mut [[f32; GROUP]; RA],
) {
    let l = const { Legacy::of(legacy_type(F)) };
    let offset = nibble_offset(F);
    let m4 = _mm256_set1_epi8(0x0F);
    let m10 = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY (whole body): block `b < nb` of the group, of each activation row and
        // of its sums (caller); every offset below is inside its block.
        unsafe {
            let p = w.add(b * l.bytes);
            prefetch_span::<H>(p.wrapping_add(prefetch_bytes(H)), l.bytes);
            let ab = a.map(|x| x.add(b * LAB));
            let mut isum = [_mm256_setzero_si256(); R];
            if F == Q8_0 {
                for s in 0..8 {
                    let wv = _mm256_loadu_si256(p.add(l.qs + 32 * s).cast());
                    let aw = _mm256_abs_epi8(wv);
                    for r in 0..R {
                        let y = _mm256_sign_epi8(bcast(ab[r].add(2 + 4 * s)), wv);
                        isum[r] = _mm256_add_epi32(
                            isum[r],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(aw, y), ones),
                        );
                    }
                }
            } else {
                let qh = l.qh.map(|h| _mm256_loadu_si256(p.add(h).cast()));
                let mut lo16 = [_mm256_setzero_si256(); R];
                let mut hi16 = [_mm256_setzero_si256(); R];
                for s in 0..4 {
                    let wv = _mm256_loadu_si256(p.add(l.qs + 32 * s).cast());
                    let mut lo = _mm256_and_si256(wv, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m4);
                    if let Some(qh) = qh {
                        let (hl, hh) = match s {
                            0 => (_mm256_slli_epi16::<4>(qh), qh),
                            1 => (_mm256_slli_epi16::<3>(qh), _mm256_srli_epi16::<1>(qh)),
                            2 => (_mm256_slli_epi16::<2>(qh), _mm256_srli_epi16::<2>(qh)),
                            _ => (_mm256_slli_epi16::<1>(qh), _mm256_srli_epi16::<3>(qh)),
                        };
                        lo = _mm256_or_si256(lo, _mm256_and_si256(hl, m10));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(hh, m10));
                    }
                    for r in 0..R {
                        let y = ab[r].add(2 + 4 * s);
                        let pl = _mm256_maddubs_epi16(lo, bcast(y));
                        let ph = _mm256_maddubs_epi16(hi, bcast(y.add(16)));
                        if qh.is_some() {
                            lo16[r] = _mm256_add_epi16(lo16[r], pl);
                            hi16[r] = _mm256_add_epi16(hi16[r], ph);
                        } else {
                            lo16[r] = _mm256_add_epi16(lo16[r], _mm256_add_epi16(pl, ph));
                        }
                    }
                }
                for r in 0..R {
                    isum[r] = _mm256_madd_epi16(lo16[r], ones);
                    if qh.is_some() {
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(hi16[r], ones));
                    }
                    if offset != 0 {
                        let c = _mm256_set1_epi32(offset * *ys[r].add(b));
                        isum[r] = _mm256_sub_epi32(isum[r], c);
                    }
                }
            }
            accumulate(&mut acc, b, legacy_values::<F, R>(p, ab, ys, b, isum));
        }
    }
    finish(&acc, res);
}

/// What a legacy format's unsigned nibbles stand above the signed values they code
/// (`q - 8` for Q4_0, `q - 16` for Q5_0; the formats with mins store the values
/// themselves): `offset * sum y` comes off each block's integer sum.
const fn nibble_offset(f: u8) -> i32 {
    match f {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    }
}

/// The values of packed legacy block `b` (at `p`) against `R` activation blocks (at
/// `ab[r]`, their quant sums at `ys[r]`), eight row lanes each, from each row's integer
/// sums `isum[r]` (offset included): `d * dx * isum` (plus `m * dx * ysum` where the
/// format has mins), `super::scalar`'s operations. Shared by [`rows_legacy`] and
/// [`rows_legacy_512`].
///
/// # Safety
/// AVX2 + F16C; a packed block of `F` readable at `p`, a Q8_0 block at each `ab[r]` and
/// block `b`'s sum at each `ys[r]` (formats with mins).
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn legacy_values<const F: u8, const R: usize>(
    p: *const u8,
    ab: [*const u8; R],
    ys: [*const i32; R],
    b: usize,
    isum: [__m256i; R],
) -> [__m256; R] {
    let l = const { Legacy::of(legacy_type(F)) };
    // SAFETY (whole body): the scales lie inside the caller's blocks.
    unsafe {
        let d = f16x8(p);
        let m = l.m.map(|m| f16x8(p.add(m)));
        std::array::from_fn(|r| {
            let dx = f16_bcast(ab[r]);
            let v = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[r]));
            match m {
                Some(m) => _mm256_add_ps(
                    v,
                    _mm256_mul_ps(_mm256_mul_ps(m, dx), _mm256_set1_ps(*ys[r].add(b) as f32)),
                ),
                None => v,
            }
        })
    }
}

/// `permutexvar` indices giving eight lanes of activation dword `lo` and eight of `hi`.
#[target_feature(enable = "avx512f")]
#[inline]
fn dword_pair(lo: i32, hi: i32) -> __m512i {
    _mm512_set_epi32(
        hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo,
    )
}

/// The two steps of a 512-bit sum added: lane `i` of the low half plus lane `i` of the
/// high half, one i32 per row of the group (the 512-bit kernels hold two steps of the
/// eight rows per register; `rows_q4_k_512`, `rows_q6_k_512`, `rows_legacy_512`).
#[target_feature(enable = "avx512f,avx2")]
#[inline]
fn fold_steps(s: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// A 512-bit vector of `a` in every 16-bit lane of its low half and `b` in its high half.
#[target_feature(enable = "avx512f")]
#[inline]
fn halves16(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// The legacy formats on AVX-512 VNNI: `R` activation rows against one group, as
/// [`rows_legacy`] with each 64-byte load holding two steps of the eight rows (lanes
/// `0..8` the first, `8..16` the second) and `dpbusd` adding four products per lane in
/// i32: the nibble formats' unsigned values (Q5's fifth bit shifted in per 16-bit lane),
/// Q8_0's signed quants as `q + 128` (`xor 0x80`) with `128 * ysum` taken off as the
/// nibble formats' offsets are. The halves are added at the block's end: the integers of
/// [`rows_legacy`] (`|.| <= 32 * 255 * 128` per lane), so the same bits.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI + AVX2 + F16C; as [`group_legacy`] otherwise.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn rows_legacy_512<const H: u8, const F: u8, const R: usize>(
    w: *const u8,
    nb: usize,
    a: [*const u8; R],
    ys: [*const i32; R],
    res: &mut [[f32; GROUP]; RA],
) {
    let l = const { Legacy::of(legacy_type(F)) };
    // Q8_0's quants are read as `q + 128`.
    let offset = if F == Q8_0 { 128 } else { nibble_offset(F) };
    let m4 = _mm512_set1_epi8(0x0F);
    let m10 = _mm512_set1_epi8(0x10);
    let flip = _mm512_set1_epi8(-128);
    // Nibble formats: steps (0, 1) meet activation dwords (0, 1) in their low nibbles and
    // (4, 5) in their high ones, steps (2, 3) dwords (2, 3) and (6, 7); Q8_0's steps
    // (2j, 2j + 1) meet dwords (2j, 2j + 1).
    let idx = nibble_pairs();
    let idx8: [__m512i; 4] = std::array::from_fn(|j| dword_pair(2 * j as i32, 2 * j as i32 + 1));
    // Q5's fifth bits (bit s of byte t: value 4s + t; bit 4 + s: value 16 + 4s + t) to
    // bit 4: the low values of steps 0..4 shift left by 4, 3, 2, 1, the high ones right
    // by 0, 1, 2, 3.
    let (lo_shift, hi_shift) = (
        [halves16(4, 3), halves16(2, 1)],
        [halves16(0, 1), halves16(2, 3)],
    );
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY (whole body): block `b < nb` of the group, of each activation row and
        // of its sums (caller); every offset below is inside its block.
        unsafe {
            let p = w.add(b * l.bytes);
            prefetch_span::<H>(p.wrapping_add(prefetch_bytes(H)), l.bytes);
            let ab = a.map(|x| x.add(b * LAB));
            let y: [__m512i; R] =
                ab.map(|x| _mm512_castsi256_si512(_mm256_loadu_si256(x.add(2).cast())));
            let mut isum = [_mm512_setzero_si512(); R];
            if F == Q8_0 {
                for (j, i) in idx8.iter().enumerate() {
                    let wv =
                        _mm512_xor_si512(_mm512_loadu_si512(p.add(l.qs + 64 * j).cast()), flip);
                    for r in 0..R {
                        isum[r] =
                            _mm512_dpbusd_epi32(isum[r], wv, _mm512_permutexvar_epi32(*i, y[r]));
                    }
                }
            } else {
                let qh = l.qh.map(|h| {
                    let q = _mm256_loadu_si256(p.add(h).cast());
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), q)
                });
                for half in 0..2 {
                    let wv = _mm512_loadu_si512(p.add(l.qs + 64 * half).cast());
                    let mut lo = _mm512_and_si512(wv, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4);
                    if let Some(qh) = qh {
                        let hl = _mm512_sllv_epi16(qh, lo_shift[half]);
                        let hh = _mm512_srlv_epi16(qh, hi_shift[half]);
                        lo = _mm512_or_si512(lo, _mm512_and_si512(hl, m10));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(hh, m10));
                    }
                    for r in 0..R {
                        let s = _mm512_dpbusd_epi32(
                            isum[r],
                            lo,
                            _mm512_permutexvar_epi32(idx[2 * half], y[r]),
                        );
                        isum[r] = _mm512_dpbusd_epi32(
                            s,
                            hi,
                            _mm512_permutexvar_epi32(idx[2 * half + 1], y[r]),
                        );
                    }
                }
            }
            let isum: [__m256i; R] = std::array::from_fn(|r| {
                let v = fold_steps(isum[r]);
                if offset != 0 {
                    _mm256_sub_epi32(v, _mm256_set1_epi32(offset * *ys[r].add(b)))
                } else {
                    v
                }
            });
            accumulate(&mut acc, b, legacy_values::<F, R>(p, ab, ys, b, isum));
        }
    }
    finish(&acc, res);
}
