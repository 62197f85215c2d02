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
pub mod api;
pub mod harmony;
pub mod ollama;
pub mod reasoning;
pub mod tools;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use frink_engine::constraint::{Constraint, GrammarCompiler};
use frink_engine::scheduler::{
    Completion, Event, EventSink, Histogram, Request, Scheduler, SchedulerConfig, SubmitError,
    TokenLogprob,
};
use frink_models::{KvType, Model};
use frink_tokenizer::{TemplateInputs, Tokenizer};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{json_response, ApiError, Endpoint, GenOptions, Prompt};

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
    /// Bearer token required on every endpoint but `/health`.
    pub api_key: Option<String>,
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
}

/// How long in-flight requests may run on after SIGINT/SIGTERM before they are cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
    /// Positions of the KV block pool (a longer prompt can never run).
    kv_positions: usize,
}

impl Engine {
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
    /// required tool call) for each of its `n` choices
    /// (each its own grammar state), or `n` times `None` without one.
    ///
    /// Errors: a 400 naming the field, with the compiler's message.
    fn constraints(
        &self,
        grammar: Option<(&'static str, frink_engine::constraint::Grammar)>,
        triggers: Option<Vec<frink_engine::constraint::Trigger>>,
        n: usize,
    ) -> Result<Vec<Option<Constraint>>, ApiError> {
        let Some((param, g)) = grammar else {
            return Ok((0..n).map(|_| None).collect());
        };
        (0..n)
            .map(|_| match &triggers {
                Some(t) => self.grammars.compile_lazy(&g, t.clone()).map(Some),
                None => self.grammars.compile(&g).map(Some),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                ApiError::invalid(Some(param), format!("'{param}': {e}"))
                    .with_code("invalid_grammar")
            })
    }
}

struct AppState {
    /// Set once the model is loaded (`/health` says `loading` before).
    engine: OnceLock<Engine>,
    model_name: String,
    api_key: Option<String>,
    n_ctx: usize,
    /// The chat template override and the default template variables.
    chat_template: Option<String>,
    chat_template_kwargs: Map<String, Value>,
    split_reasoning: bool,
    /// Slots: the most choices (`n`) one request may ask for.
    parallel: usize,
    created: u64,
    next_id: AtomicU64,
    /// Prefix groups of multi-choice requests (apart from response ids, which stay 1, 2, 3…).
    next_group: AtomicU64,
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
    rt.block_on(serve(config, load))
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
        api_key: config.api_key.clone().filter(|k| !k.is_empty()),
        n_ctx: config.ctx,
        chat_template: config.chat_template.clone(),
        chat_template_kwargs: config.chat_template_kwargs.clone(),
        split_reasoning: config.split_reasoning,
        parallel: config.parallel,
        created: unix_now(),
        next_id: AtomicU64::new(1),
        next_group: AtomicU64::new(1),
    });
    // Load the model off the runtime; a failure ends the server.
    let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<anyhow::Error>();
    {
        let state = Arc::clone(&state);
        let config = config.clone();
        std::thread::spawn(move || match start_engine(&config, loader) {
            Ok(engine) => {
                let _ = state.engine.set(engine);
                tracing::info!("model loaded; serving on http://{local}");
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
        .route("/api/pull", post(ollama::pull))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/lora-adapters", get(lora_adapters).post(set_lora_adapters))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::clone(&state));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let graceful = {
        let mut stop_rx = stop_rx.clone();
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }
    };
    let server = axum::serve(listener, app).with_graceful_shutdown(graceful);
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    tokio::select! {
        r = &mut server => { r?; return Ok(()); }
        // A successful load drops the sender: this branch is then disabled.
        Some(e) = fail_rx.recv() => return Err(e),
        () = shutdown_signal() => {}
    }
    eprintln!(
        "frink serve: shutting down (no new connections; in-flight requests get {} s)",
        SHUTDOWN_GRACE.as_secs()
    );
    let _ = stop_tx.send(true);
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
    if tokio::time::timeout(Duration::from_secs(5), &mut server)
        .await
        .is_err()
    {
        tracing::warn!("connections still open after shutdown; closing them");
    }
    eprintln!("frink serve: stopped");
    Ok(())
}

/// Loads the model, builds the tokenizer and starts the scheduler.
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
    // The pool: --kv-size positions, else --kv-mem bytes, else --parallel × --ctx.
    let (kv_size, what) = match (config.kv_size, config.kv_mem) {
        (0, Some(bytes)) => {
            let block = frink_models::KvPool::block_bytes(&model.config, config.kv_type)
                .unwrap_or(usize::MAX)
                .max(1);
            anyhow::ensure!(
                bytes >= block,
                "--kv-mem {bytes}: one KV block of {} positions takes {block} bytes",
                frink_models::KV_BLOCK
            );
            (bytes / block * frink_models::KV_BLOCK, "--kv-mem")
        }
        (0, None) => (
            config.parallel.saturating_mul(config.ctx),
            "--parallel × --ctx",
        ),
        (n, _) => (n, "--kv-size"),
    };
    frink_engine::check_kv_memory(&model, kv_size, 1, config.kv_type, what)
        .map_err(anyhow::Error::msg)?;
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
    let kv_positions = sched_config.kv_blocks() * frink_models::KV_BLOCK;
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
        kv_positions,
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
    /// Checks the bearer token (when `--api-key` is set).
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.api_key else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if given == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid or missing API key (Authorization: Bearer KEY)",
            )
            .with_code("invalid_api_key"))
        }
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

