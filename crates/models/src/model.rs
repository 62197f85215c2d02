//! Loading a model: the config, every tensor the graph reads (checked for shape), and the
//! accounting that refuses a file with tensors the graph would ignore.

use std::path::Path;

use frink_gguf::GgufFile;

use crate::arch::{Ffn, NormPlacement, Position, QkNorm};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kernels::Matrix;

/// A norm's weights: the scale, and for LayerNorm an optional bias.
#[derive(Clone, Debug)]
pub struct NormWeights {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

/// The Q, K and V projections: separate matrices, or one fused `attn_qkv` whose rows are
/// Q, then K, then V (the converters reorder falcon's and bloom's interleaved layouts).
#[derive(Clone, Debug)]
pub enum QkvWeights {
    Separate {
        wq: Matrix,
        wk: Matrix,
        wv: Matrix,
    },
    Fused(Matrix),
    /// Multi-head latent attention ([`crate::config::MlaConfig`]).
    Mla(Box<MlaWeights>),
}

/// The projections of multi-head latent attention (llama.cpp names).
#[derive(Clone, Debug)]
pub struct MlaWeights {
    /// `attn_q_a` + `attn_q_a_norm` + `attn_q_b`, or a plain `attn_q` (`q_lora_rank` 0):
    /// the per-head queries (`n_head · qk_head_dim`).
    pub q_a: Option<(Matrix, Vec<f32>)>,
    pub q_b: Matrix,
    /// `attn_kv_a_mqa`: the latent (`kv_lora_rank`) and the shared RoPE key (`n_rot`).
    pub kv_a: Matrix,
    /// `attn_kv_a_norm`: RMSNorm of the latent.
    pub kv_a_norm: Vec<f32>,
    /// `attn_k_b`: per head, `kv_lora_rank` rows × the no-RoPE query width.
    pub k_b: Experts,
    /// `attn_v_b`: per head, `value_length_mla` rows × `kv_lora_rank`.
    pub v_b: Experts,
}

/// Weights of one decoder layer, named as llama.cpp names the tensors (`blk.N.<name>`).
/// Optional parts are present exactly when the file has them (and the architecture
/// allows them).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `attn_norm` (absent for post-norm-only architectures).
    pub attn_norm: Option<NormWeights>,
    pub qkv: QkvWeights,
    /// Biases of separate projections, or of the fused one (`bqkv`).
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bqkv: Option<Vec<f32>>,
    pub wo: Matrix,
    pub bo: Option<Vec<f32>>,
    /// `attn_sinks`: one learned logit per query head that joins each softmax (gpt-oss).
    pub attn_sinks: Option<Vec<f32>>,
    /// RMSNorm weights of Q and K (`head_dim_k` each, or the whole projection width).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<NormWeights>,
    pub ffn_norm: Option<NormWeights>,
    pub ffn: FfnWeights,
    pub post_ffn_norm: Option<NormWeights>,
}

