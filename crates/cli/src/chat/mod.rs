//! `frink chat`: multi-turn chat in the terminal, with Ollama's prompt: line editing and
//! history ([`input`]), commands ([`commands`]), Ctrl+C stopping an answer and keeping the
//! conversation. Each turn re-renders the conversation with the model's template and
//! evaluates only what the KV cache does not already hold.

mod commands;
mod input;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use frink_engine::scheduler::Scheduler;
use frink_models::Model;
use frink_tokenizer::{ChatMessage, TemplateInputs, Tokenizer};

use crate::common::{CliGrammar, GenArgs, ModelArgs, SamplingArgs};
use commands::{Command, Settings};
use frink_engine::image::{EncodedImage, PromptImage, IMAGE_MARKER};
use frink_models::vision::VisionModel;
use input::Input;

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
    /// `--mmproj`, and `--image` for the first message.
    #[command(flatten)]
    pub images: crate::images::ImageArgs,
}

/// The conversation: the system message apart (it survives `/clear`), then the turns.
/// `/save` writes it as `{"system": …, "messages": [{"role", "content"}, …]}`.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Conversation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    /// The images of the messages, in the order of their markers in them.
    #[serde(skip)]
    images: Vec<EncodedImage>,
    /// Images for the next message (`/image`).
    #[serde(skip)]
    pending: Vec<EncodedImage>,
}

impl Conversation {
    /// The values of the images it holds and those pending (rows × the model's width).
    fn image_values(&self) -> usize {
        self.images
            .iter()
            .chain(&self.pending)
            .map(|im| im.rows.len())
            .sum()
    }

    /// The messages the template renders: the system message first, if any.
    fn rendered(&self) -> Vec<ChatMessage> {
        let system = self
            .system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()));
        system.chain(self.messages.iter().cloned()).collect()
    }

    fn save(&self, path: &Path) -> Result<()> {
        anyhow::ensure!(
            self.images.is_empty(),
            "a conversation with images cannot be saved (its images are not in the file)"
        );
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Reads a conversation `/save` wrote (or a bare array of messages).
    fn load(path: &Path) -> Result<Conversation> {
        // Checked before reading: a device, a FIFO or a huge file is not a conversation.
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        anyhow::ensure!(meta.is_file(), "{} is not a regular file", path.display());
        anyhow::ensure!(
            meta.len() <= MAX_CONVERSATION_BYTES,
            "{} is {} bytes; a conversation file may hold {} at most",
            path.display(),
            meta.len(),
            MAX_CONVERSATION_BYTES
        );
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let mut c: Conversation = if v.is_array() {
            Conversation {
                messages: serde_json::from_value(v)?,
                ..Default::default()
            }
        } else {
            serde_json::from_value(v).with_context(|| {
                format!("{}: expected {{\"system\", \"messages\"}}", path.display())
            })?
        };
        // A system message inside the list becomes the conversation's system message.
        if c.messages.first().is_some_and(|m| m.role == "system") {
            c.system = Some(c.messages.remove(0).content);
        }
        if c.messages.iter().any(|m| m.content.contains(IMAGE_MARKER)) {
            anyhow::bail!(
                "{}: a message holds {IMAGE_MARKER}, an image's place, without its image",
                path.display()
            );
        }
        if let Some(m) = c
            .messages
            .iter()
            .find(|m| !ROLES.contains(&m.role.as_str()))
        {
            anyhow::bail!("{}: unknown role `{}`", path.display(), m.role);
        }
        Ok(c)
    }

    /// Adds the user's `text`, with the pending images before it.
    fn ask(&mut self, text: String) {
        let text = format!("{}{text}", IMAGE_MARKER.repeat(self.pending.len()));
        self.images.append(&mut self.pending);
        self.messages.push(ChatMessage::new("user", text));
    }

    /// Takes back the last message [`Conversation::ask`] added (it could not be sent),
    /// its images pending again.
    fn unask(&mut self) {
        if let Some(m) = self.messages.pop() {
            let n = m
                .content
                .matches(IMAGE_MARKER)
                .count()
                .min(self.images.len());
            self.pending = self.images.split_off(self.images.len() - n);
        }
    }
}

/// The largest conversation file `/load` reads (far more than any context holds).
const MAX_CONVERSATION_BYTES: u64 = 64 << 20;

/// The roles a saved conversation may hold after its system message.
const ROLES: [&str; 3] = ["user", "assistant", "tool"];

/// The model side of a chat: the scheduler (whose one slot keeps the conversation's keys
/// and values between turns), the template, and how to answer.
struct Replier<'m> {
    sched: &'m Scheduler,
    model: &'m Model,
    tok: &'m Tokenizer,
    template: Option<String>,
    inputs: TemplateInputs,
    grammar: Option<CliGrammar>,
    gen: &'m GenArgs,
    /// The projector file (`--mmproj`) and the image flags.
    vision: Option<VisionModel>,
    image_args: &'m crate::images::ImageArgs,
}

