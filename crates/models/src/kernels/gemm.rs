//! The encoders' matrix products (the vision encoder's, and a text encoder's with float
//! weights: [`crate::kernels::WeightData::Gemm`]): `a · bᵀ` for two row-major f32 matrices
//! whose rows run along the shared dimension (the projections, `x · Wᵀ`, and attention's
//! `q · kᵀ` and `p · vᵀ` with `v` transposed). An encoder input is always evaluated whole,
//! so unlike a decoder's products ([`crate::kernels::matmul`]) nothing needs an element to
//! have one row's dot bits: each element is the sum of its products in order, one fused
//! multiply-add after another (`Σ_c a[i][c] · b[j][c]`, `c = 0, 1, …`), whichever path
//! computes it.
//!
//! Laid out as the BLAS libraries do it (Goto's blocking): `b` is packed once into panels
//! of `nr` of its rows, each `[k][nr]`; a register tile of `mr × nr` outputs ([`Kernel`]:
//! 6 × 16 with AVX2, 12 × 32 with AVX-512) runs down a block of [`KC`] steps of the shared
//! dimension, each step two loads of the `b` panel and one broadcast of `a` per row (read
//! in place, a row apart: a strip of 12 rows over a block is 12 KiB) for twice as many
//! fused multiply-adds as rows. A tile's sums stay in registers over a block and in `out`
//! between blocks, so each element's products are still added in order.

use crate::pool::for_each_chunk;

/// Rows of `a` in a register tile (the portable and AVX2 kernels'; [`Kernel::mr`]).
const MR: usize = 6;
/// Rows of `b` in the portable and AVX2 kernels' tile and packed panel: two 8-lane
/// vectors ([`Kernel::nr`]).
const NR: usize = 16;
/// Steps of the shared dimension per block: a panel of `b` over them is 16 or 32 KiB, a
/// strip of `a` 6 or 12 KiB, both held in the first-level cache.
const KC: usize = 256;
/// Rows of `a` per task (a multiple of every kernel's tile rows).
const ROWS_PER_TASK: usize = 48;

/// `out[i][j] = Σ_c a[i][c] · b[j][c]`: `a` is `m × k`, `b` is `n × k`, `out` is `m × n`,
/// all row-major; `b` packed once, tasks of [`ROWS_PER_TASK`] rows of `a` spread over the
/// thread pool. Each element has the bits of the one-element rule ([`dot_in_order`] in the
/// tests), AVX-512 or AVX2 and FMA where available, the portable twin otherwise.
///
/// Panics if the slices are not those sizes.
pub(crate) fn gemm_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, out: &mut [f32]) {
    gemm_nt_with(a, b, (m, n, k), out, Kernel::best());
}

/// [`gemm_nt`] with the tile kernel `kernel`.
fn gemm_nt_with(
    a: &[f32],
    b: &[f32],
    (m, n, k): (usize, usize, usize),
    out: &mut [f32],
    kernel: Kernel,
) {
    assert_eq!(a.len(), m * k, "gemm_nt: a is m × k");
    assert_eq!(b.len(), n * k, "gemm_nt: b is n × k");
    assert_eq!(out.len(), m * n, "gemm_nt: out is m × n");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let (mr, nr) = (kernel.mr(), kernel.nr());
    let panels = n.div_ceil(nr);
    // Panel p: rows p·nr .. of b, [k][nr], zero past n.
    let mut bp = vec![0f32; panels * k * nr];
    for_each_chunk(&mut bp, k * nr, &|p, dst| {
        let rows: Vec<&[f32]> = (p * nr..n.min((p + 1) * nr))
            .map(|j| &b[j * k..][..k])
            .collect();
        // Written in order, read down the panel's rows side by side.
        for (c, d) in dst.chunks_exact_mut(nr).enumerate() {
            for (v, row) in d.iter_mut().zip(&rows) {
                *v = row[c];
            }
        }
    });
    for_each_chunk(out, ROWS_PER_TASK * n, &|t, o| {
        let (i0, rows) = (t * ROWS_PER_TASK, o.len() / n);
        let strips = rows.div_ceil(mr);
        // An edge strip's rows, zero past the task's rows ([mr][kc]).
        let mut edge = vec![0f32; mr * KC];
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for s in 0..strips {
                let n_rows = mr.min(rows - s * mr);
                let first_row = (i0 + s * mr) * k + k0;
                let strip = match n_rows == mr {
                    // A whole strip is read in place, row i at i · k.
                    true => (&a[first_row..], k),
                    false => {
                        edge.fill(0.0);
                        for r in 0..n_rows {
                            edge[r * kc..][..kc].copy_from_slice(&a[first_row + r * k..][..kc]);
                        }
                        (&edge[..], kc)
                    }
                };
                for p in 0..panels {
                    let bpan = &bp[(p * k + k0) * nr..][..kc * nr];
                    let cols = nr.min(n - p * nr);
                    let at = s * mr * n + p * nr;
                    let size = (n_rows, cols);
                    kernel.run(strip, bpan, kc, (&mut o[at..], n), size, k0 == 0);
                }
            }
        }
    });
}

