//! Options and setup shared by the model-running subcommands.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use frink_models::{CacheType, KvType, Model};
use frink_store::Store;
use frink_tokenizer::Tokenizer;

/// `-m`, `-t` and `--kv-type`, as CONTRACT.md spells them.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Catalog name (fetched on first use) or path to a .gguf file.
    #[arg(short = 'm', long = "model", env = "FRINK_MODEL", default_value = frink_store::default_model_name())]
    pub model: String,
    /// Compute threads (default: the machine's physical cores).
    #[arg(short = 't', long = "threads", env = "FRINK_THREADS", value_parser = threads)]
    pub threads: Option<usize>,
    /// KV cache element type of keys and values: f16 (llama.cpp's default), f32, bf16,
    /// q8_0 (about half the memory of f16), q5_1, q5_0, q4_1, q4_0 or iq4_nl (about a
    /// quarter to a third).
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// The keys' cache type (llama.cpp's `-ctk`; default: `--kv-type`'s).
    #[arg(long = "cache-type-k", value_name = "T")]
    pub cache_type_k: Option<String>,
    /// The values' cache type (llama.cpp's `-ctv`; default: `--kv-type`'s).
    #[arg(long = "cache-type-v", value_name = "T")]
    pub cache_type_v: Option<String>,
    /// Keep at most this many bytes of routed-expert weights resident (mixture-of-experts
    /// models): an integer with an optional K, M or G suffix (powers of 1024).
    #[arg(long = "expert-budget", env = "FRINK_EXPERT_BUDGET", value_parser = parse_bytes)]
    pub expert_budget: Option<usize>,
    /// A LoRA adapter (llama.cpp's GGUF form) applied at scale 1; repeatable, or
    /// comma-separated.
    #[arg(long = "lora", value_delimiter = ',')]
    pub lora: Vec<PathBuf>,
    /// A LoRA adapter at a scale, `FILE:SCALE`; repeatable, or comma-separated.
    #[arg(long = "lora-scaled", value_delimiter = ',', value_parser = parse_lora_scaled)]
    pub lora_scaled: Vec<(PathBuf, f32)>,
    /// Load the adapters at scale 0 (the server's requests and `/lora-adapters` apply
    /// them).
    #[arg(long = "lora-init-without-apply", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub lora_init_without_apply: bool,
    /// Read the weights as stored instead of the path measured fastest on this machine
    /// (llama.cpp's `--no-repack`; see docs/speed.md, "The decode path"; never changes a
    /// result).
    #[arg(long = "no-repack", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub no_repack: bool,
    /// Decode through the repacked weights with this software-prefetch hint (`nta`, `t0`,
    /// `t1`) instead of the path measured fastest on this machine (see docs/speed.md,
    /// "The decode path"); never changes a result.
    #[arg(long = "prefetch", value_parser = parse_prefetch, conflicts_with = "no_repack")]
    pub prefetch: Option<frink_quant::dot::pack::PrefetchHint>,
    /// Measure the decode paths again on this machine instead of reading the tuning cache
    /// (`$FRINK_HOME/tuning.json`), and save the result.
    #[arg(long = "recalibrate", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub recalibrate: bool,
    /// Where the model runs: `auto` (the GPU when one is usable and runs the model, else
    /// the CPU), `cpu`, `cuda` or `cuda:N` (docs/gpu.md).
    #[arg(long = "device", env = "FRINK_DEVICE", default_value = "auto", value_parser = crate::device::parse_device)]
    pub device: crate::device::Device,
    /// Layers on the GPU (llama.cpp's `-ngl`): 0 keeps every layer on the CPU; any other
    /// count is refused while no model runs on a GPU (docs/gpu.md).
    #[arg(long = "gpu-layers", env = "FRINK_GPU_LAYERS")]
    pub gpu_layers: Option<usize>,
    /// Sequences a decode step of this command carries: what the decode path is measured
    /// with (0: the command does not decode; nothing is measured). Set by the command.
    #[arg(skip = 1usize)]
    pub decode_seqs: usize,
    /// `--override-kv` and the RoPE flags.
    #[command(flatten)]
    pub overrides: crate::overrides::OverrideArgs,
}

