//! Cross-origin requests from web pages (the Fetch standard's CORS protocol): the origins
//! `--cors-origin` allows (none by default, `*` any) get `Access-Control-Allow-Origin` on
//! every answer, and their preflights (`OPTIONS` with `Access-Control-Request-Method`) are
//! answered before the key is checked (a browser sends no credentials on a preflight).
//! A preflight from another origin is a 403 that names it; its other requests get no CORS
//! header, so the browser keeps the answer from the page.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;

/// How long a browser may cache a preflight's answer, in seconds.
const MAX_AGE: &str = "600";

/// The methods the API uses.
const METHODS: &str = "GET, POST, DELETE, OPTIONS";

/// The request headers allowed when a preflight does not list its own.
const HEADERS: &str = "authorization, content-type, x-api-key, anthropic-version, anthropic-beta";

/// The origins allowed to call the server from a browser.
#[derive(Clone, Debug, Default)]
pub struct Cors {
    origins: Vec<String>,
    any: bool,
}

/// Checks an origin given to `--cors-origin`: `*`, or `scheme://host[:port]` (no path, as a
/// browser sends `Origin`).
///
/// # Errors
/// Anything else, with the reason.
pub fn check_origin(o: &str) -> Result<(), String> {
    if o == "*" {
        return Ok(());
    }
    let rest = o
        .strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"))
        .ok_or_else(|| format!("--cors-origin {o:?}: an origin is * or http(s)://host[:port]"))?;
    if rest.is_empty() || rest.contains('/') || rest.chars().any(char::is_whitespace) {
        return Err(format!(
            "--cors-origin {o:?}: an origin has no path (e.g. https://app.example.com:8443)"
        ));
    }
    Ok(())
}

impl Cors {
    /// From `--cors-origin` values (each checked by [`check_origin`]; a trailing `/` is
    /// dropped).
    pub fn new<S: AsRef<str>>(origins: &[S]) -> Cors {
        let origins: Vec<String> = origins
            .iter()
            .map(|o| o.as_ref().trim_end_matches('/').to_string())
            .collect();
        Cors {
            any: origins.iter().any(|o| o == "*"),
            origins,
        }
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if allowed.
    fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        if self.any {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin.to_str().ok()?;
        self.origins
            .iter()
            .any(|a| a.eq_ignore_ascii_case(o))
            .then(|| origin.clone())
    }

    /// Whether a request is a preflight.
    pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
        method == Method::OPTIONS
            && headers.contains_key(header::ORIGIN)
            && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    }

    /// The answer to a preflight: 204 with the allowed methods and headers for an allowed
    /// origin, else a 403 naming the origin (`error` gives it the path's error shape).
    pub fn preflight(
        &self,
        headers: &HeaderMap,
        error: impl FnOnce(crate::api::ApiError) -> Response,
    ) -> Response {
        let Some(allow) = self.allow(headers.get(header::ORIGIN)) else {
            let origin = headers
                .get(header::ORIGIN)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            return error(crate::api::ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                format!("origin {origin:?} is not allowed (--cors-origin)"),
            ));
        };
        let asked = headers
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or(HeaderValue::from_static(HEADERS));
        let mut r = Response::new(axum::body::Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE),
        );
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        r
    }

    /// Marks an answer to a request from `origin` readable by the page, if allowed.
    pub fn decorate(&self, origin: Option<&HeaderValue>, r: &mut Response) {
        if let Some(allow) = self.allow(origin) {
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            if !h.get_all(header::VARY).iter().any(|v| v == "Origin") {
                h.append(header::VARY, HeaderValue::from_static("Origin"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_matched_exactly_or_by_star() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        let c = Cors::new(&["https://app.example.com/", "http://localhost:3000"]);
        assert_eq!(
            c.allow(Some(&v("https://app.example.com"))),
            Some(v("https://app.example.com"))
        );
        assert_eq!(
            c.allow(Some(&v("http://localhost:3000"))),
            Some(v("http://localhost:3000"))
        );
        assert_eq!(c.allow(Some(&v("http://localhost:3001"))), None);
        assert_eq!(c.allow(Some(&v("https://evil.example.com"))), None);
        assert_eq!(c.allow(None), None);
        assert_eq!(
            Cors::default().allow(Some(&v("http://localhost:3000"))),
            None
        );
        assert_eq!(Cors::new(&["*"]).allow(Some(&v("null"))), Some(v("*")));
        assert!(check_origin("*").is_ok());
        assert!(check_origin("http://127.0.0.1:8080").is_ok());
        assert!(check_origin("localhost:3000").is_err());
        assert!(check_origin("https://a.example/path").is_err());
    }
}
