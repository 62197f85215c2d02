//! A small HTTP/1.1 client over std's TcpStream for the server's tests (real sockets,
//! loopback only, one connection per request): whole answers, server-sent event streams,
//! `/metrics` values.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

/// An HTTP client of the server on a loopback port (one connection per request).
#[derive(Clone, Copy, Debug)]
pub struct Client {
    /// The port the server listens on.
    pub port: u16,
}

impl Client {
    /// A client of the server on `port`.
    pub fn new(port: u16) -> Client {
        Client { port }
    }

    /// A completion, streamed or not as `body` says: its text and finish reason.
    pub fn complete(&self, path: &str, body: &Value) -> (String, Option<String>) {
        if body["stream"] == Value::Bool(true) {
            let s = self.stream(path, body);
            assert_eq!(s.status, 200);
            let (chunks, done) = s.collect();
            assert!(done, "the stream ended with [DONE]");
            stream_text(&chunks)
        } else {
            let v = self.post_ok(path, body);
            let c = &v["choices"][0];
            let text = c["message"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .unwrap_or_default()
                .to_string();
            (text, c["finish_reason"].as_str().map(str::to_string))
        }
    }

    /// `METHOD PATH` with a JSON body (or none), answered in full.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        self.request_with(method, path, body, &[])
    }

    /// As [`Client::request`] with extra headers.
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Response {
        let mut s = self.send(method, path, body.map(str::as_bytes), headers);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read response");
        Response::parse(&raw)
    }

    /// POSTs raw bytes as the body.
    pub fn post_raw(&self, path: &str, body: &[u8]) -> Response {
        let mut s = self.send("POST", path, Some(body), &[]);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read response");
        Response::parse(&raw)
    }

    /// POSTs `body` as JSON and returns the parsed JSON answer, asserting 200.
    pub fn post_ok(&self, path: &str, body: &Value) -> Value {
        let r = self.request("POST", path, Some(&body.to_string()));
        assert_eq!(r.status, 200, "{path} {body}: {}", r.text());
        r.json()
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
    ) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let body = body.unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s
    }

    /// Opens a streamed completion (`body` must say `"stream": true`): the status, and the
    /// SSE events as they come.
    pub fn stream(&self, path: &str, body: &Value) -> Stream {
        let s = self.send("POST", path, Some(body.to_string().as_bytes()), &[]);
        let mut r = BufReader::new(s);
        let mut status = 0;
        let mut chunked = false;
        let mut line = String::new();
        loop {
            line.clear();
            r.read_line(&mut line).expect("read head");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if l.starts_with("HTTP/1.1 ") {
                status = l[9..12].parse().unwrap();
            }
            if l.eq_ignore_ascii_case("transfer-encoding: chunked") {
                chunked = true;
            }
        }
        assert!(chunked, "a streamed answer is chunked");
        Stream {
            status,
            body: BufReader::new(Chunked {
                inner: r,
                left: 0,
                done: false,
            }),
        }
    }

    /// The prompt tokens of a one-token greedy answer to a chat of "hi" with `extra`'s
    /// fields added: how long the template renders for them.
    pub fn chat_prompt_tokens(&self, extra: &Value) -> u64 {
        let mut e = serde_json::json!({"temperature": 0, "max_tokens": 1});
        for (k, v) in extra.as_object().expect("extra fields as an object") {
            e[k] = v.clone();
        }
        self.post_ok("/v1/chat/completions", &chat("hi", e))["usage"]["prompt_tokens"]
            .as_u64()
            .expect("usage.prompt_tokens")
    }

    /// `/metrics` value of `name` (a gauge or counter; summed over its label sets).
    pub fn metric(&self, name: &str) -> f64 {
        self.metric_with(name, &[])
    }

    /// [`Client::metric`] with extra headers (an API key).
    pub fn metric_with(&self, name: &str, headers: &[(&str, &str)]) -> f64 {
        let r = self.request_with("GET", "/metrics", None, headers);
        assert_eq!(r.status, 200);
        let text = r.text();
        // A model's series carry its `model_name` label: summed over the models.
        text.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                let v = match rest.strip_prefix(' ') {
                    Some(v) => v,
                    None if rest.starts_with('{') => rest.rsplit_once(' ')?.1,
                    None => return None,
                };
                Some(v.trim().parse::<f64>().unwrap())
            })
            .reduce(|a, b| a + b)
            .unwrap_or_else(|| panic!("no {name} in /metrics: {text}"))
    }
}

