//! `frink quantize IN.gguf OUT.gguf TYPE [THREADS]`: llama-quantize's job, with its names,
//! rules and options (frink-quant's `mix` and `file`): which type each tensor gets in the
//! mix, the same bytes for the same input (tested against llama-quantize's), tensor by
//! tensor in slabs of rows, with a progress bar.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use frink_gguf::{GgmlType, GgufFile};
use std::collections::BTreeMap;

use frink_quant::file::{imatrix_metadata, metadata, plan, write_tensor, Planned};
use frink_quant::imatrix::Imatrix;
use frink_quant::mix::{Mix, MixOptions};

/// Flags of `frink quantize` (llama-quantize's).
#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The model to quantize (a GGUF file, or a catalog name).
    pub input: String,
    /// Where the quantized model goes (refused if it is the input).
    pub output: PathBuf,
    /// The mix (llama-quantize's names): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q2_K_S,
    /// Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ1_S, IQ1_M, IQ2_XXS,
    /// IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS, IQ3_XS, IQ3_S, IQ3_M, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0,
    /// MXFP4_MOE, F16, BF16 or F32. Q2_K_S and the IQ1/IQ2 mixes, IQ3_XXS and IQ3_XS need
    /// --imatrix.
    #[arg(value_name = "TYPE")]
    pub mix: String,
    /// Threads (llama-quantize's optional fourth argument; default: the cores).
    #[arg(value_name = "THREADS")]
    pub threads_arg: Option<usize>,
    /// Threads (default: the cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Quantize tensors that are already quantized (from their dequantized values).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Keep output.weight as it is.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Every quantizable tensor of the mix's type (no per-tensor rules).
    #[arg(long)]
    pub pure: bool,
    /// The type of output.weight.
    #[arg(long, value_name = "TYPE", value_parser = ggml_type)]
    pub output_tensor_type: Option<GgmlType>,
    /// The type of the token embeddings.
    #[arg(long, value_name = "TYPE", value_parser = ggml_type)]
    pub token_embedding_type: Option<GgmlType>,
    /// PATTERN=TYPE: a tensor in whose name the regex PATTERN is found gets TYPE
    /// (repeatable; the first that matches wins).
    #[arg(long = "tensor-type", value_name = "PATTERN=TYPE")]
    pub tensor_type: Vec<String>,
    /// An importance matrix (GGUF or legacy .dat, from `frink imatrix` or llama-imatrix):
    /// the quantizers weigh each column by it.
    #[arg(long)]
    pub imatrix: Option<String>,
    /// Use the importance matrix only for tensors whose name contains this (repeatable).
    #[arg(long = "include-weights", value_name = "NAME")]
    pub include_weights: Vec<String>,
    /// Do not use the importance matrix for tensors whose name contains this
    /// (repeatable; applied before --include-weights).
    #[arg(long = "exclude-weights", value_name = "NAME")]
    pub exclude_weights: Vec<String>,
    /// Write one output shard per input shard, each tensor in its input's shard, named
    /// `OUT-00001-of-0000N.gguf` (a `.gguf` ending of OUT dropped), as llama-quantize does;
    /// the mix's rules then see the tensors in the shards' order.
    #[arg(long)]
    pub keep_split: bool,
}

/// Quantizer threads at most: more only adds thread starts (a slab is split in as many
/// row ranges).
const MAX_THREADS: usize = 256;

/// A ggml type by llama.cpp's name (`q4_k`, `Q8_0`, `f16`).
fn ggml_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s)
        .filter(|t| frink_quant::quantize::QUANTIZABLE.contains(t))
        .ok_or_else(|| format!("{s:?} is not a tensor type frink writes"))
}

impl QuantizeArgs {
    /// The options that choose tensor types.
    fn mix_options(&self, has_imatrix: bool) -> Result<MixOptions> {
        let mut tensor_types = Vec::new();
        for spec in &self.tensor_type {
            let (pat, ty) = spec
                .rsplit_once('=')
                .with_context(|| format!("--tensor-type {spec:?}: expected PATTERN=TYPE"))?;
            let re = regex::Regex::new(pat)
                .with_context(|| format!("--tensor-type {spec:?}: the pattern"))?;
            let ty = ggml_type(ty).map_err(|e| anyhow::anyhow!("--tensor-type {spec:?}: {e}"))?;
            let m: frink_quant::mix::NameMatcher = Box::new(move |n| re.is_match(n));
            tensor_types.push((m, ty));
        }
        Ok(MixOptions {
            pure: self.pure,
            leave_output: self.leave_output_tensor,
            output_type: self.output_tensor_type,
            token_embedding_type: self.token_embedding_type,
            tensor_types,
            has_imatrix,
        })
    }

