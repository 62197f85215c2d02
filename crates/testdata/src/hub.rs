//! A stand-in for the Hugging Face hub on a loopback port, with the hub's URL layout,
//! for tests of the store's `hf:` downloads (the real hub is unreachable from CI):
//!
//! - `GET /api/models/ORG/REPO/tree/main?recursive=true`: the tree API's JSON (`type`,
//!   `path`, `size`, `lfs.oid` = sha256);
//! - `GET /ORG/REPO/resolve/main/PATH`: `302` to a CDN-style URL on another host name
//!   (`localhost` instead of `127.0.0.1`), as the hub redirects large files;
//! - `GET /cdn/ORG/REPO/PATH?sig=…`: the bytes, honouring `Range: bytes=N-` with `206`.
//!
//! A repository may require `Authorization: Bearer TOKEN` (401 otherwise), publish a wrong
//! sha256, or cut the first download of each file halfway (the connection closes early).
//! A listing may name paths that leave the repository (`../x.gguf`, `/tmp/x.gguf`), as a
//! hostile or mirrored hub could; the stand-in then serves them where a client's URL
//! library sends the request. Every request is recorded (path, `Range`, whether `Authorization` came with it).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One repository of the stand-in.
#[derive(Clone, Debug, Default)]
pub struct Repo {
    /// `path → bytes`.
    pub files: Vec<(String, Vec<u8>)>,
    /// Requests need this bearer token.
    pub token: Option<String>,
    /// Publish this sha256 for every file instead of the true one.
    pub wrong_sha256: bool,
    /// Close the connection halfway through the first download of each file.
    pub cut_first_download: bool,
    /// List each file at half its size (then send it whole), as a hostile hub could.
    pub understate_size: bool,
    /// Answer the listing only after this many seconds (a hub that stalls).
    pub stall_listing_secs: u64,
    /// Send each file in [`TRICKLE_PIECES`] pieces [`TRICKLE_GAP`] apart (a slow download).
    pub trickle: bool,
}

/// How many pieces a trickled file is sent in.
pub const TRICKLE_PIECES: usize = 10;
/// The pause between two pieces of a trickled file.
pub const TRICKLE_GAP: std::time::Duration = std::time::Duration::from_millis(150);

/// A request the stand-in saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The request path (with query).
    pub path: String,
    /// Its `Range` header.
    pub range: Option<String>,
    /// Whether it carried `Authorization`.
    pub authorized: bool,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Repo>,
    seen: Vec<Seen>,
    served: HashMap<String, usize>,
}

/// The running stand-in (serves until the process ends).
pub struct HubStandIn {
    /// Its address, `http://127.0.0.1:PORT` (what `HF_ENDPOINT` is set to).
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(b))
}

impl HubStandIn {
    /// Starts a stand-in serving `repos` (`ORG/REPO → Repo`).
    pub fn start(repos: Vec<(&str, Repo)>) -> HubStandIn {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            repos: repos.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..State::default()
        }));
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let st = Arc::clone(&st);
                std::thread::spawn(move || {
                    let _ = serve(conn, &st, port);
                });
            }
        });
        HubStandIn {
            endpoint: format!("http://127.0.0.1:{port}"),
            state,
        }
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

