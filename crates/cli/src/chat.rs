//! `frink chat`: multi-turn chat in the terminal. Each turn re-renders the conversation
//! with the model's template and evaluates only what the KV cache does not already hold.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use clap::Args;
use frink_engine::sampling::Sampler;
use frink_engine::{Flow, GenerateParams, Session, StopMatcher};
use frink_tokenizer::{ChatMessage, Tokenizer};

use crate::common::{GenArgs, ModelArgs, SamplingArgs};

/// Flags of `frink chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub template: crate::common::TemplateArgs,
}

/// Length of the common prefix of two id sequences.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let mut model = args.model.load()?;
    let tok = std::sync::Arc::new(
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?,
    );
    let grammar = args.sampling.grammar_for(&tok)?;
    frink_engine::check_kv_memory(&model.config, args.gen.ctx, 1, args.model.kv_type, "--ctx")
        .map_err(anyhow::Error::msg)?;
    let sampling = args.sampling.params(tok.n_vocab())?;
    let draft_model = args.gen.spec.load_draft(&tok)?;
    let mut draft = draft_model.as_ref().map(|m| {
        let (ctx, kv) = (args.gen.ctx, args.model.kv_type);
        args.gen.spec.draft(m, ctx, kv, &tok, &sampling)
    });
    let mut session = Session::new(&model, args.gen.ctx, args.model.kv_type);
    let params = GenerateParams {
        max_tokens: args.gen.max_tokens(),
        ignore_eos: args.gen.ignore_eos,
        eog: tok.eog_ids().iter().copied().collect(),
        speculation: args.gen.speculation(),
        spec_sampling: args.gen.spec.spec_sampling(),
    };
    let mut messages = Vec::new();
    if let Some(s) = &args.gen.system {
        messages.push(ChatMessage::new("system", s.as_str()));
    }
    // Token ids whose keys and values the cache holds, in order.
    let mut cached: Vec<u32> = Vec::new();
    let (template, kwargs) = args.template.resolve()?;
    let inputs = frink_tokenizer::TemplateInputs {
        add_generation_prompt: true,
        kwargs,
        ..Default::default()
    };
    if template.is_none() {
        crate::run::warn_builtin_template(&tok);
    }
    eprintln!("frink chat: type a message and press Enter; an empty line or end of input quits.");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.context("reading standard input")?;
        if line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::new("user", line));
        let prompt = tok.apply_template_with(template.as_deref(), &messages, &inputs)?;
        let ids = tok.encode_chat(&prompt)?;
        // Reuse the cached prefix; always evaluate at least one token for fresh logits.
        let keep = common_prefix(&cached, &ids).min(ids.len() - 1);
        args.gen.check_fits(ids.len())?;
        // A recurrent model keeps its whole state or starts over.
        let keep = session.truncate(keep);
        // Each answer starts afresh: the seed's stream, and the grammar from its start.
        let mut sampler = Sampler::new(sampling.clone())
            .with_constraint(grammar.as_ref().map(|g| g.fresh()).transpose()?);
        let mut decoder = tok.stream_decoder(false);
        let mut stops = StopMatcher::new(&args.sampling.stop);
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        if let Some(d) = draft.as_mut() {
            d.prefix = ids[..keep].to_vec();
        }
        let gen = crate::common::generate_speculative(
            &mut session,
            &ids[keep..],
            &mut sampler,
            &params,
            &args.gen.spec,
            draft.as_mut(),
            |id| {
                if tok.is_eog(id) && !args.gen.ignore_eos {
                    return Flow::Continue;
                }
                let piece = decoder.push(id).unwrap_or_default();
                let shown = stops.push(&piece);
                answer.push_str(&shown);
                let _ = out.write_all(shown.as_bytes());
                let _ = out.flush();
                if stops.stopped() {
                    Flow::Stop
                } else {
                    Flow::Continue
                }
            },
        )?;
        let tail = stops.push(&decoder.finish()) + &stops.finish();
        answer.push_str(&tail);
        let _ = writeln!(out, "{tail}");
        if gen.context_full {
            eprintln!("[the context of {} tokens is full]", args.gen.ctx);
        }
        // The cache now holds the prompt and every generated token but the last.
        cached = ids;
        cached.extend_from_slice(&gen.ids[..gen.ids.len().saturating_sub(1)]);
        cached.truncate(session.n_past());
        messages.push(ChatMessage::new("assistant", answer));
    }
    Ok(())
}