/// A dense feed-forward block (`ffn_gate`, `ffn_up`, `ffn_down` and their biases), or a
/// shared expert (`*_shexp`).
#[derive(Clone, Debug)]
pub struct DenseFfn {
    /// `ffn_gate` (absent for plain and fused-gate FFNs).
    pub gate: Option<Matrix>,
    /// `ffn_up`: `n_ff` rows, or `2 · n_ff` (gate then up) for a fused gate.
    pub up: Matrix,
    pub down: Matrix,
    pub b_gate: Option<Vec<f32>>,
    pub b_up: Option<Vec<f32>>,
    pub b_down: Option<Vec<f32>>,
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

/// A mixture-of-experts block: the router (`ffn_gate_inp`), the routed experts
/// (`ffn_{gate,up,down}_exps`) and an optional shared expert (`ffn_*_shexp`, scaled by
/// `sigmoid(ffn_gate_inp_shexp · x)` where that vector exists).
#[derive(Clone, Debug)]
pub struct MoeFfn {
    pub router: Matrix,
    pub gate_exps: Experts,
    pub up_exps: Experts,
    pub down_exps: Experts,
    pub shared: Option<DenseFfn>,
    /// `ffn_gate_inp_shexp`: one row (`n_embd` columns).
    pub shared_gate: Option<Matrix>,
    /// `exp_probs_b.bias`: added to the expert scores for selection only (deepseek v3's
    /// `e_score_correction_bias`).
    pub selection_bias: Option<Vec<f32>>,
    /// `ffn_gate_inp.bias`: added to the router logits (gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    /// Per-expert biases `ffn_{gate,up,down}_exps.bias`, expert after expert (gpt-oss).
    pub gate_exps_bias: Option<Vec<f32>>,
    pub up_exps_bias: Option<Vec<f32>>,
    pub down_exps_bias: Option<Vec<f32>>,
}

/// A layer's feed-forward block.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer; the dense case is the common one
pub enum FfnWeights {
    Dense(DenseFfn),
    Moe(Box<MoeFfn>),
}

impl LayerWeights {
    /// Every matrix the layer multiplies.
    pub fn matrices<'a>(&'a self) -> Vec<&'a Matrix> {
        let mut m = match &self.qkv {
            QkvWeights::Separate { wq, wk, wv } => vec![wq, wk, wv],
            QkvWeights::Fused(w) => vec![w],
            QkvWeights::Mla(a) => {
                let mut v: Vec<&Matrix> = a.q_a.iter().map(|(m, _)| m).collect();
                v.extend([&a.q_b, &a.kv_a, &a.k_b.first, &a.v_b.first]);
                v
            }
        };
        m.push(&self.wo);
        let dense = |m: &mut Vec<&'a Matrix>, d: &'a DenseFfn| {
            m.extend(d.gate.as_ref());
            m.extend([&d.up, &d.down]);
        };
        match &self.ffn {
            FfnWeights::Dense(d) => dense(&mut m, d),
            FfnWeights::Moe(e) => {
                m.extend([
                    &e.router,
                    &e.gate_exps.first,
                    &e.up_exps.first,
                    &e.down_exps.first,
                ]);
                if let Some(d) = &e.shared {
                    dense(&mut m, d);
                }
                m.extend(e.shared_gate.as_ref());
            }
        }
        m
    }
}

/// All weights of a decoder model. Matrices stay in the file (mapped); vectors (norms,
/// biases) are copied to f32 at load.
#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: Matrix,
    /// LayerNorm right after the embedding lookup (bloom's `token_embd_norm`).
    pub token_embd_norm: Option<NormWeights>,
    pub output_norm: NormWeights,
    /// The LM head: `output.weight`, or `token_embd.weight` when the model ties them.
    pub output: Matrix,
    /// `rope_freqs.weight` (`n_rot / 2` values): per-pair RoPE frequency divisors of every
    /// layer (Llama 3.1's "llama3" rope scaling, as llama.cpp's converter stores it;
    /// llama.cpp `src/models/llama.cpp` passes it to `ggml_rope_ext` as `freq_factors`).
    pub rope_freqs: Option<Vec<f32>>,
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

/// Hands out tensors by name, checks their shapes and remembers which were taken.
struct Loader<'a> {
    f: &'a GgufFile,
    used: Vec<bool>,
}

