//! `frink serve`: the OpenAI-compatible HTTP server (frink-server), with the flags and
//! `FRINK_*` environment variables of CONTRACT.md.

use anyhow::{Context, Result};
use clap::Args;

use crate::common::ModelArgs;

/// Flags of `frink serve` (CONTRACT.md); each also reads a `FRINK_*` variable.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, env = "FRINK_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed on stderr).
    #[arg(long, env = "FRINK_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Sequence slots decoded together (continuous batching).
    #[arg(long, env = "FRINK_PARALLEL", default_value_t = 4)]
    pub parallel: usize,
    /// The longest context one request may use, in tokens (not a reservation: requests
    /// share the KV pool).
    #[arg(short = 'c', long, env = "FRINK_CTX", default_value_t = 4096, value_parser = crate::common::positions)]
    pub ctx: usize,
    /// Positions of the KV block pool all requests share (default: parallel × ctx).
    #[arg(long = "kv-size", env = "FRINK_KV_SIZE", conflicts_with = "kv_mem", value_parser = crate::common::positions)]
    pub kv_size: Option<usize>,
    /// Bytes of the KV block pool (K, M or G suffix), instead of --kv-size.
    #[arg(long = "kv-mem", env = "FRINK_KV_MEM", value_parser = crate::common::parse_bytes)]
    pub kv_mem: Option<usize>,
    /// Requests that may wait for a free slot; beyond it requests get 503.
    #[arg(long, env = "FRINK_QUEUE", default_value_t = 64)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every route but
    /// `GET /health`; repeatable (the environment variable takes a comma-separated list).
    #[arg(
        long = "api-key",
        env = "FRINK_API_KEY",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub api_key: Vec<String>,
    /// Let web pages of this origin call the server (`https://host[:port]`, or `*` for
    /// any); repeatable. None by default: browsers keep cross-origin answers from pages.
    #[arg(long = "cors-origin", env = "FRINK_CORS_ORIGIN", value_delimiter = ',', value_parser = cors_origin)]
    pub cors_origin: Vec<String>,
    /// Read API keys from a file, one per line (blank lines and `#` comments skipped).
    #[arg(long = "api-key-file", env = "FRINK_API_KEY_FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Connections open at once; at the cap the one idle longest is closed to admit a new
    /// one (must fit the open-file limit, `ulimit -n`).
    #[arg(
        long = "max-connections",
        env = "FRINK_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,
    /// Seconds a connection may answer nothing and move no byte before it is closed
    /// (keep-alive connections between requests, connections that send nothing).
    #[arg(
        long = "idle-timeout",
        env = "FRINK_IDLE_TIMEOUT",
        default_value_t = 30.0
    )]
    pub idle_timeout: f64,
    /// Seconds for a request's headers to arrive whole.
    #[arg(
        long = "header-timeout",
        env = "FRINK_HEADER_TIMEOUT",
        default_value_t = 10.0
    )]
    pub header_timeout: f64,
    /// Seconds for a request body to arrive whole (else 408), and for a blocked write to a
    /// client that stopped reading to move again (else the connection is closed).
    #[arg(long = "timeout", env = "FRINK_TIMEOUT", default_value_t = 600.0)]
    pub timeout: f64,
    #[command(flatten)]
    pub template: crate::common::TemplateArgs,
    #[command(flatten)]
    pub spec: crate::common::SpecArgs,
    /// `auto`: a reasoning model's `<think>` text goes to `reasoning_content`; `none`: it
    /// stays in the content.
    #[arg(long = "reasoning-format", value_parser = ["auto", "none"], default_value = "auto")]
    pub reasoning_format: String,
    /// How embeddings pool the prompt's hidden states (default: the file's
    /// `pooling_type`, else mean).
    #[arg(long, value_parser = crate::embed::parse_pooling)]
    pub pooling: Option<frink_models::Pooling>,
    /// Encoder models (BERT family): tokens evaluated in one pass at most, over all the
    /// inputs waiting (llama.cpp's `--ubatch-size`; an input longer than this goes alone).
    #[arg(long = "ubatch", default_value_t = frink_engine::embed::ENCODER_BATCH as u32, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub ubatch: u32,
    /// Models with recurrent layers (Mamba, LFM2, hybrids): checkpoints of each slot's
    /// state kept for prefix reuse (llama-server's flag; 0: a slot's state is reused only
    /// whole).
    #[arg(
        long = "ctx-checkpoints",
        env = "FRINK_CTX_CHECKPOINTS",
        default_value_t = 8
    )]
    pub ctx_checkpoints: usize,
    /// Choose each request's number of proposals from its acceptance and this machine's
    /// measured step times (`false`: propose as many as `--draft-max` and the batch allow;
    /// the tokens are the same either way).
    #[arg(long = "spec-adaptive", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = true)]
    pub spec_adaptive: bool,
    /// Positions between a prompt's periodic checkpoints (besides those around its last
    /// token).
    #[arg(long = "checkpoint-interval", default_value_t = 256)]
    pub checkpoint_interval: usize,
    /// A generation that reaches the context keeps its request's `n_keep` tokens (Ollama's
    /// `num_keep`), drops the older half of the rest and goes on, the kept keys rotated
    /// to their new positions (llama.cpp's `--context-shift`; off: it ends with `length`).
    #[arg(long = "context-shift", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub context_shift: bool,
    /// Where `POST /slots/{id}?action=save|restore` keep their files (llama.cpp's
    /// `--slot-save-path`; requests name files in it, never paths). Without it, save and
    /// restore are refused.
    #[arg(long = "slot-save-path", value_name = "DIR")]
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Keep the prefix cache's full blocks that leave memory in this folder (under a
    /// subfolder per model and KV type) and read them back when a prompt matches them.
    #[arg(long = "cache-disk", value_name = "DIR")]
    pub cache_disk: Option<std::path::PathBuf>,
    /// The most bytes `--cache-disk` keeps (K, M or G suffix); the oldest blocks go first.
    #[arg(long = "cache-disk-size", value_parser = crate::common::parse_bytes, default_value = "4G", value_name = "BYTES")]
    pub cache_disk_size: usize,
    /// Bytes all checkpoints may hold together (K, M or G suffix); the oldest go first.
    #[arg(long = "checkpoint-budget", value_parser = crate::common::parse_bytes, default_value = "1G")]
    pub checkpoint_budget: usize,
    /// Each request's log line: `text` (at info level, through RUST_LOG) or `json` (one
    /// object a line on stderr: method, path, status, client, total_ms and, for a
    /// completion, model, tokens, first_token_ms, tokens_per_second; never prompt text).
    #[arg(long = "log-format", value_parser = ["text", "json"], default_value = "text")]
    pub log_format: String,
    /// No request log lines.
    #[arg(long = "log-disable", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub log_disable: bool,
    /// Log each request's rendered prompt and the answer's text too (never by default).
    #[arg(long = "log-prompts", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub log_prompts: bool,
    /// The `-m` model's projector file (llama.cpp's `--mmproj`): requests may carry images.
    /// A `-m hf:ORG/REPO` model's is fetched from its repository when it holds one.
    #[arg(long = "mmproj", value_name = "FILE")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Do not fetch the projector file of a `-m hf:…` model (llama.cpp's `--no-mmproj`).
    #[arg(long = "no-mmproj", conflicts_with = "mmproj")]
    pub no_mmproj: bool,
    /// Fetch images given by `http(s)` URL (with size and time limits); without it such
    /// images are refused (data URIs and base64 always work).
    #[arg(long = "allow-image-urls", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false)]
    pub allow_image_urls: bool,
    /// Serve no chat page at `/` (llama-server's `--no-webui`).
    #[arg(long = "no-webui", conflicts_with = "webui_path")]
    pub no_webui: bool,
    /// Serve the chat page from this folder instead of the built-in one: `DIR/index.html`
    /// at `/`, its other files under `/webui/`.
    #[arg(long = "webui-path", value_name = "DIR")]
    pub webui_path: Option<std::path::PathBuf>,
    /// The most pixels (width × height) an image may have.
    #[arg(long = "image-max-pixels", value_name = "N", default_value_t = frink_vision::input::DEFAULT_MAX_PIXELS)]
    pub image_max_pixels: u64,
    /// Models loaded at once, at most (a request for another unloads the least recently
    /// used idle one).
    #[arg(long = "max-models", default_value_t = 3)]
    pub max_models: usize,
    /// Bytes the loaded models may hold together, each counted as its file and KV pool (K,
    /// M or G suffix; default: the memory available when the server starts).
    #[arg(long = "max-memory", value_parser = crate::common::parse_bytes)]
    pub max_memory: Option<usize>,
    /// How long a model stays loaded after its last request (Ollama's forms: `5m`, `1h`,
    /// seconds, `0` unloads at once, negative never; the -m model stays unless a request
    /// says otherwise).
    #[arg(long = "keep-alive", default_value = "5m", value_parser = keep_alive, allow_hyphen_values = true)]
    pub keep_alive: frink_server::models::KeepAlive,
    /// Models with settings of their own (a TOML file of `[models.NAME]` tables: `model`,
    /// `ctx`, `parallel`, `kv_size`, `kv_type`, `cache_type_k`, `cache_type_v`, `pooling`, `chat_template_file`,
    /// `draft_model`, `draft_max`, `lora`, `keep_alive`; docs/server.md).
    #[arg(long = "models-config")]
    pub models_config: Option<std::path::PathBuf>,
    /// Whether -m (or FRINK_MODEL) was given: without it the server loads the model each
    /// request names.
    #[arg(skip)]
    pub model_given: bool,
}

