//! `frink serve`: the OpenAI-compatible HTTP server (frink-server), with the flags and
//! `FRINK_*` environment variables of CONTRACT.md.

use anyhow::Result;
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
    #[arg(long, env = "FRINK_CTX", default_value_t = 4096)]
    pub ctx: usize,
    /// Positions of the KV block pool all requests share (default: parallel × ctx).
    #[arg(long = "kv-size", env = "FRINK_KV_SIZE", conflicts_with = "kv_mem")]
    pub kv_size: Option<usize>,
    /// Bytes of the KV block pool (K, M or G suffix), instead of --kv-size.
    #[arg(long = "kv-mem", env = "FRINK_KV_MEM", value_parser = crate::common::parse_bytes)]
    pub kv_mem: Option<usize>,
    /// Requests that may wait for a free slot; beyond it requests get 503.
    #[arg(long, env = "FRINK_QUEUE", default_value_t = 64)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long = "api-key", env = "FRINK_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
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
    /// Bytes all checkpoints may hold together (K, M or G suffix); the oldest go first.
    #[arg(long = "checkpoint-budget", value_parser = crate::common::parse_bytes, default_value = "1G")]
    pub checkpoint_budget: usize,
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
    let spec = args.spec.kind()?;
    let draft_model = args.spec.draft_path()?;
    let path = args.model.path()?;
    let (chat_template, chat_template_kwargs) = args.template.resolve()?;
    let model = args.model.clone();
    frink_server::run(
        frink_server::ServeConfig {
            model_name: args.model.model.clone(),
            host: args.host.clone(),
            port: args.port,
            parallel: args.parallel,
            ctx: args.ctx,
            kv_size: args.kv_size.unwrap_or(0),
            kv_mem: args.kv_mem,
            queue: args.queue.max(1),
            api_key: args.api_key.clone(),
            kv_type: args.model.kv_type,
            chat_template,
            chat_template_kwargs,
            split_reasoning: args.reasoning_format == "auto",
            pooling: args.pooling,
            model_path: path.clone(),
            ctx_checkpoints: args.ctx_checkpoints,
            checkpoint_interval: args.checkpoint_interval,
            checkpoint_budget: args.checkpoint_budget,
            prompt_lookup: spec == crate::common::SpecKind::Ngram,
            draft_max: args.spec.draft_max,
            draft_model,
            draft_p_min: args.spec.draft_p_min,
            draft_min: args.spec.draft_min,
            spec_adaptive: args.spec_adaptive,
            spec_sampling: args.spec.spec_sampling(),
        },
        // The same loading as every other command (thread pool, model options).
        Box::new(move || model.load_path(&path)),
    )
}
