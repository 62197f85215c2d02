//! Qwen2.5-VL's vision encoder ([`VisionModel::encode_native`]): an image at its own size
//! (sides whole merged patches), patch rows from both temporal slices of the patch
//! convolution, the ViT layers with RMSNorm, 2D RoPE and window attention, then the
//! merger (transformers `Qwen2_5_VisionTransformerPretrainedModel`; llama.cpp
//! `tools/mtmd/models/qwen2vl.cpp`).
//!
//! The rows are kept in **window order** throughout, as transformers reorders them: the
//! merged patches window by window (windows row by row, the merged patches of a window
//! row by row), each merged patch's `n_merge²` patches row by row. A window's rows are
//! then one range, which the windowed layers attend within; the other layers attend over
//! all rows, where the order changes nothing. The merger's output is put back row by row
//! of the merged grid at the end.

use std::ops::Range;

use super::vit::AttnLayout;
use super::{ProjectorWeights, VisionModel};
use crate::error::{ModelError, Result};
use crate::kernels::{add_bias, gelu_erf};
use crate::pool::for_each_chunk;

/// The merged patches of a `rows × cols` grid in window order for windows of `win × win`
/// merged patches (the last row and column of windows clipped to the grid), and each
/// window's range in that order (transformers `get_window_index`; llama.cpp `clip.cpp`'s
/// `window_idx`).
///
/// # Panics
/// If `win` is 0.
pub fn window_order(rows: usize, cols: usize, win: usize) -> (Vec<usize>, Vec<Range<usize>>) {
    assert!(win > 0, "window_order: empty windows");
    let mut order = Vec::with_capacity(rows * cols);
    let mut windows = Vec::new();
    for wy in (0..rows).step_by(win) {
        for wx in (0..cols).step_by(win) {
            let start = order.len();
            for y in wy..(wy + win).min(rows) {
                order.extend((wx..(wx + win).min(cols)).map(|x| y * cols + x));
            }
            windows.push(start..order.len());
        }
    }
    (order, windows)
}

/// The 2D RoPE rotations of a patch at row `py`, column `px` of the patch grid, for heads
/// of `hd` values: `hd / 2` (cos, sin) pairs, the first `hd / 4` by the row, the rest by
/// the column, pair `j` of each at frequency `10000^(-2j / (hd/2))` (transformers
/// `Qwen2_5_VisionRotaryEmbedding` and `rot_pos_emb`, in f32 as it computes them).
pub fn rope_2d_angles(py: usize, px: usize, hd: usize, out: &mut Vec<(f32, f32)>) {
    let quarter = hd / 4;
    let dim = (hd / 2) as f32;
    for pos in [py, px] {
        for j in 0..quarter {
            let inv = 1.0 / 10000f32.powf((2 * j) as f32 / dim);
            let (sin, cos) = (pos as f32 * inv).sin_cos();
            out.push((cos, sin));
        }
    }
}

