//! Activation quantization and quantized dot products (one weight row · one activation
//! row, or one weight row · several activation rows).
//!
//! # Use
//! ```
//! use frink_quant::dot::{best_kernel, quantize_activation, vec_dot_type};
//! use frink_quant::GgmlType;
//! let w = vec![0u8; 2 * 18]; // two Q4_0 blocks = one 64-wide weight row
//! let x = vec![0.5f32; 64];
//! let act_ty = vec_dot_type(GgmlType::Q4_0).unwrap(); // Q8_0
//! let mut act = vec![0u8; act_ty.row_bytes(64).unwrap() as usize];
//! quantize_activation(act_ty, &x, &mut act).unwrap(); // once per activation row
//! let k = best_kernel(GgmlType::Q4_0).unwrap(); // once per weight matrix
//! let y: f32 = k.dot(&w, &act); // per output element
//! assert_eq!(y, 0.0);
//! // Prefill: one weight row against several activation rows stored back to back;
//! // every result has exactly the bits `dot` gives for that row alone.
//! let acts = [act.clone(), act.clone(), act].concat();
//! let mut out = [f32::NAN; 3];
//! k.dot_rows(&w, &acts, &mut out);
//! assert_eq!(out, [y; 3]);
//! // A tile of weight rows x activation rows: out[r * n_w + i].
//! let ws = [w.clone(), w].concat();
//! let mut tile = [f32::NAN; 6];
//! k.dot_tile(&ws, 2, &acts, 3, &mut tile);
//! assert_eq!(tile, [y; 6]);
//! ```
//!
//! # Kernels
//! | ISA | formats | selected when |
//! |---|---|---|
//! | scalar ([`dot_scalar`]) | all ten | always available; the reference |
//! | AVX2 + F16C | all ten, single-row ([`DotKernel::dot`]) and multi-row ([`DotKernel::dot_rows`]); tiles ([`DotKernel::dot_tile`]) for all ten (`x86_tile`; Q8_0 tiles keep the older i16-widening kernel, as `maddubs` would saturate on its signed weights) | `is_x86_feature_detected!` |
//! | AVX-512 F/BW/VL + VNNI | tiles for all ten; 512-bit decode and prefill tiles for Q4_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (`x86_512`), 256-bit `vpdpbusd` ones for the rest and for legacy small batches of 4-8 rows (single and multi-row: the AVX2 kernels); packed groups (all seven packed types): the AVX2 group kernels for one row (K-quants: up to two), the 512-bit tile for more | `is_x86_feature_detected!`; preferred over AVX2 |
//! | NEON (baseline) | all ten, single-row (multi-row loops over rows) | `is_aarch64_feature_detected!`; compile-checked only |
//!
//! The tile kernels have three paths. Small batches on AVX-512 VNNI (legacy formats,
//! `3 <= n_a <= 8`: a continuous-batching decode step): 512-bit vectors whose lanes hold
//! `Q` blocks of one weight row by `16 / Q` activation rows; the weight row is decoded
//! once per call into an interleaved layout whose dwords are broadcast, the activation
//! rows are prepared once per call (`x86_tile/small.rs`). Decode (`n_a < 4` otherwise):
//! one length check per call, then
//! a raw-pointer loop over the weight rows, eight blocks (legacy) or super-blocks
//! (K-quants) at a time, their block values formed on eight lanes at once. Prefill
//! (`n_a >= 4`): the tile's weight rows are decoded once per call and the activation
//! rows once per chunk of 48, both into a transposed layout (vector `j` holds bytes
//! `4j..4j+4` of eight blocks), so eight `vpdpbusd` (or `maddubs + madd`) give eight
//! block sums without horizontal sums, and a register block of weight rows by
//! activation rows reuses every load (activation rows in blocks of three, a remainder
//! in blocks of two, so no padded row is computed).
//!
//! AMX is never used.
//!
//! # Pairing (ggml's `vec_dot_type`, ggml-cpu/ggml-cpu.c `type_traits_cpu`, except Q4_1/Q5_1)
//! | weight | activation |
//! |---|---|
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 | Q8_0 |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K | Q8_K (its `bsums` are used, so it must come from [`quantize_row_q8_k`]) |
//!
//! ggml pairs Q4_1/Q5_1 with Q8_1, whose block sum `s = f16(d * sum(qs))` carries the
//! min term; that sum overflows f16 (giving inf) once activations exceed about 2000 in
//! magnitude and is rounded to 11 bits. Here they use Q8_0 and the exact integer sum of
//! the activation quants instead, so every legacy format shares one activation row.
//! [`quantize_row_q8_1`] is still provided, bit-exact with ggml.
//!
//! Other types have no kernel here ([`has_dot`] is false): dequantize them instead.
//!
//! # Reduction order (the same bits on every ISA)
//! Each block (32 values for the legacy formats, a 256-value super-block for the
//! K-quants) yields exact integer sums; every kernel, scalar or SIMD, computes these same
//! integers. Each block then gives one `f32` value by a fixed formula (see the `block_*`
//! functions below: one product of the two f16/f32 scales, then products and one
//! difference or sum, no fused multiply-add). Block `b` is added into lane `b % 8` of
//! eight `f32` accumulators, in block order, and the lanes are combined as
//! `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`. The result therefore depends only
//! on the two rows, never on the ISA, thread count or the other rows of a batch; tests
//! compare every SIMD kernel with [`dot_scalar`] bit for bit.
//!
//! This differs from ggml's own (ISA-dependent) summation order, so results agree with
//! llama.cpp to rounding, not bit for bit; the quantizers do agree bit for bit.
//!
//! Integer sums are exact for every input byte pattern (including `-128` quants), except
//! that the Q8_K kernels trust the activation's `bsums` (as ggml does).

