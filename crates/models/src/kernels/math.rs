//! Element-wise math of the forward pass on eight AVX2 lanes with scalar twins of the
//! same bits: the exponential ([`fast_exp`]), SiLU ([`silu_in_place`]) and the erf GELU
//! ([`gelu_erf_in_place`]).

/// e^x by range reduction and a polynomial, defined by its operations so that the AVX2
/// form gives the same bits: `x` is first clamped to at most 88.5, then
/// `n = floor(x·log2 e + 0.5)`, `r = (x − n·C1) − n·C2` (ln 2 split in two),
/// `y = (p(r)·r² + r) + 1` with `p` the degree-5 polynomial evaluated by Horner's rule,
/// and the result `y · 2ⁿ`; every product and sum rounded on its own (never fused). The
/// constants are Cephes' `expf` (S. L. Moshier, cephes/single/expf.c). Relative error
/// under 2.4e-7 (measured 8.0e-8); `x < −126·ln 2` gives 0, `x > 88.37` gives +∞
/// (e^x passes f32's range at 88.72), NaN gives an unspecified value.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    if x < EXP_MIN {
        return 0.0;
    }
    let x = x.min(EXP_MAX);
    let n = (x * EXP_LOG2E + 0.5).floor();
    let r = (x - n * EXP_C1) - n * EXP_C2;
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p * r + c;
    }
    let y = (p * (r * r) + r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Below this, e^x is under the smallest normal f32 (`−126·ln 2`): [`fast_exp`] gives 0.
const EXP_MIN: f32 = -87.336_54;
/// Inputs are clamped to this: `n` stays at most 128 (2¹²⁸ is +∞), never wraps.
const EXP_MAX: f32 = 88.5;
const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 = C1 − C2 with C1 exact in 9 bits (Cephes expf.c).
const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
/// Cephes expf.c's polynomial, highest degree first (its last coefficient,
/// 5.0000001201e-1, is 0.5 in f32).
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// [`fast_exp`] on eight lanes (the same operations: `_mm256_min_ps` returns the bound
/// for NaN as `f32::min` does).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn exp8_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_MIN));
    let x = _mm256_min_ps(x, _mm256_set1_ps(EXP_MAX));
    let n = _mm256_floor_ps(_mm256_add_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(EXP_C1))),
        _mm256_mul_ps(n, _mm256_set1_ps(EXP_C2)),
    );
    let mut p = _mm256_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
        _mm256_set1_ps(1.0),
    );
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let e = _mm256_mul_ps(y, _mm256_castsi256_ps(scale));
    _mm256_blendv_ps(e, _mm256_setzero_ps(), under)
}

/// SiLU: `x / (1 + e^−x)` with [`fast_exp`].
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + fast_exp(-x))
}

/// `x_i = silu(x_i) · m_i` (or `silu(x_i)` without `m`) for every element: the gated
/// FFN's activation. AVX2 where available ([`silu_in_place_portable`] is the twin).
///
/// Panics if `m` is shorter than `x`.
pub fn silu_in_place(x: &mut [f32], m: Option<&[f32]>) {
    if let Some(m) = m {
        assert!(m.len() >= x.len(), "silu_in_place: multiplier length");
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above).
        #[allow(unsafe_code)]
        return unsafe { silu_in_place_avx2(x, m) };
    }
    silu_in_place_portable(x, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn silu_in_place_avx2(x: &mut [f32], m: Option<&[f32]>) {
    use std::arch::x86_64::*;
    let n8 = x.len() / 8 * 8;
    let (one, sign) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0));
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n8 <= x.len() <= m.len() (asserted by the caller).
        #[allow(unsafe_code)]
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let v = _mm256_loadu_ps(p);
            let e = exp8_avx2(_mm256_xor_ps(v, sign));
            let mut y = _mm256_div_ps(v, _mm256_add_ps(one, e));
            if let Some(m) = m {
                y = _mm256_mul_ps(y, _mm256_loadu_ps(m.as_ptr().add(i)));
            }
            _mm256_storeu_ps(p, y);
        }
        i += 8;
    }
    tail(&mut x[n8..], m.map(|m| &m[n8..]));
}

/// Abramowitz & Stegun 7.1.26: `erfc(z) ≈ t·(a1 + t·(a2 + …)) · e^(−z²)`, `t = 1/(1 + p·z)`
/// for `z ≥ 0`, absolute error under 1.5e-7 (Handbook of Mathematical Functions, 1964).
const ERF_P: f32 = 0.327_591_1;
const ERF_A: [f32; 5] = [
    1.061_405_4,
    -1.453_152,
    1.421_413_8,
    -0.284_496_74,
    0.254_829_6,
];

