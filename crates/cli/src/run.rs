//! `frink run`: one prompt, a streamed continuation.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Args};
use frink_tokenizer::{ChatMessage, Tokenizer};

use crate::common::{parse_ids, read_text, GenArgs, ModelArgs, SamplingArgs};
use frink_engine::image::PromptImage;

/// The projector and the encoded `--image`s, when `--mmproj` is given.
type Vision<'a> = Option<(
    &'a frink_models::vision::VisionModel,
    &'a [frink_engine::image::EncodedImage],
)>;

/// Flags of `frink run` (CONTRACT.md).
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Use the prompt as is, without the chat template.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub raw: bool,
    /// Turn special-token text in a raw prompt into those tokens.
    #[arg(long = "parse-special", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub parse_special: bool,
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub template: crate::common::TemplateArgs,
    #[command(flatten)]
    pub images: crate::images::ImageArgs,
    /// Read the prompt from a file (`-`: standard input), byte for byte.
    #[arg(long = "prompt-file", conflicts_with_all = ["prompt", "prompt_ids"])]
    pub prompt_file: Option<PathBuf>,
    /// The prompt as token ids, comma-separated (no template, no BOS added).
    #[arg(long = "prompt-ids", conflicts_with = "prompt")]
    pub prompt_ids: Option<String>,
    /// Print one JSON object (prompt_ids, ids, text, finish_reason, timings) instead of
    /// streaming the text.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
    /// Print per-layer expert selection counts and expert-cache hits/misses on stderr at
    /// the end (mixture-of-experts models).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub stats: bool,
    /// Fill in the middle: the text before the gap (with `--fim-suffix`; PROMPT, if given,
    /// is the start of the middle). The model needs FIM tokens (qwen2.5-coder-0.5b).
    #[arg(long = "fim-prefix", value_name = "S", conflicts_with_all = ["prompt_file", "prompt_ids", "raw"])]
    pub fim_prefix: Option<String>,
    /// Fill in the middle: the text after the gap.
    #[arg(long = "fim-suffix", value_name = "S", requires = "fim_prefix")]
    pub fim_suffix: Option<String>,
    /// The prompt.
    #[arg(required_unless_present_any = ["prompt_file", "prompt_ids", "prompt_flag", "fim_prefix"])]
    pub prompt: Option<String>,
    /// Restore the KV cache saved in FILE (the part the prompt starts with is not
    /// evaluated again) and save the cache there after the answer (llama-cli's
    /// `--prompt-cache`; a state of another model, KV type or adapter set is refused).
    #[arg(long = "prompt-cache", value_name = "FILE", conflicts_with = "image")]
    pub prompt_cache: Option<PathBuf>,
    /// The prompt, as llama.cpp's `-p` gives it (instead of PROMPT).
    #[arg(short = 'p', long = "prompt", id = "prompt_flag", conflicts_with_all = ["prompt", "prompt_file", "prompt_ids"])]
    pub prompt_flag: Option<String>,
}

/// Prompt ids for `args`: token ids as given, the raw text tokenized with the model's BOS
/// rule, or the chat template applied to [system,] user.
fn prompt_ids(
    args: &RunArgs,
    tok: &Tokenizer,
    vision: Vision<'_>,
) -> Result<(Vec<u32>, Vec<PromptImage>)> {
    if vision.is_some() && (args.prompt_ids.is_some() || args.fim_prefix.is_some()) {
        bail!("--image goes with a text prompt, not --prompt-ids or --fim-prefix");
    }
    if let Some(ids) = &args.prompt_ids {
        return Ok((parse_ids(ids)?, Vec::new()));
    }
    if let Some(prefix) = &args.fim_prefix {
        let infill = frink_tokenizer::Infill {
            prefix,
            suffix: args.fim_suffix.as_deref().unwrap_or(""),
            middle: args
                .prompt
                .as_ref()
                .or(args.prompt_flag.as_ref())
                .map_or("", |s| s),
            extra: Vec::new(),
        };
        let limits = frink_tokenizer::InfillLimits {
            n_ctx: args.gen.ctx,
            n_predict: args.gen.max_tokens(),
            ..Default::default()
        };
        return Ok((tok.infill_prompt(&infill, limits)?, Vec::new()));
    }
    let text = prompt_text(args)?;
    if let Some((vm, images)) = vision {
        return image_prompt(args, tok, text, vm, images);
    }
    if args.raw {
        return Ok((tok.encode(&text, true, args.parse_special)?, Vec::new()));
    }
    let prompt = chat_prompt(args, tok, text)?;
    Ok((tok.encode_chat(&prompt)?, Vec::new()))
}

/// The prompt's text: PROMPT, `-p` or `--prompt-file`.
fn prompt_text(args: &RunArgs) -> Result<String> {
    Ok(
        match (
            args.prompt.as_ref().or(args.prompt_flag.as_ref()),
            &args.prompt_file,
        ) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => read_text(f)?,
            (None, None) => bail!("no prompt: give PROMPT, --prompt-file F or --prompt-ids 1,2,3"),
        },
    )
}

