//! What the engine records through the `metrics` facade (feature `metrics`), read back through a
//! recording implementation of it (`metrics-util`'s debugging recorder), on the paused clock.

#![allow(clippy::unwrap_used)]

mod support;

use std::future::Future;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_breaker::{BreakerConfig, CircuitBreaker, Fallback};
use stormguard_budget::{BudgetConfig, RetryBudget};
use stormguard_classify::LocalAnswer;
use stormguard_jitter::Constant;
use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use stormguard_retry::Hedging;
use stormguard_retry::metrics::{
    ATTEMPT_DURATION, BREAKER_STATE, CONCURRENCY_GROWN, CONCURRENCY_IN_FLIGHT, CONCURRENCY_LIMIT,
    CONCURRENCY_SHRUNK, HEDGES, RATE_LIMIT_HEADROOM, RATE_LIMIT_WAIT, REFUSALS, REQUEST_ATTEMPTS,
    REQUEST_DURATION, RETRIES, STREAMS, THROTTLE_DROP_PROBABILITY,
};
use stormguard_test_kit::post;
use support::{CHAT_URI, Log, body_bytes, planned, reply, retries_only, scripted, status};
use tower::{Layer, ServiceExt};

/// Runs `test` on a paused current-thread runtime with a recorder of its own, and returns what
/// was recorded.
fn recorded<F: Future<Output = ()>>(test: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(test()));
    Recorded(snapshotter.snapshot().into_vec())
}

type Series = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

struct Recorded(Vec<Series>);

impl Recorded {
    /// The series of `kind` named `name` whose labels include all of `labels`.
    fn series(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Vec<&DebugValue> {
        (self.0.iter())
            .filter(|(key, ..)| matches(key, kind, name, labels))
            .map(|(.., value)| value)
            .collect()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        (self.series(MetricKind::Counter, name, labels).into_iter())
            .map(|value| match value {
                DebugValue::Counter(count) => *count,
                other => panic!("{other:?}"),
            })
            .sum()
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let series = self.series(MetricKind::Gauge, name, labels);
        assert!(series.len() <= 1, "{series:?}");
        series.into_iter().next().map(|value| match value {
            DebugValue::Gauge(value) => value.into_inner(),
            other => panic!("{other:?}"),
        })
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let mut values: Vec<f64> = (self.series(MetricKind::Histogram, name, labels).into_iter())
            .flat_map(|value| match value {
                DebugValue::Histogram(values) => values.iter().map(|v| v.into_inner()),
                other => panic!("{other:?}"),
            })
            .collect();
        values.sort_by(f64::total_cmp);
        values
    }
}

fn matches(key: &CompositeKey, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> bool {
    key.kind() == kind
        && key.key().name() == name
        && labels.iter().all(|(label, value)| {
            key.key()
                .labels()
                .any(|have| have.key() == *label && have.value() == *value)
        })
}

const OPENAI: (&str, &str) = ("gen_ai.provider.name", "openai");

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() < 0.002
}

#[test]
fn a_request_answered_on_its_third_attempt() {
    let seen = recorded(|| async {
        let log = Log::default();
        // 1 s per attempt: 503, 503, then 200.
        let backend = scripted(&log, Duration::from_secs(1), |index, _| {
            Ok(status(if index < 2 { 503 } else { 200 }))
        });
        let client = retries_only()
            .with_name("openai")
            .with_backoff(Constant::new(Duration::from_millis(250)))
            .layer(backend);
        let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
        assert_eq!(response.status(), 200);
    });

    let success = [OPENAI, ("outcome", "success")];
    assert_eq!(seen.histogram(REQUEST_ATTEMPTS, &success), [3.0]);
    assert!(
        seen.histogram(REQUEST_ATTEMPTS, &[("outcome", "failure")])
            .is_empty()
    );
    // Three attempts of 1 s and two backoffs of 250 ms.
    let duration = seen.histogram(REQUEST_DURATION, &success);
    assert!(
        duration.len() == 1 && close(duration[0], 3.5),
        "{duration:?}"
    );
    let failed = [
        OPENAI,
        ("http.response.status_code", "503"),
        ("error.type", "unavailable"),
    ];
    let attempts = seen.histogram(ATTEMPT_DURATION, &failed);
    assert!(
        attempts.len() == 2 && attempts.iter().all(|s| close(*s, 1.0)),
        "{attempts:?}"
    );
    let answered = seen.histogram(
        ATTEMPT_DURATION,
        &[OPENAI, ("http.response.status_code", "200")],
    );
    assert_eq!(answered.len(), 1);
    assert_eq!(
        seen.counter(RETRIES, &[OPENAI, ("reason", "unavailable")]),
        2
    );
    assert_eq!(seen.counter(REFUSALS, &[]), 0);
}

#[test]
fn an_outage_counts_what_the_budget_and_the_throttle_refused() {
    const REQUESTS: usize = 200;
    let throttle = AdaptiveThrottle::default();
    let shared = throttle.clone();
    let last = std::sync::Arc::new(std::sync::Mutex::new(0.0));
    let at_end = last.clone();
    let seen = recorded(|| async move {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_millis(100), |_, _| Ok(status(503)));
        // A budget with nothing in it: no retry is ever granted.
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let client = retries_only()
            .with_name("openai")
            .with_budget(budget)
            .with_throttle(shared)
            .layer(backend);
        let mut refused = 0;
        for _ in 0..REQUESTS {
            match client.clone().oneshot(post(CHAT_URI, "{}")).await {
                Ok(response) => assert_eq!(response.status(), 503),
                Err(error) => {
                    assert_eq!(error.attempts(), 0);
                    refused += 1;
                }
            }
        }
        assert_eq!(refused + log.len(), REQUESTS);
        assert!(refused > REQUESTS / 2, "{refused}");
        *at_end.lock().unwrap() = throttle.probability();
    });