async fn models(State(st): St, headers: HeaderMap) -> Response {
    if let Err(e) = st.authorize(&headers) {
        return e.into_response();
    }
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

async fn metrics(State(st): St, headers: HeaderMap) -> Response {
    if let Err(e) = st.authorize(&headers) {
        return e.into_response();
    }
    let m = st
        .engine
        .get()
        .map(|e| e.sched.metrics())
        .unwrap_or_default();
    let mut s = String::new();
    let mut counter = |name: &str, help: &str, kind: &str, v: f64| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    };
    counter(
        "frink_requests_total",
        "Completion requests accepted into the queue.",
        "counter",
        m.requests_total as f64,
    );
    counter(
        "frink_requests_finished_total",
        "Requests that ran to completion.",
        "counter",
        m.requests_finished as f64,
    );
    counter(
        "frink_requests_cancelled_total",
        "Requests dropped because their client went away (or at shutdown).",
        "counter",
        m.requests_cancelled as f64,
    );
    counter(
        "frink_requests_rejected_total",
        "Requests refused with 503 because the queue was full.",
        "counter",
        m.requests_rejected as f64,
    );
    counter(
        "frink_tokens_generated_total",
        "Tokens generated.",
        "counter",
        m.tokens_generated as f64,
    );
    counter(
        "frink_prompt_tokens_total",
        "Prompt tokens of admitted requests.",
        "counter",
        m.prompt_tokens as f64,
    );
    counter(
        "frink_prompt_tokens_cached_total",
        "Prompt tokens reused from a slot's cache instead of evaluated.",
        "counter",
        m.prompt_tokens_cached as f64,
    );
    counter(
        "frink_forward_steps_total",
        "Forward passes run (each over every active sequence's rows).",
        "counter",
        m.forward_steps as f64,
    );
    counter(
        "frink_checkpoints_restored_total",
        "Requests that continued from a checkpoint of a recurrent state.",
        "counter",
        m.checkpoints_restored as f64,
    );
    counter(
        "frink_checkpoints",
        "Checkpoints of recurrent states held.",
        "gauge",
        m.checkpoints as f64,
    );
    counter(
        "frink_checkpoint_bytes",
        "Bytes the checkpoints of recurrent states hold.",
        "gauge",
        m.checkpoint_bytes as f64,
    );
    counter(
        "frink_requests_active",
        "Requests running or waiting.",
        "gauge",
        (m.slots_busy + m.queue_depth) as f64,
    );
    counter(
        "frink_queue_depth",
        "Requests waiting for a slot.",
        "gauge",
        m.queue_depth as f64,
    );
    counter(
        "frink_slots_busy",
        "Sequence slots running a request.",
        "gauge",
        m.slots_busy as f64,
    );
    counter(
        "frink_slots_total",
        "Sequence slots.",
        "gauge",
        m.slots_total as f64,
    );
    counter(
        "frink_prefill_seconds_total",
        "Forward-pass time spent on prompt tokens.",
        "counter",
        m.prefill_seconds,
    );
    counter(
        "frink_decode_seconds_total",
        "Forward-pass time spent on generated tokens.",
        "counter",
        m.decode_seconds,
    );
    counter(
        "frink_grammar_mask_seconds_total",
        "Time constrained tokens spent computing their grammar's mask and committing to it.",
        "counter",
        m.grammar_seconds,
    );
    counter(
        "frink_grammar_tokens_total",
        "Tokens sampled under a grammar (response_format, json_schema, grammar).",
        "counter",
        m.grammar_tokens as f64,
    );
    // The names vLLM exports, which Kubernetes' Gateway API Inference Extension reads to
    // route by load (its endpoint picker scores replicas by queue depth and KV-cache use).
    counter(
        "vllm:num_requests_waiting",
        "Requests waiting for a slot (vLLM's name, for the Gateway API Inference Extension).",
        "gauge",
        m.queue_depth as f64,
    );
    counter(
        "vllm:num_requests_running",
        "Requests running in a slot (vLLM's name).",
        "gauge",
        m.slots_busy as f64,
    );
    counter(
        "vllm:kv_cache_usage_perc",
        "KV pool blocks held by running sequences over all blocks, 0 to 1 (vLLM's name).",
        "gauge",
        m.kv_blocks_used as f64 / m.kv_blocks_total.max(1) as f64,
    );
    counter(
        "frink_kv_blocks_total",
        "Blocks of the KV pool.",
        "gauge",
        m.kv_blocks_total as f64,
    );
    counter(
        "frink_kv_blocks_used",
        "KV pool blocks held by running sequences.",
        "gauge",
        m.kv_blocks_used as f64,
    );
    counter(
        "frink_kv_blocks_cached",
        "KV pool blocks that keep reusable tokens (the prefix cache, idle slots' conversations).",
        "gauge",
        m.kv_blocks_cached as f64,
    );
    counter(
        "frink_kv_window_blocks_total",
        "Blocks of the KV pool's window group (sliding-window layers; 0: none).",
        "gauge",
        m.kv_window_blocks_total as f64,
    );
    counter(
        "frink_kv_window_blocks_held",
        "Window-group blocks held by slots (running or idle).",
        "gauge",
        m.kv_window_blocks_held as f64,
    );
    counter(
        "frink_kv_bytes",
        "Bytes of the KV pool's keys and values.",
        "gauge",
        m.kv_bytes as f64,
    );
    counter(
        "frink_spec_proposed_tokens_total",
        "Speculative decoding: tokens proposed (prompt lookup, a draft model or a request's prediction) and verified.",
        "counter",
        m.spec_proposed as f64,
    );
    counter(
        "frink_spec_accepted_tokens_total",
        "Speculative decoding: proposed tokens the answers took (the rest were verified in vain).",
        "counter",
        m.spec_accepted as f64,
    );
    counter(
        "frink_preemptions_total",
        "Sequences whose blocks went to older ones (evaluated again later, same tokens).",
        "counter",
        m.preemptions as f64,
    );
    let _ = writeln!(
        s,
        "# HELP vllm:cache_config_info The KV pool's layout (vLLM's name): positions per block, blocks.\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\",num_cpu_blocks=\"0\"}} 1",
        frink_models::KV_BLOCK,
        m.kv_blocks_total
    );
    histogram(
        &mut s,
        "frink_time_to_first_token_seconds",
        "From a request's arrival to its first token.",
        &m.ttft,
    );
    histogram(
        &mut s,
        "frink_token_latency_seconds",
        "Between consecutive tokens of a request.",
        &m.token_latency,
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s,
    )
        .into_response()
}

