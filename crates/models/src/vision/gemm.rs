//! The vision encoder's matrix products: `a · bᵀ` for two row-major f32 matrices whose rows
//! run along the shared dimension (the projections, `x · Wᵀ`, and attention's `q · kᵀ` and
//! `p · vᵀ` with `v` transposed). An encoder input is always evaluated whole, so unlike the
//! language model's products ([`crate::kernels::matmul`]) nothing needs an element to
//! have one row's dot bits: this kernel uses fused multiply-adds on tiles of 4 × 3
//! output elements, each element's sum in eight lanes combined in one fixed tree (the
//! same bits wherever the element falls in a tile).

use crate::pool::for_each_chunk;

/// Rows of `a` per task.
const ROWS_PER_TASK: usize = 32;
/// Rows of `b` read per pass over a task's rows of `a` (kept in cache: 96 rows of 768
/// floats are 288 KiB).
const B_BLOCK: usize = 96;

/// `out[i][j] = Σ_c a[i][c] · b[j][c]`: `a` is `m × k`, `b` is `n × k`, `out` is `m × n`,
/// all row-major; tasks of [`ROWS_PER_TASK`] rows of `a` spread over the thread pool. Each
/// element has the bits of the one-element rule (`dot_fma` in the tests), AVX2 and FMA
/// where available, the portable twin otherwise.
///
/// Panics if the slices are not those sizes.
pub(crate) fn gemm_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, out: &mut [f32]) {
    assert_eq!(a.len(), m * k, "gemm_nt: a is m × k");
    assert_eq!(b.len(), n * k, "gemm_nt: b is n × k");
    assert_eq!(out.len(), m * n, "gemm_nt: out is m × n");
    if m == 0 || n == 0 {
        return;
    }
    for_each_chunk(out, ROWS_PER_TASK * n, &|t, o| {
        let i0 = t * ROWS_PER_TASK;
        let rows = o.len() / n;
        for j0 in (0..n).step_by(B_BLOCK) {
            let nj = B_BLOCK.min(n - j0);
            tile_block(
                &a[i0 * k..(i0 + rows) * k],
                &b[j0 * k..(j0 + nj) * k],
                k,
                o,
                n,
                j0,
            );
        }
    });
}

/// Output columns `j0 ..` of the rows `a` (`rows × k`) against the rows `b` (`nj × k`),
/// into `o` (rows of `ldo`), in tiles of 4 × 3; an edge tile repeats its last row or
/// column and keeps only its own elements.
fn tile_block(a: &[f32], b: &[f32], k: usize, o: &mut [f32], ldo: usize, j0: usize) {
    let (rows, nj) = (a.len() / k, b.len() / k);
    for i in (0..rows).step_by(4) {
        let ni = 4.min(rows - i);
        let ar = [0, 1, 2, 3].map(|r| &a[(i + r.min(ni - 1)) * k..][..k]);
        for j in (0..nj).step_by(3) {
            let nn = 3.min(nj - j);
            let br = [0, 1, 2].map(|c| &b[(j + c.min(nn - 1)) * k..][..k]);
            let tile = tile_4x3(ar, br);
            for (r, tr) in tile.iter().enumerate().take(ni) {
                o[(i + r) * ldo + j0 + j..][..nn].copy_from_slice(&tr[..nn]);
            }
        }
    }
}

/// One output element as the tiles compute it: `Σ_c x[c] · y[c]` in eight lanes (lane `l`
/// takes `l, l + 8, …`, fused multiply-adds), combined `((l0 + l4) + (l1 + l5)) + ((l2 +
/// l6) + (l3 + l7))`, then the tail with fused multiply-adds in order.
#[cfg(test)]
fn dot_fma(x: &[f32], y: &[f32]) -> f32 {
    let k8 = x.len() / 8 * 8;
    let mut v = [0f32; 8];
    for c0 in (0..k8).step_by(8) {
        for l in 0..8 {
            v[l] = x[c0 + l].mul_add(y[c0 + l], v[l]);
        }
    }
    let mut s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
    for t in k8..x.len() {
        s = x[t].mul_add(y[t], s);
    }
    s
}

/// A 4 × 3 tile: `t[r][c] = dot_fma(a[r], b[c])`. AVX2 + FMA where available.
#[inline]
fn tile_4x3(a: [&[f32]; 4], b: [&[f32]; 3]) -> [[f32; 3]; 4] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are available (checked above).
        #[allow(unsafe_code)]
        return unsafe { tile_4x3_avx2(a, b) };
    }
    tile_4x3_portable(a, b)
}