#[cfg(target_arch = "aarch64")]
#[allow(unsafe_code)]
mod aarch64;
pub mod pack;
pub(crate) mod quantize;
mod scalar;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86_512;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86_pack;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86_tile;

pub use quantize::{
    quantize_activation, quantize_row_q8_0, quantize_row_q8_0_scalar, quantize_row_q8_1,
    quantize_row_q8_1_scalar, quantize_row_q8_k, quantize_row_q8_k_scalar,
};

use crate::GgmlType;

/// Why a quantization or a dot product was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DotError {
    /// No integer dot product for this weight type (or not an activation type).
    #[error("no quantized dot product for type {0}")]
    NoDot(GgmlType),
    /// The requested instruction set is not available on this machine or build.
    #[error("instruction set {0:?} is not available here")]
    IsaUnavailable(Isa),
    /// The activation input and output lengths do not match whole blocks.
    #[error(
        "quantizing to {ty}: {x_len} values and {out_len} bytes are not whole matching blocks"
    )]
    Quantize {
        /// The activation type.
        ty: GgmlType,
        /// Number of input values.
        x_len: usize,
        /// Output length in bytes.
        out_len: usize,
    },
    /// The weight row and activation row do not describe the same number of values.
    #[error("dot {ty}: a weight row of {w_len} bytes and an activation row of {act_len} bytes do not match")]
    Length {
        /// The weight type.
        ty: GgmlType,
        /// Weight row bytes.
        w_len: usize,
        /// Activation row bytes.
        act_len: usize,
    },
}

/// An instruction set a kernel is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust: the reference every other kernel is tested against.
    Scalar,
    /// x86-64 AVX2 (with F16C for the scale conversions).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI (256-bit `vpdpbusd`, 32 vector registers), on top
    /// of AVX2 + F16C: the tile kernels; single and multi-row products are the AVX2 ones.
    Avx512Vnni,
    /// aarch64 NEON (baseline, no `dotprod`); compile-checked only so far.
    Neon,
}