/// GELU with the error function, `0.5·x·(1 + erf(x/√2))` (transformers' `gelu`), from
/// [`ERF_A`]'s erfc: `0.5·x·q` for `x < 0` and `0.5·x·(2 − q)` otherwise, `q =
/// erfc(|x|/√2)`, so the negative side has no cancellation. Every product and sum rounded
/// on its own, in this order, as [`gelu_erf_in_place`]'s lanes do. Absolute error under
/// 3e-7·max(|x|, 1) against f64 (measured in the tests).
#[inline(always)]
pub fn gelu_erf_fast(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + ERF_P * z);
    let mut p = ERF_A[0];
    for &a in &ERF_A[1..] {
        p = p * t + a;
    }
    let q = (p * t) * fast_exp(-(z * z));
    let c = if x >= 0.0 { 2.0 - q } else { q };
    (0.5 * x) * c
}

/// `x_i = gelu(x_i) · m_i` (or `gelu(x_i)` without `m`) with [`gelu_erf_fast`]: BERT's and
/// ModernBERT's FFN activation (a scalar `erff` per element was 16% of a MiniLM pass). AVX2
/// where available ([`gelu_erf_in_place_portable`] is the twin, the same bits).
///
/// Panics if `m` is shorter than `x`.
pub fn gelu_erf_in_place(x: &mut [f32], m: Option<&[f32]>) {
    if let Some(m) = m {
        assert!(m.len() >= x.len(), "gelu_erf_in_place: multiplier length");
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above).
        #[allow(unsafe_code)]
        return unsafe { gelu_erf_in_place_avx2(x, m) };
    }
    gelu_erf_in_place_portable(x, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gelu_erf_in_place_avx2(x: &mut [f32], m: Option<&[f32]>) {
    use std::arch::x86_64::*;
    let n8 = x.len() / 8 * 8;
    let splat = _mm256_set1_ps;
    let sign = splat(-0.0);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n8 <= x.len() <= m.len() (asserted by the caller).
        #[allow(unsafe_code)]
        unsafe {
            let ptr = x.as_mut_ptr().add(i);
            let v = _mm256_loadu_ps(ptr);
            let z = _mm256_mul_ps(
                _mm256_andnot_ps(sign, v),
                splat(std::f32::consts::FRAC_1_SQRT_2),
            );
            let t = _mm256_div_ps(
                splat(1.0),
                _mm256_add_ps(splat(1.0), _mm256_mul_ps(splat(ERF_P), z)),
            );
            let mut p = splat(ERF_A[0]);
            for &a in &ERF_A[1..] {
                p = _mm256_add_ps(_mm256_mul_ps(p, t), splat(a));
            }
            let e = exp8_avx2(_mm256_xor_ps(_mm256_mul_ps(z, z), sign));
            let q = _mm256_mul_ps(_mm256_mul_ps(p, t), e);
            let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(v, _mm256_setzero_ps());
            let c = _mm256_blendv_ps(q, _mm256_sub_ps(splat(2.0), q), ge);
            let mut y = _mm256_mul_ps(_mm256_mul_ps(splat(0.5), v), c);
            if let Some(m) = m {
                y = _mm256_mul_ps(y, _mm256_loadu_ps(m.as_ptr().add(i)));
            }
            _mm256_storeu_ps(ptr, y);
        }
        i += 8;
    }
    gelu_tail(&mut x[n8..], m.map(|m| &m[n8..]));
}

/// [`gelu_erf_in_place`] compiled for the baseline ISA.
pub fn gelu_erf_in_place_portable(x: &mut [f32], m: Option<&[f32]>) {
    gelu_tail(x, m)
}

#[inline(always)]
fn gelu_tail(x: &mut [f32], m: Option<&[f32]>) {
    match m {
        Some(m) => x
            .iter_mut()
            .zip(m)
            .for_each(|(v, m)| *v = gelu_erf_fast(*v) * m),
        None => x.iter_mut().for_each(|v| *v = gelu_erf_fast(*v)),
    }
}

/// [`silu_in_place`] compiled for the baseline ISA.
pub fn silu_in_place_portable(x: &mut [f32], m: Option<&[f32]>) {
    tail(x, m)
}