impl VisionModel {
    /// The language model's rows for one image of a native-size encoder (Qwen2.5-VL):
    /// `pixels` are its normalised values, channel-first `[3][H][W]` with `H = rows · s`,
    /// `W = cols · s` for merged patches of `s` pixels ([`super::ClipConfig::merged_patch`]);
    /// the result is `rows · cols × n_embd_out`, row by row of the merged grid.
    ///
    /// Errors: [`ModelError::Unsupported`] for another projector, an empty grid, more
    /// than [`super::MAX_NATIVE_PATCHES`] patches or pixels of another size; the
    /// kernels' own.
    pub fn encode_native(&self, pixels: &[f32], rows: usize, cols: usize) -> Result<Vec<f32>> {
        let c = &self.config;
        let (p, m, d) = (c.patch_size, c.n_merge, c.n_embd);
        let ProjectorWeights::Qwen25vl {
            mm0,
            mm0_b,
            mm2,
            mm2_b,
        } = &self.projector
        else {
            return Err(ModelError::Unsupported(format!(
                "a {} projector encodes fixed-size inputs",
                c.projector.name()
            )));
        };
        let mm = m * m;
        let n = rows * cols * mm;
        if n == 0 || n > super::MAX_NATIVE_PATCHES {
            return Err(ModelError::Unsupported(format!(
                "a {rows} × {cols} grid of merged patches ({n} patches; 1 to {})",
                super::MAX_NATIVE_PATCHES
            )));
        }
        let (h, w) = (rows * m * p, cols * m * p);
        if pixels.len() != 3 * h * w {
            return Err(ModelError::Unsupported(format!(
                "{} pixel values for a {w}×{h} RGB image (expected {})",
                pixels.len(),
                3 * h * w
            )));
        }
        let win = match c.n_wa_pattern {
            0 => rows.max(cols),
            _ => (c.window_size / (p * m)).max(1),
        };
        let (order, windows) = window_order(rows, cols, win);
        let (patches, angles) = self.native_patches(pixels, (rows, cols), &order);
        let mut x = vec![0f32; n * d];
        self.product(&self.patch, &patches, n, &mut x)?;
        if let Some(p1) = &self.patch1 {
            let mut x1 = vec![0f32; n * d];
            self.product(p1, &patches, n, &mut x1)?;
            x.iter_mut().zip(&x1).for_each(|(a, b)| *a += b);
        }
        let all = 0..n;
        let whole = std::slice::from_ref(&all);
        let windowed: Vec<Range<usize>> =
            windows.iter().map(|r| r.start * mm..r.end * mm).collect();
        for (il, layer) in self.layers.iter().enumerate() {
            let full = c.n_wa_pattern == 0 || (il + 1).is_multiple_of(c.n_wa_pattern);
            let layout = AttnLayout {
                rope: &angles,
                windows: if full { whole } else { &windowed },
            };
            self.vit_layer(layer, &mut x, n, &layout)?;
        }
        self.norm(&mut x, &self.post_ln);
        // The merger: each merged patch's rows side by side, `mm.0`, GELU, `mm.2`.
        let units = rows * cols;
        let mut hidden = vec![0f32; units * mm * d];
        self.product(mm0, &x, units, &mut hidden)?;
        add_bias(&mut hidden, mm0_b);
        for_each_chunk(&mut hidden, mm * d * 16, &|_, part| {
            part.iter_mut().for_each(|v| *v = gelu_erf(*v))
        });
        let out_d = c.n_embd_out;
        let mut merged = vec![0f32; units * out_d];
        self.product(mm2, &hidden, units, &mut merged)?;
        add_bias(&mut merged, mm2_b);
        // Back to row by row of the merged grid.
        let mut out = vec![0f32; units * out_d];
        for (k, &u) in order.iter().enumerate() {
            out[u * out_d..][..out_d].copy_from_slice(&merged[k * out_d..][..out_d]);
        }
        Ok(out)
    }

    /// The patch columns (channel, row, column within the patch: the convolution's order)
    /// of a `rows × cols` merged grid's image, in window order (`order`: the merged
    /// patches), and each patch's 2D RoPE rotations ([`rope_2d_angles`]).
    fn native_patches(
        &self,
        pixels: &[f32],
        (rows, cols): (usize, usize),
        order: &[usize],
    ) -> (Vec<f32>, Vec<(f32, f32)>) {
        let c = &self.config;
        let (p, m) = (c.patch_size, c.n_merge);
        let hd = c.n_embd / c.n_head;
        let (h, w) = (rows * m * p, cols * m * p);
        let n = rows * cols * m * m;
        let mut patches = vec![0f32; n * 3 * p * p];
        let mut angles = Vec::with_capacity(n * hd / 2);
        let mut cols_of = patches.chunks_exact_mut(3 * p * p);
        for &u in order {
            let (gy, gx) = (u / cols, u % cols);
            for q in 0..m * m {
                let (py, px) = (gy * m + q / m, gx * m + q % m);
                let col = cols_of.next().expect("a column per patch");
                for ch in 0..3 {
                    for y in 0..p {
                        let src = ch * h * w + (py * p + y) * w + px * p;
                        col[(ch * p + y) * p..][..p].copy_from_slice(&pixels[src..src + p]);
                    }
                }
                rope_2d_angles(py, px, hd, &mut angles);
            }
        }
        (patches, angles)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3 × 5 grid in windows of 2: windows row by row, clipped at the edges, each row by
    /// row (worked by hand from transformers' padding and permutation).
    #[test]
    fn windows_are_row_by_row_and_clipped() {
        let (order, windows) = window_order(3, 5, 2);
        assert_eq!(order, [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]);
        assert_eq!(windows, [0..4, 4..8, 8..10, 10..12, 12..14, 14..15]);
        // One window of the whole grid: the identity.
        let (order, windows) = window_order(3, 5, 5);
        assert_eq!(order, (0..15).collect::<Vec<_>>());
        assert_eq!(windows, vec![0..15]);
    }

    /// The first quarter of pairs turns with the row, the second with the column, at the
    /// same frequencies.
    #[test]
    fn rope_2d_turns_by_row_then_column() {
        let mut a = Vec::new();
        rope_2d_angles(3, 0, 16, &mut a);
        assert_eq!(a.len(), 8);
        assert_eq!((a[0].0, a[0].1), (3f32.cos(), 3f32.sin()));
        assert!(a[4..].iter().all(|&(c, s)| c == 1.0 && s == 0.0));
        let mut b = Vec::new();
        rope_2d_angles(0, 3, 16, &mut b);
        assert_eq!(&b[4..], &a[..4]);
    }
}
