//! The KV cache's element types: one for the keys and one for the values (llama.cpp's
//! `type_k` / `type_v`, `-ctk` / `-ctv`).

use frink_gguf::GgmlType;

/// Element type of one of the KV cache's two tensors (llama.cpp's `--cache-type-k` /
/// `--cache-type-v` values, src/llama-context.cpp `kv_cache_types`).
///
/// Floats are stored as such; the quantized types as ggml's 32-value blocks, written by
/// [`frink_quant::quantize::quantize_for_cache`] (ggml's reference rounding refined by
/// least squares for the 4- and 5-bit types; Q8_0 bit-exact with ggml's) and read in
/// place by the attention kernels: each element is exactly its block's dequantized value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
#[allow(non_camel_case_types)] // ggml's type names
pub enum CacheType {
    /// IEEE half precision, llama.cpp's default.
    #[default]
    F16,
    /// Single precision (what the tiny fixtures' references used).
    F32,
    /// bfloat16 (the upper half of an f32, rounded to nearest even).
    BF16,
    /// ggml Q8_0: an f16 scale and 32 int8 (34 bytes per 32 values).
    Q8_0,
    /// ggml Q4_0: an f16 scale and 32 4-bit quants (18 bytes).
    Q4_0,
    /// ggml Q4_1: scale, minimum and 32 4-bit quants (20 bytes).
    Q4_1,
    /// ggml Q5_0: scale and 32 5-bit quants (22 bytes).
    Q5_0,
    /// ggml Q5_1: scale, minimum and 32 5-bit quants (24 bytes).
    Q5_1,
    /// ggml IQ4_NL: a scale and 32 indices into 16 non-linear levels (18 bytes).
    IQ4_NL,
}

/// The largest magnitude of a key or value an f32 or bf16 cache may be restored with
/// ([`CacheType::finite`]): 2^32, far past any activation (llama.cpp's default f16 cache
/// holds at most 65504) and far below where a score overflows.
pub const MAX_CACHED: f32 = 4_294_967_296.0;

/// Values per block of every quantized [`CacheType`] (ggml's `QK8_0` … `QK4_NL`).
pub const CACHE_BLOCK: usize = 32;

impl CacheType {
    /// Every type, in the order `--help` lists them.
    pub const ALL: [CacheType; 9] = [
        CacheType::F32,
        CacheType::F16,
        CacheType::BF16,
        CacheType::Q8_0,
        CacheType::Q4_0,
        CacheType::Q4_1,
        CacheType::Q5_0,
        CacheType::Q5_1,
        CacheType::IQ4_NL,
    ];

    /// The ggml type of its storage.
    pub fn ggml(self) -> GgmlType {
        match self {
            CacheType::F16 => GgmlType::F16,
            CacheType::F32 => GgmlType::F32,
            CacheType::BF16 => GgmlType::BF16,
            CacheType::Q8_0 => GgmlType::Q8_0,
            CacheType::Q4_0 => GgmlType::Q4_0,
            CacheType::Q4_1 => GgmlType::Q4_1,
            CacheType::Q5_0 => GgmlType::Q5_0,
            CacheType::Q5_1 => GgmlType::Q5_1,
            CacheType::IQ4_NL => GgmlType::IQ4_NL,
        }
    }