    let budget = seen.counter(REFUSALS, &[OPENAI, ("cause", "budget")]);
    let throttled = seen.counter(REFUSALS, &[OPENAI, ("cause", "throttle")]);
    assert_eq!(budget + throttled, REQUESTS as u64);
    let failed = seen.histogram(REQUEST_ATTEMPTS, &[OPENAI, ("outcome", "failure")]);
    let refused = seen.histogram(REQUEST_ATTEMPTS, &[OPENAI, ("outcome", "refused")]);
    assert_eq!(failed.len() as u64, budget);
    assert!(failed.iter().all(|attempts| *attempts == 1.0));
    assert_eq!(refused.len() as u64, throttled);
    assert!(refused.iter().all(|attempts| *attempts == 0.0));
    assert_eq!(seen.counter(RETRIES, &[]), 0);
    // The gauge holds what the throttle said at the last attempt.
    let probability = seen.gauge(THROTTLE_DROP_PROBABILITY, &[OPENAI]).unwrap();
    assert!(probability > 0.5, "{probability}");
    assert!(close(probability, *last.lock().unwrap()), "{probability}");
}

#[test]
fn an_open_breaker_shows_in_its_gauge_and_its_refusals() {
    let seen = recorded(|| async {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_millis(10), |_, _| Ok(status(503)));
        let breaker =
            CircuitBreaker::new(BreakerConfig::default().with_consecutive_failures(Some(3)));
        let client = retries_only()
            .with_name("openai")
            .with_max_attempts(1)
            .with_breaker(breaker)
            .layer(backend);
        for _ in 0..10 {
            let _ = client.clone().oneshot(post(CHAT_URI, "{}")).await;
        }
        assert_eq!(log.len(), 3);
    });
    assert_eq!(seen.gauge(BREAKER_STATE, &[OPENAI]), Some(2.0));
    assert_eq!(seen.counter(REFUSALS, &[OPENAI, ("cause", "breaker")]), 7);
    assert_eq!(
        seen.histogram(REQUEST_ATTEMPTS, &[OPENAI, ("outcome", "refused")])
            .len(),
        7
    );
}

#[test]
fn the_concurrency_limit_shows_its_shrinks_in_its_gauges_and_counters() {
    let seen = recorded(|| async {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_millis(10), |_, _| Ok(status(429)));
        let limit = stormguard_concurrency::ConcurrencyLimit::default();
        let client = retries_only()
            .with_name("openai")
            .with_max_attempts(1)
            .with_concurrency(limit)
            .layer(backend);
        // Three 429s, each to an attempt sent after the shrink before it: 20 -> 18 -> 16 -> 14.
        for _ in 0..3 {
            let _ = client.clone().oneshot(post(CHAT_URI, "{}")).await;
        }
        assert_eq!(log.len(), 3);
    });
    assert_eq!(seen.gauge(CONCURRENCY_LIMIT, &[OPENAI]), Some(14.0));
    assert_eq!(seen.gauge(CONCURRENCY_IN_FLIGHT, &[OPENAI]), Some(0.0));
    assert_eq!(seen.counter(CONCURRENCY_SHRUNK, &[OPENAI]), 3);
    assert_eq!(seen.counter(CONCURRENCY_GROWN, &[OPENAI]), 0);
}

