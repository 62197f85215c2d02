//! The mixture-of-experts block (llama.cpp `llm_graph_context::build_moe_ffn`;
//! transformers `Qwen2MoeSparseMoeBlock`, `MixtralSparseMoeBlock`, `DeepseekV3MoE`,
//! `GptOssMLP`): a router, [`route`]'s choice of experts per row, the chosen dense experts
//! ([`crate::blocks::ffn`]) and an optional gated shared expert.

use crate::arch::{Activation, Ffn};
use crate::blocks::ffn::activate;
use crate::blocks::ffn::DenseFfn;
use crate::config::{Gating, MoeConfig};
use crate::error::{ModelError, Result};
use crate::kernels::{add_bias, matmul, matmul_each, matmul_many, softmax, Matrix, Projection};
use crate::load::Loader;
use crate::lora::LoraRows;
use crate::model::{Experts, Model};

/// A mixture-of-experts block: the router (`ffn_gate_inp`), the routed experts
/// (`ffn_{gate,up,down}_exps`) and an optional shared expert (`ffn_*_shexp`, scaled by
/// `sigmoid(ffn_gate_inp_shexp · x)` where that vector exists).
#[derive(Clone, Debug)]
pub struct MoeFfn {
    pub router: Matrix,
    pub gate_exps: Experts,
    pub up_exps: Experts,
    pub down_exps: Experts,
    pub shared: Option<DenseFfn>,
    /// `ffn_gate_inp_shexp`: one row (`n_embd` columns).
    pub shared_gate: Option<Matrix>,
    /// `exp_probs_b.bias`: added to the expert scores for selection only (deepseek v3's
    /// `e_score_correction_bias`).
    pub selection_bias: Option<Vec<f32>>,
    /// `ffn_gate_inp.bias`: added to the router logits (gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    /// Per-expert biases `ffn_{gate,up,down}_exps.bias`, expert after expert (gpt-oss).
    pub gate_exps_bias: Option<Vec<f32>>,
    pub up_exps_bias: Option<Vec<f32>>,
    pub down_exps_bias: Option<Vec<f32>>,
}

impl MoeFfn {
    /// Loads layer `il`'s router, routed experts (`ffn_{gate,up,down}_exps`, `n_expert` of
    /// width `n_ff_exp`), the shared expert where the file has `ffn_up_shexp` (its width
    /// from that tensor) with its gate, and the optional biases.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        il: usize,
        mc: &MoeConfig,
        n_embd: usize,
    ) -> Result<MoeFfn> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (e, ff) = (mc.n_expert, mc.n_ff_exp);
        // The shared expert's width: the key's, else `expert_shared_count` experts', else
        // its tensor's (ne1 of ffn_up_shexp).
        let width_key = match (mc.n_ff_shexp, mc.n_shared) {
            (0, None) => None,
            (0, Some(c)) => Some((c * ff, "expert_shared_count")),
            (w, _) => Some((w, "expert_shared_feed_forward_length")),
        };
        let shared = match l.f.tensor_index(&n("ffn_up_shexp.weight")) {
            None => match width_key {
                Some((w, key)) if w > 0 => {
                    let arch = l.f.architecture().unwrap_or("");
                    return Err(l.missing_for(
                        &n("ffn_up_shexp.weight"),
                        &format!("{arch}.{key} asks for a shared expert {w} wide"),
                    ));
                }
                _ => None,
            },
            Some(i) => {
                let ff_sh = match width_key {
                    Some((w, _)) => w,
                    None => l.f.tensor_infos()[i].shape.get(1).copied().unwrap_or(0) as usize,
                };
                Some(DenseFfn::load(
                    l,
                    &n(""),
                    "_shexp",
                    ff_sh,
                    n_embd,
                    Ffn::Gated,
                )?)
            }
        };
        Ok(MoeFfn {
            router: l.matrix(&n("ffn_gate_inp.weight"), e, n_embd)?,
            gate_exps: l.experts(&n("ffn_gate_exps.weight"), e, ff, n_embd)?,
            up_exps: l.experts(&n("ffn_up_exps.weight"), e, ff, n_embd)?,
            down_exps: l.experts(&n("ffn_down_exps.weight"), e, n_embd, ff)?,
            shared_gate: if shared.is_some() {
                l.matrix_opt(&n("ffn_gate_inp_shexp.weight"), 1, n_embd)?
            } else {
                None
            },
            selection_bias: l.vector_opt(&n("exp_probs_b.bias"), e)?,
            router_bias: l.vector_opt(&n("ffn_gate_inp.bias"), e)?,
            gate_exps_bias: l.stacked_opt(&n("ffn_gate_exps.bias"), ff, e)?,
            up_exps_bias: l.stacked_opt(&n("ffn_up_exps.bias"), ff, e)?,
            down_exps_bias: l.stacked_opt(&n("ffn_down_exps.bias"), n_embd, e)?,
            shared,
        })
    }

    /// The matrices it multiplies (each routed set by its first expert).
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        [
            &self.router,
            &self.gate_exps.first,
            &self.up_exps.first,
            &self.down_exps.first,
        ]
        .into_iter()
        .chain(self.shared.iter().flat_map(|d| d.matrices()))
        .chain(self.shared_gate.iter())
    }
}

