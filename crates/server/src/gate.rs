//! The gate every request passes before routing: the API key, then the body, read whole
//! and bounded in size and time, then the mark that its connection is answering a request
//! (held until the answer's body is sent or dropped; [`crate::conn`]).
//!
//! Because the gate runs before routing, an unknown route (404) or method (405) answers
//! only with the key, so routes cannot be listed without it. Every error the gate gives is
//! in the JSON error shape of the API family the path belongs to: Ollama's
//! `{"error": "…"}` under `/api/`, OpenAI's `{"error": {"message", "type", …}}` elsewhere.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::api::{json_response, ApiError};
use crate::conn::{Answering, ConnHandle};
use crate::Server;

/// The largest request body read, in bytes (larger ones are a 413).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// The largest request body a server with a projector file (`--mmproj`) reads: base64
/// images in the body (a 10 MB photo is 13.3 MB of base64).
pub const MAX_BODY_BYTES_IMAGES: usize = 24 << 20;

/// How much of a too-large body is read and dropped before the 413, so that a client still
/// sending it reads the answer instead of a reset connection; a body larger still is cut.
const DRAIN_BYTES: usize = 16 << 20;

/// The longest a too-large body is read on before the 413.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// The API keys a server accepts, kept as SHA-256 digests so that a comparison takes the
/// same time whatever the key given has in common with a right one.
#[derive(Clone, Default)]
pub struct ApiKeys(Vec<[u8; 32]>);

impl ApiKeys {
    /// The keys (empty ones ignored); none: every request is let in.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> ApiKeys {
        ApiKeys(
            keys.iter()
                .map(AsRef::as_ref)
                .filter(|k| !k.is_empty())
                .map(|k| Sha256::digest(k.as_bytes()).into())
                .collect(),
        )
    }

    /// Whether a key is required.
    pub fn required(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether `given` is one of the keys, exactly (no trimming, no case folding); every
    /// key is compared, each in constant time.
    pub fn accepts(&self, given: &[u8]) -> bool {
        let d: [u8; 32] = Sha256::digest(given).into();
        self.0.iter().fold(false, |ok, k| {
            let diff = k.iter().zip(&d).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            ok | (diff == 0)
        })
    }

    /// Checks a request's headers: `Authorization: Bearer KEY` (the scheme in any case, one
    /// space) or Anthropic's `x-api-key: KEY`.
    ///
    /// Errors: a 401 `invalid_api_key` when a key is required and none given is accepted.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if !self.required() {
            return Ok(());
        }
        let bearer = headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .filter_map(|v| {
                let v = v.as_bytes();
                (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| &v[7..])
            });
        let x_api_key = headers.get_all("x-api-key").iter().map(|v| v.as_bytes());
        if bearer.chain(x_api_key).any(|k| self.accepts(k)) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
            )
            .with_code("invalid_api_key"))
        }
    }
}

/// Routes answered without the key: `GET` and `HEAD /health` (a load balancer's probe)
/// and, where the server shows one (`page`), the chat page's files (they hold no secret;
/// the page asks for the key itself).
fn is_open(method: &Method, path: &str, page: bool) -> bool {
    (method == Method::GET || method == Method::HEAD)
        && (path == "/health" || (page && crate::webui::is_page_path(path)))
}

/// `e` in the error shape of the API family `path` belongs to.
pub fn error_for_path(path: &str, e: ApiError) -> Response {
    if path.starts_with("/api/") {
        json_response(e.status, &serde_json::json!({"error": e.message}))
    } else if path.starts_with("/v1/messages") {
        crate::anthropic::error(e)
    } else {
        e.into_response()
    }
}

/// The gate (an axum middleware over the whole router; see the module documentation).
pub(crate) async fn gate(State(st): State<Arc<Server>>, mut req: Request, next: Next) -> Response {
    let counts = crate::log::RequestLog::new(st.log_prompts);
    let line = crate::log::Line {
        format: st.log_format,
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        status: 0,
        client: req
            .extensions()
            .get::<crate::conn::Peer>()
            .and_then(|p| p.0),
        start: std::time::Instant::now(),
        counts: counts.clone(),
    };
    req.extensions_mut().insert(counts);
    let origin = req.headers().get(header::ORIGIN).cloned();
    let cors = st.cors.clone();
    let (mut response, mark) = checked(st, req, next).await;
    cors.decorate(origin.as_ref(), &mut response);
    let line = (line.format != crate::log::LogFormat::Off).then(|| crate::log::Line {
        status: response.status().as_u16(),
        ..line
    });
    if mark.is_none() && line.is_none() {
        return response;
    }
    response.map(|body| {
        Body::new(Held {
            body,
            _mark: mark,
            line,
        })
    })
}

