//! Per-layer embeddings (PLE), Gemma 4's second input path (llama.cpp
//! `src/models/gemma4.cpp`: `build_inp_per_layer`, `project_per_layer_inputs` and the
//! per-layer block after each layer's FFN; transformers `Gemma4TextModel.get_per_layer_inputs`,
//! `project_per_layer_inputs` and `Gemma4TextDecoderLayer.forward`).
//!
//! Once per forward call, for every row, each layer `il` gets an input of `ple` values:
//! `(rmsnorm(P · x / sqrt(n_embd))[il] + T[token][il] · sqrt(ple)) / sqrt(2)`, where `x` is
//! the row's scaled token embedding, `P` is `per_layer_model_proj` (`n_layer · ple` rows)
//! normed per layer with `per_layer_proj_norm`, and `T` is `per_layer_token_embd`
//! (`n_vocab` rows of `n_layer · ple` values, layer-major), read one row per token from
//! the mapping (never dequantized whole: Gemma 4 E2B's table is 262144 × 35 · 256).
//! After layer `il`'s FFN residual: `x += post_norm(proj(gelu(inp_gate · x) ⊙ input[il]))`.

use crate::error::Result;
use crate::kernels::{gelu_tanh, matmul, matrix_row, rms_norm, Matrix};
use crate::load::Loader;
use crate::model::{Model, NormWeights};

/// The model-level PLE weights.
#[derive(Clone, Debug)]
pub struct PleWeights {
    /// `per_layer_token_embd`: `n_vocab` rows of `n_layer · ple`.
    pub token_embd: Matrix,
    /// `per_layer_model_proj`: `n_layer · ple` rows of `n_embd`.
    pub model_proj: Matrix,
    /// `per_layer_proj_norm`: `ple` values.
    pub proj_norm: Vec<f32>,
}

/// One layer's PLE weights.
#[derive(Clone, Debug)]
pub struct PleLayer {
    /// `inp_gate`: `ple` rows of `n_embd`.
    pub inp_gate: Matrix,
    /// `proj`: `n_embd` rows of `ple`.
    pub proj: Matrix,
    /// `post_norm`.
    pub post_norm: NormWeights,
}

impl PleWeights {
    /// Loads the model-level tensors for `n_layer` layers of width `ple`.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        n_vocab: usize,
        n_embd: usize,
        n_layer: usize,
        ple: usize,
    ) -> Result<PleWeights> {
        Ok(PleWeights {
            token_embd: l.matrix("per_layer_token_embd.weight", n_vocab, n_layer * ple)?,
            model_proj: l.matrix("per_layer_model_proj.weight", n_layer * ple, n_embd)?,
            proj_norm: l.vector("per_layer_proj_norm.weight", ple)?,
        })
    }
}

impl PleLayer {
    /// Loads layer `il`'s gate, projection and norm.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        il: usize,
        n_embd: usize,
        ple: usize,
    ) -> Result<PleLayer> {
        let n = |s: &str| format!("blk.{il}.{s}");
        Ok(PleLayer {
            inp_gate: l.matrix(&n("inp_gate.weight"), ple, n_embd)?,
            proj: l.matrix(&n("proj.weight"), n_embd, ple)?,
            post_norm: l.norm_tensor(&n("post_norm.weight"), n_embd)?,
        })
    }
}

/// `a · n^(-1/2)` as transformers computes its scale constants (a Python float, then f32).
fn inv_sqrt(n: usize) -> f32 {
    (n as f64).powf(-0.5) as f32
}

impl Model {
    /// Every row's per-layer inputs: `n × n_layer × ple` values (row-major, layer-major
    /// within a row) from the rows' `tokens` and scaled embeddings `x` (`n × n_embd`).
    ///
    /// Errors: a weight type without dequantization.
    pub(crate) fn ple_inputs(&self, p: &PleWeights, tokens: &[u32], x: &[f32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (n, ple) = (tokens.len(), c.n_embd_per_layer);
        let width = c.n_layer * ple;
        let mut proj = vec![0f32; n * width];
        matmul(&p.model_proj, self.weight(&p.model_proj), x, n, &mut proj)?;
        let proj_scale = inv_sqrt(c.n_embd);
        proj.iter_mut().for_each(|v| *v *= proj_scale);
        rms_norm(&mut proj, &p.proj_norm, c.norm_eps);
        let (tok_scale, sum_scale) = (((ple as f64).sqrt()) as f32, inv_sqrt(2));
        let mut tok = vec![0f32; width];
        for (row, &t) in proj.chunks_exact_mut(width).zip(tokens) {
            matrix_row(
                &p.token_embd,
                self.weight(&p.token_embd),
                t as usize,
                &mut tok,
            )?;
            for (v, e) in row.iter_mut().zip(&tok) {
                *v = (*v + e * tok_scale) * sum_scale;
            }
        }
        Ok(proj)
    }

    /// Layer `il`'s PLE block on the residual stream `x` (`n × n_embd`) in place, with
    /// the rows' per-layer inputs `inputs` ([`Model::ple_inputs`]).
    ///
    /// Errors: a weight type without dequantization.
    pub(crate) fn ple_layer(
        &self,
        il: usize,
        p: &PleLayer,
        inputs: &[f32],
        x: &mut [f32],
        n: usize,
    ) -> Result<()> {
        let c = &self.config;
        let ple = c.n_embd_per_layer;
        let width = c.n_layer * ple;
        let mut g = vec![0f32; n * ple];
        matmul(&p.inp_gate, self.weight(&p.inp_gate), x, n, &mut g)?;
        for (r, gr) in g.chunks_exact_mut(ple).enumerate() {
            let input = &inputs[r * width + il * ple..][..ple];
            for (v, i) in gr.iter_mut().zip(input) {
                *v = gelu_tanh(*v) * i;
            }
        }
        let mut y = vec![0f32; n * c.n_embd];
        matmul(&p.proj, self.weight(&p.proj), &g, n, &mut y)?;
        // The model's norm, with the bias where the file has one.
        self.norm(&mut y, &p.post_norm);
        x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        Ok(())
    }
}
