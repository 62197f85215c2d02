//! The ViT forward pass and the projector ([`VisionModel::encode`]).

use super::{ProjectorWeights, VisionModel, VitLayer};
use crate::error::{ModelError, Result};
use crate::kernels::{add_bias, dot, gelu_tanh, layer_norm, matmul, rms_norm, softmax};
use crate::model::NormWeights;
use crate::pool::for_each_chunk;

impl VisionModel {
    /// The language model's input rows for one image: `pixels` are its normalised values,
    /// channel-first `[3][image_size][image_size]` (what the family's processor gives);
    /// the result is `tokens_per_image × n_embd_out`, row-major, in the order the image's
    /// placeholder tokens take them (row by row of the pooled grid).
    ///
    /// Errors: [`ModelError::Unsupported`] for pixels of another size; the kernels' own.
    pub fn encode(&self, pixels: &[f32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let s = c.image_size;
        if pixels.len() != 3 * s * s {
            return Err(ModelError::Unsupported(format!(
                "{} pixel values for a {s}×{s} RGB encoder input (expected {})",
                pixels.len(),
                3 * s * s
            )));
        }
        let x = self.vit(pixels)?;
        self.project(&x)
    }

    /// The encoder: patch rows, positions, the layers, the final norm (`n_patches ×
    /// n_embd`).
    fn vit(&self, pixels: &[f32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (s, p, side, d) = (c.image_size, c.patch_size, c.patches_per_side(), c.n_embd);
        let n = side * side;
        // Each patch's pixels in the convolution's column order: channel, row, column.
        let mut patches = vec![0f32; n * 3 * p * p];
        for (i, col) in patches.chunks_exact_mut(3 * p * p).enumerate() {
            let (py, px) = (i / side, i % side);
            for ch in 0..3 {
                for y in 0..p {
                    let src = ch * s * s + (py * p + y) * s + px * p;
                    col[(ch * p + y) * p..][..p].copy_from_slice(&pixels[src..src + p]);
                }
            }
        }
        let mut x = vec![0f32; n * d];
        matmul(&self.patch, self.weight(&self.patch), &patches, n, &mut x)?;
        add_bias(&mut x, &self.patch_b);
        x.iter_mut().zip(&self.pos).for_each(|(v, q)| *v += q);
        for layer in &self.layers {
            self.vit_layer(layer, &mut x, n)?;
        }
        norm(&mut x, &self.post_ln, c.eps);
        Ok(x)
    }

    /// One pre-norm layer on the residual stream `x` (`n × n_embd`).
    fn vit_layer(&self, l: &VitLayer, x: &mut [f32], n: usize) -> Result<()> {
        let (d, ff, eps) = (self.config.n_embd, self.config.n_ff, self.config.eps);
        let mut cur = x.to_vec();
        norm(&mut cur, &l.ln1, eps);
        let proj = |w, b: &[f32], input: &[f32], out: &mut [f32]| -> Result<()> {
            matmul(w, self.weight(w), input, n, out)?;
            add_bias(out, b);
            Ok(())
        };
        let (mut q, mut k, mut v) = (vec![0f32; n * d], vec![0f32; n * d], vec![0f32; n * d]);
        proj(&l.q, &l.q_b, &cur, &mut q)?;
        proj(&l.k, &l.k_b, &cur, &mut k)?;
        proj(&l.v, &l.v_b, &cur, &mut v)?;
        let attn = full_attention(&q, &k, &v, n, self.config.n_head, d);
        proj(&l.out, &l.out_b, &attn, &mut cur)?;
        x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);
        cur.copy_from_slice(x);
        norm(&mut cur, &l.ln2, eps);
        let mut up = vec![0f32; n * ff];
        proj(&l.up, &l.up_b, &cur, &mut up)?;
        up.iter_mut().for_each(|u| *u = gelu_tanh(*u));
        proj(&l.down, &l.down_b, &up, &mut cur)?;
        x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// The projector on the encoder's rows `x` (`n_patches × n_embd`).
    fn project(&self, x: &[f32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (side, d, m) = (c.patches_per_side(), c.n_embd, c.n_merge);
        match &self.projector {
            ProjectorWeights::Gemma3 { norm, proj } => {
                // Average pool of m × m patches (stride m), row by row of the pooled grid.
                let out_side = side / m;
                let mut pooled = vec![0f32; out_side * out_side * d];
                for (t, row) in pooled.chunks_exact_mut(d).enumerate() {
                    let (ty, tx) = (t / out_side, t % out_side);
                    for y in ty * m..(ty + 1) * m {
                        for xx in tx * m..(tx + 1) * m {
                            let src = &x[(y * side + xx) * d..][..d];
                            row.iter_mut().zip(src).for_each(|(a, b)| *a += b);
                        }
                    }
                    let inv = 1.0 / (m * m) as f32;
                    row.iter_mut().for_each(|a| *a *= inv);
                }
                rms_norm(&mut pooled, norm, c.eps);
                Ok(linear(&pooled, proj, d, c.n_embd_out))
            }
            ProjectorWeights::Idefics3 { fc } => {
                let shuffled = pixel_shuffle(x, side, d, m);
                let n = shuffled.len() / (d * m * m);
                let mut out = vec![0f32; n * c.n_embd_out];
                matmul(fc, self.weight(fc), &shuffled, n, &mut out)?;
                Ok(out)
            }
        }
    }
}

/// Idefics3's pixel shuffle (transformers `Idefics3Connector.pixel_shuffle`): the
/// `side × side` grid of `d`-wide rows `x` becomes a `(side/m) × (side/m)` grid whose row
/// `(Y, X)` holds the `m × m` patches it covers, row offset outer, column offset inner:
/// values `[(i·m + j)·d ..][..d]` are patch `(Y·m + i, X·m + j)`.
pub(crate) fn pixel_shuffle(x: &[f32], side: usize, d: usize, m: usize) -> Vec<f32> {
    let out_side = side / m;
    let mut out = vec![0f32; x.len()];
    for (t, row) in out.chunks_exact_mut(m * m * d).enumerate() {
        let (ty, tx) = (t / out_side, t % out_side);
        for i in 0..m {
            for j in 0..m {
                let src = ((ty * m + i) * side + tx * m + j) * d;
                row[(i * m + j) * d..][..d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    out
}

/// LayerNorm with its bias.
fn norm(x: &mut [f32], w: &NormWeights, eps: f32) {
    layer_norm(x, &w.weight, eps);
    if let Some(b) = &w.bias {
        add_bias(x, b);
    }
}

/// `x · Wᵀ` for an f32 matrix `w` of `rows × cols` (`x`: `n × cols`), rows in parallel.
fn linear(x: &[f32], w: &[f32], cols: usize, rows: usize) -> Vec<f32> {
    let n = x.len() / cols;
    let mut out = vec![0f32; n * rows];
    for_each_chunk(&mut out, rows, &|i, o| {
        let xi = &x[i * cols..][..cols];
        for (j, v) in o.iter_mut().enumerate() {
            *v = dot(xi, &w[j * cols..][..cols]);
        }
    });
    out
}

/// Full (non-causal) multi-head attention of `n` rows: `q`, `k`, `v` are `n × d` with
/// `n_head` heads of `d / n_head`; softmax(q·kᵀ / √head_dim) · v, one task per (query
/// row, head).
fn full_attention(q: &[f32], k: &[f32], v: &[f32], n: usize, n_head: usize, d: usize) -> Vec<f32> {
    let hd = d / n_head;
    let scale = 1.0 / (hd as f32).sqrt();
    // Keys and values head by head, contiguous per head.
    let by_head = |m: &[f32]| -> Vec<f32> {
        let mut t = vec![0f32; n * d];
        for h in 0..n_head {
            for j in 0..n {
                t[(h * n + j) * hd..][..hd].copy_from_slice(&m[j * d + h * hd..][..hd]);
            }
        }
        t
    };
    let (kh, vh) = (by_head(k), by_head(v));
    let mut out = vec![0f32; n * d];
    // Output piece `c` is head `c % n_head` of row `c / n_head`.
    for_each_chunk(&mut out, hd, &|c, o| {
        let (i, h) = (c / n_head, c % n_head);
        let qi = &q[i * d + h * hd..][..hd];
        let mut scores: Vec<f32> = (0..n)
            .map(|j| dot(qi, &kh[(h * n + j) * hd..][..hd]) * scale)
            .collect();
        softmax(&mut scores);
        o.fill(0.0);
        for (j, &pj) in scores.iter().enumerate() {
            let vj = &vh[(h * n + j) * hd..][..hd];
            o.iter_mut().zip(vj).for_each(|(a, b)| *a += pj * b);
        }
    });
    out
}