impl Model {
    /// A mixture-of-experts FFN on `input` (`n × n_embd`), into `out` (llama.cpp
    /// `llm_graph_context::build_moe_ffn`; transformers `Qwen2MoeSparseMoeBlock.forward`
    /// and its siblings): the router's logits, [`route`]'s experts and weights per row,
    /// then each expert once over all the rows that chose it (its weights read once per
    /// call), each row's expert outputs summed with their weights in selection order (or,
    /// with [`MoeConfig::weight_input`], each expert fed its row times its weight and the
    /// outputs summed as they are),
    /// plus the shared expert (× `sigmoid(shared_gate · x)` where it has a gate).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_ffn(
        &self,
        il: usize,
        m: &MoeFfn,
        act: Activation,
        input: &[f32],
        n: usize,
        out: &mut [f32],
        lora: &LoraRows,
    ) -> Result<()> {
        let c = &self.config;
        let mc = c.moe.as_ref().expect("a MoE layer has a MoE config");
        let (d, ne, k) = (c.n_embd, mc.n_expert, mc.n_used);
        let mut logits = vec![0f32; n * ne];
        matmul(&m.router, self.weight(&m.router), input, n, &mut logits)?;
        if let Some(b) = &m.router_bias {
            add_bias(&mut logits, b);
        }
        let sel: Vec<(usize, f32)> = logits
            .chunks_exact(ne)
            .flat_map(|row| route(row, m.selection_bias.as_deref(), mc))
            .collect();
        self.moe_stats.record(il, sel.iter().map(|&(e, _)| e));
        // Each expert over the rows that chose it; results land in slot (row, j).
        let mut slots = vec![0f32; n * k * d];
        // With weights on the inputs every expert has an input of its own, which the
        // one-row path (one shared input) does not take; Llama 4, the one such model,
        // selects one expert per token, so it would gain nothing.
        if n == 1 && self.expert_cache.is_none() && !mc.weight_input {
            self.experts_of_one_row(m, act, mc, input, &sel, lora, &mut slots)?;
        } else {
            self.experts_by_rows(m, act, mc, input, n, &sel, lora, &mut slots)?;
        }
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            for j in 0..k {
                // Weights already applied to the inputs count once.
                let wt = if mc.weight_input {
                    1.0
                } else {
                    sel[r * k + j].1
                };
                let y = &slots[(r * k + j) * d..][..d];
                if j == 0 {
                    o.iter_mut().zip(y).for_each(|(o, y)| *o = y * wt);
                } else {
                    o.iter_mut().zip(y).for_each(|(o, y)| *o += y * wt);
                }
            }
        }
        if let Some(sh) = &m.shared {
            let (mut gate, mut up) = (Vec::new(), Vec::new());
            let mut ys = vec![0f32; n * d];
            self.dense_ffn(
                sh,
                Ffn::Gated,
                act,
                sh.up.rows,
                input,
                n,
                &mut gate,
                &mut up,
                &mut ys,
                None,
                lora,
            )?;
            let mut g = vec![1f32; n];
            if let Some(wg) = &m.shared_gate {
                matmul(wg, self.weight(wg), input, n, &mut g)?;
                g.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
            }
            for ((o, y), g) in out.chunks_exact_mut(d).zip(ys.chunks_exact(d)).zip(&g) {
                o.iter_mut().zip(y).for_each(|(o, y)| *o += y * g);
            }
        }
        Ok(())
    }
    /// The routed experts of `n` rows (`sel`: each row's `k` choices), each expert once
    /// over all the rows that chose it, into `slots` (slot `row · k + j` of `n_embd`).
    #[allow(clippy::too_many_arguments)]
    fn experts_by_rows(
        &self,
        m: &MoeFfn,
        act: Activation,
        mc: &MoeConfig,
        input: &[f32],
        n: usize,
        sel: &[(usize, f32)],
        lora: &LoraRows,
        slots: &mut [f32],
    ) -> Result<()> {
        let (d, ne, k) = (self.config.n_embd, mc.n_expert, mc.n_used);
        let (mut gate, mut up) = (Vec::new(), Vec::new());
        // The chosen experts, in index order; under a budget the next one's matrices are
        // read into the cache (prefetched) while the current one computes.
        let chosen: Vec<usize> = (0..ne).filter(|&e| sel.iter().any(|s| s.0 == e)).collect();
        let load = |e: usize| {
            self.expert_cache.as_ref().map(|cache| {
                [
                    m.gate_exps.expert(e),
                    m.up_exps.expert(e),
                    m.down_exps.expert(e),
                ]
                .map(|w| cache.get(&self.file, &w))
            })
        };
        std::thread::scope(|scope| -> Result<()> {
            let mut next = None;
            for (j, &e) in chosen.iter().enumerate() {
                let cached = match next.take() {
                    Some(h) => std::thread::ScopedJoinHandle::join(h)
                        .map_err(|_| ModelError::Unsupported("expert prefetch panicked".into()))?,
                    None => load(e),
                };
                if let (Some(_), Some(&following)) = (&cached, chosen.get(j + 1)) {
                    next = Some(scope.spawn(move || load(following)));
                }
                let picks: Vec<usize> = (0..n * k).filter(|&s| sel[s].0 == e).collect();
                // Each pick's row, times its weight where weights go on the inputs.
                let xs: Vec<f32> = picks
                    .iter()
                    .flat_map(|&s| {
                        let wt = if mc.weight_input { sel[s].1 } else { 1.0 };
                        // `x · 1` is `x`: no change for the other architectures.
                        input[(s / k) * d..(s / k + 1) * d]
                            .iter()
                            .map(move |&x| x * wt)
                    })
                    .collect();
                let bias = |b: &Option<Vec<f32>>, len: usize| {
                    b.as_ref().map(|b| b[e * len..(e + 1) * len].to_vec())
                };
                let expert = DenseFfn {
                    gate: Some(m.gate_exps.expert(e)),
                    up: m.up_exps.expert(e),
                    down: m.down_exps.expert(e),
                    b_gate: bias(&m.gate_exps_bias, mc.n_ff_exp),
                    b_up: bias(&m.up_exps_bias, mc.n_ff_exp),
                    b_down: bias(&m.down_exps_bias, d),
                };
                let mut ys = vec![0f32; picks.len() * d];
                // Under a budget the matrices come from the cache (the file's bytes).
                let bytes = cached.as_ref().map(|c| [&c[0][..], &c[1][..], &c[2][..]]);
                self.dense_ffn(
                    &expert,
                    Ffn::Gated,
                    act,
                    mc.n_ff_exp,
                    &xs,
                    picks.len(),
                    &mut gate,
                    &mut up,
                    &mut ys,
                    bytes,
                    // The picking rows' adapters, on this expert's slices.
                    &lora.gather(picks.iter().map(|&s| s / k)),
                )?;
                for (&s, y) in picks.iter().zip(ys.chunks_exact(d)) {
                    slots[s * d..(s + 1) * d].copy_from_slice(y);
                }
            }
            Ok(())
        })
    }

    /// [`Model::experts_by_rows`] for one row (a decode step of one sequence): every
    /// chosen expert's gate and up products in one parallel step, the activations on
    /// this thread, every down product in one more ([`matmul_each`]) — two dispatches of
    /// the compute pool instead of five per expert. Each value has the bits the
    /// per-expert path gives it (the same products, biases, adapters and activation,
    /// element by element).
    #[allow(clippy::too_many_arguments)]
    fn experts_of_one_row(
        &self,
        m: &MoeFfn,
        act: Activation,
        mc: &MoeConfig,
        input: &[f32],
        sel: &[(usize, f32)],
        lora: &LoraRows,
        slots: &mut [f32],
    ) -> Result<()> {
        let (d, ff) = (self.config.n_embd, mc.n_ff_exp);
        let k = sel.len();
        let mats: Vec<[Matrix; 3]> = sel
            .iter()
            .map(|&(e, _)| {
                [
                    m.gate_exps.expert(e),
                    m.up_exps.expert(e),
                    m.down_exps.expert(e),
                ]
            })
            .collect();
        let (mut gate, mut up) = (vec![0f32; k * ff], vec![0f32; k * ff]);
        {
            let mut projs: Vec<Projection<'_>> = Vec::with_capacity(2 * k);
            for ((w, g), u) in mats
                .iter()
                .zip(gate.chunks_exact_mut(ff))
                .zip(up.chunks_exact_mut(ff))
            {
                projs.push(Projection {
                    w: &w[0],
                    data: self.weight(&w[0]),
                    out: g,
                });
                projs.push(Projection {
                    w: &w[1],
                    data: self.weight(&w[1]),
                    out: u,
                });
            }
            matmul_many(&mut projs, input, 1)?;
        }
        for (j, &(e, _)) in sel.iter().enumerate() {
            let (g, u) = (
                &mut gate[j * ff..(j + 1) * ff],
                &mut up[j * ff..(j + 1) * ff],
            );
            self.lora_add(&mats[j][0], input, lora, g)?;
            self.lora_add(&mats[j][1], input, lora, u)?;
            if let Some(b) = &m.up_exps_bias {
                add_bias(u, &b[e * ff..(e + 1) * ff]);
            }
            if let Some(b) = &m.gate_exps_bias {
                add_bias(g, &b[e * ff..(e + 1) * ff]);
            }
            activate(act, g, Some(u));
        }
        {
            let mut projs: Vec<Projection<'_>> = mats
                .iter()
                .zip(slots.chunks_exact_mut(d))
                .map(|(w, y)| Projection {
                    w: &w[2],
                    data: self.weight(&w[2]),
                    out: y,
                })
                .collect();
            let xs: Vec<&[f32]> = gate.chunks_exact(ff).collect();
            matmul_each(&mut projs, &xs, 1)?;
        }
        for (j, &(e, _)) in sel.iter().enumerate() {
            let y = &mut slots[j * d..(j + 1) * d];
            self.lora_add(&mats[j][2], &gate[j * ff..(j + 1) * ff], lora, y)?;
            if let Some(b) = &m.down_exps_bias {
                add_bias(y, &b[e * d..(e + 1) * d]);
            }
        }
        Ok(())
    }
}

