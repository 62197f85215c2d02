//! A loaded model's engine (scheduler, tokenizer, grammar compiler, what Ollama reports
//! of it), how the server loads one ([`Builder`]) and the router of its model-scoped
//! endpoints ([`model_router`]).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use frink_engine::constraint::{Constraint, GrammarCompiler};
use frink_engine::scheduler::{Scheduler, SchedulerConfig};
use frink_tokenizer::Tokenizer;
use serde_json::Value;

use crate::api::{self, ApiError};
use crate::models::registry::Source;
use crate::models::{Build, Loaded};
use crate::{ollama, AppState, Loader, ServeConfig, Shared};

/// The loaded model's side of the server.
pub(crate) struct Engine {
    pub(crate) sched: Scheduler,
    pub(crate) tok: Arc<Tokenizer>,
    /// Compiles requests' grammars against the vocabulary.
    pub(crate) grammars: GrammarCompiler,
    /// How embeddings pool ([`frink_engine::embed::pooling`]).
    pub(crate) pooling: frink_models::Pooling,
    /// The model's hidden size (an embedding's length).
    pub(crate) n_embd: usize,
    /// What Ollama's endpoints report about the model.
    pub(crate) info: ollama::ModelInfo,
    /// The loaded LoRA adapters (path, current default scale), by id: `--lora`, changed by
    /// `POST /lora-adapters`.
    pub(crate) lora: std::sync::Mutex<Vec<(String, f32)>>,
    /// The prompt lengths the scheduler runs (a longer prompt can never run).
    pub(crate) prompt_limit: frink_engine::scheduler::PromptLimit,
    /// What llama.cpp's `infill` sampler reads of the vocabulary, built at its first use.
    pub(crate) infill_vocab: OnceLock<Arc<frink_engine::sampling::InfillVocab>>,
    /// The projector file (`--mmproj`), for requests with images.
    pub(crate) vision: Option<Arc<frink_models::vision::VisionModel>>,
    /// An encoder (BERT family): it embeds and, with a classifier head, reranks; it does
    /// not generate ([`frink_models::arch::ArchSpec::encoder`]).
    pub(crate) encoder: bool,
    /// It has a classifier head: `/v1/rerank` scores with it.
    pub(crate) reranker: bool,
    /// Its embeddings may be shortened (`dimensions`): a model trained for Matryoshka
    /// truncation ([`frink_engine::embed::matryoshka`]).
    pub(crate) matryoshka: bool,
    /// `general.architecture`.
    pub(crate) arch: &'static str,
    /// Generations that reach the context shift it (`--context-shift`).
    pub(crate) context_shift: bool,
}

impl Engine {
    /// The vocabulary as llama.cpp's `infill` sampler reads it: each token's text without
    /// control tokens' (`token_to_piece(id, special = false)`), the end-of-generation ids,
    /// and the end-of-turn token (EOS where the model names none).
    pub(crate) fn infill_vocab(&self) -> Arc<frink_engine::sampling::InfillVocab> {
        Arc::clone(self.infill_vocab.get_or_init(|| {
            let pieces = (0..self.tok.n_vocab() as u32)
                .map(|id| {
                    self.tok
                        .token_to_piece(id, false)
                        .map(<[u8]>::to_vec)
                        .unwrap_or_default()
                })
                .collect();
            let eot = self.tok.eot_id().or(self.tok.eos_id()).unwrap_or(0);
            Arc::new(frink_engine::sampling::InfillVocab::new(
                pieces,
                self.tok.eog_ids(),
                eot,
            ))
        }))
    }

    /// A request's adapters: its own `lora` list (the adapters it does not name at scale 0,
    /// as llama-server does), else the current default scales.
    ///
    /// Errors: a 400 for a malformed list or an id that is not loaded.
    pub(crate) fn lora_set(
        &self,
        requested: Option<&Value>,
    ) -> Result<Vec<(usize, f32)>, ApiError> {
        let cur = self.lora.lock().unwrap_or_else(|e| e.into_inner());
        match requested {
            None | Some(Value::Null) => Ok(cur.iter().map(|(_, s)| *s).enumerate().collect()),
            Some(v) => {
                let list = api::lora_list(v, cur.len(), "lora")?;
                Ok((0..cur.len())
                    .map(|i| (i, list.iter().find(|e| e.0 == i).map_or(0.0, |e| e.1)))
                    .collect())
            }
        }
    }

