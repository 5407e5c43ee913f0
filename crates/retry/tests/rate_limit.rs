//! The rate limit inside the engine (`ClientLayer::with_rate_limit`), against backends the tests
//! control, on tokio's paused clock: every attempt paced, retries included; a request without
//! a slot ended at once, answered 429 and never charged to the budget; requests weighed by
//! their buffered body; the limit learning from the answers; and the slot given back whenever
//! the attempt does not go.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::Request;
use http_body_util::Full;
use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_breaker::{BreakerConfig, CircuitBreaker, State};
use stormguard_budget::RetryBudget;
use stormguard_classify::Permit;
use stormguard_classify::headers::{X_REQUEST_TIMEOUT_MS, X_SHOULD_RETRY};
use stormguard_classify::{Outcome, Reason};
use stormguard_jitter::Constant;
use stormguard_rate_limit::{RateLimit, RateLimitCause, RateLimitConfig, RateLimited};
use stormguard_retry::ClientLayer;
use stormguard_test_kit::post;
use support::{CHAT_URI, get, instant, reply, retries_only, status};
use tokio::time::Instant;
use tokio_test::assert_pending;
use tokio_test::task::spawn;
use tower::{Layer, Service, ServiceExt};

const MS: Duration = Duration::from_millis(1);

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}"#;

fn per_minute(requests: u32) -> RateLimit {
    RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(requests)))
}

/// Spends the limit's next slot, wherever it is.
fn spend_a_slot(limit: &RateLimit) {
    let head = Request::new(()).into_parts().0;
    drop(limit.reserve(&head, 0, None).unwrap().send());
}

/// A chat request whose body weighs `prompt_chars / 4 + 1` prompt tokens ("user" and the
/// content) and `max_tokens` output tokens.
fn chat(prompt_chars: usize, max_tokens: u64) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"m","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(prompt_chars)
    );
    Request::post("http://llm.test/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// When each attempt reached the backend, from the first.
fn arrivals(log: &support::Log) -> Vec<Duration> {
    let all = log.all();
    all.iter().map(|seen| seen.at - all[0].at).collect()
}

/// One a second: a 503 then its retry, which waits for a slot of its own (1 s), not only its
/// 100 ms backoff.
#[tokio::test(start_paused = true)]
async fn retries_are_paced_too() {
    let limit = per_minute(60);
    let (log, backend) = instant(|index, _| Ok(status(if index == 0 { 503 } else { 200 })));
    let client = retries_only()
        .with_backoff(Constant::new(100 * MS))
        .with_rate_limit(limit.clone())
        .layer(backend);

    let response = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(response.status(), 200);
    assert_eq!(arrivals(&log), [Duration::ZERO, Duration::from_secs(1)]);
    assert_eq!(limit.snapshot().requests_available, Some(0));
}

/// A request whose slot is beyond the 2 s wait ends at once, unsent: `RateLimitedLocally`,
/// no attempt, no retry, nothing asked of the budget or the throttle; a gateway answers it with
/// 429, the time until the slot in whole seconds, and "do not retry".
#[tokio::test(start_paused = true)]
async fn a_request_without_a_slot_ends_at_once_answered_429() {
    let limit = per_minute(60);
    for _ in 0..3 {
        spend_a_slot(&limit);
    }
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let budget = RetryBudget::default();
    let before = budget.snapshot();
    let layer = ClientLayer::default()
        .with_budget(budget.clone())
        .with_rate_limit(limit.clone());
    let throttle = layer.throttle().unwrap().clone();
    let client = layer.layer(backend);

    let start = Instant::now();
    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();

    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(error.reason(), Reason::RateLimitedLocally, "{error}");
    assert_eq!((error.attempts(), error.gave_up()), (0, None));
    assert!(!error.outcome().is_retryable());
    let response: http::Response<()> = error.to_response(false);
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    let limited: RateLimited = error.downcast_source().unwrap();
    assert_eq!(limited.cause(), RateLimitCause::Wait);
    assert_eq!(limited.retry_after(), Duration::from_secs(3));
    assert_eq!(log.len(), 0);
    assert_eq!(budget.snapshot(), before);
    assert_eq!(throttle.snapshot().requests, 0);
}

/// A retry whose slot is beyond the wait ends the request with `RateLimitedLocally` after one
/// attempt, and the budget gets its withdrawal back: the retry never went.
#[tokio::test(start_paused = true)]
async fn a_retry_without_a_slot_gives_back_its_withdrawal() {
    let limit = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_max_wait(500 * MS),
    );
    let (log, backend) = instant(|_, _| Ok(status(503)));
    let budget = RetryBudget::default();
    let before = budget.snapshot();
    let client = retries_only()
        .with_budget(budget.clone())
        .with_backoff(Constant::new(100 * MS))
        .with_rate_limit(limit)
        .layer(backend);

    let error = client.oneshot(post(CHAT_URI, CHAT)).await.unwrap_err();

    assert_eq!(error.reason(), Reason::RateLimitedLocally, "{error}");
    assert_eq!(error.attempts(), 1);
    let limited: RateLimited = error.downcast_source().unwrap();
    assert_eq!(limited.retry_after(), 900 * MS);
    assert_eq!(log.len(), 1);
    let after = budget.snapshot();
    assert_eq!((after.withdrawals, after.balance), (0, before.balance));
}

