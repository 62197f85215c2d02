//! Loading a model: the config, every tensor the graph reads (checked for shape), and the
//! accounting that refuses a file with tensors the graph would ignore.

use std::path::Path;

use frink_gguf::GgufFile;

use crate::blocks::attention::AttentionWeights;
use crate::blocks::delta_net::DeltaNetWeights;
use crate::blocks::ffn::DenseFfn;
use crate::blocks::mamba::MambaWeights;
use crate::blocks::mamba2::Mamba2Weights;
use crate::blocks::moe::MoeFfn;
use crate::blocks::short_conv::ShortConvWeights;
use crate::blocks::{FfnWeights, MixerWeights};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kernels::Matrix;
use crate::load::Loader;
use crate::plan::{Channel, Mixer};

/// A norm's weights: the scale, and for LayerNorm an optional bias.
#[derive(Clone, Debug)]
pub struct NormWeights {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

/// Weights of one layer, named as llama.cpp names the tensors (`blk.N.<name>`): its
/// norms, token mixer and channel mixer, each present as the layer's plan says
/// ([`crate::plan::LayerPlan`]).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `attn_norm` (absent for post-norm-only architectures).
    pub attn_norm: Option<NormWeights>,
    pub mixer: MixerWeights,
    pub post_attn_norm: Option<NormWeights>,
    pub ffn_norm: Option<NormWeights>,
    pub ffn: FfnWeights,
    pub post_ffn_norm: Option<NormWeights>,
    /// Gemma 4's per-layer embedding block ([`crate::blocks::ple`]).
    pub ple: Option<crate::blocks::ple::PleLayer>,
    /// `layer_output_scale.weight`: the layer's output (the whole residual stream) is
    /// multiplied by it (Gemma 4's `layer_scalar`; read wherever the file has it, as
    /// biases are).
    pub out_scale: Option<f32>,
}

/// `n` stacked matrices of one type and shape: the routed experts of a layer.
#[derive(Clone, Copy, Debug)]
pub struct Experts {
    /// Expert 0 (the others follow, `rows · row_bytes` bytes apart).
    pub first: Matrix,
    pub n: usize,
}

impl Experts {
    /// Expert `e`'s matrix.
    pub fn expert(&self, e: usize) -> Matrix {
        assert!(e < self.n, "expert {e} of {}", self.n);
        Matrix {
            offset: self.first.offset + e * self.first.rows * self.first.row_bytes,
            ..self.first
        }
    }
}

impl LayerWeights {
    /// Every matrix the layer multiplies.
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut m = self.mixer.matrices();
        match &self.ffn {
            FfnWeights::Dense(d) => m.extend(d.matrices()),
            FfnWeights::Moe(e) => m.extend(e.matrices()),
            FfnWeights::None => {}
        }
        m
    }

    /// The attention weights, for an attention layer.
    pub fn attention_mut(&mut self) -> Option<&mut AttentionWeights> {
        match &mut self.mixer {
            MixerWeights::Attention(a) => Some(a),
            _ => None,
        }
    }
}

/// All weights of a decoder model. Matrices stay in the file (mapped); vectors (norms,
/// biases) are copied to f32 at load.
#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: Matrix,
    /// LayerNorm right after the embedding lookup (bloom's `token_embd_norm`).
    pub token_embd_norm: Option<NormWeights>,
    /// The norm after the last layer (none for BERT).
    pub output_norm: Option<NormWeights>,
    /// The LM head: `output.weight`, or `token_embd.weight` when the model ties them.
    pub output: Matrix,
    /// `rope_freqs.weight` (`n_rot / 2` values): per-pair RoPE frequency divisors of every
    /// layer (Llama 3.1's "llama3" rope scaling, as llama.cpp's converter stores it;
    /// llama.cpp `src/models/llama.cpp` passes it to `ggml_rope_ext` as `freq_factors`).
    pub rope_freqs: Option<Vec<f32>>,
    /// Gemma 4's per-layer embedding tables ([`crate::blocks::ple`]).
    pub ple: Option<crate::blocks::ple::PleWeights>,
    /// An encoder's position and token-type rows and classifier head
    /// ([`crate::blocks::encoder`]).
    pub encoder: Option<crate::blocks::encoder::EncoderWeights>,
    pub layers: Vec<LayerWeights>,
}