    /// The importance matrix, its per-tensor weights after `--exclude-weights` and
    /// `--include-weights` (llama-quantize's `prepare_imatrix`: substrings of the names,
    /// exclusions first), and the provenance keys for the output.
    fn imatrix(&self) -> Result<Option<ImatrixUse>> {
        let Some(path) = &self.imatrix else {
            if !self.include_weights.is_empty() || !self.exclude_weights.is_empty() {
                bail!("--include-weights/--exclude-weights filter an importance matrix: give --imatrix FILE");
            }
            return Ok(None);
        };
        let m = Imatrix::read(path)?;
        let mut weights = m.weights().map_err(anyhow::Error::msg)?;
        weights.retain(|name, _| {
            !self
                .exclude_weights
                .iter()
                .any(|x| name.contains(x.as_str()))
        });
        if !self.include_weights.is_empty() {
            weights.retain(|name, _| {
                self.include_weights
                    .iter()
                    .any(|x| name.contains(x.as_str()))
            });
        }
        if weights.is_empty() {
            bail!(
                "--include-weights/--exclude-weights left none of the {} entries of {path}",
                m.entries.len()
            );
        }
        let keys = imatrix_metadata(path, &m, weights.len());
        eprintln!(
            "importance matrix {path}: {} entries, {} chunks{}",
            weights.len(),
            m.chunk_count,
            m.datasets
                .first()
                .map(|d| format!(" of {}", d.escape_debug()))
                .unwrap_or_default()
        );
        Ok(Some(ImatrixUse { weights, keys }))
    }
}

/// An importance matrix as `frink quantize` uses it.
struct ImatrixUse {
    /// Per-column weights by tensor name.
    weights: std::collections::BTreeMap<String, Vec<f32>>,
    /// The provenance keys written to the output.
    keys: Vec<(String, frink_gguf::MetaValue)>,
}

/// Runs `frink quantize`: plans every tensor's type, then writes the file.
///
/// Errors: a mix or option frink refuses, a tensor the rules refuse, or I/O.
pub fn run(args: &QuantizeArgs) -> Result<()> {
    let mix = Mix::parse(&args.mix).map_err(anyhow::Error::msg)?;
    let input = frink_store::Store::from_env()?.resolve(&args.input)?;
    let file =
        GgufFile::open(&input).with_context(|| format!("cannot read {}", input.display()))?;
    if file.architecture().is_none() {
        bail!(
            "{}: no general.architecture: not a model file (an importance matrix goes to --imatrix)",
            input.display()
        );
    }
    let mut inputs = file.shard_paths(&input);
    inputs.extend(args.imatrix.iter().map(PathBuf::from));
    let imatrix = args.imatrix()?;
    let opts = args.mix_options(imatrix.is_some())?;
    let tensors = plan(&file, mix, &opts, (args.allow_requantize, args.keep_split))
        .map_err(anyhow::Error::msg)?;
    let no_weights = BTreeMap::new();
    let weights = imatrix.as_ref().map_or(&no_weights, |m| &m.weights);
    let mut unweighted = Vec::new();
    for t in tensors.iter().filter(|t| t.to != t.from) {
        if t.weights(weights).map_err(anyhow::Error::msg)?.is_none() {
            if frink_quant::quantize::NEED_IMATRIX.contains(&t.to) {
                bail!(
                    "{}: {} needs importance weights, and {} has none for it",
                    t.name,
                    t.to,
                    args.imatrix.as_deref().unwrap_or("no --imatrix")
                );
            }
            if imatrix.is_some() {
                unweighted.push(t.name.as_str());
            }
        }
    }
    let threads = args
        .threads
        .or(args.threads_arg)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, MAX_THREADS);
    let keys = imatrix.as_ref().map_or(&[][..], |m| &m.keys[..]);
    let outputs = shards(&file, (mix, keys), &tensors, &args.output, args.keep_split);
    for o in &outputs {
        crate::output::check(&o.0, &inputs)?;
    }
    let names: Vec<String> = outputs.iter().map(|o| o.0.display().to_string()).collect();
    write(&file, outputs, weights, threads)?;
    if !unweighted.is_empty() {
        eprintln!(
            "no importance weights for {} tensors (quantized without): {}",
            unweighted.len(),
            few(&unweighted)
        );
    }
    report_types(&tensors);
    let size = |t: &[Planned], to: bool| -> u64 {
        t.iter()
            .map(|p| {
                let ty = if to { p.to } else { p.from };
                let n: u64 = p.shape.iter().skip(1).product();
                ty.row_bytes(p.shape[0]).unwrap_or(0) * n
            })
            .sum()
    };
    eprintln!(
        "{}: {} → {} ({:.2} MiB → {:.2} MiB, {threads} threads)",
        mix.name,
        input.display(),
        names.join(", "),
        size(&tensors, false) as f64 / 1048576.0,
        size(&tensors, true) as f64 / 1048576.0,
    );
    Ok(())
}

/// The first few of `names`, and how many more.
fn few(names: &[&str]) -> String {
    const SHOWN: usize = 6;
    let mut s = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        s += &format!(" and {} more", names.len() - SHOWN);
    }
    s
}

