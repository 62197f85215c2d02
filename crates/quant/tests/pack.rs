//! The packed (eight rows interleaved) layout and its kernels.
//!
//! - Packing keeps every bit: each row restored from the packed matrix equals the stored
//!   row, byte for byte (random bytes, so every scale, min and quant bit pattern occurs).
//! - The kernels give every result the bits of the scalar kernel on the stored row, for
//!   1 to 9 activation rows (the AVX2 kernels take four at a time: every remainder) and
//!   17 and 24, by every packed kernel the machine runs (AVX2's; AVX-512's tile of the
//!   legacy formats, above one row, its rows prepared or not), row counts
//!   that leave a padded last group, group sub-ranges, extreme scales, activations of
//!   every magnitude and activation quants of every byte value (bsums kept consistent,
//!   as the Q8_K quantizer makes them).
//! - A changed weight byte changes the result (the kernels read what they are given).

use frink_gguf::GgmlType;
use frink_quant::dot::pack::{block_bytes, prefetch_hint, Packed, PrefetchHint, GROUP};
use frink_quant::dot::{best_kernel, dot_scalar, quantize_activation, vec_dot_type, ActPrep, Isa};
use half::f16;

mod common;
use common::{scale_fields, Rng};

const PACKED: [GgmlType; 7] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// `rows` random rows of `nb` blocks with finite scales of magnitude about `scale`.
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, nb: usize, scale: f32) -> Vec<u8> {
    let ts = ty.type_size();
    let mut w: Vec<u8> = (0..rows * nb * ts).map(|_| rng.byte()).collect();
    for blk in w.chunks_exact_mut(ts) {
        for &at in scale_fields(ty) {
            let v =
                scale * (0.001 + rng.unit().abs()) * if rng.byte() & 1 == 0 { 1.0 } else { -1.0 };
            blk[at..at + 2]
                .copy_from_slice(&f16::from_f32(v.clamp(-65504.0, 65504.0)).to_le_bytes());
        }
    }
    w
}

