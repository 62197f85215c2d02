//! The dense feed-forward block (llama.cpp `llm_graph_context::build_ffn`; transformers
//! `LlamaMLP`, `GemmaMLP`, `Starcoder2MLP`): gated (`down(act(gate(x)) · up(x))`, gate and
//! up separate or fused) or plain (`down(act(up(x)))`), with the biases the file has. The
//! routed and shared experts of [`crate::blocks::moe`] are dense FFNs too.

use crate::arch::{Activation, Ffn};
use crate::blocks::{elems_per_task, rows_per_task};
use crate::error::Result;
use crate::kernels::{
    add_bias, gelu_erf_in_place, gelu_tanh, matmul, matmul_many, silu_in_place, swiglu_oai, Matrix,
    Projection, WeightData,
};
use crate::load::Loader;
use crate::lora::LoraRows;
use crate::model::Model;
use crate::pool;

/// A dense feed-forward block (`ffn_gate`, `ffn_up`, `ffn_down` and their biases), or a
/// shared expert (`*_shexp`).
#[derive(Clone, Debug)]
pub struct DenseFfn {
    /// `ffn_gate` (absent for plain and fused-gate FFNs).
    pub gate: Option<Matrix>,
    /// `ffn_up`: `n_ff` rows, or `2 · n_ff` (gate then up) for a fused gate.
    pub up: Matrix,
    pub down: Matrix,
    pub b_gate: Option<Vec<f32>>,
    pub b_up: Option<Vec<f32>>,
    pub b_down: Option<Vec<f32>>,
}

impl DenseFfn {
    /// Loads `{prefix}ffn_{gate,up,down}{suffix}.weight` (+ biases if present) of width
    /// `n_ff` and the given kind.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        prefix: &str,
        suffix: &str,
        n_ff: usize,
        n_embd: usize,
        kind: Ffn,
    ) -> Result<DenseFfn> {
        let name = |t: &str, what: &str| format!("{prefix}ffn_{t}{suffix}.{what}");
        let up_rows = match kind {
            Ffn::GatedFused => 2 * n_ff,
            _ => n_ff,
        };
        Ok(DenseFfn {
            gate: if kind == Ffn::Gated {
                Some(l.matrix(&name("gate", "weight"), n_ff, n_embd)?)
            } else {
                None
            },
            up: l.matrix(&name("up", "weight"), up_rows, n_embd)?,
            down: l.matrix(&name("down", "weight"), n_embd, n_ff)?,
            b_gate: l.vector_opt(&name("gate", "bias"), n_ff)?,
            b_up: l.vector_opt(&name("up", "bias"), up_rows)?,
            b_down: l.vector_opt(&name("down", "bias"), n_embd)?,
        })
    }

    /// The matrices it multiplies.
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        self.gate.iter().chain([&self.up, &self.down])
    }
}

/// In place over a slice: `x = act(x) · u` for the gated kinds (`Some(u)`), `act(x)` for
/// the plain one (`None`; gelu for every non-SiLU activation). SiLU on eight lanes. Each
/// element's value depends only on its own inputs.
pub(crate) fn activate(act: Activation, x: &mut [f32], u: Option<&[f32]>) {
    match (act, u) {
        (Activation::Silu, _) => silu_in_place(x, u),
        (Activation::GeluTanh, Some(u)) => x
            .iter_mut()
            .zip(u)
            .for_each(|(g, u)| *g = gelu_tanh(*g) * u),
        (Activation::SwigluOai, Some(u)) => x
            .iter_mut()
            .zip(u)
            .for_each(|(g, u)| *g = swiglu_oai(*g, *u)),
        (Activation::GeluErf, u) => gelu_erf_in_place(x, u),
        (Activation::GeluTanh | Activation::SwigluOai, None) => {
            x.iter_mut().for_each(|v| *v = gelu_tanh(*v))
        }
    }
}

impl Model {
    /// A dense FFN of width `nf` on `input` (`n × n_embd`), into `out`: gated
    /// (`down(act(gate) · up)`, gate and up from separate matrices or one fused matrix) or
    /// plain (`down(act(up))`), with the biases the file has, activation `act`. `gate` and
    /// `up` are scratch.
    /// `bytes` gives the gate, up and down matrices' bytes when they do not come from
    /// the file mapping (the expert cache); `lora` the adapters of the rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dense_ffn(
        &self,
        f: &DenseFfn,
        kind: Ffn,
        act: Activation,
        nf: usize,
        input: &[f32],
        n: usize,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        out: &mut [f32],
        bytes: Option<[&[u8]; 3]>,
        lora: &LoraRows,
    ) -> Result<()> {
        up.resize(n * f.up.rows, 0.0);
        gate.resize(n * nf, 0.0);
        let data = |i: usize, m: &Matrix| -> WeightData<'_> {
            match &bytes {
                Some(b) => WeightData::Stored(b[i]),
                None => self.weight(m),
            }
        };
        match &f.gate {
            Some(wg) => matmul_many(
                &mut [
                    Projection {
                        w: wg,
                        data: data(0, wg),
                        out: gate,
                    },
                    Projection {
                        w: &f.up,
                        data: data(1, &f.up),
                        out: up,
                    },
                ],
                input,
                n,
            )?,
            None => matmul(&f.up, data(1, &f.up), input, n, up)?,
        }
        if let Some(wg) = &f.gate {
            self.lora_add(wg, input, lora, gate)?;
        }
        self.lora_add(&f.up, input, lora, up)?;
        if let Some(b) = &f.b_up {
            add_bias(up, b);
        }
        if let Some(b) = &f.b_gate {
            add_bias(gate, b);
        }
        let activate = |x: &mut [f32], u: Option<&[f32]>| activate(act, x, u);
        let up = &*up;
        // Element-wise: even a decode step's one row is split over the threads.
        let per = elems_per_task(n * nf, nf);
        let rows = rows_per_task(n);
        match kind {
            Ffn::Gated => pool::for_each_chunk(gate, per, &|ci, part| {
                activate(part, Some(&up[ci * per..][..part.len()]));
            }),
            // Rows of 2·n_ff: the gate half, then the up half.
            Ffn::GatedFused => pool::for_each_chunk(gate, rows * nf, &|ci, part| {
                for (r, g) in part.chunks_exact_mut(nf).enumerate() {
                    let row = &up[(ci * rows + r) * 2 * nf..][..2 * nf];
                    let (gh, uh) = row.split_at(nf);
                    g.copy_from_slice(gh);
                    activate(g, Some(uh));
                }
            }),
            Ffn::Plain => pool::for_each_chunk(gate, per, &|ci, part| {
                part.copy_from_slice(&up[ci * per..][..part.len()]);
                activate(part, None);
            }),
        }
        matmul(&f.down, data(2, &f.down), gate, n, out)?;
        self.lora_add(&f.down, gate, lora, out)?;
        if let Some(b) = &f.b_down {
            add_bias(out, b);
        }
        Ok(())
    }
}