/// `nta`, `t0` or `t1` of `--prefetch`.
fn parse_prefetch(s: &str) -> std::result::Result<frink_quant::dot::pack::PrefetchHint, String> {
    frink_quant::dot::pack::PrefetchHint::parse(s)
        .ok_or_else(|| format!("{s:?}: expected nta, t0 or t1"))
}

/// `FILE:SCALE` of `--lora-scaled` (the last colon splits, so paths may hold colons).
pub fn parse_lora_scaled(s: &str) -> std::result::Result<(PathBuf, f32), String> {
    let (file, scale) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?}: expected FILE:SCALE"))?;
    let scale: f32 = scale
        .parse()
        .map_err(|_| format!("{s:?}: {scale:?} is not a number"))?;
    if !scale.is_finite() {
        return Err(format!("{s:?}: the scale must be finite"));
    }
    Ok((PathBuf::from(file), scale))
}

/// `4096`, `512K`, `1.5G`: bytes, with binary K/M/G suffixes.
pub fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 4096, 512M, 2G)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?} is not a byte count"));
    }
    Ok((v * mul as f64) as usize)
}

impl ModelArgs {
    /// Folds llama.cpp's `--cache-type-k`/`--cache-type-v` into `kv_type` (each defaults
    /// to `--kv-type`'s).
    ///
    /// Errors: a name that is not one of llama.cpp's cache types frink has (f32, f16,
    /// bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), naming the flag.
    pub fn resolve_kv_types(&mut self) -> Result<()> {
        let parse = |flag: &str, s: &Option<String>, default: CacheType| match s {
            None => Ok(default),
            Some(s) => s
                .parse::<CacheType>()
                .map_err(|e| anyhow::anyhow!("{flag} {s}: {e}")),
        };
        self.kv_type = KvType {
            k: parse("--cache-type-k", &self.cache_type_k, self.kv_type.k)?,
            v: parse("--cache-type-v", &self.cache_type_v, self.kv_type.v)?,
        };
        Ok(())
    }

    /// The metadata overrides for the model at `path` (the RoPE flags name keys of its
    /// architecture, read from the file's header).
    pub fn overrides_for(
        &self,
        path: &std::path::Path,
    ) -> Result<Vec<frink_models::overrides::MetaOverride>> {
        if !self.overrides.any() {
            return Ok(Vec::new());
        }
        let file = frink_gguf::GgufFile::open(path)
            .with_context(|| format!("cannot load {}", path.display()))?;
        let arch = file.architecture().unwrap_or("").to_string();
        self.overrides.for_arch(&arch)
    }

    /// Resolves `-m` through the store (fetching a catalog model on first use).
    pub fn path(&self) -> Result<PathBuf> {
        Ok(Store::from_env()?.resolve(&self.model)?)
    }

    /// Sizes the compute thread pool, resolves and loads the model.
    pub fn load(&self) -> Result<Model> {
        self.load_path(&self.path()?)
    }

    /// Sizes the compute thread pool and loads the model at `path` (already resolved).
    pub fn load_path(&self, path: &std::path::Path) -> Result<Model> {
        let (model, decision) = self.load_path_deciding(path)?;
        if matches!(decision.how, crate::tune::How::Measured(_)) {
            eprintln!("frink: {}", decision.describe());
        }
        Ok(model)
    }

