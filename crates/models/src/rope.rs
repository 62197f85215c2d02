//! RoPE parameters of a class of layers: the base, the position scale and YaRN's blend.
//! Leaf types read by the config (`config`), the layer plan (`plan`) and the kernels.

/// RoPE parameters of one class of layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// `rope.freq_base`: θ base.
    pub freq_base: f32,
    /// Position multiplier: 1 / `rope.scaling.factor` for linear and YaRN scaling, else 1.
    pub freq_scale: f32,
    /// YaRN's blend of interpolated and extrapolated frequencies, when scaled by YaRN.
    pub yarn: Option<YarnParams>,
}

/// YaRN RoPE scaling (llama.cpp `ggml_rope_yarn_corr_dims` and `rope_yarn` in
/// ggml-cpu; transformers `_compute_yarn_parameters` with `truncate=True`): pair `i`'s
/// angle mixes the interpolated angle (`freq_scale · θ`) and the original one with a ramp
/// that is 1 below `corr_dims[0]` and 0 above `corr_dims[1]` (× `ext_factor`), and cos/sin
/// are scaled by `attn_factor · (1 + 0.1 ln(1 / freq_scale))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnParams {
    pub corr_dims: [f32; 2],
    pub ext_factor: f32,
    pub attn_factor: f32,
}

impl YarnParams {
    /// The correction range for `n_rot` rotated dimensions of a model trained on
    /// `n_ctx_orig` positions with base `freq_base` (dimensions whose wavelength fits
    /// `beta_fast` or `beta_slow` times in the original context; floor and ceil).
    pub fn new(
        n_rot: usize,
        n_ctx_orig: usize,
        freq_base: f32,
        beta_fast: f32,
        beta_slow: f32,
        ext_factor: f32,
        attn_factor: f32,
    ) -> YarnParams {
        let dim = |beta: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        YarnParams {
            corr_dims: [
                dim(beta_fast).floor().max(0.0),
                dim(beta_slow).ceil().min(n_rot as f32 - 1.0),
            ],
            ext_factor,
            attn_factor,
        }
    }
}

/// Where an image's rows sit in its grid, for multimodal RoPE (Qwen2-VL's M-RoPE): the
/// image's rows are its merged patches row by row, `rows × cols` of them, and these
/// [`crate::EmbdRows`] start at its row `first` (an image may be split across calls).
///
/// Row `i` of the image takes the time, height and width positions `(b, b + i / cols,
/// b + i % cols)` from the image's base `b` (the position its first row would have as
/// text), and the text after the image goes on from `b + max(rows, cols)`: each image
/// shifts the positions after it back by [`ImageGrid::shift`] from their KV cache index
/// (transformers `Qwen2_5_VLModel.get_rope_index`; llama.cpp `mtmd_image_tokens`' `nx`,
/// `ny` and `n_pos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGrid {
    /// Rows of merged patches.
    pub rows: usize,
    /// Merged patches per row.
    pub cols: usize,
    /// The image's row index of the first of these rows.
    pub first: usize,
}

impl ImageGrid {
    /// How far back the image moves the positions after it: `rows · cols − max(rows,
    /// cols)` (its rows take `rows · cols` cache rows but `max(rows, cols)` positions).
    pub fn shift(&self) -> usize {
        self.rows * self.cols - self.rows.max(self.cols)
    }
}

/// The time, height and width positions of a sequence's `n` new rows for multimodal RoPE:
/// the rows go at cache rows `p0 ..`, text rows at their cache row less `shift` (what the
/// images before `p0` moved positions back: the sum of their [`ImageGrid::shift`]s) on all
/// three axes, and the rows of each `(at, n, grid)` image span (in order, inside `0..n`) as
/// [`ImageGrid`] says, each whole image adding its shift for the rows after it.
///
/// Errors (as a message): a shift past `p0`, a grid that is empty or shorter than its
/// rows, or rows before a partial image's own start.
pub fn mrope_positions(
    p0: usize,
    n: usize,
    mut shift: usize,
    images: &[(usize, usize, ImageGrid)],
) -> Result<Vec<[usize; 3]>, String> {
    let mut out = Vec::with_capacity(n);
    let text = |out: &mut Vec<[usize; 3]>, a: usize, b: usize, shift: usize| {
        out.extend((a..b).map(|i| [p0 + i - shift; 3]));
    };
    if shift > p0 {
        return Err(format!("M-RoPE shift {shift} past cache row {p0}"));
    }
    let mut end = 0;
    for &(at, len, g) in images {
        if g.rows == 0 || g.cols == 0 || g.first + len > g.rows * g.cols {
            return Err(format!(
                "image rows {}..{} outside a {} × {} grid",
                g.first,
                g.first + len,
                g.rows,
                g.cols
            ));
        }
        text(&mut out, end, at, shift);
        let base = (p0 + at - shift)
            .checked_sub(g.first)
            .ok_or_else(|| format!("image row {} before position 0", g.first))?;
        out.extend((g.first..g.first + len).map(|i| [base, base + i / g.cols, base + i % g.cols]));
        if g.first + len == g.rows * g.cols {
            shift += g.shift();
        }
        end = at + len;
    }
    text(&mut out, end, n, shift);
    Ok(out)
}

