//! Vision encoders of projector files (`mmproj`: llama.cpp's `clip` architecture, the
//! vision tower and projector its converter writes with `--mmproj`): [`VisionModel`]
//! loads one, accounting for every tensor as [`crate::Model`] does, and turns an image's
//! normalised pixels into rows of the language model's input ([`VisionModel::encode`]).
//!
//! The encoder is a ViT (SigLIP: patch embedding, learned positions, pre-norm layers of
//! LayerNorm, full attention and a GELU FFN, a final LayerNorm; llama.cpp
//! `tools/mtmd/clip.cpp` `build_vit`, transformers `SiglipVisionTransformer`; Qwen2.5-VL's
//! with RMSNorm, 2D RoPE, window attention and a gated FFN instead: [`qwen`]), then the
//! projector of [`Projector`]. Its products use the language model's matrix kernels.

mod config;
pub mod qwen;
mod vit;

pub use config::{ClipConfig, Projector, MAX_NATIVE_PATCHES, MAX_NATIVE_ROWS};
pub use vit::FRAMES_PER_PASS;

use std::path::Path;

use frink_gguf::GgufFile;

use crate::config::SizeSources;
use crate::error::{ModelError, Result};
use crate::kernels::Matrix;
use crate::load::Loader;
use crate::model::NormWeights;

/// One encoder layer's weights (llama.cpp `v.blk.N.*`).
pub(crate) struct VitLayer {
    pub(crate) ln1: NormWeights,
    pub(crate) q: Matrix,
    pub(crate) q_b: Vec<f32>,
    pub(crate) k: Matrix,
    pub(crate) k_b: Vec<f32>,
    pub(crate) v: Matrix,
    pub(crate) v_b: Vec<f32>,
    pub(crate) out: Matrix,
    pub(crate) out_b: Vec<f32>,
    pub(crate) ln2: NormWeights,
    /// The FFN's gate (Qwen2.5-VL: `down(silu(gate(x)) · up(x))`); `None`: `down(gelu(up(x)))`.
    pub(crate) gate: Option<(Matrix, Vec<f32>)>,
    pub(crate) up: Matrix,
    pub(crate) up_b: Vec<f32>,
    pub(crate) down: Matrix,
    pub(crate) down_b: Vec<f32>,
}

/// The projector's weights.
pub(crate) enum ProjectorWeights {
    /// Gemma 3: `mm.soft_emb_norm.weight` (`n_embd`, the converter already added Gemma's
    /// `1 +`) and `mm.input_projection.weight` transposed to `n_embd_out × n_embd`.
    Gemma3 { norm: Vec<f32>, proj: Vec<f32> },
    /// Idefics3: `mm.model.fc.weight`, `n_embd_out × (n_merge² · n_embd)`.
    Idefics3 { fc: Matrix },
    /// Qwen2.5-VL's merger MLP: `mm.0` (`n_merge² · n_embd` square) and `mm.2`
    /// (`n_embd_out × n_merge² · n_embd`), with biases.
    Qwen25vl {
        mm0: Matrix,
        mm0_b: Vec<f32>,
        mm2: Matrix,
        mm2_b: Vec<f32>,
    },
}

/// A loaded projector file: its config, the encoder's and projector's weights.
pub struct VisionModel {
    file: GgufFile,
    pub config: ClipConfig,
    /// `v.patch_embd.weight` as an `n_embd × (3 · p · p)` matrix (columns channel, row,
    /// column within the patch) and its bias (none for Qwen2.5-VL: empty).
    pub(crate) patch: Matrix,
    pub(crate) patch_b: Vec<f32>,
    /// Qwen2.5-VL's second temporal slice of its patch convolution
    /// (`v.patch_embd.weight.1`, which the converter splits off; a still image is both
    /// frames, so the patch row is the sum of both products, as llama.cpp computes it).
    pub(crate) patch1: Option<Matrix>,
    /// `v.position_embd.weight`: `n_patches × n_embd` (none for Qwen2.5-VL: empty).
    pub(crate) pos: Vec<f32>,
    pub(crate) layers: Vec<VitLayer>,
    /// `v.post_ln`.
    pub(crate) post_ln: NormWeights,
    pub(crate) projector: ProjectorWeights,
}

impl VisionModel {
    /// Opens and loads the projector file at `path` (memory-mapped).
    ///
    /// Errors: as [`VisionModel::from_gguf`], and the file's own.
    pub fn load(path: impl AsRef<Path>) -> Result<VisionModel> {
        VisionModel::from_gguf(GgufFile::open(path)?)
    }