#[inline(always)]
fn tail(x: &mut [f32], m: Option<&[f32]>) {
    match m {
        Some(m) => x.iter_mut().zip(m).for_each(|(v, m)| *v = silu(*v) * m),
        None => x.iter_mut().for_each(|v| *v = silu(*v)),
    }
}

/// The decay of a state-space step ([`ssm_step`]).
#[derive(Clone, Copy, Debug)]
pub enum Decay<'a> {
    /// Per state value: `e^(Δ · a[j])` (Mamba-1, [`fast_exp`]).
    PerState { delta: f32, a: &'a [f32] },
    /// One factor for every value (Mamba-2's `e^(Δ · A)` of the head).
    Scalar(f32),
}

/// One position of a state-space scan over one channel's `d_state` values (Mamba-1's
/// channel, a Mamba-2 head dimension): `h[j] = decay_j · h[j] + b[j] · dx` and the output
/// `Σ_j h[j] · c[j]`, every product and sum rounded on its own. The sum's order: eight
/// lane sums (lane `l` takes `j ≡ l mod 8` of the leading multiple of 8, in order), added
/// as `((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7))`, then the remaining `j` one by one. AVX2
/// where available ([`ssm_step_portable`] is the twin, the same bits).
///
/// Panics if `a` (per-state decay), `b` or `c` is shorter than `h`.
pub fn ssm_step(h: &mut [f32], decay: Decay<'_>, b: &[f32], c: &[f32], dx: f32) -> f32 {
    let n = h.len();
    assert!(b.len() >= n && c.len() >= n, "ssm_step: lengths");
    if let Decay::PerState { a, .. } = decay {
        assert!(a.len() >= n, "ssm_step: decay length");
    }
    #[cfg(target_arch = "x86_64")]
    if n >= 8 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked above); lengths asserted above.
        #[allow(unsafe_code)]
        return unsafe { ssm_step_avx2(h, decay, b, c, dx) };
    }
    ssm_step_portable(h, decay, b, c, dx)
}

/// The decay factor of state value `j`.
#[inline(always)]
fn decay_at(decay: Decay<'_>, j: usize) -> f32 {
    match decay {
        Decay::PerState { delta, a } => fast_exp(delta * a[j]),
        Decay::Scalar(d) => d,
    }
}

/// [`ssm_step`] compiled for the baseline ISA, in the same order.
pub fn ssm_step_portable(h: &mut [f32], decay: Decay<'_>, b: &[f32], c: &[f32], dx: f32) -> f32 {
    let n8 = h.len() / 8 * 8;
    let mut lanes = [0f32; 8];
    for k in (0..n8).step_by(8) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let j = k + l;
            h[j] = decay_at(decay, j) * h[j] + b[j] * dx;
            *lane += h[j] * c[j];
        }
    }
    let t = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    let mut sum = (t[0] + t[2]) + (t[1] + t[3]);
    for j in n8..h.len() {
        h[j] = decay_at(decay, j) * h[j] + b[j] * dx;
        sum += h[j] * c[j];
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn ssm_step_avx2(h: &mut [f32], decay: Decay<'_>, b: &[f32], c: &[f32], dx: f32) -> f32 {
    use std::arch::x86_64::*;
    let n8 = h.len() / 8 * 8;
    let vdx = _mm256_set1_ps(dx);
    let mut acc = _mm256_setzero_ps();
    let mut k = 0;
    while k < n8 {
        // SAFETY: k + 8 <= n8 <= h.len() <= a, b, c lengths (asserted by the caller).
        #[allow(unsafe_code)]
        unsafe {
            let alpha = match decay {
                Decay::PerState { delta, a } => exp8_avx2(_mm256_mul_ps(
                    _mm256_set1_ps(delta),
                    _mm256_loadu_ps(a.as_ptr().add(k)),
                )),
                Decay::Scalar(d) => _mm256_set1_ps(d),
            };
            let hp = h.as_mut_ptr().add(k);
            let hv = _mm256_add_ps(
                _mm256_mul_ps(alpha, _mm256_loadu_ps(hp)),
                _mm256_mul_ps(_mm256_loadu_ps(b.as_ptr().add(k)), vdx),
            );
            _mm256_storeu_ps(hp, hv);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(hv, _mm256_loadu_ps(c.as_ptr().add(k))));
        }
        k += 8;
    }
    // ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)).
    let t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    let mut sum = _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<1>(u, u)));
    for j in n8..h.len() {
        h[j] = decay_at(decay, j) * h[j] + b[j] * dx;
        sum += h[j] * c[j];
    }
    sum
}

