//! A request its deadline cuts, on a paused clock: with a degraded answer set, the caller gets
//! that answer at the deadline, marked as degraded and saying why; without one, the deadline
//! error. Cut while an attempt is in flight on the primary, in flight on the backup it failed
//! over to, and while the next backend was not yet ready to take the request.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use stormguard_breaker::{BreakerConfig, CircuitBreaker};
use stormguard_budget::RetryBudget;
use stormguard_classify::headers::{X_STORMGUARD_BACKEND, X_STORMGUARD_DEGRADED};
use stormguard_classify::{LocalAnswer, Reason};
use stormguard_failover::{Adapter, Answered, Backend, Degraded, Failover};
use stormguard_jitter::Constant;
use stormguard_retry::ClientLayer;
use support::{MS, Providers, request};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const DEADLINE: Duration = Duration::from_secs(2);

/// The primary never answers (0), the backup answers 200 after 5 s.
fn silent_primary() -> Providers {
    let providers = Providers::new(0, 200);
    providers.set("secondary.test", 200, 5_000 * MS);
    providers
}

/// The primary answers 503 at once, the backup 200 after 5 s.
fn failing_primary() -> Providers {
    let providers = Providers::new(503, 200);
    providers.set("secondary.test", 200, 5_000 * MS);
    providers
}

/// The primary, whose breaker opens on its first failure: one 503 sends the request on.
fn quick_to_open_primary() -> Backend {
    Backend::new("primary").with_breaker(CircuitBreaker::new(
        BreakerConfig::default().with_consecutive_failures(Some(1)),
    ))
}

fn backup() -> Backend {
    Backend::new("backup")
        .with_adapter(Adapter::new().with_origin("http://secondary.test".parse().unwrap()))
}

/// A failover from `primary` to the backup under a 2 s deadline, with the "busy" answer when
/// `degraded`.
fn failover(
    primary: Backend,
    degraded: bool,
) -> Failover<stormguard_classify::LlmClassifier, Constant> {
    let layer = ClientLayer::default()
        .with_budget(RetryBudget::default())
        .with_backoff(Constant::new(10 * MS))
        .with_timeout(DEADLINE)
        .without_throttle();
    let failover = Failover::new(layer)
        .with_backend(primary)
        .with_backend(backup());
    if !degraded {
        return failover;
    }
    // The body says why, to show what the answer was made from.
    failover.with_degraded(Degraded::new(|_head, why| {
        let body = format!("busy, try again ({})", why.reason().as_str());
        Response::builder()
            .status(200)
            .body(Bytes::from(body))
            .unwrap()
    }))
}

/// The elapsed paused time is the deadline, give or take the timer's millisecond.
fn assert_at_deadline(started: Instant) {
    let elapsed = started.elapsed();
    assert!(
        elapsed >= DEADLINE && elapsed <= DEADLINE + MS,
        "answered after {elapsed:?}, the deadline is {DEADLINE:?}"
    );
}

/// The degraded answer, marked as such and not as any backend's, made for a passed deadline.
async fn assert_degraded_for_deadline<B>(response: Response<B>)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[X_STORMGUARD_DEGRADED], "true");
    assert!(response.headers().get(X_STORMGUARD_BACKEND).is_none());
    assert!(response.extensions().get::<Answered>().is_none());
    let why = response
        .extensions()
        .get::<LocalAnswer>()
        .expect("a degraded answer is marked with LocalAnswer")
        .outcome();
    assert_eq!(why.reason(), Reason::DeadlineExceeded);
    assert!(!why.is_accepted());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"busy, try again (deadline_exceeded)");
}

#[tokio::test(start_paused = true)]
async fn a_request_cut_in_flight_on_the_primary_gets_the_degraded_answer_at_its_deadline() {
    let providers = silent_primary();
    let client = failover(Backend::new("primary"), true).layer(providers.service());
    let started = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_at_deadline(started);
    assert_degraded_for_deadline(response).await;
    // The primary was cut in its first attempt; no time was left for anything else.
    assert_eq!(providers.hits(), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_request_cut_in_flight_on_the_backup_gets_the_degraded_answer_at_its_deadline() {
    let providers = failing_primary();
    let client = failover(quick_to_open_primary(), true).layer(providers.service());
    let started = Instant::now();
    let response = client.oneshot(request()).await.unwrap();
    assert_at_deadline(started);
    assert_degraded_for_deadline(response).await;
    // The primary's 503 opened its breaker, the backup took the request and was cut at 2 s.
    assert_eq!(providers.hits(), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_backend_is_not_ready_by_its_deadline_gets_the_degraded_answer() {
    let started = Instant::now();
    let providers = Providers::new(200, 200);
    let service = providers.service_ready_at(started + 5 * DEADLINE);
    let client = failover(Backend::new("primary"), true).layer(service);
    let response = client.oneshot(request()).await.unwrap();
    assert_at_deadline(started);
    assert_degraded_for_deadline(response).await;
    assert_eq!(providers.hits(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn without_a_degraded_answer_a_request_cut_at_its_deadline_ends_with_the_deadline_error() {
    let providers = silent_primary();
    let client = failover(Backend::new("primary"), false).layer(providers.service());
    let started = Instant::now();
    let error = client.oneshot(request()).await.unwrap_err();
    assert_at_deadline(started);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(error.attempts(), 1);
    assert_eq!(error.to_string(), "deadline exceeded after 1 attempt");
    assert_eq!(providers.hits(), (1, 0));

    // Cut in flight on the backup, after the failover: the same error, two attempts sent.
    let providers = failing_primary();
    let client = failover(quick_to_open_primary(), false).layer(providers.service());
    let started = Instant::now();
    let error = client.oneshot(request()).await.unwrap_err();
    assert_at_deadline(started);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(providers.hits(), (1, 1));

    // No backend ready by the deadline: the same error at the deadline, nothing sent.
    let started = Instant::now();
    let providers = Providers::new(200, 200);
    let service = providers.service_ready_at(started + 5 * DEADLINE);
    let client = failover(Backend::new("primary"), false).layer(service);
    let error = client.oneshot(request()).await.unwrap_err();
    assert_at_deadline(started);
    assert_eq!(error.reason(), Reason::DeadlineExceeded);
    assert_eq!(error.attempts(), 0);
    assert_eq!(providers.hits(), (0, 0));
}
