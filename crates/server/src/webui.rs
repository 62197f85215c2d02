//! The chat page at `/` (crates/server/webui: plain HTML, CSS and ES modules, no build
//! step), embedded in the binary and served from memory with a strict Content-Security-
//! Policy: everything from this server, nothing from elsewhere (no CDN, no fonts, no
//! inline script). `--no-webui` turns it off; `--webui-path DIR` serves `DIR/index.html`
//! at `/` and `DIR`'s other files under `/webui/` instead.

use std::path::PathBuf;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Which page the server shows at `/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WebUi {
    /// The page built into the binary.
    #[default]
    Embedded,
    /// None: `/` is a 404 as any unknown path (`--no-webui`).
    Off,
    /// The files of a folder (`--webui-path DIR`).
    Dir(PathBuf),
}

/// The page's files: name under `/webui/` (`index.html` is `/`), content type, bytes.
const FILES: [(&str, &str, &[u8]); 6] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../webui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../webui/app.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../webui/markdown.js"),
    ),
    (
        "stream.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../webui/stream.js"),
    ),
    (
        "conversations.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../webui/conversations.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../webui/app.css"),
    ),
];

/// The icon, apart: also answered at `/favicon.ico`, which browsers ask for by themselves.
const ICON: &[u8] = include_bytes!("../webui/icon.svg");

/// The policy every page response carries: scripts, styles, fetches and frames from this
/// server only; images also from `data:` and `blob:` (attached pictures); no plugins, no
/// `<base>`, no framing by other sites.
const CSP: &str =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Whether `path` is one of the page's (answered without an API key: the page holds no
/// secret and asks for the key itself).
pub fn is_page_path(path: &str) -> bool {
    path == "/" || path == "/favicon.ico" || path.starts_with("/webui/")
}

/// The content type of a file named `name` (by its extension).
fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" => "application/json",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

fn file_response(ty: &str, body: axum::body::Bytes) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(ty).expect("a header value"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The most bytes of a `--webui-path` file served: each request holds its file whole, and
/// the page's files answer without an API key.
const MAX_FILE: u64 = 4 << 20;

/// The file `name` of a `--webui-path` folder: a plain name (letters, digits, `.`, `-`,
/// `_`; no path, not starting with a dot) of a regular file inside it, at most
/// [`MAX_FILE`].
fn from_dir(dir: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !plain {
        return None;
    }
    let path = dir.join(name);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return None;
    }
    std::fs::read(path).ok()
}

/// The response to `GET path` for the page `ui`, or `None` (the caller's 404) for a path
/// that is none of its files.
pub fn serve(ui: &WebUi, path: &str) -> Option<Response> {
    let name = match path {
        "/" => "index.html",
        "/favicon.ico" => "icon.svg",
        p => p.strip_prefix("/webui/")?,
    };
    match ui {
        WebUi::Off => None,
        WebUi::Embedded if name == "icon.svg" => Some(file_response(
            "image/svg+xml",
            axum::body::Bytes::from_static(ICON),
        )),
        WebUi::Embedded => FILES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, ty, body)| file_response(ty, axum::body::Bytes::from_static(body))),
        WebUi::Dir(dir) => from_dir(dir, name).map(|b| file_response(content_type(name), b.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file the page names is served, and the page names nothing outside this server.
    #[test]
    fn the_page_is_whole_and_names_no_other_site() {
        for (name, _, body) in FILES {
            let text = std::str::from_utf8(body).unwrap();
            for (i, _) in text.match_indices("/webui/") {
                let rest = &text[i + 7..];
                let file: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
                    .collect();
                assert!(
                    serve(&WebUi::Embedded, &format!("/webui/{file}")).is_some(),
                    "{name} names /webui/{file}, which is not served"
                );
            }
            for outside in ["http://", "https://", "//cdn", "@import", "url("] {
                assert!(!text.contains(outside), "{name} names {outside}");
            }
        }
        assert!(serve(&WebUi::Embedded, "/").is_some());
        assert!(serve(&WebUi::Embedded, "/favicon.ico").is_some());
        assert!(serve(&WebUi::Off, "/").is_none());
        assert!(serve(&WebUi::Embedded, "/webui/nothing.js").is_none());
    }

    /// A folder's files by plain name only: no parent directories, hidden files or links.
    #[test]
    fn a_folder_serves_plain_names_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "<p>mine</p>").unwrap();
        std::fs::write(dir.path().join(".secret"), "no").unwrap();
        let ui = WebUi::Dir(dir.path().to_path_buf());
        assert!(serve(&ui, "/").is_some());
        for bad in [
            "/webui/../Cargo.toml",
            "/webui/.secret",
            "/webui/a/b",
            "/webui/",
            "/webui/%2e%2e",
        ] {
            assert!(serve(&ui, bad).is_none(), "{bad}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link.txt")).unwrap();
            assert!(serve(&ui, "/webui/link.txt").is_none());
        }
    }
}