/// A loaded model: the mapped file, its config and its weights.
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
    /// Expert selections counted per layer (empty for a dense model).
    pub moe_stats: MoeStats,
    /// The routed-expert cache under `--expert-budget` ([`Model::set_expert_budget`]).
    pub expert_cache: Option<crate::experts::ExpertCache>,
    /// Loaded LoRA adapters ([`Model::add_lora`]).
    pub adapters: Vec<crate::lora::LoraAdapter>,
    /// Each adapter's default user scale (what a sequence that names no adapters gets).
    pub lora_scales: Vec<f32>,
    /// The matrices the forward pass multiplies by (every whole-tensor matrix but a token
    /// embedding table that is not also the LM head): what [`Model::set_repack`] packs.
    matmul_weights: Vec<Matrix>,
    /// Repacked matrices, with the matrix each was packed from.
    packed: PackedSet,
    /// Whether products read the packed copies (`true`) or the stored rows
    /// ([`Model::set_decode_path`]).
    pub(crate) packed_active: std::sync::atomic::AtomicBool,
    /// Named intermediates to record ([`Model::set_taps`]; `None`: none).
    pub(crate) taps: Option<std::sync::Arc<crate::taps::Taps>>,
    /// An encoder's F16 and BF16 matrices widened to f32 once at load, by tensor index
    /// ([`crate::kernels::WeightData::Gemm`] reads them; widening them in every pass
    /// was half of a pass's time on nomic-embed-text-v1.5).
    widened: std::collections::HashMap<usize, Vec<f32>>,
}

/// Repacked matrices found by two indexed loads: the tensor's index, then the matrix's
/// place in the tensor (expert `e` of a stacked tensor at place `e`).
///
/// [`Model::weight`] looks a matrix up for every projection of every decode step (OLMoE:
/// about 460 lookups a token among 3,000 packed experts); a tree map walked five levels of
/// nodes per lookup, and the weights streamed between two steps leave those nodes out of
/// the cache.
#[derive(Debug, Default)]
struct PackedSet {
    /// `[tensor][place]`.
    by_tensor: Vec<Vec<Option<(Matrix, frink_quant::dot::pack::Packed)>>>,
}

impl PackedSet {
    /// What `m`'s place holds: `m` or another matrix at that place, with its packed copy.
    fn at(&self, m: &Matrix) -> Option<&(Matrix, frink_quant::dot::pack::Packed)> {
        self.by_tensor.get(m.tensor)?.get(m.place())?.as_ref()
    }

    /// The packed copy of exactly `m`, if there is one.
    fn get(&self, m: &Matrix) -> Option<&frink_quant::dot::pack::Packed> {
        self.at(m).filter(|(pm, _)| pm == m).map(|(_, p)| p)
    }

    /// Whether `m` or another matrix at its place is packed (a place holds one).
    fn is_taken(&self, m: &Matrix) -> bool {
        self.at(m).is_some()
    }

    fn insert(&mut self, m: Matrix, p: frink_quant::dot::pack::Packed) {
        let (t, i) = (m.tensor, m.place());
        if self.by_tensor.len() <= t {
            self.by_tensor.resize_with(t + 1, Vec::new);
        }
        let places = &mut self.by_tensor[t];
        if places.len() <= i {
            places.resize_with(i + 1, || None);
        }
        places[i] = Some((m, p));
    }

    fn iter(&self) -> impl Iterator<Item = &frink_quant::dot::pack::Packed> {
        self.by_tensor.iter().flatten().flatten().map(|(_, p)| p)
    }

    /// The matrices that have a packed copy.
    fn iter_matrices(&self) -> impl Iterator<Item = &Matrix> {
        self.by_tensor.iter().flatten().flatten().map(|(m, _)| m)
    }

    /// Drops every packed matrix of the tensors `drop` names.
    fn remove_tensors(&mut self, drop: &[usize]) {
        for &t in drop {
            if let Some(places) = self.by_tensor.get_mut(t) {
                places.clear();
            }
        }
    }
}

/// How often each routed expert was selected, per layer, since load (or [`MoeStats::reset`]);
/// optionally the selections themselves in evaluation order.
#[derive(Debug, Default)]
pub struct MoeStats {
    counts: Vec<Vec<std::sync::atomic::AtomicU64>>,
    trace: std::sync::Mutex<Option<SelectionTrace>>,
}

/// Recorded selections: `(layer, experts of each row of the call, row after row)`.
pub type SelectionTrace = Vec<(usize, Vec<usize>)>;

