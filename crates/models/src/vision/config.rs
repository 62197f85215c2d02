//! [`ClipConfig`]: the hyperparameters of a projector file (`mmproj`, llama.cpp's `clip`
//! architecture, as its converter writes them: llama.cpp `tools/mtmd/clip-impl.h` keys).

use frink_gguf::GgufFile;

use crate::error::{ModelError, Result};

/// The projectors frink implements: how a vision encoder's patch rows become the language
/// model's input rows (`clip.projector_type`, llama.cpp `clip-impl.h` `PROJECTOR_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projector {
    /// Gemma 3: average pool of `n_merge × n_merge` patches, RMSNorm (`mm.soft_emb_norm`),
    /// a linear map (`mm.input_projection`) (transformers `Gemma3MultiModalProjector`,
    /// llama.cpp `tools/mtmd/models/siglip.cpp`). The image's rows attend to each other
    /// both ways in the language model.
    Gemma3,
    /// Idefics3 and SmolVLM: pixel shuffle of `n_merge × n_merge` patches into one row of
    /// `n_merge² · n_embd` values, a linear map without bias (`mm.model.fc`) (transformers
    /// `Idefics3Connector`, llama.cpp `tools/mtmd/models/siglip.cpp`). The processor splits
    /// an image into tiles of the encoder's size plus a global view; the rows attend
    /// causally in the language model.
    Idefics3,
    /// Qwen2.5-VL: an image at its own size (sides made multiples of `patch · n_merge`),
    /// a ViT with RMSNorm, 2D RoPE, window attention in all but every `n_wa_pattern`-th
    /// layer and a SiLU-gated FFN, then `n_merge × n_merge` patches merged through an MLP
    /// (`mm.0`, GELU, `mm.2`) (transformers `Qwen2_5_VisionTransformerPretrainedModel`,
    /// llama.cpp `tools/mtmd/models/qwen2vl.cpp`). The rows attend causally and take
    /// multimodal RoPE positions in the language model.
    Qwen25vl,
}

impl Projector {
    /// The names `clip.projector_type` may hold for each supported projector.
    pub const SUPPORTED: [(&'static str, Projector); 3] = [
        ("gemma3", Projector::Gemma3),
        ("idefics3", Projector::Idefics3),
        ("qwen2.5vl_merger", Projector::Qwen25vl),
    ];

    /// Its name in `clip.projector_type` (what messages call it).
    pub fn name(self) -> &'static str {
        Self::SUPPORTED
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("?", |(n, _)| n)
    }

    /// The placeholder token each of an image's rows takes in the prompt (transformers
    /// `Gemma3Processor.image_token`, `Idefics3Processor.image_token`).
    pub fn image_token(self) -> &'static str {
        match self {
            Projector::Gemma3 => "<image_soft_token>",
            Projector::Idefics3 => "<image>",
            Projector::Qwen25vl => "<|image_pad|>",
        }
    }

    /// The language-model architectures its rows are made for (`general.architecture`:
    /// SmolVLM's and Idefics3's language models are Llama).
    pub fn language_models(self) -> &'static [&'static str] {
        match self {
            Projector::Gemma3 => &["gemma3"],
            Projector::Idefics3 => &["llama"],
            Projector::Qwen25vl => &["qwen2vl"],
        }
    }

    /// Patches merged per side when the file does not say
    /// (`clip.vision.projector.scale_factor`, Qwen's `clip.vision.spatial_merge_size`):
    /// Gemma 3 pools 4 × 4 (llama.cpp `clip.cpp`), Idefics3 shuffles 2 × 2 (transformers
    /// `Idefics3Config.scale_factor`), Qwen2.5-VL merges 2 × 2.
    fn default_merge(self) -> usize {
        match self {
            Projector::Gemma3 => 4,
            Projector::Idefics3 | Projector::Qwen25vl => 2,
        }
    }

    /// Whether images keep their own size (sides rounded to whole merged patches) rather
    /// than become encoder inputs of `clip.vision.image_size`.
    pub fn native_size(self) -> bool {
        self == Projector::Qwen25vl
    }

    /// The key saying the encoder FFN's activation, which must be true: GELU for the
    /// SigLIP towers, SiLU (gated) for Qwen2.5-VL's.
    fn activation_key(self) -> &'static str {
        match self {
            Projector::Qwen25vl => "clip.use_silu",
            _ => "clip.use_gelu",
        }
    }

    /// The projector named `name`.
    ///
    /// Errors: [`ModelError::Unsupported`] naming it and the supported ones.
    pub fn from_name(name: &str) -> Result<Projector> {
        Self::SUPPORTED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, p)| p)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::SUPPORTED.iter().map(|(n, _)| *n).collect();
                ModelError::Unsupported(format!(
                    "projector type {name:?} (clip.projector_type; supported: {})",
                    known.join(", ")
                ))
            })
    }
}

