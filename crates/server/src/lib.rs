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
//! Several models can be served: each request's `model` selects one, loaded on demand
//! ([`models`]); each loaded model has its own scheduler and router ([`engine`]).
//!
//! Endpoints and shapes follow CONTRACT.md (HTTP): `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models`, `GET /health`, `GET /metrics`,
//! `POST /tokenize`, `POST /detokenize`, and the Ollama, Anthropic and llama.cpp families.

pub mod answer;
mod anthropic;
pub mod api;
pub mod calls;
pub mod conn;
pub mod cors;
mod embeddings;
mod engine;
pub mod gate;
pub mod harmony;
mod images;
mod infill;
pub mod log;
mod metrics;
pub mod models;
mod native;
pub mod ollama;
mod pull;
pub mod reasoning;
mod requests;
mod rerank;
mod respond;
mod responses;
mod slots;
pub mod tools;
pub mod webui;

use engine::Engine;
pub use engine::{check_model_flags, kv_pool_positions};
use metrics::metrics;
use respond::shutting_down;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use frink_engine::scheduler::{Completion, Event};
use frink_models::{KvType, Model};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{json_response, ApiError};

/// Settings of `frink serve` (CONTRACT.md).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The `-m` value: the name the `-m` model is served under (empty without `-m`).
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
    /// Tokens an encoder model evaluates in one pass at most, over all the inputs it
    /// groups (`--ubatch`; an input longer than this goes alone).
    pub ubatch: usize,
    /// The `-m` model's file; `None`: the server was started without `-m` and loads the
    /// model each request names.
    pub model_path: Option<std::path::PathBuf>,
    /// Models resident at once, at most (`--max-models`).
    pub max_models: usize,
    /// Bytes the resident models may hold together (`--max-memory`; each counted as its
    /// file and KV pool); `None`: what the machine has available at start.
    pub max_memory: Option<u64>,
    /// How long a model stays loaded after its last request (`--keep-alive`; the `-m`
    /// model stays loaded unless a request says otherwise).
    pub keep_alive: models::KeepAlive,
    /// `--models-config`'s models and their own settings.
    pub models_config: Vec<models::config::ModelSettings>,
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
    /// `--context-shift`: a generation that reaches the context drops its oldest tokens
    /// and goes on ([`frink_engine::scheduler::SchedulerConfig::context_shift`]).
    pub context_shift: bool,
    /// `--slot-save-path DIR`: `POST /slots/{id}?action=save|restore` files live there.
    pub slot_save_path: Option<std::path::PathBuf>,
    /// `--cache-disk DIR` and `--cache-disk-size BYTES`: the prefix cache's disk tier
    /// ([`frink_engine::scheduler::SchedulerConfig::cache_disk`]).
    pub cache_disk: Option<(std::path::PathBuf, u64)>,
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
    /// The `-m` model's projector file (`--mmproj`): its requests may carry images.
    pub mmproj: Option<std::path::PathBuf>,
    /// `--allow-image-urls`: images given by `http(s)` URL are fetched (else refused).
    pub allow_image_urls: bool,
    /// `--image-max-pixels`: the most pixels an image may have.
    pub image_max_pixels: u64,
    /// The chat page at `/` (`--no-webui`, `--webui-path`).
    pub webui: webui::WebUi,
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

/// What every loaded model shares with the rest of the server.
struct Shared {
    /// Requests' preparation (template, tokenizer, grammar) running off the HTTP threads
    /// at once, at most ([`AppState::offload`]).
    preparing: Arc<tokio::sync::Semaphore>,
    /// Stored responses of the Responses API (`previous_response_id`).
    responses: responses::Store,
    next_id: AtomicU64,
    /// Prefix groups of multi-choice requests (apart from response ids, which stay 1, 2, 3…).
    next_group: AtomicU64,
    created: u64,
}

/// One loaded model's side of the server: its engine and the settings its requests are
/// prepared with (the state of its router, [`engine::model_router`]).
struct AppState {
    /// The model's engine (set when it is loaded).
    engine: OnceLock<Engine>,
    /// The name it is served under.
    model_name: String,
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
    /// How images are taken ([`images::ImageLimits`]).
    images: images::ImageLimits,
    /// `--slot-save-path`: where slot states are saved and restored from.
    slot_save_path: Option<std::path::PathBuf>,
    shared: Arc<Shared>,
}

