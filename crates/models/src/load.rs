//! [`Loader`]: hands out a file's tensors by name to the blocks that read them, checks
//! their shapes and types, and remembers which were taken (a file with tensors nothing
//! reads is refused: [`crate::ModelError::UnusedTensors`]).

use frink_gguf::GgufFile;

use crate::error::{ModelError, Result};
use crate::kernels::Matrix;
use crate::model::{Experts, NormWeights};

/// Hands out tensors by name, checks their shapes and remembers which were taken.
pub(crate) struct Loader<'a> {
    pub(crate) f: &'a GgufFile,
    pub(crate) used: Vec<bool>,
}

impl<'a> Loader<'a> {
    /// A loader of `f`'s tensors, none taken yet.
    pub(crate) fn new(f: &'a GgufFile) -> Loader<'a> {
        Loader {
            f,
            used: vec![false; f.tensor_infos().len()],
        }
    }

    /// Whether the file has tensor `name` (taking nothing).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.f.tensor_index(name).is_some()
    }

    /// The names of the tensors nobody took.
    pub(crate) fn unused(&self) -> Vec<String> {
        self.f
            .tensor_infos()
            .iter()
            .zip(&self.used)
            .filter(|(_, &u)| !u)
            .map(|(t, _)| t.name.clone())
            .collect()
    }

    pub(crate) fn index(&mut self, name: &str) -> Option<usize> {
        let i = self.f.tensor_index(name)?;
        self.used[i] = true;
        Some(i)
    }

    pub(crate) fn shape_err(&self, name: &str, want: &[usize], i: usize) -> ModelError {
        ModelError::Tensor {
            name: name.into(),
            detail: format!(
                "shape {:?}, expected {want:?}",
                self.f.tensor_infos()[i].shape
            ),
        }
    }

    /// A `rows × cols` matrix (GGUF shape `[cols, rows]`), if present.
    pub(crate) fn matrix_opt(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Matrix>> {
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
    pub(crate) fn experts_opt(
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

    pub(crate) fn experts(
        &mut self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Experts> {
        self.experts_opt(name, n, rows, cols)?
            .ok_or_else(|| missing(name))
    }

    pub(crate) fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_opt(name, rows, cols)?
            .ok_or_else(|| missing(name))
    }

    /// A vector of `len` values, dequantized to f32, if present.
    pub(crate) fn vector_opt(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
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
    pub(crate) fn stacked_opt(
        &mut self,
        name: &str,
        len: usize,
        n: usize,
    ) -> Result<Option<Vec<f32>>> {
        let Some(i) = self.index(name) else {
            return Ok(None);
        };
        let t = self.f.tensor_at(i);
        if t.info.shape != [len as u64, n as u64] {
            return Err(self.shape_err(name, &[len, n], i));
        }
        Ok(Some(frink_quant::dequantize_tensor(&t)?))
    }

    /// `n` stacked vectors of `len` values (GGUF shape `[len, n]`), dequantized.
    pub(crate) fn stacked(&mut self, name: &str, len: usize, n: usize) -> Result<Vec<f32>> {
        self.stacked_opt(name, len, n)?.ok_or_else(|| missing(name))
    }

    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_opt(name, len)?.ok_or_else(|| missing(name))
    }

    /// A norm whose weight tensor is `weight` (`….weight`, its bias `….bias` if present;
    /// a bare name, as falcon-h1's `ffn_norm`, has no bias).
    pub(crate) fn norm_tensor(&mut self, weight: &str, len: usize) -> Result<NormWeights> {
        let w = self.vector(weight, len)?;
        let bias = match weight.strip_suffix(".weight") {
            Some(stem) => self.vector_opt(&format!("{stem}.bias"), len)?,
            None => None,
        };
        Ok(NormWeights { weight: w, bias })
    }

    /// The norm `{name}.weight` (+ `{name}.bias` if present).
    pub(crate) fn norm(&mut self, name: &str, len: usize) -> Result<NormWeights> {
        self.norm_tensor(&format!("{name}.weight"), len)
    }

    /// A vector read only when the architecture `needed`s it; when it does not, the tensor
    /// is left untouched, so a file that has it fails the unused-tensor accounting.
    pub(crate) fn vector_if(
        &mut self,
        needed: bool,
        name: &str,
        len: usize,
    ) -> Result<Option<Vec<f32>>> {
        if needed {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

pub(crate) fn missing(name: &str) -> ModelError {
    ModelError::Tensor {
        name: name.into(),
        detail: "missing".into(),
    }
}
