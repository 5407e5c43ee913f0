//! A provider's 429 with a `Retry-After` behind the axum gateway, the stack of the game day: a
//! hint that fits the caller's deadline (and the hint maximum) is waited out and the request
//! retried, so the caller gets the retry's answer; one that does not fit reaches the caller at
//! once, with the hint.
//!
//! A retry after a hint is a retry like any other: it draws on the gateway's retry budget (one
//! retry per ten successes in the last 10 s, and a floor of 10). The last tests play the game
//! day's rate-limit phase in miniature: the hinted 429s the budget can pay for are retried, the
//! others reach their callers at once with their hint; and after an overload that spent the
//! budget, as in the game day, none is retried.
//!
//! On tokio's paused clock: the waits are measured, not slept.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::StatusCode;
use http::header::RETRY_AFTER;
use stormguard::chaos::{ChaosLayer, ErrorAnswer, Fault as ChaosFault, FaultKind};
use stormguard::classify::headers::{X_REQUEST_TIMEOUT_MS, X_SHOULD_RETRY};
use stormguard_examples::gateway::{Route, Running, prometheus};
use stormguard_examples::mock::{Fault, MockConfig};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

const BODY: &str =
    r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4}"#;

/// The game day's deadline.
const DEADLINE_MS: &str = "3000";

/// What a caller with no retries of its own saw: the answer, and how long it took.
async fn call(gateway: &Running, deadline_ms: &str) -> (reqwest::Response, Duration) {
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(&gateway.url)
        .header("content-type", "application/json")
        .header(X_REQUEST_TIMEOUT_MS, deadline_ms)
        .body(BODY)
        .send()
        .await
        .unwrap();
    (response, started.elapsed())
}

/// Requests the gateway's engine named `provider` gave up on or refused for `cause` (its
/// `stormguard.refusals` counter, from the process's recorder).
fn refusals(provider: &str, cause: &str) -> f64 {
    let text = prometheus::install().unwrap().render();
    let labels = [("gen_ai_provider_name", provider), ("cause", cause)];
    prometheus::sum(&text, "stormguard_refusals", &labels)
}

/// A mock provider whose first answer is a 429 asking for `retry_after`, and healthy after.
fn limited_once(retry_after: Duration) -> MockConfig {
    MockConfig {
        first_faults: vec![Fault::RateLimited { retry_after }],
        ..MockConfig::healthy()
    }
}

/// `Retry-After: 1` with 3 s to go: the gateway waits the second and the retry answers.
#[tokio::test(start_paused = true)]
async fn a_hint_that_fits_the_deadline_is_waited_out_and_retried() {
    let provider = limited_once(Duration::from_secs(1));
    let gateway = Running::start("gateway-hint-fits", provider, Route::Direct)
        .await
        .unwrap();
    let (response, took) = call(&gateway, DEADLINE_MS).await;
    let status = response.status();
    let (stats, _) = gateway.stop().await;
    assert_eq!(status, 200, "{:?}", response.headers());
    assert_eq!(stats.attempts, 2);
    // The second asked, plus at most 10% of jitter.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_millis(1_200), "{took:?}");
}

/// The same 429, injected by the chaos layer as the game day injects it (its first half second).
#[tokio::test(start_paused = true)]
async fn a_chaos_429_that_fits_the_deadline_is_waited_out_and_retried() {
    let limited = ErrorAnswer::RateLimited {
        retry_after: Some(Duration::from_secs(1)),
    };
    let fault = ChaosFault::new(FaultKind::Answer(limited), 1.0)
        .with_duration(Some(Duration::from_millis(500)));
    let chaos = ChaosLayer::new().with_seed(7).with_fault(fault);
    let loopback = ([127, 0, 0, 1], 0).into();
    let provider = MockConfig::healthy();
    let gateway = Running::start_with(
        loopback,
        "gateway-hint-chaos",
        provider,
        Route::Direct,
        chaos,
    )
    .await
    .unwrap();
    let (response, took) = call(&gateway, DEADLINE_MS).await;
    let status = response.status();
    let injected = gateway.chaos.snapshot().faults[0].injected;
    let (stats, _) = gateway.stop().await;
    assert_eq!(status, 200, "{:?}", response.headers());
    assert_eq!((injected, stats.attempts), (1, 1));
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_millis(1_200), "{took:?}");
}