/// Rotates every block of `n` consecutive values of `x` by the orthonormal Walsh–Hadamard
/// matrix `H_n / sqrt(n)` (Sylvester's `H_2n = [[H_n, H_n], [H_n, −H_n]]`; `n` a power
/// of two): symmetric and its own inverse, so it preserves dot products. The fast
/// transform: butterflies `(a, b) → (a + b, a − b)` at strides 1, 2, 4 … `n/2`, then the
/// scale. llama.cpp rotates a quantized KV cache's rows by the same matrix
/// (`ggml_gen_hadamard` in src/llama-kv-cache.cpp, PR #21038), multiplied as a matrix.
///
/// Panics unless `n` is a power of two dividing `x.len()`.
pub fn hadamard_rotate(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "hadamard_rotate: {n} of {}",
        x.len()
    );
    let scale = 1.0 / (n as f32).sqrt();
    for block in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for pair in block.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (u, v) = (*a, *b);
                    *a = u + v;
                    *b = u - v;
                }
            }
            h *= 2;
        }
        block.iter_mut().for_each(|v| *v *= scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fast_exp` is within 2.4e-7 relative of f64's exp over its range (measured 8.0e-8;
    /// a wrong constant gives > 1e-4), 0 below it, +∞ above it; the AVX2 lanes give the
    /// scalar form's bits.
    #[test]
    fn fast_exp_is_accurate_and_the_lanes_agree() {
        let mut worst = 0f64;
        let xs: Vec<f32> = (0..=400_000)
            .map(|i| -87.3 + 175.6 * i as f32 / 400_000.0)
            .chain([
                0.0,
                -1e-30,
                -0.5,
                -88.0,
                -1e4,
                f32::NEG_INFINITY,
                88.4,
                89.0,
                1e4,
            ])
            .chain([f32::INFINITY])
            .collect();
        for &x in &xs {
            let got = fast_exp(x) as f64;
            if x < EXP_MIN {
                assert_eq!(got, 0.0, "x {x}");
            } else if x > 88.37 {
                assert_eq!(got, f64::INFINITY, "x {x}");
            } else {
                let want = (x as f64).exp();
                worst = worst.max((got - want).abs() / want);
            }
        }
        eprintln!("fast_exp: worst relative error {worst:e}");
        assert!(worst < 2.4e-7, "worst relative error {worst}");
        assert_eq!(fast_exp(0.0), 1.0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            use std::arch::x86_64::*;
            for c in xs.chunks(8) {
                let mut v = [0f32; 8];
                v[..c.len()].copy_from_slice(c);
                let mut out = [0f32; 8];
                // SAFETY: AVX2 checked above; `v` and `out` are 8 f32s.
                #[allow(unsafe_code)]
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr(), exp8_avx2(_mm256_loadu_ps(v.as_ptr())))
                };
                for (o, x) in out.iter().zip(v) {
                    assert_eq!(o.to_bits(), fast_exp(x).to_bits(), "x {x}");
                }
            }
        }
    }

    /// SiLU is within 5e-7 of f64's `x / (1 + e^-x)` (measured 1.3e-7 relative to max(|y|,
    /// 1e-3); `x · sigmoid(-x)` instead gives > 1e-1), and the AVX2 path gives the twin's
    /// bits with and without the multiplier, for lengths with and without a tail.
    #[test]
    fn silu_matches_f64_and_its_twin() {
        let mut worst = 0f64;
        for n in [1usize, 7, 8, 9, 100, 1001] {
            let x: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 0.37).sin() * 30.0 - 2.0)
                .collect();
            let m: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            for mult in [None, Some(&m[..])] {
                let (mut a, mut b) = (x.clone(), x.clone());
                silu_in_place(&mut a, mult);
                silu_in_place_portable(&mut b, mult);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "n {n}");
                for (i, (&got, &xi)) in a.iter().zip(&x).enumerate() {
                    let xi = xi as f64;
                    let want = xi / (1.0 + (-xi).exp()) * mult.map_or(1.0, |m| m[i] as f64);
                    let err = (got as f64 - want).abs() / want.abs().max(1e-3);
                    worst = worst.max(err);
                    assert!(err < 5e-7, "x {xi}: {got} vs {want}");
                }
            }
        }
        eprintln!("silu: worst relative error {worst:e}");
    }

    /// The erf GELU is within 3e-7·max(|x|, 1) of f64's (libm's `erf`), and the AVX2 path
    /// gives the twin's bits with and without the multiplier, for lengths with and without
    /// a tail.
    #[test]
    fn gelu_erf_matches_f64_and_its_twin() {
        let mut worst = 0f64;
        for n in [1usize, 7, 8, 9, 100, 1001] {
            let x: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 0.37).sin() * 12.0 - 1.0)
                .collect();
            let m: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            for mult in [None, Some(&m[..])] {
                let (mut a, mut b) = (x.clone(), x.clone());
                gelu_erf_in_place(&mut a, mult);
                gelu_erf_in_place_portable(&mut b, mult);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "n {n}");
                for (i, (&got, &xi)) in a.iter().zip(&x).enumerate() {
                    let xi = xi as f64;
                    let want = 0.5
                        * xi
                        * (1.0 + libm::erf(xi / std::f64::consts::SQRT_2))
                        * mult.map_or(1.0, |m| m[i] as f64);
                    let err = (got as f64 - want).abs() / xi.abs().max(1.0);
                    worst = worst.max(err);
                    assert!(err < 3e-7, "x {xi}: {got} vs {want}");
                }
            }
        }
        eprintln!("gelu_erf: worst error {worst:e}");
    }

    /// The scan step's AVX2 path gives its twin's bits (per-state and scalar decay, with
    /// and without a tail) and the plain formula's values within f32 rounding.
    #[test]
    fn ssm_step_lanes_agree_with_the_twin() {
        for n in [1usize, 7, 8, 16, 19, 64, 128] {
            let v =
                |s: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32 + s) * 0.73).sin()).collect() };
            let (a, b, c, h0) = (v(1.0), v(2.0), v(3.0), v(4.0));
            let a: Vec<f32> = a.iter().map(|x| -x.abs() - 0.1).collect();
            for decay in [Decay::PerState { delta: 0.37, a: &a }, Decay::Scalar(0.81)] {
                let (mut h1, mut h2) = (h0.clone(), h0.clone());
                let y1 = ssm_step(&mut h1, decay, &b, &c, 0.29);
                let y2 = ssm_step_portable(&mut h2, decay, &b, &c, 0.29);
                assert_eq!(y1.to_bits(), y2.to_bits(), "n {n}");
                assert_eq!(h1, h2, "n {n}");
                let mut want = 0f64;
                for j in 0..n {
                    let d = match decay {
                        Decay::PerState { delta, a } => ((delta * a[j]) as f64).exp(),
                        Decay::Scalar(d) => d as f64,
                    };
                    let hj = d * h0[j] as f64 + b[j] as f64 * 0.29;
                    assert!((h1[j] as f64 - hj).abs() < 1e-6, "n {n} j {j}");
                    want += hj * c[j] as f64;
                }
                assert!((y1 as f64 - want).abs() < 1e-5, "n {n}: {y1} vs {want}");
            }
        }
    }

    /// The fast transform equals the Sylvester matrix `H_n / sqrt(n)` built as llama.cpp
    /// builds it (element (i, j) is `(−1)^popcount(i & j) / sqrt(n)`), block by block;
    /// applied twice it gives the input back, and it keeps dot products.
    #[test]
    fn hadamard_rotation_is_the_orthonormal_sylvester_matrix() {
        let mut rnd = crate::kernels::test_rng(0x1234_5678_9abc_def1);
        for n in [1usize, 2, 64, 128, 256] {
            let x: Vec<f32> = (0..3 * n).map(|_| rnd() * 4.0).collect();
            let y: Vec<f32> = (0..3 * n).map(|_| rnd() * 4.0).collect();
            let mut hx = x.clone();
            hadamard_rotate(&mut hx, n);
            for (b, xb) in x.chunks_exact(n).enumerate() {
                for i in 0..n {
                    let want: f64 = (0..n)
                        .map(|j| {
                            let sign = if (i & j).count_ones() % 2 == 0 {
                                1.0
                            } else {
                                -1.0
                            };
                            sign * xb[j] as f64 / (n as f64).sqrt()
                        })
                        .sum();
                    assert!((hx[b * n + i] as f64 - want).abs() < 1e-4, "n {n} row {i}");
                }
            }
            let mut back = hx.clone();
            hadamard_rotate(&mut back, n);
            for (a, b) in back.iter().zip(&x) {
                assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "n {n}: H·H ≠ I");
            }
            let mut hy = y.clone();
            hadamard_rotate(&mut hy, n);
            let dot =
                |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| (p * q) as f64).sum::<f64>();
            assert!((dot(&hx, &hy) - dot(&x, &y)).abs() < 1e-3 * (1.0 + dot(&x, &y).abs()));
        }
    }
}
