//! Connections served on per-core threads: [`Workers`].
//!
//! On tokio's work-stealing runtime a request's tasks (the caller's connection, the provider's
//! connection, their timers) wake each other across threads, and each wake of a parked thread is
//! a system call and an interrupt: the gateway spent 48 µs of CPU a request that way against 28
//! µs on one thread (`docs/PERFORMANCE.md`, "The gateway"). The binary therefore hands each
//! accepted connection to one of [`Workers`], one thread a core, each with a single-threaded
//! runtime and its own pool of connections to the providers (see [`upstream`](super::upstream)):
//! a request is served on the thread its caller's connection landed on, from its head to its
//! last byte. What the requests share (the guards, the learned limits, the metrics, the app a
//! reload replaces) is shared as before. The accept loop, the signals, the reload and the drain
//! stay on the runtime that started the gateway.
//!
//! [`start`](super::start) serves on the runtime it is called from, as tests and embedders
//! expect (a paused clock reaches its connections); [`start_on`](super::start_on) takes workers.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::watch;

thread_local! {
    /// Whether this thread is one of the workers: its requests take its own provider connections.
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is a worker's.
pub(crate) fn on_worker() -> bool {
    ON_WORKER.with(Cell::get)
}

/// Threads that serve connections, each on a single-threaded runtime of its own, taken in turn.
/// They end when this is dropped (the gateway that took them has drained), and the connections
/// still on them are closed.
#[derive(Debug)]
pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropped with this: each thread then leaves its runtime, and ends.
    _stop: watch::Sender<()>,
}

impl Workers {
    /// `count` workers (at least one), named `stormguard-worker-N`.
    pub fn start(count: usize) -> std::io::Result<Self> {
        let (stop, stopped) = watch::channel(());
        let mut handles = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let mut stopped = stopped.clone();
            std::thread::Builder::new()
                .name(format!("stormguard-worker-{index}"))
                .spawn(move || {
                    ON_WORKER.with(|on| on.set(true));
                    // No value is ever sent: this returns when the sender is dropped.
                    runtime.block_on(async move {
                        let _ = stopped.changed().await;
                    });
                })?;
        }
        Ok(Self {
            handles,
            next: AtomicUsize::new(0),
            _stop: stop,
        })
    }

    /// One worker a core (as many as the machine says it can run at once; one when it cannot
    /// say).
    pub fn per_core() -> std::io::Result<Self> {
        Self::start(std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Never: a pool has at least one worker.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Runs `task` on the next worker in turn.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        drop(self.handles[at].spawn(task));
    }
}