#[test]
fn a_retry_the_breaker_refuses_is_no_retry_and_its_fallback_is_counted_as_one() {
    let seen = recorded(|| async {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_millis(10), |_, _| Ok(status(503)));
        // One failure opens it: the first request's retry is refused, the second is not sent.
        let breaker =
            CircuitBreaker::new(BreakerConfig::default().with_consecutive_failures(Some(1)));
        let fallback = Fallback::new(|_, _| http::Response::new(bytes::Bytes::new()));
        let client = retries_only()
            .with_name("openai")
            .with_breaker(breaker)
            .with_fallback(fallback)
            .layer(backend);
        for _ in 0..2 {
            let response = client.clone().oneshot(post(CHAT_URI, "{}")).await.unwrap();
            assert!(response.extensions().get::<LocalAnswer>().is_some());
        }
        assert_eq!(log.len(), 1);
    });
    // A retry was decided, but none was sent.
    assert_eq!(seen.counter(RETRIES, &[]), 0);
    assert_eq!(seen.counter(REFUSALS, &[OPENAI, ("cause", "breaker")]), 2);
    // Both requests were answered by the fallback: one after its attempt, one without any.
    let fallback = [OPENAI, ("outcome", "fallback")];
    assert_eq!(seen.histogram(REQUEST_ATTEMPTS, &fallback), [0.0, 1.0]);
    for outcome in ["success", "failure", "refused"] {
        assert!(
            seen.histogram(REQUEST_ATTEMPTS, &[("outcome", outcome)])
                .is_empty(),
            "{outcome}"
        );
    }
    let breaker_open = [
        OPENAI,
        ("outcome", "fallback"),
        ("error.type", "breaker_open"),
    ];
    assert_eq!(seen.histogram(REQUEST_DURATION, &breaker_open).len(), 2);
}

#[test]
fn rate_limit_waits_and_headroom() {
    let seen = recorded(|| async {
        let log = Log::default();
        let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(200)));
        // 60 a minute, a burst of 1 s: one at once, then one a second.
        let limit = RateLimit::new(
            RateLimitConfig::default()
                .with_requests_per_minute(Some(60))
                .with_burst(Duration::from_secs(1)),
        );
        let client = retries_only()
            .with_name("openai")
            .with_rate_limit(limit)
            .layer(backend);
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..3 {
            calls.spawn(client.clone().oneshot(post(CHAT_URI, "{}")));
        }
        while let Some(call) = calls.join_next().await {
            assert_eq!(call.unwrap().unwrap().status(), 200);
        }
    });
    let waits = seen.histogram(RATE_LIMIT_WAIT, &[OPENAI]);
    assert_eq!(waits.len(), 3, "{waits:?}");
    for (wait, expected) in waits.iter().zip([0.0, 1.0, 2.0]) {
        assert!(close(*wait, expected), "{waits:?}");
    }
    let headroom = seen.gauge(RATE_LIMIT_HEADROOM, &[OPENAI, ("dimension", "requests")]);
    assert_eq!(headroom, Some(0.0));
}

const EVENT_STREAM: (&str, &str) = ("content-type", "text/event-stream");
const CONTENT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const ERROR: &str = "data: {\"error\":{\"type\":\"server_error\",\"message\":\"overloaded\"}}\n\n";

#[test]
fn streams_by_outcome() {
    let seen = recorded(|| async {
        let log = Log::default();
        // The first stream fails before its content and is retried; the second completes; the
        // third breaks after its content.
        let backend = scripted(&log, Duration::ZERO, |index, _| {
            let body = match index {
                0 => ERROR.to_owned(),
                1 => format!("{CONTENT}data: [DONE]\n\n"),
                _ => format!("{CONTENT}{ERROR}"),
            };
            Ok(reply(200, &[EVENT_STREAM], &body))
        });
        let client = retries_only()
            .with_name("openai")
            .with_backoff(Constant::new(Duration::from_millis(10)))
            .layer(backend);
        for _ in 0..2 {
            let response = client.clone().oneshot(post(CHAT_URI, "{}")).await.unwrap();
            assert_eq!(response.status(), 200);
            let _ = http_body_util::BodyExt::collect(response.into_body()).await;
        }
        assert_eq!(log.len(), 3);
    });
    let count = |outcome| seen.counter(STREAMS, &[OPENAI, ("outcome", outcome)]);
    assert_eq!(count("failed_before_content"), 1);
    assert_eq!(count("complete"), 1);
    assert_eq!(count("interrupted"), 1);
    assert_eq!(seen.counter(RETRIES, &[OPENAI]), 1);
}

