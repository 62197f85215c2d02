//! Embeddings: OpenAI's `POST /v1/embeddings` and llama-server's `POST /embeddings`, over
//! the inputs' parsing and the scheduler's batched evaluation that Ollama's endpoints share.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, json_response, ApiError};
use frink_engine::scheduler::{Embed, Event, Request, SubmitError};

use crate::requests::{check_length, model_field, submit_error, ChannelSink};
use crate::respond::failed;
use crate::{AppState, Engine, St};

/// The most inputs one embedding request may carry (OpenAI's limit on `input`).
pub(crate) const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The inputs of an embedding request: `input` (OpenAI; llama-server's `content` too) as
/// a string, an array of strings, an array of token ids (one input) or an array of such
/// arrays; each tokenized as llama-server does (special tokens added and parsed), off the
/// HTTP threads ([`AppState::offload`]).
///
/// Errors: a 400 naming the field (missing, empty, wrong type, more than
/// [`MAX_EMBEDDING_INPUTS`] inputs, a token outside the vocabulary, an empty input).
pub(crate) async fn embedding_inputs(
    st: &Arc<AppState>,
    obj: &Map<String, Value>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let (field, v) = match (obj.get("input"), obj.get("content")) {
        (Some(v), _) => ("input", v),
        (None, Some(v)) => ("content", v),
        (None, None) => return Err(ApiError::invalid(Some("input"), "'input' is required")),
    };
    if let Value::Array(a) = v {
        if a.len() > MAX_EMBEDDING_INPUTS && !a.iter().all(Value::is_number) {
            return Err(ApiError::invalid(
                Some(field),
                format!(
                    "'{field}' holds {} inputs; one request may carry at most {MAX_EMBEDDING_INPUTS}",
                    a.len()
                ),
            ));
        }
    }
    let v = v.clone();
    st.offload(move |st| tokenize_inputs(st.engine()?, field, &v))
        .await
}

/// [`embedding_inputs`]' tokenization of the value `v` of `field`.
fn tokenize_inputs(eng: &Engine, field: &str, v: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
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

/// An embedding request's `dimensions`: `None` for the model's own width (or none
/// asked), `Some(d)` to keep the first `d` values before normalising, for a model trained
/// for it ([`frink_engine::embed::matryoshka`]).
///
/// Errors: a 400 naming the field for any other width, or any width but the model's own
/// on another model.
pub(crate) fn check_dimensions(
    eng: &Engine,
    obj: &Map<String, Value>,
) -> Result<Option<usize>, ApiError> {
    let bad =
        |m: String| Err(ApiError::invalid(Some("dimensions"), m).with_code("unsupported_field"));
    match api::opt_i64(obj, "dimensions")? {
        None => Ok(None),
        Some(d) if d == eng.n_embd as i64 => Ok(None),
        Some(d) if eng.matryoshka && d >= 1 && (d as usize) < eng.n_embd => Ok(Some(d as usize)),
        Some(d) if eng.matryoshka => bad(format!(
            "'dimensions' must be between 1 and this model's {} (got {d})",
            eng.n_embd
        )),
        Some(d) => bad(format!(
            "this model's embeddings have {} dimensions and it was not trained to be \
             shortened (Matryoshka) (got {d})",
            eng.n_embd
        )),
    }
}

/// Embeds `inputs` through the scheduler ([`run_embeds`]) with the server's pooling, keeps
/// the first `dims` values where asked ([`check_dimensions`]) and normalises with
/// `embd_norm` ([`frink_engine::embed::normalize`]; -1: raw). Returns the vectors in order
/// and the prompt tokens counted.
///
/// Errors: as [`run_embeds`].
pub(crate) async fn embed_inputs(
    st: &AppState,
    inputs: Vec<Vec<u32>>,
    embd_norm: i32,
    dims: Option<usize>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let eng = st.engine()?;
    let pooling = eng.pooling;
    let inputs = inputs
        .into_iter()
        .map(|t| (t, Embed::pooled(pooling)))
        .collect();
    let (mut vectors, tokens) = run_embeds(st, inputs, "input", "an input").await?;
    for v in &mut vectors {
        if let Some(d) = dims {
            v.truncate(d);
        }
        frink_engine::embed::normalize(v, embd_norm);
    }
    Ok((vectors, tokens))
}

/// Evaluates `inputs` (tokens and what to pool) through the scheduler: several inputs
/// batch together (a vector does not depend on its batch). Inputs go into the queue in
/// waves of at most `--queue`, the next submitted as one finishes, so a request with more
/// inputs than the queue holds is served, not refused. Returns the vectors (not
/// normalised) in order and the tokens counted. `field` and `what` name an input in a
/// too-long input's error.
///
/// Errors: a 400 for an input longer than the context (or an encoder's positions), 503
/// when the queue is full of other requests' work, 400/500 if an evaluation fails.
pub(crate) async fn run_embeds(
    st: &AppState,
    inputs: Vec<(Vec<u32>, Embed)>,
    field: &'static str,
    what: &str,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let eng = st.engine()?;
    for (input, _) in &inputs {
        check_length(eng, field, what, input.len())?;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tx = Some(tx);
    let n = inputs.len();
    let tokens: usize = inputs.iter().map(|i| i.0.len()).sum();
    let lora = eng.lora_set(None)?;
    let mut out: Vec<Option<Vec<f32>>> = vec![None; n];

    let (mut next, mut outstanding, mut done) = (0, 0, 0);
    while done < n {
        while next < n && outstanding < st.queue.max(1) {
            let Some(sender) = &tx else { break };
            // Cloned: a full queue hands the request back to nobody, and the input is
            // submitted again once one of ours finishes.
            let (prompt, embed) = inputs[next].clone();
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
                embed: Some(embed),
                lora: lora.clone(),
                prediction: None,
                images: Vec::new(),
                n_ctx: None,
                n_keep: 0,
                sink: Box::new(ChannelSink(sender.clone(), next)),
            };
            match eng.sched.submit(req) {
                Ok(()) => {
                    next += 1;
                    outstanding += 1;
                }
                // Other requests fill the queue: wait for one of ours to finish.
                Err(SubmitError::QueueFull) if outstanding > 0 => {
                    break;
                }
                Err(e) => return Err(submit_error(e)),
            }
        }
        if next == n {
            // Every input is queued: the channel closes when the last sink goes.
            tx = None;
        }
        match rx.recv().await {
            Some((i, Event::Embedding(v))) => out[i] = Some(v),
            Some((_, Event::Done(_))) => {
                done += 1;
                outstanding -= 1;
            }
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
pub(crate) async fn embeddings(State(st): St, body: Bytes) -> Response {
    let r = async {
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
        let dims = check_dimensions(eng, &obj)?;
        let inputs = embedding_inputs(&st, &obj).await?;
        let (vectors, tokens) = embed_inputs(&st, inputs, 2, dims).await?;
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
pub(crate) async fn embeddings_llamacpp(State(st): St, body: Bytes) -> Response {
    let r = async {
        let obj = api::parse_object(&body)?;
        let norm = match api::opt_i64(&obj, "embd_normalize")?.unwrap_or(2) {
            n @ -1..=0x7fff_ffff => n as i32,
            n => {
                return Err(ApiError::invalid(
                    Some("embd_normalize"),
                    format!(
                        "'embd_normalize' must be -1 (none), 0, 1, 2 or a p-norm above 2 (got {n})"
                    ),
                ))
            }
        };
        let dims = check_dimensions(st.engine()?, &obj)?;
        let inputs = embedding_inputs(&st, &obj).await?;
        let (vectors, _) = embed_inputs(&st, inputs, norm, dims).await?;
        let out: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(i, v)| json!({"index": i, "embedding": [v]}))
            .collect();
        Ok(json_response(StatusCode::OK, &Value::Array(out)))
    };
    r.await.unwrap_or_else(ApiError::into_response)
}
