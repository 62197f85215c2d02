//! The compute thread pool: persistent workers that run the tasks of one parallel step
//! (a matrix product, attention over heads) and then spin briefly for the next step before
//! sleeping.
//!
//! A forward pass of a small model is a few hundred short steps per token (each projection
//! of each layer), some only tens of microseconds long. Waking sleeping threads for each
//! step (as a general-purpose pool does) costs a measurable share of the token; ggml's
//! CPU backend keeps its threads spinning between the nodes of a graph for the same reason.
//! Here a worker spins for at most [`SPIN`] after a step (yielding its core on each check
//! after the first few microseconds, so an oversubscribed machine still makes progress)
//! and then sleeps on a condition variable, so an idle engine (a server waiting for
//! requests) takes no CPU.
//!
//! The calling thread takes part in every step, so `threads` = workers + 1. Steps from
//! different threads are serialised (one step runs at a time); a step started from inside
//! a task runs on the calling thread alone. Which thread runs which task never changes a
//! result: every task writes its own outputs, computed in a fixed order.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next step before it sleeps.
pub const SPIN: Duration = Duration::from_micros(1000);

/// Busy-wait iterations before a waiting thread starts yielding its core on each check
/// (a few microseconds). Without yielding, two processes with a 2-thread pool each on 2
/// cores ran 40× slower (measured: smollm2 tg 5.8 t/s instead of ~260), each spinner
/// holding the core the other's worker needed.
const YIELD_AFTER: u32 = 2000;

/// A borrowed task body with its lifetime erased (see the SAFETY note in [`Pool::run`]).
#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn(usize) + Sync + 'static));

struct Shared {
    /// Bumped once per step; a worker that sees a new value runs that step's tasks.
    epoch: AtomicUsize,
    /// The current step's body: written by the dispatcher only while no worker is in a step
    /// (`active == 0`), published by the `epoch` store (Release / Acquire).
    job: UnsafeCell<JobRef>,
    n_tasks: AtomicUsize,
    /// The next task index to claim.
    next: AtomicUsize,
    /// Workers that have not yet finished the current step.
    active: AtomicUsize,
    /// Workers sleeping (or about to) on `cv`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    quit: AtomicBool,
    panicked: AtomicBool,
}

// SAFETY: `job` is the only non-Sync field. It is written by the dispatcher only while
// every worker is outside a step (active == 0, observed with Acquire), and read by workers
// only after they observe the epoch store that follows the write (Release / Acquire), so
// there is never a concurrent write and read.
#[allow(unsafe_code)]
unsafe impl Sync for Shared {}
// SAFETY: the raw pointer in `job` is only dereferenced under the protocol above; the
// pointee is `Sync`.
#[allow(unsafe_code)]
unsafe impl Send for Shared {}

thread_local! {
    /// True while this thread runs a task of a step (nested steps run serially).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// The job before the first step.
fn noop(_: usize) {}

/// A pool of `threads - 1` workers plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool that runs each step on `threads` threads (at least 1: the caller alone).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(JobRef(&noop as &(dyn Fn(usize) + Sync))),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            quit: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("frink-compute-{i}"))
                    .spawn(move || worker(&s))
                    .expect("cannot start a compute thread")
            })
            .collect();
        Pool { shared, workers }
    }

    /// Threads taking part in each step (workers + the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) .. f(n_tasks - 1)`, each exactly once, spread over the pool's threads
    /// (tasks are claimed in index order from a shared counter), and returns when all are
    /// done. A panic in a task is re-raised here after every thread has left the step.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() || n_tasks <= 1 || IN_TASK.with(Cell::get) {
            (0..n_tasks).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the erased lifetime is never outlived: `Wait` below blocks (also while
        // unwinding) until every worker has decremented `active`, which each does only
        // after its last use of the job for this epoch.
        #[allow(unsafe_code)]
        let job: JobRef = unsafe {
            JobRef(std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f as *const _))
        };
        // SAFETY: no worker is inside a step (the previous `run` waited for active == 0
        // with Acquire), so nothing reads `job` concurrently with this write.
        #[allow(unsafe_code)]
        unsafe {
            *s.job.get() = job
        };
        s.n_tasks.store(n_tasks, Ordering::Relaxed);
        s.next.store(0, Ordering::Relaxed);
        s.active.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            drop(s.lock.lock().unwrap_or_else(|e| e.into_inner()));
            s.cv.notify_all();
        }
        struct Wait<'a>(&'a Shared);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                // Spin briefly, then yield: on a machine with more runnable threads than
                // cores the worker we wait for may need this core to finish.
                let mut spins = 0u32;
                while self.0.active.load(Ordering::Acquire) != 0 {
                    spins = spins.saturating_add(1);
                    if spins < YIELD_AFTER {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
        let wait = Wait(s);
        run_tasks(s, f);
        drop(wait);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a compute task panicked");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        drop(self.shared.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.shared.cv.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Claims and runs tasks of the current step until none are left.
fn run_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync)) {
    /// Clears the in-task flag also when a task unwinds.
    struct InTask;
    impl Drop for InTask {
        fn drop(&mut self) {
            IN_TASK.with(|t| t.set(false));
        }
    }
    let n = s.n_tasks.load(Ordering::Relaxed);
    IN_TASK.with(|t| t.set(true));
    let _in_task = InTask;
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0usize;
    loop {
        // Wait for the next step: spin, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if s.quit.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut g: MutexGuard<'_, ()> = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen && !s.quit.load(Ordering::SeqCst) {
                    g = s.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            if spins >= YIELD_AFTER {
                // Let other runnable threads (another process's, or this pool's caller)
                // have the core while we wait.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: the epoch load above (Acquire) follows the dispatcher's write of `job`
        // (published by its SeqCst epoch store), and the dispatcher keeps the job alive
        // until this worker decrements `active`.
        #[allow(unsafe_code)]
        let f: &(dyn Fn(usize) + Sync) = unsafe { &*(*s.job.get()).0 };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_tasks(s, f))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.active.fetch_sub(1, Ordering::Release);
    }
}