#[test]
fn a_layer_without_a_name_is_unknown() {
    let seen = recorded(|| async {
        let (_log, backend) = support::instant(|_, _| Ok(status(200)));
        let response = retries_only()
            .layer(backend)
            .oneshot(post(CHAT_URI, "{}"))
            .await;
        assert_eq!(body_bytes(response.unwrap()).await.len(), 0);
    });
    let attempts = seen.histogram(REQUEST_ATTEMPTS, &[("gen_ai.provider.name", "unknown")]);
    assert_eq!(attempts, [1.0]);
}

#[test]
fn each_answer_s_tokens_are_recorded_by_type_and_attempt_once_read() {
    let seen = recorded(|| async {
        // A 503 first (its attempt says nothing of tokens), then the whole answer.
        let log = Log::default();
        let backend = scripted(&log, Duration::from_millis(10), |index, _| {
            Ok(match index {
                0 => status(503),
                _ => reply(
                    200,
                    &[("content-type", "application/json")],
                    r#"{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#,
                ),
            })
        });
        let client = retries_only()
            .with_name("openai")
            .with_backoff(Constant::new(Duration::ZERO))
            .layer(backend.clone());
        let response = client.clone().oneshot(post(CHAT_URI, "{}")).await.unwrap();
        body_bytes(response).await;

        // A stream: Anthropic's usage in `message_start` (input) and `message_delta` (output).
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let streaming = scripted(&Log::default(), Duration::from_millis(10), move |_, _| {
            Ok(reply(200, &[("content-type", "text/event-stream")], stream))
        });
        let client = retries_only().with_name("openai").layer(streaming);
        let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
        body_bytes(response).await;
    });
    let tokens = |kind: &str| {
        let labels = [
            OPENAI,
            ("gen_ai.token.type", kind),
            ("stormguard.attempt", "answer"),
        ];
        seen.histogram(stormguard_retry::metrics::TOKEN_USAGE, &labels)
    };
    assert_eq!(tokens("input"), [9.0, 12.0]);
    assert_eq!(tokens("output"), [5.0, 30.0]);
}

/// Hedges are counted apart from retries, by what became of them: one that won, one cancelled,
/// one that failed, one the budget refused, one the breaker's bulkhead refused.
#[test]
fn hedges_by_what_became_of_them() {
    const SECOND: Duration = Duration::from_secs(1);
    let seen = recorded(|| async {
        let hedging = Hedging::after(SECOND);
        let run = |plan: Vec<(Duration, u16)>, layer: stormguard_retry::ClientLayer| async move {
            let client = layer
                .with_name("openai")
                .with_hedging(hedging)
                .layer(planned(&Log::default(), &plan));
            client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
        };
        let ms = Duration::from_millis;
        // Won: the first would take 10 s, the hedge answers 100 ms after it went.
        run(
            vec![(Duration::from_secs(10), 200), (ms(100), 200)],
            retries_only(),
        )
        .await;
        // Cancelled: the first answers at 1.5 s.
        run(
            vec![(ms(1500), 200), (Duration::from_secs(10), 200)],
            retries_only(),
        )
        .await;
        // Failed: the hedge answers 503 at once, the first answers at 3 s.
        run(
            vec![(Duration::from_secs(3), 200), (Duration::ZERO, 503)],
            retries_only(),
        )
        .await;
        // The budget refuses it: no floor, no successes.
        let spent = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        run(vec![(ms(1500), 200)], retries_only().with_budget(spent)).await;
        // The bulkhead (one in flight) refuses it.
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_max_in_flight(Some(1)));
        run(vec![(ms(1500), 200)], retries_only().with_breaker(breaker)).await;
    });
    let hedges = |outcome| seen.counter(HEDGES, &[OPENAI, ("outcome", outcome)]);
    assert_eq!(hedges("sent"), 3);
    assert_eq!(hedges("won"), 1);
    assert_eq!(hedges("cancelled"), 1);
    assert_eq!(hedges("failed"), 1);
    assert_eq!(hedges("budget"), 1);
    assert_eq!(hedges("refused"), 1);
    assert_eq!(seen.counter(RETRIES, &[]), 0, "a hedge is no retry");
    assert_eq!(seen.counter(REFUSALS, &[]), 0, "no request was refused");
    // Two attempts each for the three hedged requests, one for the two not hedged.
    let attempts = seen.histogram(REQUEST_ATTEMPTS, &[OPENAI, ("outcome", "success")]);
    assert_eq!(attempts, [1.0, 1.0, 2.0, 2.0, 2.0]);
}