/// The text of a prompt with `n` images, each at a `<__media__>` marker (before the text
/// when it has none; in the user's message, through the chat template unless `--raw`),
/// and its byte ranges where special tokens are parsed.
fn image_prompt_text(
    args: &RunArgs,
    tok: &Tokenizer,
    text: String,
    n: usize,
) -> Result<(String, Vec<std::ops::Range<usize>>)> {
    let text = crate::images::marked(text, n);
    if args.raw {
        let special = match args.parse_special {
            true => std::slice::from_ref(&(0..text.len())).to_vec(),
            false => Vec::new(),
        };
        return Ok((text, special));
    }
    let p = chat_prompt(args, tok, text)?;
    let special = p.template_ranges();
    Ok((p.text, special))
}

/// The prompt with `images` in it ([`image_prompt_text`]).
fn image_prompt(
    args: &RunArgs,
    tok: &Tokenizer,
    text: String,
    vm: &frink_models::vision::VisionModel,
    images: &[frink_engine::image::EncodedImage],
) -> Result<(Vec<u32>, Vec<PromptImage>)> {
    let (text, special) = image_prompt_text(args, tok, text, images.len())?;
    crate::images::prompt(tok, &text, &special, vm, images)
}

/// Checks, before any image is decoded, that the prompt with images of texts `texts`
/// (from their headers) fits the context: an image's encoding is not spent on a prompt
/// that will be refused.
fn check_image_prompt(args: &RunArgs, tok: &Tokenizer, texts: &[String]) -> Result<()> {
    if texts.is_empty() || args.prompt_ids.is_some() || args.fim_prefix.is_some() {
        return Ok(());
    }
    let (text, special) = image_prompt_text(args, tok, prompt_text(args)?, texts.len())?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let n =
        frink_engine::image::prompt_len(tok, &text, &special, &refs).map_err(anyhow::Error::msg)?;
    args.gen.check_fits(n)
}

/// `text` as the user's message (after `--system`'s), rendered by the chat template.
fn chat_prompt(
    args: &RunArgs,
    tok: &Tokenizer,
    text: String,
) -> Result<frink_tokenizer::ChatPrompt> {
    let mut messages = Vec::new();
    if let Some(s) = &args.gen.system {
        messages.push(ChatMessage::new("system", s.as_str()));
    }
    messages.push(ChatMessage::new("user", text));
    let (template, kwargs) = args.template.resolve()?;
    let inputs = frink_tokenizer::TemplateInputs {
        add_generation_prompt: true,
        kwargs,
        ..Default::default()
    };
    let prompt = tok.apply_template_with(template.as_deref(), &messages, &inputs)?;
    if template.is_none() {
        warn_builtin_template(tok);
    }
    Ok(prompt)
}