    /// [`ModelArgs::load_path`], and how its decode path was chosen ([`crate::tune`]):
    /// forced by `--no-repack` or `--prefetch`, read from the tuning cache, or measured
    /// now (a command that decodes, on a machine with packed kernels).
    pub fn load_path_deciding(
        &self,
        path: &std::path::Path,
    ) -> Result<(Model, crate::tune::Decision)> {
        use crate::tune::{self, Decision, How};
        use frink_models::tune::DecodePath;
        crate::device::resolve(self.device)?;
        if let Some(n) = self.gpu_layers.filter(|&n| n > 0) {
            anyhow::bail!(
                "--gpu-layers {n}: no model runs on a GPU yet (frink devices shows what is \
                 found); --gpu-layers 0 keeps every layer on the CPU"
            );
        }
        init_threads(self.threads)?;
        let forced = if self.no_repack {
            Some((DecodePath::Stored, "--no-repack"))
        } else {
            self.prefetch.map(|h| (DecodePath::Packed(h), "--prefetch"))
        };
        let seqs = self.decode_seqs.max(1);
        // The cache is keyed by the file's shapes, read before the weights: a cached
        // choice of the stored rows skips the packing.
        let cached = match (forced, self.recalibrate, tune::packing_here()) {
            (None, false, true) => frink_gguf::GgufFile::open(path)
                .ok()
                .and_then(|f| tune::cached(&f, seqs)),
            _ => None,
        };
        let chosen = forced.map(|f| f.0).or(cached.as_ref().map(|c| c.0));
        let overrides = self.overrides_for(path)?;
        let mut model =
            Model::load_with_overrides(path, chosen != Some(DecodePath::Stored), &overrides)
                .with_context(|| match overrides.is_empty() {
                    true => format!("cannot load {}", path.display()),
                    false => format!(
                        "cannot load {} with {}",
                        path.display(),
                        overrides
                            .iter()
                            .map(|o| o.source.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })?;
        if self.overrides.rope().any() && !model.config.plan.uses_rope() {
            anyhow::bail!(
                "the RoPE flags (--rope-*, --yarn-*) do not apply to {}: no layer of its {} \
                 architecture has rotary positions",
                path.display(),
                model.config.arch.name
            );
        }
        model.set_expert_budget(self.expert_budget)?;
        self.kv_type
            .check_heads(&model.config)
            .map_err(anyhow::Error::msg)?;
        let adapters = self.lora.iter().map(|p| (p.clone(), 1.0));
        for (file, scale) in adapters.chain(self.lora_scaled.iter().cloned()) {
            let scale = if self.lora_init_without_apply {
                0.0
            } else {
                scale
            };
            model
                .add_lora(&file, scale)
                .with_context(|| format!("cannot load the LoRA adapter {}", file.display()))?;
        }
        let decision = if let Some((p, flag)) = forced {
            tune::apply(&mut model, p);
            Decision {
                path: model.decode_path(),
                how: How::Forced(flag),
            }
        } else if let Some((p, file)) = cached {
            tune::apply(&mut model, p);
            Decision {
                path: model.decode_path(),
                how: How::Cached(file),
            }
        } else if self.decode_seqs > 0 && model.repacked_bytes() > 0 {
            tune::measure(&mut model, seqs)?
        } else {
            Decision {
                path: model.decode_path(),
                how: How::Default,
            }
        };
        Ok((model, decision))
    }
}

/// Sizes the forward pass's compute pool (frink-models `pool`): `threads`, or the
/// physical cores.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    frink_models::pool::set_threads(threads.unwrap_or(0));
    Ok(())
}

/// Parses `1,2,3` into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .with_context(|| format!("bad token id {p:?} in {s:?}"))
        })
        .collect()
}

/// Chat-template flags of `run`, `chat` and `serve`, as llama.cpp spells them.
#[derive(Args, Clone, Debug, Default)]
pub struct TemplateArgs {
    /// Use the Jinja chat template in FILE instead of the model file's.
    #[arg(
        long = "chat-template-file",
        value_name = "FILE",
        conflicts_with = "chat_template"
    )]
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Use this Jinja chat template instead of the model file's.
    #[arg(long = "chat-template", value_name = "STRING")]
    pub chat_template: Option<String>,
    /// Extra variables for the template, a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long = "chat-template-kwargs", value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
}

