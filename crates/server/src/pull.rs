//! `POST /api/pull`: a catalog model or an `hf:` name fetched into the store (what `frink
//! pull` does), with Ollama's status lines streamed as the download goes: `pulling
//! manifest`, then `pulling DIGEST` with `total` and `completed` bytes (at most every
//! [`EVERY`]), `verifying sha256 digest`, `writing manifest`, `success`; `{"error"}` when
//! it fails. It does not change the model this server runs. At most [`crate::PULLS`] run
//! at once, one per name; a pull runs to its end even if its client goes (as a `frink
//! pull` would).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use frink_store::PullEvent;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, json_response, ApiError};
use crate::ollama::{error, ndjson};
use crate::Server as AppState;

/// The least time between two `pulling` lines of one download.
const EVERY: Duration = Duration::from_millis(200);

/// What the pulling thread tells the response.
enum Msg {
    Event(PullEvent),
    Done(Result<(), ApiError>),
}

/// The HTTP error of a failed pull: 404 for a name the catalog does not hold, 400 for a
/// malformed `hf:` name, 502 for the hub or the package index failing (or sending a file
/// that does not check out), 500 for the local disk.
fn pull_error(e: frink_store::StoreError) -> ApiError {
    use frink_store::StoreError as E;
    let (status, kind) = match &e {
        E::UnknownModel { .. } => (StatusCode::NOT_FOUND, "not_found"),
        E::BadHubName(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        E::Io { .. } | E::NoHome => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        _ => (StatusCode::BAD_GATEWAY, "upstream_error"),
    };
    ApiError::new(status, kind, e.to_string())
}

/// The request: the model's name (`model`, or the older `name`) and whether to stream.
fn parse(body: &[u8]) -> Result<(String, bool), ApiError> {
    let obj = api::parse_object(body)?;
    let name = api::opt_str(&obj, "model")?
        .or(api::opt_str(&obj, "name")?)
        .ok_or_else(|| ApiError::invalid(None, "'model' is required"))?
        .to_string();
    let stream = api::opt_bool(&obj, "stream")?.unwrap_or(true);
    Ok((name, stream))
}

/// Takes one of the [`crate::PULLS`] places for `name`: 409 when it is already being
/// pulled, 503 when every place is taken.
fn admit(st: &AppState, name: &str) -> Result<(), ApiError> {
    let mut running = st.pulls.lock().unwrap_or_else(|e| e.into_inner());
    if running.contains(name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("{name} is already being pulled"),
        ));
    }
    if running.len() >= crate::PULLS {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            format!("{} pulls are running; retry when one ends", running.len()),
        ));
    }
    running.insert(name.to_string());
    Ok(())
}

/// Runs the pull of `name` on a blocking thread, sending its progress (at most every
/// [`EVERY`], and the last bytes always) and then its end on `tx`.
fn start(st: Arc<AppState>, name: String, tx: mpsc::UnboundedSender<Msg>) {
    /// Gives the pull's place back on every way out, a panic included.
    struct Place(Arc<AppState>, String);
    impl Drop for Place {
        fn drop(&mut self) {
            self.0
                .pulls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.1);
        }
    }
    tokio::task::spawn_blocking(move || {
        let _place = Place(Arc::clone(&st), name.clone());
        let last = Mutex::new(None::<Instant>);
        let progress = |e: PullEvent| {
            if let PullEvent::Downloading { completed, total } = e {
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                let due = last.is_none_or(|t| t.elapsed() >= EVERY) || completed >= total;
                if !due {
                    return;
                }
                *last = Some(Instant::now());
            }
            let _ = tx.send(Msg::Event(e));
        };
        let r = frink_store::Store::from_env()
            .and_then(|store| store.pull_with(&name, &progress))
            .map(drop)
            .map_err(pull_error);
        drop(_place);
        let _ = tx.send(Msg::Done(r));
    });
}

/// The catalog's sha256 of `name` (Ollama's layer digest), `None` for a hub name.
fn digest(name: &str) -> Option<String> {
    frink_store::catalog()
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| format!("sha256:{}", e.sha256))
}

/// Ollama's status line for one message.
fn line(name: &str, digest: Option<&str>, msg: Msg) -> Vec<Value> {
    match msg {
        Msg::Event(PullEvent::Downloading { completed, total }) => {
            let mut v = json!({"total": total, "completed": completed});
            match digest {
                Some(d) => {
                    v["status"] = json!(format!("pulling {}", &d[7..19.min(d.len())]));
                    v["digest"] = json!(d);
                }
                None => v["status"] = json!(format!("pulling {name}")),
            }
            vec![v]
        }
        Msg::Event(PullEvent::Verifying) => vec![json!({"status": "verifying sha256 digest"})],
        Msg::Done(Ok(())) => vec![
            json!({"status": "writing manifest"}),
            json!({"status": "success"}),
        ],
        Msg::Done(Err(e)) => vec![json!({"error": e.message})],
    }
}

/// `POST /api/pull` (module docs).
pub(crate) async fn pull(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let (name, stream) = match parse(&body).and_then(|r| admit(&st, &r.0).map(|()| r)) {
        Ok(x) => x,
        Err(e) => return error(e),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    start(Arc::clone(&st), name.clone(), tx);
    if !stream {
        while let Some(msg) = rx.recv().await {
            if let Msg::Done(r) = msg {
                return match r {
                    Ok(()) => json_response(StatusCode::OK, &json!({"status": "success"})),
                    Err(e) => error(e),
                };
            }
        }
        return error(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the pull ended without an answer",
        ));
    }
    let digest = digest(&name);
    let first = futures_util::stream::iter([json!({"status": "pulling manifest"})]);
    // A pull that ends without its end (a panic on the pulling thread) says so.
    let rest = futures_util::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(msg @ Msg::Done(_)) => Some((msg, None)),
            Some(msg) => Some((msg, Some(rx))),
            None => Some((
                Msg::Done(Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "the pull ended without finishing",
                ))),
                None,
            )),
        }
    });
    use futures_util::StreamExt;
    let lines =
        rest.flat_map(move |msg| futures_util::stream::iter(line(&name, digest.as_deref(), msg)));
    ndjson(first.chain(lines))
}