impl MoeStats {
    fn new(n_layer: usize, n_expert: usize) -> MoeStats {
        MoeStats {
            counts: (0..n_layer)
                .map(|_| (0..n_expert).map(|_| 0.into()).collect())
                .collect(),
            trace: std::sync::Mutex::new(None),
        }
    }

    /// Counts the experts of layer `il` in `selected` (each row's picks in order).
    pub fn record(&self, il: usize, selected: impl Iterator<Item = usize> + Clone) {
        if let Some(layer) = self.counts.get(il) {
            for e in selected.clone() {
                layer[e].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let mut t = self.trace.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = t.as_mut() {
            t.push((il, selected.collect()));
        }
    }

    /// Selection counts: `[layer][expert]`.
    pub fn counts(&self) -> Vec<Vec<u64>> {
        self.counts
            .iter()
            .map(|l| {
                l.iter()
                    .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
                    .collect()
            })
            .collect()
    }

    /// Zeroes the counts.
    pub fn reset(&self) {
        for c in self.counts.iter().flatten() {
            c.store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Starts (or stops, returning what was recorded) keeping every layer's selections:
    /// `(layer, experts of each row of the call, row after row)`.
    pub fn trace(&self, on: bool) -> Option<SelectionTrace> {
        let mut t = self.trace.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *t, on.then(Vec::new))
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .finish()
    }
}

/// Whether `ty` stores plain floats (what [`crate::kernels::WeightData::Gemm`] multiplies).
fn is_float(ty: frink_gguf::GgmlType) -> bool {
    use frink_gguf::GgmlType;
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Loads layer `il`'s token-mixer weights as `mixer` plans them.
fn load_mixer(
    l: &mut Loader<'_>,
    il: usize,
    c: &ModelConfig,
    mixer: &Mixer,
) -> Result<MixerWeights> {
    Ok(match mixer {
        Mixer::Attention(ap) => {
            MixerWeights::Attention(Box::new(AttentionWeights::load(l, il, c, ap)?))
        }
        Mixer::Mamba => MixerWeights::Mamba(Box::new(MambaWeights::load(l, il, c)?)),
        Mixer::Mamba2 { gated_norm } => {
            MixerWeights::Mamba2(Box::new(Mamba2Weights::load(l, il, c, *gated_norm)?))
        }
        Mixer::ShortConv => MixerWeights::ShortConv(Box::new(ShortConvWeights::load(l, il, c)?)),
        Mixer::GatedDeltaNet => {
            MixerWeights::GatedDeltaNet(Box::new(DeltaNetWeights::load(l, il, c)?))
        }
        Mixer::Parallel(a, b) => MixerWeights::Parallel(
            Box::new(load_mixer(l, il, c, a)?),
            Box::new(load_mixer(l, il, c, b)?),
        ),
    })
}

/// Bytes of packed weights made per step of [`Model::set_repack`] before the stored pages
/// they came from are released.
const PACK_PIECE: usize = 8 << 20;

impl Model {
    /// Maps `path` and loads the model.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    /// [`Model::load`], repacking the weights only if `repack` (and the machine prefers
    /// it: [`Model::set_repack`]).
    pub fn load_with(path: impl AsRef<Path>, repack: bool) -> Result<Model> {
        Self::from_gguf_with(GgufFile::open(path)?, repack)
    }

    /// [`Model::load_with`] with `overrides` applied to the metadata first
    /// ([`crate::overrides::apply`]): the model and its tokenizer read them as if the file
    /// held them, validated the same way.
    pub fn load_with_overrides(
        path: impl AsRef<Path>,
        repack: bool,
        overrides: &[crate::overrides::MetaOverride],
    ) -> Result<Model> {
        let mut file = GgufFile::open(path)?;
        crate::overrides::apply(&mut file, overrides)?;
        Self::from_gguf_with(file, repack)
    }

    /// Loads the model held by `file`.
    ///
    /// Errors: those of [`ModelConfig::from_gguf`]; [`ModelError::Tensor`] for a missing
    /// tensor, a wrong shape or an unsupported tensor type; [`ModelError::UnusedTensors`]
    /// when the file holds tensors the architecture's graph would not read (llama.cpp's
    /// loader refuses those too: "wrong number of tensors").
    pub fn from_gguf(file: GgufFile) -> Result<Model> {
        Self::from_gguf_with(file, true)
    }

    /// [`Model::from_gguf`], repacking only if `repack` and the machine prefers it.
    fn from_gguf_with(file: GgufFile, repack: bool) -> Result<Model> {
        let config = ModelConfig::from_gguf(&file)?;
        let c = &config;
        let a = c.arch;
        let mut l = Loader::new(&file, &c.sizes);
        let token_embd = l.matrix("token_embd.weight", c.n_vocab, c.n_embd)?;
        let token_embd_norm = match c.plan.embd_norm {
            true => Some(l.norm("token_embd_norm", c.n_embd)?),
            false => None,
        };
        let output_norm = match c.plan.output_norm {
            Some(name) => Some(l.norm(name, c.n_embd)?),
            None => None,
        };
        // An encoder has no LM head: `output` stays the embedding table, never multiplied.
        let output = match c.plan.encoder {
            true => token_embd,
            false => l
                .matrix_opt("output.weight", c.n_vocab, c.n_embd)?
                .unwrap_or(token_embd),
        };
        let encoder = match c.plan.encoder {
            true => Some(crate::blocks::encoder::EncoderWeights::load(
                &mut l,
                a.position == crate::arch::Position::Learned,
                a.rank_head,
                (c.n_ctx_train, c.n_token_types, c.n_embd),
            )?),
            false => None,
        };
        // Read only by the architectures whose llama.cpp graph applies it; elsewhere it
        // stays unread and the file is refused by the accounting below.
        let rope_freqs = l.vector_if(
            a.rope_freqs != crate::arch::RopeFreqs::Refused && l.has("rope_freqs.weight"),
            "rope_freqs.weight",
            c.n_rot / 2,
        )?;
        let ple_dim = c.n_embd_per_layer;
        let ple = match ple_dim {
            0 => None,
            p => Some(crate::blocks::ple::PleWeights::load(
                &mut l, c.n_vocab, c.n_embd, c.n_layer, p,
            )?),
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for (il, lp) in c.plan.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}");
            let mixer = load_mixer(&mut l, il, c, &lp.mixer)?;
            let ffn = match lp.channel {
                Channel::Moe(_) => {
                    let mc = c.moe.as_ref().expect("a MoE plan has a MoE config");
                    FfnWeights::Moe(Box::new(MoeFfn::load(&mut l, il, mc, c.n_embd)?))
                }
                Channel::Dense(kind, _) => {
                    let n_ff = c.n_ff_layers[il];
                    FfnWeights::Dense(DenseFfn::load(&mut l, &n(""), "", n_ff, c.n_embd, kind)?)
                }
                Channel::None => FfnWeights::None,
            };
            let norms = lp.norms;
            let (post_mixer, post_channel) = match norms.after_residual {
                true => ("attn_output_norm.weight", "layer_output_norm.weight"),
                false => ("post_attention_norm.weight", "post_ffw_norm.weight"),
            };
            // ModernBERT's first layer: no norm before attention (identity).
            let attn_norm = norms.pre_mixer
                && !(il == 0 && a.first_attn_norm_optional && !l.has(&n("attn_norm.weight")));
            let mut norm_if = |on: bool, weight: &str| match on {
                true => l.norm_tensor(&n(weight), c.n_embd).map(Some),
                false => Ok(None),
            };
            layers.push(LayerWeights {
                attn_norm: norm_if(attn_norm, "attn_norm.weight")?,
                mixer,
                post_attn_norm: norm_if(norms.post_mixer, post_mixer)?,
                ffn_norm: match norms.pre_channel {
                    Some(weight) => norm_if(true, weight)?,
                    None => None,
                },
                ffn,
                post_ffn_norm: norm_if(norms.post_channel, post_channel)?,
                ple: match ple_dim {
                    0 => None,
                    p => Some(crate::blocks::ple::PleLayer::load(&mut l, il, c.n_embd, p)?),
                },
                out_scale: l
                    .vector_opt(&n("layer_output_scale.weight"), 1)?
                    .map(|v| v[0]),
            });
        }
        let unused = l.unused();
        if !unused.is_empty() {
            return Err(ModelError::UnusedTensors {
                arch: a.name.into(),
                names: unused,
                layout: c.sizes.layout.clone(),
            });
        }
        // The embedding table is read by rows (and then only a few pages of it are ever
        // resident) unless it is the LM head as well.
        // So are Gemma 4's per-layer token table and an encoder's position and token-type
        // tables, always.
        let mut by_rows: Vec<Matrix> = ple.iter().map(|p| p.token_embd).collect();
        if let Some(e) = &encoder {
            by_rows.extend(e.position_embd.iter().chain(&e.token_types).copied());
        }
        let head = output == token_embd && !c.plan.encoder;
        let matmul_weights = l
            .matrices
            .iter()
            .filter(|m| **m != token_embd || head)
            .filter(|m| !by_rows.contains(m))
            .copied()
            .collect();
        let weights = Weights {
            token_embd,
            token_embd_norm,
            output_norm,
            output,
            rope_freqs,
            ple,
            encoder,
            layers,
        };
        let moe_stats = match &config.moe {
            Some(m) => MoeStats::new(config.n_layer, m.n_expert),
            None => MoeStats::default(),
        };
        let mut model = Model {
            file,
            config,
            weights,
            moe_stats,
            expert_cache: None,
            adapters: Vec::new(),
            lora_scales: Vec::new(),
            matmul_weights,
            packed: Default::default(),
            packed_active: std::sync::atomic::AtomicBool::new(true),
            taps: None,
            widened: Default::default(),
        };
        model.set_repack(repack && frink_quant::dot::pack::preferred());
        if model.config.plan.encoder {
            model.widen_float_matrices()?;
        }
        Ok(model)
    }

    /// Widens an encoder's F16/BF16 matrices (and any F32 one whose bytes are not
    /// f32-aligned) to f32 once, in parallel, for [`Model::weight`]'s
    /// [`WeightData::Gemm`](crate::kernels::WeightData::Gemm).
    ///
    /// Errors: a tensor that does not dequantize.
    fn widen_float_matrices(&mut self) -> Result<()> {
        let todo: Vec<Matrix> = self
            .matmul_weights
            .iter()
            .filter(|m| is_float(m.ty) && !self.packed.is_taken(m))
            .filter(|m| crate::kernels::f32_in_place(m.ty, self.data(m)).is_none())
            .copied()
            .collect();
        for m in todo {
            let mut v = vec![0f32; m.rows * m.cols];
            let data = self.data(&m);
            let failed = std::sync::Mutex::new(None);
            let rows_per = 64;
            crate::pool::for_each_chunk(&mut v, rows_per * m.cols, &|i, part| {
                let r0 = i * rows_per;
                for (j, row) in part.chunks_exact_mut(m.cols).enumerate() {
                    let bytes = &data[(r0 + j) * m.row_bytes..][..m.row_bytes];
                    if let Err(e) = frink_quant::dequantize(m.ty, bytes, row) {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    }
                }
            });
            if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e.into());
            }
            self.widened.insert(m.tensor, v);
        }
        Ok(())
    }

    /// Repacks (`on`) every matrix the forward pass multiplies by whose type has a packed
    /// layout ([`frink_quant::dot::pack`]: eight rows interleaved for the AVX2 kernels),
    /// routed experts included unless an expert budget keeps them in a cache
    /// ([`Model::set_expert_budget`]), or drops the packed copies (`off`). Results are
    /// bit-identical either way; the packed copies replace the mapped bytes in resident
    /// memory (their pages are released from the mapping once packed; a tied LM head's
    /// embedding rows are read back from the packed copy). [`Model::from_gguf`] repacks
    /// where the AVX2 or AVX-512 kernels are this machine's best
    /// ([`frink_quant::dot::pack::preferred`]; llama.cpp repacks its CPU weights the same
    /// way unless `--no-repack`).
    /// Records the forward pass's named intermediates into `taps` from now on (`None`:
    /// stop); read them with [`crate::taps::Taps::take`].
    pub fn set_taps(&mut self, taps: Option<std::sync::Arc<crate::taps::Taps>>) {
        self.taps = taps;
    }

    /// Records `values` (one row per entry of `pos`) as intermediate `name` of `layer`
    /// when taps are set.
    pub(crate) fn tap(
        &self,
        name: &'static str,
        layer: Option<usize>,
        pos: &[usize],
        values: &[f32],
    ) {
        if let Some(t) = &self.taps {
            t.record(name, layer, pos, values);
        }
    }

    pub fn set_repack(&mut self, on: bool) {
        use frink_quant::dot::pack::{block_bytes, pack_groups, Packed, GROUP};
        if !on {
            self.packed = PackedSet::default();
            return;
        }
        let mut todo = self.matmul_weights.clone();
        if self.expert_cache.is_none() {
            for (_, m) in self.routed_experts() {
                for set in [&m.gate_exps, &m.up_exps, &m.down_exps] {
                    todo.extend((0..set.n).map(|e| set.expert(e)));
                }
            }
        }
        for m in todo {
            // (Two matrices at one place would be a layout no loader makes: the second
            // stays as stored.)
            if self.packed.is_taken(&m) || block_bytes(m.ty).is_none() || m.rows < GROUP {
                continue;
            }
            let data = self.data(&m);
            let Ok(mut p) = Packed::empty(m.ty, data.len(), m.rows, m.cols) else {
                continue;
            };
            let t = self.file.tensor_at(m.tensor);
            let start = self.file.data_offset() as usize + t.info.offset as usize + m.offset;
            // A few megabytes of stored rows at a time, their pages released once packed,
            // so the peak resident memory is the packed copy and one piece of the stored
            // one (measured: a 191 MB LM head packed whole raised the peak by its size).
            let gb = p.group_bytes();
            let piece = (PACK_PIECE / gb).max(1);
            let per = piece.div_ceil(crate::pool::threads() * 4).max(1);
            let stored_group = GROUP * m.row_bytes;
            for (k, out) in p.data_mut().chunks_mut(piece * gb).enumerate() {
                crate::pool::for_each_chunk(out, per * gb, &|i, part| {
                    pack_groups(m.ty, data, m.rows, m.cols, k * piece + i * per, part)
                });
                let from = k * piece * stored_group;
                let to = ((k + 1) * piece * stored_group).min(data.len());
                // Releasing is advice; a failure only leaves the stored pages resident.
                let _ = self.file.release(start + from..start + to);
            }
            self.packed.insert(m, p);
        }
    }

    /// Bytes held by repacked matrices.
    pub fn repacked_bytes(&self) -> usize {
        self.packed.iter().map(|p| p.bytes()).sum()
    }

    /// Matrix `m`'s weights as the kernels read them: its packed copy when it has one,
    /// else its stored bytes.
    pub fn weight(&self, m: &Matrix) -> crate::kernels::WeightData<'_> {
        use crate::kernels::WeightData;
        let packed = self
            .packed_active
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| self.packed.get(m))
            .flatten();
        match packed {
            Some(p) => WeightData::Packed(p),
            // An encoder's float matrices: the blocked product, on f32 rows.
            None if self.config.plan.encoder && is_float(m.ty) => {
                let data = self.data(m);
                match crate::kernels::f32_in_place(m.ty, data) {
                    Some(f) => WeightData::Gemm(f),
                    None => match self.widened.get(&m.tensor) {
                        Some(f) => WeightData::Gemm(f),
                        None => WeightData::Stored(data),
                    },
                }
            }
            None => WeightData::Stored(self.data(m)),
        }
    }

    /// Releases the mapped pages of every matrix that has a packed copy (advice to the
    /// OS; they come back if read): what [`Model::set_repack`] does as it packs, again
    /// after something read the stored rows ([`Model::calibrate`]'s stored candidate).
    pub fn release_stored(&self) {
        for p in self.packed.iter_matrices() {
            let t = self.file.tensor_at(p.tensor);
            let start = self.file.data_offset() as usize + t.info.offset as usize + p.offset;
            let _ = self.file.release(start..start + p.rows * p.row_bytes);
        }
    }

    /// The routed experts' matrices of every layer: (layer, gate, up, down).
    fn routed_experts(&self) -> impl Iterator<Item = (usize, &MoeFfn)> {
        self.weights
            .layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| match &l.ffn {
                FfnWeights::Moe(m) => Some((il, &**m)),
                FfnWeights::Dense(_) | FfnWeights::None => None,
            })
    }

    /// Bytes of one routed expert of layer `il` (its gate, up and down matrices), or 0 for
    /// a dense layer.
    pub fn expert_bytes(&self, il: usize) -> usize {
        self.routed_experts()
            .find(|&(l, _)| l == il)
            .map_or(0, |(_, m)| {
                [m.gate_exps, m.up_exps, m.down_exps]
                    .iter()
                    .map(|e| e.first.rows * e.first.row_bytes)
                    .sum()
            })
    }

    /// Bytes of all routed experts of all layers.
    pub fn total_expert_bytes(&self) -> usize {
        self.routed_experts()
            .map(|(il, m)| self.expert_bytes(il) * m.gate_exps.n)
            .sum()
    }

    /// Keeps at most `budget` bytes of routed-expert weights resident
    /// ([`crate::experts::ExpertCache`]); `None` reads them from the mapping as every other
    /// weight. Results are bit-identical either way.
    ///
    /// Errors: [`ModelError::Unsupported`] for a dense model, or a budget smaller than
    /// one expert's three matrices (a step needs them together).
    pub fn set_expert_budget(&mut self, budget: Option<usize>) -> Result<()> {
        let Some(budget) = budget else {
            self.expert_cache = None;
            return Ok(());
        };
        let largest = (0..self.config.n_layer)
            .map(|il| self.expert_bytes(il))
            .max()
            .unwrap_or(0);
        if largest == 0 {
            return Err(ModelError::Unsupported(
                "an expert budget on a model without routed experts".into(),
            ));
        }
        if budget < largest {
            return Err(ModelError::Unsupported(format!(
                "an expert budget of {budget} bytes: one expert needs {largest}"
            )));
        }
        self.expert_cache = Some(crate::experts::ExpertCache::new(budget));
        // The cache reads the experts as stored: packed copies would keep them all
        // resident.
        let experts: Vec<usize> = self
            .routed_experts()
            .flat_map(|(_, m)| {
                [
                    m.gate_exps.first.tensor,
                    m.up_exps.first.tensor,
                    m.down_exps.first.tensor,
                ]
            })
            .collect();
        self.packed.remove_tensors(&experts);
        Ok(())
    }

    /// Loads the LoRA adapter at `path` ([`crate::lora::LoraAdapter::load`]) with default
    /// user scale `scale` (0: loaded but not applied unless a sequence asks for it);
    /// returns its index.
    ///
    /// Errors: those of [`crate::lora::LoraAdapter::load`].
    pub fn add_lora(&mut self, path: impl AsRef<Path>, scale: f32) -> Result<usize> {
        let adapter = crate::lora::LoraAdapter::load(path, self)?;
        self.adapters.push(adapter);
        self.lora_scales.push(scale);
        Ok(self.adapters.len() - 1)
    }

    /// The stored bytes of a matrix.
    pub fn data(&self, m: &Matrix) -> &[u8] {
        &self.file.tensor_at(m.tensor).data[m.offset..m.offset + m.rows * m.row_bytes]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use frink_gguf::GgmlType;
    use frink_quant::dot::pack::Packed;

    /// Expert `e` (8 rows of 32 Q4_0 values) of a stacked tensor `tensor`.
    fn expert(tensor: usize, e: usize) -> Matrix {
        let row_bytes = GgmlType::Q4_0.row_bytes(32).unwrap() as usize;
        Matrix {
            ty: GgmlType::Q4_0,
            rows: 8,
            cols: 32,
            row_bytes,
            tensor,
            offset: e * 8 * row_bytes,
        }
    }

    fn packed(m: &Matrix) -> Packed {
        Packed::new(m.ty, &vec![0u8; m.rows * m.row_bytes], m.rows, m.cols).unwrap()
    }

    #[test]
    fn packed_set_finds_exactly_the_matrix_it_holds() {
        let mut set = PackedSet::default();
        let (a, b) = (expert(3, 5), expert(3, 0));
        set.insert(a, packed(&a));
        assert!(set.get(&a).is_some());
        // Another expert of the tensor, another tensor, a place past the end: none.
        assert!(set.get(&b).is_none() && !set.is_taken(&b));
        assert!(set.get(&expert(2, 5)).is_none() && set.get(&expert(9, 5)).is_none());
        assert!(set.get(&expert(3, 6)).is_none());
        // A matrix of another shape at a's place (expert 5 of wider rows) finds the place
        // taken but not its own packed copy: it is read as stored.
        let same_place = Matrix {
            cols: 64,
            row_bytes: 2 * a.row_bytes,
            offset: 2 * a.offset,
            ..a
        };
        assert_eq!(same_place.place(), a.place());
        assert!(set.is_taken(&same_place) && set.get(&same_place).is_none());
        set.insert(b, packed(&b));
        assert_eq!(set.iter().count(), 2);
        set.remove_tensors(&[3]);
        assert!(set.get(&a).is_none() && set.get(&b).is_none() && set.iter().count() == 0);
    }
}