impl TemplateArgs {
    /// The template override (`None`: the file's own) and the keyword arguments.
    ///
    /// Errors: an unreadable template file; kwargs that are not a JSON object.
    pub fn resolve(&self) -> Result<(Option<String>, serde_json::Map<String, serde_json::Value>)> {
        let template =
            match (&self.chat_template_file, &self.chat_template) {
                (Some(p), _) => Some(std::fs::read_to_string(p).with_context(|| {
                    format!("--chat-template-file: cannot read {}", p.display())
                })?),
                (None, t) => t.clone(),
            };
        let kwargs = match &self.chat_template_kwargs {
            None => serde_json::Map::new(),
            Some(s) => match serde_json::from_str::<serde_json::Value>(s) {
                Ok(serde_json::Value::Object(m)) => m,
                _ => anyhow::bail!("--chat-template-kwargs must be a JSON object, got {s}"),
            },
        };
        Ok((template, kwargs))
    }
}

/// Sampling flags of `run` and `chat` (CONTRACT.md), defaults as llama.cpp's.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Greedy decoding (argmax), the same as --temp 0.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub greedy: bool,
    /// Temperature (≤ 0 means greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (≤ 0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches P (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below P × the top token's probability (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for tokens among the last 64 (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtracted once from each token already present.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: a new one each run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when the text contains S (repeatable); S is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Add B to token ID's logit before sampling (repeatable): `ID=B`, B a number in
    /// -100..100; -100 (or `-inf`) bans the token.
    #[arg(long = "logit-bias", value_name = "ID=B", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Constrain the answer to JSON valid against this schema (a file, or the JSON itself).
    #[arg(long = "json-schema", value_name = "FILE|JSON", conflicts_with_all = ["grammar", "regex"])]
    pub json_schema: Option<String>,
    /// Constrain the answer to this grammar file: GBNF (llama.cpp's grammars), or
    /// llguidance's Lark syntax with the first line `%llguidance {}`.
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    pub grammar: Option<std::path::PathBuf>,
    /// Constrain the whole answer to match this regular expression.
    #[arg(long, value_name = "R")]
    pub regex: Option<String>,
}

impl SamplingArgs {
    /// The grammar `--json-schema`, `--grammar` or `--regex` asks for, if any.
    ///
    /// Errors: an unreadable file, a schema that is not JSON, a grammar that does not
    /// parse.
    pub fn grammar(&self) -> Result<Option<frink_engine::constraint::Grammar>> {
        use frink_engine::constraint::Grammar;
        if let Some(s) = &self.json_schema {
            let text = if s.trim_start().starts_with(['{', '[']) || s.trim() == "true" {
                s.clone()
            } else {
                std::fs::read_to_string(s)
                    .with_context(|| format!("--json-schema: cannot read {s}"))?
            };
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema: not JSON: {s}"))?;
            return Ok(Some(Grammar::JsonSchema(v)));
        }
        if let Some(p) = &self.grammar {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("--grammar: cannot read {}", p.display()))?;
            return Ok(Some(
                Grammar::from_grammar_text(&text).map_err(|e| anyhow::anyhow!("--grammar: {e}"))?,
            ));
        }
        Ok(self.regex.clone().map(Grammar::Regex))
    }

    /// [`SamplingArgs::grammar`] ready to compile for `tok`'s vocabulary, if one is asked.
    ///
    /// Errors: those of [`SamplingArgs::grammar`], and a grammar that does not compile
    /// (the message names the construct).
    pub fn grammar_for(
        &self,
        tok: &std::sync::Arc<frink_tokenizer::Tokenizer>,
    ) -> Result<Option<CliGrammar>> {
        let Some(grammar) = self.grammar()? else {
            return Ok(None);
        };
        let compiler = frink_engine::constraint::GrammarCompiler::new(std::sync::Arc::clone(tok))?;
        let g = CliGrammar { compiler, grammar };
        g.fresh()?;
        Ok(Some(g))
    }
}