fn histogram(s: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (i, b) in Histogram::BOUNDS.iter().enumerate() {
        let c = h.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(s, "{name}_bucket{{le=\"{b}\"}} {c}");
    }
    let _ = writeln!(s, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(s, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
}

/// llama-server's `GET /lora-adapters`: `[{"id", "path", "scale"}]`, the default scales.
async fn lora_adapters(State(st): St, headers: HeaderMap) -> Response {
    let r = (|| {
        st.authorize(&headers)?;
        Ok::<_, ApiError>(lora_json(st.engine()?))
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

/// llama-server's `POST /lora-adapters` `[{"id", "scale"}]`: sets the default scales (the
/// adapters it does not name to 0) and answers with the new list.
async fn set_lora_adapters(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        st.authorize(&headers)?;
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

async fn tokenize(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        st.authorize(&headers)?;
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
    })();
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

async fn detokenize(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        st.authorize(&headers)?;
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

/// Which endpoint a completion answers (their shapes differ).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

/// A parsed, tokenized completion request, ready to queue.
struct Prepared {
    prompt: Vec<u32>,
    opts: GenOptions,
    /// `Some(n)`: report log-probabilities with `n` alternatives.
    logprobs: Option<usize>,
    /// The grammar each choice must match (one entry per choice).
    constraints: Vec<Option<Constraint>>,
    /// What to read out of a chat answer (reasoning, tool calls).
    answer: answer::AnswerFormat,
    /// Control tokens the answer shows as text (a tool-call format's markers).
    shown_tokens: Vec<u32>,
    /// OpenAI's predicted output, tokenized (proposed for speculative verification).
    prediction: Option<Vec<u32>>,
    model: String,
}

async fn chat_completions(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        st.authorize(&headers)?;
        let obj = api::parse_object(&body)?;
        prepare_chat(&st, &obj)
    })();
    match r {
        Ok(p) => complete(&st, Kind::Chat, p).await,
        Err(e) => e.into_response(),
    }
}

/// A chat request (OpenAI's fields, llama.cpp's extensions) parsed, rendered through the
/// template and tokenized: everything `/v1/chat/completions` and Ollama's `/api/chat` share.
///
/// Errors: a 400 naming the field at fault.
fn prepare_chat(st: &AppState, obj: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let eng = st.engine()?;
    let messages = api::messages(obj)?;
    let opts = api::gen_options(obj, Endpoint::Chat, eng.tok.n_vocab())?;
    let top = api::opt_i64(obj, "top_logprobs")?;
    let n_probs = api::opt_i64(obj, "n_probs")?;
    let logprobs = match api::opt_bool(obj, "logprobs")? {
        Some(true) => Some(top.or(n_probs).unwrap_or(0)),
        // llama.cpp's n_probs > 0 asks for the probabilities by itself.
        None => n_probs.filter(|&n| n > 0),
        Some(false) => None,
    };
    if let Some(n) = logprobs.filter(|n| !(0..=20).contains(n)) {
        let name = if top.is_some() {
            "top_logprobs"
        } else {
            "n_probs"
        };
        return Err(ApiError::invalid(
            Some(name),
            format!("'{name}' must be between 0 and 20, got {n}"),
        ));
    }
    let logprobs = logprobs.map(|n| n as usize);
    // Tools: rendered by the template; calls parsed from the answer in the format the
    // template teaches; a required call enforced by a grammar.
    let mut grammar = api::grammar(obj)?;
    // A lazy grammar's trigger (tool_choice "auto": a call, once begun, is enforced).
    let mut trigger = None;
    let mut answer = answer::AnswerFormat::default();
    // The markers whose control tokens the answer must show.
    let mut markers: Vec<&str> = Vec::new();
    let mut tools_for_template = None;
    let template = st.template(eng);
    let tool_format = tools::ToolFormat::detect(template.unwrap_or(""));
    // A required or named call needs tools to call (an empty `tools` is none).
    let choice_needs_tools = obj
        .get("tool_choice")
        .is_some_and(|c| !c.is_null() && c != "none" && c != "auto");
    let no_tools = || ApiError::invalid(Some("tool_choice"), "'tool_choice' requires 'tools'");
    if let Some(tv) = obj.get("tools").filter(|v| !v.is_null()) {
        let bad = |p: &str, m: String| ApiError::invalid(Some(p), m);
        let tools = tools::check_tools(tv).map_err(|m| bad("tools", m))?;
        if tools.is_empty() && choice_needs_tools {
            return Err(no_tools());
        }
        if !tools.is_empty() {
            let (usable, required) =
                tools::choice(&tools, obj.get("tool_choice")).map_err(|m| bad("tool_choice", m))?;
            let format = tool_format.ok_or_else(|| {
                bad(
                    "tools",
                    "this model's chat template teaches no tool-call format frink parses \
                     (see `frink inspect` and the README's list of formats)"
                        .into(),
                )
                .with_code("unsupported_field")
            })?;
            let parallel = api::opt_bool(obj, "parallel_tool_calls")?.unwrap_or(true);
            if required {
                if let Some((param, _)) = &grammar {
                    return Err(bad(
                        param,
                        format!("'{param}' and a required tool call both constrain the answer"),
                    ));
                }
                let lark = format.call_grammar(&usable, parallel, &|m| eng.tok.control_token(m));
                grammar = Some(("tool_choice", frink_engine::constraint::Grammar::Lark(lark)));
            } else if grammar.is_none() && !usable.is_empty() {
                // `auto`: free text, and a call held to the grammar once it begins.
                let lark = format.auto_grammar(&usable, parallel, &|m| eng.tok.control_token(m));
                grammar = Some(("tools", frink_engine::constraint::Grammar::Lark(lark)));
                trigger = Some(format.triggers(&|m| eng.tok.control_token(m)));
            }
            // llama.cpp's `parse_tool_calls: false`: the calls stay in the text.
            let parse_calls = api::opt_bool(obj, "parse_tool_calls")?.unwrap_or(true);
            if !usable.is_empty() && parse_calls {
                // Harmony's calls come out of its channels (the reasoning splitter).
                answer.tool_format = Some(format).filter(|&f| f != tools::ToolFormat::Harmony);
                answer.tools = tools::ToolSet::new(&usable);
                markers.extend(format.markers());
            }
            tools_for_template = Some(Value::Array(tools));
        }
    } else if choice_needs_tools {
        return Err(no_tools());
    }
    let mut kwargs = st.chat_template_kwargs.clone();
    match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => kwargs.extend(m.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("chat_template_kwargs"),
                "'chat_template_kwargs' must be an object",
            ))
        }
    }
    let inputs = TemplateInputs {
        add_generation_prompt: true,
        tools: tools_for_template,
        kwargs,
        ..TemplateInputs::default()
    };
    let gemma4 = tool_format == Some(tools::ToolFormat::Gemma4);
    let messages = if tools::wants_tool_responses(tool_format, template.unwrap_or("")) {
        tools::gemma4_tool_responses(messages)
    } else {
        messages
    };
    let mut rendered = eng
        .tok
        .apply_template_with(st.chat_template.as_deref(), &messages, &inputs)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    if gemma4 && rendered.text.ends_with("<turn|>\n") {
        // A history that ends with a closed model turn (results and an answer) gets no
        // new one from Gemma 4's template: open it, as llama.cpp does.
        rendered.text.push_str("<|turn>model\n");
    }
    let prompt = eng
        .tok
        .encode_chat(&rendered)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    let split = match api::opt_str(obj, "reasoning_format")? {
        None => st.split_reasoning,
        Some("none") => false,
        Some("auto" | "deepseek") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                Some("reasoning_format"),
                format!(
                    "'reasoning_format' must be \"none\", \"auto\" or \"deepseek\", got {other:?}"
                ),
            ))
        }
    };
    answer.reasoning = reasoning::Mode::detect(template.unwrap_or(""), &rendered.text, split);
    match answer.reasoning {
        Some(reasoning::Mode::Harmony { .. }) => markers.extend(crate::harmony::MARKERS),
        // Tags that are control tokens (Gemma 4's channel) must show for the split.
        Some(reasoning::Mode::Think { tags, .. }) => markers.extend(tags.tokens),
        None => {}
    }
    markers.sort_unstable();
    markers.dedup();
    let shown_tokens = markers
        .iter()
        .filter_map(|m| eng.tok.control_token(m))
        .collect();
    let constraints = eng.constraints(grammar, trigger, opts.n)?;
    let prediction = api::prediction(obj)?
        .map(|text| eng.tok.encode(&text, false, false))
        .transpose()
        .map_err(|e| ApiError::invalid(Some("prediction"), e.to_string()))?;
    Ok(Prepared {
        prompt,
        opts,
        logprobs,
        constraints,
        answer,
        shown_tokens,
        prediction,
        model: model_field(st, obj),
    })
}