impl Isa {
    /// Whether kernels for this ISA exist in this build and the CPU supports them.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            _ => false,
        }
    }

    /// Every available ISA, the scalar one first.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Neon]
            .into_iter()
            .filter(|i| i.is_available())
            .collect()
    }

    /// The fastest available ISA (detected once).
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            [Isa::Avx512Vnni, Isa::Avx2, Isa::Neon]
                .into_iter()
                .find(|i| i.is_available())
                .unwrap_or(Isa::Scalar)
        })
    }
}

/// The activation type ggml pairs with weight type `ty` for its integer dot product
/// (see the module table), or `None` if there is no kernel for `ty` here.
pub fn vec_dot_type(ty: GgmlType) -> Option<GgmlType> {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 | T::Q8_0 => Some(T::Q8_0),
        T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K => Some(T::Q8_K),
        _ => None,
    }
}

/// Whether weight type `ty` has an integer dot kernel here (on every ISA: a type without
/// a SIMD version uses the scalar one).
pub fn has_dot(ty: GgmlType) -> bool {
    vec_dot_type(ty).is_some()
}

/// A safe row kernel: `fn(weight_row, activation_row) -> f32`, lengths already checked.
type RowFn = fn(&[u8], &[u8]) -> f32;

/// A safe multi-row kernel: `fn(weight_row, activation_rows, activation_row_bytes, out)`,
/// lengths already checked; `out[r]` has the bits of `RowFn(w, row r)`.
type RowsFn = fn(&[u8], &[u8], usize, &mut [f32]);

/// A safe tile kernel: `fn(weight_rows, n_w, activation_rows, n_a, out)` with
/// `out[r * n_w + i]`, lengths already checked; each element has the bits of `RowFn`.
type TileFn = fn(&[u8], usize, &[u8], usize, &mut [f32]);

/// Where a tile kernel puts its results: `sink(r, i, values)` receives the results of
/// activation row `r` for weight rows `i .. i + values.len()`.
pub type TileSink<'a> = dyn FnMut(usize, usize, &[f32]) + 'a;

/// A safe prefill tile kernel on prepared activations: `fn(weight_rows, n_w,
/// activation_rows, n_a, prepared, sink)`, lengths already checked, `n_a >= 4`.
type TilePrepFn = fn(&[u8], usize, &[u8], usize, &ActPrep, &mut TileSink<'_>);

/// What the prefill tile kernels of the Q8_K-paired formats derive from one activation
/// super-block: the Q4_K/Q5_K bsum pair sums `bsum_2j + bsum_2j+1` as i16 pairs
/// (`pairs[q]` = sums `2q` and `2q + 1`), the Q6_K offsets `-32 bsum_g`, and the scale.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct KExtra {
    pub(crate) pairs: [u32; 4],
    pub(crate) init: [i32; 16],
    pub(crate) d: f32,
}

impl KExtra {
    /// The extras of the Q8_K block `a` (292 bytes: d, 256 quants, 16 bsums).
    pub(crate) fn of(a: &[u8]) -> KExtra {
        let bs = |i: usize| i16::from_le_bytes([a[260 + 2 * i], a[261 + 2 * i]]);
        let mut e = KExtra::default();
        for q in 0..4 {
            // |bsum| <= 16 * 128: a pair sum fits i16.
            let p0 = bs(4 * q) + bs(4 * q + 1);
            let p1 = bs(4 * q + 2) + bs(4 * q + 3);
            e.pairs[q] = u32::from(p0 as u16) | (u32::from(p1 as u16) << 16);
        }
        for g in 0..16 {
            e.init[g] = -32 * i32::from(bs(g));
        }
        e.d = f32_at(a, 0);
        e
    }
}

/// Bytes of one activation block in the legacy prefill tile's layout
/// ([`interleave_q8_0`]): 32 quants, a scale and `-8 Σy`.
pub(crate) const LI: usize = 40;

/// Activation rows of the largest register block of the AVX-512 prefill tiles.
pub(crate) const TILE_RA: usize = 8;