/// `Retry-After: 5` with 3 s to go: no wait, the caller gets the 429 at once, with its hint,
/// marked final.
#[tokio::test(start_paused = true)]
async fn a_hint_beyond_the_deadline_reaches_the_caller_at_once_with_the_hint() {
    let provider = limited_once(Duration::from_secs(5));
    let gateway = Running::start("gateway-hint-late", provider, Route::Direct)
        .await
        .unwrap();
    let (response, took) = call(&gateway, DEADLINE_MS).await;
    let (stats, _) = gateway.stop().await;
    assert_eq!(refusals("gateway-hint-late", "deadline"), 1.0);
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()[RETRY_AFTER], "5");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(stats.attempts, 1);
    assert!(took < Duration::from_millis(100), "{took:?}");
}

/// `Retry-After: 120`, above the hint maximum (60 s): the caller gets the 429 at once, with its
/// hint. (The gateway's upstream timeout of 5 s would not fit it either; the maximum is asked
/// first, and is what the engine counts.)
#[tokio::test(start_paused = true)]
async fn a_hint_above_the_maximum_reaches_the_caller_at_once_with_the_hint() {
    let provider = limited_once(Duration::from_secs(120));
    let gateway = Running::start("gateway-hint-long", provider, Route::Direct)
        .await
        .unwrap();
    let (response, took) = call(&gateway, "600000").await;
    let (stats, _) = gateway.stop().await;
    assert_eq!(refusals("gateway-hint-long", "hint"), 1.0);
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()[RETRY_AFTER], "120");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(stats.attempts, 1);
    assert!(took < Duration::from_millis(100), "{took:?}");
}

/// What one caller saw of a call sent with the others: its status, its `Retry-After` and
/// `x-should-retry`, how long it took, and its body.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    retry_after: Option<String>,
    should_retry: Option<String>,
    took: Duration,
    body: String,
}

/// `calls` callers, each with the game day's deadline, all at once: what each saw.
async fn together(gateway: &Running, calls: usize) -> Vec<Seen> {
    let client = reqwest::Client::new();
    let mut set = JoinSet::new();
    for _ in 0..calls {
        let request = client
            .post(&gateway.url)
            .header("content-type", "application/json")
            .header(X_REQUEST_TIMEOUT_MS, DEADLINE_MS)
            .body(BODY);
        set.spawn(async move {
            let started = Instant::now();
            let response = request.send().await.unwrap();
            let header = |name: http::HeaderName| {
                let value = response.headers().get(name)?;
                Some(value.to_str().unwrap().to_owned())
            };
            let took = started.elapsed();
            Seen {
                status: response.status(),
                retry_after: header(RETRY_AFTER),
                should_retry: header(X_SHOULD_RETRY),
                took,
                body: response.text().await.unwrap(),
            }
        });
    }
    set.join_all().await
}

/// `at` after the origin of `gateway`'s chaos layer, from which its faults' schedules count.
async fn until(gateway: &Running, at: Duration) {
    sleep_until(gateway.chaos.origin() + at).await;
}

/// The game day's phases, on a shorter schedule: healthy until 1 s, overloaded (every call 529)
/// until 1.5 s if `overload`, then every call answered 429 with `Retry-After: 1` until 2 s, by
/// the chaos layer under the gateway's upstream client.
async fn game_day(name: &str, overload: bool) -> Running {
    let during = |answer, from: u64, to: u64| {
        ChaosFault::new(FaultKind::Answer(answer), 1.0)
            .with_start(Duration::from_millis(from))
            .with_duration(Some(Duration::from_millis(to - from)))
    };
    let limited = ErrorAnswer::RateLimited {
        retry_after: Some(Duration::from_secs(1)),
    };
    let mut chaos = ChaosLayer::new().with_fault(during(limited, 1_500, 2_000));
    if overload {
        chaos = chaos.with_fault(during(ErrorAnswer::Overloaded, 1_000, 1_500));
    }
    let loopback = ([127, 0, 0, 1], 0).into();
    let provider = MockConfig::healthy();
    Running::start_with(loopback, name, provider, Route::Direct, chaos)
        .await
        .unwrap()
}