pub fn run(args: &RunArgs) -> Result<()> {
    if let Some(f) = &args.prompt_cache {
        // Checked before the answer: the cache is saved after it.
        let dir = f.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            anyhow::bail!("--prompt-cache {}: its folder does not exist", f.display());
        }
    }
    // The first use of a catalog model fetches it; that is not part of load_ms.
    let path = args.model.path()?;
    let t0 = Instant::now();
    let mut model = args.model.load_path(&path)?;
    crate::common::generative(&model, "run")?;
    let tok = std::sync::Arc::new(
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?,
    );
    let grammar = args.sampling.grammar_for(&tok)?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;

    let vision = args
        .images
        .load(&model, &args.model.model, !args.images.image.is_empty())?;
    // The images' decoding, preprocessing and encoding, timed apart from the prompt.
    let t_images = Instant::now();
    let encoded = match &vision {
        Some(vm) => args.images.encode_checked(
            vm,
            args.images.image_max_pixels,
            &|texts| check_image_prompt(args, &tok, texts),
            args.gen.ctx,
        )?,
        None => Vec::new(),
    };
    let image_ms = match encoded.is_empty() {
        true => 0.0,
        false => t_images.elapsed().as_secs_f64() * 1e3,
    };
    // Without images the prompt is text alone (a typed marker stays text).
    let with_images = vision.as_ref().filter(|_| !encoded.is_empty());
    let (prompt, images) = prompt_ids(args, &tok, with_images.map(|vm| (vm, &encoded[..])))?;
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty");
    args.gen.check_fits(prompt.len())?;
    let max_tokens = args.gen.max_tokens();
    frink_engine::check_kv_memory(&model.config, args.gen.ctx, 1, args.model.kv_type, "--ctx")
        .map_err(anyhow::Error::msg)?;
    let sampling = args.sampling.params(tok.n_vocab())?;
    let draft = args.gen.spec.load_draft(&tok, args.model.kv_type)?;
    let config = crate::decode::config(&args.gen, args.model.kv_type)?;
    let ask = crate::decode::Ask {
        prompt: prompt.clone(),
        sampling,
        max_tokens,
        stop: args.sampling.stop.clone(),
        ignore_eos: args.gen.ignore_eos,
        constraint: grammar.as_ref().map(|g| g.fresh()).transpose()?,
        images,
    };
    let mut text = String::new();
    let mut out = Output::new(args.json);
    let interrupted = crate::interrupt::on_sigint()?;
    let done = frink_engine::scheduler::Scheduler::scoped(
        &model,
        draft.as_ref(),
        std::sync::Arc::clone(&tok),
        config,
        |sched| {
            if let Some(f) = &args.prompt_cache {
                crate::decode::restore_cache(sched, f)?;
            }
            // Shows each piece; false once the reader has gone (`| head`).
            let done = crate::decode::answer(sched, &model, ask, &interrupted, |piece| {
                text.push_str(piece);
                out.write(piece);
                !out.closed()
            })?;
            if let Some(f) = &args.prompt_cache {
                crate::decode::save_cache(sched, f)?;
            }
            Ok::<_, anyhow::Error>(done)
        },
    )?;
    if crate::decode::context_full(&done, prompt.len(), max_tokens, args.gen.ctx) {
        eprintln!(
            "\n[generation stopped: the context of {} tokens is full]",
            args.gen.ctx
        );
    }
    let t = crate::decode::timings(&done);
    if args.json {
        let json = serde_json::json!({
            "prompt_ids": shown_ids(&prompt, &tok, vision.as_ref()),
            "ids": done.ids,
            "text": text,
            "finish_reason": done.finish_reason.as_str(),
            "speculation": {"proposed": done.proposed, "accepted": done.accepted},
            "timings": {
                "load_ms": load_ms,
                "images": encoded.len(),
                "image_ms": image_ms,
                "prompt_tokens": t.prompt_tokens,
                "cached_tokens": done.cached_tokens,
                "prompt_ms": t.prompt_ms,
                "first_token_ms": t.first_token_ms,
                "gen_tokens": t.gen_tokens,
                "gen_ms": t.gen_ms,
            },
        });
        out.line(&json.to_string());
    } else {
        out.line("");
        if !encoded.is_empty() {
            eprintln!(
                "images: {} encoded in {image_ms:.1} ms ({:.1} ms per image)",
                encoded.len(),
                image_ms / encoded.len() as f64
            );
        }
        eprintln!("{}", crate::common::timing_line(Some(load_ms), &t));
    }
    if args.stats {
        crate::common::print_moe_stats(&model);
    }
    Ok(())
}

/// Standard output for a streamed answer: written and flushed piece by piece; once a write
/// fails (the reader closed the pipe: `frink run … | head`), nothing more is written and
/// [`Output::closed`] says so, so generation stops at once and the process ends quietly.
struct Output {
    stdout: std::io::Stdout,
    /// `--json`: the pieces are not streamed (only the final line is written).
    quiet: bool,
    closed: bool,
}

impl Output {
    fn new(quiet: bool) -> Output {
        Output {
            stdout: std::io::stdout(),
            quiet,
            closed: false,
        }
    }

    fn write(&mut self, s: &str) {
        if !self.quiet && !s.is_empty() {
            self.put(s.as_bytes());
        }
    }

    /// `s` and a newline, in any mode.
    fn line(&mut self, s: &str) {
        self.put(format!("{s}\n").as_bytes());
    }

    fn put(&mut self, bytes: &[u8]) {
        if self.closed {
            return;
        }
        let mut lock = self.stdout.lock();
        if let Err(e) = lock.write_all(bytes).and_then(|()| lock.flush()) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                // Not a reader gone but the output lost (a full disk): say so, exit 1.
                crate::common::exit_on_write_error(&e);
            }
            self.closed = true;
        }
    }

    fn closed(&self) -> bool {
        self.closed
    }
}

/// Says on stderr when the file has no chat template of its own, so a base model answering
/// oddly in chat mode is not a mystery (gemma3-270m in the catalog is one).
pub fn warn_builtin_template(tok: &Tokenizer) {
    if tok.chat_template().is_none() {
        eprintln!(
            "note: this model file has no chat template; using the built-in {} turn format (for a base model, try --raw)",
            tok.architecture()
        );
    }
}

/// The prompt's ids as the model's processor spells them: an image's rows as its
/// placeholder token (they carry image keys inside the engine).
fn shown_ids(
    prompt: &[u32],
    tok: &Tokenizer,
    vm: Option<&frink_models::vision::VisionModel>,
) -> Vec<u32> {
    let placeholder = vm
        .and_then(|vm| tok.token_id(vm.config.projector.image_token()))
        .unwrap_or(0);
    frink_engine::image::model_ids(prompt, placeholder)
}
