//! `frink serve`: an OpenAI-compatible HTTP server over the engine's continuous-batching
//! scheduler.
//!
//! The HTTP side runs on a small tokio runtime; inference runs on the scheduler's own
//! thread (frink-engine `scheduler`), so `/health` and the other endpoints answer while a
//! long prompt is being evaluated. Each completion request is parsed and tokenized here,
//! queued (503 when the queue is full), and its events come back through a channel: a
//! streamed answer is written as server-sent events as they arrive, ending in
//! `data: [DONE]`. When the client goes away the channel closes and the scheduler frees the
//! request's slot at its next step.
//!
//! Endpoints and shapes follow CONTRACT.md (HTTP): `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models`, `GET /health`, `GET /metrics`,
//! `POST /tokenize`, `POST /detokenize`.

pub mod answer;
mod anthropic;
pub mod api;
pub mod calls;
pub mod conn;
pub mod cors;
mod embeddings;
pub mod gate;
pub mod harmony;
mod infill;
pub mod log;
mod metrics;
mod native;
pub mod ollama;
mod pull;
pub mod reasoning;
mod requests;
mod respond;
mod responses;
pub mod tools;

use embeddings::{embeddings, embeddings_llamacpp};
use metrics::metrics;
use requests::{chat_completions, completions};
use respond::shutting_down;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use frink_engine::constraint::{Constraint, GrammarCompiler};
use frink_engine::scheduler::{Completion, Event, Scheduler, SchedulerConfig};
use frink_models::{KvType, Model};
use frink_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{json_response, ApiError};

/// Settings of `frink serve` (CONTRACT.md).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The name reported by `/v1/models` (the `-m` value).
    pub model_name: String,
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0: any free port; the chosen one is logged).
    pub port: u16,
    /// Sequence slots decoded together.
    pub parallel: usize,
    /// Positions one request may use at most (`--ctx`).
    pub ctx: usize,
    /// Positions of the KV block pool all requests share (`--kv-size`; 0: from
    /// `kv_mem`, else `parallel × ctx`).
    pub kv_size: usize,
    /// Bytes of the KV block pool (`--kv-mem`), when `kv_size` is 0.
    pub kv_mem: Option<usize>,
    /// Requests that may wait for a slot.
    pub queue: usize,
    /// Keys accepted on every route but `GET /health` (`--api-key`, repeatable, and
    /// `--api-key-file`); none: no key is required.
    pub api_keys: Vec<String>,
    /// Origins whose web pages may call the server (`--cors-origin`, repeatable; `*` any;
    /// none: no cross-origin answers) ([`cors::Cors`]).
    pub cors_origins: Vec<String>,
    /// Limits on connections (`--max-connections`, the timeouts; [`conn::ConnLimits`]).
    pub conn: conn::ConnLimits,
    /// KV cache element type.
    pub kv_type: KvType,
    /// A Jinja chat template to use instead of the model file's (`--chat-template[-file]`).
    pub chat_template: Option<String>,
    /// Template variables every chat request gets (`--chat-template-kwargs`); a request's
    /// `chat_template_kwargs` add to and override them.
    pub chat_template_kwargs: serde_json::Map<String, Value>,
    /// Separate `<think>` reasoning into `reasoning_content` (`--reasoning-format auto`,
    /// the default) or keep it in the content (`none`); a request's `reasoning_format`
    /// overrides it.
    pub split_reasoning: bool,
    /// Embeddings' pooling (`--pooling`; `None`: the file's, else mean).
    pub pooling: Option<frink_models::Pooling>,
    /// The model file (what Ollama's `/api/show` and `/api/tags` describe).
    pub model_path: std::path::PathBuf,
    /// Recurrent models: checkpoints per slot, positions between them, bytes in all
    /// ([`frink_engine::scheduler::SchedulerConfig::ctx_checkpoints`]).
    pub ctx_checkpoints: usize,
    pub checkpoint_interval: usize,
    pub checkpoint_budget: usize,
    /// Prompt-lookup speculation (`--spec ngram`) for requests without a `prediction`.
    pub prompt_lookup: bool,
    /// Most tokens proposed per step (`--draft-max`; 0: no speculation).
    pub draft_max: usize,
    /// The draft model's file (`--draft-model`): requests without a prediction speculate
    /// with its proposals instead of prompt lookup.
    pub draft_model: Option<std::path::PathBuf>,
    /// `--draft-p-min`, `--draft-min` ([`frink_engine::DraftModel`]).
    pub draft_p_min: f32,
    pub draft_min: usize,
    /// `--spec-adaptive`: each request proposes the number of tokens that pays on this
    /// machine's measured step times (`true`), or as many as `--draft-max` and the batch
    /// allow (`false`) ([`SchedulerConfig::spec_adaptive`]).
    pub spec_adaptive: bool,
    /// `--spec-sampling`: how proposals are accepted ([`SchedulerConfig::spec_sampling`]).
    pub spec_sampling: frink_engine::SpecSampling,
    /// How each request's log line is written (`--log-format`, `--log-disable`).
    pub log_format: log::LogFormat,
    /// `--log-prompts`: the log lines carry the prompt and the answer text.
    pub log_prompts: bool,
}

