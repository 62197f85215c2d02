//! Fill-in-the-middle: llama.cpp's `POST /infill` (`input_prefix`, `input_suffix`,
//! `input_extra` with other files of the repository, `prompt` as the middle's start;
//! answered in llama.cpp's native shape, whole or streamed: [`crate::native`]), and `suffix` on `/v1/completions` and Ollama's `/api/generate`
//! (the prompt is the prefix). The prompt is built as llama-server builds it
//! ([`frink_tokenizer::Tokenizer::infill_prompt`]); a model without FIM tokens is a 400.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use frink_tokenizer::Infill;
use serde_json::{Map, Value};

use crate::api::{self, ApiError, Endpoint};
use crate::requests::{infill_ids, text_prepared, Prepared};
use crate::AppState;

/// `input_extra`: `[{"filename", "text"}]` (a file name defaults to `tmp`, as llama.cpp's).
fn extra(obj: &Map<String, Value>) -> Result<Vec<(&str, &str)>, ApiError> {
    let bad = || {
        ApiError::invalid(
            Some("input_extra"),
            "'input_extra' must be an array of {\"filename\": string, \"text\": string}",
        )
    };
    match obj.get("input_extra") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let o = item.as_object().ok_or_else(bad)?;
                let text = o.get("text").and_then(Value::as_str).ok_or_else(bad)?;
                let name = match o.get("filename") {
                    None | Some(Value::Null) => "tmp",
                    Some(v) => v.as_str().ok_or_else(bad)?,
                };
                Ok((name, text))
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// An `/infill` request parsed and tokenized.
fn prepare(st: &AppState, obj: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let eng = st.engine()?;
    let opts = api::gen_options(obj, Endpoint::Completions, eng.tok.n_vocab(), st.parallel)?;
    let text = |name: &'static str| -> Result<&str, ApiError> {
        Ok(api::opt_str(obj, name)?.unwrap_or(""))
    };
    let infill = Infill {
        prefix: text("input_prefix")?,
        suffix: text("input_suffix")?,
        middle: text("prompt")?,
        extra: extra(obj)?,
    };
    let prompt = infill_ids(st, eng, &infill, opts.max_tokens, "input_prefix")?;
    text_prepared(st, eng, obj, prompt, opts, None)
}

/// `POST /infill` (module docs).
pub(crate) async fn infill(
    State(st): State<Arc<AppState>>,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    body: Bytes,
) -> Response {
    let r = st
        .offload(move |st| {
            let mut obj = api::parse_object(&body)?;
            let return_tokens = crate::native::take_return_tokens(&mut obj)?;
            Ok((prepare(st, &obj)?, return_tokens))
        })
        .await;
    match r {
        Ok((p, return_tokens)) => {
            let log = log.map(|l| l.0).unwrap_or_default();
            crate::native::answer(&st, p, "input_prefix", return_tokens, log).await
        }
        Err(e) => e.into_response(),
    }
}
