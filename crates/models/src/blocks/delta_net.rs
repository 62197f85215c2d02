//! Qwen3-Next's gated DeltaNet, a linear-attention token mixer (llama.cpp
//! `build_layer_attn_linear` in `src/models/qwen3next.cpp`; transformers
//! `Qwen3NextGatedDeltaNet` and its `torch_recurrent_gated_delta_rule`).
//!
//! `q | k | v = attn_qkv · h` (`n_group` key heads of `d_state` for q and k,
//! `time_step_rank` value heads of `d_state` for v), `z = attn_gate · h`, `b | a =
//! ssm_ba · h` (per key head: its value heads' b, then their a); `q | k | v =
//! silu(conv(q | k | v))` (causal, depthwise, no bias); q and k L2-normalised per head
//! (`x / sqrt(Σx² + ε)`), q scaled by `1/sqrt(d_state)`; value head `h` reads key head
//! `h / (value heads / key heads)`. Per value head and position, with `β = sigmoid(b)` and
//! the decay `e^g`, `g = softplus(a + dt_bias) · A` (`ssm_a` holds `A = -exp(A_log)`):
//! `S ← e^g · S`, `δ = (v − Sᵀk) · β`, `S ← S + k δᵀ`, `o = Sᵀ q` (`S` is `d_state ×
//! d_state`). Then `rmsnorm(o) · ssm_norm · silu(z)` per head and `ssm_out`.
//!
//! The rule runs position by position (its recurrent form) in prefill and decode alike:
//! a prefix gives the same state however it was chunked, and a prompt in one batch the
//! same bits as token by token.

use crate::blocks::{conv_sequences, scan_sequences, softplus, Rows};
use crate::config::{ModelConfig, SsmConfig};
use crate::error::Result;
use crate::kernels::{matmul_many, rms_norm, silu, Matrix, Projection};
use crate::load::Loader;
use crate::model::Model;
use crate::Sequence;

/// A gated DeltaNet layer's weights (llama.cpp names).
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    /// `attn_qkv`: `2 · key_dim + value_dim` rows (q, k, v).
    pub qkv: Matrix,
    /// `attn_gate`: `value_dim` rows (z).
    pub gate: Matrix,
    /// `ssm_ba`: `2 · value heads` rows.
    pub ba: Matrix,
    /// `ssm_conv1d.weight`: `channels × d_conv` over q | k | v.
    pub conv_w: Vec<f32>,
    /// `ssm_dt.bias` and `ssm_a` (`A = -exp(A_log)`): one per value head.
    pub dt_b: Vec<f32>,
    pub a: Vec<f32>,
    /// `ssm_norm`: the gated RMSNorm's weight, one head wide.
    pub norm: Vec<f32>,
    pub ssm_out: Matrix,
}

impl DeltaNetWeights {
    pub(crate) fn load(l: &mut Loader<'_>, il: usize, c: &ModelConfig) -> Result<DeltaNetWeights> {
        let s = c.ssm.as_ref().expect("a DeltaNet plan has an SSM config");
        let n = |t: &str| format!("blk.{il}.{t}");
        let (kd, vd, nv) = (s.n_group * s.d_state, s.d_inner, s.dt_rank);
        let ch = 2 * kd + vd;
        Ok(DeltaNetWeights {
            qkv: l.matrix(&n("attn_qkv.weight"), ch, c.n_embd)?,
            gate: l.matrix(&n("attn_gate.weight"), vd, c.n_embd)?,
            ba: l.matrix(&n("ssm_ba.weight"), 2 * nv, c.n_embd)?,
            conv_w: l.stacked(&n("ssm_conv1d.weight"), s.d_conv, ch)?,
            dt_b: l.vector(&n("ssm_dt.bias"), nv)?,
            a: l.vector(&n("ssm_a"), nv)?,
            norm: l.vector(&n("ssm_norm.weight"), s.d_state)?,
            ssm_out: l.matrix(&n("ssm_out.weight"), c.n_embd, vd)?,
        })
    }
}

