//! The ViT forward pass and the projector ([`VisionModel::encode`]).

use super::{ProjectorWeights, VisionModel, VitLayer};
use crate::error::{ModelError, Result};
use crate::kernels::gemm::gemm_nt;
use crate::kernels::{add_bias, gelu_tanh, layer_norm, rms_norm, silu, softmax, Matrix};
use crate::model::NormWeights;
use crate::pool::for_each_chunk;

impl VisionModel {
    /// The language model's input rows for one encoder input: `pixels` are its
    /// normalised values, channel-first `[3][image_size][image_size]` (what the family's
    /// processor gives); the result is `tokens_per_image × n_embd_out`, row-major, in the
    /// order the image's placeholder tokens take them (row by row of the pooled grid).
    ///
    /// Errors: [`ModelError::Unsupported`] for pixels of another size; the kernels' own.
    pub fn encode(&self, pixels: &[f32]) -> Result<Vec<f32>> {
        self.encode_frames(&[pixels])
    }

    /// [`VisionModel::encode`] of several encoder inputs (an image's tiles), their rows
    /// one after the other. Up to [`FRAMES_PER_PASS`] go through the encoder together:
    /// each weight is widened and packed once for them all (each attends only within
    /// itself, so the rows are those of one input at a time).
    ///
    /// Errors: as [`VisionModel::encode`], for any of them.
    pub fn encode_frames(&self, frames: &[&[f32]]) -> Result<Vec<f32>> {
        let s = self.config.image_size;
        if let Some(f) = frames.iter().find(|f| f.len() != 3 * s * s) {
            return Err(ModelError::Unsupported(format!(
                "{} pixel values for a {s}×{s} RGB encoder input (expected {})",
                f.len(),
                3 * s * s
            )));
        }
        let mut out = Vec::new();
        for group in frames.chunks(FRAMES_PER_PASS) {
            let x = self.vit(group)?;
            let per = x.len() / group.len();
            for f in x.chunks_exact(per) {
                out.extend(self.project(f)?);
            }
        }
        Ok(out)
    }

    /// The encoder on `frames` together: patch rows, positions, the layers (attention
    /// within each frame), the final norm (`frames × n_patches × n_embd`).
    fn vit(&self, frames: &[&[f32]]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (s, p, side, d) = (c.image_size, c.patch_size, c.patches_per_side(), c.n_embd);
        let n = side * side;
        let rows = frames.len() * n;
        // Each patch's pixels in the convolution's column order: channel, row, column.
        let mut patches = vec![0f32; rows * 3 * p * p];
        for (i, col) in patches.chunks_exact_mut(3 * p * p).enumerate() {
            let (pixels, i) = (frames[i / n], i % n);
            let (py, px) = (i / side, i % side);
            for ch in 0..3 {
                for y in 0..p {
                    let src = ch * s * s + (py * p + y) * s + px * p;
                    col[(ch * p + y) * p..][..p].copy_from_slice(&pixels[src..src + p]);
                }
            }
        }
        let mut x = vec![0f32; rows * d];
        self.product(&self.patch, &patches, rows, &mut x)?;
        add_bias(&mut x, &self.patch_b);
        for frame in x.chunks_exact_mut(n * d) {
            frame.iter_mut().zip(&self.pos).for_each(|(v, q)| *v += q);
        }
        let windows: Vec<std::ops::Range<usize>> =
            (0..frames.len()).map(|f| f * n..(f + 1) * n).collect();
        let layout = AttnLayout {
            rope: &[],
            windows: &windows,
        };
        for layer in &self.layers {
            self.vit_layer(layer, &mut x, rows, &layout)?;
        }
        self.norm(&mut x, &self.post_ln);
        Ok(x)
    }

    /// The encoder's norm with weights `w` on rows `x`: RMSNorm for Qwen2.5-VL's, else
    /// LayerNorm.
    pub(crate) fn norm(&self, x: &mut [f32], w: &NormWeights) {
        norm(x, w, self.config.eps, self.config.projector.native_size());
    }