/// The server's state: the models it has and holds, and everything not one model's.
pub(crate) struct Server {
    registry: models::registry::Registry,
    models: Arc<models::Models>,
    /// The `-m` model has loaded (`/health` says `loading` before); true without `-m`.
    ready: std::sync::atomic::AtomicBool,
    /// The keys the gate accepts ([`gate::ApiKeys`]).
    keys: gate::ApiKeys,
    /// The origins allowed cross-origin requests ([`cors::Cors`]).
    cors: cors::Cors,
    /// The open connections and their limits.
    conns: Arc<conn::ConnTable>,
    /// The `hf:` and catalog names being pulled (`/api/pull`), at most [`PULLS`] at once.
    pulls: std::sync::Mutex<std::collections::HashSet<String>>,
    /// How request lines are written ([`log::LogFormat`]).
    log_format: log::LogFormat,
    /// `--log-prompts` ([`ServeConfig::log_prompts`]).
    log_prompts: bool,
    /// The chat template override (what `/api/show` reports).
    chat_template: Option<String>,
    /// The `-m` model is served with a projector file (`/api/show` reports `vision`).
    cli_vision: bool,
    /// The largest request body read ([`gate::MAX_BODY_BYTES`], larger with images).
    max_body: usize,
    /// The chat page ([`webui`]).
    pub(crate) webui: webui::WebUi,
    /// What `/api/tags` and `/api/show` report of each file, by its modification time.
    infos: std::sync::Mutex<
        std::collections::HashMap<std::path::PathBuf, (SystemTime, Arc<ollama::ModelInfo>)>,
    >,
    shared: Arc<Shared>,
    created: u64,
}

/// When a model-scoped request arrived, and how long it waited for its model to load
/// (zero if it was loaded): Ollama's `total_duration` and `load_duration` count them
/// (set by [`models::dispatch`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arrival {
    pub at: std::time::Instant,
    pub load: std::time::Duration,
}

/// Loads a model file (sizing the compute pool first): the caller's policy, run on a
/// thread of its own for each model the server loads. The adapters: `None` the
/// caller's own rule (`--lora` for the `-m` model), else these at scale 1.
pub type Loader =
    Arc<dyn Fn(&std::path::Path, Option<&[std::path::PathBuf]>) -> Result<Model> + Send + Sync>;

/// Runs the server until SIGINT or SIGTERM; returns once it has shut down.
///
/// The listener is bound first and the `-m` model (if any) loads in the background, so
/// `/health` answers `503 {"status": "loading"}` until it is ready; other models load
/// when a request names them.
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

/// The server's state for `config`.
fn server_state(config: &ServeConfig, loader: Loader) -> Arc<Server> {
    let shared = Arc::new(Shared {
        preparing: Arc::new(tokio::sync::Semaphore::new(PREPARING)),
        responses: responses::Store::default(),
        next_id: AtomicU64::new(1),
        next_group: AtomicU64::new(1),
        created: unix_now(),
    });
    let store = frink_store::Store::from_env().ok();
    let registry = models::registry::Registry::new(
        config
            .model_path
            .clone()
            .map(|p| (config.model_name.clone(), p)),
        config.models_config.clone(),
        store,
        frink_store::home_file("aliases.json"),
    );
    let build = Arc::new(engine::Builder {
        config: config.clone(),
        loader,
        shared: Arc::clone(&shared),
    });
    let models = Arc::new(models::Models::new(
        build,
        config.max_models,
        config.max_memory.unwrap_or_else(models::available_memory),
        config.keep_alive,
        config.conn.io_timeout,
    ));
    Arc::new(Server {
        registry,
        models,
        ready: std::sync::atomic::AtomicBool::new(config.model_path.is_none()),
        keys: gate::ApiKeys::new(&config.api_keys),
        cors: cors::Cors::new(&config.cors_origins),
        conns: Arc::new(conn::ConnTable::new(config.conn)),
        pulls: Default::default(),
        log_format: config.log_format,
        log_prompts: config.log_prompts,
        chat_template: config.chat_template.clone(),
        cli_vision: config.mmproj.is_some(),
        max_body: match config.mmproj {
            Some(_) => gate::MAX_BODY_BYTES_IMAGES,
            None => gate::MAX_BODY_BYTES,
        },
        webui: config.webui.clone(),
        infos: Default::default(),
        created: shared.created,
        shared,
    })
}