/// How long in-flight requests may run on after SIGINT/SIGTERM before they are cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Pulls (`/api/pull`) running at once: each holds a thread for its whole download, so
/// they are few (more is a 503) and one name is pulled once at a time (a 409 meanwhile).
const PULLS: usize = 2;

/// Requests prepared (template rendered, prompt tokenized, grammar compiled) at once, each
/// on a blocking thread of its own: the two HTTP threads never wait on that work, so
/// `/health` and light requests answer while heavy ones are prepared.
const PREPARING: usize = 4;

/// The loaded model's side of the server.
struct Engine {
    sched: Scheduler,
    tok: Arc<Tokenizer>,
    /// Compiles requests' grammars against the vocabulary.
    grammars: GrammarCompiler,
    /// How embeddings pool ([`frink_engine::embed::pooling`]).
    pooling: frink_models::Pooling,
    /// The model's hidden size (an embedding's length).
    n_embd: usize,
    /// What Ollama's endpoints report about the model.
    info: ollama::ModelInfo,
    /// The loaded LoRA adapters (path, current default scale), by id: `--lora`, changed by
    /// `POST /lora-adapters`.
    lora: std::sync::Mutex<Vec<(String, f32)>>,
    /// The prompt lengths the scheduler runs (a longer prompt can never run).
    prompt_limit: frink_engine::scheduler::PromptLimit,
    /// What llama.cpp's `infill` sampler reads of the vocabulary, built at its first use.
    infill_vocab: OnceLock<Arc<frink_engine::sampling::InfillVocab>>,
}

