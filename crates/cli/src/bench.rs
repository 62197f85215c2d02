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
    /// Instead of pp/tg: speculative decoding on this prompt (the file's text as the user
    /// message through the chat template), greedy, the first `-n` tokens at most,
    /// `-r` rounds alternating `--spec off` and the speculation asked for (`--spec`,
    /// `--draft-model`, …); reports both decode rates, the speedup and the acceptance,
    /// and checks that the tokens are the same.
    #[arg(long = "spec-prompt-file")]
    pub spec_prompt_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub spec: crate::common::SpecArgs,
    /// Instead of pp/tg, with `--mmproj`: each `--image`'s preprocessing and encoding
    /// timed apart (crate::bench_image).
    #[command(flatten)]
    pub images: crate::images::ImageArgs,
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
    frink_engine::check_kv_memory(&model.config, n_ctx, 1, args.model.kv_type, "-d + -p + -n")
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
    let (model, decision) = args.model.load_path_deciding(&path)?;
    crate::common::generative(&model, "bench")?;
    // What the decode runs through, and how it was chosen (docs/speed.md, "The decode path").
    eprintln!("{}", decision.describe());
    if let Some(f) = &args.spec_prompt_file {
        return speculation(args, &model, f);
    }
    if args.images.mmproj.is_some() || !args.images.image.is_empty() {
        return crate::bench_image::run(args, &model);
    }
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
            // llama-bench's columns of the cache types, shown when not its default f16.
            let kv = args.model.kv_type;
            let (head, rule, cells) = match kv == frink_models::KvType::F16 {
                true => (String::new(), String::new(), String::new()),
                false => (
                    " type_k | type_v |".into(),
                    " --- | --- |".into(),
                    format!(" {} | {} |", kv.k, kv.v),
                ),
            };
            if results.is_empty() {
                outln!("| model | size | params | backend | threads |{head} test | t/s |");
                outln!("| --- | ---: | ---: | --- | ---: |{rule} ---: | ---: |");
            }
            outln!(
                "| {arch} | {:.2} MiB | {:.2} M | CPU | {threads} |{cells} {name} | {avg_ts:.2} ± {stddev_ts:.2} |",
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
            "type_k": args.model.kv_type.k.name(),
            "type_v": args.model.kv_type.v.name(),
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": n_depth,
            "avg_ns": avg_ns.round() as u64,
            "stddev_ns": stddev_ns.round() as u64,
            "avg_ts": avg_ts,
            "stddev_ts": stddev_ts,
            "samples_ns": samples_ns.iter().map(|v| v.round() as u64).collect::<Vec<_>>(),
            "samples_ts": samples_ts,
            "decode_path": decision.path.name(),
            "decode_path_chosen": match decision.how {
                crate::tune::How::Forced(_) => "forced",
                crate::tune::How::Cached(_) => "cached",
                crate::tune::How::Measured(_) => "measured",
                crate::tune::How::Default => "default",
            },
        }));
    }
    let peak = peak_rss_bytes();
    for r in &mut results {
        r["peak_rss_bytes"] = json!(peak);
    }
    if args.json {
        outln!("{}", serde_json::Value::Array(results));
    } else if let Some(p) = peak {
        outln!(
            "\npeak resident memory: {:.1} MiB",
            p as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

/// `frink bench --spec-prompt-file F`: greedy decode rates of the prompt with and without
/// the speculation of `args.spec`, alternating, with the proposals' acceptance.
fn speculation(args: &BenchArgs, model: &Model, file: &std::path::Path) -> Result<()> {
    use frink_engine::sampling::{Sampler, SamplingParams};
    let tok = frink_tokenizer::Tokenizer::from_gguf(&model.file)?;
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let messages = [frink_tokenizer::ChatMessage::new("user", text)];
    let inputs = frink_tokenizer::TemplateInputs {
        add_generation_prompt: true,
        ..Default::default()
    };
    let rendered = tok.apply_template_with(None, &messages, &inputs)?;
    let prompt = tok.encode_chat(&rendered)?;
    let n_gen = args.n_gen.iter().copied().find(|&n| n > 0).unwrap_or(128);
    let n_ctx = prompt.len() + n_gen + 1;
    let draft_model = args.spec.load_draft(&tok, args.model.kv_type)?;
    let mut params = frink_engine::GenerateParams {
        ignore_eos: false,
        max_tokens: n_gen,
        eog: tok.eog_ids().iter().copied().collect(),
        speculation: None,
        spec_sampling: args.spec.spec_sampling(),
    };
    let mut once = |spec: bool| -> Result<frink_engine::Generation> {
        let mut session = Session::new(model, n_ctx, args.model.kv_type);
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let mut draft = draft_model.as_ref().filter(|_| spec).map(|m| {
            args.spec.draft(
                m,
                n_ctx,
                args.model.kv_type,
                &tok,
                &SamplingParams::greedy(),
            )
        });
        params.speculation = args.spec.speculation().filter(|_| spec);
        Ok(crate::common::generate_speculative(
            &mut session,
            &prompt,
            &mut sampler,
            &params,
            &args.spec,
            draft.as_mut(),
            |_| frink_engine::Flow::Continue,
        )?)
    };
    let rate =
        |g: &frink_engine::Generation| g.timings.gen_tokens as f64 / (g.timings.gen_ms / 1e3);
    let (mut off, mut on, mut proposed, mut accepted) = (Vec::new(), Vec::new(), 0, 0);
    let mut ids = None;
    for round in 0..args.repetitions.max(1) {
        for spec in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let g = once(spec)?;
            anyhow::ensure!(
                ids.get_or_insert_with(|| g.ids.clone()) == &g.ids,
                "speculation changed the tokens (a bug: please report it)"
            );
            if spec {
                on.push(rate(&g));
                proposed += g.proposed;
                accepted += g.accepted;
            } else {
                off.push(rate(&g));
            }
        }
    }
    let (off_ts, _) = mean_std(&off);
    let (on_ts, _) = mean_std(&on);
    let tokens = ids.map_or(0, |v| v.len());
    let acceptance = accepted as f64 / proposed.max(1) as f64;
    if args.json {
        outln!(
            "{}",
            json!({"prompt_tokens": prompt.len(), "gen_tokens": tokens, "plain_ts": off,
                   "spec_ts": on, "speedup": on_ts / off_ts, "proposed": proposed,
                   "accepted": accepted, "acceptance": acceptance})
        );
    } else {
        outln!("| prompt | tokens | plain t/s | speculative t/s | speedup | accepted |");
        outln!("| ---: | ---: | ---: | ---: | ---: | ---: |");
        outln!(
            "| {} | {tokens} | {off_ts:.2} | {on_ts:.2} | {:.2}x | {accepted} of {proposed} ({:.0}%) |",
            prompt.len(),
            on_ts / off_ts,
            acceptance * 100.0
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
pub(crate) fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}
