//! `frink inspect-plan`: runs a prompt through a mixture-of-experts model, counts each
//! layer's expert selections, and shows which experts a byte budget would keep resident
//! (the hottest first), as CONTRACT.md gives it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use frink_engine::Session;
use frink_models::Logits;
use frink_tokenizer::Tokenizer;

use crate::common::ModelArgs;

/// Flags of `frink inspect-plan`.
#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt: a text file (`-`: standard input), tokenized with the model's BOS rule.
    #[arg(long = "prompt-file")]
    pub prompt_file: PathBuf,
}

/// Runs the plan and prints one JSON object:
/// `{"layers": [{"layer", "counts"}], "resident": [{"layer", "expert", "count", "bytes"}],
/// "budget", "resident_bytes", "expert_bytes", "total_expert_bytes", "selections",
/// "resident_selections", "prompt_tokens", "cache"}`. Without `--expert-budget`, every
/// expert counts as resident.
pub fn run(args: &PlanArgs) -> Result<()> {
    // (The prompt in batches: no decode path to measure.)
    let model = crate::common::ModelArgs {
        decode_seqs: 0,
        ..args.model.clone()
    }
    .load()?;
    if model.config.moe.is_none() {
        bail!("inspect-plan: the model has no routed experts");
    }
    let text = if args.prompt_file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(&args.prompt_file)
            .with_context(|| format!("cannot read {}", args.prompt_file.display()))?
    };
    let tok = Tokenizer::from_gguf(&model.file).context("cannot build the tokenizer")?;
    let ids = tok.encode(&text, tok.add_bos(), false)?;
    let mut session = Session::new(&model, ids.len().max(1), args.model.kv_type);
    model.moe_stats.reset();
    session.eval(&ids, Logits::None)?;

    let counts = model.moe_stats.counts();
    let layers: Vec<_> = counts
        .iter()
        .enumerate()
        .filter(|(il, _)| model.expert_bytes(*il) > 0)
        .map(|(il, c)| serde_json::json!({"layer": il, "counts": c}))
        .collect();
    // The hottest experts first (ties: lower layer, then lower expert), while they fit.
    let mut hot: Vec<(u64, usize, usize)> = counts
        .iter()
        .enumerate()
        .flat_map(|(il, c)| c.iter().enumerate().map(move |(e, &n)| (n, il, e)))
        .filter(|&(_, il, _)| model.expert_bytes(il) > 0)
        .collect();
    hot.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let budget = args.model.expert_budget.unwrap_or(usize::MAX);
    let (mut used, mut served, mut resident) = (0usize, 0u64, Vec::new());
    for (n, il, e) in &hot {
        let b = model.expert_bytes(*il);
        if used + b <= budget {
            used += b;
            served += n;
            resident.push(serde_json::json!({"layer": il, "expert": e, "count": n, "bytes": b}));
        }
    }
    let selections: u64 = hot.iter().map(|h| h.0).sum();
    let cache = model.expert_cache.as_ref().map(|c| {
        let s = c.stats();
        serde_json::json!({"hits": s.hits, "misses": s.misses, "peak_bytes": s.peak_bytes})
    });
    let out = serde_json::json!({
        "prompt_tokens": ids.len(),
        "layers": layers,
        "resident": resident,
        "budget": args.model.expert_budget,
        "resident_bytes": used,
        "expert_bytes": (0..model.config.n_layer).map(|il| model.expert_bytes(il)).collect::<Vec<_>>(),
        "total_expert_bytes": model.total_expert_bytes(),
        "selections": selections,
        "resident_selections": served,
        "cache": cache,
    });
    outln!("{out}");
    Ok(())
}