/// The routes: the server's own, and every model-scoped one through
/// [`models::dispatch::dispatch`] (the same paths as [`engine::model_router`]).
fn router(state: &Arc<Server>) -> Router {
    let mut app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models::manage::list))
        .route("/v1/models/{*id}", get(models::manage::retrieve))
        .route("/models", get(models::manage::list))
        .route("/models/load", post(models::manage::load))
        .route("/models/unload", post(models::manage::unload))
        .route("/api/show", post(models::manage::show))
        .route("/api/pull", post(pull::pull))
        .route("/api/tags", get(models::manage::tags))
        .route("/api/ps", get(models::manage::ps))
        .route("/api/delete", axum::routing::delete(models::manage::delete))
        .route("/api/copy", post(models::manage::copy))
        .route("/api/create", post(models::manage::create))
        .route("/api/version", get(ollama::version))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/", get(page))
        .route("/favicon.ico", get(page))
        .route("/webui/{*file}", get(page));
    for (path, method, _) in engine::MODEL_ROUTES {
        let d = match *method {
            "GET" => get(models::dispatch::dispatch),
            "GET POST" => get(models::dispatch::dispatch).post(models::dispatch::dispatch),
            _ => post(models::dispatch::dispatch),
        };
        app = app.route(path, d);
    }
    // Bodies are read and bounded by the gate ([`gate::MAX_BODY_BYTES`], larger with a
    // projector file), not by axum's 2 MB default, which cut image requests at 2 MB.
    app.layer(axum::extract::DefaultBodyLimit::disable())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::clone(state))
}

async fn serve(config: ServeConfig, loader: Loader) -> Result<()> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    serve_on(listener, config, loader, shutdown_signal()).await
}

/// Serves on `listener` (`config`'s host and port are not read) until `shutdown`
/// completes, then shuts down as on SIGTERM: the server [`run`] starts, for a caller that
/// binds its own socket (the server's tests, in-process).
///
/// Errors: a failed load of the `-m` model; an accept loop that fails.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    config: ServeConfig,
    loader: Loader,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let local: SocketAddr = listener.local_addr()?;
    let state = server_state(&config, loader);
    // Load the -m model off the runtime; a failure ends the server.
    let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<anyhow::Error>();
    match state.registry.cli_source() {
        Some(source) => {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                // No time limit: a large -m model may load for long.
                match state.models.acquire_waiting(&source, None).await {
                    Ok(lease) => {
                        drop(lease);
                        state.ready.store(true, Ordering::Release);
                        tracing::info!("model loaded; serving on http://{local}");
                        eprintln!("frink serve: ready on http://{local}");
                    }
                    Err(e) => {
                        let _ = fail_tx.send(anyhow::anyhow!("{}", e.message));
                    }
                }
            });
            eprintln!("frink serve: listening on http://{local} (loading the model)");
        }
        None => {
            drop(fail_tx);
            eprintln!(
                "frink serve: no -m: models load when a request names one ({} listed)",
                state.registry.list().len()
            );
            eprintln!("frink serve: ready on http://{local}");
        }
    }
    {
        // Idle models go when their keep-alive ends.
        let models = Arc::clone(&state.models);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                models.expire();
            }
        });
    }
    let app = router(&state);
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
        () = shutdown => {}
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
            let busy: usize = state
                .models
                .each_app()
                .iter()
                .filter_map(|a| a.engine.get())
                .map(|e| e.sched.in_flight())
                .sum();
            if busy == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await
        }
    };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, wait_idle).await;
    for a in state.models.each_app() {
        if let Some(e) = a.engine.get() {
            e.sched.cancel_all();
        }
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
        let permit = Arc::clone(&self.shared.preparing)
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
        format!(
            "{prefix}-{}",
            self.shared.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }
}

type St = State<Arc<AppState>>;

/// A file of the chat page ([`webui::serve`]), or the API's 404.
async fn page(State(st): State<Arc<Server>>, uri: axum::http::Uri) -> Response {
    match webui::serve(&st.webui, uri.path()) {
        Some(r) => r,
        None => not_found(uri).await,
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    gate::error_for_path(
        uri.path(),
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no such endpoint",
        )
        .with_code("not_found"),
    )
}

async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    gate::error_for_path(
        uri.path(),
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this endpoint does not take that HTTP method",
        )
        .with_code("method_not_allowed"),
    )
}

/// `GET /health`: 200 once the `-m` model has loaded (at once without `-m`), 503
/// `{"status": "loading"}` before.
async fn health(State(srv): State<Arc<Server>>) -> Response {
    if srv.ready.load(Ordering::Acquire) {
        json_response(StatusCode::OK, &json!({"status": "ok"}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "loading"}),
        )
    }
}