/// OpenAI's `finish_reason` of a chat answer: `tool_calls` where calls were read from an
/// answer that ended by itself; an answer cut by `max_tokens` or the context stays
/// `length` whatever was read from it (as llama-server reports it), so a client sees
/// that the last call may be cut short.
fn chat_finish(reason: frink_engine::FinishReason, has_calls: bool) -> &'static str {
    match reason {
        frink_engine::FinishReason::Stop if has_calls => "tool_calls",
        r => r.as_str(),
    }
}

async fn completions(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        st.authorize(&headers)?;
        let obj = api::parse_object(&body)?;
        prepare_completion(&st, &obj)
    })();
    match r {
        Ok(p) => complete(&st, Kind::Text, p).await,
        Err(e) => e.into_response(),
    }
}

/// A completion request (`prompt` as text or token ids) parsed and tokenized: what
/// `/v1/completions` and Ollama's raw `/api/generate` share.
///
/// Errors: a 400 naming the field at fault.
fn prepare_completion(st: &AppState, obj: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let eng = st.engine()?;
    let prompt = api::prompt(obj)?;
    let opts = api::gen_options(obj, Endpoint::Completions, eng.tok.n_vocab())?;
    // OpenAI's integer `logprobs`, else llama.cpp's `n_probs` (0: none).
    let logprobs = match api::opt_i64(obj, "logprobs")? {
        Some(n) => Some(("logprobs", n)),
        None => api::opt_i64(obj, "n_probs")?
            .filter(|&n| n != 0)
            .map(|n| ("n_probs", n)),
    };
    let logprobs = match logprobs {
        Some((name, n)) if !(0..=20).contains(&n) => {
            return Err(ApiError::invalid(
                Some(name),
                format!("'{name}' must be between 0 and 20, got {n}"),
            ))
        }
        Some((_, n)) => Some(n as usize),
        None => None,
    };
    let prompt = match prompt {
        Prompt::Text(t) => eng
            .tok
            .encode(&t, true, true)
            .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?,
        Prompt::Ids(ids) => ids,
    };
    let n_vocab = eng.tok.n_vocab();
    if let Some(t) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::invalid(
            Some("prompt"),
            format!("token id {t} is outside the vocabulary of {n_vocab}"),
        ));
    }
    let constraints = eng.constraints(api::grammar(obj)?, None, opts.n)?;
    Ok(Prepared {
        prompt,
        opts,
        logprobs,
        constraints,
        answer: answer::AnswerFormat::default(),
        shown_tokens: Vec::new(),
        prediction: None,
        model: model_field(st, obj),
    })
}

