//! Weight matrices repacked at load, eight rows interleaved, for the AVX2 group kernels
//! and the AVX-512 tile ([`preferred`]).
//!
//! On a machine whose best kernels are the AVX2 ones ([`preferred`]), a decode step is bound
//! by the instructions per weight byte, not by memory: the row-at-a-time kernels spend
//! most of their work on horizontal sums and on the per-block scale arithmetic (measured
//! on an AMD EPYC Zen 1 VM: 3-4.8 GB/s of Q4_K weights per core, against 9 GB/s of read
//! bandwidth). With eight weight rows interleaved (llama.cpp's CPU "repack" buffers do the
//! same for Q4_0 and Q4_K, ggml-cpu/repack.cpp), a 256-bit register holds four bytes of
//! each of eight rows, every product instruction is a full `maddubs` against an activation
//! dword broadcast to all lanes, each lane is one weight row (no horizontal sums), and the
//! scales of eight rows are applied with one `madd` per chunk. On an AVX-512 VNNI
//! machine the same layout serves: a decode step reads a group as one contiguous stream
//! (no per-block gathers) through the group kernels' 512-bit twins, and products of more
//! than [`PACKED_TILE_ROWS`] rows hand two groups at a time to the 512-bit tile, which
//! lays their fields side by side as 16 row lanes.
//!
//! # Layout
//! A [`Packed`] matrix is `ceil(rows / 8)` groups of eight rows (the last one padded with
//! zero rows), each group its `nb` blocks in order (`nb` = blocks per row), each block
//! `block_bytes(ty)` bytes holding that block of all eight rows. The format is frink's own
//! (never written to a file) and is chosen for the kernels:
//!
//! | type | bytes per 8-row block | fields (offset: content) |
//! |---|---|---|
//! | Q4_K | 1184 (8 × 148) | 0: `d[8]` f16; 16: `dmin[8]` f16; 32: scales `[chunk 8][row 8]` u8; 96: mins `[pair 4][row 8][2]` u8; 160: quants `[chunk 8][step 4][row 8][4 bytes]` |
//! | Q6_K | 1680 (8 × 210) | 0: low nibbles `[chunk 8][step 4][row 8][4 bytes]`; 1024: high bits `[chunk 8][half 2][row 8][4 bytes]`; 1536: scales `[chunk 8][row 8][2]` i8; 1664: `d[8]` f16 |
//!
//! Quants: in chunk `c` (32 values), step `s`, row `r`, byte `t` holds value `32c + 4s + t`
//! in its low nibble and value `32c + 16 + 4s + t` in its high nibble (Q6_K: their low four
//! bits), so one 32-byte load gives eight rows × eight values of one chunk, and the
//! matching activations are the dwords at `32c + 4s` and `32c + 16 + 4s`. Q6_K's high bits:
//! half `h` of chunk `c`, row `r`, byte `t`, bits `2s..2s+2` are the high two bits of value
//! `32c + 16h + 4s + t`. Q4_K's scales and mins are unpacked from their 6-bit form (2.8%
//! more bytes than stored, against three shifts and masks per scale per row in the kernel);
//! the mins are paired per row (`chunk 2p`, `chunk 2p + 1`) to meet the activation's
//! pair sums in one `madd`. [`Packed::row`] restores a row's stored bytes exactly (every
//! bit of the stored block is kept), which the tests check.
//!
//! # Results
//! Every result has exactly the bits of [`super::dot_scalar`] on the stored row: each
//! block's integers are the same exact sums (i16 partial sums are bounded below 2^15 by
//! the value ranges: see the kernels), the block value is the same `f32` formula, block
//! `b` of a row is added into accumulator `b % 8` in block order, and the eight
//! accumulators are combined in the same tree. Without AVX2 the same API runs the scalar
//! kernel on the restored rows.

use super::{ActPrep, DotError, Isa, TileSink};
use crate::GgmlType;

/// Weight rows interleaved in one group.
pub const GROUP: usize = 8;

