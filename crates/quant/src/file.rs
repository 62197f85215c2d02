//! Quantizing a GGUF model file, tensor by tensor (llama.cpp src/llama-quant.cpp
//! `llama_model_quantize_impl`): the metadata copied with `general.file_type` and
//! `general.quantization_version` set and split keys removed, the tensors in llama.cpp's
//! order, each either copied or dequantized to f32 and quantized to its type
//! ([`crate::mix`]) in slabs of rows, so memory holds one slab, not the model.

use std::io::Write;

use frink_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};

use crate::mix::{tensor_order, Mix, MixModel, MixOptions, MixPlan, MixTensor};

/// `GGML_QNT_VERSION`, written as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// Values dequantized at once: a slab of rows of at most this many f32 (64 MiB).
const SLAB_VALUES: usize = 16 << 20;

/// One tensor of the output: its name, its input and output types and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// The tensor's name.
    pub name: String,
    /// Its type in the input.
    pub from: GgmlType,
    /// Its type in the output.
    pub to: GgmlType,
    /// `ne0` first.
    pub shape: Vec<u64>,
    /// Whether its quantizer needs an importance matrix (a `Q2_K_S` mix's Q2_K tensors).
    pub needs_imatrix: bool,
    /// The input shard holding it (0 unless the input is split).
    pub shard: usize,
    /// The type the mix's rules wanted, when its rows are not whole blocks of it and
    /// llama.cpp's fallback gave [`Planned::to`] instead.
    pub fallback_from: Option<GgmlType>,
}

impl Planned {
    /// This tensor's importance weights in `weights` ([`crate::imatrix::Imatrix::weights`]),
    /// as llama-quant.cpp looks them up: by name, `ne0 · ne2` values (one row of `ne0`
    /// per expert). `None` when the matrix has none (llama-quantize goes on without).
    ///
    /// # Errors
    /// Weights of another size (except for the token embeddings, where llama.cpp ignores
    /// them), or none for a tensor that needs them ([`Planned::needs_imatrix`]).
    pub fn weights<'a>(
        &self,
        weights: &'a std::collections::BTreeMap<String, Vec<f32>>,
    ) -> Result<Option<&'a [f32]>, String> {
        let want = self.shape[0] * self.shape.get(2).copied().unwrap_or(1);
        let token_embd =
            self.name == "token_embd.weight" || self.name == "per_layer_token_embd.weight";
        let found = match weights.get(&self.name) {
            Some(w) if w.len() as u64 == want => Some(w.as_slice()),
            Some(w) if !token_embd => {
                return Err(format!(
                    "{}: the importance matrix has {} values, the tensor needs {want}",
                    self.name,
                    w.len()
                ))
            }
            _ => None,
        };
        if found.is_none() && self.needs_imatrix {
            return Err(format!(
                "{}: no importance matrix entry, and its {} quantization needs one",
                self.name, self.to
            ));
        }
        Ok(found)
    }
}

/// What the mix rules read of `file`'s metadata.
pub fn mix_model(file: &GgufFile) -> MixModel {
    let arch = file.architecture().unwrap_or("").to_string();
    let key = |k: &str| file.get(&format!("{arch}.{k}"));
    let first = |k: &str| -> u32 {
        match key(k) {
            Some(MetaValue::Array(a)) => a.get(0).and_then(|v| v.as_u32()).unwrap_or(0),
            Some(v) => v.as_u32().unwrap_or(0),
            None => 0,
        }
    };
    let (n_head, n_head_kv) = (
        first("attention.head_count"),
        first("attention.head_count_kv"),
    );
    let n_head_kv = if key("attention.head_count_kv").is_none() {
        n_head
    } else {
        n_head_kv
    };
    let n_layer = first("block_count");
    MixModel {
        is_70b: arch == "llama" && n_layer == 80 && n_head != n_head_kv,
        n_gqa: n_head.checked_div(n_head_kv).unwrap_or(0),
        n_expert: first("expert_count"),
        n_layer,
        arch,
    }
}