/// A `--keep-alive` value ([`frink_server::models::KeepAlive::parse`]).
fn keep_alive(s: &str) -> Result<frink_server::models::KeepAlive, String> {
    frink_server::models::KeepAlive::parse(&serde_json::Value::String(s.to_string()))
        .map_err(|e| e.replace("'keep_alive'", "--keep-alive"))
}

/// Resolves the model (fetching a catalog model on first use) and serves until SIGINT or
/// SIGTERM.
pub fn run(args: &ServeArgs) -> Result<()> {
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    anyhow::ensure!(args.ctx >= 2, "--ctx must be at least 2");
    anyhow::ensure!(
        args.kv_size.is_none_or(|n| n >= 2),
        "--kv-size must be at least 2"
    );
    anyhow::ensure!(
        args.checkpoint_interval >= 1,
        "--checkpoint-interval must be at least 1"
    );
    let seconds = |name: &str, v: f64| -> Result<std::time::Duration> {
        anyhow::ensure!(
            v.is_finite() && v > 0.0 && v <= 1e6,
            "{name} must be a number of seconds above 0, got {v}"
        );
        Ok(std::time::Duration::from_secs_f64(v))
    };
    let conn = frink_server::conn::ConnLimits {
        max_connections: args.max_connections,
        header_timeout: seconds("--header-timeout", args.header_timeout)?,
        idle_timeout: seconds("--idle-timeout", args.idle_timeout)?,
        io_timeout: seconds("--timeout", args.timeout)?,
    };
    anyhow::ensure!(
        conn.max_connections >= 1,
        "--max-connections must be at least 1"
    );
    frink_server::conn::fit_open_files(conn.max_connections, 64).map_err(anyhow::Error::msg)?;
    let api_keys = api_keys(args)?;
    let spec = args.spec.kind()?;
    let draft_model = args.spec.draft_path()?;
    anyhow::ensure!(args.max_models >= 1, "--max-models must be at least 1");
    anyhow::ensure!(
        args.mmproj.is_none() || args.model_given,
        "--mmproj is the -m model's projector file: give the model with -m"
    );
    let path = if args.model_given {
        Some(args.model.path()?)
    } else {
        None
    };
    let mmproj = match args.model_given {
        true => {
            crate::images::projector_path(&args.mmproj, args.no_mmproj, &args.model.model, false)?
        }
        false => None,
    };
    let (chat_template, chat_template_kwargs) = args.template.resolve()?;
    // The decode path is measured with the batches a loaded server decodes (docs/speed.md, "The
    // decode path").
    let model = crate::common::ModelArgs {
        decode_seqs: args.parallel.clamp(1, 4),
        ..args.model.clone()
    };
    let config = frink_server::ServeConfig {
        model_name: if args.model_given {
            args.model.model.clone()
        } else {
            String::new()
        },
        host: args.host.clone(),
        port: args.port,
        parallel: args.parallel,
        ctx: args.ctx,
        kv_size: args.kv_size.unwrap_or(0),
        kv_mem: args.kv_mem,
        queue: args.queue.max(1),
        api_keys,
        cors_origins: args.cors_origin.clone(),
        conn,
        kv_type: args.model.kv_type,
        chat_template,
        chat_template_kwargs,
        split_reasoning: args.reasoning_format == "auto",
        pooling: args.pooling,
        ubatch: args.ubatch as usize,
        model_path: path.clone(),
        max_models: args.max_models,
        max_memory: args.max_memory.map(|b| b as u64),
        keep_alive: args.keep_alive,
        models_config: match &args.models_config {
            Some(p) => frink_server::models::config::read(p, &|name| {
                let store = frink_store::Store::from_env()?;
                match store.list().into_iter().find(|m| m.name == name) {
                    Some(m) => Ok(m.path),
                    None => Ok(store.resolve(name)?),
                }
            })?,
            None => Vec::new(),
        },
        ctx_checkpoints: args.ctx_checkpoints,
        checkpoint_interval: args.checkpoint_interval,
        checkpoint_budget: args.checkpoint_budget,
        context_shift: args.context_shift,
        cache_disk: cache_disk(args)?,
        slot_save_path: match &args.slot_save_path {
            Some(d) if !d.is_dir() => {
                anyhow::bail!(
                    "--slot-save-path {}: no such directory (make it first)",
                    d.display()
                )
            }
            d => d.clone(),
        },
        prompt_lookup: spec == crate::common::SpecKind::Ngram,
        draft_max: args.spec.draft_max,
        draft_model,
        draft_p_min: args.spec.draft_p_min,
        draft_min: args.spec.draft_min,
        spec_adaptive: args.spec_adaptive,
        spec_sampling: args.spec.spec_sampling(),
        log_format: match (args.log_disable, args.log_format.as_str()) {
            (true, _) => frink_server::log::LogFormat::Off,
            (false, "json") => frink_server::log::LogFormat::Json,
            _ => frink_server::log::LogFormat::Text,
        },
        log_prompts: args.log_prompts,
        mmproj,
        allow_image_urls: args.allow_image_urls,
        webui: match (&args.webui_path, args.no_webui) {
            (Some(dir), _) if !dir.join("index.html").is_file() => anyhow::bail!(
                "--webui-path {}: no index.html there to serve at /",
                dir.display()
            ),
            (Some(dir), _) => frink_server::webui::WebUi::Dir(dir.clone()),
            (None, true) => frink_server::webui::WebUi::Off,
            (None, false) => frink_server::webui::WebUi::Embedded,
        },
        image_max_pixels: args.image_max_pixels,
    };
    // Sizes are checked against the file's metadata before anything listens or loads.
    if let Some(path) = &path {
        check_model(&model, path, &config)?;
    }
    // The same loading as every other command (thread pool, model options), for each
    // model the server loads.
    // LoRA adapters belong to the -m model; other models load without them.
    let plain = crate::common::ModelArgs {
        lora: Vec::new(),
        lora_scaled: Vec::new(),
        ..model.clone()
    };
    frink_server::run(
        config,
        std::sync::Arc::new(move |p, lora| match lora {
            Some(files) => crate::common::ModelArgs {
                lora: files.to_vec(),
                ..plain.clone()
            }
            .load_path(p),
            None if path.as_deref() == Some(p) => model.load_path(p),
            None => plain.load_path(p),
        }),
    )
}