/// The `model` of a request (informational) or the loaded model's name.
fn model_field(st: &AppState, obj: &Map<String, Value>) -> String {
    obj.get("model")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(&st.model_name)
        .to_string()
}

/// Forwards one choice's scheduler events, tagged with the choice's index.
struct ChannelSink(mpsc::UnboundedSender<(usize, Event)>, usize);

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send((self.1, event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The answer to a request the scheduler would not queue.
fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            "the request queue is full; retry later",
        )
        .with_code("queue_full"),
        SubmitError::Stopped => shutting_down("the server is shutting down".into()),
    }
}

/// The inputs of an embedding request: `input` (OpenAI; llama-server's `content` too) as
/// a string, an array of strings, an array of token ids (one input) or an array of such
/// arrays; each tokenized as llama-server does (special tokens added and parsed).
///
/// Errors: a 400 naming the field (missing, empty, wrong type, a token outside the
/// vocabulary, an empty input).
fn embedding_inputs(eng: &Engine, obj: &Map<String, Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let (field, v) = match (obj.get("input"), obj.get("content")) {
        (Some(v), _) => ("input", v),
        (None, Some(v)) => ("content", v),
        (None, None) => return Err(ApiError::invalid(Some("input"), "'input' is required")),
    };
    let bad = |m: &str| ApiError::invalid(Some(field), format!("'{field}' {m}"));
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < eng.tok.n_vocab())
                    .map(|t| t as u32)
                    .ok_or_else(|| bad("holds a value that is not a token id of this model"))
            })
            .collect()
    };
    let text = |t: &str| {
        eng.tok
            .encode(t, true, true)
            .map_err(|e| ApiError::invalid(Some(field), e.to_string()))
    };
    let inputs = match v {
        Value::String(t) => vec![text(t)?],
        Value::Array(a) if a.is_empty() => return Err(bad("is empty")),
        Value::Array(a) if a.iter().all(Value::is_number) => vec![ids(a)?],
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(t) => text(t),
                Value::Array(ids_) => ids(ids_),
                _ => Err(bad("must be strings or arrays of token ids")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad("must be a string, an array of strings or token ids")),
    };
    if inputs.iter().any(Vec::is_empty) {
        return Err(bad("holds an input without tokens"));
    }
    Ok(inputs)
}

/// Refuses an embedding request's `dimensions` unless it is the model's own width (frink
/// does not shorten embeddings).
fn check_dimensions(eng: &Engine, obj: &Map<String, Value>) -> Result<(), ApiError> {
    match api::opt_i64(obj, "dimensions")? {
        Some(d) if d != eng.n_embd as i64 => Err(ApiError::invalid(
            Some("dimensions"),
            format!(
                "this model's embeddings have {} dimensions and cannot be shortened (got {d})",
                eng.n_embd
            ),
        )
        .with_code("unsupported_field")),
        _ => Ok(()),
    }
}

/// Embeds `inputs` through the scheduler (several inputs batch together; a vector does
/// not depend on its batch), each pooled with the server's pooling and normalised with
/// `embd_norm` ([`frink_engine::embed::normalize`]; -1: raw). Returns the vectors in
/// order and the prompt tokens counted.
///
/// Errors: a 400 for an input longer than the slot context, 503 for a full queue, 500 if
/// an evaluation fails.
async fn embed_inputs(
    st: &AppState,
    inputs: Vec<Vec<u32>>,
    embd_norm: i32,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let eng = st.engine()?;
    for input in &inputs {
        check_length(st, eng, "input", "an input", input.len())?;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let n = inputs.len();
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    for (i, prompt) in inputs.into_iter().enumerate() {
        let req = Request {
            prompt,
            sampling: frink_engine::sampling::SamplingParams::default(),
            max_tokens: Some(0),
            stop: Vec::new(),
            ignore_eos: false,
            top_logprobs: None,
            constraint: None,
            prefix_group: None,
            follows_prefix: false,
            shown_tokens: Vec::new(),
            embed: Some(eng.pooling),
            lora: eng.lora_set(None)?,
            prediction: None,
            sink: Box::new(ChannelSink(tx.clone(), i)),
        };
        eng.sched.submit(req).map_err(submit_error)?;
    }
    drop(tx);
    let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
    let mut done = 0;
    while done < n {
        match rx.recv().await {
            Some((i, Event::Embedding(mut v))) => {
                frink_engine::embed::normalize(&mut v, embd_norm);
                out[i] = Some(v);
            }
            Some((_, Event::Done(_))) => done += 1,
            Some((_, Event::Delta { .. })) => {}
            other => return Err(failed(other.map(|(_, e)| e), "an embedding")),
        }
    }
    Ok((
        out.into_iter().map(Option::unwrap_or_default).collect(),
        tokens,
    ))
}

/// `POST /v1/embeddings` (OpenAI's shape): `input`, `encoding_format` (`float`, or
/// `base64`: the little-endian f32 bytes), `dimensions` (only the model's own width);
/// vectors L2-normalised as llama-server's.
async fn embeddings(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        st.authorize(&headers)?;
        let eng = st.engine()?;
        let obj = api::parse_object(&body)?;
        let base64 = match api::opt_str(&obj, "encoding_format")? {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    Some("encoding_format"),
                    format!("'encoding_format' must be \"float\" or \"base64\", got {other:?}"),
                ))
            }
        };
        check_dimensions(eng, &obj)?;
        let inputs = embedding_inputs(eng, &obj)?;
        let (vectors, tokens) = embed_inputs(&st, inputs, 2).await?;
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::encode(bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "object": "list",
                "data": data,
                "model": model_field(&st, &obj),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }),
        ))
    };
    r.await.unwrap_or_else(ApiError::into_response)
}