/// The most rows and columns of a register tile (AVX-512's).
const MR_MAX: usize = 12;
const NR_MAX: usize = 32;

/// The register-tile kernels, chosen once per product by what the processor has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The widest kernel this processor runs.
    fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Kernel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// Every kernel this processor runs (for the tests).
    #[cfg(test)]
    fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Kernel::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Kernel::Avx512);
            }
        }
        v
    }

    /// Rows of its register tile: 6 (AVX2: 12 accumulators of 8 lanes, 6 × 2) or 12
    /// (AVX-512: 24 of 16 lanes, 12 × 2), as many accumulators as the registers hold
    /// beside `b`'s vectors and the broadcast.
    fn mr(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => 12,
            _ => MR,
        }
    }

    /// Columns of its register tile and of `b`'s packed panels: two vectors, so that each
    /// step's loads (two of `b`, a broadcast of `a` per row) stay fewer than its fused
    /// multiply-adds.
    fn nr(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => 32,
            _ => NR,
        }
    }

    /// `c += a · bpanᵀ` over `kc` steps for a tile of `size` (rows, columns) at the
    /// start of `c` (rows of `ldc`): row `r` of `a` at `r · lda`, `bpan` `[kc][nr]`; `first`:
    /// the sums start at 0 instead of `c`. A whole tile is read and written in place, an
    /// edge tile through a copy.
    fn run(
        self,
        apan: (&[f32], usize),
        bpan: &[f32],
        kc: usize,
        (c, ldc): (&mut [f32], usize),
        size: (usize, usize),
        first: bool,
    ) {
        let (mr, nr) = (self.mr(), self.nr());
        if size == (mr, nr) {
            return self.tile(apan, bpan, kc, (c, ldc), first);
        }
        let mut t = [0f32; MR_MAX * NR_MAX];
        if !first {
            for r in 0..size.0 {
                t[r * nr..][..size.1].copy_from_slice(&c[r * ldc..][..size.1]);
            }
        }
        self.tile(apan, bpan, kc, (&mut t, nr), first);
        for r in 0..size.0 {
            c[r * ldc..][..size.1].copy_from_slice(&t[r * nr..][..size.1]);
        }
    }

    /// [`Kernel::run`] on a whole tile.
    fn tile(
        self,
        apan: (&[f32], usize),
        bpan: &[f32],
        kc: usize,
        c: (&mut [f32], usize),
        first: bool,
    ) {
        let (mr, nr) = (self.mr(), self.nr());
        assert!(
            apan.1 >= kc
                && apan.0.len() >= (mr - 1) * apan.1 + kc
                && bpan.len() >= kc * nr
                && c.0.len() >= (mr - 1) * c.1 + nr,
            "tile: short panels or output"
        );
        match self {
            Kernel::Portable => tile_portable(apan, bpan, kc, c, first),
            // SAFETY: `best` and `available` name these kernels only where the processor
            // has their features; the lengths are checked above.
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            Kernel::Avx2 => unsafe { tile_avx2(apan, bpan, kc, c, first) },
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            Kernel::Avx512 => unsafe { tile_avx512(apan, bpan, kc, c, first) },
        }
    }
}

/// The portable tile of [`MR`] × [`NR`]: each element's fused multiply-adds in order.
fn tile_portable(
    (a, lda): (&[f32], usize),
    bpan: &[f32],
    kc: usize,
    (c, ldc): (&mut [f32], usize),
    first: bool,
) {
    let mut t = [[0f32; NR]; MR];
    if !first {
        for (r, tr) in t.iter_mut().enumerate() {
            tr.copy_from_slice(&c[r * ldc..][..NR]);
        }
    }
    for s in 0..kc {
        let bv = &bpan[s * NR..][..NR];
        for (r, tr) in t.iter_mut().enumerate() {
            let x = a[r * lda + s];
            for (acc, &y) in tr.iter_mut().zip(bv) {
                *acc = x.mul_add(y, *acc);
            }
        }
    }
    for (r, tr) in t.iter().enumerate() {
        c[r * ldc..][..NR].copy_from_slice(tr);
    }
}