impl Replier<'_> {
    /// The prompt of the next answer: `convo` rendered and tokenized.
    ///
    /// # Errors
    /// The template fails, or the prompt leaves no room in the context (both lengths
    /// named); the conversation is kept either way.
    fn prompt(&self, convo: &Conversation) -> Result<(Vec<u32>, Vec<PromptImage>)> {
        let prompt = self.tok.apply_template_with(
            self.template.as_deref(),
            &convo.rendered(),
            &self.inputs,
        )?;
        let (ids, images) = match (&self.vision, convo.images.is_empty()) {
            (Some(vm), false) => {
                let special = prompt.template_ranges();
                crate::images::prompt(self.tok, &prompt.text, &special, vm, &convo.images)?
            }
            _ => (self.tok.encode_chat(&prompt)?, Vec::new()),
        };
        self.gen.check_fits(ids.len())?;
        Ok((ids, images))
    }

    /// `/image FILE` read and encoded.
    /// `held`: the values of the images the conversation already holds (with those
    /// pending), whose rows leave that much less of the context to this one.
    fn image(&self, file: &str, held: usize) -> Result<EncodedImage> {
        let Some(vm) = &self.vision else {
            anyhow::bail!("/image needs the model's projector file: frink chat --mmproj FILE");
        };
        let held = held / vm.config.n_embd_out.max(1);
        let args = crate::images::ImageArgs {
            image: vec![file.into()],
            ..Default::default()
        };
        let room = self.gen.ctx.saturating_sub(held);
        let mut one = args.encode_with(vm, self.image_args.image_max_pixels, room)?;
        Ok(one.remove(0))
    }

    /// Streams the answer to `ids` on standard output and returns its text; stops at an
    /// end-of-generation token, a stop string, the budget, a full context, or when
    /// `interrupted` is set (Ctrl+C).
    fn answer(
        &self,
        (ids, images): (Vec<u32>, Vec<PromptImage>),
        settings: &Settings,
        interrupted: &Arc<AtomicBool>,
    ) -> Result<String> {
        let n_prompt = ids.len();
        let ask = crate::decode::Ask {
            prompt: ids,
            sampling: settings.sampling.clone(),
            max_tokens: settings.max_tokens(),
            stop: settings.stop.clone(),
            ignore_eos: self.gen.ignore_eos,
            // Each answer starts its grammar afresh.
            constraint: self.grammar.as_ref().map(|g| g.fresh()).transpose()?,
            images,
        };
        let mut answer = String::new();
        let done = crate::decode::answer(self.sched, self.model, ask, interrupted, |piece| {
            answer.push_str(piece);
            out!("{piece}");
            true
        })?;
        outln!("");
        if interrupted.load(Ordering::Relaxed) {
            eprintln!("[stopped]");
        }
        if crate::decode::context_full(&done, n_prompt, settings.max_tokens(), self.gen.ctx) {
            eprintln!("[the context of {} tokens is full]", self.gen.ctx);
        }
        if settings.verbose {
            let t = crate::decode::timings(&done);
            eprintln!("{}", crate::common::timing_line(None, &t));
        }
        Ok(answer)
    }
}

/// `/show info`: what the model is and how this chat runs it.
fn describe(model: &Model, path: &Path, tok: &Tokenizer, args: &ChatArgs) -> String {
    let f = &model.file;
    let template =
        if args.template.chat_template.is_some() || args.template.chat_template_file.is_some() {
            "given on the command line".to_string()
        } else if tok.chat_template().is_some() {
            "the file's".to_string()
        } else {
            format!("built-in {} turns (the file has none)", tok.architecture())
        };
    format!(
        "  model          {}\n  file           {}\n  architecture   {}\n  parameters     {}\n  \
         quantization   {}\n  context        {} tokens (trained for {})\n  layers         {}\n  \
         embedding      {}\n  template       {template}",
        args.model.model,
        path.display(),
        f.architecture().unwrap_or("unknown"),
        frink_gguf::parameter_size(f.parameter_count()),
        f.file_type_name().unwrap_or("unknown"),
        args.gen.ctx,
        model.config.n_ctx_train,
        model.config.n_layer,
        model.config.n_embd,
    )
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let path = args.model.path()?;
    let mut model = args.model.load_path(&path)?;
    crate::common::generative(&model, "chat")?;
    let tok_arc = std::sync::Arc::new(
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?,
    );
    let tok: &Tokenizer = &tok_arc;
    let grammar = args.sampling.grammar_for(&tok_arc)?;
    frink_engine::check_kv_memory(&model.config, args.gen.ctx, 1, args.model.kv_type, "--ctx")
        .map_err(anyhow::Error::msg)?;
    let settings = Settings {
        sampling: args.sampling.params(tok.n_vocab())?,
        n_predict: args.gen.n_predict,
        stop: args.sampling.stop.clone(),
        verbose: false,
    };
    let info = describe(&model, &path, tok, args);
    let draft = args.gen.spec.load_draft(tok, args.model.kv_type)?;
    let config = crate::decode::config(&args.gen, args.model.kv_type)?;
    let (template, kwargs) = args.template.resolve()?;
    if template.is_none() {
        crate::run::warn_builtin_template(tok);
    }
    let interrupted = crate::interrupt::on_sigint()?;
    let mut reader = input::Reader::new(input::history_path())?;
    Scheduler::scoped(
        &model,
        draft.as_ref(),
        Arc::clone(&tok_arc),
        config,
        |sched| {
            let vision = args.images.load(&model, &args.model.model, true)?;
            let pending = match &vision {
                Some(vm) => args.images.encode(vm, args.gen.ctx)?,
                None => Vec::new(),
            };
            let replier = Replier {
                sched,
                model: &model,
                tok,
                template,
                inputs: TemplateInputs {
                    add_generation_prompt: true,
                    kwargs,
                    ..Default::default()
                },
                grammar,
                gen: &args.gen,
                vision,
                image_args: &args.images,
            };
            let convo = Conversation {
                system: args.gen.system.clone(),
                pending,
                ..Default::default()
            };
            converse(&replier, convo, settings, &info, &mut reader, &interrupted)
        },
    )
}

