//! The `frink` command line: thin layers over the library crates.
//!
//! Spellings, defaults and output shapes follow shared/CONTRACT.md: `--json` prints exactly
//! one JSON value as the last line of stdout, progress goes to stderr, exit status is 0 on
//! success, 1 on failure (with one `error: …` line on stderr) and 2 on bad usage.

/// `println!` for the commands' output: a reader that went away (`frink inspect … | head`)
/// ends the process quietly with exit 0, as `head` expects, where `println!` panics.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::common::out(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `print!` with [`outln!`]'s rule.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::common::out(format_args!($($t)*))
    };
}

mod bench;
mod bench_image;
mod chat;
mod common;
mod decode;
mod device;
mod embed;
mod images;
mod imatrix;
mod inspect;
mod intermediates;
mod interrupt;
mod logits;
mod output;
mod overrides;
mod perplexity;
mod plan;
mod quantize;
mod rerank;
mod run;
mod serve;
mod tokenize;
mod tune;
mod verify;

use std::process::ExitCode;

use anyhow::Result;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};
use frink_store::Store;

#[derive(Parser)]
#[command(name = "frink", version, about = "Local LLM inference over GGUF files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (chat template applied unless --raw), streamed to stdout.
    Run(run::RunArgs),
    /// Chat with a model in the terminal, turn by turn.
    Chat(chat::ChatArgs),
    /// Serve models over OpenAI's, Ollama's, Anthropic's and llama.cpp's HTTP APIs
    /// (continuous batching); without -m (or FRINK_MODEL), the model each request names.
    Serve(serve::ServeArgs),
    /// Prompt-processing and generation throughput (llama-bench compatible).
    Bench(bench::BenchArgs),
    /// Perplexity of a text file, computed the way llama-perplexity does.
    Perplexity(perplexity::PerplexityArgs),
    /// Print the embedding of each text (pooled hidden states, normalised).
    Embed(embed::EmbedArgs),
    /// Quantize a GGUF model file to a llama-quantize mix (Q4_K_M, Q8_0, …).
    Quantize(quantize::QuantizeArgs),
    /// Compute an importance matrix over a text (llama-imatrix's), for quantize --imatrix.
    Imatrix(imatrix::ImatrixArgs),
    /// Rank documents by relevance to a query with a reranker (a cross-encoder).
    Rerank(rerank::RerankArgs),
    /// Print the token ids of a text, as llama.cpp's tokenizer gives them.
    Tokenize(tokenize::TokenizeArgs),
    /// Print the text of token ids (special tokens rendered).
    Detokenize(tokenize::DetokenizeArgs),
    /// Run a prompt through a mixture-of-experts model and show per-layer expert selection
    /// counts and which experts an --expert-budget would keep resident (JSON).
    InspectPlan(plan::PlanArgs),
    /// Show a GGUF file's metadata, tensor counts by type, and (with --tensors) its tensor table.
    Inspect {
        /// Catalog name (fetched on first use) or path to a .gguf file.
        model: String,
        /// List every tensor (name, type, shape, file offset, bytes).
        #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
        tensors: bool,
        /// Print one JSON object instead of text.
        #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
        json: bool,
        /// Print the layer plan instead: what each layer computes (token mixer, channel
        /// mixer, norms, residual), runs of identical layers on one line.
        #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
        plan: bool,
    },
    /// Fetch a catalog model into the store (a no-op when it is already there); prints its path.
    Pull {
        /// Catalog name, e.g. smollm2-135m.
        name: String,
    },
    /// Write the logits of every position of a token id sequence, evaluated in one batch.
    Logits {
        #[command(flatten)]
        model: common::ModelArgs,
        /// Token ids, comma-separated.
        #[arg(long)]
        ids: String,
        /// Output file: little-endian float32 [n_ids][n_vocab].
        #[arg(short = 'o', long = "output")]
        output: std::path::PathBuf,
        #[command(flatten)]
        dump: logits::DumpArgs,
    },
    /// Run every check of a reference directory (shared/golden/<model>,
    /// shared/fixtures/tiny/<name>, shared/fixtures/quant/<TYPE>); exit 1 on any mismatch.
    Verify {
        /// Model (default: the directory's own: golden model name or tiny model.gguf).
        #[arg(short = 'm', long = "model", env = "FRINK_MODEL")]
        model: Option<String>,
        /// The reference directory.
        #[arg(long)]
        golden: std::path::PathBuf,
        /// KV cache type (default: the reference's: f16 for golden, f32 for fixtures).
        #[arg(long = "kv-type")]
        kv_type: Option<frink_models::KvType>,
        /// A tiny fixture's transformers hidden states (f32 [n_layers][n_tokens][n_embd],
        /// crates/models/tests/data/hidden/make_hidden.py): each layer's output (`l_out`) is
        /// compared with them and the first layer that departs is named.
        #[arg(long = "intermediates")]
        intermediates: Option<std::path::PathBuf>,
        /// Compute threads.
        #[arg(short = 't', long = "threads", env = "FRINK_THREADS", value_parser = common::threads)]
        threads: Option<usize>,
        /// Where the model runs: auto, cpu, cuda or cuda:N.
        #[arg(long = "device", env = "FRINK_DEVICE", default_value = "auto", value_parser = device::parse_device)]
        device: device::Device,
    },
    /// Remove a model from the store (a catalog name or `hf:ORG/REPO/FILE.gguf`).
    Rm {
        /// The model's name as `frink list` shows it.
        name: String,
    },
    /// Print what Ollama's `/api/show` gives for a model: details, metadata, template,
    /// capabilities (JSON).
    Show {
        /// Catalog name, `hf:` name (fetched on first use) or path to a .gguf file.
        model: String,
    },
    /// List the GPUs (name, memory, compute capability), the driver and NVRTC versions,
    /// and where each library was found (or where it was looked for).
    Devices {
        /// Print one JSON object instead of text.
        #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
        json: bool,
    },
    /// List the catalog and which models are in the store.
    List {
        /// Print one JSON array of the stored models instead of text.
        #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
        json: bool,
    },
}

