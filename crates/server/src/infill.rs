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

use crate::api::request::InfillRequest;
use crate::api::{self, ApiError};
use crate::requests::{infill_ids, limits, text_prepared, Prepared};
use crate::AppState;

/// An `/infill` request read ([`InfillRequest::read`]) and tokenized.
fn prepare(st: &AppState, obj: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let eng = crate::requests::generative(st)?;
    let req = InfillRequest::read(obj, limits(st, eng))?;
    let infill = Infill {
        prefix: &req.prefix,
        suffix: &req.suffix,
        middle: &req.middle,
        extra: req
            .extra
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect(),
    };
    let prompt = infill_ids(st, eng, &infill, req.text.opts.max_tokens, "input_prefix")?;
    text_prepared(st, eng, prompt, req.text)
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