/// The chat's loop: reads messages and commands until `/bye` or the end of the input.
fn converse(
    replier: &Replier<'_>,
    mut convo: Conversation,
    mut settings: Settings,
    info: &str,
    reader: &mut input::Reader,
    interrupted: &Arc<AtomicBool>,
) -> Result<()> {
    eprintln!("frink chat: type a message (/help lists the commands, /bye or Ctrl+D leaves)");
    loop {
        let text = match reader.read()? {
            Input::End => break,
            Input::Interrupted => {
                eprintln!("(Ctrl+C stops an answer; /bye or Ctrl+D leaves)");
                continue;
            }
            Input::Text(t) | Input::Block(t) if t.trim().is_empty() => continue,
            Input::Block(t) => (t, false),
            Input::Text(t) => (t, true),
        };
        let (text, may_be_command) = text;
        let parsed = if may_be_command {
            commands::parse(&text)
        } else {
            Ok(None)
        };
        match parsed {
            Ok(Some(Command::Bye)) => break,
            Ok(Some(Command::Image(file))) => {
                let held = convo.image_values();
                match replier.image(&file, held) {
                    Ok(im) => {
                        convo.pending.push(im);
                        eprintln!("Added the image; it goes with the next message.");
                    }
                    Err(e) => eprintln!("error: {e:#}"),
                }
                continue;
            }
            Ok(Some(cmd)) => {
                if let Err(e) = apply(cmd, &mut convo, &mut settings, info) {
                    eprintln!("error: {e:#}");
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("error: {e:#}");
                continue;
            }
        }
        if text.contains(IMAGE_MARKER) {
            // It would take an image's place now or in a later turn (as /load refuses it).
            eprintln!("error: the message holds {IMAGE_MARKER}, the text that marks an image's place; /image FILE adds an image");
            continue;
        }
        convo.ask(text);
        let ids = match replier.prompt(&convo) {
            Ok(ids) => ids,
            Err(e) => {
                convo.unask();
                eprintln!("error: {e:#} (the message was not sent; /clear starts over)");
                continue;
            }
        };
        interrupted.store(false, Ordering::Relaxed);
        let answer = replier.answer(ids, &settings, interrupted)?;
        convo.messages.push(ChatMessage::new("assistant", answer));
    }
    Ok(())
}

/// Carries out a command other than `/bye`.
fn apply(
    cmd: Command,
    convo: &mut Conversation,
    settings: &mut Settings,
    info: &str,
) -> Result<()> {
    match cmd {
        Command::Help => eprintln!("{}", commands::HELP),
        Command::Bye => {}
        Command::Image(_) => {}
        Command::Clear => {
            convo.messages.clear();
            convo.images.clear();
            convo.pending.clear();
            eprintln!("Cleared the conversation.");
        }
        Command::System(s) => {
            convo.system = (!s.is_empty()).then_some(s);
            eprintln!("Set the system message.");
        }
        Command::Parameter(p) => {
            settings.set(p);
            eprintln!("Set the parameter.");
        }
        Command::Verbose(v) => {
            settings.verbose = v;
            eprintln!("Set {} mode.", if v { "verbose" } else { "quiet" });
        }
        Command::ShowInfo => eprintln!("{info}"),
        Command::ShowSystem => eprintln!(
            "{}",
            convo.system.as_deref().unwrap_or("(no system message)")
        ),
        Command::ShowParameters => eprintln!("{}", settings.describe()),
        Command::Save(p) => {
            convo.save(Path::new(&p))?;
            eprintln!("Saved the conversation to {p}.");
        }
        Command::Load(p) => {
            *convo = Conversation::load(Path::new(&p))?;
            eprintln!("Loaded {} messages from {p}.", convo.messages.len());
        }
    }
    Ok(())
}