impl Engine {
    /// The vocabulary as llama.cpp's `infill` sampler reads it: each token's text without
    /// control tokens' (`token_to_piece(id, special = false)`), the end-of-generation ids,
    /// and the end-of-turn token (EOS where the model names none).
    fn infill_vocab(&self) -> Arc<frink_engine::sampling::InfillVocab> {
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
    fn lora_set(&self, requested: Option<&Value>) -> Result<Vec<(usize, f32)>, ApiError> {
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
    fn constraint(
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

struct AppState {
    /// Set once the model is loaded (`/health` says `loading` before).
    engine: OnceLock<Engine>,
    model_name: String,
    /// The keys the gate accepts ([`gate::ApiKeys`]).
    keys: gate::ApiKeys,
    /// The origins allowed cross-origin requests ([`cors::Cors`]).
    cors: cors::Cors,
    /// The open connections and their limits.
    conns: Arc<conn::ConnTable>,
    /// Requests' preparation (template, tokenizer, grammar) running off the HTTP threads
    /// at once, at most ([`AppState::offload`]).
    preparing: Arc<tokio::sync::Semaphore>,
    /// The `hf:` and catalog names being pulled (`/api/pull`), at most [`PULLS`] at once.
    pulls: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Embedding inputs the scheduler's queue holds (`--queue`): a request's inputs are
    /// submitted in waves of at most this many.
    queue: usize,
    n_ctx: usize,
    /// The chat template override and the default template variables.
    chat_template: Option<String>,
    chat_template_kwargs: Map<String, Value>,
    split_reasoning: bool,
    /// Slots: the most choices (`n`) one request may ask for.
    parallel: usize,
    /// How request lines are written ([`log::LogFormat`]).
    log_format: log::LogFormat,
    /// `--log-prompts` ([`ServeConfig::log_prompts`]).
    log_prompts: bool,
    created: u64,
    next_id: AtomicU64,
    /// Stored responses of the Responses API (`previous_response_id`).
    responses: responses::Store,
    /// Prefix groups of multi-choice requests (apart from response ids, which stay 1, 2, 3…).
    next_group: AtomicU64,
}

/// What is served, once loaded: the model's name, file and architecture, the context,
/// slots, KV pool, threads, device and the tool-call and reasoning formats its template
/// teaches.
fn banner(config: &ServeConfig, eng: &Engine, template: Option<&str>) -> String {
    let template = template.or(eng.tok.chat_template()).unwrap_or("");
    let tools = tools::ToolFormat::detect(template).map_or("none", |f| f.name());
    let thinking = if template.contains("<think>") || template.contains("<|channel") {
        "yes"
    } else {
        "no"
    };
    format!(
        "model {} ({}), architecture {}, context {} tokens, {} slots, KV pool {} positions \
         ({:?}), {} threads, device cpu, tool calls {tools}, reasoning {thinking}",
        config.model_name,
        config.model_path.display(),
        eng.tok.architecture(),
        config.ctx,
        config.parallel,
        eng.prompt_limit.kv_positions,
        config.kv_type,
        frink_models::pool::threads(),
    )
}

/// Loads the model (sizing the compute pool first): the caller's policy, run on a
/// background thread once the listener is bound.
pub type Loader = Box<dyn FnOnce() -> Result<Model> + Send>;

/// Runs the server until SIGINT or SIGTERM; returns once it has shut down.
///
/// The listener is bound first and `load` runs in the background, so `/health` answers
/// `503 {"status": "loading"}` until the model is ready.
pub fn run(config: ServeConfig, load: Loader) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("frink-http")
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")?;
    let r = rt.block_on(serve(config, load));
    // A download (`/api/pull`) still running on a blocking thread must not keep the
    // process alive after shutdown.
    rt.shutdown_timeout(Duration::from_millis(500));
    r
}

async fn serve(config: ServeConfig, loader: Loader) -> Result<()> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local: SocketAddr = listener.local_addr()?;
    let state = Arc::new(AppState {
        engine: OnceLock::new(),
        model_name: config.model_name.clone(),
        keys: gate::ApiKeys::new(&config.api_keys),
        cors: cors::Cors::new(&config.cors_origins),
        conns: Arc::new(conn::ConnTable::new(config.conn)),
        preparing: Arc::new(tokio::sync::Semaphore::new(PREPARING)),
        pulls: Default::default(),
        queue: config.queue,
        n_ctx: config.ctx,
        chat_template: config.chat_template.clone(),
        chat_template_kwargs: config.chat_template_kwargs.clone(),
        split_reasoning: config.split_reasoning,
        parallel: config.parallel,
        log_format: config.log_format,
        log_prompts: config.log_prompts,
        created: unix_now(),
        next_id: AtomicU64::new(1),
        next_group: AtomicU64::new(1),
        responses: responses::Store::default(),
    });
    // Load the model off the runtime; a failure ends the server.
    let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<anyhow::Error>();
    {
        let state = Arc::clone(&state);
        let config = config.clone();
        std::thread::spawn(move || match start_engine(&config, loader) {
            Ok(engine) => {
                let banner = banner(&config, &engine, state.chat_template.as_deref());
                let _ = state.engine.set(engine);
                tracing::info!("model loaded; serving on http://{local}");
                eprintln!("frink serve: {banner}");
                eprintln!("frink serve: ready on http://{local}");
            }
            Err(e) => {
                let _ = fail_tx.send(e);
            }
        });
    }
    eprintln!("frink serve: listening on http://{local} (loading the model)");

    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/embeddings", post(embeddings_llamacpp))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/show", post(ollama::show))
        .route("/api/pull", post(pull::pull))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/lora-adapters", get(lora_adapters).post(set_lora_adapters))
        .route("/infill", post(infill::infill))
        .route("/completion", post(native::completion))
        .route("/props", get(native::props))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::clone(&state));
    // The gate runs before routing: the key, the bounded body, the connection's mark.
    let service = tower_layer::Layer::layer(
        &axum::middleware::from_fn_with_state(Arc::clone(&state), gate::gate),
        app,
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut accepting = tokio::spawn(conn::accept_loop(
        listener,
        service,
        Arc::clone(&state.conns),
        stop_rx,
    ));
    tokio::select! {
        r = &mut accepting => {
            r?;
            return Ok(());
        }
        // A successful load drops the sender: this branch is then disabled.
        Some(e) = fail_rx.recv() => return Err(e),
        () = shutdown_signal() => {}
    }
    eprintln!(
        "frink serve: shutting down (listener closed; in-flight requests get {} s)",
        SHUTDOWN_GRACE.as_secs()
    );
    // The accept loop drops the listener: new connections are refused from here on.
    let _ = stop_tx.send(true);
    let _ = accepting.await;
    // Let running requests finish for a while, then cancel them; their streams end.
    let wait_idle = async {
        loop {
            match state.engine.get() {
                Some(e) if e.sched.in_flight() > 0 => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, wait_idle).await;
    if let Some(e) = state.engine.get() {
        e.sched.cancel_all();
    }
    let t0 = std::time::Instant::now();
    while state.conns.open_count() > 0 {
        if t0.elapsed() > Duration::from_secs(5) {
            tracing::warn!("connections still open after shutdown; closing them");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("frink serve: stopped");
    Ok(())
}

/// Loads the model, builds the tokenizer and starts the scheduler.
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

fn start_engine(config: &ServeConfig, load: Loader) -> Result<Engine> {
    let mut model = load()?;
    let lora = model
        .adapters
        .iter()
        .map(|a| a.path.clone())
        .zip(model.lora_scales.iter().copied())
        .collect();
    let pooling = frink_engine::embed::pooling(config.pooling, model.config.pooling);
    let n_embd = model.config.n_embd;
    let info = ollama::ModelInfo::read(
        &model,
        &config.model_path.to_string_lossy(),
        config.chat_template.as_deref(),
    );
    let tok = Arc::new(
        Tokenizer::from_gguf_releasing(&mut model.file).context("cannot build the tokenizer")?,
    );
    let kv_size = kv_pool_positions(config, &model.config)?;
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
        ..SchedulerConfig::default()
    };
    let prompt_limit = sched_config.prompt_limit();
    let draft = config
        .draft_model
        .as_deref()
        .map(|p| frink_engine::load_draft_model(p, &tok))
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
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    /// Runs `f` (a request's preparation: template, tokenizer, grammar) on a blocking
    /// thread, at most [`PREPARING`] at once, so the HTTP threads never wait on it.
    ///
    /// Errors: those of `f`; a 500 if it panicked.
    async fn offload<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        // The permit lives as long as the work: a client that goes away drops this future,
        // not the blocking job, which keeps its permit until it ends.
        let permit = Arc::clone(&self.preparing)
            .acquire_owned()
            .await
            .map_err(|_| shutting_down("the server is shutting down".into()))?;
        let st = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&st)
        })
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("preparing the request failed: {e}"),
            ))
        })
    }

    /// The loaded engine, or 503 while loading.
    fn engine(&self) -> Result<&Engine, ApiError> {
        self.engine.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                "the model is still loading",
            )
            .with_code("loading")
        })
    }

    /// The chat template prompts are rendered with: the server's override
    /// (`--chat-template[-file]`) or the file's.
    fn template<'a>(&'a self, eng: &'a Engine) -> Option<&'a str> {
        self.chat_template.as_deref().or(eng.tok.chat_template())
    }

    fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