/// The output's tensors in llama.cpp's order with the type each gets; with `keep_split`,
/// by input shard and place in it, as llama-quantize's `--keep-split` orders them.
///
/// Errors: a tensor the rules refuse ([`MixPlan::type_of`]), or a quantized input tensor
/// to be quantized again without `allow_requantize` (llama-quantize's
/// `--allow-requantize`: the result is worse than from the original).
pub fn plan(
    file: &GgufFile,
    mix: Mix,
    opts: &MixOptions,
    (allow_requantize, keep_split): (bool, bool),
) -> Result<Vec<Planned>, String> {
    let model = mix_model(file);
    let mut infos: Vec<(usize, &frink_gguf::TensorInfo)> = file
        .tensor_infos()
        .iter()
        .enumerate()
        .map(|(i, t)| (file.tensor_shard(i), t))
        .collect();
    infos.sort_by(|a, b| tensor_order(&a.1.name, &b.1.name));
    if keep_split {
        // llama-quant.cpp with `keep_split`: the tensors by shard, then by place in it,
        // and the rules see them in that order.
        infos.sort_by_key(|&(shard, t)| (shard, t.offset));
    }
    let names: Vec<&str> = infos.iter().map(|t| t.1.name.as_str()).collect();
    let mut rules = MixPlan::new(mix, opts, &model, &names);
    let mut out = Vec::with_capacity(infos.len());
    for (shard, t) in infos {
        let tensor = MixTensor {
            name: &t.name,
            ty: t.ggml_type,
            shape: &t.shape,
        };
        let (to, fallback_from) = rules.type_of(&tensor)?;
        if to != t.ggml_type {
            if !crate::quantize::QUANTIZABLE.contains(&to) {
                return Err(format!("{}: frink cannot write {to} tensors yet", t.name));
            }
            if !crate::is_supported(t.ggml_type) {
                return Err(format!(
                    "{}: frink cannot read {} tensors",
                    t.name, t.ggml_type
                ));
            }
            if !matches!(t.ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
                && !allow_requantize
            {
                return Err(format!(
                    "{}: requantizing from {} is refused without --allow-requantize",
                    t.name, t.ggml_type
                ));
            }
        }
        // Written with ggml's dimensions (`ggml_n_dims`: trailing 1s dropped), as gguf.cpp
        // writes a tensor's shape.
        let mut shape = t.shape.clone();
        while shape.len() > 1 && shape.last() == Some(&1) {
            shape.pop();
        }
        out.push(Planned {
            fallback_from,
            shard,
            needs_imatrix: to != t.ggml_type && rules.requires_imatrix(&t.name, to),
            name: t.name.clone(),
            from: t.ggml_type,
            to,
            shape,
        });
    }
    Ok(out)
}

/// The output's metadata: `file`'s, without split keys, then the quantization version,
/// the mix's `general.file_type` and `extra` (the imatrix provenance,
/// [`imatrix_metadata`]) at the end (gguf.cpp's `gguf_set_val_*` removes a key it sets
/// and appends it: the header comes out byte for byte as llama-quantize's).
pub fn metadata(file: &GgufFile, mix: Mix, extra: &[(String, MetaValue)]) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        let set_below = k == "general.quantization_version"
            || k == "general.file_type"
            || extra.iter().any(|(e, _)| e == k);
        if !k.starts_with("split.") && !set_below {
            w.add_metadata(k.clone(), v.clone());
        }
    }
    w.add_metadata(
        "general.quantization_version",
        MetaValue::U32(QUANTIZATION_VERSION),
    );
    w.add_metadata("general.file_type", MetaValue::U32(mix.file_type));
    for (k, v) in extra {
        w.add_metadata(k.clone(), v.clone());
    }
    w
}

/// The keys llama-quantize records when it quantizes with an importance matrix
/// (tools/quantize/quantize.cpp): `quantize.imatrix.file` (the path as given),
/// `quantize.imatrix.dataset` (the first dataset, when there is one), both cut to 127
/// bytes as its fixed buffer does; `quantize.imatrix.entries_count` (entries used, after
/// `--include-weights`/`--exclude-weights`) and `quantize.imatrix.chunks_count` (when
/// positive), as u32.
pub fn imatrix_metadata(
    path: &str,
    imatrix: &crate::imatrix::Imatrix,
    entries: usize,
) -> Vec<(String, MetaValue)> {
    let cut = |s: &str| {
        let mut end = s.len().min(127);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        MetaValue::String(s[..end].to_string())
    };
    let mut out = vec![("quantize.imatrix.file".to_string(), cut(path))];
    if let Some(d) = imatrix.datasets.first() {
        out.push(("quantize.imatrix.dataset".into(), cut(d)));
    }
    out.push((
        "quantize.imatrix.entries_count".into(),
        MetaValue::U32(entries as u32),
    ));
    if imatrix.chunk_count > 0 {
        out.push((
            "quantize.imatrix.chunks_count".into(),
            MetaValue::U32(imatrix.chunk_count),
        ));
    }
    out
}

