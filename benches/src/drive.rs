//! Driving requests through a variant: one at a time on the caller's thread, or from several
//! threads sharing the variant's state.

use std::fmt;
use std::future::{Future, poll_fn};
use std::hint::black_box;
use std::pin::pin;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use tokio::runtime::Runtime;
use tower::Service;

use crate::requests::{Req, chat_request};

/// Requests that had to wait on the runtime (see [`send`]); expected to stay zero.
pub static WAITED: AtomicU64 = AtomicU64::new(0);

/// Requests sent by [`in_parallel`] that did not end in a 200 (an error, or a failure the retry
/// gave up on); reported by the profiling mode.
pub static NOT_OK: AtomicU64 = AtomicU64::new(0);

/// A current-thread runtime with time enabled (the deadline's timer needs it).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// Sends one request as a caller does (`poll_ready`, then `call`), inside the runtime's context
/// (the caller holds `runtime.enter()`), polling with a no-op waker. Every variant completes on
/// its first poll here, so no variant pays for a scheduler; a future that does wait is handed to
/// `block_on` and counted in [`WAITED`].
pub fn send<S, B>(runtime: &Runtime, service: &mut S, request: Req) -> Result<Response<B>, S::Error>
where
    S: Service<Req, Response = Response<B>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    match service.poll_ready(&mut cx) {
        Poll::Ready(ready) => ready?,
        Poll::Pending => {
            WAITED.fetch_add(1, Ordering::Relaxed);
            runtime.block_on(poll_fn(|cx| service.poll_ready(cx)))?;
        }
    }
    let mut future = pin!(service.call(request));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => {
            WAITED.fetch_add(1, Ordering::Relaxed);
            runtime.block_on(future)
        }
    }
}

/// Before measuring: one request must come back 200, having made `calls` backend calls.
pub fn check<S, B>(name: &str, runtime: &Runtime, service: &mut S, calls: Option<&AtomicU64>)
where
    S: Service<Req, Response = Response<B>>,
    S::Error: fmt::Debug,
{
    let before = calls.map(|calls| calls.load(Ordering::Relaxed));
    let response = send(runtime, service, chat_request());
    let status = response.as_ref().map(Response::status);
    assert!(matches!(status, Ok(StatusCode::OK)), "{name}: {status:?}");
    if let (Some(calls), Some(before)) = (calls, before) {
        let made = calls.load(Ordering::Relaxed) - before;
        assert_eq!(made, 2, "{name}: one failure and one retry per request");
    }
}

/// `threads` threads send `iters` requests each through clones of `service`; returns the time
/// from the first start to the last end. Spawning threads and building runtimes is not timed.
pub fn in_parallel<S, B>(service: &S, threads: usize, iters: u64) -> Duration
where
    S: Service<Req, Response = Response<B>> + Clone + Send,
{
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let mut service = service.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    let runtime = runtime();
                    let _context = runtime.enter();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let response = black_box(send(&runtime, &mut service, chat_request()));
                        if !response.is_ok_and(|response| response.status() == StatusCode::OK) {
                            NOT_OK.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|span| span.0).min();
    let end = spans.iter().map(|span| span.1).max();
    match (start, end) {
        (Some(start), Some(end)) => end - start,
        _ => Duration::ZERO,
    }
}