/// [`tile_portable`] with AVX2 and FMA: twelve 8-lane accumulators (6 rows × 2), one
/// broadcast of `a` and two loads of `b` per step.
///
/// # Safety
/// The processor has AVX2 and FMA; `apan` holds `kc · 6` values, `bpan` `kc · 16`, `c`
/// at least `5 · ldc + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
unsafe fn tile_avx2(
    (a, lda): (&[f32], usize),
    bpan: &[f32],
    kc: usize,
    (c, ldc): (&mut [f32], usize),
    first: bool,
) {
    use std::arch::x86_64::*;
    let cp = c.as_mut_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    if !first {
        for (r, a) in acc.iter_mut().enumerate() {
            a[0] = _mm256_loadu_ps(cp.add(r * ldc));
            a[1] = _mm256_loadu_ps(cp.add(r * ldc + 8));
        }
    }
    let (ap, bp) = (a.as_ptr(), bpan.as_ptr());
    for s in 0..kc {
        let b0 = _mm256_loadu_ps(bp.add(s * NR));
        let b1 = _mm256_loadu_ps(bp.add(s * NR + 8));
        for (r, a) in acc.iter_mut().enumerate() {
            let x = _mm256_broadcast_ss(&*ap.add(r * lda + s));
            a[0] = _mm256_fmadd_ps(x, b0, a[0]);
            a[1] = _mm256_fmadd_ps(x, b1, a[1]);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(cp.add(r * ldc), a[0]);
        _mm256_storeu_ps(cp.add(r * ldc + 8), a[1]);
    }
}

/// [`tile_portable`] with AVX-512 on 12 rows of 32: twenty-four 16-lane accumulators,
/// two loads of `b` and twelve broadcasts of `a` per step.
///
/// # Safety
/// The processor has AVX-512F; `apan` holds `kc · 12` values, `bpan` `kc · 32`, `c` at
/// least `11 · ldc + 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
unsafe fn tile_avx512(
    (a, lda): (&[f32], usize),
    bpan: &[f32],
    kc: usize,
    (c, ldc): (&mut [f32], usize),
    first: bool,
) {
    use std::arch::x86_64::*;
    const R: usize = 12;
    const W: usize = 32;
    let cp = c.as_mut_ptr();
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    if !first {
        for (r, a) in acc.iter_mut().enumerate() {
            a[0] = _mm512_loadu_ps(cp.add(r * ldc));
            a[1] = _mm512_loadu_ps(cp.add(r * ldc + 16));
        }
    }
    let (ap, bp) = (a.as_ptr(), bpan.as_ptr());
    for s in 0..kc {
        let b0 = _mm512_loadu_ps(bp.add(s * W));
        let b1 = _mm512_loadu_ps(bp.add(s * W + 16));
        for (r, a) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*ap.add(r * lda + s));
            a[0] = _mm512_fmadd_ps(x, b0, a[0]);
            a[1] = _mm512_fmadd_ps(x, b1, a[1]);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(cp.add(r * ldc), a[0]);
        _mm512_storeu_ps(cp.add(r * ldc + 16), a[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One output element as every kernel computes it: `Σ_c x[c] · y[c]`, one fused
    /// multiply-add after another from 0.
    fn dot_in_order(x: &[f32], y: &[f32]) -> f32 {
        x.iter().zip(y).fold(0f32, |s, (p, q)| p.mul_add(*q, s))
    }

    /// Every kernel gives the one-element rule's bits, and the product agrees with f64
    /// sums (measured: see the message), for sizes with and without edge tiles, several
    /// blocks of the shared dimension and several tasks.
    #[test]
    fn gemm_equals_its_twin_and_f64() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut worst = 0f64;
        for (m, n, k) in [
            (4, 3, 8),
            (5, 7, 19),
            (33, 100, 64),
            (1, 1, 3),
            (70, 98, 37),
            (50, 17, 600),
            (6, 16, 0),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            for kernel in Kernel::available() {
                let mut out = vec![f32::NAN; m * n];
                gemm_nt_with(&a, &b, (m, n, k), &mut out, kernel);
                for i in 0..m {
                    for j in 0..n {
                        let (x, y) = (&a[i * k..][..k], &b[j * k..][..k]);
                        let twin = dot_in_order(x, y);
                        assert_eq!(
                            out[i * n + j].to_bits(),
                            twin.to_bits(),
                            "{kernel:?} {m}×{n}×{k} ({i}, {j})"
                        );
                        let exact: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
                        worst = worst.max((out[i * n + j] as f64 - exact).abs());
                    }
                }
            }
        }
        // Measured 2.0e-5 at most (sums of up to 600 products of magnitude ≤ 1, each
        // added in order).
        assert!(worst < 1e-4, "worst |Δ| against f64: {worst}");
        eprintln!("gemm_nt: worst |Δ| against f64 {worst:e}");
    }
}