/// A URL path with its `.` and `..` segments resolved, as URL parsers resolve them
/// (RFC 3986, 5.2.4).
fn resolve_dots(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/').skip(1) {
        match seg {
            "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

fn respond(
    conn: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)
}

fn serve(mut conn: TcpStream, st: &Mutex<State>, port: u16) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut range = None;
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut s = st.lock().unwrap();
    s.seen.push(Seen {
        path: path.clone(),
        range: range.clone(),
        authorized: auth.is_some(),
    });
    // A hostile listing (`../../x.gguf`): the client's URL library resolves the dot
    // segments, so the request arrives elsewhere; a hostile hub serves the file there.
    let plain = path.split('?').next().unwrap_or("");
    let hostile = s.repos.iter().find_map(|(name, repo)| {
        repo.files.iter().find_map(|(p, b)| {
            let url = format!("/{name}/resolve/main/{p}");
            (url != plain && resolve_dots(&url) == plain).then(|| b.clone())
        })
    });
    if let Some(bytes) = hostile {
        drop(s);
        return respond(&mut conn, "200 OK", &[], &bytes);
    }
    let (route, rest) = if let Some(r) = path.strip_prefix("/api/models/") {
        ("tree", r.split('?').next().unwrap_or(""))
    } else if let Some(r) = path.strip_prefix("/cdn/") {
        ("cdn", r.split('?').next().unwrap_or(""))
    } else {
        ("resolve", path.trim_start_matches('/'))
    };
    let mut parts = rest.splitn(3, '/');
    let repo_name = format!(
        "{}/{}",
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("")
    );
    let tail = parts.next().unwrap_or("").to_string();
    let Some(repo) = s.repos.get(&repo_name).cloned() else {
        drop(s);
        return respond(
            &mut conn,
            "404 Not Found",
            &[],
            b"{\"error\":\"Repository not found\"}",
        );
    };
    // The CDN's signed URLs carry no token; the hub's own routes check it.
    if route != "cdn" {
        if let Some(t) = &repo.token {
            if auth.as_deref() != Some(&format!("Bearer {t}")) {
                drop(s);
                return respond(
                    &mut conn,
                    "401 Unauthorized",
                    &[],
                    b"{\"error\":\"Invalid credentials\"}",
                );
            }
        }
    }
    match route {
        "tree" if repo.stall_listing_secs > 0 => {
            drop(s);
            std::thread::sleep(std::time::Duration::from_secs(repo.stall_listing_secs));
            respond(&mut conn, "503 Service Unavailable", &[], b"stalled")
        }
        "tree" => {
            let entries: Vec<serde_json::Value> = repo
                .files
                .iter()
                .map(|(p, b)| {
                    let sha = if repo.wrong_sha256 {
                        "0".repeat(64)
                    } else {
                        sha256_hex(b)
                    };
                    let size = if repo.understate_size {
                        b.len() / 2
                    } else {
                        b.len()
                    };
                    serde_json::json!({"type": "file", "path": p, "size": size, "oid": "git-sha1",
                                       "lfs": {"oid": sha, "size": size, "pointerSize": 134}})
                })
                .collect();
            drop(s);
            let body = serde_json::Value::Array(entries).to_string();
            respond(
                &mut conn,
                "200 OK",
                &[("Content-Type", "application/json".into())],
                body.as_bytes(),
            )
        }
        "resolve" => {
            let file = tail.strip_prefix("resolve/main/").unwrap_or("");
            if !repo.files.iter().any(|(p, _)| p == file) {
                drop(s);
                return respond(&mut conn, "404 Not Found", &[], b"Entry not found");
            }
            drop(s);
            let location = format!("http://localhost:{port}/cdn/{repo_name}/{file}?sig=signed");
            respond(&mut conn, "302 Found", &[("Location", location)], b"")
        }
        _ => {
            let Some((_, bytes)) = repo.files.iter().find(|(p, _)| *p == tail) else {
                drop(s);
                return respond(&mut conn, "404 Not Found", &[], b"");
            };
            let key = format!("{repo_name}/{tail}");
            let n = s.served.entry(key).or_insert(0);
            *n += 1;
            let first = *n == 1;
            drop(s);
            let from: usize = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|r| r.parse().ok())
                .unwrap_or(0)
                .min(bytes.len());
            let body = &bytes[from..];
            let status = if from > 0 {
                "206 Partial Content"
            } else {
                "200 OK"
            };
            let mut headers = vec![("Content-Type", "application/octet-stream".to_string())];
            if from > 0 {
                headers.push((
                    "Content-Range",
                    format!("bytes {from}-{}/{}", bytes.len() - 1, bytes.len()),
                ));
            }
            if repo.cut_first_download && first {
                // Promise the whole body, send half, close.
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                conn.write_all(head.as_bytes())?;
                conn.write_all(&body[..body.len() / 2])?;
                conn.flush()?;
                return conn.shutdown(std::net::Shutdown::Both);
            }
            if repo.trickle {
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                conn.write_all(head.as_bytes())?;
                for piece in body.chunks(body.len().div_ceil(TRICKLE_PIECES).max(1)) {
                    conn.write_all(piece)?;
                    conn.flush()?;
                    std::thread::sleep(TRICKLE_GAP);
                }
                return conn.shutdown(std::net::Shutdown::Both);
            }
            respond(&mut conn, status, &headers, body)
        }
    }
}