/// A command-line grammar and its compiler: a fresh constraint for each answer.
pub struct CliGrammar {
    compiler: frink_engine::constraint::GrammarCompiler,
    grammar: frink_engine::constraint::Grammar,
}

impl CliGrammar {
    /// The grammar's constraint at the start of an answer.
    pub fn fresh(&self) -> Result<frink_engine::constraint::Constraint> {
        self.compiler
            .compile(&self.grammar)
            .context("the grammar does not compile")
    }
}

/// Parses `--logit-bias ID=B`: a token id and a bias in -100..=100 (or `-inf`, a ban).
fn parse_logit_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("expected ID=BIAS, got `{s}`"))?;
    let id: u32 = id
        .trim()
        .parse()
        .map_err(|_| format!("`{id}` is not a token id"))?;
    let bias: f32 = match bias.trim() {
        "-inf" => f32::NEG_INFINITY,
        b => b
            .parse()
            .ok()
            .filter(|b: &f32| (-100.0..=100.0).contains(b))
            .ok_or_else(|| format!("the bias must be a number in -100..100 or -inf, got `{b}`"))?,
    };
    Ok((id, frink_engine::sampling::ban_bias(bias)))
}

impl SamplingArgs {
    /// The sampler parameters these flags describe, for a model of `n_vocab` tokens.
    ///
    /// Errors: a `--logit-bias` id outside the vocabulary (it would bias nothing); a NaN or
    /// infinite value of a sampling flag.
    pub fn params(&self, n_vocab: usize) -> Result<frink_engine::sampling::SamplingParams> {
        for (flag, v) in [
            ("--temp", self.temp),
            ("--top-p", self.top_p),
            ("--min-p", self.min_p),
            ("--repeat-penalty", self.repeat_penalty),
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ] {
            anyhow::ensure!(v.is_finite(), "{flag} must be a finite number, got {v}");
        }
        if let Some((id, _)) = self
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= n_vocab)
        {
            anyhow::bail!("--logit-bias: token id {id} is outside the vocabulary of {n_vocab}");
        }
        let seed = self
            .seed
            .unwrap_or_else(frink_engine::sampling::random_seed);
        Ok(frink_engine::sampling::SamplingParams {
            temperature: if self.greedy { 0.0 } else { self.temp },
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: 64,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed,
            logit_bias: self.logit_bias.clone(),
            chain: None,
        })
    }
}

/// Reads a text input byte for byte (CONTRACT.md: no trailing newline is stripped);
/// `-` is standard input.
pub fn read_text(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let limit = MAX_TEXT_BYTES as u64 + 1;
    if path.as_os_str() == "-" {
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut bytes)
            .context("reading stdin")?;
    } else {
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        #[cfg(unix)]
        let pipe = std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type());
        #[cfg(not(unix))]
        let pipe = false;
        anyhow::ensure!(
            meta.is_file() || pipe,
            "{}: not a text file or a pipe (give a file, or - for standard input)",
            path.display()
        );
        std::fs::File::open(path)
            .and_then(|f| f.take(limit).read_to_end(&mut bytes))
            .with_context(|| format!("cannot read {}", path.display()))?;
    }
    anyhow::ensure!(
        bytes.len() <= MAX_TEXT_BYTES,
        "{}: more than {} GiB of text",
        path.display(),
        MAX_TEXT_BYTES >> 30
    );
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// The most text [`read_text`] reads (4 GiB): a larger input is refused rather than
/// read until memory runs out (`/dev/zero` through a pipe).
const MAX_TEXT_BYTES: usize = 4 << 30;