/// The register blocks the AVX-512 prefill tiles take `n_a` activation rows in, as
/// `(first row, rows)`: blocks of [`TILE_RA`], then the rest as at most one block each of
/// 4, 2 and 1 rows (so that no padded row is computed). The one decomposition of both the
/// tiles and the layout [`interleave_q8_0`] prepares for them.
pub(crate) fn tile_row_groups(n_a: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut r0 = 0;
    std::iter::from_fn(move || {
        let g = match n_a - r0 {
            0 => return None,
            left if left >= TILE_RA => TILE_RA,
            4.. => 4,
            2.. => 2,
            _ => 1,
        };
        r0 += g;
        Some((r0 - g, g))
    })
}

/// `n_a` Q8_0 activation rows (`acts`, back to back, 34-byte blocks: f16 scale, 32 i8
/// quants) laid out for the legacy prefill tile: each register block `(r0, g)` of
/// [`tile_row_groups`] takes `g * nb * LI` bytes from byte `r0 * nb * LI` on; within it,
/// block `b` of its `g` rows is `g * LI` bytes from `b * g * LI`: the rows' 32 quants
/// (row `q` at `32 q`), then per row its scale as `f32` and `-8 Σy` as `i32` (row `q` at
/// `32 g + 8 q`, little-endian). One base pointer and constant offsets then reach every
/// row of a register block (the stored rows needed two pointers per row: 16 for 8 rows,
/// more than the general registers, and the spills and the per-block `-c Σy` took a fifth
/// of a Q4_0 prefill's tile time, perf, AMD Zen 5); `-8 Σy` serves every offset `c` (8,
/// 16, 128) by a shift, and `Σy` itself by an exact arithmetic shift.
///
/// # Panics
/// If `acts` is not `n_a` rows of whole Q8_0 blocks.
pub(crate) fn interleave_q8_0(acts: &[u8], n_a: usize) -> Vec<u8> {
    let ab_q8 = GgmlType::Q8_0.type_size();
    if n_a == 0 {
        return Vec::new();
    }
    let ab = acts.len() / n_a;
    assert!(
        ab * n_a == acts.len() && ab.is_multiple_of(ab_q8),
        "Q8_0 rows"
    );
    let nb = ab / ab_q8;
    let mut out = vec![0u8; n_a * nb * LI];
    for (r0, g) in tile_row_groups(n_a) {
        let group = &mut out[r0 * nb * LI..][..g * nb * LI];
        for q in 0..g {
            let row = &acts[(r0 + q) * ab..][..ab];
            for (blk, dst) in row.chunks_exact(ab_q8).zip(group.chunks_exact_mut(g * LI)) {
                dst[32 * q..][..32].copy_from_slice(&blk[2..]);
                let ysum: i32 = blk[2..].iter().map(|&v| i32::from(v as i8)).sum();
                let ex = &mut dst[32 * g + 8 * q..][..8];
                ex[..4].copy_from_slice(&f16_at(blk, 0).to_le_bytes());
                ex[4..].copy_from_slice(&(-8 * ysum).to_le_bytes());
            }
        }
    }
    out
}

/// Activation rows prepared once per matrix product for every tile of it
/// ([`DotKernel::prepare`], [`DotKernel::dot_tile_prepared`]). Q8_K rows: one record per
/// super-block of what the prefill kernels derive from it besides its quants (the bsum
/// pair sums, the Q6_K offsets, the scale); Q8_0 rows: the rows in the legacy tile's
/// layout (`interleave_q8_0`). The same prepared rows serve every kernel of their
/// activation type.
#[derive(Clone, Debug, Default)]
pub struct ActPrep {
    pub(crate) k: Vec<KExtra>,
    pub(crate) l: Vec<u8>,
    n_a: usize,
}

impl ActPrep {
    /// Whether nothing was prepared (the default, or a kernel that reads rows as stored).
    pub fn is_empty(&self) -> bool {
        self.k.is_empty() && self.l.is_empty()
    }