type St = State<Arc<AppState>>;

async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint",
    )
    .with_code("not_found")
    .into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this endpoint does not take that HTTP method",
    )
    .with_code("method_not_allowed")
    .into_response()
}

async fn health(State(st): St) -> Response {
    if st.engine.get().is_some() {
        json_response(StatusCode::OK, &json!({"status": "ok"}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "loading"}),
        )
    }
}

async fn models(State(st): St) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [{
            "id": st.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "frink",
        }]}),
    )
}

/// llama-server's `GET /lora-adapters`: `[{"id", "path", "scale"}]`, the default scales.
async fn lora_adapters(State(st): St) -> Response {
    let r = (|| Ok::<_, ApiError>(lora_json(st.engine()?)))();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

/// llama-server's `POST /lora-adapters` `[{"id", "scale"}]`: sets the default scales (the
/// adapters it does not name to 0) and answers with the new list.
async fn set_lora_adapters(State(st): St, body: Bytes) -> Response {
    let r = (|| {
        let eng = st.engine()?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(None, format!("the body is not JSON: {e}")))?;
        {
            let mut cur = eng.lora.lock().unwrap_or_else(|e| e.into_inner());
            let list = api::lora_list(&v, cur.len(), "lora-adapters")?;
            for (i, (_, s)) in cur.iter_mut().enumerate() {
                *s = list.iter().find(|e| e.0 == i).map_or(0.0, |e| e.1);
            }
        }
        Ok::<_, ApiError>(lora_json(eng))
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

fn lora_json(eng: &Engine) -> Value {
    let cur = eng.lora.lock().unwrap_or_else(|e| e.into_inner());
    Value::Array(
        cur.iter()
            .enumerate()
            .map(|(i, (path, scale))| json!({"id": i, "path": path, "scale": scale}))
            .collect(),
    )
}

async fn tokenize(State(st): St, body: Bytes) -> Response {
    let r = st
        .offload(move |st| {
            let eng = st.engine()?;
            let obj = api::parse_object(&body)?;
            let content = api::opt_str(&obj, "content")?.unwrap_or_default();
            let add_special = api::opt_bool(&obj, "add_special")?.unwrap_or(false);
            let parse_special = api::opt_bool(&obj, "parse_special")?.unwrap_or(true);
            let ids = eng
                .tok
                .encode(content, add_special, parse_special)
                .map_err(|e| ApiError::invalid(Some("content"), e.to_string()))?;
            Ok::<_, ApiError>(json!({ "tokens": ids }))
        })
        .await;
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

async fn detokenize(State(st): St, body: Bytes) -> Response {
    let r = (|| {
        let eng = st.engine()?;
        let obj = api::parse_object(&body)?;
        let bad = || ApiError::invalid(Some("tokens"), "'tokens' must be an array of token ids");
        let ids = match obj.get("tokens") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(bad)?,
            Some(_) => return Err(bad()),
        };
        let text = eng
            .tok
            .decode(&ids, true)
            .map_err(|e| ApiError::invalid(Some("tokens"), e.to_string()))?;
        Ok(json!({ "content": text }))
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}