/// The vision encoder's and projector's hyperparameters, read once at load.
#[derive(Clone, Debug, PartialEq)]
pub struct ClipConfig {
    pub projector: Projector,
    /// The square input side in pixels (`clip.vision.image_size`).
    pub image_size: usize,
    /// The square patch side in pixels (`clip.vision.patch_size`).
    pub patch_size: usize,
    /// The encoder's width (`clip.vision.embedding_length`).
    pub n_embd: usize,
    /// The encoder's FFN width (`clip.vision.feed_forward_length`).
    pub n_ff: usize,
    /// Encoder layers (`clip.vision.block_count`).
    pub n_layer: usize,
    /// Attention heads (`clip.vision.attention.head_count`).
    pub n_head: usize,
    /// LayerNorm epsilon (`clip.vision.attention.layer_norm_epsilon`), also the
    /// projector's RMSNorm epsilon (transformers `Gemma3MultiModalProjector`).
    pub eps: f32,
    /// The language model's width, which the projector maps to
    /// (`clip.vision.projection_dim`).
    pub n_embd_out: usize,
    /// Per-channel mean and standard deviation of the normalisation
    /// (`clip.vision.image_mean`, `clip.vision.image_std`).
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Patches merged per side into one output row (`clip.vision.projector.scale_factor`,
    /// or the projector's default).
    pub n_merge: usize,
    /// The longest side an image is resized to before it is split into tiles
    /// (`clip.vision.preproc_image_size`, Idefics3's processor `size.longest_edge`; when
    /// absent, 4 tiles' width as SmolVLM's processors use). Unused by Gemma 3.
    pub longest_edge: usize,
    /// Qwen2.5-VL: every `n_wa_pattern`-th layer (`il + 1` a multiple) attends over the
    /// whole image, the others within windows (`clip.vision.n_wa_pattern`, required; 0
    /// for the other projectors).
    pub n_wa_pattern: usize,
    /// Qwen2.5-VL's attention window side in pixels (`clip.vision.window_size`; absent:
    /// 112, transformers' `window_size` and llama.cpp's default).
    pub window_size: usize,
    /// The fewest and most pixels a native-size image is resized to
    /// (`clip.vision.image_min_pixels`, `clip.vision.image_max_pixels`; absent: 4 merged
    /// patches, transformers' `min_pixels`, and [`MAX_NATIVE_PATCHES`] patches, llama.cpp's
    /// limit of [`MAX_NATIVE_ROWS`] rows merged 2 × 2).
    pub min_pixels: usize,
    pub max_pixels: usize,
}

impl ClipConfig {
    /// Patches per side of the input.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Rows each encoder input (an image, or one tile of it) gives the language model
    /// (for a fixed-size encoder: a native-size one's depend on the image).
    pub fn tokens_per_image(&self) -> usize {
        (self.patches_per_side() / self.n_merge).pow(2)
    }