/// Bytes of one packed block (eight rows), or `None` if `ty` is not packed.
pub fn block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(Q4K_BYTES),
        GgmlType::Q6_K => Some(Q6K_BYTES),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            Some(Legacy::of(ty).bytes)
        }
        _ => None,
    }
}

/// Where the fields of a packed legacy block (eight rows of one 32-value block) lie: the
/// scales `d[8]` (f16) at 0, then the mins `m[8]` (f16, Q4_1/Q5_1), the high bits
/// (Q5_0/Q5_1: `[row 8][4 bytes]`), the quants (`[step][row 8][4 bytes]`: four steps of
/// nibble bytes, or eight of Q8_0's signed bytes).
#[derive(Clone, Copy, Debug)]
pub(super) struct Legacy {
    /// Offset of the mins, if the format has them.
    pub(super) m: Option<usize>,
    /// Offset of the high bits, if the format has them.
    pub(super) qh: Option<usize>,
    /// Offset of the quants.
    pub(super) qs: usize,
    /// Bytes of the packed block.
    pub(super) bytes: usize,
    /// Byte offsets of the stored block's fields: min, high bits, quants.
    stored: (usize, usize, usize),
}

impl Legacy {
    /// The layout of legacy type `ty` (ggml-common.h `block_q4_0` .. `block_q8_0`: `d`
    /// first, then `m`, `qh`, `qs` where the format has them).
    pub(super) const fn of(ty: GgmlType) -> Legacy {
        match ty {
            GgmlType::Q4_0 => Legacy {
                m: None,
                qh: None,
                qs: 16,
                bytes: 144,
                stored: (0, 0, 2),
            },
            GgmlType::Q4_1 => Legacy {
                m: Some(16),
                qh: None,
                qs: 32,
                bytes: 160,
                stored: (2, 0, 4),
            },
            GgmlType::Q5_0 => Legacy {
                m: None,
                qh: Some(16),
                qs: 48,
                bytes: 176,
                stored: (0, 2, 6),
            },
            GgmlType::Q5_1 => Legacy {
                m: Some(16),
                qh: Some(32),
                qs: 64,
                bytes: 192,
                stored: (2, 4, 8),
            },
            // Q8_0: eight steps of 32 signed bytes.
            _ => Legacy {
                m: None,
                qh: None,
                qs: 16,
                bytes: 272,
                stored: (0, 0, 2),
            },
        }
    }
}

/// Packs stored legacy block `blk` of type `ty` as row `r` of the packed block `dst`.
/// Quants: step `s`, byte `t` is the stored nibble byte `4s + t` (values `4s + t` and
/// `16 + 4s + t`), or Q8_0's byte `4s + t`. High bits: byte `t`, bit `s` is the fifth
/// bit of value `4s + t` and bit `4 + s` that of value `16 + 4s + t`.
fn pack_legacy(ty: GgmlType, blk: &[u8], r: usize, dst: &mut [u8]) {
    let l = Legacy::of(ty);
    let (sm, sh, sq) = l.stored;
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
    if let Some(m) = l.m {
        dst[m + 2 * r..m + 2 * r + 2].copy_from_slice(&blk[sm..sm + 2]);
    }
    if let Some(h) = l.qh {
        let qh = u32::from_le_bytes([blk[sh], blk[sh + 1], blk[sh + 2], blk[sh + 3]]);
        for t in 0..4 {
            let mut b = 0u8;
            for s in 0..4 {
                b |= (((qh >> (4 * s + t)) & 1) as u8) << s;
                b |= (((qh >> (16 + 4 * s + t)) & 1) as u8) << (4 + s);
            }
            dst[h + 4 * r + t] = b;
        }
    }
    let steps = if ty == GgmlType::Q8_0 { 8 } else { 4 };
    for s in 0..steps {
        let at = l.qs + (s * GROUP + r) * 4;
        dst[at..at + 4].copy_from_slice(&blk[sq + 4 * s..sq + 4 * s + 4]);
    }
}

