//! Several models behind one server, loaded on demand (Ollama's model management,
//! llama-server's router mode).
//!
//! [`Models`] holds the resident models. A request names its model; [`Models::acquire`]
//! answers with a [`Lease`] on it once it is loaded: a resident model at once, else after
//! its load, which waits for room. Room is `--max-models` models and a memory budget
//! (`--max-memory`: each model counted as its file plus its KV pool); a model that needs
//! room unloads the least recently used idle ones, and marks busy ones as draining: they
//! take no new requests, and unload when their last one ends (never in the middle of
//! one), so two models that take turns in a small budget alternate in batches. An idle
//! model unloads when its keep-alive ends (Ollama's `keep_alive`: `--keep-alive`, a
//! request's own; the `-m` model by default never).
//!
//! Requests reach their model through [`dispatch`], which reads the `model` field, takes
//! the lease, applies a created model's defaults, and passes the request to that model's
//! own router; the lease lives as long as the response's body.

pub mod config;
pub(crate) mod dispatch;
pub(crate) mod manage;
pub(crate) mod registry;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::http::StatusCode;
use axum::Router;

use crate::api::ApiError;
use crate::AppState;
use registry::Source;

/// How long an idle model stays loaded: Ollama's `keep_alive` (a duration; 0 unloads
/// when its last request ends; negative keeps it loaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlive {
    /// Unloaded once idle this long.
    For(Duration),
    /// Never unloaded for idleness.
    Forever,
}

impl KeepAlive {
    /// Parses Ollama's forms: a number of seconds (JSON number or numeric string), or a Go
    /// duration (`5m`, `1h30m`, `300ms`, `1.5h`); negative: forever.
    ///
    /// Errors: a sentence naming the value.
    pub fn parse(v: &serde_json::Value) -> Result<KeepAlive, String> {
        let secs = match v {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::String(s) => s
                .trim()
                .parse::<f64>()
                .ok()
                .or_else(|| go_duration(s.trim())),
            _ => None,
        }
        .filter(|s| s.is_finite())
        .ok_or_else(|| {
            format!(
                "'keep_alive' must be a duration such as \"5m\" or a number of seconds, got {v}"
            )
        })?;
        Ok(if secs < 0.0 {
            KeepAlive::Forever
        } else {
            KeepAlive::For(Duration::from_secs_f64(secs.min(1e12)))
        })
    }

    /// When a model idle from `now` unloads (`None`: never).
    fn deadline(self, now: Instant) -> Option<Instant> {
        match self {
            KeepAlive::For(d) => now.checked_add(d),
            KeepAlive::Forever => None,
        }
    }
}

/// Seconds of a Go duration string (`-1h2m3.5s`, units ns us µs ms s m h).
fn go_duration(s: &str) -> Option<f64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[u..];
        total += value * scale;
    }
    Some(if neg { -total } else { total })
}

/// A loaded model: its state and its router (the model-scoped endpoints).
#[derive(Clone)]
pub(crate) struct Loaded {
    pub app: Arc<AppState>,
    pub router: Router,
}

/// What the manager needs of the server to load a model.
pub(crate) trait Build: Send + Sync {
    /// Bytes `source` will hold once loaded (file and KV pool), read from its metadata.
    fn bytes(&self, source: &Source) -> Result<u64, ApiError>;
    /// Loads `source` (blocking: run on a thread of its own).
    fn load(&self, source: &Source) -> anyhow::Result<Loaded>;
}

enum SlotState {
    Loading,
    Ready(Loaded),
    /// The load failed (when): requests get the error for [`FAILED_KEPT`], then a new
    /// request tries again.
    Failed(ApiError, Instant),
}

/// How long a failed load answers for itself before the next request tries again (so
/// many clients of a broken file do not each load it).
const FAILED_KEPT: Duration = Duration::from_secs(5);

/// A model resident or being loaded.
struct Slot {
    /// Its engine's key ([`Source::key`]: one engine per file and settings, whatever
    /// names lead to it).
    key: String,
    /// The file.
    path: std::path::PathBuf,
    /// The name it was loaded under.
    name: String,
    bytes: u64,
    state: SlotState,
    /// Requests holding it.
    leases: usize,
    /// When it unloads if idle (`None`: never).
    expires: Option<Instant>,
    /// Its keep-alive after the current requests.
    keep: KeepAlive,
    /// Asked to make room: no new requests; unloaded when its last one ends.
    draining: bool,
    last_used: Instant,
    loaded_at: SystemTime,
}

