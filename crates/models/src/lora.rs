//! LoRA adapters in llama.cpp's GGUF form (`convert_lora_to_gguf.py`; the rules of
//! llama.cpp `src/llama-adapter.cpp`, `llama_adapter_lora_init_impl`, and of its graphs'
//! `build_lora_mm`): `general.type = "adapter"`, `adapter.type = "lora"`,
//! `adapter.lora.alpha`, and per adapted base matrix `W` (`<name>`) a pair
//! `<name>.lora_a` (GGUF shape `[n_in, r]`) and `<name>.lora_b` (`[r, n_out]`), so that
//! `y = W·x + s · B·(A·x)` with `s = user_scale · alpha / r` (`user_scale` alone when the
//! file has no alpha). For `token_embd.weight` the two are swapped: `lora_a` is `[r,
//! n_vocab]` (a row per token) and the lookup of token `t` gains `s · B·a_t`.
//!
//! Adapters are applied, never merged: the base weights stay as mapped, and each sequence
//! of a batch names its own adapters and scales ([`crate::Sequence::lora`]).

use std::collections::HashMap;
use std::path::Path;

use frink_gguf::{GgmlType, GgufFile};

use crate::error::{ModelError, Result};
use crate::kernels::{dot_multi_keys, weighted_sum_multi, KvData, KvRows, Matrix};
use crate::model::Model;

/// One adapted matrix: `a` is `A`, `rank × n_in` (for `token_embd` the `n_vocab × rank`
/// table), `bt` is `Bᵀ`, `rank × n_out`, each row-major.
#[derive(Clone, Debug)]
pub struct LoraWeight {
    pub a: LoraData,
    pub bt: LoraData,
    pub rank: usize,
}

/// The elements of one LoRA half as kept in memory: F16 tensors as they are (half the
/// bytes each decode step streams per adapter, read by widening, which is exact), every
/// other type (F32, BF16, Q8_0) dequantized to f32, exactly.
#[derive(Clone, Debug, PartialEq)]
pub enum LoraData {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
}

impl LoraData {
    /// `values` (the dequantized tensor, or one expert's part of it) kept as a tensor of
    /// type `ty` is kept: f16 when `ty` is F16 (the conversion back is exact), else f32.
    fn new(ty: GgmlType, values: &[f32]) -> LoraData {
        match ty {
            GgmlType::F16 => {
                LoraData::F16(values.iter().map(|&v| half::f16::from_f32(v)).collect())
            }
            _ => LoraData::F32(values.to_vec()),
        }
    }

    /// Its rows of `width` elements, as the attention kernels read them.
    fn rows(&self, width: usize) -> KvRows<'_> {
        let data = match self {
            LoraData::F32(v) => KvData::F32(v),
            LoraData::F16(v) => KvData::F16(v),
        };
        KvRows::new(data, 0, width)
    }

    /// Elements `range`, as f32.
    fn slice_f32(&self, range: std::ops::Range<usize>) -> Vec<f32> {
        match self {
            LoraData::F32(v) => v[range].to_vec(),
            LoraData::F16(v) => v[range].iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// A loaded LoRA adapter.
pub struct LoraAdapter {
    /// Where it was read from (what `/lora-adapters` reports).
    pub path: String,
    pub file: GgufFile,
    /// `adapter.lora.alpha` (0: absent).
    pub alpha: f32,
    /// The adapted base matrices, by their tensor index in the base file and the expert
    /// (0 for a plain matrix; each expert of a stacked `*_exps` tensor its own).
    pub weights: HashMap<(usize, usize), LoraWeight>,
    /// The adapted base tensors' names, in the adapter file's order.
    pub targets: Vec<String>,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("path", &self.path)
            .field("alpha", &self.alpha)
            .field("targets", &self.targets.len())
            .finish()
    }
}

/// The adapter types frink multiplies (llama.cpp accepts the same for LoRA tensors).
const LORA_TYPES: [GgmlType; 4] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0];

fn bad(name: &str, detail: impl Into<String>) -> ModelError {
    ModelError::Tensor {
        name: name.into(),
        detail: detail.into(),
    }
}

impl LoraAdapter {
    /// Reads the adapter at `path` for `model`.
    ///
    /// Errors: [`ModelError::Metadata`] for a file that is not a LoRA adapter or is for
    /// another architecture; [`ModelError::Tensor`] naming the tensor for one that is not
    /// a `.lora_a`/`.lora_b` of an existing base matrix, a pair missing its other half,
    /// shapes that do not fit the base matrix (per expert for a stacked tensor), an
    /// unsupported type, or a matrix frink does not adapt; the reader's errors for a
    /// truncated or hostile file.
    pub fn load(path: impl AsRef<Path>, model: &Model) -> Result<LoraAdapter> {
        let path = path.as_ref();
        Self::from_gguf(GgufFile::open(path)?, path.display().to_string(), model)
    }

