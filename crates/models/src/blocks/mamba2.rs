//! Mamba-2's SSD mixer (llama.cpp `build_mamba2_layer` in
//! `src/models/graph-context-mamba.cpp` with ggml's `ssm_conv` and `ssm_scan`;
//! transformers `Mamba2Mixer.torch_forward`), evaluated as its recurrence.
//!
//! `z | xBC | Δ = ssm_in · h`; `xBC = silu(conv(xBC) + conv_bias)`, split into `x`
//! (`n_head` heads of `head_dim`), `B` and `C` (`n_group` groups of `d_state`; head `h`
//! reads group `h / (n_head / n_group)`); `Δ = softplus(Δ + dt_bias)` per head; then per
//! head, position by position: `s = exp(Δ · A) · s + Δ · x ⊗ B` (`head_dim × d_state`),
//! `y = s · C + D · x`; `y = rmsnorm_groups(y · silu(z)) · ssm_norm` over groups of
//! `d_inner / n_group` (just `y · silu(z)` without `ssm_norm`: falcon-h1); `out = ssm_out ·
//! y`. The recurrence has no chunk boundaries, so a
//! prefix always yields the same state.

use crate::blocks::{columns, conv_sequences, scan_sequences, softplus, Rows};
use crate::config::{ModelConfig, SsmConfig};
use crate::error::Result;
use crate::kernels::{fast_exp, matmul, rms_norm, silu, ssm_step, Decay, Matrix};
use crate::load::Loader;
use crate::model::Model;
use crate::Sequence;

/// A Mamba-2 layer's weights (llama.cpp names, `blk.N.ssm_*`).
#[derive(Clone, Debug)]
pub struct Mamba2Weights {
    /// `ssm_in`: `2 · d_inner + 2 · n_group · d_state + n_head` rows (z, xBC, Δ).
    pub ssm_in: Matrix,
    /// `ssm_conv1d.weight` (`channels × d_conv` over x | B | C) and `.bias`.
    pub conv_w: Vec<f32>,
    pub conv_b: Vec<f32>,
    /// `ssm_dt.bias`, `ssm_a` (`A = -exp(A_log)`), `ssm_d`: one per head.
    pub dt_b: Vec<f32>,
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// `ssm_norm`: the gated RMSNorm's weight, `d_inner` (groups of `d_inner / n_group`);
    /// without it the output is `y · silu(z)` alone (falcon-h1).
    pub norm: Option<Vec<f32>>,
    pub ssm_out: Matrix,
}

impl Mamba2Weights {
    pub(crate) fn load(
        l: &mut Loader<'_>,
        il: usize,
        c: &ModelConfig,
        gated_norm: bool,
    ) -> Result<Mamba2Weights> {
        let s = c.ssm.as_ref().expect("a Mamba-2 plan has an SSM config");
        let n = |t: &str| format!("blk.{il}.{t}");
        let (di, nh, ng) = (s.d_inner, s.dt_rank, s.n_group);
        let ch = di + 2 * ng * s.d_state;
        Ok(Mamba2Weights {
            ssm_in: l.matrix(&n("ssm_in.weight"), di + ch + nh, c.n_embd)?,
            conv_w: l.stacked(&n("ssm_conv1d.weight"), s.d_conv, ch)?,
            conv_b: l.vector(&n("ssm_conv1d.bias"), ch)?,
            dt_b: l.vector(&n("ssm_dt.bias"), nh)?,
            a: l.stacked(&n("ssm_a"), 1, nh)?,
            d: l.stacked(&n("ssm_d"), 1, nh)?,
            norm: match gated_norm {
                true => Some(l.stacked(&n("ssm_norm.weight"), di / ng, ng)?),
                false => None,
            },
            ssm_out: l.matrix(&n("ssm_out.weight"), c.n_embd, di)?,
        })
    }
}

impl Model {
    /// Mamba-2 layer `il` on `input` (`n × n_embd`), advancing each sequence's state;
    /// the output projection into `out` (`n × n_embd`).
    pub(crate) fn mamba2_block(
        &self,
        il: usize,
        w: &Mamba2Weights,
        seqs: &mut [Sequence<'_>],
        rows: &Rows<'_>,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let s: &SsmConfig = self.config.ssm.as_ref().expect("Mamba-2 has an SSM config");
        let (di, ds, nh, ng) = (s.d_inner, s.d_state, s.dt_rank, s.n_group);
        let (hd, ch) = (di / nh, di + 2 * ng * ds);
        let width = di + ch + nh;
        let n = rows.n();
        let mut zxbcdt = vec![0f32; n * width];
        matmul(&w.ssm_in, self.weight(&w.ssm_in), input, n, &mut zxbcdt)?;
        let mut xbc_in = Vec::new();
        columns(&zxbcdt, width, di, ch, &mut xbc_in);
        let xbc = conv_sequences(
            seqs,
            rows,
            il,
            &w.conv_w,
            Some(&w.conv_b),
            &xbc_in,
            ch,
            true,
        );
        // The scan, position by position per sequence, its heads split over the pool.
        let mut y = vec![0f32; n * di];
        let per_group = nh / ng;
        scan_sequences(seqs, rows, il, hd * ds, hd, &mut y, &|r, h0, s_all, yb| {
            let cols = s_all.len() / ds;
            for (t, row) in r.clone().enumerate() {
                let xr = &xbc[row * ch..(row + 1) * ch];
                let (x, bc) = xr.split_at(di);
                let (b, cc) = bc.split_at(ng * ds);
                for (k, sh) in s_all.chunks_exact_mut(hd * ds).enumerate() {
                    let h = h0 + k;
                    let delta = softplus(zxbcdt[row * width + di + ch + h] + w.dt_b[h]);
                    let decay = fast_exp(delta * w.a[h]);
                    let g = h / per_group;
                    let (bg, cg) = (&b[g * ds..(g + 1) * ds], &cc[g * ds..(g + 1) * ds]);
                    for (p, sp) in sh.chunks_exact_mut(ds).enumerate() {
                        let xv = x[h * hd + p];
                        let acc = ssm_step(sp, Decay::Scalar(decay), bg, cg, delta * xv);
                        yb[t * cols + k * hd + p] = acc + w.d[h] * xv;
                    }
                }
            }
        });
        // The gate, then RMSNorm per group.
        let gs = di / ng;
        for (r, yr) in y.chunks_exact_mut(di).enumerate() {
            let z = &zxbcdt[r * width..r * width + di];
            yr.iter_mut().zip(z).for_each(|(v, &z)| *v *= silu(z));
            if let Some(norm) = &w.norm {
                for (yg, wg) in yr.chunks_exact_mut(gs).zip(norm.chunks_exact(gs)) {
                    rms_norm(yg, wg, self.config.norm_eps);
                }
            }
        }
        matmul(&w.ssm_out, self.weight(&w.ssm_out), &y, n, out)?;
        Ok(())
    }
}