/// `POST /embeddings` (llama-server's shape): `content` (or `input`), answered as
/// `[{"index": i, "embedding": [[…]]}]`, normalised (`embd_normalize`, default 2).
async fn embeddings_llamacpp(State(st): St, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        st.authorize(&headers)?;
        let eng = st.engine()?;
        let obj = api::parse_object(&body)?;
        let norm = api::opt_i64(&obj, "embd_normalize")?.unwrap_or(2) as i32;
        let inputs = embedding_inputs(eng, &obj)?;
        let (vectors, _) = embed_inputs(&st, inputs, norm).await?;
        let out: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(i, v)| json!({"index": i, "embedding": [v]}))
            .collect();
        Ok(json_response(StatusCode::OK, &Value::Array(out)))
    };
    r.await.unwrap_or_else(ApiError::into_response)
}

/// Queues a prepared request and answers it, streamed or whole.
async fn complete(st: &AppState, kind: Kind, mut p: Prepared) -> Response {
    let prompt_field = if kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    let rx = match queue(st, &mut p, prompt_field) {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    let Ok(eng) = st.engine() else {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "no model",
        )
        .into_response();
    };
    let fmt = Formatter {
        kind,
        id: st.next_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: std::mem::take(&mut p.model),
        tok: Arc::clone(&eng.tok),
        logprobs: p.logprobs.is_some(),
        include_usage: p.opts.include_usage,
        n: p.opts.n,
        answer: std::mem::take(&mut p.answer),
        prediction: p.prediction.is_some(),
    };
    if p.opts.stream {
        stream_response(fmt, rx)
    } else {
        whole_response(fmt, rx).await
    }
}

/// A 400 `context_length_exceeded` on `field` when `what` ("the prompt", "an input") of
/// `n` tokens leaves no position to evaluate in the context (`--ctx`) or the KV pool.
fn check_length(
    st: &AppState,
    eng: &Engine,
    field: &'static str,
    what: &str,
    n: usize,
) -> Result<(), ApiError> {
    let limit = if n >= st.n_ctx {
        format!("the context of {} tokens (--ctx)", st.n_ctx)
    } else if n >= eng.kv_positions {
        format!("the KV pool of {} positions (--kv-size)", eng.kv_positions)
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        Some(field),
        format!("{what} is {n} tokens, longer than {limit}"),
    )
    .with_code("context_length_exceeded"))
}

/// Checks a prepared request against the server's limits and queues its choices (each a
/// request of its own, with its own seed stream: the seed plus its index; several share
/// one evaluation of the prompt). Returns the receiver of their events, tagged with the
/// choice index. `prompt_field` names the field a too-long prompt came from.
///
/// Errors: a 400 for an empty or too-long prompt or `n` above `--parallel`; 503 for a full
/// queue or a server shutting down.
fn queue(
    st: &AppState,
    p: &mut Prepared,
    prompt_field: &'static str,
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    let eng = st.engine()?;
    if p.prompt.is_empty() {
        return Err(ApiError::invalid(Some("prompt"), "the prompt is empty"));
    }
    check_length(st, eng, prompt_field, "the prompt", p.prompt.len())?;
    let n = p.opts.n;
    if n > st.parallel {
        return Err(ApiError::invalid(
            Some("n"),
            format!(
                "'n' is {n}; this server runs at most {} choices (--parallel)",
                st.parallel
            ),
        ));
    }
    let lora = eng.lora_set(p.opts.lora.as_ref())?;
    let group = st.next_group.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut sampling = p.opts.sampling.clone();
    let seed = sampling.seed;
    for (i, constraint) in std::mem::take(&mut p.constraints).into_iter().enumerate() {
        sampling.seed = seed.wrapping_add(i as u64);
        let req = Request {
            prompt: p.prompt.clone(),
            sampling: sampling.clone(),
            max_tokens: p.opts.max_tokens,
            stop: p.opts.stop.clone(),
            ignore_eos: p.opts.ignore_eos,
            top_logprobs: p.logprobs,
            constraint,
            prefix_group: (n > 1).then_some(group),
            follows_prefix: i > 0,
            shown_tokens: p.shown_tokens.clone(),
            embed: None,
            lora: lora.clone(),
            prediction: p.prediction.clone(),
            sink: Box::new(ChannelSink(tx.clone(), i)),
        };
        // On an error the choices already queued see their channel close and are dropped.
        eng.sched.submit(req).map_err(submit_error)?;
    }
    Ok(rx)
}

/// Builds the JSON of responses and chunks.
struct Formatter {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    tok: Arc<Tokenizer>,
    logprobs: bool,
    include_usage: bool,
    /// Choices (`n`).
    n: usize,
    /// What to read out of a chat answer (reasoning, tool calls).
    answer: answer::AnswerFormat,
    /// The request gave a `prediction` (its counts go into `usage`).
    prediction: bool,
}

/// The finished choices' counts as OpenAI's `usage` reports them: the prompt once, the
/// generated tokens of every choice; timings and cached tokens of the first choice.
#[derive(Default)]
struct Totals {
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
    first_token_ms: f64,
    gen_ms: f64,
    /// Speculation over every choice: tokens proposed and verified, and accepted.
    proposed: usize,
    accepted: usize,
}