/// The inverse of [`pack_legacy`]: row `r` of packed block `src` as stored.
fn unpack_legacy(ty: GgmlType, src: &[u8], r: usize, out: &mut [u8]) {
    let l = Legacy::of(ty);
    let (sm, sh, sq) = l.stored;
    out[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    if let Some(m) = l.m {
        out[sm..sm + 2].copy_from_slice(&src[m + 2 * r..m + 2 * r + 2]);
    }
    if let Some(h) = l.qh {
        let mut qh = 0u32;
        for t in 0..4 {
            let b = src[h + 4 * r + t];
            for s in 0..4 {
                qh |= u32::from((b >> s) & 1) << (4 * s + t);
                qh |= u32::from((b >> (4 + s)) & 1) << (16 + 4 * s + t);
            }
        }
        out[sh..sh + 4].copy_from_slice(&qh.to_le_bytes());
    }
    let steps = if ty == GgmlType::Q8_0 { 8 } else { 4 };
    for s in 0..steps {
        let at = l.qs + (s * GROUP + r) * 4;
        out[sq + 4 * s..sq + 4 * s + 4].copy_from_slice(&src[at..at + 4]);
    }
}

/// Q4_K packed block: offsets of its fields.
pub(super) const Q4K_BYTES: usize = 1184;
pub(super) const Q4K_DMIN: usize = 16;
pub(super) const Q4K_SCALES: usize = 32;
pub(super) const Q4K_MINS: usize = 96;
pub(super) const Q4K_QS: usize = 160;

/// Q6_K packed block: offsets of its fields.
pub(super) const Q6K_BYTES: usize = 1680;
pub(super) const Q6K_QH: usize = 1024;
pub(super) const Q6K_SCALES: usize = 1536;
pub(super) const Q6K_D: usize = 1664;

/// Whether weights should be repacked on this machine: the AVX2 or the AVX-512 VNNI
/// kernels are its best ([`block_bytes`] says which types have a packed layout). On
/// AVX-512 the packed groups serve one-row decode steps through the AVX2 group kernels
/// (one contiguous stream per eight rows, no per-block gathers) and everything
/// larger through the 512-bit tile ([`Packed::dot_groups`]). Measured on an AMD Zen 5
/// VM (`tile_speed`, one thread): one row Q4_K 1536x8960 46-47 GB/s packed against 40
/// stored, Q6_K 48 against 57 (both above a core's share of the machine's bandwidth),
/// Q8_0 8960x1536 52.6 packed; eight rows Q4_K 443-469 GOP/s against 131 stored, Q4_0
/// 440 against about 200; 512 rows (prefill) Q4_K 619-624. The one predicate the loader
/// asks.
pub fn preferred() -> bool {
    matches!(Isa::best(), Isa::Avx2 | Isa::Avx512Vnni)
}

/// The cache hint of the software prefetch in the packed group kernels (the decode path:
/// up to [`PACKED_TILE_ROWS`] activation rows). Which is fastest is a property of the
/// machine, not of the arithmetic (every hint gives the same bits): on an AMD Zen 5 VM
/// `Nta` was 1.5-3.6% faster than `T0`; on an Intel Xeon VM (Sapphire Rapids class) `Nta`
/// halved the decode speed and `T1` was the fastest (measurements at the kernels'
/// `prefetch_bytes`). frink chooses it per machine by measuring
/// (`frink_models::Model::calibrate`) unless told (`--prefetch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrefetchHint {
    /// `prefetchnta`: into L1, marked for early eviction (the lines pass L2 and L3 by on
    /// many parts).
    Nta,
    /// `prefetcht0`: into every cache level.
    T0,
    /// `prefetcht1`: into L2 (and L3), not L1.
    T1,
}

impl PrefetchHint {
    /// Every hint.
    pub const ALL: [PrefetchHint; 3] = [PrefetchHint::Nta, PrefetchHint::T0, PrefetchHint::T1];