/// With 6,000 tokens a minute (100 a second, a bucket of 100), a request is weighed by its
/// buffered JSON body, prompt and `max_tokens`: 400 bytes of text (100 tokens) and 50 more go
/// from a full bucket and leave 50 in debt, so the same request waits 1.5 s for a full bucket
/// again; one allowing 10,000 output tokens is heavier than a minute's quota, refused at once.
#[tokio::test(start_paused = true)]
async fn requests_are_weighed_by_their_body() {
    let limit = RateLimit::new(RateLimitConfig::default().with_tokens_per_minute(Some(6_000)));
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = retries_only().with_rate_limit(limit.clone()).layer(backend);

    client.clone().oneshot(chat(396, 50)).await.unwrap();
    assert_eq!(limit.snapshot().tokens_available, Some(0));
    client.clone().oneshot(chat(396, 50)).await.unwrap();
    assert_eq!(arrivals(&log), [Duration::ZERO, 1_500 * MS]);

    let error = client.oneshot(chat(396, 10_000)).await.unwrap_err();
    assert_eq!(error.reason(), Reason::RateLimitedLocally);
    let limited: RateLimited = error.downcast_source().unwrap();
    assert_eq!(
        limited.cause(),
        RateLimitCause::TooHeavy {
            tokens: 10_100,
            per_minute: 6_000,
        }
    );
    assert_eq!(log.len(), 2);
}

/// Answers seen through the engine teach the limit: after one stating
/// `x-ratelimit-limit-requests: 60`, requests go at one a second (the first went before the
/// limit was known, so the second finds the bucket full); after one stating a token limit, the
/// body is weighed.
#[tokio::test(start_paused = true)]
async fn the_limit_learns_from_the_answers() {
    let limit = RateLimit::default();
    let (log, backend) =
        instant(|_, _| Ok(reply(200, &[("x-ratelimit-limit-requests", "60")], "{}")));
    let client = retries_only().with_rate_limit(limit.clone()).layer(backend);
    for _ in 0..4 {
        client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();
    }
    assert_eq!(limit.snapshot().requests_per_minute, Some(60));
    let seconds = [0, 0, 1, 2].map(Duration::from_secs);
    assert_eq!(arrivals(&log), seconds);

    let limit = RateLimit::default();
    let (log, backend) =
        instant(|_, _| Ok(reply(200, &[("x-ratelimit-limit-tokens", "6000")], "{}")));
    let client = retries_only().with_rate_limit(limit.clone()).layer(backend);
    for _ in 0..3 {
        client.clone().oneshot(chat(396, 50)).await.unwrap();
    }
    // Weighed 150 tokens from the second on: at once (a full bucket), then 1.5 s later.
    assert_eq!(arrivals(&log), [0, 0, 1_500].map(|ms| ms * MS));
}

/// A 429 with `retry-after: 1` holds the limit until then: a request that came meanwhile waits
/// until 1 s instead of meeting another 429, and the retry goes no earlier.
#[tokio::test(start_paused = true)]
async fn a_429_holds_every_request_until_its_hint() {
    let limit = per_minute(6_000);
    let (log, backend) = instant(|index, _| {
        Ok(if index == 0 {
            reply(429, &[("retry-after", "1")], "")
        } else {
            status(200)
        })
    });
    let client = retries_only().with_rate_limit(limit.clone()).layer(backend);

    let first = tokio::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    tokio::time::sleep(100 * MS).await;
    let second = tokio::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    assert_eq!(second.await.unwrap().unwrap().status(), 200);

    // The request that came meanwhile goes at 1 s; the retry at its hint, with its jitter.
    let arrived = arrivals(&log);
    assert_eq!(arrived.len(), 3);
    assert_eq!(arrived[1], Duration::from_secs(1), "{arrived:?}");
    assert!(arrived[2] >= Duration::from_secs(1), "{arrived:?}");
}