/// The resident models (see the module documentation).
pub(crate) struct Models {
    slots: Mutex<Slots>,
    changed: tokio::sync::Notify,
    build: Arc<dyn Build>,
    max_models: usize,
    max_memory: u64,
    default_keep: KeepAlive,
    /// How long a request waits for its model (a load, room for it) before a 503.
    wait_limit: Duration,
    /// Loads started, by model name order of first use (for `/metrics`).
    pub loads: AtomicU64,
    pub unloads: AtomicU64,
    pub load_failures: AtomicU64,
}

/// The slots and the requests waiting for each file's model.
#[derive(Default)]
struct Slots {
    list: Vec<Slot>,
    /// Requests in [`Models::acquire`] for each file: a model just loaded for them is not
    /// taken away before they hold it.
    waiting: std::collections::HashMap<String, usize>,
}

impl std::ops::Deref for Slots {
    type Target = Vec<Slot>;
    fn deref(&self) -> &Vec<Slot> {
        &self.list
    }
}

impl std::ops::DerefMut for Slots {
    fn deref_mut(&mut self) -> &mut Vec<Slot> {
        &mut self.list
    }
}

/// Counts a request as waiting for a file's model while it lives.
struct Waiting<'a>(&'a Models, &'a str);

impl<'a> Waiting<'a> {
    fn new(models: &'a Models, key: &'a str) -> Waiting<'a> {
        *models.lock().waiting.entry(key.to_string()).or_default() += 1;
        Waiting(models, key)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut g = self.0.lock();
        if let Some(n) = g.waiting.get_mut(self.1) {
            *n -= 1;
            if *n == 0 {
                g.waiting.remove(self.1);
            }
        }
        drop(g);
        // A model it protected may now make room for others.
        self.0.changed.notify_waiters();
    }
}

/// What one look at the slots found.
enum Attempt {
    Leased(Lease),
    /// Loading, draining, or no room yet: wait for a change.
    Wait,
    /// Not resident, and its size is not known yet.
    Size,
}

/// A request's hold on a loaded model: while any exists the model stays loaded.
pub(crate) struct Lease {
    pub loaded: Loaded,
    models: Arc<Models>,
    key: String,
    keep: Option<KeepAlive>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.models.release(&self.key, self.keep);
    }
}

/// What `/api/ps` and `/metrics` report of a resident model.
pub(crate) struct Resident {
    pub name: String,
    pub path: std::path::PathBuf,
    pub bytes: u64,
    pub app: Arc<AppState>,
    pub expires: Option<SystemTime>,
}

impl Models {
    /// A manager of at most `max_models` models within `max_memory` bytes.
    pub fn new(
        build: Arc<dyn Build>,
        max_models: usize,
        max_memory: u64,
        default_keep: KeepAlive,
        wait_limit: Duration,
    ) -> Models {
        Models {
            slots: Mutex::new(Slots::default()),
            changed: tokio::sync::Notify::new(),
            build,
            max_models: max_models.max(1),
            max_memory,
            default_keep,
            wait_limit,
            loads: AtomicU64::new(0),
            unloads: AtomicU64::new(0),
            load_failures: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The keep-alive of `source` when its requests do not say: the `-m` model's is
    /// forever, others' `--keep-alive`.
    fn keep_of(&self, source: &Source) -> KeepAlive {
        match (&source.settings, source.is_cli) {
            (Some(s), _) if s.keep_alive.is_some() => s.keep_alive.unwrap_or(self.default_keep),
            (_, true) => KeepAlive::Forever,
            _ => self.default_keep,
        }
    }

    /// A lease on `source`, loading it first if needed (waiting for room); `keep` is the
    /// request's `keep_alive`.
    ///
    /// Errors: the load's failure (a 500 naming the file), or a 400 for a file whose
    /// metadata cannot be read.
    pub async fn acquire(
        self: &Arc<Self>,
        source: &Source,
        keep: Option<KeepAlive>,
    ) -> Result<Lease, ApiError> {
        tokio::time::timeout(self.wait_limit, self.acquire_waiting(source, keep))
            .await
            .unwrap_or_else(|_| {
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable_error",
                    format!(
                        "waited {} s for model '{}': the models loaded are answering requests and there is no room for it (--max-models, --max-memory); retry later",
                        self.wait_limit.as_secs(),
                        source.name
                    ),
                )
                .with_code("model_busy"))
            })
    }

