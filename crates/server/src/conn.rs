//! Connections: the accept loop, and the limits a production HTTP server puts on them.
//!
//! Each accepted TCP connection is served by hyper's HTTP/1.1 machinery in a task of its
//! own. What bounds them (defaults in [`ConnLimits::default`], flags in `frink serve`):
//!
//! - **A cap on open connections** (`--max-connections`). At the cap, the connection idle
//!   longest is closed to admit the new one (idle: no request being answered; one still
//!   sending its headers or its body counts as idle; one whose answer is still leaving
//!   does not), so a crowd of idle or slow connections cannot keep `/health` or a real
//!   client out. When every open connection is answering a request, a few more are
//!   admitted for `/health` alone (anything else gets a 503 in the JSON error shape and
//!   the connection closes), and beyond those a new connection gets that 503 at once.
//! - **A header-read timeout** (`--header-timeout`): a connection whose request head is not
//!   whole that long after its first byte is closed (headers sent a byte at a time).
//! - **An idle timeout** (`--idle-timeout`): a connection answering nothing, and neither
//!   reading nor writing a byte for that long, is closed (keep-alive connections between
//!   requests, connections that never send anything).
//! - **A body and send timeout** (`--timeout`): a request body must arrive whole within it
//!   (else a 408, by [`crate::gate`]), and a connection whose writes have been blocked that
//!   long (a client that stopped reading its answer) is closed.
//!
//! After SIGTERM the listener is dropped at once, so the OS refuses new connections;
//! connections answering a request finish it (hyper's graceful shutdown), idle ones close.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// The limits on connections (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once (`--max-connections`).
    pub max_connections: usize,
    /// Time for a request's head to arrive whole (`--header-timeout`).
    pub header_timeout: Duration,
    /// Time a connection may answer nothing and move no byte (`--idle-timeout`).
    pub idle_timeout: Duration,
    /// Time for a request body to arrive whole, and for a blocked write to move again
    /// (`--timeout`).
    pub io_timeout: Duration,
}

impl Default for ConnLimits {
    /// 1,024 connections, 10 s for a request head, 30 s idle, 600 s for a body or a
    /// blocked write (llama-server's `--timeout` default).
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(600),
        }
    }
}

/// Connections admitted past the cap for `/health` when every other one is answering a
/// request ([`Conn::is_overflow`]).
pub const OVERFLOW: usize = 16;

/// One open connection, as the table and its request handlers see it.
pub struct Conn {
    id: u64,
    /// The table's clock.
    epoch: Instant,
    /// Milliseconds (on the table's clock) of the last byte read or written.
    last_io: AtomicU64,
    /// Requests being answered (their body read, their answer not yet sent whole).
    answering: AtomicUsize,
    /// A request body is being read (the body timeout, not the idle one, governs it).
    receiving: AtomicBool,
    /// Milliseconds + 1 at which the first byte of a request head arrived (set by a read
    /// on a connection with no request in hand, cleared when hyper hands the request
    /// over, its head whole); 0: no head arriving. The header timeout counts from it.
    head_started: AtomicU64,
    /// Milliseconds + 1 at which a write first found the socket full; 0: not blocked.
    write_blocked: AtomicU64,
    /// Closes the connection.
    kill: Notify,
    /// Admitted past the cap, every other connection answering a request: it may only
    /// ask for `/health` ([`Conn::is_overflow`]).
    overflow: bool,
}

impl Conn {
    /// Whether this connection was admitted past `--max-connections` (every other one was
    /// answering a request): the gate answers it `/health` only, and closes it.
    pub fn is_overflow(&self) -> bool {
        self.overflow
    }

