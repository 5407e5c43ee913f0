//! The accept loop: HTTP/1.1 connections with a bounded head (its size, and the time a caller
//! may take to send it) and a cap on connections served at once, stopped gracefully.
//!
//! `axum::serve` sets none of these; a caller that sends its head a byte a minute (slow-loris)
//! would hold a task and a socket for as long as it likes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};

/// How the listener bounds its callers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The longest a caller may take to send a request's head.
    pub(crate) header_read_timeout: Duration,
    /// The largest request head, in bytes.
    pub(crate) max_header_bytes: usize,
    /// Connections served at once; more wait in the kernel's backlog.
    pub(crate) max_connections: usize,
}

/// How long requests in flight get to finish once the gateway is told to stop.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// A pause after an accept that failed (out of file descriptors, most often), so that the loop
/// does not spin while the process is out of them.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` within `limits` until `stopped` fires.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    mut stopped: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => break,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => tokio::select! {
                    _ = &mut stopped => break,
                    accepted = listener.accept() => accepted.map(|accepted| (accepted, slot)),
                },
                Err(_) => break,
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
        let connection = connection(limits)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    let _ = tokio::time::timeout(STOP_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// One connection's HTTP/1.1 settings.
fn connection(limits: Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
}
