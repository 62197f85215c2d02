//! [`Loader`]: hands out a file's tensors by name to the blocks that read them, checks
//! their shapes and types, and remembers which were taken (a file with tensors nothing
//! reads is refused: [`crate::ModelError::UnusedTensors`]).

use frink_gguf::GgufFile;

use crate::config::SizeSources;
use crate::error::{ModelError, Result};
use crate::kernels::Matrix;
use crate::model::{Experts, NormWeights};

/// Hands out tensors by name, checks their shapes and remembers which were taken.
pub(crate) struct Loader<'a> {
    pub(crate) f: &'a GgufFile,
    pub(crate) used: Vec<bool>,
    /// Every whole-tensor matrix handed out, in order (what [`crate::Model::set_repack`]
    /// may repack).
    pub(crate) matrices: Vec<Matrix>,
    /// The metadata the expected shapes come from, named when a tensor contradicts it.
    sizes: &'a SizeSources,
}

impl<'a> Loader<'a> {
    /// A loader of `f`'s tensors, none taken yet, whose expected shapes come from `sizes`.
    pub(crate) fn new(f: &'a GgufFile, sizes: &'a SizeSources) -> Loader<'a> {
        Loader {
            f,
            used: vec![false; f.tensor_infos().len()],
            matrices: Vec::new(),
            sizes,
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

    /// Tensor `i` (`name`) does not have shape `want`: the error names the metadata each
    /// contradicted dimension comes from.
    pub(crate) fn shape_err(&self, name: &str, want: &[usize], i: usize) -> ModelError {
        let shape = &self.f.tensor_infos()[i].shape;
        let why: Vec<String> = want
            .iter()
            .enumerate()
            .filter(|&(d, &w)| shape.len() != want.len() || shape[d] != w as u64)
            .map(|(_, &w)| self.sizes.explain(w))
            .collect();
        ModelError::Tensor {
            name: name.into(),
            detail: format!(
                "shape {shape:?}, expected {want:?} ({}): the metadata contradicts the tensor",
                why.join("; ")
            ),
        }
    }

    /// Tensor `name`, which the layer layout needs, is absent: the error names the keys
    /// that decided the layout.
    fn missing(&self, name: &str) -> ModelError {
        self.missing_for(name, "")
    }

    /// [`Loader::missing`], with `why` (e.g. the key that asked for the tensor) first.
    pub(crate) fn missing_for(&self, name: &str, why: &str) -> ModelError {
        let mut detail = "missing".to_string();
        if !why.is_empty() {
            detail += &format!(": {why}");
        }
        if !self.sizes.layout.is_empty() {
            detail += &format!(
                " (the layer layout follows {})",
                self.sizes.layout.join(", ")
            );
        }
        ModelError::Tensor {
            name: name.into(),
            detail,
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
        self.whole(name, i, rows, cols).map(Some)
    }

    /// Tensor `i` (`name`, its shape checked) as a whole `rows × cols` matrix of a type
    /// the kernels read, remembered among [`Loader::matrices`].
    fn whole(&mut self, name: &str, i: usize, rows: usize, cols: usize) -> Result<Matrix> {
        let t = &self.f.tensor_infos()[i];
        if !frink_quant::is_supported(t.ggml_type) || !cols.is_multiple_of(t.ggml_type.block_size())
        {
            return Err(ModelError::Tensor {
                name: name.into(),
                detail: format!("tensor type {} is not supported", t.ggml_type),
            });
        }
        let m = Matrix {
            ty: t.ggml_type,
            rows,
            cols,
            row_bytes: (t.n_bytes / rows as u64) as usize,
            tensor: i,
            offset: 0,
        };
        self.matrices.push(m);
        Ok(m)
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
            .ok_or_else(|| self.missing(name))
    }

    /// A tensor of GGUF shape `shape` used as a `rows × cols` matrix (its dimensions
    /// after the first flattened into the rows, ne0.. into the columns as `cols` says: a
    /// ViT's patch convolution `[p, p, 3, n_embd]` as `n_embd × 3·p·p`).
    pub(crate) fn matrix_shaped(
        &mut self,
        name: &str,
        shape: &[usize],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let i = self.index(name).ok_or_else(|| self.missing(name))?;
        let t = &self.f.tensor_infos()[i];
        let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if t.shape != want || shape.iter().product::<usize>() != rows * cols {
            return Err(self.shape_err(name, shape, i));
        }
        self.whole(name, i, rows, cols)
    }

    pub(crate) fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_opt(name, rows, cols)?
            .ok_or_else(|| self.missing(name))
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
        self.stacked_opt(name, len, n)?
            .ok_or_else(|| self.missing(name))
    }

    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vector_opt(name, len)?
            .ok_or_else(|| self.missing(name))
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