/// [`crate::kernels::rope_angles`] for multimodal RoPE: pair `i` rotates by the angle of
/// position component `c` where `i mod Σsections` falls in section `c` (time, height,
/// width, then a fourth component, 0 here as llama.cpp writes it for text and images).
/// Each component's angles are the plain ones of its position, so a row whose three
/// positions are equal gets plain RoPE's angles bit for bit (llama.cpp ggml-cpu
/// `ggml_mrope_cache_init`; transformers `apply_multimodal_rotary_pos_emb`).
pub fn mrope_angles(
    pos: [usize; 3],
    sections: &[usize; 4],
    n_rot: usize,
    rp: &RopeParams,
    factors: Option<&[f32]>,
    scratch: &mut [Vec<(f32, f32)>; 4],
    out: &mut Vec<(f32, f32)>,
) {
    for (c, s) in scratch.iter_mut().enumerate() {
        let p = pos.get(c).copied().unwrap_or(0);
        crate::kernels::rope_angles(p, n_rot, rp, factors, s);
    }
    let total: usize = sections.iter().sum::<usize>().max(1);
    out.clear();
    for i in 0..n_rot / 2 {
        // The component whose section holds pair i (mod the sections' sum).
        let (mut sector, mut c) = (i % total, 0);
        while c < 3 && sector >= sections[c] {
            sector -= sections[c];
            c += 1;
        }
        out.push(
            scratch
                .get(c)
                .and_then(|s| s.get(i))
                .copied()
                .unwrap_or((1.0, 0.0)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text, a 2 × 3 image, text, a 3 × 1 image cut across two calls: the positions of
    /// transformers' `get_rope_index` worked by hand.
    #[test]
    fn positions_follow_each_images_grid() {
        let g = |rows, cols, first| ImageGrid { rows, cols, first };
        // Rows 0-1 text, 2-7 the 2 × 3 image (base 2), 8 text at 2 + 3 = 5, 9-10 the
        // first two rows of a 3 × 1 image (base 6).
        let a = mrope_positions(0, 11, 0, &[(2, 6, g(2, 3, 0)), (9, 2, g(3, 1, 0))]).unwrap();
        let want: Vec<[usize; 3]> = vec![
            [0, 0, 0],
            [1, 1, 1],
            [2, 2, 2],
            [2, 2, 3],
            [2, 2, 4],
            [2, 3, 2],
            [2, 3, 3],
            [2, 3, 4],
            [5, 5, 5],
            [6, 6, 6],
            [6, 7, 6],
        ];
        assert_eq!(a, want);
        // The next call: the image's last row, then text at 6 + 3 = 9; the shift of the
        // first image (6 - 3 = 3) carried in.
        let b = mrope_positions(11, 2, 3, &[(0, 1, g(3, 1, 2))]).unwrap();
        assert_eq!(b, vec![[6, 8, 6], [9, 9, 9]]);
        assert_eq!(g(2, 3, 0).shift() + g(3, 1, 0).shift(), 3);
        // Refused: a shift past the rows, rows past the grid.
        assert!(mrope_positions(2, 1, 3, &[]).is_err());
        assert!(mrope_positions(0, 4, 0, &[(0, 4, g(1, 3, 0))]).is_err());
    }

    /// Equal positions give plain RoPE's angles bit for bit; the sections pick each pair's
    /// component, repeating past their sum.
    #[test]
    fn angles_take_each_sections_component() {
        let rp = RopeParams {
            freq_base: 10000.0,
            freq_scale: 1.0,
            yarn: None,
        };
        let (mut plain, mut multi) = (Vec::new(), Vec::new());
        let mut scratch: [Vec<(f32, f32)>; 4] = Default::default();
        crate::kernels::rope_angles(7, 16, &rp, None, &mut plain);
        mrope_angles(
            [7; 3],
            &[2, 3, 3, 0],
            16,
            &rp,
            None,
            &mut scratch,
            &mut multi,
        );
        assert_eq!(plain, multi);
        let by = |p: usize| {
            let mut v = Vec::new();
            crate::kernels::rope_angles(p, 16, &rp, None, &mut v);
            v
        };
        let (t, h, w) = (by(1), by(2), by(3));
        mrope_angles(
            [1, 2, 3],
            &[1, 1, 1, 0],
            16,
            &rp,
            None,
            &mut scratch,
            &mut multi,
        );
        for (i, a) in multi.iter().enumerate() {
            let want = [t[i], h[i], w[i]][i % 3];
            assert_eq!(*a, want, "pair {i}");
        }
    }
}