    /// As [`LoraAdapter::load`], from an opened file (`path` is what it reports).
    pub fn from_gguf(file: GgufFile, path: String, model: &Model) -> Result<LoraAdapter> {
        let meta_err = |key: &str, detail: String| ModelError::Metadata {
            key: key.into(),
            detail,
        };
        let text = |key: &str| file.get(key).and_then(|v| v.as_str()).map(str::to_string);
        match text("general.type").as_deref() {
            Some("adapter") => {}
            other => {
                return Err(meta_err(
                    "general.type",
                    format!("{other:?}, expected \"adapter\" (a LoRA adapter file)"),
                ))
            }
        }
        match text("adapter.type").as_deref() {
            Some("lora") => {}
            other => {
                return Err(meta_err(
                    "adapter.type",
                    format!("{other:?}, expected \"lora\""),
                ))
            }
        }
        let base_arch = model.config.arch.name;
        match text("general.architecture") {
            Some(a) if a == base_arch => {}
            other => {
                return Err(meta_err(
                    "general.architecture",
                    format!("{other:?}, but the base model is {base_arch:?}"),
                ))
            }
        }
        let alpha = match file.get("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => match v.as_f32() {
                Some(a) if a.is_finite() && a >= 0.0 => a,
                _ => {
                    return Err(meta_err(
                        "adapter.lora.alpha",
                        format!("{v} is not a non-negative number"),
                    ))
                }
            },
        };
        // Pair the halves by base tensor name, in file order.
        let mut pairs: Vec<(String, Option<usize>, Option<usize>)> = Vec::new();
        for (i, t) in file.tensor_infos().iter().enumerate() {
            let (base, is_a) = if let Some(b) = t.name.strip_suffix(".lora_a") {
                (b, true)
            } else if let Some(b) = t.name.strip_suffix(".lora_b") {
                (b, false)
            } else {
                return Err(bad(
                    &t.name,
                    "not a LoRA tensor (expected a .lora_a or .lora_b suffix)",
                ));
            };
            let at = match pairs.iter().position(|p| p.0 == base) {
                Some(at) => at,
                None => {
                    pairs.push((base.to_string(), None, None));
                    pairs.len() - 1
                }
            };
            let slot = if is_a {
                &mut pairs[at].1
            } else {
                &mut pairs[at].2
            };
            if slot.replace(i).is_some() {
                return Err(bad(&t.name, "given twice"));
            }
        }
        let base = &model.file;
        let adaptable = model.adaptable_tensors();
        let mut weights = HashMap::new();
        let mut targets = Vec::new();
        for (name, a, b) in pairs {
            let (Some(a), Some(b)) = (a, b) else {
                let half = if a.is_none() { "lora_a" } else { "lora_b" };
                return Err(bad(&name, format!("the LoRA pair has no {half}")));
            };
            let Some(bi) = base.tensor_index(&name) else {
                return Err(bad(&name, "an adapter tensor naming no base matrix"));
            };
            let (ta, tb) = (&file.tensor_infos()[a], &file.tensor_infos()[b]);
            let wshape = &base.tensor_infos()[bi].shape;
            for t in [ta, tb] {
                if !LORA_TYPES.contains(&t.ggml_type) {
                    return Err(bad(
                        &t.name,
                        format!(
                            "type {} (LoRA tensors are F32, F16, BF16 or Q8_0)",
                            t.ggml_type
                        ),
                    ));
                }
                if t.shape.len() != wshape.len() {
                    return Err(bad(
                        &t.name,
                        format!("shape {:?}, but the base matrix is {wshape:?}", t.shape),
                    ));
                }
            }
            // Stacked experts (`[n_in, n_out, n_expert]`): A `[n_in, r, n_expert]` and B
            // `[r, n_out, n_expert]`, one pair per expert (llama.cpp `build_lora_mm_id`).
            let n_expert = match wshape.len() {
                2 => 1,
                3 if ta.shape[2] == wshape[2] && tb.shape[2] == wshape[2] => wshape[2] as usize,
                _ => {
                    return Err(bad(
                        &name,
                        format!(
                            "lora_a {:?} and lora_b {:?} do not fit the base tensor {wshape:?}",
                            ta.shape, tb.shape
                        ),
                    ))
                }
            };
            if !adaptable.contains(&bi) {
                return Err(bad(
                    &name,
                    "LoRA on this matrix is not supported (frink applies adapters to attention's Q/K/V and output, dense, shared and routed expert FFNs, the LM head and the token embeddings)",
                ));
            }
            let token_embd = name == "token_embd.weight";
            // GGUF order ne0 first: W [n_in, n_out]; A [n_in, r], B [r, n_out]; for
            // token_embd W [n_embd, n_vocab], A [r, n_vocab], B [r, n_embd].
            let (n_in, n_out) = (wshape[0] as usize, wshape[1] as usize);
            let rank = tb.shape[0] as usize;
            let fits = if token_embd {
                ta.shape[..2] == [rank as u64, n_out as u64]
                    && tb.shape[..2] == [rank as u64, n_in as u64]
            } else {
                ta.shape[..2] == [n_in as u64, rank as u64]
                    && tb.shape[..2] == [rank as u64, n_out as u64]
            };
            if !fits || rank == 0 {
                return Err(bad(
                    &name,
                    format!(
                        "lora_a {:?} and lora_b {:?} do not fit the base matrix {wshape:?}",
                        ta.shape, tb.shape
                    ),
                ));
            }
            if token_embd && model.weights.output.tensor == bi {
                return Err(bad(
                    &name,
                    "LoRA on token_embd of a model whose LM head is tied to it",
                ));
            }
            let a_all = frink_quant::dequantize_tensor(&file.tensor_at(a))?;
            let b_all = frink_quant::dequantize_tensor(&file.tensor_at(b))?;
            let (per_a, per_b) = (a_all.len() / n_expert, b_all.len() / n_expert);
            for e in 0..n_expert {
                // B is stored n_out rows of rank values; kept transposed.
                let b_rows = &b_all[e * per_b..(e + 1) * per_b];
                let n_b_out = b_rows.len() / rank;
                let mut bt = vec![0f32; b_rows.len()];
                for (o, row) in b_rows.chunks_exact(rank).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        bt[j * n_b_out + o] = v;
                    }
                }
                weights.insert(
                    (bi, e),
                    LoraWeight {
                        a: LoraData::new(ta.ggml_type, &a_all[e * per_a..(e + 1) * per_a]),
                        bt: LoraData::new(tb.ggml_type, &bt),
                        rank,
                    },
                );
            }
            targets.push(name);
        }
        Ok(LoraAdapter {
            path,
            file,
            alpha,
            weights,
            targets,
        })
    }

    /// The factor on `B·(A·x)` at user scale `scale` for a matrix of rank `rank`:
    /// `scale · alpha / rank`, or `scale` without an alpha (llama.cpp `build_lora_mm`).
    pub fn factor(&self, scale: f32, rank: usize) -> f32 {
        if self.alpha == 0.0 {
            scale
        } else {
            scale * self.alpha / rank as f32
        }
    }
}