    /// Prepared blocks.
    fn len(&self) -> usize {
        self.k.len() + self.l.len() / LI
    }
}

/// A dot-product kernel for one weight type on one ISA, chosen once and called per row.
#[derive(Clone, Copy)]
pub struct DotKernel {
    ty: GgmlType,
    act: GgmlType,
    isa: Isa,
    f: RowFn,
    rows: Option<RowsFn>,
    tile: Option<TileFn>,
    tile_prep: Option<TilePrepFn>,
}

impl std::fmt::Debug for DotKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DotKernel")
            .field("ty", &self.ty)
            .field("act", &self.act)
            .field("isa", &self.isa)
            .finish()
    }
}

impl DotKernel {
    /// The activation type its rows must be quantized to.
    pub fn act_type(&self) -> GgmlType {
        self.act
    }

    /// The ISA whose code runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Checks that `w` (weight blocks) and `act` (activation blocks) are rows of the same
    /// length.
    ///
    /// # Errors
    /// [`DotError::Length`] otherwise.
    pub fn check(&self, w: &[u8], act: &[u8]) -> Result<(), DotError> {
        let (wb, ab) = (self.ty.type_size(), self.act.type_size());
        let ok = w.len().is_multiple_of(wb) && {
            let n = w.len() / wb * self.ty.block_size();
            n.is_multiple_of(self.act.block_size()) && act.len() == n / self.act.block_size() * ab
        };
        if ok {
            Ok(())
        } else {
            Err(DotError::Length {
                ty: self.ty,
                w_len: w.len(),
                act_len: act.len(),
            })
        }
    }

    /// The dot product of weight row `w` with activation row `act` (quantized to
    /// [`Self::act_type`]), in the crate's fixed reduction order.
    ///
    /// # Panics
    /// If the lengths do not match (see [`Self::check`]).
    #[inline]
    pub fn dot(&self, w: &[u8], act: &[u8]) -> f32 {
        if let Err(e) = self.check(w, act) {
            panic!("{e}");
        }
        (self.f)(w, act)
    }

    /// Dots weight row `w` with each of the `out.len()` activation rows stored back to back
    /// in `acts`, writing `out[r]`. Every `out[r]` has exactly the bits of
    /// `self.dot(w, row r)`: the multi-row kernels (AVX2: every format) only share the decoding of each weight block between rows.
    ///
    /// # Panics
    /// If `acts.len()` is not `out.len()` activation rows matching `w` (see
    /// [`Self::check`]).
    pub fn dot_rows(&self, w: &[u8], acts: &[u8], out: &mut [f32]) {
        let n = w.len() / self.ty.type_size() * self.ty.block_size();
        let ab = n / self.act.block_size() * self.act.type_size();
        let whole = if ab == 0 {
            acts.is_empty()
        } else {
            acts.len() == out.len() * ab
        };
        if !whole {
            panic!(
                "dot_rows {}: {} activation bytes are not {} rows of {ab}",
                self.ty,
                acts.len(),
                out.len()
            );
        }
        if let Err(e) = self.check(w, &acts[..ab.min(acts.len())]) {
            panic!("{e}");
        }
        if ab == 0 {
            out.fill(0.0);
            return;
        }
        match self.rows {
            Some(rows) => rows(w, acts, ab, out),
            None => {
                for (o, a) in out.iter_mut().zip(acts.chunks_exact(ab)) {
                    *o = (self.f)(w, a);
                }
            }
        }
    }