    /// The fewest rows any image gives the language model: a fixed-size encoder's
    /// [`ClipConfig::tokens_per_image`], a native-size one's `min_pixels` in merged
    /// patches (at least 1).
    pub fn min_rows_per_image(&self) -> usize {
        match self.projector.native_size() {
            true => (self.min_pixels / self.merged_patch().pow(2)).max(1),
            false => self.tokens_per_image(),
        }
    }

    /// Pixels per side of one merged patch (a native-size image's sides are multiples).
    pub fn merged_patch(&self) -> usize {
        self.patch_size * self.n_merge
    }

    /// Reads the hyperparameters of a projector file.
    ///
    /// Errors: [`ModelError::Metadata`] naming a missing or mistyped key or a size that
    /// does not divide; [`ModelError::Unsupported`] for a file without a vision encoder,
    /// an unsupported projector type or activation.
    pub fn from_gguf(f: &GgufFile) -> Result<ClipConfig> {
        let arch = f.get("general.architecture").and_then(|v| v.as_str());
        if arch != Some("clip") {
            return Err(meta_err(
                "general.architecture",
                format!(
                    "{}: a projector file (mmproj) has architecture \"clip\"",
                    arch.map_or("missing".to_string(), |a| format!("{a:?}"))
                ),
            ));
        }
        if f.get("clip.has_vision_encoder").and_then(|v| v.as_bool()) != Some(true) {
            return Err(ModelError::Unsupported(
                "a projector file without a vision encoder (clip.has_vision_encoder)".into(),
            ));
        }
        let name = f
            .get("clip.vision.projector_type")
            .or_else(|| f.get("clip.projector_type"))
            .and_then(|v| v.as_str())
            .ok_or_else(|| meta_err("clip.projector_type", "missing".into()))?;
        let projector = Projector::from_name(name)?;
        let act = projector.activation_key();
        if f.get(act).and_then(|v| v.as_bool()) != Some(true) {
            return Err(ModelError::Unsupported(format!(
                "a {} vision encoder without {act} = true (another FFN activation)",
                projector.name()
            )));
        }
        let other = match act {
            "clip.use_silu" => "clip.use_gelu",
            _ => "clip.use_silu",
        };
        if f.get(other).and_then(|v| v.as_bool()) == Some(true) {
            return Err(ModelError::Unsupported(format!(
                "a vision encoder with both {act} and {other} set (llama.cpp refuses it too)"
            )));
        }
        let u = |key: &str| -> Result<usize> {
            f.get(key)
                .and_then(|v| v.as_u64())
                .filter(|&v| v > 0 && v <= 1 << 20)
                .map(|v| v as usize)
                .ok_or_else(|| meta_err(key, "missing, zero or not a count".into()))
        };
        let triple = |key: &str| -> Result<[f32; 3]> {
            let v = f
                .get(key)
                .and_then(|v| v.as_array())
                .and_then(|a| a.to_f32_vec())
                .ok_or_else(|| meta_err(key, "missing or not an array of numbers".into()))?;
            <[f32; 3]>::try_from(v.as_slice())
                .map_err(|_| meta_err(key, format!("{} values, expected 3", v.len())))
        };
        let eps = f
            .get("clip.vision.attention.layer_norm_epsilon")
            .and_then(|v| v.as_f32())
            .ok_or_else(|| {
                meta_err("clip.vision.attention.layer_norm_epsilon", "missing".into())
            })?;
        let merge_key = match projector {
            Projector::Qwen25vl => "clip.vision.spatial_merge_size",
            _ => "clip.vision.projector.scale_factor",
        };
        let n_merge = match f.get(merge_key) {
            Some(v) => v
                .as_u64()
                .filter(|&v| v > 0 && v <= 64)
                .ok_or_else(|| meta_err(merge_key, "not a count".into()))?
                as usize,
            None => projector.default_merge(),
        };
        let opt = |key: &str, default: usize| -> Result<usize> {
            match f.get(key) {
                Some(_) => u(key),
                None => Ok(default),
            }
        };
        let image_size = u("clip.vision.image_size")?;
        let longest_edge = match f.get("clip.vision.preproc_image_size") {
            Some(_) => u("clip.vision.preproc_image_size")?,
            None => 4 * image_size,
        };
        let c = ClipConfig {
            projector,
            image_size,
            patch_size: u("clip.vision.patch_size")?,
            n_embd: u("clip.vision.embedding_length")?,
            n_ff: u("clip.vision.feed_forward_length")?,
            n_layer: u("clip.vision.block_count")?,
            n_head: u("clip.vision.attention.head_count")?,
            eps,
            n_embd_out: u("clip.vision.projection_dim")?,
            mean: triple("clip.vision.image_mean")?,
            std: triple("clip.vision.image_std")?,
            n_merge,
            longest_edge,
            n_wa_pattern: 0,
            window_size: 0,
            min_pixels: 0,
            max_pixels: 0,
        };
        let c = match projector {
            Projector::Qwen25vl => {
                let merged = (c.patch_size * c.n_merge).pow(2);
                ClipConfig {
                    n_wa_pattern: u("clip.vision.n_wa_pattern")?,
                    window_size: opt("clip.vision.window_size", 112)?,
                    min_pixels: opt("clip.vision.image_min_pixels", 4 * merged)?,
                    max_pixels: opt(
                        "clip.vision.image_max_pixels",
                        MAX_NATIVE_PATCHES * c.patch_size.pow(2),
                    )?,
                    ..c
                }
            }
            _ => c,
        };
        c.check_bounds()?;
        if projector.native_size() {
            return c.check_native();
        }
        let side = c.patches_per_side();
        if !c.image_size.is_multiple_of(c.patch_size) || !side.is_multiple_of(c.n_merge) {
            return Err(meta_err(
                "clip.vision.image_size",
                format!(
                    "{} is not a whole number of {}-pixel patches pooled {} per side",
                    c.image_size, c.patch_size, c.n_merge
                ),
            ));
        }
        if !c.n_embd.is_multiple_of(c.n_head) {
            return Err(meta_err(
                "clip.vision.attention.head_count",
                format!("{} does not divide the width {}", c.n_head, c.n_embd),
            ));
        }
        Ok(c)
    }
}

/// The largest encoder input side frink reads (`clip.vision.image_size`): published
/// encoders use 224 to 896 (Gemma 3).
pub const MAX_IMAGE_SIZE: usize = 4096;
/// The most patches per encoder input: Gemma 3's 64 × 64, the largest published
/// (attention over them holds a 64 MiB score matrix per head).
pub const MAX_PATCHES: usize = 4096;
/// The most rows a native-size image gives the language model (merged patches), the
/// default of `clip.vision.image_max_pixels`: llama.cpp's limit for Qwen2.5-VL (transformers'
/// processor allows 16384, four times the encoder's work and memory).
pub const MAX_NATIVE_ROWS: usize = 4096;
/// The most patches a native-size image may give the encoder: [`MAX_NATIVE_ROWS`] merged
/// 2 × 2.
pub const MAX_NATIVE_PATCHES: usize = 4 * MAX_NATIVE_ROWS;

/// The most tiles per side an image is split into (`clip.vision.preproc_image_size /
/// clip.vision.image_size`): SmolVLM's processors use 4.
pub const MAX_TILES_PER_SIDE: usize = 8;

impl ClipConfig {
    /// A native-size encoder's limits: at most [`MAX_NATIVE_PATCHES`] patches, at least one
    /// merged patch, and a window of whole merged patches.
    fn check_native(self) -> Result<ClipConfig> {
        let (p, unit) = (self.patch_size, self.merged_patch());
        if self.n_merge < 2 || self.n_merge > 4 {
            return Err(meta_err(
                "clip.vision.spatial_merge_size",
                format!(
                    "{}: Qwen2.5-VL merges 2 × 2 patches (2 to 4 taken)",
                    self.n_merge
                ),
            ));
        }
        if self.max_pixels / (p * p) > MAX_NATIVE_PATCHES {
            return Err(meta_err(
                "clip.vision.image_max_pixels",
                format!(
                    "{} pixels make {} patches of {p} × {p}, more than {MAX_NATIVE_PATCHES}",
                    self.max_pixels,
                    self.max_pixels / (p * p)
                ),
            ));
        }
        if self.min_pixels > self.max_pixels || self.max_pixels < unit * unit {
            return Err(meta_err(
                "clip.vision.image_min_pixels",
                format!(
                    "{} to {} pixels: not a range holding one {unit} × {unit} merged patch",
                    self.min_pixels, self.max_pixels
                ),
            ));
        }
        if self.window_size < unit || self.window_size > MAX_IMAGE_SIZE {
            return Err(meta_err(
                "clip.vision.window_size",
                format!(
                    "{} pixels: not between one merged patch ({unit}) and {MAX_IMAGE_SIZE}",
                    self.window_size
                ),
            ));
        }
        if self.n_wa_pattern > self.n_layer {
            return Err(meta_err(
                "clip.vision.n_wa_pattern",
                format!("{} is past the {} layers", self.n_wa_pattern, self.n_layer),
            ));
        }
        if !self.n_embd.is_multiple_of(self.n_head)
            || !(self.n_embd / self.n_head).is_multiple_of(4)
        {
            return Err(meta_err(
                "clip.vision.attention.head_count",
                format!(
                    "{} heads of a width {} (2D RoPE needs heads of a multiple of 4)",
                    self.n_head, self.n_embd
                ),
            ));
        }
        Ok(self)
    }