/// Each row's adapters in a forward call: (adapter, user scale) per batch row (rows of
/// scale 0 are left out: they compute exactly the base model).
#[derive(Default)]
pub(crate) struct LoraRows {
    per_row: Vec<Vec<(usize, f32)>>,
    any: bool,
}

impl LoraRows {
    /// The rows of each sequence (`rows.of(si)`) with that sequence's adapters.
    pub fn new(sets: &[&[(usize, f32)]], rows: &crate::blocks::Rows<'_>) -> LoraRows {
        // Without an applied adapter (the common case) nothing is built per row.
        if sets.iter().all(|set| set.iter().all(|e| e.1 == 0.0)) {
            return LoraRows::default();
        }
        let mut per_row = vec![Vec::new(); rows.n()];
        for (si, set) in sets.iter().enumerate() {
            let used: Vec<(usize, f32)> = set.iter().copied().filter(|e| e.1 != 0.0).collect();
            for r in rows.of(si) {
                per_row[r].clone_from(&used);
            }
        }
        let any = per_row.iter().any(|r| !r.is_empty());
        LoraRows { per_row, any }
    }

    /// The rows `rows` (batch rows, in this order) as rows `0..` of a gathered input (an
    /// expert's rows).
    pub fn gather(&self, rows: impl Iterator<Item = usize>) -> LoraRows {
        if !self.any {
            return LoraRows::default();
        }
        let per_row = rows.map(|r| self.per_row[r].clone()).collect();
        LoraRows { per_row, any: true }
    }

    /// The same over a subset of the rows: `map[r]` is row `r`'s index in the subset, if
    /// it is in it.
    pub fn select(&self, map: &[Option<usize>]) -> LoraRows {
        let n = map.iter().flatten().count();
        let mut per_row = vec![Vec::new(); n];
        for (r, at) in map.iter().enumerate() {
            if let (Some(i), Some(set)) = (at, self.per_row.get(r)) {
                per_row[*i].clone_from(set);
            }
        }
        LoraRows {
            per_row,
            any: self.any,
        }
    }
}

