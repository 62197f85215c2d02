//! LFM2's gated short convolution (llama.cpp `build_shortconv_block` in
//! `src/models/lfm2.cpp`; transformers `Lfm2ShortConv.slow_forward`): `B | C | x =
//! in_proj · h`, `y = C · conv(B · x)` (causal, depthwise, `shortconv.l_cache` taps, no
//! bias), `out = out_proj · y`. Its state is the convolution's window of `B · x`.

use crate::blocks::{conv_sequences, Rows};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::{matmul, Matrix};
use crate::load::Loader;
use crate::model::Model;
use crate::Sequence;

/// A short-convolution layer's weights (`blk.N.shortconv.*`).
#[derive(Clone, Debug)]
pub struct ShortConvWeights {
    /// `shortconv.in_proj`: `3 · n_embd` rows (B, C, x).
    pub in_proj: Matrix,
    /// `shortconv.conv.weight`: `n_embd × taps`.
    pub conv: Vec<f32>,
    pub out_proj: Matrix,
}

impl ShortConvWeights {
    pub(crate) fn load(l: &mut Loader<'_>, il: usize, c: &ModelConfig) -> Result<ShortConvWeights> {
        let n = |t: &str| format!("blk.{il}.shortconv.{t}");
        let d = c.n_embd;
        Ok(ShortConvWeights {
            in_proj: l.matrix(&n("in_proj.weight"), 3 * d, d)?,
            conv: l.stacked(&n("conv.weight"), c.short_conv_taps, d)?,
            out_proj: l.matrix(&n("out_proj.weight"), d, d)?,
        })
    }
}

impl Model {
    /// Short-convolution layer `il` on `input` (`n × n_embd`), advancing each sequence's
    /// window; the output projection into `out` (`n × n_embd`).
    pub(crate) fn short_conv_block(
        &self,
        il: usize,
        w: &ShortConvWeights,
        seqs: &mut [Sequence<'_>],
        rows: &Rows<'_>,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.config.n_embd;
        let n = rows.n();
        let mut bcx = vec![0f32; n * 3 * d];
        matmul(&w.in_proj, self.weight(&w.in_proj), input, n, &mut bcx)?;
        // B · x per row, then the convolution per sequence, then C · conv.
        let mut bx = vec![0f32; n * d];
        for (o, r) in bx.chunks_exact_mut(d).zip(bcx.chunks_exact(3 * d)) {
            let (b, x) = (&r[..d], &r[2 * d..]);
            o.iter_mut()
                .zip(b.iter().zip(x))
                .for_each(|(o, (b, x))| *o = b * x);
        }
        let mut y = conv_sequences(seqs, rows, il, &w.conv, None, &bx, d, false);
        for (yr, r) in y.chunks_exact_mut(d).zip(bcx.chunks_exact(3 * d)) {
            yr.iter_mut().zip(&r[d..2 * d]).for_each(|(y, c)| *y *= c);
        }
        matmul(&w.out_proj, self.weight(&w.out_proj), &y, n, out)?;
        Ok(())
    }
}