/// Generation limits shared by `run` and `chat`: system message, token budget, context.
#[derive(Args, Clone, Debug)]
pub struct GenArgs {
    /// System message (chat template).
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate (-1: until an end-of-generation token or the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    pub n_predict: i64,
    /// Context size in tokens (the KV cache; llama.cpp's `-c`).
    #[arg(short = 'c', long, default_value_t = 4096, value_parser = positions)]
    pub ctx: usize,
    /// Never sample an end-of-generation token (llama.cpp's `--ignore-eos`; the server's
    /// `ignore_eos`): the answer ends at `-n`, a stop string or the context.
    #[arg(long = "ignore-eos", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// A count that must be at least 1 (`-t 0` is refused naming the value, as llama.cpp's
/// tools do not run without threads).
pub fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1, got 0".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number")),
    }
}

/// The most compute threads a command starts (`-t`): far above any machine's cores, below
/// what the system lets one process start.
pub const MAX_THREADS: usize = 1024;

/// `-t N`: 1 to [`MAX_THREADS`], the value named when refused.
pub fn threads(s: &str) -> std::result::Result<usize, String> {
    match at_least_one(s)? {
        n if n > MAX_THREADS => Err(format!(
            "{n} threads is more than the {MAX_THREADS} allowed"
        )),
        n => Ok(n),
    }
}

/// The largest context (`--ctx`, `--kv-size`): llama.cpp's `n_ctx` is a 32-bit integer,
/// and positions beyond it overflow the sizes computed from it.
pub const MAX_CTX: usize = i32::MAX as usize;

/// `--ctx N` and `--kv-size N`: 2 to [`MAX_CTX`] positions, the value named when refused.
pub fn positions(s: &str) -> std::result::Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    if !(2..=MAX_CTX).contains(&n) {
        return Err(format!("{n} positions: must be between 2 and {MAX_CTX}"));
    }
    Ok(n)
}