/// The gate's checks and the route (see [`gate`]); with the response, the mark that keeps
/// its connection answering while the body leaves (none for an answer refused here).
async fn checked(st: Arc<Server>, req: Request, next: Next) -> (Response, Option<Answering>) {
    let path = req.uri().path().to_string();
    let (parts, body) = req.into_parts();
    let conn = parts
        .extensions
        .get::<ConnHandle>()
        .map(|h| Arc::clone(&h.0));
    if conn.as_ref().is_some_and(|c| c.is_overflow()) {
        return (overflow(&path, parts, next).await, None);
    }
    if crate::cors::Cors::is_preflight(&parts.method, &parts.headers) {
        let r = st
            .cors
            .preflight(&parts.headers, |e| error_for_path(&path, e));
        return (r, None);
    }
    if !is_open(&parts.method, &path, st.webui != crate::webui::WebUi::Off) {
        if let Err(e) = st.keys.check(&parts.headers) {
            return (error_for_path(&path, e), None);
        }
    }
    if path.starts_with("/api/blobs/") && parts.method != axum::http::Method::HEAD {
        // Ollama's model-file uploads: refused before a byte of the file is read.
        return (error_for_path(&path, blob_upload_refused()), None);
    }
    let bytes = {
        let _receiving = conn.as_ref().map(|c| c.receiving());
        match read_body(
            &parts.headers,
            body,
            st.conns.limits().io_timeout,
            st.max_body,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => return (error_for_path(&path, e), None),
        }
    };
    let answering = conn.as_ref().map(|c| c.answering());
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    (response, answering)
}

/// Why `POST /api/blobs/{digest}` (an `/api/create` with `files`) is refused.
pub(crate) fn blob_upload_refused() -> ApiError {
    ApiError::invalid(
        Some("files"),
        "uploading model files (/api/blobs, /api/create's 'files') is not supported; place the GGUF file in the store's folder ($FRINK_HOME/models) and create from its name",
    )
}

/// A connection admitted past the cap ([`crate::conn::Conn::is_overflow`]): `/health`
/// answers (a liveness probe must not fail because the server is busy), anything else is a
/// 503; the connection closes after either.
async fn overflow(path: &str, parts: axum::http::request::Parts, next: Next) -> Response {
    let mut r = if is_open(&parts.method, path, false) {
        next.run(Request::from_parts(parts, Body::empty())).await
    } else {
        error_for_path(
            path,
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                "every connection this server allows (--max-connections) is answering a \
                 request; retry later",
            )
            .with_code("too_many_connections"),
        )
    };
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// Reads a request body whole: at most `max` bytes ([`MAX_BODY_BYTES`], or
/// [`MAX_BODY_BYTES_IMAGES`] with a projector file), within `limit`.
///
/// Errors: 413 for a larger body (read on and dropped up to [`DRAIN_BYTES`] or for
/// [`DRAIN_TIME`] first), 408 for one not whole in time, 400 for a malformed one (a bad
/// chunk).
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: Duration,
    max: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared == Some(0) {
        return Ok(Bytes::new());
    }
    let now = tokio::time::Instant::now;
    let mut deadline = now() + limit;
    let mut over = declared.is_some_and(|n| n > max as u64);
    if over {
        deadline = deadline.min(now() + DRAIN_TIME);
    }
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(None) => break,
            Err(_) | Ok(Some(Err(_))) if over => break,
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    format!(
                        "the request body did not arrive whole within {} s (--timeout); \
                         {seen} bytes came",
                        limit.as_secs_f64()
                    ),
                )
                .with_code("request_timeout"))
            }
            Ok(Some(Err(e))) => {
                return Err(ApiError::invalid(
                    None,
                    format!("malformed request body: {e}"),
                ))
            }
            Ok(Some(Ok(chunk))) => {
                seen += chunk.len();
                if !over && seen > max {
                    over = true;
                    buf = Vec::new();
                    deadline = deadline.min(now() + DRAIN_TIME);
                }
                if !over {
                    buf.extend_from_slice(&chunk);
                } else if seen > DRAIN_BYTES {
                    break;
                }
            }
        }
    }
    if over {
        let n = declared.map_or_else(|| format!("more than {max}"), |n| n.to_string());
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is {n} bytes; this server reads at most {max}"),
        )
        .with_code("request_too_large"));
    }
    Ok(Bytes::from(buf))
}

/// A response body that keeps its connection marked as answering until it is sent whole or
/// dropped, and writes its request's log line when it ends (or is dropped unfinished: its
/// client went away).
struct Held {
    body: Body,
    _mark: Option<Answering>,
    line: Option<crate::log::Line>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = r {
            if let Some(line) = this.line.take() {
                line.write(false);
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            // A body never polled to its end: the client went away (or the answer had no
            // body, whose end is its drop).
            line.write(!http_body::Body::is_end_stream(&self.body));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly_from_either_header() {
        let keys = ApiKeys::new(&["sekrit", "", "other key"]);
        assert!(keys.required());
        assert!(keys.accepts(b"sekrit") && keys.accepts(b"other key"));
        for bad in [
            &b"sekrit "[..],
            b" sekrit",
            b"SEKRIT",
            b"sekri",
            b"",
            b"sekritt",
        ] {
            assert!(!keys.accepts(bad), "{:?}", String::from_utf8_lossy(bad));
        }
        let with = |name: &'static str, v: &str| {
            let mut h = HeaderMap::new();
            h.insert(name, v.parse().unwrap());
            keys.check(&h).is_ok()
        };
        assert!(with("authorization", "Bearer sekrit"));
        assert!(with("authorization", "bearer sekrit"));
        assert!(with("x-api-key", "other key"));
        assert!(!with("authorization", "Bearer  sekrit"));
        assert!(!with("authorization", "Basic sekrit"));
        assert!(!with("authorization", "sekrit"));
        assert!(!with("x-api-key", "Bearer sekrit"));
        assert!(!ApiKeys::new::<&str>(&[]).required());
        assert!(ApiKeys::new::<&str>(&[]).check(&HeaderMap::new()).is_ok());
    }
}
