//! Replay of axum and tonic request bodies (features `axum` and `tonic`).

#![cfg(any(feature = "axum", feature = "tonic"))]
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use stormguard_retry::ReplayBody;
use support::{Chunked, Log, retries_only, scripted, status};
use tower::{Layer, ServiceExt};

fn payload() -> Vec<Bytes> {
    (0..4).map(|i| Bytes::from(vec![b'0' + i; 8])).collect()
}

/// Sends a 32-byte body of unknown length made with `wrap` twice: with a cap of 64 (replayed
/// until the third attempt succeeds) and a cap of 16 (sent once, whole).
async fn replays<B>(wrap: fn(Chunked) -> B)
where
    B: ReplayBody + Send + 'static,
    B::Error: Into<stormguard_classify::BoxError> + std::fmt::Debug,
{
    let expected: Bytes = payload().concat().into();

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |n, _| {
        Ok(if n < 2 { status(503) } else { status(200) })
    });
    let request = Request::post("http://svc.test/upload")
        .body(wrap(Chunked::new(payload())))
        .unwrap();
    let response = retries_only()
        .with_max_replay_body(64)
        .layer(backend)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let bodies: Vec<_> = log.all().into_iter().map(|seen| seen.body).collect();
    assert_eq!(
        bodies,
        [expected.clone(), expected.clone(), expected.clone()]
    );

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let request = Request::post("http://svc.test/upload")
        .body(wrap(Chunked::new(payload())))
        .unwrap();
    let response = retries_only()
        .with_max_replay_body(16)
        .layer(backend)
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let bodies: Vec<_> = log.all().into_iter().map(|seen| seen.body).collect();
    assert_eq!(bodies, [expected]);
}

#[cfg(feature = "axum")]
#[tokio::test(start_paused = true)]
async fn axum_bodies_are_replayed() {
    replays(axum::body::Body::new).await;
}

#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn tonic_bodies_are_replayed() {
    replays(tonic::body::Body::new).await;
}