    /// Refuses sizes and values no published projector has and that would make an image's
    /// work or memory absurd, or its rows NaN, before any image is read.
    fn check_bounds(&self) -> Result<()> {
        if self.patch_size > MAX_IMAGE_SIZE {
            return Err(meta_err(
                "clip.vision.patch_size",
                format!("{} pixels, more than {MAX_IMAGE_SIZE}", self.patch_size),
            ));
        }
        if self.projector.native_size() {
            return self.check_values();
        }
        if self.image_size > MAX_IMAGE_SIZE {
            return Err(meta_err(
                "clip.vision.image_size",
                format!("{} pixels, more than {MAX_IMAGE_SIZE}", self.image_size),
            ));
        }
        let patches = (self.image_size / self.patch_size.max(1)).pow(2);
        if patches > MAX_PATCHES {
            return Err(meta_err(
                "clip.vision.patch_size",
                format!("{patches} patches per input, more than {MAX_PATCHES}"),
            ));
        }
        let tiles = self.longest_edge.div_ceil(self.image_size);
        if self.projector == Projector::Idefics3 && tiles > MAX_TILES_PER_SIDE {
            return Err(meta_err(
                "clip.vision.preproc_image_size",
                format!("{tiles} tiles per side, more than {MAX_TILES_PER_SIDE}"),
            ));
        }
        self.check_values()
    }

    /// The epsilon, mean and standard deviation: finite, and no zero deviation.
    fn check_values(&self) -> Result<()> {
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(meta_err(
                "clip.vision.attention.layer_norm_epsilon",
                format!("{} is not a finite non-negative number", self.eps),
            ));
        }
        let finite = |v: &[f32; 3]| v.iter().all(|x| x.is_finite());
        if !finite(&self.mean) {
            return Err(meta_err("clip.vision.image_mean", "not finite".into()));
        }
        if !finite(&self.std) || self.std.contains(&0.0) {
            return Err(meta_err(
                "clip.vision.image_std",
                "zero or not finite".into(),
            ));
        }
        Ok(())
    }
}

fn meta_err(key: &str, detail: String) -> ModelError {
    ModelError::Metadata {
        key: key.into(),
        detail,
    }
}
