//! `GET /metrics`: the scheduler's counters, gauges and histograms in Prometheus' text
//! format (CONTRACT.md), with vLLM's names beside frink's.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use std::fmt::Write as _;

use frink_engine::scheduler::{Histogram, MetricsSnapshot};

use std::sync::Arc;

use crate::Server;

/// One Prometheus series: name, help text, type (`counter` or `gauge`), value.
struct Series(&'static str, &'static str, &'static str, f64);

const COUNTER: &str = "counter";
const GAUGE: &str = "gauge";

/// `GET /metrics`: each loaded model's series labelled `model_name` (vLLM's label), then
/// the server's own (connections, model loads, memory).
pub(crate) async fn metrics(State(srv): State<Arc<Server>>) -> Response {
    let resident = srv.models.resident();
    let per: Vec<(String, MetricsSnapshot, u64)> = resident
        .iter()
        .filter_map(|r| {
            let e = r.app.engine().ok()?;
            Some((label(&r.name), e.sched.metrics(), r.bytes))
        })
        .collect();
    let mut s = String::new();
    let tables: Vec<Vec<Series>> = per
        .iter()
        .map(|(_, m, _)| {
            request_series(m)
                .into_iter()
                .chain(step_series(m))
                .collect()
        })
        .collect();
    if let Some(first) = tables.first() {
        for (j, Series(name, help, kind, _)) in first.iter().enumerate() {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (k, (model, _, _)) in per.iter().enumerate() {
                let _ = writeln!(s, "{name}{{model_name=\"{model}\"}} {}", tables[k][j].3);
            }
        }
        let _ = writeln!(
            s,
            "# HELP vllm:cache_config_info The KV pool's layout (vLLM's name): positions per block, blocks.\n# TYPE vllm:cache_config_info gauge"
        );
        for (model, m, _) in &per {
            let _ = writeln!(
                s,
                "vllm:cache_config_info{{model_name=\"{model}\",block_size=\"{}\",num_gpu_blocks=\"{}\",num_cpu_blocks=\"0\"}} 1",
                frink_models::KV_BLOCK,
                m.kv_blocks_total
            );
        }
        let _ = writeln!(
            s,
            "# HELP frink_model_bytes Bytes a loaded model counts for (its file and KV pool).\n# TYPE frink_model_bytes gauge"
        );
        for (model, _, bytes) in &per {
            let _ = writeln!(s, "frink_model_bytes{{model_name=\"{model}\"}} {bytes}");
        }
    }
    type Pick = fn(&MetricsSnapshot) -> &Histogram;
    let hists: [(&str, &str, Pick); 2] = [
        (
            "frink_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
            |m| &m.ttft,
        ),
        (
            "frink_token_latency_seconds",
            "Between consecutive tokens of a request.",
            |m| &m.token_latency,
        ),
    ];
    for (name, help, h) in hists {
        if per.is_empty() {
            break;
        }
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (model, m, _) in &per {
            histogram(&mut s, name, &format!("model_name=\"{model}\","), h(m));
        }
    }
    let series = connection_series(&srv.conns)
        .into_iter()
        .chain(model_series(&srv.models));
    for Series(name, help, kind, v) in series {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s,
    )
        .into_response()
}

/// `name` as a Prometheus label value (backslash, quote and newline escaped).
fn label(name: &str) -> String {
    name.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The model manager's counters and gauges.
fn model_series(m: &crate::models::Models) -> Vec<Series> {
    let count =
        |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed) as f64;
    vec![
        Series(
            "frink_models_loaded",
            "Models loaded now.",
            GAUGE,
            m.resident().len() as f64,
        ),
        Series(
            "frink_model_loads_total",
            "Model loads started (the first and every reload).",
            COUNTER,
            count(&m.loads),
        ),
        Series(
            "frink_model_unloads_total",
            "Models unloaded (keep-alive ended, room made for another, or asked).",
            COUNTER,
            count(&m.unloads),
        ),
        Series(
            "frink_model_load_failures_total",
            "Model loads that failed.",
            COUNTER,
            count(&m.load_failures),
        ),
        Series(
            "frink_models_bytes",
            "Bytes the loaded and loading models count for.",
            GAUGE,
            m.bytes() as f64,
        ),
        Series(
            "frink_models_memory_budget_bytes",
            "Bytes the models may hold together (--max-memory).",
            GAUGE,
            m.max_memory() as f64,
        ),
    ]
}

/// The requests' counts and the slots' and queue's gauges.
fn request_series(m: &MetricsSnapshot) -> Vec<Series> {
    vec![
        Series("frink_requests_total", "Completion requests accepted into the queue.", COUNTER, m.requests_total as f64),
        Series("frink_requests_finished_total", "Requests that ran to completion.", COUNTER, m.requests_finished as f64),
        Series("frink_requests_cancelled_total", "Requests dropped because their client went away (or at shutdown).", COUNTER, m.requests_cancelled as f64),
        Series("frink_requests_failed_total", "Requests that ended in an error (a failed evaluation, a grammar the answer could not follow).", COUNTER, m.requests_failed as f64),
        Series("frink_requests_rejected_total", "Requests refused with 503 because the queue was full.", COUNTER, m.requests_rejected as f64),
        Series("frink_tokens_generated_total", "Tokens generated.", COUNTER, m.tokens_generated as f64),
        Series("frink_prompt_tokens_total", "Prompt tokens of admitted requests.", COUNTER, m.prompt_tokens as f64),
        Series("frink_prompt_tokens_cached_total", "Prompt tokens reused from a slot's cache instead of evaluated.", COUNTER, m.prompt_tokens_cached as f64),
        Series("frink_forward_steps_total", "Forward passes run (each over every active sequence's rows).", COUNTER, m.forward_steps as f64),
        Series("frink_checkpoints_restored_total", "Requests that continued from a checkpoint of a recurrent state.", COUNTER, m.checkpoints_restored as f64),
        Series("frink_checkpoints", "Checkpoints of recurrent states held.", GAUGE, m.checkpoints as f64),
        Series("frink_checkpoint_bytes", "Bytes the checkpoints of recurrent states hold.", GAUGE, m.checkpoint_bytes as f64),
        Series("frink_requests_active", "Requests running or waiting.", GAUGE, (m.slots_busy + m.queue_depth) as f64),
        Series("frink_queue_depth", "Requests waiting for a slot.", GAUGE, m.queue_depth as f64),
        Series("frink_slots_busy", "Sequence slots running a request.", GAUGE, m.slots_busy as f64),
    ]
}

/// The connection table's gauge and counters ([`crate::conn::ConnTable`]).
fn connection_series(conns: &crate::conn::ConnTable) -> Vec<Series> {
    let count =
        |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed) as f64;
    vec![
        Series(
            "frink_connections_open",
            "HTTP connections open.",
            GAUGE,
            conns.open_count() as f64,
        ),
        Series(
            "frink_connections_evicted_total",
            "Idle connections closed to admit new ones at --max-connections.",
            COUNTER,
            count(&conns.evicted),
        ),
        Series(
            "frink_connections_timed_out_total",
            "Connections closed by --idle-timeout or a write blocked for --timeout.",
            COUNTER,
            count(&conns.timed_out),
        ),
        Series(
            "frink_connections_refused_total",
            "Connections refused with a 503 at --max-connections, all answering requests.",
            COUNTER,
            count(&conns.refused),
        ),
    ]
}