impl Loader<'_> {
    fn index(&mut self, name: &str) -> Option<usize> {
        let i = self.f.tensor_index(name)?;
        self.used[i] = true;
        Some(i)
    }

    fn shape_err(&self, name: &str, want: &[usize], i: usize) -> ModelError {
        ModelError::Tensor {
            name: name.into(),
            detail: format!(
                "shape {:?}, expected {want:?}",
                self.f.tensor_infos()[i].shape
            ),
        }
    }

    /// A `rows × cols` matrix (GGUF shape `[cols, rows]`), if present.
    fn matrix_opt(&mut self, name: &str, rows: usize, cols: usize) -> Result<Option<Matrix>> {
        let Some(i) = self.index(name) else {
            return Ok(None);
        };
        let t = &self.f.tensor_infos()[i];
        // A one-row matrix may be stored as a vector (qwen2moe's ffn_gate_inp_shexp is
        // [n_embd, 1] from the converter, [n_embd] after llama-quantize).
        let vector_ok = rows == 1 && t.shape == [cols as u64];
        if t.shape != [cols as u64, rows as u64] && !vector_ok {
            return Err(self.shape_err(name, &[cols, rows], i));
        }
        if !frink_quant::is_supported(t.ggml_type) {
            return Err(ModelError::Tensor {
                name: name.into(),
                detail: format!("tensor type {} is not supported", t.ggml_type),
            });
        }
        Ok(Some(Matrix {
            ty: t.ggml_type,
            rows,
            cols,
            row_bytes: (t.n_bytes / rows as u64) as usize,
            tensor: i,
            offset: 0,
        }))
    }

    /// `n` stacked `rows × cols` matrices (GGUF shape `[cols, rows, n]`: llama.cpp's
    /// `ffn_{gate,up,down}_exps`), if present: expert `e` is bytes
    /// `e · rows · row_bytes ..` of the tensor.
    fn experts_opt(
        &mut self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Experts>> {
        let Some(i) = self.index(name) else {
            return Ok(None);
        };
        let t = &self.f.tensor_infos()[i];
        if t.shape != [cols as u64, rows as u64, n as u64] {
            return Err(self.shape_err(name, &[cols, rows, n], i));
        }
        if !frink_quant::is_supported(t.ggml_type) {
            return Err(ModelError::Tensor {
                name: name.into(),
                detail: format!("tensor type {} is not supported", t.ggml_type),
            });
        }
        Ok(Some(Experts {
            first: Matrix {
                ty: t.ggml_type,
                rows,
                cols,
                row_bytes: (t.n_bytes / (rows * n) as u64) as usize,
                tensor: i,
                offset: 0,
            },
            n,
        }))
    }

    fn experts(&mut self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Experts> {
        self.experts_opt(name, n, rows, cols)?
            .ok_or_else(|| missing(name))
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_opt(name, rows, cols)?
            .ok_or_else(|| missing(name))
    }

    /// A vector of `len` values, dequantized to f32, if present.
    fn vector_opt(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        let Some(i) = self.index(name) else {
            return Ok(None);
        };
        let t = self.f.tensor_at(i);
        if t.info.shape != [len as u64] {
            return Err(self.shape_err(name, &[len], i));
        }
        Ok(Some(frink_quant::dequantize_tensor(&t)?))
    }

    /// `n` stacked vectors of `len` values (GGUF shape `[len, n]`), dequantized, if present.
    fn stacked_opt(&mut self, name: &str, len: usize, n: usize) -> Result<Option<Vec<f32>>> {
        let Some(i) = self.index(name) else {
            return Ok(None);
        };
        let t = self.f.tensor_at(i);
        if t.info.shape != [len as u64, n as u64] {
            return Err(self.shape_err(name, &[len, n], i));
        }
        Ok(Some(frink_quant::dequantize_tensor(&t)?))
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_opt(name, len)?.ok_or_else(|| missing(name))
    }

    /// A norm `{name}.weight` (+ `{name}.bias` if present), if present.
    fn norm_opt(&mut self, name: &str, len: usize) -> Result<Option<NormWeights>> {
        let Some(weight) = self.vector_opt(&format!("{name}.weight"), len)? else {
            return Ok(None);
        };
        let bias = self.vector_opt(&format!("{name}.bias"), len)?;
        Ok(Some(NormWeights { weight, bias }))
    }

    fn norm(&mut self, name: &str, len: usize) -> Result<NormWeights> {
        self.norm_opt(name, len)?
            .ok_or_else(|| missing(&format!("{name}.weight")))
    }

    /// A dense FFN `{prefix}ffn_{gate,up,down}{suffix}.weight` (+ biases if present) of
    /// width `n_ff` and the given kind.
    fn dense_ffn(
        &mut self,
        prefix: &str,
        suffix: &str,
        n_ff: usize,
        n_embd: usize,
        kind: Ffn,
    ) -> Result<DenseFfn> {
        let name = |t: &str, what: &str| format!("{prefix}ffn_{t}{suffix}.{what}");
        let up_rows = match kind {
            Ffn::GatedFused => 2 * n_ff,
            _ => n_ff,
        };
        Ok(DenseFfn {
            gate: if kind == Ffn::Gated {
                Some(self.matrix(&name("gate", "weight"), n_ff, n_embd)?)
            } else {
                None
            },
            up: self.matrix(&name("up", "weight"), up_rows, n_embd)?,
            down: self.matrix(&name("down", "weight"), n_embd, n_ff)?,
            b_gate: self.vector_opt(&name("gate", "bias"), n_ff)?,
            b_up: self.vector_opt(&name("up", "bias"), up_rows)?,
            b_down: self.vector_opt(&name("down", "bias"), n_embd)?,
        })
    }

    /// A vector read only when the architecture `needed`s it; when it does not, the tensor
    /// is left untouched, so a file that has it fails the unused-tensor accounting.
    fn vector_if(&mut self, needed: bool, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if needed {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn missing(name: &str) -> ModelError {
    ModelError::Tensor {
        name: name.into(),
        detail: "missing".into(),
    }
}

impl Model {
    /// Maps `path` and loads the model.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::from_gguf(GgufFile::open(path)?)
    }

    /// Loads the model held by `file`.
    ///
    /// Errors: those of [`ModelConfig::from_gguf`]; [`ModelError::Tensor`] for a missing
    /// tensor, a wrong shape or an unsupported tensor type; [`ModelError::UnusedTensors`]
    /// when the file holds tensors the architecture's graph would not read (llama.cpp's
    /// loader refuses those too: "wrong number of tensors").
    pub fn from_gguf(file: GgufFile) -> Result<Model> {
        let config = ModelConfig::from_gguf(&file)?;
        let c = &config;
        let a = c.arch;
        let mut l = Loader {
            f: &file,
            used: vec![false; file.tensor_infos().len()],
        };
        let token_embd = l.matrix("token_embd.weight", c.n_vocab, c.n_embd)?;
        let token_embd_norm = match a.position {
            Position::Alibi => Some(l.norm("token_embd_norm", c.n_embd)?),
            Position::Rope(_) => None,
        };
        let output_norm = l.norm("output_norm", c.n_embd)?;
        let output = l
            .matrix_opt("output.weight", c.n_vocab, c.n_embd)?
            .unwrap_or(token_embd);
        // Read only by the architectures whose llama.cpp graph applies it; elsewhere it
        // stays unread and the file is refused by the accounting below.
        let rope_freqs = l.vector_if(
            a.rope_freqs && l.f.tensor_index("rope_freqs.weight").is_some(),
            "rope_freqs.weight",
            c.n_rot / 2,
        )?;
        let pre = a.norm_placement == NormPlacement::Pre;
        let (q_norm_len, k_norm_len) = match a.qk_norm {
            QkNorm::Whole => (c.q_dim(), c.k_dim()),
            _ => (c.head_dim_k, c.head_dim_k),
        };
        let qk_norm = a.qk_norm != QkNorm::None;
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let qkv_rows = c.q_dim() + c.k_dim() + c.v_dim();
            let (qkv, bqkv) = if let Some(mla) = &c.mla {
                let rank = mla.kv_lora_rank;
                let nope = mla.qk_head_dim - c.n_rot;
                let q_full = c.n_head * mla.qk_head_dim;
                let q_a = if mla.q_lora_rank > 0 {
                    Some((
                        l.matrix(&n("attn_q_a.weight"), mla.q_lora_rank, c.n_embd)?,
                        l.vector(&n("attn_q_a_norm.weight"), mla.q_lora_rank)?,
                    ))
                } else {
                    None
                };
                let q_b = match &q_a {
                    Some(_) => l.matrix(&n("attn_q_b.weight"), q_full, mla.q_lora_rank)?,
                    None => l.matrix(&n("attn_q.weight"), q_full, c.n_embd)?,
                };
                let w = MlaWeights {
                    q_a,
                    q_b,
                    kv_a: l.matrix(&n("attn_kv_a_mqa.weight"), rank + c.n_rot, c.n_embd)?,
                    kv_a_norm: l.vector(&n("attn_kv_a_norm.weight"), rank)?,
                    k_b: l.experts(&n("attn_k_b.weight"), c.n_head, rank, nope)?,
                    v_b: l.experts(&n("attn_v_b.weight"), c.n_head, mla.v_head_dim, rank)?,
                };
                (QkvWeights::Mla(Box::new(w)), None)
            } else {
                match l.matrix_opt(&n("attn_qkv.weight"), qkv_rows, c.n_embd)? {
                    Some(w) => (
                        QkvWeights::Fused(w),
                        l.vector_opt(&n("attn_qkv.bias"), qkv_rows)?,
                    ),
                    None => (
                        QkvWeights::Separate {
                            wq: l.matrix(&n("attn_q.weight"), c.q_dim(), c.n_embd)?,
                            wk: l.matrix(&n("attn_k.weight"), c.k_dim(), c.n_embd)?,
                            wv: l.matrix(&n("attn_v.weight"), c.v_dim(), c.n_embd)?,
                        },
                        None,
                    ),
                }
            };
            let separate = matches!(qkv, QkvWeights::Separate { .. });
            let bias = |l: &mut Loader<'_>, name: &str, len: usize| {
                if separate {
                    l.vector_opt(&n(name), len)
                } else {
                    Ok(None)
                }
            };
            let (bq, bk, bv) = (
                bias(&mut l, "attn_q.bias", c.q_dim())?,
                bias(&mut l, "attn_k.bias", c.k_dim())?,
                bias(&mut l, "attn_v.bias", c.v_dim())?,
            );
            let ffn = match &c.moe {
                Some(moe) if il >= moe.n_leading_dense => {
                    let (e, ff) = (moe.n_expert, moe.n_ff_exp);
                    let shared = match l.f.tensor_index(&n("ffn_up_shexp.weight")) {
                        None => None,
                        Some(i) => {
                            // The shared expert's width from its tensor (ne1 of ffn_up_shexp).
                            let ff_sh =
                                l.f.tensor_infos()[i].shape.get(1).copied().unwrap_or(0) as usize;
                            Some(l.dense_ffn(&n(""), "_shexp", ff_sh, c.n_embd, Ffn::Gated)?)
                        }
                    };
                    FfnWeights::Moe(Box::new(MoeFfn {
                        router: l.matrix(&n("ffn_gate_inp.weight"), e, c.n_embd)?,
                        gate_exps: l.experts(&n("ffn_gate_exps.weight"), e, ff, c.n_embd)?,
                        up_exps: l.experts(&n("ffn_up_exps.weight"), e, ff, c.n_embd)?,
                        down_exps: l.experts(&n("ffn_down_exps.weight"), e, c.n_embd, ff)?,
                        shared_gate: if shared.is_some() {
                            l.matrix_opt(&n("ffn_gate_inp_shexp.weight"), 1, c.n_embd)?
                        } else {
                            None
                        },
                        selection_bias: l.vector_opt(&n("exp_probs_b.bias"), e)?,
                        router_bias: l.vector_opt(&n("ffn_gate_inp.bias"), e)?,
                        gate_exps_bias: l.stacked_opt(&n("ffn_gate_exps.bias"), ff, e)?,
                        up_exps_bias: l.stacked_opt(&n("ffn_up_exps.bias"), ff, e)?,
                        down_exps_bias: l.stacked_opt(&n("ffn_down_exps.bias"), c.n_embd, e)?,
                        shared,
                    }))
                }
                _ => FfnWeights::Dense(l.dense_ffn(&n(""), "", c.n_ff, c.n_embd, a.ffn)?),
            };
            layers.push(LayerWeights {
                attn_norm: if pre {
                    Some(l.norm(&n("attn_norm"), c.n_embd)?)
                } else {
                    None
                },
                qkv,
                bq,
                bk,
                bv,
                bqkv,
                wo: l.matrix(&n("attn_output.weight"), c.n_embd, c.attn_out_dim())?,
                bo: l.vector_opt(&n("attn_output.bias"), c.n_embd)?,
                attn_sinks: l.vector_opt(&n("attn_sinks.weight"), c.n_head)?,
                q_norm: l.vector_if(qk_norm, &n("attn_q_norm.weight"), q_norm_len)?,
                k_norm: l.vector_if(qk_norm, &n("attn_k_norm.weight"), k_norm_len)?,
                post_attn_norm: if a.ffn_norm_name == "post_attention_norm" {
                    None
                } else if pre {
                    l.norm_opt(&n("post_attention_norm"), c.n_embd)?
                } else {
                    Some(l.norm(&n("post_attention_norm"), c.n_embd)?)
                },
                ffn_norm: if pre && !a.parallel_residual {
                    Some(l.norm(&n(a.ffn_norm_name), c.n_embd)?)
                } else {
                    None
                },
                ffn,
                post_ffn_norm: if pre {
                    l.norm_opt(&n("post_ffw_norm"), c.n_embd)?
                } else {
                    Some(l.norm(&n("post_ffw_norm"), c.n_embd)?)
                },
            });
        }
        let unused: Vec<String> = file
            .tensor_infos()
            .iter()
            .zip(&l.used)
            .filter(|(_, &u)| !u)
            .map(|(t, _)| t.name.clone())
            .collect();
        if !unused.is_empty() {
            return Err(ModelError::UnusedTensors {
                arch: a.name.into(),
                names: unused,
            });
        }
        let weights = Weights {
            token_embd,
            token_embd_norm,
            output_norm,
            output,
            rope_freqs,
            layers,
        };
        let moe_stats = match &config.moe {
            Some(m) => MoeStats::new(config.n_layer, m.n_expert),
            None => MoeStats::default(),
        };
        Ok(Model {
            file,
            config,
            weights,
            moe_stats,
            expert_cache: None,
        })
    }

    /// The routed experts' matrices of every layer: (layer, gate, up, down).
    fn routed_experts(&self) -> impl Iterator<Item = (usize, &MoeFfn)> {
        self.weights
            .layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| match &l.ffn {
                FfnWeights::Moe(m) => Some((il, &**m)),
                FfnWeights::Dense(_) => None,
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
        Ok(())
    }

    /// The stored bytes of a matrix.
    pub fn data(&self, m: &Matrix) -> &[u8] {
        &self.file.tensor_at(m.tensor).data[m.offset..m.offset + m.rows * m.row_bytes]
    }
}