/// Prints how many tensors got each type, and the fallbacks: tensors whose rows are not
/// whole blocks of the type the mix wanted (llama-quantize's "falling back" lines).
fn report_types(tensors: &[Planned]) {
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    let mut fallbacks: BTreeMap<(String, String), usize> = BTreeMap::new();
    for t in tensors {
        *by_type.entry(t.to.to_string()).or_default() += 1;
        if let Some(from) = t.fallback_from {
            *fallbacks
                .entry((from.to_string(), t.to.to_string()))
                .or_default() += 1;
        }
    }
    let list = |m: Vec<String>| m.join(", ");
    eprintln!(
        "tensor types: {}",
        list(by_type.iter().map(|(t, n)| format!("{n} {t}")).collect())
    );
    if !fallbacks.is_empty() {
        eprintln!(
            "fallbacks (rows that are not whole blocks of the mix's type): {}",
            list(
                fallbacks
                    .iter()
                    .map(|((a, b), n)| format!("{n} {a} → {b}"))
                    .collect()
            )
        );
    }
}

/// One output file: where it goes, its header and its tensors.
type Output<'a> = (PathBuf, frink_gguf::GgufWriter, Vec<&'a Planned>);

/// The output files: one, or with `--keep-split` one per input shard named as
/// llama-quantize names them (`OUT-00001-of-00003.gguf`, from the output as given), the
/// first with the metadata and, when there are several, each with `split.no`,
/// `split.count` and `split.tensors.count` (llama-quant.cpp).
fn shards<'a>(
    file: &GgufFile,
    (mix, keys): (Mix, &[(String, frink_gguf::MetaValue)]),
    tensors: &'a [Planned],
    out: &std::path::Path,
    keep_split: bool,
) -> Vec<Output<'a>> {
    use frink_gguf::{GgufWriter, MetaValue};
    if !keep_split {
        return vec![(
            out.to_path_buf(),
            metadata(file, mix, keys),
            tensors.iter().collect(),
        )];
    }
    let n = tensors.iter().map(|t| t.shard + 1).max().unwrap_or(1);
    // llama-quantize drops a `.gguf` ending before adding the shard suffix.
    let out = out.display().to_string();
    let prefix = out.strip_suffix(".gguf").unwrap_or(&out);
    (0..n)
        .map(|i| {
            let mut w = if i == 0 {
                metadata(file, mix, keys)
            } else {
                GgufWriter::new()
            };
            if n > 1 {
                w.add_metadata("split.no", MetaValue::U16(i as u16));
                w.add_metadata("split.count", MetaValue::U16(n as u16));
                w.add_metadata("split.tensors.count", MetaValue::I32(tensors.len() as i32));
            }
            let path = PathBuf::from(format!("{prefix}-{:05}-of-{n:05}.gguf", i + 1));
            (path, w, tensors.iter().filter(|t| t.shard == i).collect())
        })
        .collect()
}

/// Writes each output to a temporary file of its own beside it, then renames it
/// ([`crate::output`]): an interrupted run leaves no file that looks whole.
fn write(
    file: &GgufFile,
    outputs: Vec<Output<'_>>,
    weights: &BTreeMap<String, Vec<f32>>,
    threads: usize,
) -> Result<()> {
    let rows_of = |t: &Planned| t.shape.iter().skip(1).product::<u64>();
    let rows: u64 = outputs.iter().flat_map(|o| &o.2).map(|t| rows_of(t)).sum();
    let bar = indicatif::ProgressBar::new(rows);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>40} [{bar:30}] {percent}% {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut before = 0u64;
    let mut written: Vec<PathBuf> = Vec::new();
    let mut result = Ok(());
    for (out, header, tensors) in outputs {
        let (f, part) = match crate::output::create_part(&out) {
            Ok(x) => x,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        let infos: Vec<(String, GgmlType, Vec<u64>)> = tensors
            .iter()
            .map(|t| (t.name.clone(), t.to, t.shape.clone()))
            .collect();
        result = (|| -> Result<()> {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            header
                .stream(&mut w, &infos, |i, sink| {
                    let t = tensors[i];
                    bar.set_message(format!("{} {}", t.name, t.to));
                    let base = before;
                    let qw = if t.to == t.from {
                        None
                    } else {
                        t.weights(weights).map_err(std::io::Error::other)?
                    };
                    write_tensor(file, t, qw, threads, sink, &mut |r| {
                        bar.set_position(base + r)
                    })?;
                    before += rows_of(t);
                    Ok(())
                })
                .map_err(|e| match e {
                    // The writer names no file; the tensor's own error says what failed.
                    frink_gguf::GgufError::Io { source, .. } => anyhow::anyhow!("{source}"),
                    other => other.into(),
                })?;
            use std::io::Write;
            w.flush()?;
            w.get_ref().sync_all()?;
            crate::output::finish(&part, &out)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&part);
            break;
        }
        written.push(out);
    }
    bar.finish_and_clear();
    if result.is_err() {
        // A split output is whole only with every shard.
        written.iter().for_each(|p| {
            let _ = std::fs::remove_file(p);
        });
    }
    result
}