/// The experts one row chooses and their weights: the one routing rule of every MoE
/// architecture (llama.cpp `llm_graph_context::build_moe_ffn`; transformers
/// `Qwen2MoeSparseMoeBlock.forward`, `DeepseekV3TopkRouter`), its variants as parameters:
///
/// 1. scores: softmax of the router logits, or a sigmoid per expert ([`Gating`]);
/// 2. selection scores: the scores plus `selection_bias` where there is one (deepseek v3's
///    correction bias: used for choosing only, never as a weight);
/// 3. group-limited routing (`n_group > 0`): each group of `n_expert / n_group` experts
///    is ranked by the sum of its two best selection scores, and only the experts of the
///    best `n_group_used` groups stay eligible;
/// 4. the `n_used` best eligible selection scores (ties to the lower index), in
///    descending order;
/// 5. weights: their scores, renormalised to sum 1 where `norm_topk`, times
///    `weights_scale`.
pub fn route(logits: &[f32], selection_bias: Option<&[f32]>, mc: &MoeConfig) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    match mc.gating {
        Gating::Softmax => softmax(&mut p),
        Gating::Sigmoid => p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
    }
    let choice: Vec<f32> = match selection_bias {
        Some(b) => p.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => p.clone(),
    };
    let mut eligible = vec![true; p.len()];
    if let Some(per) = p.len().checked_div(mc.n_group) {
        let group_score = |g: usize| {
            let mut s: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
            s.sort_by(|a, b| b.total_cmp(a));
            s.iter().take(2).sum::<f32>()
        };
        let mut groups: Vec<usize> = (0..mc.n_group).collect();
        groups.sort_by(|&a, &b| group_score(b).total_cmp(&group_score(a)).then(a.cmp(&b)));
        eligible.iter_mut().for_each(|e| *e = false);
        for &g in &groups[..mc.n_group_used] {
            eligible[g * per..(g + 1) * per]
                .iter_mut()
                .for_each(|e| *e = true);
        }
    }
    let mut idx: Vec<usize> = (0..p.len()).filter(|&e| eligible[e]).collect();
    idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    idx.truncate(mc.n_used);
    let mut w: Vec<f32> = idx.iter().map(|&e| p[e]).collect();
    if mc.norm_topk {
        let sum: f32 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= sum);
    }
    if mc.weights_scale != 1.0 {
        w.iter_mut().for_each(|v| *v *= mc.weights_scale);
    }
    idx.into_iter().zip(w).collect()
}
