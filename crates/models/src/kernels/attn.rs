//! Attention's inner kernels over cached keys and values read in place (f32, f16, bf16 or
//! ggml blocks, [`super::kv_rows`]): scores of up to four query rows against a run of key
//! rows, and weighted sums of value rows for up to four query rows. Every element has the
//! bits of the scalar rule whatever the number of rows sharing a call and however the
//! cache stores the rows: reading an element in place gives exactly its widened or
//! dequantized value, so reading in place equals widening to f32 first.

#[cfg(target_arch = "x86_64")]
use super::kv_rows::{has_avx2_f16c, load8, prefetch_elems, raw, vector_ok, with_kind};
use super::kv_rows::{KvRows, PREFETCH_KEYS};
#[cfg(target_arch = "x86_64")]
use super::math::exp8_avx2;
use super::math::fast_exp;
#[cfg(target_arch = "x86_64")]
use super::sum_lanes_avx2;

/// Keys per block of [`weighted_sum_multi_avx2`]: each block's value rows (a few KiB)
/// stay in L1 while the passes over its output elements read them again.
const VALUE_BLOCK: usize = 64;
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
            with_kind!(keys.data, K => dot_multi_keys_avx2::<R, K>(q, keys, range, out))
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
        return unsafe { with_kind!(v.data, K => weighted_sum_multi_avx2::<R, K>(o, p, v, keys)) };
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
    use crate::kernels::{axpy, dot, test_rng, KvData};
    use crate::kv::CacheType;
    use half::f16;

    /// The multi-row kernels give the bits of `dot` and of `axpy` per key on the widened
    /// rows, on every build, for f32, f16, bf16 and every quantized cache type's rows,
    /// strided, contiguous and in a KV cache's head-major blocks (with and without a block
    /// table), for head sizes with and without a tail, and for 1 to 4 rows.
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
            let bf16: Vec<u16> = raw.iter().map(|&x| (x.to_bits() >> 16) as u16).collect();
            let q: Vec<Vec<f32>> = (0..4).map(|_| (0..hd).map(|_| rnd()).collect()).collect();
            let p: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..n_keys).map(|_| rnd().abs()).collect())
                .collect();
            // Block rows (heads of whole blocks): block-aligned (the vector path) and,
            // to exercise the fallback, starting 8 elements into a block.
            let (qstart, qstride) = (hd * 2, hd * 3 + 32);
            let n_q = (qstart + 8 + n_keys * qstride).max(n_blocked).div_ceil(32) * 32;
            let src: Vec<f32> = (0..n_q).map(|_| rnd() * 5.0).collect();
            let quantized: Vec<(CacheType, Vec<u8>)> = CacheType::ALL
                .into_iter()
                .filter(|t| t.is_quantized())
                .map(|t| {
                    let mut b = vec![0u8; t.bytes(n_q).unwrap()];
                    frink_quant::quantize::quantize_for_cache(t.ggml(), &src, &mut b).unwrap();
                    (t, b)
                })
                .collect();
            let blocked = |data| {
                let rows = KvRows::new(data, 16 * hd, 3 * hd).in_blocks(4, hd);
                [rows, rows.starting_at(Some(&table[..]), 0)]
            };
            let mut layouts = vec![
                KvRows::new(KvData::F32(&raw), start, stride),
                KvRows::new(KvData::F16(&half), start, stride),
                KvRows::new(KvData::BF16(&bf16), start, stride),
            ];
            layouts.extend(blocked(KvData::F32(&raw)));
            layouts.extend(blocked(KvData::F16(&half)));
            layouts.extend(blocked(KvData::BF16(&bf16)));
            if hd % 32 == 0 {
                for (t, b) in &quantized {
                    let data = KvData::Quant(*t, b);
                    layouts.push(KvRows::new(data, qstart, qstride));
                    layouts.push(KvRows::new(data, qstart + 8, qstride));
                    layouts.extend(blocked(data));
                }
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
