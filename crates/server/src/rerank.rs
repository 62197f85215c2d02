//! Reranking: `POST /v1/rerank` and `/rerank` in the shape llama-server, Jina and Cohere
//! share (`query`, `documents`, `top_n`, `return_documents`; `results` sorted best first,
//! each with its `index` and `relevance_score`), and TEI's (`texts`, answered as a bare
//! array of `{"index", "score"}`, with `return_text`), as llama-server accepts both
//! (tools/server/server-context.cpp `post_rerank`, server-common.cpp
//! `format_response_rerank`; TEI's `raw_scores` honoured: its scores are sigmoids unless it
//! is true). Each (query, document) pair is encoded as the model's
//! tokenizer pairs texts ([`frink_tokenizer::Tokenizer::encode_pair`]) and scored by the
//! model's classifier head: the raw score, as llama-server returns it.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use frink_engine::scheduler::Embed;
use frink_models::Pooling;
use serde_json::{json, Map, Value};

use crate::api::{self, json_response, ApiError};
use crate::embeddings::{run_embeds, MAX_EMBEDDING_INPUTS};
use crate::requests::{check_length, model_field};
use crate::St;

/// The documents of a rerank request: `documents` (strings, or objects whose `text` is
/// scored, as Jina's) or TEI's `texts`; whether the TEI shape was used.
///
/// Errors: a 400 naming the field (missing, empty, more than [`MAX_EMBEDDING_INPUTS`], an
/// element that is neither a string nor an object with a string `text`).
fn documents(obj: &Map<String, Value>) -> Result<(Vec<String>, bool), ApiError> {
    let (field, tei) = match (obj.get("documents"), obj.get("texts")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                Some("texts"),
                "give 'documents' or TEI's 'texts', not both",
            ))
        }
        (Some(_), _) => ("documents", false),
        (None, Some(_)) => ("texts", true),
        (None, None) => {
            return Err(ApiError::invalid(
                Some("documents"),
                "'documents' is required",
            ))
        }
    };
    let bad = |m: &str| ApiError::invalid(Some(field), format!("'{field}' {m}"));
    let Some(Value::Array(a)) = obj.get(field) else {
        return Err(bad("must be an array"));
    };
    if a.is_empty() {
        return Err(bad("must be a non-empty array"));
    }
    if a.len() > MAX_EMBEDDING_INPUTS {
        return Err(bad(&format!(
            "holds {} documents; one request may carry at most {MAX_EMBEDDING_INPUTS}",
            a.len()
        )));
    }
    let docs = a
        .iter()
        .map(|d| match d {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(bad("holds an object without a string 'text'")),
            },
            _ => Err(bad("must hold strings or objects with a 'text'")),
        })
        .collect::<Result<_, _>>()?;
    Ok((docs, tei))
}

/// `POST /v1/rerank` and `/rerank`.
pub(crate) async fn rerank(State(st): St, body: Bytes) -> Response {
    let r = async {
        let obj = api::parse_object(&body)?;
        let eng = st.engine()?;
        if !eng.reranker {
            return Err(ApiError::invalid(
                Some("model"),
                format!(
                    "model '{}' ({}) cannot rerank: it has no classifier head (a reranker's \
                     GGUF has cls.output, e.g. bge-reranker)",
                    st.model_name, eng.arch
                ),
            )
            .with_code("model_not_supported"));
        }
        let query = match obj.get("query") {
            Some(Value::String(q)) => q.clone(),
            Some(_) => return Err(ApiError::invalid(Some("query"), "'query' must be a string")),
            None => return Err(ApiError::invalid(Some("query"), "'query' is required")),
        };
        if obj.contains_key("rank_fields") {
            return Err(ApiError::invalid(
                Some("rank_fields"),
                "'rank_fields' is not supported: give each document's text as a string or \
                 as its 'text'",
            )
            .with_code("unsupported_field"));
        }
        let (docs, tei) = documents(&obj)?;
        let top_n = match api::opt_i64(&obj, "top_n")? {
            None => docs.len(),
            Some(n) if n >= 0 => (n as usize).min(docs.len()),
            Some(n) => {
                return Err(ApiError::invalid(
                    Some("top_n"),
                    format!("'top_n' must not be negative (got {n})"),
                ))
            }
        };
        // Either spelling in either shape.
        let with_text = api::opt_bool(&obj, "return_text")?
            .or(api::opt_bool(&obj, "return_documents")?)
            .unwrap_or(false);
        // TEI's scores are the sigmoid of the logits unless `raw_scores` (its default
        // false); it truncates nothing unless asked, and frink never does.
        let sigmoid = tei && !api::opt_bool(&obj, "raw_scores")?.unwrap_or(false);
        if api::opt_bool(&obj, "truncate")? == Some(true) {
            return Err(ApiError::invalid(
                Some("truncate"),
                "'truncate' is not supported: an input past the model's positions is refused",
            )
            .with_code("unsupported_field"));
        }
        // The query once, refused before any document when it alone is past the
        // model's positions; each pair checked as it is made.
        let pairs = {
            let docs = docs.clone();
            st.offload(move |st| {
                let eng = st.engine()?;
                let tok = &eng.tok;
                let bad = |field: &str, e: frink_tokenizer::TokenizerError| {
                    ApiError::invalid(Some(field), e.to_string())
                };
                let q = tok
                    .encode(&query, false, false)
                    .map_err(|e| bad("query", e))?;
                check_length(eng, "query", "the query", q.len())?;
                docs.iter()
                    .map(|d| {
                        let d = tok
                            .encode(d, false, false)
                            .map_err(|e| bad("documents", e))?;
                        let (ids, types) =
                            tok.pair_from_ids(&q, &d).map_err(|e| bad("documents", e))?;
                        check_length(eng, "documents", "a query and document", ids.len())?;
                        Ok((
                            ids,
                            Embed {
                                pooling: Pooling::Rank,
                                token_types: types,
                            },
                        ))
                    })
                    .collect::<Result<Vec<_>, ApiError>>()
            })
            .await?
        };
        let (scores, tokens) = run_embeds(&st, pairs, "documents", "a query and document").await?;
        let mut ranked: Vec<(usize, f32)> = scores
            .iter()
            .enumerate()
            .map(|(i, v)| (i, v.first().copied().unwrap_or(f32::NAN)))
            .map(|(i, s)| (i, if sigmoid { 1.0 / (1.0 + (-s).exp()) } else { s }))
            .collect();
        // Best first; equal scores keep the documents' order.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(top_n);
        let label = if tei { "score" } else { "relevance_score" };
        let results: Vec<Value> = ranked
            .iter()
            .map(|&(i, s)| {
                let mut r = json!({"index": i, label: s});
                if with_text && tei {
                    r["text"] = json!(docs[i]);
                } else if with_text {
                    r["document"] = json!({"text": docs[i]});
                }
                r
            })
            .collect();
        if tei {
            return Ok(json_response(StatusCode::OK, &Value::Array(results)));
        }
        Ok(json_response(
            StatusCode::OK,
            &json!({
                "model": model_field(&st, &obj),
                "object": "list",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "results": results,
            }),
        ))
    };
    r.await.unwrap_or_else(ApiError::into_response)
}