/// What the `-m` model's metadata (with the overrides) says of the flags, before anything
/// listens or loads: the KV pool's size, `--cache-disk` and `--context-shift` refused
/// where the model cannot have them ([`frink_server::check_model_flags`]).
fn check_model(
    model: &crate::common::ModelArgs,
    path: &std::path::Path,
    config: &frink_server::ServeConfig,
) -> Result<()> {
    let mut file = frink_gguf::GgufFile::open(path)
        .with_context(|| format!("cannot load {}", path.display()))?;
    frink_models::overrides::apply(&mut file, &model.overrides_for(path)?)
        .with_context(|| format!("cannot load {}", path.display()))?;
    let shape = frink_models::ModelConfig::from_gguf(&file)
        .with_context(|| format!("cannot load {}", path.display()))?;
    drop(file);
    frink_server::kv_pool_positions(config, &shape)?;
    frink_server::check_model_flags(config, &shape)
}

/// `--cache-disk DIR` (made if missing) with `--cache-disk-size`.
fn cache_disk(args: &ServeArgs) -> Result<Option<(std::path::PathBuf, u64)>> {
    let Some(d) = &args.cache_disk else {
        return Ok(None);
    };
    std::fs::create_dir_all(d).with_context(|| format!("--cache-disk {}", d.display()))?;
    Ok(Some((d.clone(), args.cache_disk_size as u64)))
}

/// A `--cors-origin` value ([`frink_server::cors::check_origin`]).
fn cors_origin(s: &str) -> Result<String, String> {
    frink_server::cors::check_origin(s).map(|()| s.to_string())
}

/// The keys of `--api-key` (repeatable) and `--api-key-file` (one per line, blank lines
/// and `#` comments skipped; only the line ending is removed, nothing else is trimmed).
///
/// Errors: an unreadable key file, or one that holds no key.
fn api_keys(args: &ServeArgs) -> Result<Vec<String>> {
    let mut keys: Vec<String> = args
        .api_key
        .iter()
        .filter(|k| !k.is_empty())
        .cloned()
        .collect();
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--api-key-file {}: {e}", path.display()))?;
        let before = keys.len();
        keys.extend(
            text.lines()
                .map(|l| l.strip_suffix('\r').unwrap_or(l))
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string),
        );
        anyhow::ensure!(
            keys.len() > before,
            "--api-key-file {} holds no key",
            path.display()
        );
    }
    Ok(keys)
}