/// Speculative decoding flags of `run`, `chat` and `serve`.
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` (prompt lookup: proposals from earlier text of the
    /// prompt and answer), `draft` (a draft model's, `--draft-model`) or `off`; proposals
    /// are verified in one batched step, so the tokens are exactly those of `off` (with
    /// the default `--spec-sampling exact`).
    /// Default: `draft` with `--draft-model`, else `ngram`.
    #[arg(long = "spec", value_parser = ["ngram", "draft", "off"])]
    pub spec: Option<String>,
    /// Most tokens proposed per speculative step (0: no speculation, predictions included).
    #[arg(long = "draft-max", default_value_t = 7)]
    pub draft_max: usize,
    /// The draft model (catalog name or .gguf path; llama.cpp's `-md`): same vocabulary as
    /// the model, checked at load.
    #[arg(long = "draft-model", visible_alias = "model-draft")]
    pub draft_model: Option<String>,
    /// Propose nothing rather than fewer draft tokens than this.
    #[arg(long = "draft-min", default_value_t = 0)]
    pub draft_min: usize,
    /// Stop drafting when the draft model's choice has a lower probability than this.
    #[arg(long = "draft-p-min", default_value_t = frink_engine::DraftModel::DEFAULT_P_MIN)]
    pub draft_p_min: f32,
    /// How proposals are accepted: `exact` (a row's sampled token is taken; the tokens
    /// are exactly those of `--spec off`, seeded ones too) or `rejection` (Leviathan et
    /// al.'s rejection sampling: the same distribution, a sampling draft model accepted
    /// more often, but a seed no longer gives `--spec off`'s tokens).
    #[arg(long = "spec-sampling", default_value = "exact", value_parser = ["exact", "rejection"])]
    pub spec_sampling: String,
}

/// What [`SpecArgs`] resolve to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecKind {
    Off,
    Ngram,
    Draft(String),
}

impl SpecArgs {
    /// The speculation asked for. Errors: `--spec draft` without `--draft-model`, or a
    /// draft model with `--spec ngram` (one of them would be ignored).
    pub fn kind(&self) -> Result<SpecKind> {
        if self.draft_max == 0 {
            return Ok(SpecKind::Off);
        }
        match (self.spec.as_deref(), &self.draft_model) {
            (Some("off"), _) => Ok(SpecKind::Off),
            (None | Some("draft"), Some(m)) => Ok(SpecKind::Draft(m.clone())),
            (Some("draft"), None) => anyhow::bail!("--spec draft needs --draft-model"),
            (Some("ngram"), Some(_)) => {
                anyhow::bail!("--draft-model is given with --spec ngram: use --spec draft")
            }
            _ => Ok(SpecKind::Ngram),
        }
    }

    /// The prompt-lookup speculation asked for (`None`: off, a draft model, or 0
    /// proposals).
    pub fn speculation(&self) -> Option<frink_engine::Speculation> {
        (self.kind().ok() == Some(SpecKind::Ngram)).then_some(frink_engine::Speculation {
            draft_max: self.draft_max,
        })
    }

    /// The draft model's file, if one is asked for (a catalog model is fetched on first
    /// use).
    pub fn draft_path(&self) -> Result<Option<PathBuf>> {
        match self.kind()? {
            SpecKind::Draft(name) => Ok(Some(Store::from_env()?.resolve(&name)?)),
            _ => Ok(None),
        }
    }

    /// `--spec-sampling`.
    pub fn spec_sampling(&self) -> frink_engine::SpecSampling {
        match self.spec_sampling.as_str() {
            "rejection" => frink_engine::SpecSampling::Rejection,
            _ => frink_engine::SpecSampling::Exact,
        }
    }

    /// A draft of `model` (from [`SpecArgs::load_draft`]) with a cache of `n_ctx`
    /// positions, the limits of `--draft-p-min` and `--draft-min`, `tok`'s
    /// end-of-generation tokens, and under `--spec-sampling rejection` drawing from the
    /// chain of `sampling` ([`frink_engine::DraftModel::sample_with`]).
    pub fn draft<'m>(
        &self,
        model: &'m Model,
        n_ctx: usize,
        kv_type: KvType,
        tok: &Tokenizer,
        sampling: &frink_engine::sampling::SamplingParams,
    ) -> frink_engine::DraftModel<'m> {
        let mut d = frink_engine::DraftModel::new(model, n_ctx, kv_type);
        d.p_min = self.draft_p_min;
        d.n_min = self.draft_min;
        d.eog = tok.eog_ids().iter().copied().collect();
        if self.spec_sampling() == frink_engine::SpecSampling::Rejection {
            d.sample_with(sampling);
        }
        d
    }

    /// Loads the draft model, if one is asked for, for a cache of `kv_type`
    /// ([`frink_engine::load_draft_model`]).
    pub fn load_draft(&self, tok: &Tokenizer, kv_type: KvType) -> Result<Option<Model>> {
        self.draft_path()?
            .map(|p| frink_engine::load_draft_model(&p, tok, kv_type).map_err(anyhow::Error::msg))
            .transpose()
    }
}

/// Generates as [`frink_engine::generate`] with the speculation of `spec`: a draft model's
/// proposals (`draft`, made by [`SpecArgs::draft`]), prompt lookup, or none.
pub fn generate_speculative(
    session: &mut frink_engine::Session<'_>,
    prompt: &[u32],
    sampler: &mut frink_engine::sampling::Sampler,
    params: &frink_engine::GenerateParams,
    spec: &SpecArgs,
    draft: Option<&mut frink_engine::DraftModel<'_>>,
    on_token: impl FnMut(u32) -> frink_engine::Flow,
) -> std::result::Result<frink_engine::Generation, frink_engine::GenerateError> {
    match draft {
        Some(d) => {
            let proposer: Option<(&mut dyn frink_engine::Propose, usize)> =
                Some((d, spec.draft_max));
            frink_engine::generate_with(session, prompt, sampler, params, proposer, on_token)
        }
        None => frink_engine::generate(session, prompt, sampler, params, on_token),
    }
}

impl GenArgs {
    /// The token budget of one answer ([`budget`] of `-n`).
    pub fn max_tokens(&self) -> Option<usize> {
        budget(self.n_predict)
    }

    /// Refuses a prompt that leaves no room in the context, naming both lengths: the
    /// scheduler's one rule ([`frink_engine::scheduler::PromptLimit`]) for a cache of
    /// `--ctx` positions.
    pub fn check_fits(&self, n_prompt: usize) -> Result<()> {
        frink_engine::scheduler::PromptLimit {
            n_ctx: self.ctx,
            kv_positions: usize::MAX,
        }
        .check(n_prompt)
        .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// The token budget `-n` (`num_predict`) gives: `None` for -1, no limit but the context.
pub fn budget(n_predict: i64) -> Option<usize> {
    usize::try_from(n_predict).ok()
}

/// The timing line `run` prints after an answer (and `chat` under `/set verbose`): load
/// time when given, prompt tokens and their rate, time to the first token, generated tokens
/// and their rate.
pub fn timing_line(load_ms: Option<f64>, t: &frink_engine::Timings) -> String {
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    let load = load_ms.map_or(String::new(), |ms| format!("load {ms:.0} ms | "));
    format!(
        "[{load}prompt {} tokens in {:.0} ms ({:.1} t/s) | first token {:.0} ms | {} more tokens in {:.0} ms ({:.1} t/s)]",
        t.prompt_tokens,
        t.prompt_ms,
        rate(t.prompt_tokens, t.prompt_ms),
        t.first_token_ms,
        t.gen_tokens,
        t.gen_ms,
        rate(t.gen_tokens, t.gen_ms)
    )
}

/// Prints, on stderr, how often each routed expert was selected per layer and the expert
/// cache's hits and misses (`--stats`); nothing for a dense model.
pub fn print_moe_stats(model: &Model) {
    let counts = model.moe_stats.counts();
    if counts.is_empty() {
        return;
    }
    eprintln!("expert selections per layer (expert: count):");
    for (il, layer) in counts.iter().enumerate() {
        if layer.iter().all(|&c| c == 0) {
            continue;
        }
        let cells: Vec<String> = layer
            .iter()
            .enumerate()
            .map(|(e, c)| format!("{e}:{c}"))
            .collect();
        eprintln!("  layer {il}: {}", cells.join(" "));
    }
    if let Some(cache) = &model.expert_cache {
        let s = cache.stats();
        eprintln!(
            "expert cache: budget {} bytes, {} hits, {} misses, {} bytes resident (peak {})",
            s.budget, s.hits, s.misses, s.resident_bytes, s.peak_bytes
        );
    }
}

/// Writes `args` to standard output; when the reader has gone (a closed pipe) the process
/// ends quietly with exit 0 rather than panicking ([`outln!`]); any other write error (a
/// full disk) is reported and ends it with exit 1.
pub fn out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        exit_on_write_error(&e);
    }
}

/// Ends the process after a failed write to standard output: quietly with exit 0 when the
/// reader has gone (`| head`), with the error and exit 1 otherwise.
pub fn exit_on_write_error(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write the output: {e}");
    std::process::exit(1);
}

/// Refuses an encoder (BERT family) for a command that needs logits (`frink {command}`),
/// saying what it does instead.
///
/// Errors: the model is an encoder.
pub fn generative(model: &Model, command: &str) -> Result<()> {
    if model.config.plan.encoder {
        anyhow::bail!(
            "the model is an encoder ({}): it gives embeddings (frink embed){}, not text; \
             frink {command} needs a generative model",
            model.config.arch.name,
            if model.has_classifier() {
                " and reranking scores (frink rerank)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