    /// Its name on the command line and in the tuning cache: `nta`, `t0`, `t1`.
    pub fn name(self) -> &'static str {
        match self {
            PrefetchHint::Nta => "nta",
            PrefetchHint::T0 => "t0",
            PrefetchHint::T1 => "t1",
        }
    }

    /// The hint named `s` ([`PrefetchHint::name`]).
    pub fn parse(s: &str) -> Option<PrefetchHint> {
        Self::ALL.into_iter().find(|h| h.name() == s)
    }
}

/// The process's prefetch hint ([`set_prefetch_hint`]), as an index into
/// [`PrefetchHint::ALL`].
static PREFETCH_HINT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the prefetch hint of every later packed product in this process
/// ([`Packed::dot_groups`]). It changes timing only, never a result.
pub fn set_prefetch_hint(h: PrefetchHint) {
    let i = PrefetchHint::ALL.iter().position(|&x| x == h).unwrap_or(0);
    PREFETCH_HINT.store(i as u8, std::sync::atomic::Ordering::Relaxed);
}

/// The process's prefetch hint (`Nta` until [`set_prefetch_hint`] says otherwise).
pub fn prefetch_hint() -> PrefetchHint {
    let i = PREFETCH_HINT.load(std::sync::atomic::Ordering::Relaxed) as usize;
    PrefetchHint::ALL
        .get(i)
        .copied()
        .unwrap_or(PrefetchHint::Nta)
}

/// Activation rows above which packed groups are multiplied by the AVX-512 tile (on such
/// a machine) rather than the group kernels: eight, every decode step (`SMALL_BATCH` in
/// frink-models). The tile is faster on a cache-resident matrix (`tile_speed packed`, one
/// thread, AMD Zen 5 VM, 8 rows, AVX2 group kernels / tile GOP/s: Q4_0 8960x1536 131 /
/// 440, Q8_0 131 / 347, Q4_K 1536x8960 289 / 443), but a decode step streams its weights
/// from memory, where a group kernel reads one contiguous run per thread and the tile two
/// groups side by side. Decode steps of several sequences (`decode_step` example,
/// Qwen2.5-1.5B-shaped files, two threads, ctx 100, the two thresholds alternating step
/// by step in one process, median ms, tile / group kernels): Q4_K_M 4 sequences 52.3 /
/// 25.0, 8 sequences 67.6 / 47.0; with the AVX2 group kernels Q4_0 2 sequences 39.7 /
/// 21.2, 4 sequences 51.2 / 32.2, Q8_0 2 sequences 57.5 / 38.6, 4 sequences 60.8 / 43.0
/// (8: Q4_0 61.9 / 60.9, Q8_0 74.6 / 81.4), and with the AVX-512 ones 8 sequences Q4_0
/// 62.9 / 49.4, Q8_0 75.7 / 55.8.
pub const PACKED_TILE_ROWS: usize = 8;

/// Zeroed bytes aligned to 64 (a cache line), so the kernels' 32-byte loads never
/// straddle lines. Allocated zeroed (the pages are mapped on first write, by whichever
/// thread packs them).
struct Aligned {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: `Aligned` owns its allocation exclusively (like a `Box<[u8]>`).
#[allow(unsafe_code)]
unsafe impl Send for Aligned {}
// SAFETY: shared access only reads.
#[allow(unsafe_code)]
unsafe impl Sync for Aligned {}

impl Aligned {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1), 64).expect("a packed matrix's size")
    }

    #[allow(unsafe_code)]
    fn zeroed(len: usize) -> Aligned {
        let layout = Self::layout(len);
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        Aligned { ptr, len }
    }

    #[allow(unsafe_code)]
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    #[allow(unsafe_code)]
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc_zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