impl Model {
    /// The base tensors adapters may change: where [`Model::lora_add`] runs (attention's
    /// Q/K/V, fused QKV and output projections outside MLA, dense, shared-expert and
    /// routed-expert FFN matrices, the LM head) and the token embeddings
    /// ([`Model::lora_embed`]).
    pub fn adaptable_tensors(&self) -> Vec<usize> {
        use crate::blocks::attention::QkvWeights;
        use crate::blocks::{FfnWeights, MixerWeights};
        let w = &self.weights;
        let mut out = vec![w.token_embd.tensor, w.output.tensor];
        fn mixer(m: &MixerWeights, out: &mut Vec<usize>) {
            match m {
                MixerWeights::Attention(a) => {
                    match &a.qkv {
                        QkvWeights::Separate { wq, wk, wv } => {
                            out.extend([wq.tensor, wk.tensor, wv.tensor])
                        }
                        QkvWeights::QueryOnly(m) | QkvWeights::Fused(m) => out.push(m.tensor),
                        QkvWeights::Mla(_) => return,
                    }
                    out.push(a.wo.tensor);
                }
                MixerWeights::Parallel(a, b) => {
                    mixer(a, out);
                    mixer(b, out);
                }
                _ => {}
            }
        }
        for l in &w.layers {
            mixer(&l.mixer, &mut out);
            let dense = match &l.ffn {
                FfnWeights::Dense(d) => Some(d),
                FfnWeights::Moe(m) => m.shared.as_ref(),
                FfnWeights::None => None,
            };
            if let Some(d) = dense {
                out.extend(d.matrices().map(|m| m.tensor));
            }
            if let FfnWeights::Moe(m) = &l.ffn {
                out.extend([&m.gate_exps, &m.up_exps, &m.down_exps].map(|e| e.first.tensor));
            }
        }
        out
    }

    /// Adds every adapter's `s · B·(A·x)` for matrix `w` to `out` (`n × w.rows`), on the
    /// rows of `x` (`n × w.cols`) whose sequences use it: the base product was computed
    /// once for all rows, each row's low-rank product with its own adapters, the rows
    /// split over the compute pool (one dispatch per matrix, whatever the adapters). A
    /// row's result depends only on its own input and adapters.
    pub(crate) fn lora_add(
        &self,
        w: &Matrix,
        x: &[f32],
        lora: &LoraRows,
        out: &mut [f32],
    ) -> Result<()> {
        if !lora.any {
            return Ok(());
        }
        // Expert e of a stacked tensor starts e matrices into it.
        let key = (w.tensor, w.place());
        let adapts = |ai: usize| self.adapters[ai].weights.contains_key(&key);
        if !lora.per_row.iter().flatten().any(|&(ai, _)| adapts(ai)) {
            return Ok(());
        }
        let (n_in, n_out) = (w.cols, w.rows);
        let rows = crate::blocks::rows_per_task(out.len() / n_out);
        crate::pool::for_each_chunk(out, rows * n_out, &|ci, part| {
            let mut t = Vec::new();
            for (k, orow) in part.chunks_exact_mut(n_out).enumerate() {
                let r = ci * rows + k;
                let xr = &x[r * n_in..(r + 1) * n_in];
                for &(ai, scale) in &lora.per_row[r] {
                    let ad = &self.adapters[ai];
                    let Some(lw) = ad.weights.get(&key) else {
                        continue;
                    };
                    // t = A·x (each element `dot`'s bits), then out += Σ_j (f·t_j)·(Bᵀ)_j
                    // (`axpy`'s bits per j, in order).
                    t.clear();
                    t.resize(lw.rank, 0.0);
                    dot_multi_keys([xr], lw.a.rows(n_in), 0..lw.rank, [&mut t[..]]);
                    let f = ad.factor(scale, lw.rank);
                    t.iter_mut().for_each(|tj| *tj *= f);
                    weighted_sum_multi([&mut *orow], [&t[..]], lw.bt.rows(n_out), 0..lw.rank);
                }
            }
        });
        Ok(())
    }

    /// Adds the adapters' token-embedding deltas `s · B·a_t` to the embedded rows `x`
    /// (`n × n_embd`) of `tokens`.
    pub(crate) fn lora_embed(&self, tokens: &[u32], lora: &LoraRows, x: &mut [f32]) -> Result<()> {
        if !lora.any {
            return Ok(());
        }
        let d = self.config.n_embd;
        let e = self.weights.token_embd.tensor;
        for (r, set) in lora.per_row.iter().enumerate() {
            for &(ai, scale) in set {
                let ad = &self.adapters[ai];
                let Some(lw) = ad.weights.get(&(e, 0)) else {
                    continue;
                };
                let f = ad.factor(scale, lw.rank);
                let start = tokens[r] as usize * lw.rank;
                let mut p = lw.a.slice_f32(start..start + lw.rank);
                p.iter_mut().for_each(|aj| *aj *= f);
                let xr = &mut x[r * d..(r + 1) * d];
                weighted_sum_multi([xr], [&p[..]], lw.bt.rows(d), 0..lw.rank);
            }
        }
        Ok(())
    }
}