    /// Whether the connection is answering a request: one being handled, or an answer whose
    /// bytes are still leaving (a write the socket has not taken). Neither the idle timeout
    /// nor an eviction closes it then; only the send timeout does.
    fn busy(&self) -> bool {
        self.answering.load(Ordering::SeqCst) > 0 || self.write_blocked.load(Ordering::Relaxed) != 0
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.last_io.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Marks a request as being answered until the guard drops (with the answer's body).
    pub fn answering(self: &Arc<Self>) -> Answering {
        self.answering.fetch_add(1, Ordering::SeqCst);
        Answering(Arc::clone(self))
    }

    /// Records that a request's head is whole (hyper handed the request over): the header
    /// timeout no longer applies to it.
    fn head_whole(&self) {
        self.head_started.store(0, Ordering::SeqCst);
    }

    /// Marks a request body as arriving until the guard drops.
    pub fn receiving(self: &Arc<Self>) -> Receiving {
        self.receiving.store(true, Ordering::SeqCst);
        Receiving(Arc::clone(self))
    }

    /// Records bytes read: on a connection with no request in hand they begin a request
    /// head, and the header timeout starts.
    fn read_some(&self) {
        self.touch();
        if !self.busy() && !self.receiving.load(Ordering::SeqCst) {
            let now = self.now_ms() + 1;
            let _ = self
                .head_started
                .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// Records the outcome of a write: progress clears the blocked mark, a full socket
    /// sets it (once).
    fn wrote(&self, r: &Poll<std::io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.touch();
                self.write_blocked.store(0, Ordering::Relaxed);
            }
            Poll::Pending => {
                let now = self.now_ms() + 1;
                let _ = self.write_blocked.compare_exchange(
                    0,
                    now,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            _ => {}
        }
    }
}

/// A request being answered on a connection ([`Conn::answering`]).
pub struct Answering(Arc<Conn>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.touch();
        self.0.answering.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request body arriving on a connection ([`Conn::receiving`]).
pub struct Receiving(Arc<Conn>);

impl Drop for Receiving {
    fn drop(&mut self) {
        self.0.receiving.store(false, Ordering::SeqCst);
    }
}

/// The connection a request came on, in the request's extensions.
#[derive(Clone)]
pub struct ConnHandle(pub Arc<Conn>);

/// The client's address of a request's connection (a request extension; the request log
/// names it).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub Option<std::net::SocketAddr>);

/// The open connections.
pub struct ConnTable {
    limits: ConnLimits,
    epoch: Instant,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// Connections closed to admit newer ones at the cap.
    pub evicted: AtomicU64,
    /// Connections closed by the idle or send timeout.
    pub timed_out: AtomicU64,
    /// Connections refused with a 503 at the cap, every open one answering a request.
    pub refused: AtomicU64,
}

impl ConnTable {
    /// An empty table with these limits.
    pub fn new(limits: ConnLimits) -> ConnTable {
        ConnTable {
            limits,
            epoch: Instant::now(),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            evicted: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The limits the table keeps.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    /// Connections open now.
    pub fn open_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Registers a new connection; at the cap, first closes the one idle longest. When
    /// every connection is answering a request, the new one is admitted past the cap for
    /// `/health` alone (a liveness probe must not fail because the server is busy), up to
    /// [`OVERFLOW`] such; `None` beyond.
    fn admit(&self) -> Option<Arc<Conn>> {
        let mut open = self.lock();
        let mut overflow = false;
        let regular = open.values().filter(|c| !c.overflow).count();
        if regular >= self.limits.max_connections {
            let victim = open
                .values()
                .filter(|c| !c.overflow && !c.busy())
                .min_by_key(|c| c.last_io.load(Ordering::Relaxed))
                .map(|c| c.id);
            match victim {
                Some(v) => {
                    if let Some(c) = open.remove(&v) {
                        c.kill.notify_one();
                        self.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None if open.len() - regular < OVERFLOW => overflow = true,
                None => return None,
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            epoch: self.epoch,
            last_io: AtomicU64::new(self.now_ms()),
            answering: AtomicUsize::new(0),
            receiving: AtomicBool::new(false),
            head_started: AtomicU64::new(0),
            write_blocked: AtomicU64::new(0),
            kill: Notify::new(),
            overflow,
        });
        open.insert(id, Arc::clone(&conn));
        Some(conn)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes the connections past the header, idle or send timeout.
    fn reap(&self) {
        let now = self.now_ms();
        let header = self.limits.header_timeout.as_millis() as u64;
        let idle = self.limits.idle_timeout.as_millis() as u64;
        let send = self.limits.io_timeout.as_millis() as u64;
        let since = |at: u64| (at != 0).then(|| now.saturating_sub(at - 1));
        let mut open = self.lock();
        open.retain(|_, c| {
            let quiet = now.saturating_sub(c.last_io.load(Ordering::Relaxed));
            let waiting = !c.busy() && !c.receiving.load(Ordering::SeqCst);
            let head = since(c.head_started.load(Ordering::SeqCst));
            let expired = (waiting && head.is_some_and(|t| t >= header))
                || (waiting && head.is_none() && quiet >= idle)
                || since(c.write_blocked.load(Ordering::Relaxed)).is_some_and(|t| t >= send);
            if expired {
                c.kill.notify_one();
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            !expired
        });
    }
}

/// A TCP stream that records its progress on its [`Conn`].
struct Tracked {
    inner: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.conn.read_some();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.conn.wrote(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.conn.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What the accept loop serves each request with: the gated router, cloned per
/// connection.
pub trait HttpService:
    tower_service::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static
{
}

impl<S> HttpService for S where
    S: tower_service::Service<Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static
{
}

/// Accepts connections on `listener` and serves each with `service` until `stop` turns
/// true; then drops the listener at once and returns (the connections finish on their
/// own tasks). An accept error (out of file descriptors) is logged and retried after a
/// short pause, never fatal.
pub async fn accept_loop<S: HttpService>(
    listener: TcpListener,
    service: S,
    table: Arc<ConnTable>,
    mut stop: watch::Receiver<bool>,
) where
    S::Future: Send + 'static,
{
    let reaper = {
        let table = Arc::clone(&table);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                table.reap();
            }
        })
    };
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match table.admit() {
            Some(conn) => {
                tokio::spawn(serve_connection(
                    stream,
                    conn,
                    service.clone(),
                    Arc::clone(&table),
                    stop.clone(),
                ));
            }
            None => {
                table.refused.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(refuse(stream));
            }
        }
    }
    drop(listener);
    // The reaper keeps closing idle connections while the others finish.
    tokio::spawn(async move {
        while table.open_count() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        reaper.abort();
    });
}

/// Serves one connection until it ends, is killed (idle, evicted) or, after `stop`, has
/// finished the request it was answering.
async fn serve_connection<S: HttpService>(
    stream: TcpStream,
    conn: Arc<Conn>,
    service: S,
    table: Arc<ConnTable>,
    mut stop: watch::Receiver<bool>,
) where
    S::Future: Send + 'static,
{
    let peer = Peer(stream.peer_addr().ok());
    let io = TokioIo::new(Tracked {
        inner: stream,
        conn: Arc::clone(&conn),
    });
    let handle = ConnHandle(Arc::clone(&conn));
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        // hyper hands a request over once its head is whole.
        handle.0.head_whole();
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(handle.clone());
        req.extensions_mut().insert(peer);
        let mut service = service.clone();
        tower_service::Service::call(&mut service, req)
    });
    // The header timeout is the reaper's (it counts from a head's first byte: hyper's
    // counts from the start of the wait, which would close idle keep-alive connections
    // after the header timeout rather than the idle one).
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    let served = builder.serve_connection(io, svc);
    tokio::pin!(served);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = served.as_mut() => break,
            () = conn.kill.notified() => break,
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
    table.remove(conn.id);
}

/// Answers a connection the table cannot admit: a 503 in the JSON error shape, then close
/// (at most a second spent on it).
async fn refuse(mut stream: TcpStream) {
    let body = crate::api::ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "server_overloaded",
        "every connection this server allows (--max-connections) is answering a request; \
         retry later",
    )
    .with_code("too_many_connections")
    .body()
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// The open-file limit raised to its hard maximum (as Go's runtime and nginx do), and
/// `want` connections checked against it: the soft limit less `reserve` descriptors for
/// the model file, logs and the engine must hold them.
///
/// Errors: `want` connections do not fit under the limit (a message naming both).
pub fn fit_open_files(want: usize, reserve: usize) -> Result<(), String> {
    let Ok(limit) = rlimit::increase_nofile_limit(u64::MAX) else {
        return Ok(());
    };
    let room = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserve);
    if want > room {
        return Err(format!(
            "--max-connections {want} does not fit the open-file limit of {limit} \
             (ulimit -n; {reserve} kept for the model and the server): at most {room}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn limits(max: usize) -> ConnLimits {
        ConnLimits {
            max_connections: max,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_millis(500),
        }
    }

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room() {
        let table = ConnTable::new(limits(3));
        let a = table.admit().unwrap();
        let b = table.admit().unwrap();
        let c = table.admit().unwrap();
        // `a` answers a request; `b` moved a byte after `c`: `c` is the longest idle.
        let _answering = a.answering();
        c.last_io.store(0, Ordering::Relaxed);
        b.last_io.store(10, Ordering::Relaxed);
        a.last_io.store(0, Ordering::Relaxed);
        let d = table.admit().unwrap();
        assert_eq!(table.open_count(), 3);
        let open = table.lock();
        assert!(open.contains_key(&a.id) && open.contains_key(&b.id) && open.contains_key(&d.id));
        assert!(!open.contains_key(&c.id));
        drop(open);
        assert_eq!(table.evicted.load(Ordering::Relaxed), 1);
        // Every connection answering: a few more come in for /health only, then none.
        let _all = [b.answering(), d.answering()];
        for _ in 0..OVERFLOW {
            assert!(table.admit().is_some_and(|c| c.is_overflow()));
        }
        assert!(table.admit().is_none());
        assert_eq!(table.open_count(), 3 + OVERFLOW);
        // A connection whose answer is still leaving (a blocked write) is not idle either.
        let table = ConnTable::new(limits(1));
        let e = table.admit().unwrap();
        e.write_blocked.store(1, Ordering::Relaxed);
        assert!(table.admit().is_some_and(|c| c.is_overflow()));
        table.reap();
        assert!(table.lock().contains_key(&e.id));
    }

    #[test]
    fn an_answer_still_leaving_outlives_the_idle_timeout() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            // One large answer, handed to hyper whole (as a JSON body is): more than the
            // socket buffers hold, so its writes block while the client waits.
            const SIZE: usize = 64 << 20;
            let app =
                axum::Router::new().route("/", axum::routing::get(|| async { vec![b'x'; SIZE] }));
            let mut l = limits(8);
            l.idle_timeout = Duration::from_millis(300);
            l.io_timeout = Duration::from_secs(20);
            let table = Arc::new(ConnTable::new(l));
            let (_stop_tx, stop_rx) = watch::channel(false);
            tokio::spawn(accept_loop(listener, app, Arc::clone(&table), stop_rx));
            let got = tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .unwrap();
                // Far past the idle timeout before the first read.
                std::thread::sleep(Duration::from_millis(1500));
                let mut all = Vec::new();
                let _ = s.read_to_end(&mut all);
                all.len()
            })
            .await
            .unwrap();
            assert!(got > SIZE, "{got} bytes of an answer of {SIZE}");
            assert_eq!(table.timed_out.load(Ordering::Relaxed), 0);
        });
    }

    /// The header timeout counts from a head's first byte, not from the wait before it: a
    /// keep-alive connection idle between requests lives for the idle timeout (a user
    /// found idle connections closed at the header timeout's 10 s, not the idle 30 s).
    #[test]
    fn keep_alive_lives_for_the_idle_timeout_and_slow_heads_die_at_the_header_timeout() {
        use std::io::Read;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
            let mut l = limits(8);
            l.header_timeout = Duration::from_millis(300);
            l.idle_timeout = Duration::from_millis(1500);
            let table = Arc::new(ConnTable::new(l));
            let (_stop_tx, stop_rx) = watch::channel(false);
            tokio::spawn(accept_loop(listener, app, Arc::clone(&table), stop_rx));
            let (second, slow_cut) = tokio::task::spawn_blocking(move || {
                let ask = |s: &mut std::net::TcpStream| -> bool {
                    if s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
                        return false;
                    }
                    let mut b = [0u8; 512];
                    s.read(&mut b)
                        .is_ok_and(|n| n > 0 && b[..n].ends_with(b"ok"))
                };
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                assert!(ask(&mut s));
                // Past the header timeout, inside the idle one: still served.
                std::thread::sleep(Duration::from_millis(800));
                let second = ask(&mut s);
                // A head that never ends: cut at the header timeout.
                let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                slow.write_all(b"GET / HTTP/1.1\r\n").unwrap();
                let t0 = Instant::now();
                let mut b = [0u8; 64];
                let _ = slow.read(&mut b);
                (second, t0.elapsed())
            })
            .await
            .unwrap();
            assert!(
                second,
                "a keep-alive connection was closed at the header timeout"
            );
            assert!(slow_cut < Duration::from_millis(1200), "{slow_cut:?}");
        });
    }

    #[test]
    fn a_client_that_stops_reading_is_cut_after_the_send_timeout() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            // An answer that never ends.
            let app = axum::Router::new().route(
                "/",
                axum::routing::get(|| async {
                    let chunk = axum::body::Bytes::from(vec![b'x'; 1 << 16]);
                    Body::from_stream(futures_util::stream::repeat_with(move || {
                        Ok::<_, std::io::Error>(chunk.clone())
                    }))
                }),
            );
            let table = Arc::new(ConnTable::new(limits(8)));
            let (_stop_tx, stop_rx) = watch::channel(false);
            tokio::spawn(accept_loop(listener, app, Arc::clone(&table), stop_rx));
            let client = tokio::task::spawn_blocking(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                // Never read; hold the socket until the test ends.
                std::thread::sleep(Duration::from_secs(6));
                drop(s);
            });
            let t0 = Instant::now();
            while table.open_count() == 0 && t0.elapsed() < Duration::from_secs(2) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(table.open_count(), 1, "the connection was admitted");
            while table.open_count() > 0 && t0.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(table.open_count(), 0, "a blocked writer is cut");
            assert_eq!(table.timed_out.load(Ordering::Relaxed), 1);
            client.abort();
        });
    }
}
