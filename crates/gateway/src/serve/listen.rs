//! The accept loop: HTTP/1.1 connections with a bounded head (its size, and the time a caller
//! may take to send it) and a cap on connections served at once; each request served by the app
//! current when it arrives (a reload replaces it), and the drain.
//!
//! `axum::serve` sets none of these; a caller that sends its head a byte a minute (slow-loris)
//! would hold a task and a socket for as long as it likes.
//!
//! The drain: the listener is closed at once (new connections are refused), every connection is
//! told to shut down gracefully (an idle kept-alive one closes at once, one with a request in
//! flight once its answer is written), and the requests in flight get the grace. When it ends,
//! [`Ending`] tells each of them: a request still waiting is answered 503, a stream still open
//! ends with its in-band error event; they get [`FLUSH`] more to be written.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tower::ServiceExt;

use super::Drained;
use super::drain::Ending;
use super::workers::Workers;

/// How the listener bounds its callers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The longest a caller may take to send a request's head.
    pub(crate) header_read_timeout: Duration,
    /// The largest request head, in bytes.
    pub(crate) max_header_bytes: usize,
}

/// What serves a request: replaced whole by a reload, read once per request (per connection for
/// its limits), so that a request in flight keeps the app it started with.
#[derive(Clone)]
pub(crate) struct Current {
    /// The app.
    pub(crate) app: Router,
    /// The limits of a new connection.
    pub(crate) limits: Limits,
    /// The drain's grace.
    pub(crate) grace: Duration,
}

/// The grace of a gateway dropped without being stopped or drained.
const DROPPED_GRACE: Duration = Duration::from_secs(1);

/// How long the answers the end of the grace makes (503s, in-band error events) get to be
/// written before the connections left are closed.
pub(crate) const FLUSH: Duration = Duration::from_secs(1);

/// A pause after an accept that failed (out of file descriptors, most often), so that the loop
/// does not spin while the process is out of them.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The listener's parts that do not change while it serves.
pub(crate) struct Listen {
    pub(crate) listener: TcpListener,
    pub(crate) max_connections: usize,
    pub(crate) current: watch::Receiver<Current>,
    pub(crate) ending: Ending,
    pub(crate) end: watch::Sender<bool>,
    /// Where connections are served: these threads, or the runtime of the accept loop.
    pub(crate) workers: Option<Arc<Workers>>,
}

/// Serves until `stopped` gives a grace (or is dropped), then drains with it.
pub(crate) async fn serve(
    listen: Listen,
    mut stopped: oneshot::Receiver<Duration>,
) -> std::io::Result<Drained> {
    let Listen {
        listener,
        max_connections,
        current,
        ending,
        end,
        workers,
    } = listen;
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let grace = loop {
        let accepted = tokio::select! {
            grace = &mut stopped => break grace.unwrap_or(DROPPED_GRACE),
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => tokio::select! {
                    grace = &mut stopped => break grace.unwrap_or(DROPPED_GRACE),
                    accepted = listener.accept() => accepted.map(|accepted| (accepted, slot)),
                },
                Err(_) => break DROPPED_GRACE,
            },
        };
        let ((stream, _), slot) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Relayed streams are many small writes: sent at once, not held back by Nagle.
        let _ = stream.set_nodelay(true);
        let limits = current.borrow().limits;
        let served = Served {
            limits,
            requests: current.clone(),
            watcher: graceful.watcher(),
            slot,
        };
        match &workers {
            None => drop(tokio::spawn(served.serve(stream))),
            // The socket moves to the worker's runtime, registered there.
            Some(workers) => match stream.into_std() {
                Ok(stream) => workers.spawn(async move {
                    if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
                        served.serve(stream).await;
                    }
                }),
                Err(error) => tracing::warn!(%error, "accepted connection lost"),
            },
        }
    };
    // New connections are refused from here on.
    drop(listener);
    Ok(drain(graceful, grace, &ending, &end).await)
}

/// Gives the requests in flight `grace`, then ends those left and gives their last answers
/// [`FLUSH`].
async fn drain(
    graceful: GracefulShutdown,
    grace: Duration,
    ending: &Ending,
    end: &watch::Sender<bool>,
) -> Drained {
    let began = tokio::time::Instant::now();
    let before = ending.counts().tally();
    tracing::info!(
        in_flight = before.in_flight(),
        grace_ms = grace.as_millis() as u64,
        "draining: new connections refused, requests in flight get the grace"
    );
    let shutdown = graceful.shutdown();
    tokio::pin!(shutdown);
    let within = tokio::time::timeout(grace, &mut shutdown).await.is_ok();
    if !within {
        let _ = end.send(true);
        let _ = tokio::time::timeout(FLUSH, &mut shutdown).await;
    }
    let after = ending.counts().tally();
    let drained = Drained {
        in_flight: before.in_flight(),
        finished: after.finished.saturating_sub(before.finished),
        ended: after.ended.saturating_sub(before.ended),
        cut: after.in_flight(),
        took: began.elapsed(),
    };
    tracing::info!(
        finished = drained.finished,
        ended = drained.ended,
        cut = drained.cut,
        took_ms = drained.took.as_millis() as u64,
        "drained"
    );
    drained
}

/// One accepted connection and what it is served with.
struct Served {
    limits: Limits,
    /// The app current when each request arrives.
    requests: watch::Receiver<Current>,
    /// The drain's hold on it.
    watcher: Watcher,
    /// Its place among the connections served at once, given back when it closes.
    slot: OwnedSemaphorePermit,
}

impl Served {
    /// Serves `stream` until it closes, on the runtime this is polled on.
    async fn serve(self, stream: tokio::net::TcpStream) {
        let Self {
            limits,
            requests,
            watcher,
            slot,
        } = self;
        let service = tower::service_fn(move |request: http::Request<Incoming>| {
            let app = requests.borrow().app.clone();
            app.oneshot(request)
        });
        let connection = builder(limits)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let _ = watcher.watch(connection).await;
        drop(slot);
    }
}

/// One connection's HTTP/1.1 settings.
fn builder(limits: Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
}