/// An attempt that waited for its slot tells the backend the time left when it goes: two
/// requests with 10 s deadlines, the second paced 1 s: 9,950 ms and 8,950 ms (less the 50 ms
/// margin).
#[tokio::test(start_paused = true)]
async fn the_time_left_is_stamped_when_the_attempt_goes() {
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = ClientLayer::default()
        .without_throttle()
        .with_timeout(Duration::from_secs(10))
        .with_rate_limit(per_minute(60))
        .layer(backend);

    let first = tokio::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    let second = tokio::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();

    let told: Vec<String> = log
        .all()
        .iter()
        .map(|seen| {
            seen.header(X_REQUEST_TIMEOUT_MS.as_str())
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(told, ["9950", "8950"]);
    assert_eq!(arrivals(&log), [Duration::ZERO, Duration::from_secs(1)]);
}

/// Dropping the response future while it waits for its slot gives the slot back: the next
/// request goes at the slot the dropped one had.
#[tokio::test(start_paused = true)]
async fn dropped_while_pacing_the_slot_is_given_back() {
    let limit = per_minute(60);
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let mut client = retries_only().with_rate_limit(limit.clone()).layer(backend);
    client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    let mut pacing = spawn(client.ready().await.unwrap().call(post(CHAT_URI, CHAT)));
    assert_pending!(pacing.poll());
    tokio::time::advance(500 * MS).await;
    assert_pending!(pacing.poll());
    drop(pacing);
    tokio::time::advance(500 * MS).await;
    assert_eq!(limit.snapshot().requests_available, Some(1));
    client.clone().oneshot(post(CHAT_URI, CHAT)).await.unwrap();

    assert_eq!(arrivals(&log), [Duration::ZERO, Duration::from_secs(1)]);
}

/// An open breaker refuses the attempt after its slot came: the slot is given back, at once or
/// after a wait, and the next request gets it.
#[tokio::test(start_paused = true)]
async fn a_breaker_refusal_gives_the_slot_back() {
    let limit = per_minute(60);
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(7));
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = ClientLayer::default()
        .without_throttle()
        .with_breaker(breaker.clone())
        .with_rate_limit(limit.clone())
        .layer(backend.clone());
    let open = |breaker: &CircuitBreaker| {
        let failure = Outcome::retryable(Reason::Unavailable).with_accepted(false);
        for _ in 0..breaker.config().min_calls() {
            breaker
                .try_acquire()
                .unwrap()
                .record(&failure, &HeaderMap::new());
        }
        assert_eq!(breaker.state(), State::Open);
    };

    // Refused at once: the bucket's one slot is still there.
    open(&breaker);
    for _ in 0..5 {
        let error = client
            .clone()
            .oneshot(post(CHAT_URI, CHAT))
            .await
            .unwrap_err();
        assert_eq!(error.reason(), Reason::BreakerOpen);
        assert_eq!(limit.snapshot().requests_available, Some(1));
    }

    // Refused after waiting 1 s for its slot (the breaker opened meanwhile).
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(7));
    let limit = per_minute(60);
    let client = ClientLayer::default()
        .without_throttle()
        .with_breaker(breaker.clone())
        .with_rate_limit(limit.clone())
        .layer(backend);
    spend_a_slot(&limit);
    let waiting = tokio::spawn(client.clone().oneshot(post(CHAT_URI, CHAT)));
    tokio::time::sleep(500 * MS).await;
    open(&breaker);
    let error = waiting.await.unwrap().unwrap_err();
    assert_eq!(error.reason(), Reason::BreakerOpen);
    assert_eq!(limit.snapshot().requests_available, Some(1));
    assert_eq!(log.len(), 0);
}

/// A throttle full of an outage drops most attempts after their slot came: each dropped one
/// gives its slot back, so the slots spent are exactly the attempts sent.
#[tokio::test(start_paused = true)]
async fn a_throttle_refusal_gives_the_slot_back() {
    let limit = per_minute(6_000);
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(5));
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let client = retries_only()
        .with_throttle(throttle.clone())
        .with_rate_limit(limit.clone())
        .layer(backend);
    for _ in 0..100 {
        // A rejection: a permit dropped untold counts as not accepted.
        drop(throttle.try_acquire());
    }
    let mut throttled = 0;
    for _ in 0..50 {
        if let Err(error) = client.clone().oneshot(get()).await {
            assert_eq!(error.reason(), Reason::Throttled);
            throttled += 1;
        }
    }
    assert!(throttled >= 30, "{throttled} of 50 throttled");
    let spent = 100 - limit.snapshot().requests_available.unwrap();
    assert_eq!(spent, log.len() as u64);
}

/// A request whose slot is free now reaches the backend at the first poll, with no timer. (On
/// the real clock: a paused one would hide the millisecond a timer rounds up to.)
#[tokio::test]
async fn a_free_slot_sends_at_the_first_poll() {
    let (log, backend) = instant(|_, _| Ok(status(200)));
    let mut client = ClientLayer::default()
        .with_rate_limit(per_minute(60))
        .layer(backend);
    let mut call = spawn(client.ready().await.unwrap().call(get()));
    assert!(call.poll().is_ready());
    assert_eq!(log.len(), 1);
}