    /// The tile product for prefill: `ws` holds `n_w` weight rows and `acts` holds `n_a`
    /// activation rows, each back to back; `out[r * n_w + i]` (activation row `r`, weight
    /// row `i`) gets exactly the bits of `self.dot(weight row i, activation row r)`. The
    /// x86 tile kernels (every format) handle decode (`n_a = 1`, a tight loop over the
    /// weight rows) and prefill (each weight block decoded once per call, activation-only
    /// terms prepared once per activation row; see the module's kernel table); other ISAs
    /// run [`Self::dot_rows`] per weight row.
    ///
    /// # Panics
    /// If `ws` is not `n_w` rows and `acts` not `n_a` rows of matching lengths, or
    /// `out.len() != n_a * n_w`.
    pub fn dot_tile(&self, ws: &[u8], n_w: usize, acts: &[u8], n_a: usize, out: &mut [f32]) {
        assert_eq!(out.len(), n_a * n_w, "dot_tile {}: output length", self.ty);
        if n_w == 0 || n_a == 0 {
            return;
        }
        let (wrb, ab) = (ws.len() / n_w, acts.len() / n_a);
        assert!(
            wrb * n_w == ws.len() && ab * n_a == acts.len(),
            "dot_tile {}: {} weight bytes are not {n_w} rows or {} activation bytes not {n_a} rows",
            self.ty,
            ws.len(),
            acts.len()
        );
        if let Err(e) = self.check(&ws[..wrb], &acts[..ab]) {
            panic!("{e}");
        }
        match self.tile {
            Some(tile) => tile(ws, n_w, acts, n_a, out),
            None => {
                let mut col = vec![0f32; n_a];
                for (i, w) in ws.chunks_exact(wrb.max(1)).enumerate().take(n_w) {
                    self.dot_rows(w, acts, &mut col);
                    for (r, v) in col.iter().enumerate() {
                        out[r * n_w + i] = *v;
                    }
                }
            }
        }
    }

    /// Whether [`Self::dot_tile_prepared`] reads anything [`Self::prepare`] computes.
    pub fn wants_prep(&self) -> bool {
        self.tile_prep.is_some()
    }

    /// Prepares `n_a` activation rows (`acts`, back to back) for
    /// [`Self::dot_tile_prepared`]: done once per matrix product, shared by its tiles.
    /// Empty for kernels that read the rows as they are.
    ///
    /// # Panics
    /// If `acts` is not `n_a` whole rows of [`Self::act_type`].
    pub fn prepare(&self, acts: &[u8], n_a: usize) -> ActPrep {
        let ab = self.act.type_size();
        assert!(
            n_a == 0 || acts.len().is_multiple_of(n_a) && (acts.len() / n_a).is_multiple_of(ab),
            "prepare {}: {} bytes are not {n_a} activation rows",
            self.ty,
            acts.len()
        );
        let mut prep = ActPrep {
            n_a,
            ..ActPrep::default()
        };
        if self.tile_prep.is_some() {
            if self.act == GgmlType::Q8_K {
                prep.k = acts.chunks_exact(ab).map(KExtra::of).collect();
            } else {
                prep.l = interleave_q8_0(acts, n_a);
            }
        }
        prep
    }

    /// [`Self::dot_tile`] with the activation rows prepared by [`Self::prepare`] (from the
    /// same `acts` and `n_a`), the results handed to `sink(r, i, values)` (activation row
    /// `r`, weight rows `i ..`) instead of a contiguous tile: every value has exactly the
    /// bits `dot_tile` gives it.
    ///
    /// # Panics
    /// As [`Self::dot_tile`]; if `prep` was not prepared for `n_a` rows of this length.
    pub fn dot_tile_prepared(
        &self,
        ws: &[u8],
        n_w: usize,
        acts: &[u8],
        n_a: usize,
        prep: &ActPrep,
        sink: &mut TileSink<'_>,
    ) {
        if n_w == 0 || n_a == 0 {
            return;
        }
        let (wrb, ab) = (ws.len() / n_w, acts.len() / n_a);
        assert!(
            wrb * n_w == ws.len() && ab * n_a == acts.len(),
            "dot_tile_prepared {}: {} weight bytes are not {n_w} rows or {} activation bytes not {n_a} rows",
            self.ty,
            ws.len(),
            acts.len()
        );
        if let Err(e) = self.check(&ws[..wrb], &acts[..ab]) {
            panic!("{e}");
        }
        match self.tile_prep {
            Some(f) if n_a >= 4 && !prep.is_empty() => {
                assert!(
                    prep.n_a == n_a && prep.len() * self.act.type_size() == acts.len(),
                    "dot_tile_prepared {}: activations prepared for other rows",
                    self.ty
                );
                f(ws, n_w, acts, n_a, prep, sink)
            }
            _ => TILE_SCRATCH.with_borrow_mut(|buf| {
                buf.clear();
                buf.resize(n_a * n_w, 0.0);
                self.dot_tile(ws, n_w, acts, n_a, buf);
                for (r, row) in buf.chunks_exact(n_w).enumerate() {
                    sink(r, 0, row);
                }
            }),
        }
    }