    /// Its name as `--cache-type-k` spells it (llama.cpp's, lower case).
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F16 => "f16",
            CacheType::F32 => "f32",
            CacheType::BF16 => "bf16",
            CacheType::Q8_0 => "q8_0",
            CacheType::Q4_0 => "q4_0",
            CacheType::Q4_1 => "q4_1",
            CacheType::Q5_0 => "q5_0",
            CacheType::Q5_1 => "q5_1",
            CacheType::IQ4_NL => "iq4_nl",
        }
    }

    /// Whether elements are stored in quantized blocks (ggml's `ggml_is_quantized`: not
    /// f32, f16 or bf16).
    pub fn is_quantized(self) -> bool {
        self.ggml().is_quantized()
    }

    /// Bytes of one quantized block ([`CACHE_BLOCK`] values), or of one element of a float
    /// type.
    pub fn unit_bytes(self) -> usize {
        self.ggml().type_size()
    }

    /// Bytes `n` elements take (`n` a multiple of [`CACHE_BLOCK`] for a quantized type),
    /// or `None` on overflow.
    pub fn bytes(self, n: usize) -> Option<usize> {
        match self.is_quantized() {
            true => (n / CACHE_BLOCK).checked_mul(self.unit_bytes()),
            false => n.checked_mul(self.unit_bytes()),
        }
    }

    /// Whether every value stored in `bytes` (whole elements or blocks of this type) is
    /// finite and of a size a model makes: each f16 element finite, each f32 or bf16 one
    /// at most [`MAX_CACHED`] in magnitude; each block's f16 scale finite, and its minimum
    /// for Q4_1 and Q5_1 (the quants are bounded by construction). A saved state passes
    /// here before its blocks are reused: one huge key or value turns every later score
    /// that reads it into infinity and the logits into NaN.
    pub fn finite(self, bytes: &[u8]) -> bool {
        let f16_ok = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00;
        let small = |v: f32| v.abs() <= MAX_CACHED;
        match self {
            CacheType::F32 => bytes
                .chunks_exact(4)
                .all(|b| small(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            CacheType::F16 => bytes.chunks_exact(2).all(f16_ok),
            CacheType::BF16 => bytes.chunks_exact(2).all(|b| {
                small(f32::from_bits(
                    u32::from(u16::from_le_bytes([b[0], b[1]])) << 16,
                ))
            }),
            CacheType::Q4_1 | CacheType::Q5_1 => bytes
                .chunks_exact(self.unit_bytes())
                .all(|b| f16_ok(&b[..2]) && f16_ok(&b[2..4])),
            _ => bytes.chunks_exact(self.unit_bytes()).all(f16_ok),
        }
    }

    /// Whether a head of `hd` elements is a whole number of blocks (always, for a float
    /// type).
    pub fn fits_head(self, hd: usize) -> bool {
        !self.is_quantized() || hd.is_multiple_of(CACHE_BLOCK)
    }
}

impl std::fmt::Display for CacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CacheType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CacheType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = CacheType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown KV cache type {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// The KV cache's element types: keys and values (`--cache-type-k` / `--cache-type-v`;
/// `--kv-type` sets both).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct KvType {
    /// The keys' type (llama.cpp `type_k`).
    pub k: CacheType,
    /// The values' type (llama.cpp `type_v`).
    pub v: CacheType,
}

impl KvType {
    /// f16 keys and values, llama.cpp's default.
    pub const F16: KvType = KvType::both(CacheType::F16);
    /// f32 keys and values.
    pub const F32: KvType = KvType::both(CacheType::F32);
    /// Q8_0 keys and values.
    pub const Q8_0: KvType = KvType::both(CacheType::Q8_0);

    /// `t` for both keys and values.
    pub const fn both(t: CacheType) -> KvType {
        KvType { k: t, v: t }
    }

    /// Its name: the type's when keys and values share it (`q8_0`), else
    /// `k=q4_0,v=f16`. Saved states and disk blocks record it.
    pub fn name(self) -> String {
        match self.k == self.v {
            true => self.k.name().to_string(),
            false => format!("k={},v={}", self.k, self.v),
        }
    }

    /// Whether either tensor is stored quantized.
    pub fn is_quantized(self) -> bool {
        self.k.is_quantized() || self.v.is_quantized()
    }

    /// Bytes one position of `k_dim` keys and `v_dim` values takes, or `None` on overflow.
    pub fn row_bytes(self, k_dim: usize, v_dim: usize) -> Option<usize> {
        self.k.bytes(k_dim)?.checked_add(self.v.bytes(v_dim)?)
    }

    /// The Walsh–Hadamard block that rotates queries and keys of head size `hd_k` before
    /// a quantized key cache stores the keys, as llama.cpp does since PR #21038
    /// (src/llama-kv-cache.cpp `attn_rot_k`, `build_input_k_rot`): for a quantized key
    /// type and `hd_k` a multiple of 64, the largest power of two from 64 up that divides
    /// it; else none. The rotation spreads a head's outlier channels over its blocks
    /// (Qwen2's key biases: the Q8_0 cache's perplexity cost on qwen2.5-coder-0.5b falls
    /// from 7.8% to 3.6%) and leaves every score unchanged in exact arithmetic.
    pub fn key_rotation(self, hd_k: usize) -> Option<usize> {
        if !self.k.is_quantized() || hd_k == 0 || !hd_k.is_multiple_of(64) {
            return None;
        }
        Some(1 << hd_k.trailing_zeros())
    }

    /// The block that rotates values of head size `hd_v` before a quantized value cache
    /// stores them, and rotates the attention output back: 64 where `hd_v` is a multiple
    /// of 64 (llama.cpp `attn_rot_v`, `build_input_v_rot`: the smallest block measured
    /// best).
    pub fn value_rotation(self, hd_v: usize) -> Option<usize> {
        (self.v.is_quantized() && hd_v > 0 && hd_v.is_multiple_of(64)).then_some(64)
    }

    /// Whether a cache of these types can hold the keys and values of every attention
    /// layer of `config` (a quantized type: every head a whole number of 32-value blocks,
    /// as llama.cpp requires; layers may differ in head sizes: Gemma 4).
    ///
    /// Errors: a message naming the type, keys or values, and the sizes.
    pub fn check_heads(self, config: &crate::ModelConfig) -> Result<(), String> {
        for a in config
            .plan
            .layers
            .iter()
            .filter_map(|l| l.mixer.attention())
        {
            let (hd_k, hd_v) = (a.geometry.head_dim_k, a.geometry.head_dim_v);
            for (t, hd, what) in [(self.k, hd_k, "key"), (self.v, hd_v, "value")] {
                if !t.fits_head(hd) {
                    return Err(format!(
                        "KV cache type {t} for the {what}s needs heads that are multiples of \
                         {CACHE_BLOCK} values (this model's {what} heads are {hd}); f32, f16 \
                         and bf16 fit any head"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    /// One type for both (`q8_0`), or the form [`KvType::name`] writes (`k=q4_0,v=f16`).
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some((k, v)) = s.strip_prefix("k=").and_then(|r| r.split_once(",v=")) {
            return Ok(KvType {
                k: k.parse()?,
                v: v.parse()?,
            });
        }
        s.parse().map(KvType::both).map_err(|e: String| {
            format!("{e}, or k=TYPE,v=TYPE for keys and values of different types")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_are_ggmls() {
        for k in CacheType::ALL {
            assert_eq!(k.name().parse::<CacheType>(), Ok(k));
            for v in CacheType::ALL {
                let t = KvType { k, v };
                assert_eq!(t.name().parse::<KvType>(), Ok(t), "{}", t.name());
            }
            let g = k.ggml();
            assert_eq!(k.bytes(64), Some(64 / g.block_size() * g.type_size()));
            assert_eq!(k.is_quantized(), g.block_size() > 1);
        }
        assert_eq!(KvType::Q8_0.name(), "q8_0");
        assert!("q4_k".parse::<CacheType>().unwrap_err().contains("iq4_nl"));
    }

    /// Saved values are refused when not finite or beyond [`MAX_CACHED`] (a forged state's
    /// 3.4e38 keys made every later logit NaN), accepted otherwise.
    #[test]
    fn saved_values_must_be_finite_and_of_a_model_size() {
        let f32s = |v: f32| v.to_le_bytes().to_vec();
        assert!(CacheType::F32.finite(&f32s(1e3)));
        assert!(!CacheType::F32.finite(&f32s(3e38)));
        assert!(!CacheType::F32.finite(&f32s(f32::NAN)));
        assert!(CacheType::BF16.finite(&0x4000u16.to_le_bytes()));
        assert!(!CacheType::BF16.finite(&0x7f7fu16.to_le_bytes()));
        assert!(CacheType::F16.finite(&0x7bffu16.to_le_bytes()));
        assert!(!CacheType::F16.finite(&0x7c00u16.to_le_bytes()));
        let mut block = [0u8; 20];
        assert!(CacheType::Q4_1.finite(&block));
        block[2..4].copy_from_slice(&0x7c00u16.to_le_bytes());
        assert!(!CacheType::Q4_1.finite(&block));
        assert!(CacheType::Q4_0.finite(&block[..18]), "Q4_0 has no minimum");
    }
}