/// The process-wide pool the forward pass uses, created on first use.
static GLOBAL: Mutex<Option<Pool>> = Mutex::new(None);

/// Sets the number of compute threads of the forward pass (workers + the calling thread;
/// 0 means [`default_threads`]). Replaces the pool if the count changes.
pub fn set_threads(threads: usize) {
    let n = if threads == 0 {
        default_threads()
    } else {
        threads
    };
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    if g.as_ref().map(Pool::threads) != Some(n) {
        *g = Some(Pool::new(n));
    }
    THREADS.store(n, Ordering::Relaxed);
}

/// The thread count of the global pool (0 until it is created or sized).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The number of compute threads the forward pass uses (without waiting for a step in
/// progress).
pub fn threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// The default thread count: the machine's physical cores (SMT siblings share a core's
/// vector units, so a second thread per core slows these kernels down, as llama.cpp's
/// default also assumes), at most the CPUs this process may run on.
pub fn default_threads() -> usize {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores().map_or(allowed, |p| p.clamp(1, allowed))
}

/// Distinct (package, core) pairs of the CPUs in Linux's sysfs topology, if readable.
fn physical_cores() -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()? {
        let path = entry.ok()?.path();
        let name = path.file_name()?.to_str()?.to_owned();
        if !name
            .strip_prefix("cpu")
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let read = |f: &str| std::fs::read_to_string(path.join("topology").join(f)).ok();
        if let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cores.insert((pkg.trim().to_owned(), core.trim().to_owned()));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Runs `f(0..n_tasks)` on the global pool (see [`Pool::run`]). Steps from different
/// threads take turns; a step started inside a task runs serially on its thread.
pub fn run(n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    if n_tasks <= 1 || IN_TASK.with(Cell::get) {
        (0..n_tasks).for_each(f);
        return;
    }
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(|| {
        THREADS.store(default_threads(), Ordering::Relaxed);
        Pool::new(default_threads())
    })
    .run(n_tasks, f);
}

/// `f(i, chunk)` for each `chunk`-sized piece `i` of `data` (the last may be shorter),
/// pieces spread over the global pool: the parallel form of `chunks_mut().enumerate()`.
pub fn for_each_chunk<T: Send>(data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    let chunk = chunk.max(1);
    let len = data.len();
    let shared = Disjoint::new(data);
    run(len.div_ceil(chunk), &|i| {
        let at = i * chunk;
        // SAFETY: piece i is elements i*chunk .. min((i+1)*chunk, len), disjoint from every
        // other piece.
        #[allow(unsafe_code)]
        let piece = unsafe { shared.range(at, chunk.min(len - at)) };
        f(i, piece)
    });
}

/// A mutable slice shared by the tasks of one step, each writing its own disjoint
/// elements.
pub(crate) struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only access disjoint ranges through `range` (its caller's obligation), so
// sharing the pointer across threads is like splitting the slice.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        Disjoint {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: std::marker::PhantomData,
        }
    }

    /// Elements `at..at + len` (bounds-checked).
    ///
    /// # Safety
    /// No two live references returned by this method may overlap: each task of a step
    /// must take ranges no other task takes.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, at: usize, len: usize) -> &mut [T] {
        assert!(
            at <= self.len && len <= self.len - at,
            "Disjoint range out of bounds"
        );
        // SAFETY: in bounds (checked above); exclusivity is the caller's obligation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            for n in [0, 1, 2, 7, 1000] {
                let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn default_is_at_least_one_and_at_most_the_allowed_cpus() {
        let n = default_threads();
        let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!((1..=allowed).contains(&n), "{n} of {allowed}");
    }

    #[test]
    fn workers_sleep_and_wake() {
        let pool = Pool::new(2);
        std::thread::sleep(SPIN * 5);
        let sum = AtomicU64::new(0);
        pool.run(100, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }

    #[test]
    fn a_panicking_task_is_reported_and_the_pool_survives() {
        let pool = Pool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(64, &|i| {
                if i == 40 {
                    panic!("task 40");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicU64::new(0);
        pool.run(10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn nested_steps_run_serially() {
        let pool = Pool::new(2);
        let n = AtomicU64::new(0);
        pool.run(4, &|_| {
            run(3, &|_| {
                n.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(n.load(Ordering::Relaxed), 12);
    }
}