/// `x / sqrt(Σx² + ε)` in place (transformers `l2norm`).
fn l2_normalize(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

impl Model {
    /// Gated DeltaNet layer `il` on `input` (`n × n_embd`), advancing each sequence's
    /// state; the output projection into `out` (`n × n_embd`).
    pub(crate) fn delta_net_block(
        &self,
        il: usize,
        w: &DeltaNetWeights,
        seqs: &mut [Sequence<'_>],
        rows: &Rows<'_>,
        input: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let s: &SsmConfig = c.ssm.as_ref().expect("DeltaNet has an SSM config");
        let (dk, nk, nv) = (s.d_state, s.n_group, s.dt_rank);
        let (kd, vd) = (nk * dk, s.d_inner);
        let ch = 2 * kd + vd;
        let per_k = nv / nk;
        let n = rows.n();
        let (mut mixed, mut z, mut ba) = (
            vec![0f32; n * ch],
            vec![0f32; n * vd],
            vec![0f32; n * 2 * nv],
        );
        matmul_many(
            &mut [
                Projection {
                    w: &w.qkv,
                    data: self.weight(&w.qkv),
                    out: &mut mixed,
                },
                Projection {
                    w: &w.gate,
                    data: self.weight(&w.gate),
                    out: &mut z,
                },
                Projection {
                    w: &w.ba,
                    data: self.weight(&w.ba),
                    out: &mut ba,
                },
            ],
            input,
            n,
        )?;
        let mut qkv = conv_sequences(seqs, rows, il, &w.conv_w, None, &mixed, ch, true);
        // q and k: L2-normalised per key head, q scaled.
        let scale = 1.0 / (dk as f32).sqrt();
        for row in qkv.chunks_exact_mut(ch) {
            for head in row[..2 * kd].chunks_exact_mut(dk) {
                l2_normalize(head, 1e-6);
            }
            row[..kd].iter_mut().for_each(|v| *v *= scale);
        }
        let mut y = vec![0f32; n * vd];
        scan_sequences(seqs, rows, il, dk * dk, dk, &mut y, &|r, h0, s_all, yb| {
            let cols = s_all.len() / dk;
            let mut kv_mem = vec![0f32; dk];
            for (t, row) in r.clone().enumerate() {
                let qr = &qkv[row * ch..(row + 1) * ch];
                for (u, sh) in s_all.chunks_exact_mut(dk * dk).enumerate() {
                    let h = h0 + u;
                    let g = h / per_k;
                    let (q, k) = (
                        &qr[g * dk..(g + 1) * dk],
                        &qr[kd + g * dk..kd + (g + 1) * dk],
                    );
                    let v = &qr[2 * kd + h * dk..2 * kd + (h + 1) * dk];
                    // b and a of value head h: in key head g's group, its j-th.
                    let (gi, j) = (h / per_k, h % per_k);
                    let b = ba[row * 2 * nv + gi * 2 * per_k + j];
                    let a = ba[row * 2 * nv + gi * 2 * per_k + per_k + j];
                    let beta = 1.0 / (1.0 + (-b).exp());
                    let decay = (softplus(a + w.dt_b[h]) * w.a[h]).exp();
                    // Two passes over S: Sᵀk of the decayed state is e^g · (Sᵀk); the
                    // decay is applied in the update's pass.
                    kv_mem.fill(0.0);
                    for (i, srow) in sh.chunks_exact(dk).enumerate() {
                        kv_mem
                            .iter_mut()
                            .zip(srow)
                            .for_each(|(m, s)| *m += s * k[i]);
                    }
                    // δ = (v − e^g · Sᵀk) · β, reusing kv_mem.
                    kv_mem
                        .iter_mut()
                        .zip(v)
                        .for_each(|(m, v)| *m = (v - decay * *m) * beta);
                    let o = &mut yb[t * cols + u * dk..t * cols + (u + 1) * dk];
                    o.fill(0.0);
                    for (i, srow) in sh.chunks_exact_mut(dk).enumerate() {
                        srow.iter_mut()
                            .zip(&kv_mem)
                            .for_each(|(s, d)| *s = decay * *s + k[i] * d);
                        o.iter_mut().zip(&*srow).for_each(|(o, s)| *o += s * q[i]);
                    }
                }
            }
        });
        // rmsnorm(o) · ssm_norm · silu(z), per value head.
        for (yr, zr) in y.chunks_exact_mut(vd).zip(z.chunks_exact(vd)) {
            rms_norm(yr, &w.norm, c.norm_eps);
            yr.iter_mut().zip(zr).for_each(|(y, &z)| *y *= silu(z));
        }
        crate::kernels::matmul(&w.ssm_out, self.weight(&w.ssm_out), &y, n, out)?;
        Ok(())
    }
}