    /// One pre-norm layer on the residual stream `x` (`n × n_embd`): attention as `layout`
    /// says, then the FFN (SiLU-gated where the layer has a gate, else GELU).
    pub(crate) fn vit_layer(
        &self,
        l: &VitLayer,
        x: &mut [f32],
        n: usize,
        layout: &AttnLayout<'_>,
    ) -> Result<()> {
        let (d, ff, n_head) = (self.config.n_embd, self.config.n_ff, self.config.n_head);
        let mut cur = x.to_vec();
        self.norm(&mut cur, &l.ln1);
        let proj = |w: &Matrix, b: &[f32], input: &[f32], out: &mut [f32]| -> Result<()> {
            self.product(w, input, n, out)?;
            add_bias(out, b);
            Ok(())
        };
        let (mut q, mut k, mut v) = (vec![0f32; n * d], vec![0f32; n * d], vec![0f32; n * d]);
        proj(&l.q, &l.q_b, &cur, &mut q)?;
        proj(&l.k, &l.k_b, &cur, &mut k)?;
        proj(&l.v, &l.v_b, &cur, &mut v)?;
        if !layout.rope.is_empty() {
            rope_2d(&mut q, layout.rope, d / n_head);
            rope_2d(&mut k, layout.rope, d / n_head);
        }
        let attn = match layout.windows {
            [w] if *w == (0..n) => full_attention(&q, &k, &v, n, n_head, d),
            windows => {
                let mut attn = vec![0f32; n * d];
                for w in windows {
                    let r = w.start * d..w.end * d;
                    let a = full_attention(
                        &q[r.clone()],
                        &k[r.clone()],
                        &v[r.clone()],
                        w.len(),
                        n_head,
                        d,
                    );
                    attn[r].copy_from_slice(&a);
                }
                attn
            }
        };
        proj(&l.out, &l.out_b, &attn, &mut cur)?;
        x.iter_mut().zip(&cur).for_each(|(a, b)| *a += b);
        cur.copy_from_slice(x);
        self.norm(&mut cur, &l.ln2);
        let mut up = vec![0f32; n * ff];
        proj(&l.up, &l.up_b, &cur, &mut up)?;
        match &l.gate {
            Some((g, g_b)) => {
                let mut gate = vec![0f32; n * ff];
                proj(g, g_b, &cur, &mut gate)?;
                for_each_chunk(&mut up, ff, &|i, row| {
                    let g = &gate[i * ff..][..ff];
                    row.iter_mut().zip(g).for_each(|(u, &g)| *u *= silu(g))
                });
            }
            None => for_each_chunk(&mut up, ff, &|_, row| {
                row.iter_mut().for_each(|u| *u = gelu_tanh(*u))
            }),
        }
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
                let mut out = vec![0f32; out_side * out_side * c.n_embd_out];
                gemm_nt(
                    &pooled,
                    proj,
                    out_side * out_side,
                    c.n_embd_out,
                    d,
                    &mut out,
                );
                Ok(out)
            }
            ProjectorWeights::Qwen25vl { .. } => Err(ModelError::Unsupported(
                "a Qwen2.5-VL projector encodes images at their own size (encode_native)".into(),
            )),
            ProjectorWeights::Idefics3 { fc } => {
                let shuffled = pixel_shuffle(x, side, d, m);
                let n = shuffled.len() / (d * m * m);
                let mut out = vec![0f32; n * c.n_embd_out];
                self.product(fc, &shuffled, n, &mut out)?;
                Ok(out)
            }
        }
    }
}