/// [`tile_4x3`]'s twin for any machine: the same lanes, fused products and tree.
fn tile_4x3_portable(a: [&[f32]; 4], b: [&[f32]; 3]) -> [[f32; 3]; 4] {
    let k = a[0].len();
    let k8 = k / 8 * 8;
    let mut acc = [[[0f32; 8]; 3]; 4];
    for c0 in (0..k8).step_by(8) {
        for r in 0..4 {
            for c in 0..3 {
                for l in 0..8 {
                    acc[r][c][l] = a[r][c0 + l].mul_add(b[c][c0 + l], acc[r][c][l]);
                }
            }
        }
    }
    std::array::from_fn(|r| {
        std::array::from_fn(|c| {
            let v = &acc[r][c];
            let mut s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
            for t in k8..k {
                s = a[r][t].mul_add(b[c][t], s);
            }
            s
        })
    })
}

/// [`tile_4x3`] with AVX2 and FMA: twelve 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_4x3_avx2(a: [&[f32]; 4], b: [&[f32]; 3]) -> [[f32; 3]; 4] {
    use std::arch::x86_64::*;
    let k = a[0].len();
    for s in a.iter().chain(b.iter()) {
        assert_eq!(s.len(), k, "tile_4x3: rows of one length");
    }
    let k8 = k / 8 * 8;
    let z = _mm256_setzero_ps();
    let (mut c00, mut c01, mut c02, mut c10, mut c11, mut c12) = (z, z, z, z, z, z);
    let (mut c20, mut c21, mut c22, mut c30, mut c31, mut c32) = (z, z, z, z, z, z);
    let (a0, a1, a2, a3) = (a[0].as_ptr(), a[1].as_ptr(), a[2].as_ptr(), a[3].as_ptr());
    let (b0, b1, b2) = (b[0].as_ptr(), b[1].as_ptr(), b[2].as_ptr());
    let mut c0 = 0;
    while c0 < k8 {
        // SAFETY: c0 + 8 <= k8 <= k, every row's length (asserted above).
        #[allow(unsafe_code)]
        unsafe {
            let (v0, v1, v2) = (
                _mm256_loadu_ps(b0.add(c0)),
                _mm256_loadu_ps(b1.add(c0)),
                _mm256_loadu_ps(b2.add(c0)),
            );
            let u = _mm256_loadu_ps(a0.add(c0));
            c00 = _mm256_fmadd_ps(u, v0, c00);
            c01 = _mm256_fmadd_ps(u, v1, c01);
            c02 = _mm256_fmadd_ps(u, v2, c02);
            let u = _mm256_loadu_ps(a1.add(c0));
            c10 = _mm256_fmadd_ps(u, v0, c10);
            c11 = _mm256_fmadd_ps(u, v1, c11);
            c12 = _mm256_fmadd_ps(u, v2, c12);
            let u = _mm256_loadu_ps(a2.add(c0));
            c20 = _mm256_fmadd_ps(u, v0, c20);
            c21 = _mm256_fmadd_ps(u, v1, c21);
            c22 = _mm256_fmadd_ps(u, v2, c22);
            let u = _mm256_loadu_ps(a3.add(c0));
            c30 = _mm256_fmadd_ps(u, v0, c30);
            c31 = _mm256_fmadd_ps(u, v1, c31);
            c32 = _mm256_fmadd_ps(u, v2, c32);
        }
        c0 += 8;
    }
    let acc = [
        [c00, c01, c02],
        [c10, c11, c12],
        [c20, c21, c22],
        [c30, c31, c32],
    ];
    let mut t = [[0f32; 3]; 4];
    for r in 0..4 {
        for c in 0..3 {
            let mut s = crate::kernels::sum_lanes_avx2(acc[r][c]);
            for i in k8..k {
                s = a[r][i].mul_add(b[c][i], s);
            }
            t[r][c] = s;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD tile gives the portable twin's bits, and the product agrees with f64 sums
    /// (measured: see the message), for sizes with and without lane tails and edge tiles.
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
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let mut out = vec![0f32; m * n];
            gemm_nt(&a, &b, m, n, k, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (x, y) = (&a[i * k..][..k], &b[j * k..][..k]);
                    let twin = dot_fma(x, y);
                    assert_eq!(
                        out[i * n + j].to_bits(),
                        twin.to_bits(),
                        "{m}×{n}×{k} ({i}, {j})"
                    );
                    let exact: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
                    worst = worst.max((out[i * n + j] as f64 - exact).abs());
                }
            }
            if m >= 4 && n >= 3 && k >= 8 {
                let ar = [0, 1, 2, 3].map(|r| &a[r * k..(r + 1) * k]);
                let br = [0, 1, 2].map(|c| &b[c * k..(c + 1) * k]);
                let (s, p) = (tile_4x3(ar, br), tile_4x3_portable(ar, br));
                assert_eq!(
                    s.map(|r| r.map(f32::to_bits)),
                    p.map(|r| r.map(f32::to_bits))
                );
            }
        }
        // Measured 1.2e-6 at most (sums of up to 100 products of magnitude ≤ 1).
        assert!(worst < 1e-5, "worst |Δ| against f64: {worst}");
        eprintln!("gemm_nt: worst |Δ| against f64 {worst:e}");
    }
}
