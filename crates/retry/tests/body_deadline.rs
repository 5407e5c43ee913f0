//! The request's deadline holds to the last byte of every body the engine hands back, on tokio's
//! paused clock: a stream handed over late in the request's time ends at the deadline with
//! `DeadlineExceeded`, not when the backend stops sending.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use stormguard_classify::{Reason, chain, outcome_of};
use stormguard_deadline::DeadlineExceeded;
use stormguard_retry::ClientLayer;
use stormguard_stream::StreamPolicy;
use stormguard_test_kit::ScriptedBody;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// An event stream of one content event at each of `at`, then its end.
fn paced(at: impl IntoIterator<Item = Instant>) -> ScriptedBody {
    let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n";
    at.into_iter()
        .fold(ScriptedBody::new(), |body, at| body.until(at).data(event))
}

/// A 25 s deadline and a 10 s limit on the first event: the first attempt's stream stays silent,
/// the limit ends it at 10 s and the retry goes (within 0.5 s: full jitter); the retry's first
/// token comes at 19.5 s (within its own limit) and one more each second until 30.5 s. The caller
/// reads the six tokens before 25 s, then, at 25 s exactly, the deadline's error, and nothing
/// after it.
#[tokio::test(start_paused = true)]
async fn a_stream_handed_back_after_a_retry_ends_at_the_deadline() {
    let started = Instant::now();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&calls);
    let backend = tower::service_fn(move |_request: Request<Full<Bytes>>| {
        let body = match seen.fetch_add(1, Ordering::SeqCst) {
            0 => ScriptedBody::hanging(),
            _ => paced((0..12).map(|n| started + Duration::from_millis(19_500 + 1_000 * n))),
        };
        let response = Response::builder()
            .header("content-type", "text/event-stream")
            .body(body);
        async move { response }
    });
    let policy = StreamPolicy::default().with_first_event(Some(Duration::from_secs(10)));
    let client = ClientLayer::default()
        .without_throttle()
        .with_timeout(Duration::from_secs(25))
        .with_stream_policy(policy)
        .layer(backend);
    let request = Request::post("http://llm.test/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(19_500));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let mut body = response.into_body();
    let mut tokens = 0;
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => tokens += usize::from(frame.is_data()),
            Some(Err(error)) => break error,
            None => panic!(
                "the stream outlived its deadline: ended after {:?}",
                started.elapsed()
            ),
        }
    };
    assert_eq!(started.elapsed(), Duration::from_secs(25));
    assert_eq!(tokens, 6);
    let reason = outcome_of(&*error).map(|outcome| outcome.reason());
    assert_eq!(reason, Some(Reason::DeadlineExceeded));
    assert!(chain(&*error).any(|link| link.is::<DeadlineExceeded>()));
    assert!(body.frame().await.is_none());
}

/// A body whose bytes are all there when it is handed back is read to its end, whatever the
/// deadline: it is checked only when the body has to wait.
#[tokio::test(start_paused = true)]
async fn a_body_read_at_once_is_never_cut() {
    let backend = tower::service_fn(|_request: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
            b"{\"ok\":true}",
        ))))
    });
    let client = ClientLayer::default()
        .with_timeout(Duration::from_secs(1))
        .layer(backend);
    let response = client
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, Bytes::from_static(b"{\"ok\":true}"));
}