    /// Loads a parsed projector file: its config ([`ClipConfig::from_gguf`]) and every
    /// tensor the encoder and projector read, with their shapes checked.
    ///
    /// Errors: those of [`ClipConfig::from_gguf`]; [`ModelError::Tensor`] for a missing or
    /// misshapen tensor or an unsupported type; [`ModelError::UnusedTensors`] for tensors
    /// the graph does not read (a feature frink would silently drop).
    pub fn from_gguf(file: GgufFile) -> Result<VisionModel> {
        let config = ClipConfig::from_gguf(&file)?;
        let c = &config;
        let sizes = SizeSources {
            sizes: vec![
                (c.n_embd, "clip.vision.embedding_length".into()),
                (c.n_ff, "clip.vision.feed_forward_length".into()),
                (c.n_embd_out, "clip.vision.projection_dim".into()),
                (
                    c.n_embd * c.n_merge.pow(2),
                    match c.projector {
                        Projector::Qwen25vl => {
                            "clip.vision.embedding_length × clip.vision.spatial_merge_size²"
                        }
                        _ => "clip.vision.embedding_length × clip.vision.projector.scale_factor²",
                    }
                    .into(),
                ),
                (c.patch_size, "clip.vision.patch_size".into()),
                (
                    c.patches_per_side().pow(2),
                    "(clip.vision.image_size / clip.vision.patch_size)²".into(),
                ),
            ],
            layout: Vec::new(),
        };
        let mut ld = Loader::new(&file, &sizes);
        let (d, p, n_patches) = (c.n_embd, c.patch_size, c.patches_per_side().pow(2));
        let patch = ld.matrix_shaped("v.patch_embd.weight", &[p, p, 3, d], d, 3 * p * p)?;
        let native = c.projector.native_size();
        let (patch_b, patch1, pos) = match native {
            false => (
                ld.vector("v.patch_embd.bias", d)?,
                None,
                ld.stacked("v.position_embd.weight", d, n_patches)?,
            ),
            true => (
                Vec::new(),
                Some(ld.matrix_shaped("v.patch_embd.weight.1", &[p, p, 3, d], d, 3 * p * p)?),
                Vec::new(),
            ),
        };
        let layers = (0..c.n_layer)
            .map(|il| load_layer(&mut ld, c, il))
            .collect::<Result<Vec<_>>>()?;
        let post_ln = ld.norm("v.post_ln", d)?;
        let projector = match c.projector {
            Projector::Gemma3 => {
                let norm = ld.vector("mm.soft_emb_norm.weight", d)?;
                // Stored as transformers' `[n_embd, n_embd_out]` parameter (GGUF ne
                // `[n_embd_out, n_embd]`), which llama.cpp transposes in the graph.
                let w = ld.stacked("mm.input_projection.weight", c.n_embd_out, d)?;
                let mut proj = vec![0f32; w.len()];
                for (ci, row) in w.chunks_exact(c.n_embd_out).enumerate() {
                    for (o, &v) in row.iter().enumerate() {
                        proj[o * d + ci] = v;
                    }
                }
                ProjectorWeights::Gemma3 { norm, proj }
            }
            Projector::Idefics3 => ProjectorWeights::Idefics3 {
                fc: ld.matrix("mm.model.fc.weight", c.n_embd_out, d * c.n_merge.pow(2))?,
            },
            Projector::Qwen25vl => {
                let wide = d * c.n_merge.pow(2);
                ProjectorWeights::Qwen25vl {
                    mm0: ld.matrix("mm.0.weight", wide, wide)?,
                    mm0_b: ld.vector("mm.0.bias", wide)?,
                    mm2: ld.matrix("mm.2.weight", c.n_embd_out, wide)?,
                    mm2_b: ld.vector("mm.2.bias", c.n_embd_out)?,
                }
            }
        };
        let unused = ld.unused();
        if !unused.is_empty() {
            return Err(ModelError::UnusedTensors {
                arch: format!("clip ({} projector)", c.projector.name()),
                names: unused,
                layout: Vec::new(),
            });
        }
        Ok(VisionModel {
            file,
            config,
            patch,
            patch_b,
            patch1,
            pos,
            layers,
            post_ln,
            projector,
        })
    }

    /// Matrix `m`'s stored bytes.
    pub(crate) fn weight(&self, m: &Matrix) -> &[u8] {
        self.file.tensor_at(m.tensor).data
    }

    /// Whether an image's rows attend to each other both ways in the language model
    /// (Gemma 3: transformers' `token_type_ids` mask, llama.cpp
    /// `mtmd_decode_use_non_causal`), rather than causally.
    pub fn bidirectional(&self) -> bool {
        matches!(self.config.projector, Projector::Gemma3)
    }
}

/// Layer `il`'s weights. An FFN whose `ffn_down` reads the encoder's width is stored with
/// up and down swapped (older converters' naming, which llama.cpp `clip.cpp` also undoes
/// by shape).
fn load_layer(ld: &mut Loader<'_>, c: &ClipConfig, il: usize) -> Result<VitLayer> {
    let (d, ff) = (c.n_embd, c.n_ff);
    let name = |t: &str| format!("v.blk.{il}.{t}");
    let square = |ld: &mut Loader<'_>, t: &str| -> Result<(Matrix, Vec<f32>)> {
        Ok((
            ld.matrix(&name(&format!("{t}.weight")), d, d)?,
            ld.vector(&name(&format!("{t}.bias")), d)?,
        ))
    };
    let ln1 = ld.norm(&name("ln1"), d)?;
    let (q, q_b) = square(ld, "attn_q")?;
    let (k, k_b) = square(ld, "attn_k")?;
    let (v, v_b) = square(ld, "attn_v")?;
    let (out, out_b) = square(ld, "attn_out")?;
    let ln2 = ld.norm(&name("ln2"), d)?;
    let swapped =
        ld.f.tensor(&name("ffn_down.weight"))
            .is_some_and(|t| t.info.shape.first() == Some(&(d as u64)) && d != ff);
    let (up_name, down_name) = match swapped {
        true => ("ffn_down", "ffn_up"),
        false => ("ffn_up", "ffn_down"),
    };
    let gate = match c.projector {
        Projector::Qwen25vl => Some((
            ld.matrix(&name("ffn_gate.weight"), ff, d)?,
            ld.vector(&name("ffn_gate.bias"), ff)?,
        )),
        _ => None,
    };
    Ok(VitLayer {
        ln1,
        q,
        q_b,
        k,
        k_b,
        v,
        v_b,
        out,
        out_b,
        ln2,
        gate,
        up: ld.matrix(&name(&format!("{up_name}.weight")), ff, d)?,
        up_b: ld.vector(&name(&format!("{up_name}.bias")), ff)?,
        down: ld.matrix(&name(&format!("{down_name}.weight")), d, ff)?,
        down_b: ld.vector(&name(&format!("{down_name}.bias")), d)?,
    })
}