impl Totals {
    fn add(&mut self, index: usize, c: &Completion) {
        if index == 0 {
            self.prompt_tokens = c.prompt_tokens;
            self.cached_tokens = c.cached_tokens;
            self.first_token_ms = c.first_token_ms;
            self.gen_ms = c.gen_ms;
        }
        self.completion_tokens += c.ids.len();
        self.proposed += c.proposed;
        self.accepted += c.accepted;
    }
}

impl Formatter {
    /// The id stem of choice `i`'s tool calls (`call_<stem>_<k>`): unique per response
    /// and choice, the same streamed or whole.
    fn call_ids(&self, i: usize) -> String {
        format!("{}_{i}", self.id)
    }

    /// The chunk choices of a streamed tool call: its id, type and name with empty
    /// arguments, then the arguments in one fragment.
    fn call_deltas(&self, choice: usize, k: usize, c: &tools::ToolCall) -> [Value; 2] {
        let full = tools::call_json(&self.call_ids(choice), k, c);
        let mut head = full.clone();
        head["index"] = json!(k);
        head["function"]["arguments"] = json!("");
        [
            json!({"index": choice, "delta": {"tool_calls": [head]}, "logprobs": null, "finish_reason": null}),
            json!({"index": choice, "delta": {"tool_calls": [{"index": k, "function": {"arguments": c.arguments}}]}, "logprobs": null, "finish_reason": null}),
        ]
    }

    fn piece(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self
            .tok
            .token_to_piece(id, true)
            .unwrap_or_default()
            .to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// Log-probabilities in the endpoint's shape (`offset`: characters before the first).
    fn logprobs_json(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let (text, bytes) = self.piece(t.id);
                        let top: Vec<Value> = t
                            .top
                            .iter()
                            .map(|&(id, lp)| {
                                let (text, bytes) = self.piece(id);
                                json!({"token": text, "logprob": lp, "bytes": bytes})
                            })
                            .collect();
                        json!({"token": text, "logprob": t.logprob, "bytes": bytes, "top_logprobs": top})
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Text => {
                let mut toks = Vec::new();
                let mut lps = Vec::new();
                let mut tops = Vec::new();
                let mut offsets = Vec::new();
                let mut at = offset;
                for t in tokens {
                    let (text, _) = self.piece(t.id);
                    offsets.push(at);
                    at += text.chars().count();
                    toks.push(text);
                    lps.push(t.logprob);
                    let mut m = Map::new();
                    for &(id, lp) in &t.top {
                        m.insert(self.piece(id).0, json!(lp));
                    }
                    tops.push(Value::Object(m));
                }
                json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }

    fn usage(&self, t: &Totals) -> Value {
        json!({
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "total_tokens": t.prompt_tokens + t.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
            "completion_tokens_details": self.completion_details(t),
        })
    }

    /// OpenAI's `completion_tokens_details`: for a request with a `prediction`, its
    /// tokens the answer took (`accepted_prediction_tokens`) and those verified and not
    /// taken (`rejected_prediction_tokens`; counted in `completion_tokens`' cost, not in
    /// its number, as OpenAI bills them); zero otherwise (prompt lookup is not a
    /// prediction: `/metrics` counts it).
    fn completion_details(&self, t: &Totals) -> Value {
        let (accepted, rejected) = if self.prediction {
            (t.accepted, t.proposed - t.accepted)
        } else {
            (0, 0)
        };
        json!({
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
        })
    }

    /// One streamed chunk with `choice` (`None`: the usage-only chunk).
    fn chunk(&self, choice: Option<Value>, usage: Option<Value>) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "frink",
            "choices": choice.map_or_else(Vec::new, |c| vec![c]),
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }

    /// The choice `index` of a streamed chunk: a text delta, or the end with its finish
    /// reason.
    fn delta_choice(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Text => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Streams the answer as server-sent events.
///
/// The event stream owns the receiver: when the client disconnects, the body is dropped,
/// the channel closes and the scheduler frees the slot at its next step.
fn stream_response(fmt: Formatter, rx: mpsc::UnboundedReceiver<(usize, Event)>) -> Response {
    struct S {
        fmt: Formatter,
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        out: VecDeque<Bytes>,
        done: bool,
        /// Characters sent so far, per choice (completion logprobs' text offsets).
        chars: Vec<usize>,
        finished: usize,
        totals: Totals,
        /// Per choice: the answer's reader (chat requests) and the calls sent.
        answers: Vec<Option<answer::AnswerStream>>,
        calls: Vec<usize>,
    }
    impl S {
        /// Sends choice `i`'s parts: reasoning as `reasoning_content` deltas, content as
        /// content deltas, calls as tool-call deltas.
        fn push_parts(&mut self, i: usize, parts: Vec<reasoning::Part>, mut logprobs: Value) {
            for p in parts {
                match p {
                    reasoning::Part::Reasoning(t) => {
                        let c = json!({"index": i, "delta": {"reasoning_content": t}, "logprobs": std::mem::take(&mut logprobs), "finish_reason": null});
                        self.out.push_back(sse(&self.fmt.chunk(Some(c), None)));
                    }
                    reasoning::Part::Content(t) => {
                        let c =
                            self.fmt
                                .delta_choice(i, Some(&t), std::mem::take(&mut logprobs), None);
                        self.out.push_back(sse(&self.fmt.chunk(Some(c), None)));
                    }
                    reasoning::Part::Call(call) => {
                        for d in self.fmt.call_deltas(i, self.calls[i], &call) {
                            self.out.push_back(sse(&self.fmt.chunk(Some(d), None)));
                        }
                        self.calls[i] += 1;
                    }
                }
            }
        }
    }
    let mut out = VecDeque::new();
    if fmt.kind == Kind::Chat {
        for i in 0..fmt.n {
            let first = fmt.chunk(
                Some(json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})),
                None,
            );
            out.push_back(sse(&first));
        }
    }
    let state = S {
        answers: (0..fmt.n)
            .map(|_| (fmt.kind == Kind::Chat).then(|| fmt.answer.stream()))
            .collect(),
        calls: vec![0; fmt.n],
        chars: vec![0; fmt.n],
        fmt,
        rx,
        out,
        done: false,
        finished: 0,
        totals: Totals::default(),
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.out.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.done {
                return None;
            }
            match s.rx.recv().await {
                Some((i, Event::Delta { text, tokens })) => {
                    // (Text offsets matter to completions, which have neither reasoning nor
                    // tool calls to take text out of the stream.)
                    let lp = if s.fmt.logprobs {
                        s.fmt.logprobs_json(&tokens, s.chars[i])
                    } else {
                        Value::Null
                    };
                    s.chars[i] += text.chars().count();
                    let parts = match s.answers[i].as_mut() {
                        Some(a) => a.push(&text),
                        None => vec![reasoning::Part::Content(text)],
                    };
                    s.push_parts(i, parts, lp);
                }
                Some((i, Event::Done(c))) => {
                    if let Some(a) = s.answers[i].take() {
                        let parts = a.finish();
                        s.push_parts(i, parts, Value::Null);
                    }
                    let finish = Some(chat_finish(c.finish_reason, s.calls[i] > 0));
                    let fin = s.fmt.delta_choice(i, None, Value::Null, finish);
                    s.out.push_back(sse(&s.fmt.chunk(Some(fin), None)));
                    s.totals.add(i, &c);
                    s.finished += 1;
                    if s.finished == s.fmt.n {
                        if s.fmt.include_usage {
                            let u = s.fmt.usage(&s.totals);
                            s.out.push_back(sse(&s.fmt.chunk(None, Some(u))));
                        }
                        s.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                        s.done = true;
                    }
                }
                // (Only embedding requests get one.)
                Some((_, Event::Embedding(_))) => {}
                Some((_, Event::Error(msg))) => {
                    let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg);
                    s.out.push_back(sse(&e.body()));
                    s.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    s.done = true;
                }
                Some((_, Event::Cancelled(msg))) => {
                    s.out.push_back(sse(&shutting_down(msg).body()));
                    s.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    s.done = true;
                }
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the request ended without an answer",
                    );
                    s.out.push_back(sse(&e.body()));
                    s.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    s.done = true;
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// The error of a request whose events ended in `event` (an `Error`, a `Cancelled`, or
/// the channel closing without `what`): 500, 503 at shutdown.
fn failed(event: Option<Event>, what: &str) -> ApiError {
    match event {
        Some(Event::Error(msg)) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)
        }
        Some(Event::Cancelled(msg)) => shutting_down(msg),
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("the request ended without {what}"),
        ),
    }
}

