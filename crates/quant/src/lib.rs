//! ggml block formats: layouts and scalar dequantization, bit-exact with ggml.
//!
//! [`dequantize`] turns the stored bytes of a ggml tensor type into `f32` values, giving
//! for every supported type exactly the bits that ggml's own `to_float` gives (the
//! `dequantize_row_*` functions of `ggml/src/ggml-quants.c`, and `ggml_fp16_to_fp32_row` /
//! `ggml_bf16_to_fp32_row` for the plain half types). The code here is a scalar reference:
//! it is written for clarity and exactness, and faster kernels are tested against it.
//!
//! Exactness rests on doing each floating-point operation in the same order, in `f32`, as
//! ggml's C does, with no fused multiply-add (Rust never contracts `a * b + c` on its
//! own). Every block layout (byte offsets of every field) is documented in the module of
//! its family:
//!
//! | family | types | module |
//! |---|---|---|
//! | plain floats | F32, F16, BF16 | `float` |
//! | legacy 32-element blocks | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 | `legacy` |
//! | K-quants (256-element super-blocks) | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K | `kquants` |
//! | ternary | TQ1_0, TQ2_0 | `ternary` |
//! | I-quants (codebooks in [`grids`]) | IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS | `iquants` |
//!
//! Types for which ggml defines no conversion to `f32` (Q8_1, an activation-only format,
//! and the integer and F64 types) are refused with [`QuantError::Unsupported`].
//!
//! [`dot`] holds activation quantization (Q8_0, Q8_1, Q8_K, bit-exact with ggml's
//! reference quantizers) and integer dot products of weight rows with quantized activation
//! rows: a scalar reference and run-time selected SIMD kernels that give the same bits.
//! `unsafe` is denied crate-wide and allowed only in its architecture modules
//! (`dot::x86`, `dot::aarch64`), for intrinsics behind run-time feature detection.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod dot;
pub mod file;
mod float;
pub mod imatrix;
#[rustfmt::skip]
pub mod grids;
mod iquants;
mod kquants;
mod legacy;
pub mod mix;
pub mod quantize;
mod ternary;

pub use frink_gguf::{GgmlType, QK_K};

/// Why a dequantization was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// This crate has no dequantization for the type (see [`is_supported`]).
    #[error("tensor type {0} is not supported")]
    Unsupported(GgmlType),
    /// The data is not a whole number of blocks, or the output does not hold exactly the
    /// values those blocks decode to (`data_len / type_size * block_size`).
    #[error(
        "{ty}: {data_len} bytes of data and room for {out_len} values do not match \
         (a {ty} block is {block_bytes} bytes for {block_len} values)"
    )]
    LengthMismatch {
        /// The tensor type.
        ty: GgmlType,
        /// Bytes of data given.
        data_len: usize,
        /// Length of the output slice given.
        out_len: usize,
        /// Bytes per block of `ty` (`ggml_type_size`).
        block_bytes: usize,
        /// Values per block of `ty` (`ggml_blck_size`).
        block_len: usize,
    },
    /// A tensor's shape does not describe its data: a row length (`ne0`) that is not a
    /// whole number of blocks, a byte count that disagrees with the shape, or more values
    /// than this machine can address.
    #[error(
        "tensor {name}: shape {shape:?} of type {ty} does not match its {n_bytes} bytes of data"
    )]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// Its shape, `ne0` first.
        shape: Vec<u64>,
        /// The size of its data in bytes.
        n_bytes: u64,
    },
    /// The type is quantized only with an importance matrix
    /// (`ggml_quantize_requires_imatrix`: IQ2_XXS, IQ2_XS, IQ1_S).
    #[error("{0} quantization needs an importance matrix")]
    NeedsImatrix(GgmlType),
}

/// Every type [`dequantize`] accepts, in ggml id order.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
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
    GgmlType::Q8_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::IQ1_M,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