    /// [`Models::acquire`] without its time limit (the `-m` model's first load).
    pub async fn acquire_waiting(
        self: &Arc<Self>,
        source: &Source,
        keep: Option<KeepAlive>,
    ) -> Result<Lease, ApiError> {
        let mut need = None;
        let key = source.key();
        let _waiting = Waiting::new(self, &key);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.try_acquire(source, keep, need)? {
                Attempt::Leased(lease) => return Ok(lease),
                Attempt::Wait => changed.await,
                Attempt::Size => {
                    // Read from the file's metadata off the async threads, once.
                    let build = Arc::clone(&self.build);
                    let s = source.clone();
                    need = Some(
                        tokio::task::spawn_blocking(move || build.bytes(&s))
                            .await
                            .map_err(|e| server_error(format!("sizing the model failed: {e}")))??,
                    );
                }
            }
        }
    }

    /// One attempt of [`Models::acquire`]; `need` is the model's size once known.
    fn try_acquire(
        self: &Arc<Self>,
        source: &Source,
        keep: Option<KeepAlive>,
        need: Option<u64>,
    ) -> Result<Attempt, ApiError> {
        let mut slots = self.lock();
        let key = source.key();
        if let Some(i) = slots.iter().position(|s| s.key == key) {
            let slot = &mut slots[i];
            match &slot.state {
                SlotState::Ready(l) if !slot.draining => {
                    slot.leases += 1;
                    slot.last_used = Instant::now();
                    if let Some(k) = keep {
                        slot.keep = k;
                    }
                    return Ok(Attempt::Leased(Lease {
                        loaded: l.clone(),
                        models: Arc::clone(self),
                        key: slot.key.clone(),
                        keep,
                    }));
                }
                SlotState::Failed(e, at) if at.elapsed() < FAILED_KEPT => return Err(e.clone()),
                SlotState::Failed(..) => {
                    slots.remove(i);
                }
                _ => return Ok(Attempt::Wait),
            }
        }
        let Some(need) = need else {
            return Ok(Attempt::Size);
        };
        if !self.make_room(&mut slots, need) {
            return Ok(Attempt::Wait);
        }
        slots.push(Slot {
            key,
            path: source.path.clone(),
            name: source.name.clone(),
            bytes: need,
            state: SlotState::Loading,
            leases: 0,
            expires: None,
            keep: keep.unwrap_or_else(|| self.keep_of(source)),
            draining: false,
            last_used: Instant::now(),
            loaded_at: SystemTime::now(),
        });
        drop(slots);
        self.start_load(source.clone());
        Ok(Attempt::Wait)
    }

    /// Whether a model of `need` bytes fits now; if not, unloads idle models (least
    /// recently used first) and marks busy ones draining until it would.
    fn make_room(&self, slots: &mut Slots, need: u64) -> bool {
        slots.retain(
            |s| !matches!(s.state, SlotState::Failed(_, at) if at.elapsed() >= FAILED_KEPT),
        );
        let counted = |s: &&Slot| !matches!(s.state, SlotState::Failed(..));
        let fits = |slots: &[Slot]| {
            let n = slots.iter().filter(counted).count();
            n == 0 && {
                if need > self.max_memory {
                    tracing::warn!(
                        "a model of {need} bytes is loaded alone although --max-memory is {}",
                        self.max_memory
                    );
                }
                true
            } || (n < self.max_models
                && slots
                    .iter()
                    .map(|s| s.bytes)
                    .sum::<u64>()
                    .saturating_add(need)
                    <= self.max_memory)
        };
        loop {
            if fits(slots) {
                return true;
            }
            let idle = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    s.leases == 0
                        && !slots.waiting.contains_key(&s.key)
                        && matches!(s.state, SlotState::Ready(_))
                })
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i);
            let Some(i) = idle else { break };
            self.unload(slots.remove(i));
        }
        // Busy models finish what they run and then go, as many as needed.
        let mut freed_bytes = 0u64;
        let used: u64 = slots.iter().map(|s| s.bytes).sum();
        let resident = slots.iter().filter(counted).count();
        // (A ready model without requests has requests about to take it: it is drained
        // once they hold it.)
        let mut order: Vec<usize> = (0..slots.len())
            .filter(|&i| matches!(slots[i].state, SlotState::Ready(_)) && slots[i].leases > 0)
            .collect();
        order.sort_by_key(|&i| slots[i].last_used);
        for (freed_models, i) in order.into_iter().enumerate() {
            let room = resident - freed_models < self.max_models
                && used - freed_bytes + need <= self.max_memory;
            if room {
                break;
            }
            slots[i].draining = true;
            freed_bytes += slots[i].bytes;
        }
        false
    }

    /// Loads `source` on a thread of its own; its slot becomes ready or failed.
    fn start_load(self: &Arc<Self>, source: Source) {
        self.loads.fetch_add(1, Ordering::Relaxed);
        let models = Arc::clone(self);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            // A panic while loading fails the load (its waiters get the error) instead of
            // leaving the slot loading for ever.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                models.build.load(&source)
            }))
            .unwrap_or_else(|_| Err(anyhow::anyhow!("loading {} panicked", source.name)));
            let mut slots = models.lock();
            let key = source.key();
            let Some(slot) = slots.iter_mut().find(|s| s.key == key) else {
                return;
            };
            match r {
                Ok(l) => {
                    eprintln!(
                        "frink serve: loaded {} in {:.1} s",
                        source.name,
                        t0.elapsed().as_secs_f64()
                    );
                    slot.state = SlotState::Ready(l);
                    slot.last_used = Instant::now();
                    slot.loaded_at = SystemTime::now();
                    slot.expires = slot.keep.deadline(Instant::now());
                }
                Err(e) => {
                    models.load_failures.fetch_add(1, Ordering::Relaxed);
                    slot.state = SlotState::Failed(
                        // The loader's error names the file and what is wrong with it.
                        server_error(format!("{e:#}")),
                        Instant::now(),
                    );
                    slot.bytes = 0;
                }
            }
            drop(slots);
            models.changed.notify_waiters();
        });
    }

    /// A lease ends: the model's idle clock starts; it goes now if it was draining or its
    /// keep-alive is 0.
    fn release(&self, key: &str, keep: Option<KeepAlive>) {
        let mut slots = self.lock();
        if let Some(i) = slots.iter().position(|s| s.key == key) {
            let slot = &mut slots[i];
            slot.leases = slot.leases.saturating_sub(1);
            slot.last_used = Instant::now();
            if let Some(k) = keep {
                slot.keep = k;
            }
            slot.expires = slot.keep.deadline(Instant::now());
            let gone = slot.keep == KeepAlive::For(Duration::ZERO);
            if slot.leases == 0 && (slot.draining || gone) {
                self.unload(slots.remove(i));
            }
        }
        drop(slots);
        self.changed.notify_waiters();
    }

    /// Drops a slot's model off the async threads (its scheduler's thread is joined).
    fn unload(&self, slot: Slot) {
        if let SlotState::Ready(l) = slot.state {
            self.unloads.fetch_add(1, Ordering::Relaxed);
            eprintln!("frink serve: unloaded {}", slot.name);
            std::thread::spawn(move || drop(l));
        }
    }

    /// Unloads idle models whose keep-alive has ended; called every second.
    pub fn expire(&self) {
        let now = Instant::now();
        let mut slots = self.lock();
        let mut i = 0;
        let mut any = false;
        while i < slots.len() {
            let s = &slots[i];
            let due = s.leases == 0
                && matches!(s.state, SlotState::Ready(_))
                && s.expires.is_some_and(|e| e <= now);
            if due {
                self.unload(slots.remove(i));
                any = true;
            } else {
                i += 1;
            }
        }
        drop(slots);
        if any {
            self.changed.notify_waiters();
        }
    }

    /// Unloads the model of engine key `key` ([`Source::key`]) now if it is idle (Ollama's `keep_alive: 0` on an
    /// empty request, llama.cpp's `/models/unload`); `Ok(false)` if it was not loaded.
    ///
    /// Errors: a 409 while requests run on it (with `later`, it is then marked to go when
    /// they end).
    pub fn unload_now(&self, key: &str, later: bool) -> Result<bool, ApiError> {
        let mut slots = self.lock();
        let Some(i) = slots.iter().position(|s| s.key == key) else {
            return Ok(false);
        };
        let busy = slots[i].leases > 0 || slots.waiting.contains_key(key);
        if busy || matches!(slots[i].state, SlotState::Loading) {
            if later {
                // It goes when the requests that hold or await it end.
                slots[i].draining = slots[i].leases > 0;
                slots[i].keep = KeepAlive::For(Duration::ZERO);
            }
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                format!(
                    "model '{}' is answering requests; it unloads when they end",
                    slots[i].name
                ),
            ));
        }
        self.unload(slots.remove(i));
        drop(slots);
        self.changed.notify_waiters();
        Ok(true)
    }

    /// The resident models, ready ones only, most recently used first.
    pub fn resident(&self) -> Vec<Resident> {
        let now_i = Instant::now();
        let now_s = SystemTime::now();
        let slots = self.lock();
        let mut out: Vec<(Instant, Resident)> = slots
            .iter()
            .filter_map(|s| match &s.state {
                SlotState::Ready(l) => Some((
                    s.last_used,
                    Resident {
                        name: s.name.clone(),
                        path: s.path.clone(),
                        bytes: s.bytes,
                        app: Arc::clone(&l.app),
                        expires: s
                            .expires
                            .map(|e| now_s + e.saturating_duration_since(now_i)),
                    },
                )),
                _ => None,
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.0));
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// Whether the model of engine key `key` is loaded (ready).
    pub fn is_loaded(&self, key: &str) -> bool {
        self.lock()
            .iter()
            .any(|s| s.key == key && matches!(s.state, SlotState::Ready(_)))
    }

    /// The capabilities of the loaded model of engine key `key` (Ollama's words:
    /// `completion`, `tools`, `vision`, …), `None` while it is not loaded.
    pub fn capabilities(&self, key: &str) -> Option<Vec<&'static str>> {
        self.lock()
            .iter()
            .find(|s| s.key == key)
            .and_then(|s| match &s.state {
                SlotState::Ready(l) => l.app.engine.get().map(|e| e.info.capabilities.clone()),
                _ => None,
            })
    }

    /// Bytes the resident and loading models count for.
    pub fn bytes(&self) -> u64 {
        self.lock().iter().map(|s| s.bytes).sum()
    }

    /// The memory budget (`--max-memory`).
    pub fn max_memory(&self) -> u64 {
        self.max_memory
    }

    /// The loaded models' schedulers, for shutdown.
    pub fn each_app(&self) -> Vec<Arc<AppState>> {
        self.resident().into_iter().map(|r| r.app).collect()
    }
}

