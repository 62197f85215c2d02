//! Activation quantizers and quantized dot products.
//!
//! - Quantizers: bit-exact with ggml's reference quantizers, checked against gguf-py's
//!   Q8_0 (`tests/data/dot/make_q8_0.py`) and hand-computed blocks (Q8_0 ties round away
//!   from zero; Q8_K ties round to even; Q8_K's sign convention and bsums).
//! - Every SIMD kernel equals its scalar twin bit for bit on random blocks, extreme
//!   scales, all-zero blocks and odd block counts.
//! - Every kernel agrees with `dot(dequantize(w), dequantize(act))` (computed in f64)
//!   within a measured relative tolerance.
//! - Real rows of every quantized fixture (`shared/fixtures/quant/*/llama.gguf`).

use std::collections::BTreeSet;
use std::path::Path;

use frink_gguf::{GgmlType, GgufFile};
use frink_quant::dequantize;
use frink_quant::dot::{
    dot_scalar, has_dot, kernel, quantize_activation, quantize_row_q8_0, quantize_row_q8_1,
    quantize_row_q8_k, vec_dot_type, DotError, DotKernel, Isa,
};
use half::f16;

mod common;
use common::{scale_fields, Rng};

const DOT_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// How the f16 scales of generated weight blocks are chosen.
#[derive(Clone, Copy, Debug)]
enum Scales {
    /// Random magnitudes in [1e-3, 1), random sign.
    Normal,
    /// The largest finite f16 (65504), random sign.
    Max,
    /// The smallest normal f16 (2^-14), random sign.
    MinNormal,
}

/// `nb` random weight blocks of `ty` with finite scales chosen by `scales`; every fifth
/// block (starting at block 2) is all zero bytes.
fn weight_row(rng: &mut Rng, ty: GgmlType, nb: usize, scales: Scales) -> Vec<u8> {
    let bytes = ty.type_size();
    let mut w: Vec<u8> = (0..nb * bytes).map(|_| rng.byte()).collect();
    for (b, block) in w.chunks_exact_mut(bytes).enumerate() {
        if b % 5 == 2 {
            block.fill(0);
            continue;
        }
        for &at in scale_fields(ty) {
            let sign = if rng.byte() & 1 == 0 { 1.0 } else { -1.0 };
            let v = match scales {
                Scales::Normal => sign * (1e-3 + rng.unit().abs()),
                Scales::Max => sign * 65504.0,
                Scales::MinNormal => sign * 6.103_515_6e-5,
            };
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    w
}

/// Random activation values of length `n` scaled by `scale`, with a zero stretch.
fn act_values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if (64..96).contains(&(i % 300)) {
                0.0
            } else {
                rng.normal() * scale
            }
        })
        .collect()
}

fn quantized(act_ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; x.len() / act_ty.block_size() * act_ty.type_size()];
    quantize_activation(act_ty, x, &mut a).unwrap();
    a
}