/// Whether [`dequantize`] handles `ty` (it is in [`SUPPORTED`]).
pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Dequantizes `data`, a whole number of blocks of type `ty`, into `out`.
///
/// `data` holds `n` blocks of `ty.type_size()` bytes each, in the stored (little-endian)
/// format; `out` must have exactly `n * ty.block_size()` elements. Rows need not be
/// separated: blocks never straddle rows in ggml, so any run of whole rows is a run of
/// whole blocks. The values are bit-identical to ggml's `to_float` for the type (see the
/// module of each family for the rule and its source).
///
/// # Errors
/// - [`QuantError::Unsupported`] if `ty` is not in [`SUPPORTED`] (nothing is written).
/// - [`QuantError::LengthMismatch`] if `data.len()` is not a multiple of the block size
///   in bytes or `out.len()` is not the matching number of values (nothing is written).
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType as T;
    match ty {
        T::F32 => each_block(ty, data, out, float::f32_le),
        T::F16 => each_block(ty, data, out, float::f16_le),
        T::BF16 => each_block(ty, data, out, float::bf16_le),
        T::Q4_0 => each_block(ty, data, out, legacy::q4_0),
        T::Q4_1 => each_block(ty, data, out, legacy::q4_1),
        T::Q5_0 => each_block(ty, data, out, legacy::q5_0),
        T::Q5_1 => each_block(ty, data, out, legacy::q5_1),
        T::Q8_0 => each_block(ty, data, out, legacy::q8_0),
        T::MXFP4 => each_block(ty, data, out, legacy::mxfp4),
        T::Q2_K => each_block(ty, data, out, kquants::q2_k),
        T::Q3_K => each_block(ty, data, out, kquants::q3_k),
        T::Q4_K => each_block(ty, data, out, kquants::q4_k),
        T::Q5_K => each_block(ty, data, out, kquants::q5_k),
        T::Q6_K => each_block(ty, data, out, kquants::q6_k),
        T::Q8_K => each_block(ty, data, out, kquants::q8_k),
        T::TQ1_0 => each_block(ty, data, out, ternary::tq1_0),
        T::TQ2_0 => each_block(ty, data, out, ternary::tq2_0),
        T::IQ2_XXS => each_block(ty, data, out, iquants::iq2_xxs),
        T::IQ2_XS => each_block(ty, data, out, iquants::iq2_xs),
        T::IQ2_S => each_block(ty, data, out, iquants::iq2_s),
        T::IQ3_XXS => each_block(ty, data, out, iquants::iq3_xxs),
        T::IQ3_S => each_block(ty, data, out, iquants::iq3_s),
        T::IQ1_S => each_block(ty, data, out, iquants::iq1_s),
        T::IQ1_M => each_block(ty, data, out, iquants::iq1_m),
        T::IQ4_NL => each_block(ty, data, out, iquants::iq4_nl),
        T::IQ4_XS => each_block(ty, data, out, iquants::iq4_xs),
        T::Q8_1 | T::I8 | T::I16 | T::I32 | T::I64 | T::F64 => Err(QuantError::Unsupported(ty)),
    }
}

/// Dequantizes a whole GGUF tensor into a new vector of `info.n_elements()` values, in
/// storage order (`ne0` fastest).
///
/// # Errors
/// - [`QuantError::Unsupported`] if the tensor's type is not in [`SUPPORTED`].
/// - [`QuantError::TensorShape`] if `ne0` is not a whole number of blocks, the data size
///   disagrees with the shape, or the element count does not fit in `usize`.
pub fn dequantize_tensor(t: &frink_gguf::Tensor) -> Result<Vec<f32>, QuantError> {
    let info = t.info;
    let ty = info.ggml_type;
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let shape_err = || QuantError::TensorShape {
        name: info.name.clone(),
        ty,
        shape: info.shape.clone(),
        n_bytes: info.n_bytes,
    };
    let row_len = info.shape.first().copied().unwrap_or(1);
    let rows: u64 = info.shape.iter().skip(1).product();
    let expected_bytes = ty
        .row_bytes(row_len)
        .and_then(|rb| rb.checked_mul(rows))
        .ok_or_else(shape_err)?;
    if expected_bytes != info.n_bytes || t.data.len() as u64 != info.n_bytes {
        return Err(shape_err());
    }
    let n = row_len
        .checked_mul(rows)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(shape_err)?;
    let mut out = vec![0.0f32; n];
    dequantize(ty, t.data, &mut out)?;
    Ok(out)
}

/// Applies `decode` to each `B`-byte block of `data`, writing `N` values per block.
///
/// The block geometry comes from the decoder's own signature, so a layout and its decoder
/// cannot disagree; a unit test checks every geometry against [`GgmlType`]'s table.
fn each_block<const B: usize, const N: usize>(
    ty: GgmlType,
    data: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; B], &mut [f32; N]),
) -> Result<(), QuantError> {
    let (blocks, rest) = data.as_chunks::<B>();
    if !rest.is_empty() || blocks.len().checked_mul(N) != Some(out.len()) {
        return Err(QuantError::LengthMismatch {
            ty,
            data_len: data.len(),
            out_len: out.len(),
            block_bytes: B,
            block_len: N,
        });
    }
    let (outs, _) = out.as_chunks_mut::<N>();
    for (block, y) in blocks.iter().zip(outs) {
        decode(block, y);
    }
    Ok(())
}

/// The little-endian `u16` at byte `at` of `b`.
#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian `u32` at byte `at` of `b`.
#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The IEEE half (`ggml_half`) at byte `at` of `b`, widened exactly to `f32`
/// (`GGML_FP16_TO_FP32`, ggml/src/ggml-impl.h).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16_at(b, at)).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every decoder's block geometry (fixed by its signature) matches ggml's type table,
    /// and every type outside `SUPPORTED` is refused.
    #[test]
    fn block_geometry_matches_ggml_table() {
        for ty in GgmlType::all() {
            let bytes = ty.type_size();
            let n = ty.block_size();
            let data = vec![0u8; 3 * bytes];
            let mut out = vec![f32::NAN; 3 * n];
            let r = dequantize(ty, &data, &mut out);
            if is_supported(ty) {
                assert_eq!(r, Ok(()), "{ty}");
                assert!(
                    out.iter().all(|v| v.is_finite()),
                    "{ty}: not every value written"
                );
                let mut short = vec![0.0; 3 * n - 1];
                assert!(dequantize(ty, &data, &mut short).is_err(), "{ty}");
            } else {
                assert_eq!(r, Err(QuantError::Unsupported(ty)));
            }
        }
    }
}