/// A weight matrix in the packed layout (see the module documentation).
pub struct Packed {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    nb: usize,
    pb: usize,
    buf: Aligned,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

/// Checks that `data_len` bytes are `rows` whole stored rows of `cols` values of `ty`;
/// returns the bytes per packed block and per stored row.
fn geometry_of(
    ty: GgmlType,
    data_len: usize,
    rows: usize,
    cols: usize,
) -> Result<(usize, usize), DotError> {
    let pb = block_bytes(ty).ok_or(DotError::NoDot(ty))?;
    let rb = cols / ty.block_size() * ty.type_size();
    if !cols.is_multiple_of(ty.block_size()) || rows.checked_mul(rb) != Some(data_len) {
        return Err(DotError::Length {
            ty,
            w_len: data_len,
            act_len: rows.saturating_mul(cols),
        });
    }
    Ok((pb, rb))
}

/// Packs groups `g0 ..` (as many as `out` holds: `out.len()` is a whole number of
/// groups' bytes) of the `rows` stored rows `data` of `cols` values of type `ty` into
/// `out`. The pieces of one matrix may be packed on different threads.
///
/// # Panics
/// If `ty` has no packed layout, `data` is not `rows` rows of `cols` values, or `out`
/// passes the matrix's groups.
pub fn pack_groups(ty: GgmlType, data: &[u8], rows: usize, cols: usize, g0: usize, out: &mut [u8]) {
    let (pb, rb) = geometry_of(ty, data.len(), rows, cols).expect("pack_groups: geometry");
    let (nb, ts) = (cols / ty.block_size(), ty.type_size());
    let gb = nb * pb;
    assert!(
        gb > 0 && out.len().is_multiple_of(gb) && g0 + out.len() / gb <= rows.div_ceil(GROUP),
        "pack_groups: {} bytes from group {g0}",
        out.len()
    );
    for (k, group) in out.chunks_exact_mut(gb).enumerate() {
        let g = g0 + k;
        for r in 0..GROUP.min(rows - g * GROUP) {
            let row = &data[(g * GROUP + r) * rb..][..rb];
            for (b, blk) in row.chunks_exact(ts).enumerate() {
                let dst = &mut group[b * pb..][..pb];
                match ty {
                    GgmlType::Q4_K => pack_q4_k(blk, r, dst),
                    GgmlType::Q6_K => pack_q6_k(blk, r, dst),
                    _ => pack_legacy(ty, blk, r, dst),
                }
            }
        }
    }
}

impl Packed {
    /// Packs `rows` stored rows of `cols` values of type `ty` (`data`: the rows back to
    /// back, as in the file).
    ///
    /// # Errors
    /// As [`Packed::empty`].
    pub fn new(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<Packed, DotError> {
        let mut p = Packed::empty(ty, data.len(), rows, cols)?;
        pack_groups(ty, data, rows, cols, 0, p.data_mut());
        Ok(p)
    }

    /// An all-zero packed matrix for `rows` stored rows of `cols` values of type `ty`
    /// (`data_len` stored bytes), to be filled by [`pack_groups`] on [`Self::data_mut`]
    /// (in pieces of [`Self::group_bytes`]).
    ///
    /// # Errors
    /// [`DotError::NoDot`] if `ty` has no packed layout; [`DotError::Length`] if
    /// `data_len` bytes are not `rows` whole rows of `cols` values.
    pub fn empty(
        ty: GgmlType,
        data_len: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Packed, DotError> {
        let (pb, _) = geometry_of(ty, data_len, rows, cols)?;
        let nb = cols / ty.block_size();
        Ok(Packed {
            ty,
            rows,
            cols,
            nb,
            pb,
            buf: Aligned::zeroed(rows.div_ceil(GROUP) * nb * pb),
        })
    }

    /// Bytes of one group (eight rows, every block).
    pub fn group_bytes(&self) -> usize {
        self.nb * self.pb
    }

    /// The packed bytes, writable (see [`Self::empty`]).
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.buf.bytes_mut()
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Output features (weight rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (values per row).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Groups of [`GROUP`] rows (the last may hold padding rows).
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Bytes the packed matrix holds.
    pub fn bytes(&self) -> usize {
        self.buf.len
    }

    /// The packed bytes.
    pub(super) fn data(&self) -> &[u8] {
        self.buf.bytes()
    }

    /// Writes the stored bytes of row `r` (as in the file) into `out`.
    ///
    /// # Panics
    /// If `r >= rows` or `out` is not one row long.
    pub fn row(&self, r: usize, out: &mut [u8]) {
        let ts = self.ty.type_size();
        assert!(
            r < self.rows && out.len() == self.nb * ts,
            "Packed::row {r}"
        );
        let (g, k) = (r / GROUP, r % GROUP);
        let data = self.data();
        for (b, o) in out.chunks_exact_mut(ts).enumerate() {
            let src = &data[(g * self.nb + b) * self.pb..][..self.pb];
            match self.ty {
                GgmlType::Q4_K => unpack_q4_k(src, k, o),
                GgmlType::Q6_K => unpack_q6_k(src, k, o),
                _ => unpack_legacy(self.ty, src, k, o),
            }
        }
    }

    /// Panics unless groups `g0 .. g0 + n_g` are the matrix's and `acts` is `n_a`
    /// activation rows (the arguments of [`Self::dot_groups`]).
    fn check_groups(&self, g0: usize, n_g: usize, acts: &[u8], n_a: usize) {
        assert!(
            g0 + n_g <= self.groups() && acts.len() == n_a * self.act_row_bytes(),
            "Packed::dot_groups {}: groups {g0}+{n_g} of {}, {} activation bytes for {n_a} rows",
            self.ty,
            self.groups(),
            acts.len()
        );
    }

    /// The products of weight rows `8 g0 .. 8 (g0 + n_g)` (clipped to `rows`) with `n_a`
    /// activation rows (`acts`, back to back, quantized to [`super::vec_dot_type`] of the
    /// weight type): `sink(r, i, values)` receives activation row `r`'s results for weight
    /// rows `8 g0 + i ..`. Every value has the bits of [`super::dot_scalar`] on the stored
    /// row. `prep`: the rows prepared by the weight type's best kernel
    /// ([`super::DotKernel::prepare`]), or empty; products of more than
    /// [`PACKED_TILE_ROWS`] rows on an AVX-512 VNNI machine read it (or compute it when
    /// empty).
    ///
    /// # Panics
    /// If the groups pass the matrix or `acts` is not `n_a` activation rows of `cols`
    /// values.
    pub fn dot_groups(
        &self,
        g0: usize,
        n_g: usize,
        acts: &[u8],
        n_a: usize,
        prep: &ActPrep,
        sink: &mut TileSink<'_>,
    ) {
        self.dot_groups_on(Isa::best(), prefetch_hint(), g0, n_g, acts, n_a, prep, sink);
    }

    /// [`Self::dot_groups`] by the kernels of `isa`, the group kernels prefetching with
    /// `hint`: on [`Isa::Avx512Vnni`], products of more than [`PACKED_TILE_ROWS`] rows by
    /// the 512-bit tile, the rest by the 512-bit group kernels; on [`Isa::Avx2`], the AVX2
    /// group kernels; the scalar twin where `isa` is not available here or has no packed
    /// kernels. The same bits whichever runs, whatever the hint (the tests compare every
    /// available one with the twin).
    ///
    /// # Panics
    /// As [`Self::dot_groups`].
    #[allow(clippy::too_many_arguments)]
    pub fn dot_groups_on(
        &self,
        isa: Isa,
        hint: PrefetchHint,
        g0: usize,
        n_g: usize,
        acts: &[u8],
        n_a: usize,
        prep: &ActPrep,
        sink: &mut TileSink<'_>,
    ) {
        self.check_groups(g0, n_g, acts, n_a);
        if n_g == 0 || n_a == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni && n_a > PACKED_TILE_ROWS && isa.is_available() {
            if let Some(k) = super::x86_512::packed_tile_kernel(self.ty) {
                assert!(
                    prep.is_empty() || prep.len() == n_a * self.nb,
                    "Packed::dot_groups {}: activation extras of another shape",
                    self.ty
                );
                k(self, g0, n_g, acts, n_a, prep, sink);
                return;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && isa.is_available() {
            let wide = isa == Isa::Avx512Vnni;
            super::x86_pack::dot_groups(self, g0, n_g, acts, n_a, (wide, hint), sink);
            return;
        }
        let _ = (isa, prep, hint);
        self.dot_groups_scalar(g0, n_g, acts, n_a, sink);
    }

    /// [`Self::dot_groups`] by the scalar kernel on restored rows: the twin the SIMD
    /// kernels are tested against.
    ///
    /// # Panics
    /// As [`Self::dot_groups`].
    pub fn dot_groups_scalar(
        &self,
        g0: usize,
        n_g: usize,
        acts: &[u8],
        n_a: usize,
        sink: &mut TileSink<'_>,
    ) {
        self.check_groups(g0, n_g, acts, n_a);
        let ab = self.act_row_bytes();
        let k = super::kernel(self.ty, Isa::Scalar).expect("packed types have a dot kernel");
        let mut row = vec![0u8; self.nb * self.ty.type_size()];
        let first = g0 * GROUP;
        let last = ((g0 + n_g) * GROUP).min(self.rows);
        let mut vals = vec![0f32; last - first];
        for (r, a) in acts.chunks_exact(ab).enumerate() {
            for (i, v) in vals.iter_mut().enumerate() {
                self.row(first + i, &mut row);
                *v = k.dot(&row, a);
            }
            sink(r, 0, &vals);
        }
    }

    /// Bytes of one activation row (Q8_K for the K-quants, Q8_0 for the legacy formats,
    /// as [`super::vec_dot_type`] pairs them).
    pub fn act_row_bytes(&self) -> usize {
        let act = super::vec_dot_type(self.ty).expect("packed types have a dot kernel");
        self.cols / act.block_size() * act.type_size()
    }

    /// Bytes per packed block and blocks per row.
    pub(super) fn geometry(&self) -> (usize, usize) {
        (self.pb, self.nb)
    }
}

/// The 12 scale bytes of a Q4_K/Q5_K block from its eight 6-bit scales and mins: the
/// inverse of `crate::kquants::scale_min_k4`.
fn k4_scale_bytes(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
    }
    s
}

/// Packs stored Q4_K block `blk` as row `r` of the packed block `dst`.
fn pack_q4_k(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
    dst[Q4K_DMIN + 2 * r..Q4K_DMIN + 2 * r + 2].copy_from_slice(&blk[2..4]);
    let (sc, mn) = super::k4_scales_mins(&blk[4..16]);
    for c in 0..8 {
        dst[Q4K_SCALES + 8 * c + r] = sc[c];
        dst[Q4K_MINS + 16 * (c / 2) + 2 * r + c % 2] = mn[c];
    }
    let mut v = [0u8; 256];
    for j in 0..4 {
        for l in 0..32 {
            let b = blk[16 + 32 * j + l];
            v[64 * j + l] = b & 15;
            v[64 * j + 32 + l] = b >> 4;
        }
    }
    pack_nibbles(&v, r, &mut dst[Q4K_QS..Q4K_QS + 1024]);
}

/// The quants of one row into the `[chunk][step][row][4 bytes]` plane: value `32c + 4s +
/// t` in the low nibble, `32c + 16 + 4s + t` in the high one (their low four bits).
fn pack_nibbles(v: &[u8; 256], r: usize, plane: &mut [u8]) {
    for c in 0..8 {
        for s in 0..4 {
            let at = ((4 * c + s) * GROUP + r) * 4;
            for t in 0..4 {
                let e = 32 * c + 4 * s + t;
                plane[at + t] = (v[e] & 15) | ((v[e + 16] & 15) << 4);
            }
        }
    }
}

fn unpack_q4_k(src: &[u8], r: usize, out: &mut [u8]) {
    out[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    out[2..4].copy_from_slice(&src[Q4K_DMIN + 2 * r..Q4K_DMIN + 2 * r + 2]);
    let sc: [u8; 8] = std::array::from_fn(|c| src[Q4K_SCALES + 8 * c + r]);
    let mn: [u8; 8] = std::array::from_fn(|c| src[Q4K_MINS + 16 * (c / 2) + 2 * r + c % 2]);
    out[4..16].copy_from_slice(&k4_scale_bytes(&sc, &mn));
    out[16..144].fill(0);
    for c in 0..8 {
        for s in 0..4 {
            for t in 0..4 {
                let b = src[Q4K_QS + ((4 * c + s) * GROUP + r) * 4 + t];
                for (v, e) in [
                    (b & 15, 32 * c + 4 * s + t),
                    (b >> 4, 32 * c + 16 + 4 * s + t),
                ] {
                    let (cc, l) = (e / 32, e % 32);
                    out[16 + 32 * (cc / 2) + l] |= v << (4 * (cc % 2));
                }
            }
        }
    }
}

/// Packs stored Q6_K block `blk` as row `r` of the packed block `dst`.
fn pack_q6_k(blk: &[u8], r: usize, dst: &mut [u8]) {
    // The 256 unsigned 6-bit values (crate::kquants' layout: ql at 0, qh at 128).
    let mut v = [0u8; 256];
    for n in 0..2 {
        for l in 0..32 {
            let (q0, q1, h) = (blk[64 * n + l], blk[64 * n + 32 + l], blk[128 + 32 * n + l]);
            v[128 * n + l] = (q0 & 15) | ((h & 3) << 4);
            v[128 * n + 32 + l] = (q1 & 15) | (((h >> 2) & 3) << 4);
            v[128 * n + 64 + l] = (q0 >> 4) | (((h >> 4) & 3) << 4);
            v[128 * n + 96 + l] = (q1 >> 4) | ((h >> 6) << 4);
        }
    }
    pack_nibbles(&v, r, &mut dst[..Q6K_QH]);
    for c in 0..8 {
        for h in 0..2 {
            let at = Q6K_QH + ((2 * c + h) * GROUP + r) * 4;
            for t in 0..4 {
                let mut bits = 0u8;
                for s in 0..4 {
                    bits |= (v[32 * c + 16 * h + 4 * s + t] >> 4) << (2 * s);
                }
                dst[at + t] = bits;
            }
        }
        dst[Q6K_SCALES + 16 * c + 2 * r] = blk[192 + 2 * c];
        dst[Q6K_SCALES + 16 * c + 2 * r + 1] = blk[192 + 2 * c + 1];
    }
    dst[Q6K_D + 2 * r..Q6K_D + 2 * r + 2].copy_from_slice(&blk[208..210]);
}

fn unpack_q6_k(src: &[u8], r: usize, out: &mut [u8]) {
    out[..192].fill(0);
    for c in 0..8 {
        for s in 0..4 {
            for t in 0..4 {
                let b = src[((4 * c + s) * GROUP + r) * 4 + t];
                for (h, low) in [(0, b & 15), (1, b >> 4)] {
                    let bits = src[Q6K_QH + ((2 * c + h) * GROUP + r) * 4 + t];
                    let v = low | (((bits >> (2 * s)) & 3) << 4);
                    let e = 32 * c + 16 * h + 4 * s + t;
                    let (n, k, l) = (e / 128, (e % 128) / 32, e % 32);
                    out[64 * n + 32 * (k % 2) + l] |= (v & 15) << (4 * (k / 2));
                    out[128 + 32 * n + l] |= (v >> 4) << (2 * k);
                }
            }
        }
        out[192 + 2 * c] = src[Q6K_SCALES + 16 * c + 2 * r];
        out[192 + 2 * c + 1] = src[Q6K_SCALES + 16 * c + 2 * r + 1];
    }
    out[208..210].copy_from_slice(&src[Q6K_D + 2 * r..Q6K_D + 2 * r + 2]);
}