/// `n_a` activation rows for `nb` weight blocks of `ty`: quantized from random values of
/// magnitude `scale`, or (`raw`) random quant bytes (every value, -128 included) with a
/// random scale (and consistent bsums for Q8_K).
fn acts(rng: &mut Rng, ty: GgmlType, n_a: usize, nb: usize, scale: f32, raw: bool) -> Vec<u8> {
    let act = vec_dot_type(ty).unwrap();
    let n = nb * ty.block_size();
    let rb = n / act.block_size() * act.type_size();
    let mut a = vec![0u8; n_a * rb];
    for row in a.chunks_exact_mut(rb) {
        if raw && act == GgmlType::Q8_0 {
            for blk in row.chunks_exact_mut(34) {
                blk[0..2].copy_from_slice(&f16::from_f32(rng.unit() * scale).to_le_bytes());
                for q in &mut blk[2..34] {
                    *q = rng.byte();
                }
            }
        } else if raw {
            for blk in row.chunks_exact_mut(292) {
                blk[0..4].copy_from_slice(&(rng.unit() * scale).to_le_bytes());
                for q in &mut blk[4..260] {
                    *q = rng.byte();
                }
                for g in 0..16 {
                    let s: i32 = blk[4 + 16 * g..20 + 16 * g]
                        .iter()
                        .map(|&q| i32::from(q as i8))
                        .sum();
                    blk[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
                }
            }
        } else {
            let x: Vec<f32> = (0..n).map(|_| rng.unit() * scale).collect();
            quantize_activation(act, &x, row).unwrap();
        }
    }
    a
}

/// Every result of `p.dot_groups_on(isa, hint, ..)` for groups `g0 .. g0 + n_g`, as `[act
/// row][weight row]`, with the activation rows prepared by the type's best kernel
/// (`prepared`) or not.
fn products_on(
    p: &Packed,
    (isa, hint): (Isa, PrefetchHint),
    (g0, n_g): (usize, usize),
    a: &[u8],
    n_a: usize,
    prepared: bool,
) -> Vec<Vec<f32>> {
    let n = ((g0 + n_g) * GROUP).min(p.rows()) - g0 * GROUP;
    let mut out = vec![vec![f32::NAN; n]; n_a];
    let prep = if prepared {
        best_kernel(p.ty()).unwrap().prepare(a, n_a)
    } else {
        ActPrep::default()
    };
    p.dot_groups_on(isa, hint, g0, n_g, a, n_a, &prep, &mut |r, i, v| {
        out[r][i..i + v.len()].copy_from_slice(v)
    });
    out
}

/// [`products_on`] by the machine's best kernels, the rows not prepared.
fn products(p: &Packed, g0: usize, n_g: usize, a: &[u8], n_a: usize) -> Vec<Vec<f32>> {
    products_on(p, (Isa::best(), prefetch_hint()), (g0, n_g), a, n_a, false)
}

/// The instruction sets with packed kernels that this machine runs (AVX2's group kernels,
/// AVX-512's tile of the legacy formats), or the best one (the scalar twin elsewhere).
fn isas() -> Vec<Isa> {
    let mut v: Vec<Isa> = [Isa::Avx2, Isa::Avx512Vnni]
        .into_iter()
        .filter(|i| i.is_available())
        .collect();
    if v.is_empty() {
        v.push(Isa::best());
    }
    v
}

#[test]
fn packing_keeps_every_byte() {
    let mut rng = Rng(0x9ac4_0001);
    for ty in PACKED {
        for (rows, nb) in [(8, 1), (13, 2), (24, 6), (5, 3), (9, 17)] {
            let w = weights(&mut rng, ty, rows, nb, 1.0);
            let p = Packed::new(ty, &w, rows, nb * ty.block_size()).unwrap();
            assert_eq!(p.groups(), rows.div_ceil(GROUP));
            assert_eq!(p.bytes(), p.groups() * nb * block_bytes(ty).unwrap());
            let rb = nb * ty.type_size();
            let mut row = vec![0u8; rb];
            for r in 0..rows {
                p.row(r, &mut row);
                assert_eq!(row, w[r * rb..(r + 1) * rb], "{ty} row {r} of {rows}");
            }
        }
    }
}

#[test]
fn packed_kernels_match_scalar_bit_for_bit() {
    let mut rng = Rng(0x9ac4_0002);
    let mut compared = 0usize;
    for ty in PACKED {
        let rb_of = |nb: usize| nb * ty.type_size();
        let counts: &[(usize, usize)] = if ty.block_size() == 256 {
            &[(8, 1), (21, 2), (16, 6), (3, 9)]
        } else {
            &[(8, 1), (21, 7), (16, 18), (3, 36)]
        };
        for &(rows, nb) in counts {
            for (wscale, ascale, raw) in [
                (1.0, 1.0, false),
                (65504.0, 3e4, false),
                (6.2e-5, 1e-5, false),
                (1.0, 2.0, true),
            ] {
                let w = weights(&mut rng, ty, rows, nb, wscale);
                let p = Packed::new(ty, &w, rows, nb * ty.block_size()).unwrap();
                let ab = p.act_row_bytes();
                // 1..=9: every remainder of the AVX2 kernels' four rows; above
                // `PACKED_TILE_ROWS` the AVX-512 tile, with its rows'
                // extras prepared or computed there; every kernel this machine runs.
                for n_a in (1..=9).chain([17, 24]) {
                    let a = acts(&mut rng, ty, n_a, nb, ascale, raw);
                    let mut twin = vec![vec![f32::NAN; rows]; n_a];
                    p.dot_groups_scalar(0, p.groups(), &a, n_a, &mut |r, i, v| {
                        twin[r][i..i + v.len()].copy_from_slice(v)
                    });
                    // Every kernel with every prefetch hint (a hint changes no bit).
                    let kernels = isas()
                        .into_iter()
                        .flat_map(|i| PrefetchHint::ALL.map(|h| (i, h)));
                    for (isa, hint) in kernels {
                        for prepared in [false, true] {
                            let got =
                                products_on(&p, (isa, hint), (0, p.groups()), &a, n_a, prepared);
                            for (r, got_r) in got.iter().enumerate() {
                                let ar = &a[r * ab..(r + 1) * ab];
                                for (i, g) in got_r.iter().enumerate() {
                                    let want =
                                        dot_scalar(ty, &w[i * rb_of(nb)..(i + 1) * rb_of(nb)], ar)
                                            .unwrap();
                                    assert_eq!(
                                        (g.to_bits(), twin[r][i].to_bits()),
                                        (want.to_bits(), want.to_bits()),
                                        "{ty} {rows}x{nb} blocks, {isa:?} {hint:?} (prepared: {prepared}), act row {r} of {n_a}, weight row {i}: {g:e} / scalar {want:e}"
                                    );
                                    compared += 1;
                                }
                            }
                        }
                    }
                }
                // A sub-range of groups gives the same bits as the whole call.
                if p.groups() > 1 {
                    for n_a in [3, 12] {
                        let a = acts(&mut rng, ty, n_a, nb, ascale, raw);
                        let whole = products(&p, 0, p.groups(), &a, n_a);
                        let part = products(&p, 1, p.groups() - 1, &a, n_a);
                        for r in 0..n_a {
                            assert_eq!(
                                whole[r][GROUP..],
                                part[r][..],
                                "{ty} groups 1.. ({n_a} rows)"
                            );
                        }
                    }
                }
            }
        }
    }
    eprintln!("{compared} packed products compared with the scalar kernel");
    assert!(compared > 50_000);
}

#[test]
fn a_changed_weight_changes_the_result() {
    let mut rng = Rng(0x9ac4_0003);
    for ty in PACKED {
        let (rows, nb) = (8, 2);
        let cols = nb * ty.block_size();
        let mut w = weights(&mut rng, ty, rows, nb, 1.0);
        let a = acts(&mut rng, ty, 1, nb, 1.0, false);
        let before = products(&Packed::new(ty, &w, rows, cols).unwrap(), 0, 1, &a, 1);
        // A quant byte of row 5, block 1 (past every format's scales: the last bytes of
        // the block are quants).
        let at = 5 * nb * ty.type_size() + 2 * ty.type_size() - 3;
        w[at] ^= 0x11;
        let after = products(&Packed::new(ty, &w, rows, cols).unwrap(), 0, 1, &a, 1);
        for i in 0..rows {
            assert_eq!(before[0][i] != after[0][i], i == 5, "{ty} row {i}");
        }
    }
}

#[test]
fn a_short_matrix_is_refused() {
    let w = vec![0u8; 144 * 3];
    assert!(Packed::new(GgmlType::Q4_K, &w, 2, 512).is_err());
    assert!(Packed::new(GgmlType::IQ4_NL, &w, 1, 32).is_err());
}