impl Command {
    /// The model options of a command that runs a model.
    fn model_args(&mut self) -> Option<&mut common::ModelArgs> {
        match self {
            Command::Run(a) => Some(&mut a.model),
            Command::Chat(a) => Some(&mut a.model),
            Command::Serve(a) => Some(&mut a.model),
            Command::Bench(a) => Some(&mut a.model),
            Command::Perplexity(a) => Some(&mut a.model),
            Command::Imatrix(a) => Some(&mut a.model),
            Command::Embed(a) => Some(&mut a.model),
            Command::Rerank(a) => Some(&mut a.model),
            Command::InspectPlan(a) => Some(&mut a.model),
            Command::Logits { model, .. } => Some(model),
            _ => None,
        }
    }
}

/// llama.cpp's flags of two letters behind one dash, which clap would read as a one-letter
/// flag and its value (`-md` as `-m d`): each is its long name here.
const LLAMA_CPP_FLAGS: &[(&str, &str)] = &[
    ("-md", "--draft-model"),
    ("-np", "--parallel"),
    ("-ngl", "--gpu-layers"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
];

/// `arg` with a [`LLAMA_CPP_FLAGS`] name (alone, or as `-ctk=VALUE`) spelled long.
fn long_llama_cpp_flag(arg: std::ffi::OsString) -> std::ffi::OsString {
    let text = arg.to_string_lossy();
    for (short, long) in LLAMA_CPP_FLAGS {
        if text == *short {
            return (*long).into();
        }
        if let Some(value) = text.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
            return format!("{long}={value}").into();
        }
    }
    arg
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,frink=info,frink_store=info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .init();
    let args = std::env::args_os().map(long_llama_cpp_flag);
    let matches = with_env(Cli::command())
        .mut_subcommand("serve", |c| {
            // Its default is not what `frink serve` without -m does: it serves the model
            // each request names (`model_given` below).
            c.mut_arg("model", |a| {
                a.hide_default_value(true).help(
                    "Catalog name (fetched on first use) or path to a .gguf file, served at \
                     start; without it, each request's `model` names the model to load",
                )
            })
        })
        .try_get_matches_from(args)
        .unwrap_or_else(|e| e.exit());
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `frink serve` without -m (or FRINK_MODEL) serves what each request names.
    if let (Command::Serve(a), Some(m)) = (&mut cli.command, matches.subcommand_matches("serve")) {
        a.model_given = m.value_source("model") != Some(clap::parser::ValueSource::DefaultValue);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of standard output went away (`| head`): not an error of ours.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line: the error and its causes joined; a cause the message before already
            // ends with (an error that prints its source) is not said twice.
            let mut chain: Vec<String> = Vec::new();
            for c in e.chain() {
                let s = c.to_string();
                if !chain.last().is_some_and(|last| last.ends_with(&s)) {
                    chain.push(s);
                }
            }
            eprintln!("error: {}", chain.join(": ").replace('\n', " "));
            ExitCode::from(1)
        }
    }
}

