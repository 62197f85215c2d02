//! Mamba-1's selective-scan mixer (llama.cpp `build_mamba_layer` in
//! `src/models/graph-context-mamba.cpp` with ggml's `ssm_conv` and `ssm_scan`;
//! transformers `MambaMixer.slow_forward`).
//!
//! `x | z = ssm_in · h`; `x = silu(conv(x) + conv_bias)` (causal, depthwise); `Δ | B | C =
//! ssm_x · x`; `Δ = softplus(ssm_dt · Δ + dt_bias)` per channel; then per channel `i` and
//! state `j`, position by position: `s[i][j] = exp(Δ[i] · A[i][j]) · s[i][j] + Δ[i] · B[j] ·
//! x[i]` and `y[i] = Σ_j s[i][j] · C[j] + D[i] · x[i]`; `out = ssm_out · (y · silu(z))`.
//! `ssm_a` holds `A = -exp(A_log)` as the converter stores it. The projections run over all
//! rows of the call at once; the convolution and the scan per sequence, in position
//! order, so a prompt evaluated in one batch and token by token give the same values.

use crate::blocks::{columns, conv_sequences, scan_sequences, softplus, Rows};
use crate::config::{ModelConfig, SsmConfig};
use crate::error::Result;
use crate::kernels::{matmul, silu, ssm_step, Decay, Matrix};
use crate::load::Loader;
use crate::model::Model;
use crate::Sequence;

/// A Mamba-1 layer's weights (llama.cpp names, `blk.N.ssm_*`).
#[derive(Clone, Debug)]
pub struct MambaWeights {
    /// `ssm_in`: `2 · d_inner` rows (x, then z).
    pub ssm_in: Matrix,
    /// `ssm_conv1d.weight` (`d_inner × d_conv`) and `.bias`.
    pub conv_w: Vec<f32>,
    pub conv_b: Vec<f32>,
    /// `ssm_x`: `dt_rank + 2 · d_state` rows (Δ, B, C).
    pub ssm_x: Matrix,
    /// `ssm_dt`: `d_inner` rows of `dt_rank`, and its bias.
    pub ssm_dt: Matrix,
    pub dt_b: Vec<f32>,
    /// `ssm_a`: `A`, `d_inner × d_state`.
    pub a: Vec<f32>,
    /// `ssm_d`: the skip connection's `D`, per channel.
    pub d: Vec<f32>,
    pub ssm_out: Matrix,
}

impl MambaWeights {
    pub(crate) fn load(l: &mut Loader<'_>, il: usize, c: &ModelConfig) -> Result<MambaWeights> {
        let s = c.ssm.as_ref().expect("a Mamba plan has an SSM config");
        let n = |t: &str| format!("blk.{il}.{t}");
        let (di, ds) = (s.d_inner, s.d_state);
        Ok(MambaWeights {
            ssm_in: l.matrix(&n("ssm_in.weight"), 2 * di, c.n_embd)?,
            conv_w: l.stacked(&n("ssm_conv1d.weight"), s.d_conv, di)?,
            conv_b: l.vector(&n("ssm_conv1d.bias"), di)?,
            ssm_x: l.matrix(&n("ssm_x.weight"), s.dt_rank + 2 * ds, di)?,
            ssm_dt: l.matrix(&n("ssm_dt.weight"), di, s.dt_rank)?,
            dt_b: l.vector(&n("ssm_dt.bias"), di)?,
            a: l.stacked(&n("ssm_a"), ds, di)?,
            d: l.vector(&n("ssm_d"), di)?,
            ssm_out: l.matrix(&n("ssm_out.weight"), c.n_embd, di)?,
        })
    }
}

impl Model {
    /// Mamba-1 layer `il` on `input` (`n × n_embd`), advancing each sequence's state;
    /// the output projection into `out` (`n × n_embd`).
    pub(crate) fn mamba_block(
        &self,
        il: usize,
        w: &MambaWeights,
        seqs: &mut [Sequence<'_>],
        rows: &Rows<'_>,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let s: &SsmConfig = self.config.ssm.as_ref().expect("Mamba has an SSM config");
        let (di, ds, dr) = (s.d_inner, s.d_state, s.dt_rank);
        let n = rows.n();
        let mut xz = vec![0f32; n * 2 * di];
        matmul(&w.ssm_in, self.weight(&w.ssm_in), input, n, &mut xz)?;
        // x: the convolution (per sequence, from its window), its bias, SiLU.
        let mut xs = Vec::new();
        columns(&xz, 2 * di, 0, di, &mut xs);
        let xc = conv_sequences(seqs, rows, il, &w.conv_w, Some(&w.conv_b), &xs, di, true);
        // Δ (low rank), B, C per row; Δ projected up to one step per channel.
        let width = dr + 2 * ds;
        let mut xdb = vec![0f32; n * width];
        matmul(&w.ssm_x, self.weight(&w.ssm_x), &xc, n, &mut xdb)?;
        let mut dt_low = Vec::new();
        columns(&xdb, width, 0, dr, &mut dt_low);
        let mut dt = vec![0f32; n * di];
        matmul(&w.ssm_dt, self.weight(&w.ssm_dt), &dt_low, n, &mut dt)?;
        // The scan, position by position per sequence, its channels split over the pool.
        let mut y = vec![0f32; n * di];
        scan_sequences(seqs, rows, il, ds, 1, &mut y, &|r, c0, h_all, yb| {
            let nc = h_all.len() / ds;
            for (t, row) in r.clone().enumerate() {
                let bc = &xdb[row * width + dr..(row + 1) * width];
                let (b, cc) = bc.split_at(ds);
                for (k, h) in h_all.chunks_exact_mut(ds).enumerate() {
                    let i = c0 + k;
                    let delta = softplus(dt[row * di + i] + w.dt_b[i]);
                    let x = xc[row * di + i];
                    let a = &w.a[i * ds..(i + 1) * ds];
                    let decay = Decay::PerState { delta, a };
                    let acc = ssm_step(h, decay, b, cc, delta * x);
                    let z = xz[row * 2 * di + di + i];
                    yb[t * nc + k] = (acc + w.d[i] * x) * silu(z);
                }
            }
        });
        matmul(&w.ssm_out, self.weight(&w.ssm_out), &y, n, out)?;
        Ok(())
    }
}