/// A whole HTTP response.
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header lines, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl Response {
    /// Parses a raw HTTP/1.1 response (a chunked body is de-chunked).
    pub fn parse(raw: &[u8]) -> Response {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("end of the head");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.lines();
        let status = lines.next().unwrap()[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        if headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v == "chunked")
        {
            let mut out = Vec::new();
            Chunked {
                inner: BufReader::new(&body[..]),
                left: 0,
                done: false,
            }
            .read_to_end(&mut out)
            .unwrap();
            body = out;
        }
        Response {
            status,
            headers,
            body,
        }
    }

    /// The value of header `name` (lowercase), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// A chunked transfer-encoded body, decoded.
struct Chunked<R: BufRead> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                self.done = true;
                return Ok(0);
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let want = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
            return Ok(0);
        }
        self.left -= n;
        if self.left == 0 {
            let mut crlf = String::new();
            self.inner.read_line(&mut crlf)?;
        }
        Ok(n)
    }
}

/// An open server-sent-event stream.
pub struct Stream {
    /// HTTP status.
    pub status: u16,
    body: BufReader<Chunked<BufReader<TcpStream>>>,
}

impl Stream {
    /// The next `data:` payload (`None` at the end of the body).
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(d) = self.next_line()?.strip_prefix("data: ") {
                return Some(d.to_string());
            }
        }
    }

    /// The next line of an NDJSON body (Ollama's streams), `None` at the end of the body.
    pub fn next_line(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.body.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if !line.trim().is_empty() {
                return Some(line.trim_end().to_string());
            }
        }
    }

    /// Reads the rest: the JSON chunks before `[DONE]`, and whether `[DONE]` came last.
    pub fn collect(mut self) -> (Vec<Value>, bool) {
        let mut chunks = Vec::new();
        while let Some(d) = self.next_data() {
            if d == "[DONE]" {
                return (chunks, self.next_data().is_none());
            }
            chunks.push(serde_json::from_str(&d).expect("a JSON chunk"));
        }
        (chunks, false)
    }
}

/// Text of a chat or completion stream's chunks, and the finish reason of the last choice.
pub fn stream_text(chunks: &[Value]) -> (String, Option<String>) {
    let mut text = String::new();
    let mut finish = None;
    for c in chunks {
        for ch in c["choices"].as_array().into_iter().flatten() {
            if let Some(t) = ch["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = ch["text"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (text, finish)
}

/// A chat request of one user message with `extra`'s fields added.
pub fn chat(content: &str, extra: Value) -> Value {
    let mut v =
        serde_json::json!({"model": "x", "messages": [{"role": "user", "content": content}]});
    for (k, val) in extra.as_object().expect("extra fields as an object") {
        v[k] = val.clone();
    }
    v
}

/// A chat answer's message text.
pub fn message(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no message in {v}"))
        .to_string()
}

/// Asserts an OpenAI-shaped error answer of `status`: `{"error": {"message", "type", …}}`
/// as JSON; returns its message.
pub fn assert_openai_error(r: &Response, status: u16) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "{}",
        r.text()
    );
    let v = r.json();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not the error shape: {v}"));
    assert!(v["error"]["type"].is_string(), "{v}");
    msg.to_string()
}

/// `/health`'s time to answer on a fresh connection.
pub fn health_time(port: u16) -> Duration {
    let t0 = Instant::now();
    let r = Client::new(port).request("GET", "/health", None);
    assert_eq!(r.status, 200, "{}", r.text());
    t0.elapsed()
}