/// A 500 with `message`.
pub(crate) fn server_error(message: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
}

/// What the machine can hold without swapping: `MemAvailable` of /proc/meminfo (all of
/// the address space where it cannot be read).
pub fn available_memory() -> u64 {
    frink_engine::meminfo_bytes("MemAvailable").unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keep_alive_reads_ollamas_forms() {
        let p = |v| KeepAlive::parse(&v).unwrap();
        assert_eq!(p(json!("5m")), KeepAlive::For(Duration::from_secs(300)));
        assert_eq!(p(json!("1h30m")), KeepAlive::For(Duration::from_secs(5400)));
        assert_eq!(
            p(json!("300ms")),
            KeepAlive::For(Duration::from_millis(300))
        );
        assert_eq!(p(json!(0)), KeepAlive::For(Duration::ZERO));
        assert_eq!(p(json!("0")), KeepAlive::For(Duration::ZERO));
        assert_eq!(p(json!(30)), KeepAlive::For(Duration::from_secs(30)));
        assert_eq!(p(json!("-1")), KeepAlive::Forever);
        assert_eq!(p(json!(-1)), KeepAlive::Forever);
        assert_eq!(p(json!("-1m")), KeepAlive::Forever);
        for bad in [json!("soon"), json!("5x"), json!(true), json!("")] {
            assert!(KeepAlive::parse(&bad).is_err(), "{bad}");
        }
    }
}