/// The steps' times, the grammar's, the KV pool's use (with the names vLLM exports, which
/// Kubernetes' Gateway API Inference Extension reads to route by load: its endpoint picker
/// scores replicas by queue depth and KV-cache use) and speculation.
fn step_series(m: &MetricsSnapshot) -> Vec<Series> {
    vec![
        Series("frink_slots_total", "Sequence slots.", GAUGE, m.slots_total as f64),
        Series("frink_prefill_seconds_total", "Forward-pass time spent on prompt tokens.", COUNTER, m.prefill_seconds),
        Series("frink_decode_seconds_total", "Forward-pass time spent on generated tokens.", COUNTER, m.decode_seconds),
        Series("frink_grammar_mask_seconds_total", "Time constrained tokens spent computing their grammar's mask and committing to it.", COUNTER, m.grammar_seconds),
        Series("frink_grammar_tokens_total", "Tokens sampled under a grammar (response_format, json_schema, grammar).", COUNTER, m.grammar_tokens as f64),
        Series("vllm:num_requests_waiting", "Requests waiting for a slot (vLLM's name, for the Gateway API Inference Extension).", GAUGE, m.queue_depth as f64),
        Series("vllm:num_requests_running", "Requests running in a slot (vLLM's name).", GAUGE, m.slots_busy as f64),
        Series("vllm:kv_cache_usage_perc", "KV pool blocks held by running sequences over all blocks, 0 to 1 (vLLM's name).", GAUGE, m.kv_blocks_used as f64 / m.kv_blocks_total.max(1) as f64),
        Series("frink_kv_blocks_total", "Blocks of the KV pool.", GAUGE, m.kv_blocks_total as f64),
        Series("frink_kv_blocks_used", "KV pool blocks held by running sequences.", GAUGE, m.kv_blocks_used as f64),
        Series("frink_kv_blocks_cached", "KV pool blocks that keep reusable tokens (the prefix cache, idle slots' conversations).", GAUGE, m.kv_blocks_cached as f64),
        Series("frink_kv_window_blocks_total", "Blocks of the KV pool's window group (sliding-window layers; 0: none).", GAUGE, m.kv_window_blocks_total as f64),
        Series("frink_kv_window_blocks_held", "Window-group blocks held by slots (running or idle).", GAUGE, m.kv_window_blocks_held as f64),
        Series("frink_kv_bytes", "Bytes of the KV pool's keys and values.", GAUGE, m.kv_bytes as f64),
        Series("frink_spec_proposed_tokens_total", "Speculative decoding: tokens proposed (prompt lookup, a draft model or a request's prediction) and verified.", COUNTER, m.spec_proposed as f64),
        Series("frink_spec_accepted_tokens_total", "Speculative decoding: proposed tokens the answers took (the rest were verified in vain).", COUNTER, m.spec_accepted as f64),
        Series("frink_preemptions_total", "Sequences whose blocks went to older ones (evaluated again later, same tokens).", COUNTER, m.preemptions as f64),
        Series("frink_cache_disk_hits_total", "Prefix-cache blocks read back from the disk tier (--cache-disk).", COUNTER, m.cache_disk_hits as f64),
        Series("frink_cache_disk_bytes", "Bytes of the prefix cache's disk tier.", GAUGE, m.cache_disk_bytes as f64),
        Series("frink_context_shifts_total", "Generations that reached the context and dropped their oldest tokens to go on (--context-shift).", COUNTER, m.context_shifts as f64),
    ]
}

/// One model's histogram lines (`labels`: `key="value",` pairs before `le`).
pub(crate) fn histogram(s: &mut String, name: &str, labels: &str, h: &Histogram) {
    for (i, b) in Histogram::BOUNDS.iter().enumerate() {
        let c = h.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(s, "{name}_bucket{{{labels}le=\"{b}\"}} {c}");
    }
    let _ = writeln!(s, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", h.count);
    let l = labels.trim_end_matches(',');
    let _ = writeln!(
        s,
        "{name}_sum{{{l}}} {}\n{name}_count{{{l}}} {}",
        h.sum, h.count
    );
}
