//! `GET /metrics`: the scheduler's counters, gauges and histograms in Prometheus' text
//! format (CONTRACT.md), with vLLM's names beside frink's.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use std::fmt::Write as _;

use frink_engine::scheduler::Histogram;

use crate::St;

pub(crate) async fn metrics(State(st): St) -> Response {
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
        "frink_requests_failed_total",
        "Requests that ended in an error (a failed evaluation, a grammar the answer could not follow).",
        "counter",
        m.requests_failed as f64,
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
    let conns = &st.conns;
    counter(
        "frink_connections_open",
        "HTTP connections open.",
        "gauge",
        conns.open_count() as f64,
    );
    for (name, help, v) in [
        (
            "frink_connections_evicted_total",
            "Idle connections closed to admit new ones at --max-connections.",
            &conns.evicted,
        ),
        (
            "frink_connections_timed_out_total",
            "Connections closed by --idle-timeout or a write blocked for --timeout.",
            &conns.timed_out,
        ),
        (
            "frink_connections_refused_total",
            "Connections refused with a 503 at --max-connections, all answering requests.",
            &conns.refused,
        ),
    ] {
        counter(
            name,
            help,
            "counter",
            v.load(std::sync::atomic::Ordering::Relaxed) as f64,
        );
    }
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

pub(crate) fn histogram(s: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (i, b) in Histogram::BOUNDS.iter().enumerate() {
        let c = h.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(s, "{name}_bucket{{le=\"{b}\"}} {c}");
    }
    let _ = writeln!(s, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(s, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
}