/// Raw random activation blocks for the legacy activation types (no bsums to keep
/// consistent): every i8 value including -128, finite random scales.
fn raw_legacy_act(rng: &mut Rng, act_ty: GgmlType, nb: usize) -> Vec<u8> {
    let bytes = act_ty.type_size();
    let mut a: Vec<u8> = (0..nb * bytes).map(|_| rng.byte()).collect();
    for block in a.chunks_exact_mut(bytes) {
        let v = rng.unit() * 2.0;
        block[0..2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
    }
    a
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The non-scalar kernels of `ty` available here (a kernel that falls back to scalar code
/// is left out).
fn simd_kernels(ty: GgmlType) -> Vec<DotKernel> {
    Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .map(|i| kernel(ty, i).unwrap())
        .filter(|k| k.isa() != Isa::Scalar)
        .collect()
}

/// Checks every SIMD kernel of `ty` against the scalar one, bit for bit; returns how many
/// comparisons were made.
fn check_simd(label: &str, ty: GgmlType, w: &[u8], a: &[u8]) -> usize {
    let want = dot_scalar(ty, w, a).unwrap();
    let mut n = 0;
    for k in simd_kernels(ty) {
        let got = k.dot(w, a);
        assert!(
            same_bits(got, want),
            "{label}: {ty} {:?} gives {got:e} ({:#010x}), scalar {want:e} ({:#010x})",
            k.isa(),
            got.to_bits(),
            want.to_bits()
        );
        n += 1;
    }
    n
}

const LEGACY_COUNTS: [usize; 10] = [1, 2, 3, 7, 8, 9, 17, 18, 28, 65];
const K_COUNTS: [usize; 6] = [1, 2, 3, 7, 9, 19];

fn counts(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 256 {
        &K_COUNTS
    } else {
        &LEGACY_COUNTS
    }
}

#[test]
fn simd_kernels_match_scalar_bit_for_bit() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut compared = 0;
    let mut with_simd = BTreeSet::new();
    for ty in DOT_TYPES {
        let act_ty = vec_dot_type(ty).unwrap();
        for &nb in counts(ty) {
            let n = nb * ty.block_size();
            for scales in [Scales::Normal, Scales::Max, Scales::MinNormal] {
                for act_scale in [1.0f32, 3e4, 1e-5] {
                    let w = weight_row(&mut rng, ty, nb, scales);
                    let a = quantized(act_ty, &act_values(&mut rng, n, act_scale));
                    let label = format!("{nb} blocks, {scales:?} weights, act x{act_scale}");
                    let c = check_simd(&label, ty, &w, &a);
                    if c > 0 {
                        with_simd.insert(ty);
                    }
                    compared += c;
                }
            }
            // All-zero rows, both sides.
            let zw = vec![0u8; nb * ty.type_size()];
            let za = quantized(act_ty, &vec![0.0; n]);
            compared += check_simd("all-zero", ty, &zw, &za);
            let w = weight_row(&mut rng, ty, nb, Scales::Normal);
            compared += check_simd("zero activation", ty, &w, &za);
            if act_ty != GgmlType::Q8_K {
                let a = raw_legacy_act(&mut rng, act_ty, n / 32);
                compared += check_simd("raw activation bytes", ty, &w, &a);
                // Weight bytes with arbitrary (possibly inf/NaN) scales.
                let wr: Vec<u8> = (0..nb * ty.type_size()).map(|_| rng.byte()).collect();
                compared += check_simd("raw weight bytes", ty, &wr, &a);
            }
        }
    }
    eprintln!("{compared} SIMD results bit-identical to scalar; SIMD types: {with_simd:?}");
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        assert_eq!(with_simd, DOT_TYPES.into_iter().collect(), "AVX2 kernels");
    }
}

/// `dot_rows` gives every row exactly the bits of `dot` on that row alone, whatever the
/// number of rows (crossing the 4- and 8-row chunks of the multi-row kernels).
#[test]
fn dot_rows_equals_dot_per_row() {
    let mut rng = Rng(0x4242_0000_0000_0006);
    let mut multi = BTreeSet::new();
    for ty in DOT_TYPES {
        let act_ty = vec_dot_type(ty).unwrap();
        for &nb in counts(ty) {
            let n = nb * ty.block_size();
            let w = weight_row(&mut rng, ty, nb, Scales::Normal);
            for nrows in [1usize, 2, 3, 4, 5, 8, 9, 13] {
                let mut acts = Vec::new();
                for r in 0..nrows {
                    let scale = [1.0f32, 1e3, 1e-3][r % 3];
                    acts.extend(quantized(act_ty, &act_values(&mut rng, n, scale)));
                }
                let ab = acts.len() / nrows;
                for isa in Isa::available() {
                    let k = kernel(ty, isa).unwrap();
                    let mut out = vec![f32::NAN; nrows];
                    k.dot_rows(&w, &acts, &mut out);
                    for (r, got) in out.iter().enumerate() {
                        let want = k.dot(&w, &acts[r * ab..][..ab]);
                        assert!(
                            same_bits(*got, want),
                            "{ty} {isa:?} {nb} blocks, row {r} of {nrows}: {got:e} vs {want:e}"
                        );
                    }
                    multi.insert(ty);
                }
            }
        }
    }
    assert_eq!(multi.len(), DOT_TYPES.len());
}

/// `dot_tile` gives every (weight row, activation row) pair exactly the bits of `dot`.
#[test]
fn dot_tile_equals_dot_per_pair() {
    let mut rng = Rng(0x7171_0000_0000_0007);
    for ty in DOT_TYPES {
        let act_ty = vec_dot_type(ty).unwrap();
        for &nb in counts(ty).iter().step_by(2) {
            let n = nb * ty.block_size();
            let wrb = nb * ty.type_size();
            for (n_w, n_a) in [(1usize, 1usize), (3, 2), (2, 8), (5, 9), (1, 13), (4, 0)] {
                let mut ws = Vec::new();
                for _ in 0..n_w {
                    ws.extend(weight_row(&mut rng, ty, nb, Scales::Normal));
                }
                let mut acts = Vec::new();
                for r in 0..n_a {
                    let scale = [1.0f32, 1e3, 1e-3][r % 3];
                    acts.extend(quantized(act_ty, &act_values(&mut rng, n, scale)));
                }
                let ab = acts.len().checked_div(n_a).unwrap_or(0);
                for isa in Isa::available() {
                    let k = kernel(ty, isa).unwrap();
                    let mut out = vec![f32::NAN; n_w * n_a];
                    k.dot_tile(&ws, n_w, &acts, n_a, &mut out);
                    for r in 0..n_a {
                        for i in 0..n_w {
                            let want = k.dot(&ws[i * wrb..][..wrb], &acts[r * ab..][..ab]);
                            let got = out[r * n_w + i];
                            assert!(
                                same_bits(got, want),
                                "{ty} {isa:?} {nb} blocks, tile {n_w}x{n_a}, ({i}, {r}): {got:e} vs {want:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Every kernel's `dot_tile` equals `dot_scalar` bit for bit on every pair, for tile
/// shapes that cross the decode/prefill switch (`n_a` 1..3 vs 4+), the register blocks
/// and the activation chunks (48 rows), with odd `n_w` and `n_a`, rows whose block count
/// is not a multiple of eight, extreme weight scales, all-zero blocks, raw activation
/// bytes (every i8 including -128) and raw weight bytes (any f16 scale, inf and NaN).
#[test]
fn dot_tile_equals_scalar_on_every_path() {
    let mut rng = Rng(0x7171_0000_0000_0009);
    let mut compared = 0usize;
    // Decode (1..=3 rows), small batches (4..=8 rows, odd and even weight counts) and
    // prefill shapes.
    let shapes: [(usize, usize); 20] = [
        (1, 1),
        (7, 1),
        (17, 1),
        (9, 2),
        (7, 3),
        (1, 4),
        (6, 4),
        (3, 5),
        (8, 5),
        (5, 6),
        (1, 7),
        (9, 7),
        (2, 8),
        (11, 8),
        (64, 8),
        (17, 9),
        (7, 17),
        (5, 50),
        (32, 13),
        (3, 97),
    ];
    for ty in DOT_TYPES {
        let act_ty = vec_dot_type(ty).unwrap();
        let nbs: &[usize] = if ty.block_size() == 256 {
            &[1, 3, 6, 9, 17]
        } else {
            &[1, 7, 8, 9, 17, 28]
        };
        for &nb in nbs {
            let n = nb * ty.block_size();
            let wrb = nb * ty.type_size();
            for (case, &(n_w, n_a)) in shapes.iter().enumerate() {
                let mut ws = Vec::new();
                for i in 0..n_w {
                    let scales = [Scales::Normal, Scales::Max, Scales::MinNormal][(i + case) % 3];
                    match (i + case) % 7 {
                        5 => ws.extend(vec![0u8; wrb]),
                        6 if act_ty != GgmlType::Q8_K => {
                            ws.extend((0..wrb).map(|_| rng.byte()));
                        }
                        _ => ws.extend(weight_row(&mut rng, ty, nb, scales)),
                    }
                }
                let mut acts = Vec::new();
                for r in 0..n_a {
                    match (r + case) % 5 {
                        3 if act_ty != GgmlType::Q8_K => {
                            acts.extend(raw_legacy_act(&mut rng, act_ty, n / 32));
                        }
                        4 => acts.extend(quantized(act_ty, &vec![0.0; n])),
                        k => {
                            let scale = [1.0f32, 3e4, 1e-5, 1.0][k];
                            acts.extend(quantized(act_ty, &act_values(&mut rng, n, scale)));
                        }
                    }
                }
                let ab = acts.len() / n_a;
                let want: Vec<f32> = (0..n_a * n_w)
                    .map(|e| {
                        let (r, i) = (e / n_w, e % n_w);
                        dot_scalar(ty, &ws[i * wrb..][..wrb], &acts[r * ab..][..ab]).unwrap()
                    })
                    .collect();
                for isa in Isa::available() {
                    let k = kernel(ty, isa).unwrap();
                    let mut out = vec![f32::NAN; n_w * n_a];
                    k.dot_tile(&ws, n_w, &acts, n_a, &mut out);
                    // The same tile through prepared activations and a sink (the path of
                    // a prefill's matrix products) must give the same bits.
                    let prep = k.prepare(&acts, n_a);
                    let mut sunk = vec![f32::NAN; n_w * n_a];
                    k.dot_tile_prepared(&ws, n_w, &acts, n_a, &prep, &mut |r, i, v| {
                        sunk[r * n_w + i..][..v.len()].copy_from_slice(v)
                    });
                    for (e, (a, b)) in out.iter().zip(&sunk).enumerate() {
                        assert!(
                            same_bits(*a, *b),
                            "{ty} {isa:?} prepared tile {n_w}x{n_a} element {e}: {a:e} vs {b:e}"
                        );
                    }
                    for (e, (got, want)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            same_bits(*got, *want),
                            "{ty} {isa:?} {nb} blocks, tile {n_w}x{n_a}, (w {}, a {}): {got:e} ({:#010x}) vs scalar {want:e} ({:#010x})",
                            e % n_w,
                            e / n_w,
                            got.to_bits(),
                            want.to_bits()
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    eprintln!("{compared} tile results bit-identical to scalar");
}

#[test]
#[should_panic(expected = "output length")]
fn dot_tile_checks_lengths() {
    let k = kernel(GgmlType::Q4_0, Isa::best()).unwrap();
    k.dot_tile(&[0u8; 36], 2, &[0u8; 34], 1, &mut [0.0; 3]);
}

#[test]
#[should_panic(expected = "activation bytes are not 3 rows")]
fn dot_rows_checks_lengths() {
    let k = kernel(GgmlType::Q4_0, Isa::best()).unwrap();
    k.dot_rows(&[0u8; 18], &[0u8; 34 * 2], &mut [0.0; 3]);
}

/// `sum w_i * x_i` in f64 over the dequantized rows, and `sum |w_i x_i|` (plus, for the
/// formats with a min, `sum_b |m_b| sum |x_i|`, since the min term is a separate
/// product) as the error scale.
fn reference(ty: GgmlType, w: &[u8], a: &[u8]) -> (f64, f64) {
    let act_ty = vec_dot_type(ty).unwrap();
    let nb = w.len() / ty.type_size();
    let n = nb * ty.block_size();
    let mut wf = vec![0f32; n];
    dequantize(ty, w, &mut wf).unwrap();
    let mut xf = vec![0f32; n];
    dequantize(act_ty, a, &mut xf).unwrap();
    let mut sum = 0f64;
    let mut mag = 0f64;
    for (w, x) in wf.iter().zip(&xf) {
        sum += f64::from(*w) * f64::from(*x);
        mag += (f64::from(*w) * f64::from(*x)).abs();
    }
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        for (wb, xb) in w.chunks_exact(ty.type_size()).zip(xf.chunks_exact(32)) {
            let m = f64::from(f16::from_le_bytes([wb[2], wb[3]]).to_f32()).abs();
            mag += m * xb.iter().map(|x| f64::from(x.abs())).sum::<f64>();
        }
    }
    (sum, mag)
}

/// Measured with the correct kernels on the data below (relative to the error scale of
/// `reference`): worst 3.5e-8 (Q4_1), 1.1e-8 to 1.8e-8 for the others; on the fixture
/// rows no more. A wrong scale, nibble or offset gives errors of order 1e-2 and more
/// (`tolerance_catches_a_swapped_nibble_order`).
fn tolerance(_ty: GgmlType) -> f64 {
    2e-7
}

/// Returns the relative error of every kernel of `ty` against the f64 reference, after
/// asserting it is within `tolerance(ty)`.
fn check_reference(label: &str, ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    let (want, mag) = reference(ty, w, a);
    let mut worst = 0f64;
    for isa in Isa::available() {
        let got = kernel(ty, isa).unwrap().dot(w, a);
        let err = if mag == 0.0 {
            assert_eq!(got, 0.0, "{label}: {ty} {isa:?} on a zero product");
            0.0
        } else {
            (f64::from(got) - want).abs() / mag
        };
        assert!(
            err <= tolerance(ty),
            "{label}: {ty} {isa:?}: got {got:e}, reference {want:e}, relative error {err:e} > {:e}",
            tolerance(ty)
        );
        worst = worst.max(err);
    }
    worst
}

#[test]
fn kernels_match_dequantized_f64_reference() {
    let mut rng = Rng(0x0dd5_eed5_0000_0002);
    for ty in DOT_TYPES {
        let act_ty = vec_dot_type(ty).unwrap();
        let mut worst = 0f64;
        for &nb in counts(ty) {
            let n = nb * ty.block_size();
            for scales in [Scales::Normal, Scales::Max, Scales::MinNormal] {
                for act_scale in [1.0f32, 3e4, 1e-3] {
                    let w = weight_row(&mut rng, ty, nb, scales);
                    let a = quantized(act_ty, &act_values(&mut rng, n, act_scale));
                    let label = format!("{nb} blocks, {scales:?}, act x{act_scale}");
                    worst = worst.max(check_reference(&label, ty, &w, &a));
                }
            }
        }
        eprintln!("{ty}: worst relative error {worst:.3e}");
    }
}

/// A kernel with a deliberately wrong nibble order would exceed the tolerance: this
/// checks the tolerance can fail, using Q4_0 with its two nibble halves swapped.
#[test]
fn tolerance_catches_a_swapped_nibble_order() {
    let mut rng = Rng(0x0bad_0000_0000_0003);
    let ty = GgmlType::Q4_0;
    let w = weight_row(&mut rng, ty, 18, Scales::Normal);
    let a = quantized(GgmlType::Q8_0, &act_values(&mut rng, 576, 1.0));
    let swapped: Vec<u8> = w
        .chunks_exact(18)
        .flat_map(|b| {
            let mut b = b.to_vec();
            for q in &mut b[2..] {
                *q = q.rotate_left(4);
            }
            b
        })
        .collect();
    let (want, mag) = reference(ty, &w, &a);
    let bad = dot_scalar(ty, &swapped, &a).unwrap();
    let err = (f64::from(bad) - want).abs() / mag;
    assert!(
        err > 100.0 * tolerance(ty),
        "swapped nibbles: error {err:e}"
    );
}

// ---------------------------------------------------------------------------------------
// Quantizers

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn q8_0_matches_gguf_py() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dot");
    let x = read_f32(&dir.join("q8_0.x.f32"));
    let want = std::fs::read(dir.join("q8_0.gguf_py.raw")).unwrap();
    let mut got = vec![0u8; want.len()];
    quantize_row_q8_0(&x, &mut got).unwrap();
    for (b, (g, w)) in got.chunks(34).zip(want.chunks(34)).enumerate() {
        assert_eq!(g, w, "block {b}");
    }
}

#[test]
fn q8_0_and_q8_1_hand_computed() {
    // amax = 127 -> d = 1, id = 1: values are rounded half away from zero (roundf).
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 0.5;
    x[4] = -0.5;
    x[5] = 1.4999999;
    x[6] = -126.5;
    let mut q = [0u8; 34];
    quantize_row_q8_0(&x, &mut q).unwrap();
    assert_eq!(u16::from_le_bytes([q[0], q[1]]), 0x3C00, "d = 1.0 as f16");
    let qs: Vec<i8> = q[2..9].iter().map(|&b| b as i8).collect();
    assert_eq!(qs, [127, 3, -3, 1, -1, 1, -127]);
    assert!(q[9..].iter().all(|&b| b == 0));

    // Q8_1: the same d and qs, plus s = f16(d * sum(qs)).
    let mut q1 = [0u8; 36];
    quantize_row_q8_1(&x, &mut q1).unwrap();
    assert_eq!(q1[0..2], q[0..2]);
    assert_eq!(q1[4..], q[2..]);
    let sum = 127 + 3 - 3 + 1 - 1 + 1 - 127;
    assert_eq!(
        u16::from_le_bytes([q1[2], q1[3]]),
        f16::from_f32(sum as f32).to_bits()
    );

    // The scale is rounded to f16 only for storage: id comes from the f32 d. With
    // amax = 1, d = 1/127 (f32), and x = 0.5 gives 63.5 * (1 + tiny) -> 64.
    let mut y = [0f32; 32];
    y[0] = 1.0;
    y[1] = 0.5;
    y[2] = -1.0 / 3.0;
    let mut q = [0u8; 34];
    quantize_row_q8_0(&y, &mut q).unwrap();
    let d = 1.0f32 / 127.0;
    let id = 1.0 / d;
    assert_eq!(u16::from_le_bytes([q[0], q[1]]), f16::from_f32(d).to_bits());
    assert_eq!(q[3] as i8, (0.5 * id).round() as i8);
    assert_eq!(q[4] as i8, (-1.0f32 / 3.0 * id).round() as i8);

    // An all-zero block: d = 0 and zero quants.
    let mut q = [0xAAu8; 34];
    quantize_row_q8_0(&[0.0; 32], &mut q).unwrap();
    assert!(q.iter().all(|&b| b == 0));
}

#[test]
fn q8_k_hand_computed() {
    // max = 127 (positive) -> iscale = -1: quants are negated, ties go to even, d = -1.
    let mut x = [0f32; 256];
    x[0] = 127.0;
    x[1] = 2.5; // -2.5 -> -2
    x[2] = 3.5; // -3.5 -> -4
    x[3] = -126.5; // 126.5 -> 126
    x[4] = -0.5; // 0.5 -> 0
    x[17] = 10.0;
    x[255] = -127.0; // the same magnitude later: max stays the first (127)
    let mut q = vec![0u8; 292];
    quantize_row_q8_k(&x, &mut q).unwrap();
    assert_eq!(f32::from_le_bytes([q[0], q[1], q[2], q[3]]), -1.0);
    let qs: Vec<i8> = q[4..260].iter().map(|&b| b as i8).collect();
    assert_eq!(qs[..5], [-127, -2, -4, 126, 0]);
    assert_eq!(qs[17], -10);
    assert_eq!(qs[255], 127);
    let bsums: Vec<i16> = (0..16)
        .map(|j| i16::from_le_bytes([q[260 + 2 * j], q[261 + 2 * j]]))
        .collect();
    assert_eq!(bsums[0], -127 - 2 - 4 + 126); // qs[4] = 0
    assert_eq!(bsums[1], -10);
    assert_eq!(bsums[15], 127);
    assert!(bsums[2..15].iter().all(|&s| s == 0));

    // max = -2 -> iscale = 63.5: 1.0 -> 63.5 -> 64 (even), 0.5 -> 31.75 -> 32, d = 1/63.5.
    let mut x = [0f32; 256];
    x[0] = -2.0;
    x[1] = 1.0;
    x[2] = 0.5;
    quantize_row_q8_k(&x, &mut q).unwrap();
    assert_eq!(
        f32::from_le_bytes([q[0], q[1], q[2], q[3]]),
        1.0 / (-127.0f32 / -2.0)
    );
    assert_eq!(
        q[4..7].iter().map(|&b| b as i8).collect::<Vec<_>>(),
        [-127, 64, 32]
    );

    // All zero: everything zero (ggml leaves bsums unwritten; we write zeros).
    let mut q = vec![0x55u8; 292 * 2];
    let mut x = vec![0f32; 512];
    x[300] = 1.0;
    quantize_row_q8_k(&x, &mut q).unwrap();
    assert!(q[..292].iter().all(|&b| b == 0));
    assert_eq!(q[292 + 4 + 44] as i8, -127);
}

#[test]
fn q8_k_round_trips_within_half_a_step() {
    let mut rng = Rng(0x7777_0000_0000_0004);
    let x: Vec<f32> = (0..1024).map(|_| rng.normal()).collect();
    let mut q = vec![0u8; 4 * 292];
    quantize_row_q8_k(&x, &mut q).unwrap();
    let mut y = vec![0f32; 1024];
    dequantize(GgmlType::Q8_K, &q, &mut y).unwrap();
    for (b, (xs, ys)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
        let d = f32::from_le_bytes(q[292 * b..][..4].try_into().unwrap()).abs();
        for (x, y) in xs.iter().zip(ys) {
            assert!((x - y).abs() <= 0.5001 * d, "block {b}: {x} vs {y}, d {d}");
        }
    }
}

#[test]
fn lengths_are_checked() {
    let mut out = vec![0u8; 34];
    assert!(matches!(
        quantize_row_q8_0(&[0.0; 31], &mut out),
        Err(DotError::Quantize { .. })
    ));
    assert!(quantize_row_q8_0(&[0.0; 64], &mut out).is_err());
    assert!(quantize_row_q8_k(&[0.0; 32], &mut [0u8; 292]).is_err());
    assert_eq!(
        quantize_activation(GgmlType::F32, &[0.0; 32], &mut out),
        Err(DotError::NoDot(GgmlType::F32))
    );
    let k = kernel(GgmlType::Q4_0, Isa::Scalar).unwrap();
    assert!(k.try_dot(&[0u8; 18], &[0u8; 34]).is_ok());
    assert!(k.try_dot(&[0u8; 18], &[0u8; 68]).is_err());
    assert!(k.try_dot(&[0u8; 17], &[0u8; 34]).is_err());
    let k = kernel(GgmlType::Q4_K, Isa::best()).unwrap();
    assert!(k.try_dot(&[0u8; 144], &[0u8; 292]).is_ok());
    assert!(k.try_dot(&[0u8; 144], &[0u8; 34 * 8]).is_err());
    assert_eq!(
        kernel(GgmlType::IQ4_NL, Isa::Scalar).unwrap_err(),
        DotError::NoDot(GgmlType::IQ4_NL)
    );
    for ty in GgmlType::all() {
        assert_eq!(has_dot(ty), DOT_TYPES.contains(&ty), "{ty}");
    }
}

// ---------------------------------------------------------------------------------------
// Real rows

#[test]
fn fixture_rows() {
    let Some(root) = frink_testdata::require("fixtures/quant", "fixture_rows") else {
        return;
    };
    let mut rng = Rng(0xf1f1_0000_0000_0005);
    let mut covered = BTreeSet::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("llama.gguf").exists())
        .collect();
    dirs.sort();
    let mut rows = 0;
    for dir in dirs {
        let file = GgufFile::open(dir.join("llama.gguf")).unwrap();
        for t in file.tensors() {
            let ty = t.info.ggml_type;
            if !has_dot(ty) {
                continue;
            }
            let n = t.info.row_len() as usize;
            let row_bytes = ty.row_bytes(n as u64).unwrap() as usize;
            let act_ty = vec_dot_type(ty).unwrap();
            let a = quantized(act_ty, &act_values(&mut rng, n, 1.0));
            for r in 0..(t.info.n_rows() as usize).min(3) {
                let w = &t.data[r * row_bytes..][..row_bytes];
                let label = format!("{}:{} row {r}", dir.display(), t.info.name);
                check_simd(&label, ty, w, &a);
                check_reference(&label, ty, w, &a);
                rows += 1;
            }
            covered.insert(ty);
        }
    }
    eprintln!("{rows} fixture rows checked");
    assert_eq!(
        covered,
        DOT_TYPES.into_iter().collect(),
        "types with fixture rows"
    );
}

/// One prepared activation matrix serves every kernel of its activation type (a matrix
/// product's projections of different formats share it, as gemma3's Q5_0 and Q8_0 do):
/// activations prepared by one format's kernel give every other format's exact results.
/// A format-specific term baked into the preparation (the value offset, once) broke
/// gemma3-270m's perplexity (3975 instead of 18.3) while every single-format test passed.
#[test]
fn prepared_activations_serve_every_format_of_their_type() {
    let mut rng = Rng(0x7171_0000_0000_0011);
    let (n_w, n_a) = (19, 13);
    for isa in Isa::available() {
        for ty in DOT_TYPES {
            let act_ty = vec_dot_type(ty).unwrap();
            let nb = if ty.block_size() == 256 { 3 } else { 9 };
            let n = nb * ty.block_size();
            let wrb = nb * ty.type_size();
            let ws: Vec<u8> = (0..n_w)
                .flat_map(|_| weight_row(&mut rng, ty, nb, Scales::Normal))
                .collect();
            let acts: Vec<u8> = (0..n_a)
                .flat_map(|_| quantized(act_ty, &act_values(&mut rng, n, 1.0)))
                .collect();
            let ab = acts.len() / n_a;
            let k = kernel(ty, isa).unwrap();
            for other in DOT_TYPES
                .into_iter()
                .filter(|&o| vec_dot_type(o) == Some(act_ty))
            {
                let prep = kernel(other, isa).unwrap().prepare(&acts, n_a);
                let mut got = vec![f32::NAN; n_w * n_a];
                k.dot_tile_prepared(&ws, n_w, &acts, n_a, &prep, &mut |r, i, v| {
                    got[r * n_w + i..][..v.len()].copy_from_slice(v)
                });
                for (e, g) in got.iter().enumerate() {
                    let (r, i) = (e / n_w, e % n_w);
                    let want =
                        dot_scalar(ty, &ws[i * wrb..][..wrb], &acts[r * ab..][..ab]).unwrap();
                    assert!(
                        same_bits(*g, want),
                        "{ty} {isa:?} on activations prepared by {other}: (w {i}, a {r}) {g:e} vs {want:e}"
                    );
                }
            }
        }
    }
}