/// Writes `t`'s output bytes to `sink`: its input bytes when the type stays, else slabs of
/// rows dequantized and quantized on `threads` threads (whole rows each), with the
/// importance weights `qw` ([`Planned::weights`]: a row of the tensor's columns per
/// expert) when given. `done(rows)` is told the rows written so far.
pub fn write_tensor(
    file: &GgufFile,
    t: &Planned,
    qw: Option<&[f32]>,
    threads: usize,
    sink: &mut dyn Write,
    done: &mut dyn FnMut(u64),
) -> std::io::Result<()> {
    let other = |e: String| std::io::Error::other(e);
    let data = file
        .tensor(&t.name)
        .ok_or_else(|| other(format!("{}: not in the file", t.name)))?
        .data;
    let n_rows: u64 = t.shape.iter().skip(1).product();
    if t.from == t.to {
        sink.write_all(data)?;
        done(n_rows);
        return Ok(());
    }
    let cols = t.shape[0] as usize;
    let (src_row, dst_row) = (row_bytes(t.from, cols)?, row_bytes(t.to, cols)?);
    let slab = (SLAB_VALUES / cols).max(1);
    let mut x = Vec::new();
    let mut q = Vec::new();
    let mut r0 = 0usize;
    while (r0 as u64) < n_rows {
        let n = slab.min(n_rows as usize - r0);
        x.resize(n * cols, 0f32);
        q.resize(n * dst_row, 0u8);
        let src = &data[r0 * src_row..(r0 + n) * src_row];
        let job = Rows {
            cols,
            src_row,
            dst_row,
            first: r0,
            per_expert: t.shape.get(1).map_or(1, |&r| r.max(1) as usize),
            qw,
        };
        job.run(threads, src, &mut x, &mut q, t).map_err(other)?;
        sink.write_all(&q)?;
        r0 += n;
        done(r0 as u64);
    }
    Ok(())
}

/// `src` (of type `ty`) as f32 in `x`: [`crate::dequantize`], except F16, widened by
/// `half`'s slice conversion (F16C where the CPU has it; exact either way, so the same
/// bits), a third of an F16 model's Q8_0 quantization time element by element.
fn widen(ty: GgmlType, src: &[u8], x: &mut [f32]) -> Result<(), crate::QuantError> {
    if ty != GgmlType::F16 || src.len() != 2 * x.len() {
        return crate::dequantize(ty, src, x);
    }
    use half::slice::HalfFloatSliceExt;
    let h: Vec<half::f16> = src
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
        .collect();
    h.convert_to_f32_slice(x);
    Ok(())
}

fn row_bytes(ty: GgmlType, cols: usize) -> std::io::Result<usize> {
    ty.row_bytes(cols as u64)
        .map(|b| b as usize)
        .ok_or_else(|| std::io::Error::other(format!("rows of {cols} are not whole {ty} blocks")))
}

/// A slab of rows to dequantize and quantize.
struct Rows<'a> {
    cols: usize,
    src_row: usize,
    dst_row: usize,
    /// The slab's first row in the tensor.
    first: usize,
    /// Rows per expert (`ne1`): row `r`'s importance weights are expert `r / per_expert`'s.
    per_expert: usize,
    qw: Option<&'a [f32]>,
}

impl Rows<'_> {
    /// Dequantizes and quantizes the rows of `src` into `q`, `threads` row ranges at once.
    fn run(
        &self,
        threads: usize,
        src: &[u8],
        x: &mut [f32],
        q: &mut [u8],
        t: &Planned,
    ) -> Result<(), String> {
        let (cols, n) = (self.cols, x.len() / self.cols);
        let per = n.div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            let jobs: Vec<_> = x
                .chunks_mut(per * cols)
                .zip(q.chunks_mut(per * self.dst_row))
                .zip(src.chunks(per * self.src_row))
                .enumerate()
                .map(|(i, ((x, q), src))| {
                    std::thread::Builder::new().spawn_scoped(s, move || -> Result<(), String> {
                        widen(t.from, src, x).map_err(|e| e.to_string())?;
                        let first = self.first + i * per;
                        if let Some(bad) = x.iter().position(|v| !v.is_finite()) {
                            return Err(format!(
                                "{}: row {} holds {} (llama-quantize refuses rows that are \
                                 not finite too)",
                                t.name,
                                first + bad / cols,
                                x[bad]
                            ));
                        }
                        self.quantize(t.to, first, x, q)
                    })
                })
                .collect();
            jobs.into_iter().try_for_each(|j| {
                let j = j.map_err(|e| format!("cannot start a quantizer thread: {e}"))?;
                j.join()
                    .unwrap_or_else(|_| Err("a quantizer thread failed".into()))
            })
        })
    }

    /// Quantizes rows `first..` (`x`) into `q`, each with its expert's weights.
    fn quantize(&self, ty: GgmlType, first: usize, x: &[f32], q: &mut [u8]) -> Result<(), String> {
        let Some(qw) = self.qw else {
            return crate::quantize::quantize(ty, x, q).map_err(|e| e.to_string());
        };
        let rows = x.len() / self.cols;
        let mut r = 0;
        while r < rows {
            let expert = (first + r) / self.per_expert;
            // The rows of this expert in the range.
            let end = rows.min((expert + 1) * self.per_expert - first);
            let w = qw
                .get(expert * self.cols..(expert + 1) * self.cols)
                .ok_or_else(|| format!("no importance weights for expert {expert}"))?;
            crate::quantize::quantize_weighted(
                ty,
                &x[r * self.cols..end * self.cols],
                w,
                &mut q[r * self.dst_row..end * self.dst_row],
            )
            .map_err(|e| e.to_string())?;
            r = end;
        }
        Ok(())
    }
}