/// The answer to a request the scheduler cancelled at shutdown: 503, as for a request
/// that arrives after shutdown began.
fn shutting_down(msg: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", msg)
}

/// Collects the events of every choice and answers one JSON object.
async fn whole_response(
    fmt: Formatter,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
) -> Response {
    let mut text = vec![String::new(); fmt.n];
    let mut tokens: Vec<Vec<TokenLogprob>> = vec![Vec::new(); fmt.n];
    let mut finish: Vec<Option<frink_engine::FinishReason>> = vec![None; fmt.n];
    let mut totals = Totals::default();
    while finish.iter().any(Option::is_none) {
        match rx.recv().await {
            Some((
                i,
                Event::Delta {
                    text: t,
                    tokens: lp,
                },
            )) => {
                text[i].push_str(&t);
                tokens[i].extend(lp);
            }
            Some((i, Event::Done(c))) => {
                finish[i] = Some(c.finish_reason);
                totals.add(i, &c);
            }
            // (Only embedding requests get one.)
            Some((_, Event::Embedding(_))) => {}
            other => return failed(other.map(|(_, e)| e), "an answer").into_response(),
        }
    }
    let object = match fmt.kind {
        Kind::Chat => "chat.completion",
        Kind::Text => "text_completion",
    };
    let choices: Vec<Value> = (0..fmt.n)
        .map(|i| {
            let logprobs = if fmt.logprobs {
                fmt.logprobs_json(&tokens[i], 0)
            } else {
                Value::Null
            };
            let mut thinking = String::new();
            let mut choice = match fmt.kind {
                Kind::Chat => {
                    let (r, content, calls) = fmt.answer.parse(&text[i]);
                    thinking = r;
                    let mut message = json!({"role": "assistant", "content": content});
                    let reason = finish[i].map(|f| chat_finish(f, !calls.is_empty()));
                    if !calls.is_empty() {
                        let calls: Vec<Value> = calls
                            .iter()
                            .enumerate()
                            .map(|(k, c)| tools::call_json(&fmt.call_ids(i), k, c))
                            .collect();
                        if content.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = Value::Array(calls);
                    }
                    json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason})
                }
                Kind::Text => json!({
                    "index": i,
                    "text": text[i],
                    "logprobs": logprobs,
                    "finish_reason": finish[i].map(frink_engine::FinishReason::as_str),
                }),
            };
            if !thinking.is_empty() {
                choice["message"]["reasoning_content"] = json!(thinking);
            }
            choice
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "id": fmt.id,
            "object": object,
            "created": fmt.created,
            "model": fmt.model,
            "system_fingerprint": "frink",
            "choices": choices,
            "usage": fmt.usage(&totals),
            "timings": {
                "first_token_ms": totals.first_token_ms,
                "gen_ms": totals.gen_ms,
                "cached_tokens": totals.cached_tokens,
            },
        }),
    )
}
