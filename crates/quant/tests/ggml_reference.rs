//! The quantizers against ggml's own bytes (`tests/data/ggml/`, made by
//! `make_reference.py` through ctypes from the anchor build's libggml-base.so): the same
//! input gives byte-identical blocks to `ggml_quantize_chunk` (what llama-quantize writes
//! without an importance matrix, and with one), and to the row conversion that stores a
//! KV cache.

use frink_quant::quantize::{
    quantize, quantize_for_cache, quantize_weighted, GRID_TYPES, NEED_IMATRIX, QUANTIZABLE,
    WEIGHTED,
};
use frink_quant::GgmlType;

fn data(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/ggml")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn input() -> Vec<f32> {
    floats("input.f32")
}

fn floats(name: &str) -> Vec<f32> {
    data(name)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn name(ty: GgmlType) -> String {
    format!("{ty:?}").to_lowercase()
}

/// The first block whose bytes differ, for the message.
fn first_difference(ty: GgmlType, got: &[u8], want: &[u8]) -> Option<usize> {
    got.chunks(ty.type_size())
        .zip(want.chunks(ty.type_size()))
        .position(|(a, b)| a != b)
}

/// `ty` without weights against `file_<ty>.bin`.
fn check_file(ty: GgmlType) {
    let x = input();
    let want = data(&format!("file_{}.bin", name(ty)));
    let mut got = vec![0u8; want.len()];
    quantize(ty, &x, &mut got).unwrap();
    assert_eq!(
        first_difference(ty, &got, &want),
        None,
        "{ty}: block differs from ggml_quantize_chunk's"
    );
}

/// `ty` with the importance weights against `weighted_<ty>.bin`, and those bytes differ
/// from the unweighted ones where there are any (so the weights are read at all).
fn check_weighted(ty: GgmlType) {
    let x = input();
    let qw = floats("imatrix.f32");
    assert_eq!(qw.len(), 512);
    let want = data(&format!("weighted_{}.bin", name(ty)));
    let mut got = vec![0u8; want.len()];
    quantize_weighted(ty, &x, &qw, &mut got).unwrap();
    assert_eq!(
        first_difference(ty, &got, &want),
        None,
        "{ty}: block differs from ggml_quantize_chunk's with an imatrix"
    );
    if !NEED_IMATRIX.contains(&ty) {
        assert_ne!(want, data(&format!("file_{}.bin", name(ty))), "{ty}");
    }
}

#[test]
fn file_quantizers_give_ggmls_bytes() {
    for &ty in QUANTIZABLE
        .iter()
        .filter(|&&t| t != GgmlType::F32 && !GRID_TYPES.contains(&t))
    {
        check_file(ty);
    }
}

/// The types ggml writes only with an importance matrix are refused without one.
#[test]
fn types_that_need_an_imatrix_are_refused_without() {
    let x = input();
    for &ty in NEED_IMATRIX {
        let mut out = vec![0u8; x.len() / 256 * ty.type_size()];
        assert_eq!(
            quantize(ty, &x, &mut out),
            Err(frink_quant::QuantError::NeedsImatrix(ty))
        );
    }
}

#[test]
fn iq1_quantizers_give_ggmls_bytes() {
    check_file(GgmlType::IQ1_M);
    check_weighted(GgmlType::IQ1_S);
    check_weighted(GgmlType::IQ1_M);
}

#[test]
fn iq2_quantizers_give_ggmls_bytes() {
    check_file(GgmlType::IQ2_S);
    check_weighted(GgmlType::IQ2_XXS);
    check_weighted(GgmlType::IQ2_XS);
    check_weighted(GgmlType::IQ2_S);
}

#[test]
fn iq3_quantizers_give_ggmls_bytes() {
    check_file(GgmlType::IQ3_XXS);
    check_file(GgmlType::IQ3_S);
    check_weighted(GgmlType::IQ3_XXS);
    check_weighted(GgmlType::IQ3_S);
}

/// The KV cache's quantizer: every type but Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL gives the
/// file quantizer's bytes (ggml's); those five refine ggml's reference rounding (the
/// file bytes, and for IQ4_NL the CPU backend's row conversion, `cache_iq4_nl.bin`, which
/// llama.cpp stores), so they decode with no more squared error than ggml's blocks on
/// any block, and less in all (measured 5.7% less for Q5_0 to 13.9% for Q4_1 on this
/// input).
#[test]
fn cache_quantizers_fit_at_least_as_well_as_ggmls() {
    let x = input();
    let refined = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ];
    for &ty in QUANTIZABLE
        .iter()
        .filter(|&&t| t != GgmlType::F32 && !GRID_TYPES.contains(&t))
    {
        let ggml = match ty {
            GgmlType::IQ4_NL => data("cache_iq4_nl.bin"),
            _ => data(&format!("file_{}.bin", name(ty))),
        };
        let mut got = vec![0u8; ggml.len()];
        quantize_for_cache(ty, &x, &mut got).unwrap();
        if !refined.contains(&ty) {
            assert_eq!(got, ggml, "{ty}");
            continue;
        }
        let n = ty.block_size();
        let (mut ours, mut theirs) = (0f64, 0f64);
        for (i, ((g, w), x)) in got
            .chunks(ty.type_size())
            .zip(ggml.chunks(ty.type_size()))
            .zip(x.chunks(n))
            .enumerate()
        {
            let err = |b: &[u8]| {
                let mut y = vec![0f32; n];
                frink_quant::dequantize(ty, b, &mut y).unwrap();
                x.iter()
                    .zip(&y)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum::<f64>()
            };
            let (eg, ew) = (err(g), err(w));
            assert!(
                eg <= ew * (1.0 + 1e-5) + 1e-30,
                "{ty} block {i}: {eg} > {ew}"
            );
            ours += eg;
            theirs += ew;
        }
        assert!(ours < 0.96 * theirs, "{ty}: {ours} vs {theirs}");
    }
}

/// With importance weights (32 rows of 512 values, one weight per column, some 0 and one
/// 1e4): every type whose quantizer reads them gives `ggml_quantize_chunk`'s bytes with
/// that imatrix.
#[test]
fn weighted_quantizers_give_ggmls_bytes() {
    for &ty in WEIGHTED.iter().filter(|t| !GRID_TYPES.contains(t)) {
        check_weighted(ty);
    }
}
