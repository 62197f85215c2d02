//! Loading a model: the config, every tensor the graph reads (checked for shape), and the
//! accounting that refuses a file with tensors the graph would ignore.

use std::path::Path;

use frink_gguf::GgufFile;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kernels::Matrix;

/// Weights of one decoder layer, named as llama.cpp names the tensors (`blk.N.<name>`).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Per-head RMSNorm weights of Q and K (`head_dim_k` each).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// All weights of a decoder model. Matrices stay in the file (mapped); vectors (norms,
/// biases) are copied to f32 at load.
#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: Matrix,
    pub output_norm: Vec<f32>,
    /// The LM head: `output.weight`, or `token_embd.weight` when the model ties them.
    pub output: Matrix,
    pub layers: Vec<LayerWeights>,
}

/// A loaded model: the mapped file, its config and its weights.
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
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
        if t.shape != [cols as u64, rows as u64] {
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
        }))
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

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_opt(name, len)?.ok_or_else(|| missing(name))
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
        let output_norm = l.vector("output_norm.weight", c.n_embd)?;
        let output = l
            .matrix_opt("output.weight", c.n_vocab, c.n_embd)?
            .unwrap_or(token_embd);
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            layers.push(LayerWeights {
                attn_norm: l.vector(&n("attn_norm.weight"), c.n_embd)?,
                wq: l.matrix(&n("attn_q.weight"), c.q_dim(), c.n_embd)?,
                wk: l.matrix(&n("attn_k.weight"), c.k_dim(), c.n_embd)?,
                wv: l.matrix(&n("attn_v.weight"), c.v_dim(), c.n_embd)?,
                wo: l.matrix(&n("attn_output.weight"), c.n_embd, c.n_head * c.head_dim_v)?,
                bq: l.vector_if(a.qkv_bias, &n("attn_q.bias"), c.q_dim())?,
                bk: l.vector_if(a.qkv_bias, &n("attn_k.bias"), c.k_dim())?,
                bv: l.vector_if(a.qkv_bias, &n("attn_v.bias"), c.v_dim())?,
                q_norm: l.vector_if(a.qk_norm, &n("attn_q_norm.weight"), c.head_dim_k)?,
                k_norm: l.vector_if(a.qk_norm, &n("attn_k_norm.weight"), c.head_dim_k)?,
                post_attn_norm: l.vector_if(
                    a.post_norms,
                    &n("post_attention_norm.weight"),
                    c.n_embd,
                )?,
                ffn_norm: l.vector(&n("ffn_norm.weight"), c.n_embd)?,
                w_gate: l.matrix(&n("ffn_gate.weight"), c.n_ff, c.n_embd)?,
                w_up: l.matrix(&n("ffn_up.weight"), c.n_ff, c.n_embd)?,
                w_down: l.matrix(&n("ffn_down.weight"), c.n_embd, c.n_ff)?,
                post_ffn_norm: l.vector_if(a.post_norms, &n("post_ffw_norm.weight"), c.n_embd)?,
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
            output_norm,
            output,
            layers,
        };
        Ok(Model {
            file,
            config,
            weights,
        })
    }

    /// The stored bytes of a matrix.
    pub fn data(&self, m: &Matrix) -> &[u8] {
        self.file.tensor_at(m.tensor).data
    }
}