/// The healthy phase: 100 calls from 0.9 s, one after the other, each answered. They put 100
/// successes in the retry budget (10 retries; with its floor of 10, 20) and 100 accepts in the
/// adaptive throttle's 2 s window (which the 429s, not accepted, would tip otherwise).
async fn healthy_phase(gateway: &Running) {
    until(gateway, Duration::from_millis(900)).await;
    for _ in 0..100 {
        let (response, _) = call(gateway, DEADLINE_MS).await;
        assert_eq!(response.status(), 200);
    }
    let elapsed = gateway.chaos.origin().elapsed();
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
}

/// With 100 successes in the budget's window, 30 callers answered 429 with `Retry-After: 1`: the
/// budget pays for 20 retries (10% of the successes and its floor of 10), each sent after the
/// second asked and answered; the other 10 callers get the 429 at once, with its hint, marked
/// final.
#[tokio::test(start_paused = true)]
async fn the_budget_pays_for_the_hinted_retries_it_can_and_the_rest_get_the_hint() {
    let gateway = game_day("gateway-hint-share", false).await;
    healthy_phase(&gateway).await;
    until(&gateway, Duration::from_millis(1_500)).await;
    let seen = together(&gateway, 30).await;
    let limited = gateway.chaos.snapshot().faults[0].injected;
    let (stats, _) = gateway.stop().await;

    let (retried, handed_back): (Vec<&Seen>, Vec<&Seen>) =
        seen.iter().partition(|seen| seen.status == 200);
    assert_eq!((retried.len(), handed_back.len()), (20, 10), "{seen:?}");
    for seen in retried {
        assert!(seen.took >= Duration::from_secs(1), "{seen:?}");
        assert!(seen.took < Duration::from_millis(1_200), "{seen:?}");
    }
    for seen in handed_back {
        assert_eq!(seen.status, 429, "{seen:?}");
        assert_eq!(seen.retry_after.as_deref(), Some("1"), "{seen:?}");
        assert_eq!(seen.should_retry.as_deref(), Some("false"), "{seen:?}");
        assert!(seen.body.contains("rate_limit_exceeded"), "{seen:?}");
        assert!(seen.took < Duration::from_millis(100), "{seen:?}");
    }
    // 30 injected 429s; the provider saw the 100 healthy calls and the 20 retries.
    assert_eq!((limited, stats.attempts), (30, 120));
    assert_eq!(refusals("gateway-hint-share", "budget"), 10.0);
}

/// The game day's order: an overload spends the budget on its retries (10 callers answered 529,
/// each tried 3 times: 20 retries), and the hinted 429s that follow find it empty. No retry,
/// every caller gets the 429 at once with its hint: what the game day's callers saw in its
/// rate-limit phase.
#[tokio::test(start_paused = true)]
async fn after_an_overload_spent_the_budget_the_hinted_429s_are_handed_back_at_once() {
    let gateway = game_day("gateway-hint-spent", true).await;
    healthy_phase(&gateway).await;
    until(&gateway, Duration::from_secs(1)).await;
    let overloaded = together(&gateway, 10).await;
    assert!(
        overloaded.iter().all(|seen| seen.status == 529),
        "{overloaded:?}"
    );
    until(&gateway, Duration::from_millis(1_500)).await;
    let seen = together(&gateway, 30).await;
    let injected: Vec<u64> = (gateway.chaos.snapshot().faults.iter())
        .map(|fault| fault.injected)
        .collect();
    let budget = gateway.health.to_json()["budget"].clone();
    let (stats, _) = gateway.stop().await;

    for seen in &seen {
        assert_eq!(seen.status, 429, "{seen:?}");
        assert_eq!(seen.retry_after.as_deref(), Some("1"), "{seen:?}");
        assert_eq!(seen.should_retry.as_deref(), Some("false"), "{seen:?}");
        assert!(seen.body.contains("rate_limit_exceeded"), "{seen:?}");
        assert!(seen.took < Duration::from_millis(100), "{seen:?}");
    }
    // 30 429s, 30 529s (3 attempts of 10 calls); the provider saw the healthy calls only.
    assert_eq!(injected, [30, 30]);
    assert_eq!(stats.attempts, 100);
    // The overload's 20 retries spent it; each of the 30 hinted retries was refused.
    assert_eq!(budget["withdrawals"], 20, "{budget}");
    assert_eq!(budget["rejected"], 30, "{budget}");
    assert_eq!(refusals("gateway-hint-spent", "budget"), 30.0);
}
