//! `frink bench`: prompt-processing and generation throughput, measured the way
//! llama.cpp's llama-bench measures it (tools/llama-bench/llama-bench.cpp): `pp N` evaluates
//! N prompt tokens in one batch, `tg N` generates N tokens one per step, each after `-d D`
//! tokens already in the KV cache (evaluated once per test, untimed; every run starts
//! from the cache cut back to them); one warm-up run, then `-r` timed repetitions; t/s
//! reported as mean ± sample standard deviation over the repetitions. `-p`, `-n` and `-d`
//! take comma lists, run as llama-bench orders them: every prompt size at every depth,
//! then every generation length at every depth.

use std::time::Instant;

use anyhow::Result;
use clap::{ArgAction, Args};
use frink_engine::Session;
use frink_models::{Logits, Model};
use serde_json::json;

use crate::common::ModelArgs;

/// Flags of `frink bench` (CONTRACT.md; llama-bench's spellings).
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the pp tests, comma-separated (0: skip).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generated tokens of the tg tests, comma-separated (0: skip).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Tokens already in the KV cache when each test starts, comma-separated.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Timed repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Print llama-bench's `-o json` array (plus `peak_rss_bytes`) instead of a table.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
}

/// Deterministic pseudo-random token ids (llama-bench uses random ids too).
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

/// A session holding `n_depth` tokens, with room for a test of `n_prompt + n_gen` more.
fn session_at_depth<'m>(
    model: &'m Model,
    args: &BenchArgs,
    n_depth: usize,
    n_prompt: usize,
    n_gen: usize,
) -> Result<Session<'m>> {
    let n_vocab = model.config.n_vocab;
    let n_ctx = n_depth
        .checked_add(n_prompt)
        .and_then(|n| n.checked_add(n_gen + 1))
        .ok_or_else(|| anyhow::anyhow!("-d + -p + -n overflow"))?;
    frink_engine::check_kv_memory(model, n_ctx, 1, args.model.kv_type, "-d + -p + -n")
        .map_err(anyhow::Error::msg)?;
    let mut session =
        Session::new(model, n_ctx, args.model.kv_type).with_batch(frink_engine::DEFAULT_BATCH);
    if n_depth > 0 {
        session.eval(&tokens(n_depth, n_vocab, u64::MAX), Logits::None)?;
    }
    Ok(session.with_batch(n_prompt.max(1)))
}

/// One run of a test from the session's depth: seconds spent evaluating.
fn run_once(
    session: &mut Session<'_>,
    n_depth: usize,
    n_prompt: usize,
    n_gen: usize,
    rep: u64,
) -> Result<f64> {
    let kept = session.truncate(n_depth);
    if kept < n_depth {
        // A recurrent state cannot be cut back to the depth: it is evaluated again, untimed.
        let depth = tokens(n_depth, session.model().config.n_vocab, u64::MAX);
        session.eval(&depth[kept..], Logits::None)?;
    }
    let ids = tokens(n_prompt + n_gen, session.model().config.n_vocab, rep);
    let start = Instant::now();
    if n_prompt > 0 {
        session.eval(&ids[..n_prompt], Logits::Last)?;
    }
    for &t in &ids[n_prompt..] {
        session.eval(&[t], Logits::Last)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Peak resident set size of this process in bytes (`VmHWM` in /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let path = args.model.path()?;
    let model = args.model.load_path(&path)?;
    let threads = frink_models::pool::threads();
    let n_params: u64 = model
        .file
        .tensor_infos()
        .iter()
        .map(|t| t.n_elements())
        .sum();
    let model_size: u64 = model.file.tensor_infos().iter().map(|t| t.n_bytes).sum();
    let filename = path.display().to_string();
    let arch = model.config.arch.name;
    let mut results = Vec::new();
    for (n_prompt, n_gen, n_depth) in tests(args) {
        let mut session = session_at_depth(&model, args, n_depth, n_prompt, n_gen)?;
        run_once(&mut session, n_depth, n_prompt, n_gen, 0)?; // warm-up
        let mut samples_ns = Vec::new();
        for rep in 0..args.repetitions.max(1) {
            samples_ns
                .push(run_once(&mut session, n_depth, n_prompt, n_gen, rep as u64 + 1)? * 1e9);
        }
        drop(session);
        let n = (n_prompt + n_gen) as f64;
        let samples_ts: Vec<f64> = samples_ns.iter().map(|ns| n * 1e9 / ns).collect();
        let (avg_ns, stddev_ns) = mean_std(&samples_ns);
        let (avg_ts, stddev_ts) = mean_std(&samples_ts);
        let mut name = if n_prompt > 0 {
            format!("pp{n_prompt}")
        } else {
            format!("tg{n_gen}")
        };
        if n_depth > 0 {
            name += &format!(" @ d{n_depth}");
        }
        if !args.json {
            if results.is_empty() {
                println!("| model | size | params | backend | threads | test | t/s |");
                println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
            }
            println!(
                "| {arch} | {:.2} MiB | {:.2} M | CPU | {threads} | {name} | {avg_ts:.2} ± {stddev_ts:.2} |",
                model_size as f64 / (1 << 20) as f64,
                n_params as f64 / 1e6
            );
        }
        results.push(json!({
            "model_filename": filename,
            "model_type": arch,
            "model_size": model_size,
            "model_n_params": n_params,
            "n_batch": n_prompt.max(1),
            "n_threads": threads,
            "type_k": args.model.kv_type.name(),
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": n_depth,
            "avg_ns": avg_ns.round() as u64,
            "stddev_ns": stddev_ns.round() as u64,
            "avg_ts": avg_ts,
            "stddev_ts": stddev_ts,
            "samples_ns": samples_ns.iter().map(|v| v.round() as u64).collect::<Vec<_>>(),
            "samples_ts": samples_ts,
        }));
    }
    let peak = peak_rss_bytes();
    for r in &mut results {
        r["peak_rss_bytes"] = json!(peak);
    }
    if args.json {
        println!("{}", serde_json::Value::Array(results));
    } else if let Some(p) = peak {
        println!(
            "\npeak resident memory: {:.1} MiB",
            p as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

/// The tests in llama-bench's order (`get_cmd_params_instances`): `(n_prompt, 0, depth)` for
/// every nonzero prompt size and depth, then `(0, n_gen, depth)` for every nonzero
/// generation length and depth.
fn tests(args: &BenchArgs) -> Vec<(usize, usize, usize)> {
    let depths = if args.n_depth.is_empty() {
        vec![0]
    } else {
        args.n_depth.clone()
    };
    let mut out = Vec::new();
    for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
        out.extend(depths.iter().map(|&d| (p, 0, d)));
    }
    for &n in args.n_gen.iter().filter(|&&n| n > 0) {
        out.extend(depths.iter().map(|&d| (0, n, d)));
    }
    out
}

/// Mean and sample standard deviation (llama-bench's `stdev`: n − 1 in the denominator).
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}