    /// The compiled constraint of a request's grammar (from its grammar fields, or a
    /// required tool call), or `None` without one: compiled once per request, whatever
    /// its `n` (each choice gets a clone).
    ///
    /// Errors: a 400 `invalid_grammar` naming the field, with the compiler's sentence.
    pub(crate) fn constraint(
        &self,
        grammar: Option<(&'static str, frink_engine::constraint::Grammar)>,
        triggers: Option<Vec<frink_engine::constraint::Trigger>>,
    ) -> Result<Option<Constraint>, ApiError> {
        let Some((param, g)) = grammar else {
            return Ok(None);
        };
        match triggers {
            Some(t) => self.grammars.compile_lazy(&g, t),
            None => self.grammars.compile(&g),
        }
        .map(Some)
        .map_err(|e| {
            ApiError::invalid(Some(param), format!("'{param}': {e}")).with_code("invalid_grammar")
        })
    }
}

/// What is served, once loaded: the model's name, file and architecture, the context,
/// slots, KV pool, threads, device and the tool-call and reasoning formats its template
/// teaches.
fn banner(config: &ServeConfig, path: &Path, eng: &Engine, template: Option<&str>) -> String {
    let template = template.or(eng.tok.chat_template()).unwrap_or("");
    let tools = crate::tools::ToolFormat::detect(template).map_or("none", |f| f.name());
    let thinking = if template.contains("<think>") || template.contains("<|channel") {
        "yes"
    } else {
        "no"
    };
    if eng.encoder {
        return format!(
            "model {} ({}), architecture {} (encoder: embeddings{}), inputs up to {} tokens, \
             passes of up to {} tokens, {} threads, device cpu",
            config.model_name,
            path.display(),
            eng.arch,
            if eng.reranker { " and reranking" } else { "" },
            eng.prompt_limit.n_ctx - 1,
            config.ubatch,
            frink_models::pool::threads(),
        );
    }
    format!(
        "model {} ({}), architecture {}, context {} tokens, {} slots, KV pool {} positions \
         ({}), {} threads, device cpu, tool calls {tools}, reasoning {thinking}",
        config.model_name,
        path.display(),
        eng.tok.architecture(),
        config.ctx,
        config.parallel,
        eng.prompt_limit.kv_positions,
        config.kv_type.name(),
        frink_models::pool::threads(),
    )
}

/// Refuses KV cache types, `--cache-disk` and `--context-shift` for a model whose cache
/// cannot have them, naming why ([`frink_models::KvType::check_heads`],
/// [`frink_engine::scheduler::disk_tier_refusal`], [`frink_models::shift::shift_refusal`]);
/// an encoder keeps no cache, so none applies.
///
/// Errors: a flag the model cannot honour.
pub fn check_model_flags(config: &ServeConfig, model: &frink_models::ModelConfig) -> Result<()> {
    if model.plan.encoder {
        return Ok(());
    }
    config
        .kv_type
        .check_heads(model)
        .map_err(anyhow::Error::msg)?;
    if config.cache_disk.is_some() {
        if let Some(why) = frink_engine::scheduler::disk_tier_refusal(model) {
            anyhow::bail!("--cache-disk: {why}");
        }
    }
    if config.context_shift {
        if let Some(why) = frink_models::shift::shift_refusal(model, config.ctx) {
            anyhow::bail!("--context-shift: {why}");
        }
    }
    Ok(())
}

/// The KV pool's positions for `config` on a model of `model`'s shape: `--kv-size`, else
/// `--kv-mem` bytes in whole blocks, else `--parallel × --ctx`; checked against this
/// machine's memory. `frink serve` calls it with the file's metadata before it listens, so
/// a size that cannot fit is refused before anything is bound or loaded.
///
/// # Errors
/// `--kv-mem` below one block, or a pool larger than the machine's memory, naming the
/// flags and the sizes.
pub fn kv_pool_positions(config: &ServeConfig, model: &frink_models::ModelConfig) -> Result<usize> {
    let (kv_size, what) = match (config.kv_size, config.kv_mem) {
        (0, Some(bytes)) => {
            let block = frink_models::KvPool::block_bytes(model, config.kv_type)
                .unwrap_or(usize::MAX)
                .max(1);
            anyhow::ensure!(
                bytes >= block,
                "--kv-mem {bytes}: one KV block of {} positions takes {block} bytes",
                frink_models::KV_BLOCK
            );
            (
                bytes / block * frink_models::KV_BLOCK,
                "--kv-mem".to_string(),
            )
        }
        (0, None) => (
            config.parallel.saturating_mul(config.ctx),
            format!(
                "--parallel {} × --ctx {} (the KV pool's default size)",
                config.parallel, config.ctx
            ),
        ),
        (n, _) => (n, "--kv-size".to_string()),
    };
    frink_engine::check_kv_memory(model, kv_size, 1, config.kv_type, &what)
        .map_err(anyhow::Error::msg)?;
    Ok(kv_size)
}

/// Loads the model at `path`, builds the tokenizer and starts the scheduler.
fn start_engine(
    config: &ServeConfig,
    path: &Path,
    lora: Option<&[std::path::PathBuf]>,
    load: &Loader,
) -> Result<Engine> {
    let mut model = load(path, lora)?;
    let vision = match &config.mmproj {
        Some(p) => Some(Arc::new(
            frink_vision::input::load_projector(p, &model.config).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let lora = model
        .adapters
        .iter()
        .map(|a| a.path.clone())
        .zip(model.lora_scales.iter().copied())
        .collect();
    let pooling = frink_engine::embed::pooling(config.pooling, model.config.pooling);
    let n_embd = model.config.n_embd;
    let mut info = ollama::ModelInfo::read(
        &model,
        &path.to_string_lossy(),
        config.chat_template.as_deref(),
    );
    if vision.is_some() {
        info.capabilities.push("vision");
    }
    let tok = Arc::new(
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?,
    );
    let encoder = model.config.plan.encoder;
    let reranker = model.has_classifier();
    let matryoshka = frink_engine::embed::matryoshka(&model);
    let arch = model.config.arch.name;
    // An encoder keeps no KV pool; its inputs are bounded by its positions, and a pass
    // takes `--ubatch` tokens.
    let kv_size = match encoder {
        true => 0,
        false => kv_pool_positions(config, &model.config)?,
    };
    check_model_flags(config, &model.config)?;
    let sched_config = SchedulerConfig {
        parallel: config.parallel,
        n_ctx: config.ctx,
        kv_size,
        queue: config.queue,
        kv_type: config.kv_type,
        ctx_checkpoints: config.ctx_checkpoints,
        checkpoint_interval: config.checkpoint_interval,
        checkpoint_budget: config.checkpoint_budget,
        prompt_lookup: config.prompt_lookup,
        draft_max: config.draft_max,
        draft_p_min: config.draft_p_min,
        draft_min: config.draft_min,
        spec_adaptive: config.spec_adaptive,
        spec_sampling: config.spec_sampling,
        context_shift: config.context_shift && !encoder,
        cache_disk: config.cache_disk.clone().filter(|_| !encoder),
        prefill_chunk_alone: match encoder {
            true => config.ubatch,
            false => SchedulerConfig::default().prefill_chunk_alone,
        },
        ..SchedulerConfig::default()
    };
    let prompt_limit = match encoder {
        true => frink_engine::scheduler::PromptLimit {
            n_ctx: encoder_ctx(&model.config),
            kv_positions: usize::MAX,
        },
        false => sched_config.prompt_limit(),
    };
    let draft = config
        .draft_model
        .as_deref()
        .map(|p| frink_engine::load_draft_model(p, &tok, config.kv_type))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let sched = Scheduler::start_with_draft(model, draft, Arc::clone(&tok), sched_config);
    let grammars = GrammarCompiler::new(Arc::clone(&tok))
        .context("cannot index the vocabulary for grammars")?;
    Ok(Engine {
        lora: std::sync::Mutex::new(lora),
        sched,
        tok,
        grammars,
        pooling,
        n_embd,
        info,
        prompt_limit,
        infill_vocab: OnceLock::new(),
        vision,
        encoder,
        reranker,
        matryoshka,
        arch,
        context_shift: config.context_shift && !encoder,
    })
}

/// The context an encoder's server runs with: one past its longest input, its position
/// count (`--ctx` does not apply), as a decoder's context leaves a position to generate
/// into.
fn encoder_ctx(model: &frink_models::ModelConfig) -> usize {
    model.n_ctx_train.saturating_add(1)
}

/// A model-scoped route: its path, its methods (for the top router's own method check)
/// and the model router's handlers.
pub(crate) type ModelRoute = (
    &'static str,
    &'static str,
    fn() -> MethodRouter<Arc<AppState>>,
);

/// The model-scoped endpoints: the top router sends each to
/// [`crate::models::dispatch::dispatch`], which passes it to the model's [`model_router`].
pub(crate) const MODEL_ROUTES: &[ModelRoute] = {
    use crate::{anthropic, embeddings, infill, native, requests, rerank, responses};
    &[
        ("/v1/chat/completions", "POST", || {
            post(requests::chat_completions)
        }),
        ("/chat/completions", "POST", || {
            post(requests::chat_completions)
        }),
        ("/v1/completions", "POST", || post(requests::completions)),
        ("/completions", "POST", || post(requests::completions)),
        ("/v1/embeddings", "POST", || post(embeddings::embeddings)),
        ("/v1/rerank", "POST", || post(rerank::rerank)),
        ("/rerank", "POST", || post(rerank::rerank)),
        ("/v1/reranking", "POST", || post(rerank::rerank)),
        ("/reranking", "POST", || post(rerank::rerank)),
        ("/embeddings", "POST", || {
            post(embeddings::embeddings_llamacpp)
        }),
        ("/api/chat", "POST", || post(ollama::chat)),
        ("/api/generate", "POST", || post(ollama::generate)),
        ("/api/embed", "POST", || post(ollama::embed)),
        ("/api/embeddings", "POST", || post(ollama::embeddings)),
        ("/lora-adapters", "GET POST", || {
            get(native::lora_adapters).post(native::set_lora_adapters)
        }),
        ("/infill", "POST", || post(infill::infill)),
        ("/completion", "POST", || post(native::completion)),
        ("/props", "GET", || get(native::props)),
        ("/slots", "GET", || get(crate::slots::list)),
        ("/slots/{id}", "POST", || post(crate::slots::action)),
        ("/v1/responses", "POST", || post(responses::create)),
        ("/v1/messages", "POST", || post(anthropic::messages)),
        ("/v1/messages/count_tokens", "POST", || {
            post(anthropic::count_tokens)
        }),
        ("/tokenize", "POST", || post(native::tokenize)),
        ("/detokenize", "POST", || post(native::detokenize)),
    ]
};

/// The router of one loaded model: the handlers of [`MODEL_ROUTES`] over its state.
pub(crate) fn model_router(app: Arc<AppState>) -> Router {
    MODEL_ROUTES
        .iter()
        .fold(Router::new(), |r, (path, _, handlers)| {
            r.route(path, handlers())
        })
        .with_state(app)
}

/// How the server loads a model: the server's settings with the model's name and file.
pub(crate) struct Builder {
    pub config: ServeConfig,
    pub loader: Loader,
    pub shared: Arc<Shared>,
}

impl Builder {
    /// The server's settings for `source`: its name and file, a `--models-config` model's
    /// own settings over the flags.
    fn config_of(&self, source: &Source) -> ServeConfig {
        let mut c = ServeConfig {
            model_name: source.name.clone(),
            model_path: Some(source.path.clone()),
            // The draft model speculates for the -m model (whose vocabulary it shares).
            draft_model: self.config.draft_model.clone().filter(|_| source.is_cli),
            // So does the projector file.
            mmproj: self.config.mmproj.clone().filter(|_| source.is_cli),
            ..self.config.clone()
        };
        if let Some(s) = &source.settings {
            c.ctx = s.ctx.unwrap_or(c.ctx);
            c.parallel = s.parallel.unwrap_or(c.parallel);
            if s.kv_size.is_some() || s.ctx.is_some() || s.parallel.is_some() {
                // Its own pool: the size given, else its slots × its context.
                c.kv_size = s.kv_size.unwrap_or(0);
                c.kv_mem = None;
            }
            c.kv_type = frink_models::KvType {
                k: s.cache_types.0.unwrap_or(c.kv_type.k),
                v: s.cache_types.1.unwrap_or(c.kv_type.v),
            };
            c.pooling = s.pooling.or(c.pooling);
            c.chat_template = s.chat_template.clone().or(c.chat_template);
            c.draft_model = s.draft_model.clone();
            c.draft_max = s.draft_max.unwrap_or(c.draft_max);
        }
        c
    }
}

impl Build for Builder {
    fn bytes(&self, source: &Source) -> Result<u64, ApiError> {
        let fail = |e: String| {
            crate::models::server_error(format!(
                "cannot load model '{}' ({}): {e}",
                source.name,
                source.path.display()
            ))
        };
        let file = frink_gguf::GgufFile::open(&source.path).map_err(|e| fail(e.to_string()))?;
        let shape = frink_models::ModelConfig::from_gguf(&file).map_err(|e| fail(e.to_string()))?;
        let config = self.config_of(source);
        let positions = match shape.plan.encoder {
            true => 0,
            false => kv_pool_positions(&config, &shape).map_err(|e| fail(e.to_string()))?,
        };
        let block = frink_models::KvPool::block_bytes(&shape, config.kv_type).unwrap_or(0);
        let kv = ((positions / frink_models::KV_BLOCK) as u64 + 1).saturating_mul(block as u64);
        // The model's file, its draft model's and its adapters'.
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let files = std::iter::once(source.path.as_path())
            .chain(config.draft_model.as_deref())
            .chain(
                source
                    .settings
                    .iter()
                    .flat_map(|s| s.lora.iter().map(|p| p.as_path())),
            )
            .map(size)
            .fold(0u64, u64::saturating_add);
        Ok(files.saturating_add(kv))
    }

    fn load(&self, source: &Source) -> Result<Loaded> {
        let mut config = self.config_of(source);
        let lora = source.settings.as_ref().map(|s| s.lora.as_slice());
        let engine = start_engine(&config, &source.path, lora, &self.loader)?;
        // An encoder's context is its inputs' bound (what the server's checks read).
        config.ctx = engine.prompt_limit.n_ctx;
        eprintln!(
            "frink serve: {}",
            banner(
                &config,
                &source.path,
                &engine,
                config.chat_template.as_deref()
            )
        );
        let app = Arc::new(AppState {
            engine: OnceLock::new(),
            model_name: source.name.clone(),
            queue: config.queue,
            n_ctx: config.ctx,
            chat_template: config.chat_template.clone(),
            chat_template_kwargs: config.chat_template_kwargs.clone(),
            split_reasoning: config.split_reasoning,
            parallel: config.parallel,
            images: crate::images::ImageLimits {
                allow_urls: config.allow_image_urls,
                max_pixels: config.image_max_pixels,
            },
            shared: Arc::clone(&self.shared),
            slot_save_path: config.slot_save_path.clone(),
        });
        let _ = app.engine.set(engine);
        Ok(Loaded {
            router: model_router(Arc::clone(&app)),
            app,
        })
    }
}