    /// As [`Self::dot`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`DotError::Length`] if the rows do not match.
    pub fn try_dot(&self, w: &[u8], act: &[u8]) -> Result<f32, DotError> {
        self.check(w, act)?;
        Ok((self.f)(w, act))
    }
}

thread_local! {
    /// The tile of [`DotKernel::dot_tile_prepared`]'s fallback, reused across calls.
    static TILE_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The kernel for weight type `ty` on `isa`. A type with no SIMD version on an available
/// `isa` gets the scalar code (same bits), reported as [`Isa::Scalar`].
///
/// # Errors
/// [`DotError::NoDot`] if `ty` has no kernel; [`DotError::IsaUnavailable`] if `isa` is not
/// available here.
pub fn kernel(ty: GgmlType, isa: Isa) -> Result<DotKernel, DotError> {
    let act = vec_dot_type(ty).ok_or(DotError::NoDot(ty))?;
    if !isa.is_available() {
        return Err(DotError::IsaUnavailable(isa));
    }
    type Simd = (RowFn, Option<RowsFn>, Option<TileFn>);
    #[cfg(target_arch = "x86_64")]
    let tile_prep = match isa {
        Isa::Avx512Vnni => x86_512::tile_prep_kernel(ty),
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let tile_prep = None;
    let simd: Option<Simd> = match isa {
        Isa::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_kernel(ty).map(|f| {
            let tile = x86_tile::avx2::tile_kernel(ty).or(x86::avx2_tile_kernel(ty));
            (f, x86::avx2_rows_kernel(ty), tile)
        }),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::avx2_kernel(ty).map(|f| {
            let tile = x86_512::tile_kernel(ty)
                .or(x86_tile::small_tile_kernel(ty))
                .or(x86::avx2_tile_kernel(ty));
            (f, x86::avx2_rows_kernel(ty), tile)
        }),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => aarch64::neon_kernel(ty).map(|f| (f, None, None)),
        _ => None,
    };
    Ok(match simd {
        Some((f, rows, tile)) => DotKernel {
            ty,
            act,
            isa,
            f,
            rows,
            tile,
            tile_prep,
        },
        None => DotKernel {
            ty,
            act,
            isa: Isa::Scalar,
            f: scalar::kernel(ty).ok_or(DotError::NoDot(ty))?,
            rows: None,
            tile: None,
            tile_prep: None,
        },
    })
}

/// The fastest kernel for `ty` on this machine.
///
/// # Errors
/// [`DotError::NoDot`] if `ty` has no kernel.
pub fn best_kernel(ty: GgmlType) -> Result<DotKernel, DotError> {
    kernel(ty, Isa::best())
}

/// `dot(w, act)` with the fastest kernel (chooses the kernel on every call: prefer
/// [`best_kernel`] in loops).
///
/// # Errors
/// As [`kernel`] and [`DotKernel::try_dot`].
pub fn dot(ty: GgmlType, w: &[u8], act: &[u8]) -> Result<f32, DotError> {
    best_kernel(ty)?.try_dot(w, act)
}

/// `dot(w, act)` with the scalar reference kernel.
///
/// # Errors
/// As [`kernel`] and [`DotKernel::try_dot`].
pub fn dot_scalar(ty: GgmlType, w: &[u8], act: &[u8]) -> Result<f32, DotError> {
    kernel(ty, Isa::Scalar)?.try_dot(w, act)
}

// ---------------------------------------------------------------------------------------
// The shared floating-point tail: every kernel ends in these, so every ISA gets the same
// bits from the same integers.

/// Eight `f32` lanes: block `b` goes to lane `b % 8`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Lanes(pub(crate) [f32; 8]);

impl Lanes {
    #[inline(always)]
    pub(crate) fn add(&mut self, b: usize, v: f32) {
        self.0[b % 8] += v;
    }

    #[inline(always)]
    pub(crate) fn finish(&self) -> f32 {
        let l = &self.0;
        ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
    }
}

/// The f16 at byte `at` of `b`, widened exactly.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The f32 at byte `at` of `b`.
#[inline(always)]
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Q4_0 / Q5_0 / Q8_0 block value: `(d_w * d_x) * isum`.
#[inline(always)]
pub(crate) fn block_sym(dw: f32, dx: f32, isum: i32) -> f32 {
    (dw * dx) * isum as f32
}

/// Q4_1 / Q5_1 block value: `(d_w * d_x) * isum + (m_w * d_x) * ysum`, with `ysum` the
/// sum of the block's activation quants.
#[inline(always)]
pub(crate) fn block_min(dw: f32, dx: f32, isum: i32, mw: f32, ysum: i32) -> f32 {
    (dw * dx) * isum as f32 + (mw * dx) * ysum as f32
}

/// Q2_K / Q4_K / Q5_K super-block value: `(d_x * d_w) * sumi - (d_x * dmin_w) * summ`.
#[inline(always)]
pub(crate) fn block_k_min(dx: f32, dw: f32, dmin: f32, sumi: i32, summ: i32) -> f32 {
    (dx * dw) * sumi as f32 - (dx * dmin) * summ as f32
}

/// Q3_K / Q6_K super-block value: `(d_x * d_w) * sumi`.
#[inline(always)]
pub(crate) fn block_k(dx: f32, dw: f32, sumi: i32) -> f32 {
    (dx * dw) * sumi as f32
}

/// `sum_j m_j * (bsums[2j] + bsums[2j+1])` for the eight Q4_K/Q5_K mins, from the Q8_K
/// block `a` (bsums at byte 260).
#[inline(always)]
pub(crate) fn k4_min_sum(mins: &[u8; 8], a: &[u8]) -> i32 {
    let mut s = 0i32;
    for (j, &m) in mins.iter().enumerate() {
        let b0 = i16::from_le_bytes([a[260 + 4 * j], a[261 + 4 * j]]);
        let b1 = i16::from_le_bytes([a[262 + 4 * j], a[263 + 4 * j]]);
        s += i32::from(m) * (i32::from(b0) + i32::from(b1));
    }
    s
}

/// `sum_i c_i * bsums[i]` over the 16 Q8_K bsums of block `a`.
#[inline(always)]
pub(crate) fn bsum_dot(c: &[i32; 16], a: &[u8]) -> i32 {
    let mut s = 0i32;
    for (i, &c) in c.iter().enumerate() {
        s += c * i32::from(i16::from_le_bytes([a[260 + 2 * i], a[261 + 2 * i]]));
    }
    s
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block (`scales` = its 12 bytes).
#[inline(always)]
pub(crate) fn k4_scales_mins(scales: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = crate::kquants::scale_min_k4(j, scales);
    }
    (sc, m)
}

/// The 16 signed Q3_K scales (`scale - 32`).
#[inline(always)]
pub(crate) fn q3k_scales(scales: &[u8]) -> [i32; 16] {
    crate::kquants::q3_k_scales(scales).map(|s| i32::from(s) - 32)
}