impl VisionModel {
    /// `out = x · Wᵀ` for the stored matrix `w` (`x`: `n × w.cols`, `out`: `n × w.rows`):
    /// the weights widened to f32 (bit-exact, frink-quant), then [`gemm_nt`].
    ///
    /// Errors: a weight type without a dequantization.
    pub(crate) fn product(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let bytes = self.weight(w);
        let mut wf = vec![0f32; w.rows * w.cols];
        let failed = std::sync::Mutex::new(None);
        for_each_chunk(&mut wf, w.cols * 64, &|t, part| {
            let rows = bytes[t * 64 * w.row_bytes..].chunks_exact(w.row_bytes);
            for (row, o) in rows.zip(part.chunks_exact_mut(w.cols)) {
                if let Err(e) = frink_quant::dequantize(w.ty, row, o) {
                    *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(ModelError::Unsupported(format!("vision weights: {e}")));
        }
        gemm_nt(x, &wf, n, w.rows, w.cols, out);
        Ok(())
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

/// The most encoder inputs that go through the encoder together
/// ([`VisionModel::encode_frames`]): four of SmolVLM's 1,024 patches hold about 120 MiB of
/// activations at once, and the weights are widened a quarter as often.
pub const FRAMES_PER_PASS: usize = 4;

/// How a layer's rows attend: the rows' 2D RoPE rotations, and the windows of rows that
/// attend only among themselves.
pub(crate) struct AttnLayout<'a> {
    /// Per row, `head_dim / 2` (cos, sin) pairs applied to every head of its query and key
    /// (Qwen2.5-VL: [`crate::vision::qwen::rope_2d_angles`]); empty: no RoPE.
    pub rope: &'a [(f32, f32)],
    /// Row ranges, in order and covering every row, each attending only within itself
    /// (one range of all rows: full attention).
    pub windows: &'a [std::ops::Range<usize>],
}

/// Rotates every head of every row of `x` (rows of `n_head · hd`) by its row's `hd / 2`
/// angle pairs, halves paired `(i, i + hd/2)` (transformers
/// `apply_rotary_pos_emb_vision`'s `rotate_half`).
fn rope_2d(x: &mut [f32], angles: &[(f32, f32)], hd: usize) {
    let half = hd / 2;
    let d = x.len() / (angles.len() / half).max(1);
    for_each_chunk(x, d * 16, &|ci, rows| {
        for (r, row) in rows.chunks_exact_mut(d).enumerate() {
            let a = &angles[(ci * 16 + r) * half..][..half];
            for head in row.chunks_exact_mut(hd) {
                crate::kernels::rope_rotate(head, a, true);
            }
        }
    });
}

/// LayerNorm with its bias, or RMSNorm (`rms`, with a bias if the file has one).
fn norm(x: &mut [f32], w: &NormWeights, eps: f32, rms: bool) {
    let d = w.weight.len();
    for_each_chunk(x, d * 64, &|_, rows| {
        match rms {
            true => rms_norm(rows, &w.weight, eps),
            false => layer_norm(rows, &w.weight, eps),
        }
        if let Some(b) = &w.bias {
            add_bias(rows, b);
        }
    });
}

/// Full (non-causal) multi-head attention of `n` rows: `q`, `k`, `v` are `n × d` with
/// `n_head` heads of `d / n_head`; softmax(q·kᵀ / √head_dim) · v, head by head as two
/// matrix products ([`gemm_nt`]: the scores `q_h · k_hᵀ`, then the weights times `v_h`
/// transposed). [`full_attention_rows`], one row at a time, is its twin in the tests.
pub(crate) fn full_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    n_head: usize,
    d: usize,
) -> Vec<f32> {
    full_attention_blocked(q, k, v, (n, n_head, d), SCORES)
}

/// [`full_attention`] with the queries in blocks whose scores take at most `scores`
/// values (the same bits whatever the blocks: each query row's products and softmax are
/// its own).
fn full_attention_blocked(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (n, n_head, d): (usize, usize, usize),
    scores: usize,
) -> Vec<f32> {
    let hd = d / n_head;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; n * d];
    let (mut qh, mut kh, mut vt) = (vec![0f32; n * hd], vec![0f32; n * hd], vec![0f32; n * hd]);
    let block = (scores / n.max(1)).clamp(1, n.max(1));
    let (mut scores, mut oh) = (vec![0f32; block * n], vec![0f32; n * hd]);
    for h in 0..n_head {
        for i in 0..n {
            let src = i * d + h * hd;
            // The scale goes on the queries (one pass over n · hd values, not n²).
            for (d, &x) in qh[i * hd..][..hd].iter_mut().zip(&q[src..src + hd]) {
                *d = x * scale;
            }
            kh[i * hd..][..hd].copy_from_slice(&k[src..src + hd]);
            for c in 0..hd {
                vt[c * n + i] = v[src + c];
            }
        }
        for q0 in (0..n).step_by(block) {
            let rows = block.min(n - q0);
            let s = &mut scores[..rows * n];
            gemm_nt(&qh[q0 * hd..(q0 + rows) * hd], &kh, rows, n, hd, s);
            for_each_chunk(s, n * 16, &|_, rows| {
                rows.chunks_exact_mut(n).for_each(softmax)
            });
            gemm_nt(s, &vt, rows, hd, n, &mut oh[q0 * hd..(q0 + rows) * hd]);
        }
        for i in 0..n {
            out[i * d + h * hd..][..hd].copy_from_slice(&oh[i * hd..][..hd]);
        }
    }
    out
}

/// The most attention scores [`full_attention`] holds at once (64 MiB of f32): a
/// native-size image's 16,384 patches would otherwise take 1 GiB per head.
const SCORES: usize = 1 << 24;

/// [`full_attention`] one query row and head at a time with [`crate::kernels::dot`] and
/// [`crate::kernels::axpy`]: its twin, which tests compare it against.
#[cfg(test)]
pub(crate) fn full_attention_rows(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    n_head: usize,
    d: usize,
) -> Vec<f32> {
    let hd = d / n_head;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; n * d];
    for (c, o) in out.chunks_exact_mut(hd).enumerate() {
        let (i, h) = (c / n_head, c % n_head);
        let qi: Vec<f32> = q[i * d + h * hd..][..hd]
            .iter()
            .map(|x| x * scale)
            .collect();
        let mut scores: Vec<f32> = (0..n)
            .map(|j| crate::kernels::dot(&qi, &k[j * d + h * hd..][..hd]))
            .collect();
        softmax(&mut scores);
        for (j, &pj) in scores.iter().enumerate() {
            crate::kernels::axpy(o, pj, &v[j * d + h * hd..][..hd]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention by matrix products agrees with its one-row-at-a-time twin (the
    /// products' fused multiply-adds round differently from `dot`), for row counts and head
    /// sizes with and without the tiles' and lanes' tails.
    #[test]
    fn attention_equals_its_one_row_twin() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        for (n, n_head, d) in [(8, 2, 32), (9, 3, 48), (11, 2, 36), (1, 1, 16), (64, 4, 64)] {
            let m: Vec<Vec<f32>> = (0..3)
                .map(|_| (0..n * d).map(|_| rnd()).collect())
                .collect();
            let a = full_attention(&m[0], &m[1], &m[2], n, n_head, d);
            let b = full_attention_rows(&m[0], &m[1], &m[2], n, n_head, d);
            // Queries in blocks of 1, 3 and 5 rows: the same bits.
            for rows in [1, 3, 5] {
                let c = full_attention_blocked(&m[0], &m[1], &m[2], (n, n_head, d), rows * n);
                assert_eq!(a, c, "n {n}: blocks of {rows}");
            }
            let worst = a
                .iter()
                .zip(&b)
                .fold(0f32, |w, (x, y)| w.max((x - y).abs()));
            // Measured 4.8e-7 at most; a head's scores from another head give ~1.
            assert!(worst < 1e-5, "n {n} heads {n_head} width {d}: {worst}");
        }
    }

    /// Each output row of the pixel shuffle holds its m × m patches, row offset outer
    /// (transformers' view/permute sequence worked by hand for a 4 × 4 grid, m = 2).
    #[test]
    fn pixel_shuffle_groups_patches_row_offset_outer() {
        // Patch (y, x) of width 1 holds the value 10·y + x.
        let x: Vec<f32> = (0..16).map(|i| (10 * (i / 4) + i % 4) as f32).collect();
        let out = pixel_shuffle(&x, 4, 1, 2);
        assert_eq!(
            out,
            [0., 1., 10., 11., 2., 3., 12., 13., 20., 21., 30., 31., 22., 23., 32., 33.]
        );
    }
}
