//! Multi-head latent attention (llama.cpp `src/models/deepseek2.cpp`, the absorbed form;
//! transformers `DeepseekV2Attention`): keys and values from a shared compressed latent,
//! each head's query projected into it, each head's output projected back out of it. The
//! attention itself is [`crate::blocks::attention`]'s, as multi-query attention over the
//! latent.

use crate::error::Result;
use crate::kernels::{matmul, rms_norm, Matrix};
use crate::load::Loader;
use crate::model::{Experts, Model};

/// The projections of multi-head latent attention (llama.cpp names).
#[derive(Clone, Debug)]
pub struct MlaWeights {
    /// `attn_q_a` + `attn_q_a_norm` + `attn_q_b`, or a plain `attn_q` (`q_lora_rank` 0):
    /// the per-head queries (`n_head · qk_head_dim`).
    pub q_a: Option<(Matrix, Vec<f32>)>,
    pub q_b: Matrix,
    /// `attn_kv_a_mqa`: the latent (`kv_lora_rank`) and the shared RoPE key (`n_rot`).
    pub kv_a: Matrix,
    /// `attn_kv_a_norm`: RMSNorm of the latent.
    pub kv_a_norm: Vec<f32>,
    /// `attn_k_b`: per head, `kv_lora_rank` rows × the no-RoPE query width.
    pub k_b: Experts,
    /// `attn_v_b`: per head, `value_length_mla` rows × `kv_lora_rank`.
    pub v_b: Experts,
}

impl MlaWeights {
    /// Loads layer `il`'s MLA projections (shapes from [`crate::config::MlaConfig`]).
    pub(crate) fn load(
        l: &mut Loader<'_>,
        il: usize,
        c: &crate::ModelConfig,
        mla: &crate::config::MlaConfig,
    ) -> Result<MlaWeights> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let rank = mla.kv_lora_rank;
        let nope = mla.qk_head_dim - c.n_rot;
        let q_full = c.n_head * mla.qk_head_dim;
        let q_a = if mla.q_lora_rank > 0 {
            Some((
                l.matrix(&n("attn_q_a.weight"), mla.q_lora_rank, c.n_embd)?,
                l.vector(&n("attn_q_a_norm.weight"), mla.q_lora_rank)?,
            ))
        } else {
            None
        };
        let q_b = match &q_a {
            Some(_) => l.matrix(&n("attn_q_b.weight"), q_full, mla.q_lora_rank)?,
            None => l.matrix(&n("attn_q.weight"), q_full, c.n_embd)?,
        };
        Ok(MlaWeights {
            q_a,
            q_b,
            kv_a: l.matrix(&n("attn_kv_a_mqa.weight"), rank + c.n_rot, c.n_embd)?,
            kv_a_norm: l.vector(&n("attn_kv_a_norm.weight"), rank)?,
            k_b: l.experts(&n("attn_k_b.weight"), c.n_head, rank, nope)?,
            v_b: l.experts(&n("attn_v_b.weight"), c.n_head, mla.v_head_dim, rank)?,
        })
    }

    /// The matrices it multiplies (the per-head ones by their first head).
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        self.q_a.iter().map(|(m, _)| m).chain([
            &self.q_b,
            &self.kv_a,
            &self.k_b.first,
            &self.v_b.first,
        ])
    }
}

impl Model {
    /// Multi-head latent attention's queries, keys and values for `n` rows of `input`
    /// (llama.cpp `src/models/deepseek2.cpp`, the absorbed form; transformers
    /// `DeepseekV2Attention`): per head, the query's no-RoPE part is projected into the
    /// latent through `attn_k_b`, so `q` holds `[latent query | RoPE part]` per head, `k` the
    /// shared `[normed latent | RoPE key]` and `v` the normed latent: the scores equal the
    /// un-absorbed ones and attention runs as multi-query attention over the latent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mla_qkv(
        &self,
        w: &MlaWeights,
        input: &[f32],
        n: usize,
        q: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let mc = c.mla.as_ref().expect("MLA weights have an MLA config");
        let (rank, rope) = (mc.kv_lora_rank, c.n_rot);
        let (qk, nope) = (mc.qk_head_dim, mc.qk_head_dim - rope);
        let mut qf = vec![0f32; n * c.n_head * qk];
        match &w.q_a {
            Some((qa, qa_norm)) => {
                let mut t = vec![0f32; n * qa.rows];
                matmul(qa, self.weight(qa), input, n, &mut t)?;
                rms_norm(&mut t, qa_norm, c.norm_eps);
                matmul(&w.q_b, self.weight(&w.q_b), &t, n, &mut qf)?;
            }
            None => matmul(&w.q_b, self.weight(&w.q_b), input, n, &mut qf)?,
        }
        let mut kv = vec![0f32; n * (rank + rope)];
        matmul(&w.kv_a, self.weight(&w.kv_a), input, n, &mut kv)?;
        let (kd, vd, qd) = (c.k_dim(), c.v_dim(), c.q_dim());
        for i in 0..n {
            let row = &kv[i * (rank + rope)..(i + 1) * (rank + rope)];
            let kr = &mut k[i * kd..(i + 1) * kd];
            kr.copy_from_slice(row);
            rms_norm(&mut kr[..rank], &w.kv_a_norm, c.norm_eps);
            v[i * vd..(i + 1) * vd].copy_from_slice(&kr[..rank]);
        }
        let mut nope_rows = vec![0f32; n * nope];
        let mut absorbed = vec![0f32; n * rank];
        for h in 0..c.n_head {
            for i in 0..n {
                nope_rows[i * nope..(i + 1) * nope]
                    .copy_from_slice(&qf[(i * c.n_head + h) * qk..][..nope]);
            }
            let kb = w.k_b.expert(h);
            matmul(&kb, self.weight(&kb), &nope_rows, n, &mut absorbed)?;
            for i in 0..n {
                let head = &mut q[i * qd + h * (rank + rope)..][..rank + rope];
                head[..rank].copy_from_slice(&absorbed[i * rank..(i + 1) * rank]);
                head[rank..].copy_from_slice(&qf[(i * c.n_head + h) * qk + nope..][..rope]);
            }
        }
        Ok(())
    }
    /// Each head's latent attention output (`n × n_head · kv_lora_rank` in `attn`)
    /// projected out of the latent through `attn_v_b`, into `out` (`n × n_head ·
    /// value_length_mla`), the input of `attn_output`.
    pub(crate) fn mla_output(
        &self,
        w: &MlaWeights,
        attn: &[f32],
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &self.config;
        let mc = c.mla.as_ref().expect("MLA weights have an MLA config");
        let (rank, vh) = (mc.kv_lora_rank, mc.v_head_dim);
        out.resize(n * c.n_head * vh, 0.0);
        let mut lat = vec![0f32; n * rank];
        let mut o = vec![0f32; n * vh];
        for h in 0..c.n_head {
            for i in 0..n {
                lat[i * rank..(i + 1) * rank]
                    .copy_from_slice(&attn[(i * c.n_head + h) * rank..][..rank]);
            }
            let vb = w.v_b.expert(h);
            matmul(&vb, self.weight(&vb), &lat, n, &mut o)?;
            for i in 0..n {
                out[(i * c.n_head + h) * vh..][..vh].copy_from_slice(&o[i * vh..(i + 1) * vh]);
            }
        }
        Ok(())
    }
}