/// The environment variable of option `--long`: `FRINK_` and the name in capitals, `-` as
/// `_` (`--kv-type` reads `FRINK_KV_TYPE`): CONTRACT.md's rule, for every option of every
/// command.
pub fn env_name(long: &str) -> String {
    format!("FRINK_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// `cmd` with every option of every (sub)command also read from [`env_name`] of its long
/// name, where it names none itself (the one place the variables are declared; `--help`
/// and `--version` excepted).
fn with_env(cmd: clap::Command) -> clap::Command {
    let cmd = cmd.mut_args(|a| match a.get_long() {
        Some(long) if a.get_env().is_none() && long != "help" && long != "version" => {
            let name = env_name(long);
            a.env(name)
        }
        _ => a,
    });
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    subs.into_iter()
        .fold(cmd, |c, name| c.mut_subcommand(name, with_env))
}

fn run(mut cli: Cli) -> Result<()> {
    if let Some(m) = cli.command.model_args() {
        m.resolve_kv_types()?;
    }
    let store = Store::from_env()?;
    match cli.command {
        Command::Embed(args) => embed::run(&args),
        Command::Quantize(args) => quantize::run(&args),
        Command::Rerank(args) => rerank::run(&args),
        Command::Tokenize(args) => tokenize::tokenize(&args),
        Command::Detokenize(args) => tokenize::detokenize(&args),
        Command::Inspect {
            model,
            tensors,
            json,
            plan,
        } => {
            let path = store.resolve(&model)?;
            if plan {
                inspect::plan(&path)
            } else {
                inspect::inspect(&path, tensors, json)
            }
        }
        Command::Run(args) => run::run(&args),
        Command::InspectPlan(args) => plan::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Chat(args) => chat::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Imatrix(args) => imatrix::run(&args),
        Command::Logits {
            model,
            ids,
            output,
            dump,
        } => logits::run(&model, &common::parse_ids(&ids)?, &output, &dump),
        Command::Verify {
            model,
            golden,
            kv_type,
            intermediates,
            threads,
            device,
        } => {
            let args = common::ModelArgs {
                model: model
                    .clone()
                    .unwrap_or_else(|| frink_store::default_model_name().into()),
                threads,
                kv_type: kv_type.unwrap_or_default(),
                expert_budget: None,
                lora: Vec::new(),
                lora_scaled: Vec::new(),
                lora_init_without_apply: false,
                no_repack: false,
                prefetch: None,
                recalibrate: false,
                decode_seqs: 0,
                device,
                gpu_layers: None,
                overrides: Default::default(),
                cache_type_k: None,
                cache_type_v: None,
            };
            verify::run(
                &args,
                model.is_some(),
                &golden,
                kv_type,
                intermediates.as_deref(),
            )
        }
        Command::Devices { json } => device::list(json),
        Command::Pull { name } => {
            let path = store.pull(&name)?;
            outln!("{}", path.display());
            Ok(())
        }
        Command::List { json } => {
            let models = store.list();
            if json {
                outln!("{}", serde_json::to_string(&models)?);
            } else {
                list(&store, &models);
            }
            Ok(())
        }
        Command::Rm { name } => {
            for f in store.remove(&name)? {
                eprintln!("removed {}", f.display());
            }
            Ok(())
        }
        Command::Show { model } => {
            let path = store.resolve(&model)?;
            let m = frink_models::Model::load(&path)?;
            let info = frink_server::ollama::ModelInfo::read(&m, &path.to_string_lossy(), None);
            outln!("{}", info.show());
            Ok(())
        }
    }
}

/// `frink list`: the catalog (pulled or not) and the hub models in the store, sizes in
/// decimal units as `ollama list` writes them (`--json` has the bytes).
fn list(store: &frink_store::Store, models: &[frink_store::ListedModel]) {
    outln!("store: {}", store.root().display());
    outln!("  {:<36} {:>8}  PATH", "NAME", "SIZE");
    for entry in store.catalog() {
        match models.iter().find(|m| m.name == entry.name) {
            Some(m) => outln!(
                "  {:<36} {:>8}  {}",
                m.name,
                frink_gguf::human_bytes(m.bytes),
                m.path.display()
            ),
            None => outln!(
                "  {:<36} {:>8}  (not pulled: frink pull {})",
                entry.name,
                "-",
                entry.name
            ),
        }
    }
    for m in models.iter().filter(|m| m.name.starts_with("hf:")) {
        outln!(
            "  {:<36} {:>8}  {}",
            m.name,
            frink_gguf::human_bytes(m.bytes),
            m.path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option of every command reads `FRINK_<NAME>` (CONTRACT.md), the name by the
    /// one rule.
    #[test]
    fn every_option_of_every_command_has_its_environment_variable() {
        fn walk(cmd: &clap::Command, path: &str, checked: &mut usize) {
            for a in cmd.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                if long == "help" || long == "version" {
                    continue;
                }
                let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
                assert_eq!(env, Some(env_name(long)), "{path} --{long}");
                *checked += 1;
            }
            for s in cmd.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), checked);
            }
        }
        let mut cmd = with_env(Cli::command());
        cmd.build();
        let mut checked = 0;
        walk(&cmd, "frink", &mut checked);
        assert!(checked > 100, "only {checked} options found");
    }
}
