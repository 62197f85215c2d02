//! llama.cpp's slot endpoints (tools/server/README.md): `GET /slots` and `POST
//! /slots/{id}?action=save|restore|erase` with `{"filename": …}` for save and restore.
//! Files live in `--slot-save-path` and are named by a file name, never a path: nothing
//! is read or written outside that folder. A restored slot's tokens are reused by the
//! next request whose prompt starts with them, whatever `id_slot` it sends
//! ([`frink_engine::scheduler::SlotAction`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use frink_engine::scheduler::{SlotAction, SlotError, SlotReply};
use serde_json::{json, Value};

use crate::api::{json_response, parse_object, ApiError};
use crate::{AppState, St};

/// Whether `name` is a plain file name (llama.cpp `fs_validate_filename`'s rule, kept
/// simple): 1 to 255 bytes, no path separator, no `..`, not starting with a dot, no
/// control characters.
fn valid_filename(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', ':'])
        && !name.contains("..")
        && !name.chars().any(char::is_control)
}

/// Runs a slot action on the scheduler's thread (off the async runtime's threads).
async fn run(st: Arc<AppState>, id: usize, action: SlotAction) -> Result<SlotReply, ApiError> {
    let eng = st.engine()?;
    if eng.encoder {
        return Err(ApiError::invalid(
            None,
            format!("model '{}' is an encoder: it has no slots", st.model_name),
        ));
    }
    let st2 = Arc::clone(&st);
    let r = tokio::task::spawn_blocking(move || {
        st2.engine()
            .map(|e| e.sched.slot(id, action))
            .map_err(|_| SlotError::Stopped)
            .and_then(|r| r)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    })?;
    r.map_err(|e| match e {
        SlotError::Io { .. } | SlotError::Pool(_) | SlotError::Stopped => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        ),
        SlotError::NoSuchSlot { .. } => ApiError::invalid(Some("id_slot"), e.to_string()),
        _ => ApiError::invalid(None, e.to_string()),
    })
}

/// `GET /slots`: each slot's id, context, whether it runs a request and the tokens its
/// cache holds.
pub(crate) async fn list(State(st): St) -> Response {
    match run(st, 0, SlotAction::List).await {
        Ok(SlotReply::List(slots)) => {
            let v: Vec<Value> = slots
                .iter()
                .map(|s| {
                    json!({
                        "id": s.id,
                        "id_task": if s.is_processing { 0 } else { -1 },
                        "n_ctx": s.n_ctx,
                        "speculative": false,
                        "is_processing": s.is_processing,
                        "tokens_cached": s.n_tokens,
                    })
                })
                .collect();
            json_response(StatusCode::OK, &Value::Array(v))
        }
        Ok(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "no list")
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /slots/{id}?action=save|restore|erase`.
pub(crate) async fn action(
    State(st): St,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    // The slot is the path's last segment (the model dispatch nests this router).
    let id = uri.path().rsplit('/').next().unwrap_or("");
    match slot_action(st, id, &q, &body).await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

async fn slot_action(
    st: Arc<AppState>,
    id: &str,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let id: usize = id
        .parse()
        .map_err(|_| ApiError::invalid(Some("id_slot"), format!("invalid slot id {id:?}")))?;
    let action = q.get("action").map(String::as_str).unwrap_or("");
    let file = |st: &AppState| -> Result<(String, std::path::PathBuf), ApiError> {
        let Some(dir) = &st.slot_save_path else {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "not_supported_error",
                "this server does not save slots: start it with --slot-save-path DIR",
            ));
        };
        let obj = parse_object(body)?;
        let name = obj
            .get("filename")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(Some("filename"), "'filename' must be a string"))?;
        if !valid_filename(name) {
            return Err(ApiError::invalid(
                Some("filename"),
                format!("invalid filename {name:?}: a file name, not a path"),
            ));
        }
        Ok((name.to_string(), dir.join(name)))
    };
    // Errors name the file as the request did, not the server's folder.
    let named = |e: ApiError, path: &std::path::Path, name: &str| ApiError {
        message: e.message.replace(&path.display().to_string(), name),
        ..e
    };
    match action {
        "save" => {
            let (name, path) = file(&st)?;
            let r = run(st, id, SlotAction::Save(path.clone())).await;
            match r.map_err(|e| named(e, &path, &name))? {
                SlotReply::Saved {
                    n_tokens,
                    n_bytes,
                    ms,
                } => Ok(json!({
                    "id_slot": id, "filename": name, "n_saved": n_tokens,
                    "n_written": n_bytes, "timings": {"save_ms": ms},
                })),
                other => Err(unexpected(other)),
            }
        }
        "restore" => {
            let (name, path) = file(&st)?;
            let r = run(st, id, SlotAction::Restore(path.clone())).await;
            match r.map_err(|e| named(e, &path, &name))? {
                SlotReply::Restored {
                    n_tokens,
                    n_bytes,
                    ms,
                } => Ok(json!({
                    "id_slot": id, "filename": name, "n_restored": n_tokens,
                    "n_read": n_bytes, "timings": {"restore_ms": ms},
                })),
                other => Err(unexpected(other)),
            }
        }
        "erase" => match run(st, id, SlotAction::Erase).await? {
            SlotReply::Erased { n_tokens } => Ok(json!({"id_slot": id, "n_erased": n_tokens})),
            other => Err(unexpected(other)),
        },
        other => Err(ApiError::invalid(
            Some("action"),
            format!("invalid action {other:?}: save, restore or erase"),
        )),
    }
}

fn unexpected(r: SlotReply) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("unexpected answer {r:?}"),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_names_not_paths() {
        for ok in ["a.bin", "slot 0.state", "x"] {
            assert!(super::valid_filename(ok), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "a/b",
            "/etc/passwd",
            ".hidden",
            "a\\b",
            "c:x",
            "a\nb",
            "x..y",
        ] {
            assert!(!super::valid_filename(bad), "{bad:?}");
        }
        assert!(!super::valid_filename(&"a".repeat(256)));
    }
}
