//! The server in-process for its HTTP tests: [`TestServer::start`] serves a catalog model
//! (fetched through the store on first use) on a free loopback port with `frink serve`'s
//! defaults, on a runtime of its own; a test changes the settings it is about. Requests go
//! over real sockets ([`frink_testdata::http::Client`]). The tests of the `frink serve`
//! command itself (its flags, signals, logs, memory) and those comparing the server with
//! the other commands live in the `frink` crate.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frink_server::ServeConfig;
#[allow(unused_imports)] // each test binary uses its own subset
pub use frink_testdata::http::{
    assert_openai_error, chat, health_time, message, stream_text, Client, Response, Stream,
};

/// Tests that each start a server run one at a time (two cores).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the one-at-a-time lock (a test that panicked before does not poison it).
pub fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A catalog model's file, fetched on first use (`frink_store::Store::resolve`).
pub fn model_path(name: &str) -> std::path::PathBuf {
    frink_store::Store::from_env()
        .and_then(|s| s.resolve(name))
        .unwrap_or_else(|e| panic!("cannot fetch {name}: {e:#}"))
}

/// `frink serve -m MODEL`'s settings with every flag at its default (`--port 0`).
pub fn config(model: &str) -> ServeConfig {
    config_at(model, model_path(model))
}

/// [`config`] for the model file at `path`, served as `name`.
pub fn config_at(name: &str, path: std::path::PathBuf) -> ServeConfig {
    ServeConfig {
        model_name: name.to_string(),
        host: "127.0.0.1".into(),
        port: 0,
        parallel: 4,
        ctx: 4096,
        kv_size: 0,
        kv_mem: None,
        queue: 64,
        api_keys: Vec::new(),
        cors_origins: Vec::new(),
        conn: frink_server::conn::ConnLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(600),
        },
        kv_type: Default::default(),
        chat_template: None,
        chat_template_kwargs: Default::default(),
        split_reasoning: true,
        pooling: None,
        ubatch: frink_engine::embed::ENCODER_BATCH,
        model_path: Some(path),
        max_models: 3,
        max_memory: None,
        keep_alive: frink_server::models::KeepAlive::parse(&"5m".into())
            .expect("a keep-alive of 5m"),
        models_config: Vec::new(),
        ctx_checkpoints: 8,
        checkpoint_interval: 256,
        checkpoint_budget: 1 << 30,
        prompt_lookup: true,
        draft_max: 7,
        draft_model: None,
        draft_p_min: frink_engine::DraftModel::DEFAULT_P_MIN,
        draft_min: 0,
        context_shift: false,
        slot_save_path: None,
        cache_disk: None,
        spec_adaptive: true,
        spec_sampling: Default::default(),
        log_format: frink_server::log::LogFormat::Off,
        log_prompts: false,
        mmproj: None,
        allow_image_urls: false,
        image_max_pixels: frink_vision::input::DEFAULT_MAX_PIXELS,
        webui: Default::default(),
    }
}

/// A server running in this process; shut down (as on SIGTERM) on drop.
pub struct TestServer {
    client: Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::ops::Deref for TestServer {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl TestServer {
    /// Serves `model` (a catalog name) with [`config`]'s settings changed by `set`, two
    /// threads for the model, and waits (at most 2 minutes) until `/health` says it is
    /// ready.
    pub fn start(model: &str, set: impl FnOnce(&mut ServeConfig)) -> TestServer {
        let mut config = config(model);
        set(&mut config);
        TestServer::start_with(config)
    }

    /// Serves with `config` ([`config_at`] for a file of the tests' own).
    pub fn start_with(config: ServeConfig) -> TestServer {
        frink_models::pool::set_threads(2);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("its address").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let failed = Arc::new(Mutex::new(None::<String>));
        let thread = {
            let failed = Arc::clone(&failed);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                let load: frink_server::Loader = Arc::new(|p, _| {
                    frink_models::Model::load_with(p, true).map_err(anyhow::Error::from)
                });
                let r = rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    let shutdown = async move {
                        let _ = stopped.await;
                    };
                    frink_server::serve_on(listener, config, load, shutdown).await
                });
                if let Err(e) = r {
                    *failed.lock().unwrap() = Some(format!("{e:#}"));
                }
                rt.shutdown_timeout(Duration::from_millis(500));
            })
        };
        let srv = TestServer {
            client: Client::new(port),
            stop: Some(stop),
            thread: Some(thread),
        };
        let t0 = Instant::now();
        loop {
            if let Some(e) = failed.lock().unwrap().take() {
                panic!("the server did not start: {e}");
            }
            if srv.health_ok() {
                return srv;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "not ready in 2 minutes"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether `GET /health` answers 200 (a refused connection is not yet).
    fn health_ok(&self) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", self.client.port)).is_ok()
            && self.request("GET", "/health", None).status == 200
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
