//! The state machine through the public API, on a paused clock: what opens the breaker and what
//! does not, how long it stays open, how probes close it or open it again, and what its
//! refusals and snapshots say.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use http::HeaderMap;
use http::Response;
use stormguard_breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, CircuitBreaker, OpenCause, Rejected, State,
};
use stormguard_classify::Permit;
use stormguard_classify::{GrpcCode, LlmClassifier, Outcome, Reason};

const SECOND: Duration = Duration::from_secs(1);

/// A 503: the backend did not accept the attempt.
const UNAVAILABLE: Outcome = Outcome::retryable(Reason::Unavailable).with_accepted(false);

/// Acquires and records `n` attempts that ended with `outcome`, at the current instant.
fn record(breaker: &CircuitBreaker, outcome: Outcome, n: u32) {
    for _ in 0..n {
        breaker
            .try_acquire()
            .unwrap()
            .record(&outcome, &HeaderMap::new());
    }
}

/// The refusal of the next attempt, which must be refused because the breaker is open.
fn refusal(breaker: &CircuitBreaker) -> BreakerOpen {
    match breaker.try_acquire() {
        Err(Rejected::Open(open)) => open,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The next attempt, which must be let through as a probe.
fn probe(breaker: &CircuitBreaker) -> BreakerPermit {
    let permit = breaker.try_acquire().unwrap();
    assert!(permit.is_probe(), "{breaker:?}");
    permit
}

/// The open wait just drawn: the time left right after the breaker opened.
fn open_wait(breaker: &CircuitBreaker) -> Duration {
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Open, "{snapshot:?}");
    snapshot.retry_after.unwrap()
}

/// Asserts `wait` lies in `[base, 1.25 * base)`: the configured wait stretched by 0 to 25%.
fn assert_jittered(wait: Duration, base: Duration) {
    assert!(
        wait >= base && wait < base.mul_f64(1.25),
        "wait {wait:?} outside [{base:?}, 1.25 * {base:?})"
    );
}

/// With 20 calls at least and a failure ratio of 50%: 19 failed calls never open the breaker,
/// 10 failures among 20 calls do, whatever their order, and 9 among 20 do not; 11 among 22 do.
#[tokio::test(start_paused = true)]
async fn opens_exactly_at_the_failure_ratio_over_min_calls() {
    let config = BreakerConfig::default().with_seed(1);

    let breaker = CircuitBreaker::new(config);
    record(&breaker, UNAVAILABLE, 19);
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!((snapshot.calls, snapshot.failures), (19, 19));
    record(&breaker, UNAVAILABLE, 1);
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!(snapshot.cause, Some(OpenCause::Failures));
    assert_eq!(snapshot.opened, 1);

    // 10 of 20, the failures last or first: open at the 20th call, not before.
    for failures_first in [false, true] {
        let breaker = CircuitBreaker::new(config);
        let order = if failures_first {
            [UNAVAILABLE, Outcome::success()]
        } else {
            [Outcome::success(), UNAVAILABLE]
        };
        record(&breaker, order[0], 10);
        record(&breaker, order[1], 9);
        assert_eq!(breaker.state(), State::Closed, "{breaker:?}");
        record(&breaker, order[1], 1);
        let snapshot = breaker.snapshot();
        assert_eq!(
            snapshot.state,
            State::Open,
            "failures first: {failures_first}"
        );
        assert_eq!((snapshot.calls, snapshot.failures), (20, 10));
    }

    // 9 of 20, in any order, stay closed; 10 of 21 too; 11 of 22 open.
    for pattern in [
        "FFFFFFFFFSSSSSSSSSSS",
        "SSSSSSSSSSSFFFFFFFFF",
        "FSFSFSFSFSFSFSFSFSSS",
    ] {
        let breaker = CircuitBreaker::new(config);
        for call in pattern.chars() {
            let outcome = if call == 'F' {
                UNAVAILABLE
            } else {
                Outcome::success()
            };
            record(&breaker, outcome, 1);
        }
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, State::Closed, "{pattern}");
        assert_eq!((snapshot.calls, snapshot.failures), (20, 9));
        record(&breaker, UNAVAILABLE, 1);
        assert_eq!(breaker.state(), State::Closed, "{pattern}: 10 of 21");
        record(&breaker, UNAVAILABLE, 1);
        assert_eq!(breaker.state(), State::Open, "{pattern}: 11 of 22");
    }
}

/// Outcomes the backend accepted or that are not its health's business: rate limits (with or
/// without `Retry-After`, gRPC's `RESOURCE_EXHAUSTED`), fatal 4xx, an accepted conflict.
const HEALTHY: [Outcome; 10] = [
    Outcome::success(),
    Outcome::retryable(Reason::RateLimited).with_accepted(false),
    Outcome::retryable(Reason::RateLimited)
        .with_accepted(false)
        .with_retry_after(Some(Duration::from_secs(20))),
    Outcome::retryable(Reason::Grpc(GrpcCode::ResourceExhausted)).with_accepted(false),
    Outcome::fatal(Reason::BadRequest),
    Outcome::fatal(Reason::QuotaExhausted),
    Outcome::fatal(Reason::ContextTooLong),
    Outcome::fatal(Reason::ContentFiltered),
    Outcome::fatal(Reason::Unauthorized),
    Outcome::retryable(Reason::Conflict).with_accepted(true),
];

/// Refusals of local layers, which never reached the backend.
const UNSENT: [Outcome; 4] = [
    Outcome::fatal(Reason::Throttled).with_accepted(false),
    Outcome::fatal(Reason::RetryBudgetExhausted).with_accepted(false),
    Outcome::fatal(Reason::BreakerOpen).with_accepted(false),
    Outcome::fatal(Reason::BulkheadFull).with_accepted(false),
];

/// Health failures, each with whether it is an answer: 5xx, 529, transport errors, the server
/// saying not to retry; timeouts are no answer.
const FAILED: [(Outcome, bool); 8] = [
    (UNAVAILABLE, true),
    (Outcome::retryable(Reason::Overloaded), true),
    (Outcome::retryable(Reason::ServerError), true),
    (Outcome::retryable(Reason::Transport), true),
    (
        Outcome::retryable(Reason::Grpc(GrpcCode::Unavailable)),
        true,
    ),
    (
        Outcome::fatal(Reason::ServerSaidNoRetry).with_accepted(false),
        true,
    ),
    (Outcome::retryable(Reason::Timeout), false),
    (
        Outcome::retryable(Reason::Grpc(GrpcCode::DeadlineExceeded)),
        false,
    ),
];

/// Only what the backend did not accept is a health failure. A rate limit is the rate limiter's
/// business, a fatal 4xx is the caller's mistake: 100 of them, over the minimum of 20 calls,
/// are counted as calls and never open the breaker. Refusals of local layers (throttle, budget,
/// another breaker, a bulkhead) never reached the backend: not even counted. 5xx, 529, timeouts
/// and transport errors open it at the 20th; a timeout is counted, but is no answer.
#[tokio::test(start_paused = true)]
async fn only_what_the_backend_did_not_accept_is_a_health_failure() {
    for outcome in HEALTHY {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(2));
        record(&breaker, outcome, 100);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, State::Closed, "{outcome}");
        assert_eq!(
            (
                snapshot.calls,
                snapshot.failures,
                snapshot.answers,
                snapshot.opened
            ),
            (100, 0, 100, 0),
            "{outcome}"
        );
    }

    for outcome in UNSENT {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(3));
        record(&breaker, outcome, 100);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, State::Closed, "{outcome}");
        assert_eq!(
            (
                snapshot.calls,
                snapshot.failures,
                snapshot.answers,
                snapshot.in_flight
            ),
            (0, 0, 0, 0),
            "{outcome}"
        );
    }

    for (outcome, is_answer) in FAILED {
        assert!(!outcome.is_accepted());
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(4));
        record(&breaker, outcome, 19);
        assert_eq!(breaker.state(), State::Closed, "{outcome}");
        record(&breaker, outcome, 1);
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, State::Open, "{outcome}");
        let answers = if is_answer { 20 } else { 0 };
        assert_eq!(
            (snapshot.calls, snapshot.failures, snapshot.answers),
            (20, 20, answers),
            "{outcome}"
        );
    }
}

/// OpenAI's rate limit: a 429 that a later request may pass.
const OPENAI_RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o on tokens per min (TPM)","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
/// OpenAI's answer when the quota is spent: a final 429.
const OPENAI_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
/// OpenAI's answer to a prompt that does not fit.
const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
/// Anthropic's answer when it is overloaded.
const ANTHROPIC_OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

/// Real responses, judged by the default `LlmClassifier` from their status, headers and error
/// body: 20 server failures (500, 502, 503, 504, 529, a 503 saying `x-should-retry: false`)
/// open the breaker; 20 rate limits, spent quotas, bad requests or successes do not.
#[tokio::test(start_paused = true)]
async fn real_responses_judged_by_the_llm_classifier() {
    let cases = [
        (500, None, "", true),
        (502, None, "<html>bad gateway</html>", true),
        (503, Some(("retry-after", "2")), "", true),
        (503, Some(("x-should-retry", "false")), "", true),
        (504, None, "", true),
        (529, None, ANTHROPIC_OVERLOADED, true),
        (429, Some(("retry-after", "3")), OPENAI_RATE_LIMIT, false),
        (429, None, OPENAI_QUOTA, false),
        (400, None, OPENAI_CONTEXT, false),
        (401, None, "", false),
        (404, None, "", false),
        (422, None, "", false),
        (200, None, "{}", false),
    ];
    for (status, header, body, opens) in cases {
        let mut response = Response::builder().status(status);
        if let Some((name, value)) = header {
            response = response.header(name, value);
        }
        let (parts, ()) = response.body(()).unwrap().into_parts();
        let outcome = LlmClassifier::default().classify_http(&parts, body.as_bytes());
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(5));
        record(&breaker, outcome, 20);
        let snapshot = breaker.snapshot();
        assert_eq!(
            snapshot.state == State::Open,
            opens,
            "{status} {body}: {outcome}"
        );
        assert_eq!(snapshot.failures, if opens { 20 } else { 0 }, "{status}");
    }
}

/// Failures leave the 10 s window a slice (1 s) at a time: 10 failures recorded at 0 s still
/// count at 9.9 s (with 9 successes and one more failure, 11 of 20 calls failed: open) and no
/// longer at 10 s (1 failure of 10 calls: closed). Failures recorded at 1 s still count at
/// 10 s and are gone at 11 s.
#[tokio::test(start_paused = true)]
async fn failures_older_than_the_window_no_longer_count() {
    let config = BreakerConfig::default().with_seed(6);
    for (at, counted, opens) in [
        (Duration::from_millis(9_900), 10, true),
        (Duration::from_millis(9_999), 10, true),
        (Duration::from_millis(10_000), 0, false),
        (Duration::from_secs(25), 0, false),
    ] {
        let breaker = CircuitBreaker::new(config);
        record(&breaker, UNAVAILABLE, 10);
        tokio::time::advance(at).await;
        let snapshot = breaker.snapshot();
        assert_eq!(
            (snapshot.calls, snapshot.failures),
            (counted, counted),
            "{at:?}"
        );
        record(&breaker, Outcome::success(), 9);
        record(&breaker, UNAVAILABLE, 1);
        assert_eq!(breaker.state() == State::Open, opens, "{at:?}");
    }

    let breaker = CircuitBreaker::new(config);
    record(&breaker, UNAVAILABLE, 5);
    tokio::time::advance(SECOND).await;
    record(&breaker, UNAVAILABLE, 7);
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(breaker.snapshot().failures, 7, "at 10 s");
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(breaker.snapshot().failures, 7, "at 10.999 s");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(breaker.snapshot().failures, 0, "at 11 s");
    assert_eq!(breaker.snapshot().window, Duration::from_secs(10));
}

/// The open wait is the configured 1 s stretched by a random 0 to 25%: over 200 breakers opened
/// at the same instant every wait lies in `[1 s, 1.25 s)`, they spread over most of that range
/// (so that they do not all probe at once), and a seed replays its wait.
#[tokio::test(start_paused = true)]
async fn the_open_wait_is_stretched_by_up_to_a_quarter() {
    let waits: Vec<Duration> = (0..200)
        .map(|seed| {
            let breaker =
                CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(seed));
            record(&breaker, UNAVAILABLE, 1);
            open_wait(&breaker)
        })
        .collect();
    for &wait in &waits {
        assert_jittered(wait, SECOND);
    }
    let shortest = waits.iter().min().unwrap();
    let longest = waits.iter().max().unwrap();
    assert!(*shortest < Duration::from_millis(1_020), "{shortest:?}");
    assert!(*longest > Duration::from_millis(1_230), "{longest:?}");

    let again = CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(17));
    record(&again, UNAVAILABLE, 1);
    assert_eq!(open_wait(&again), waits[17]);
}

/// The open wait ends to the nanosecond: a nanosecond before, the breaker reads open and refuses
/// with 1 ns to wait; at its end `state()` reads half-open before any attempt asked, and the next
/// attempt is a probe.
#[tokio::test(start_paused = true)]
async fn open_turns_half_open_when_the_wait_ends() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(7));
    record(&breaker, UNAVAILABLE, 1);
    let wait = open_wait(&breaker);
    assert_jittered(wait, SECOND);

    tokio::time::advance(wait - Duration::from_nanos(1)).await;
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(refusal(&breaker).retry_after(), Duration::from_nanos(1));

    tokio::time::advance(Duration::from_nanos(1)).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::HalfOpen);
    assert_eq!(snapshot.retry_after, Some(Duration::ZERO));
    let permit = probe(&breaker);
    assert_eq!(breaker.snapshot().probes, 1);
    permit.record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);
}

/// Each probe answered with a health failure opens the breaker again, for twice as long as
/// before: 1 s, 2 s, 4 s, 8 s, 16 s, then 30 s at most (each stretched by 0 to 25%). A probe's
/// success closes it, and the next opening waits 1 s again.
#[tokio::test(start_paused = true)]
async fn failed_probes_double_the_wait_up_to_30_s_and_closing_resets_it() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_min_calls(1).with_seed(8));
    record(&breaker, UNAVAILABLE, 1);
    let mut wait = open_wait(&breaker);
    assert_jittered(wait, SECOND);
    for (failed, base) in [2, 4, 8, 16, 30, 30, 30].into_iter().enumerate() {
        tokio::time::advance(wait).await;
        probe(&breaker).record(&UNAVAILABLE, &HeaderMap::new());
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.cause, Some(OpenCause::ProbeFailed));
        assert_eq!(snapshot.opened, failed as u64 + 2);
        wait = open_wait(&breaker);
        assert_jittered(wait, Duration::from_secs(base));
    }

    tokio::time::advance(wait).await;
    probe(&breaker).record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);
    record(&breaker, UNAVAILABLE, 1);
    assert_eq!(breaker.snapshot().cause, Some(OpenCause::Failures));
    assert_jittered(open_wait(&breaker), SECOND);
    // And a failed probe after that waits 2 s, not 60 s.
    tokio::time::advance(open_wait(&breaker)).await;
    probe(&breaker).record(&UNAVAILABLE, &HeaderMap::new());
    assert_jittered(open_wait(&breaker), 2 * SECOND);
}

/// The server's hint (`Retry-After` on the failure that opened the breaker, or on a probe's
/// failure) replaces the computed wait, up to the longest wait: 7 s is followed, 90 s is cut to
/// the default 30 s, 20 s to a configured 10 s; a probe failing with a 5 s hint waits 5 s, not
/// the doubled 2 s.
#[tokio::test(start_paused = true)]
async fn the_servers_hint_is_the_open_wait_up_to_the_longest() {
    let config = BreakerConfig::default().with_min_calls(1).with_seed(9);
    for (config, hint, expected) in [
        (config, 7, 7),
        (config, 90, 30),
        (
            config.with_open_wait(SECOND, Duration::from_secs(10)),
            20,
            10,
        ),
        (config, 0, 0),
    ] {
        let breaker = CircuitBreaker::new(config);
        let hinted = UNAVAILABLE.with_retry_after(Some(Duration::from_secs(hint)));
        record(&breaker, hinted, 1);
        let wait = breaker.snapshot().retry_after.unwrap();
        if expected == 0 {
            assert_eq!(wait, Duration::ZERO);
            assert_eq!(breaker.state(), State::HalfOpen);
        } else {
            assert_jittered(wait, Duration::from_secs(expected));
        }
    }

    let breaker = CircuitBreaker::new(config);
    record(&breaker, UNAVAILABLE, 1);
    tokio::time::advance(open_wait(&breaker)).await;
    let hinted = UNAVAILABLE.with_retry_after(Some(Duration::from_secs(5)));
    probe(&breaker).record(&hinted, &HeaderMap::new());
    assert_jittered(open_wait(&breaker), Duration::from_secs(5));
}

/// A refusal says how long until the breaker lets a probe through: the open wait minus the time
/// already waited, to the nanosecond. It is final (fatal, not accepted, reason `breaker_open`,
/// the time left as its hint), was never sent, and names the cause.
#[tokio::test(start_paused = true)]
async fn refusals_tell_the_time_left() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(10));
    record(&breaker, UNAVAILABLE, 20);
    let wait = open_wait(&breaker);
    let mut waited = Duration::ZERO;
    for step in [0, 1, 399, 599] {
        tokio::time::advance(Duration::from_millis(step)).await;
        waited += Duration::from_millis(step);
        let open = refusal(&breaker);
        assert_eq!(open.retry_after(), wait - waited);
        assert_eq!(breaker.snapshot().retry_after, Some(wait - waited));
        assert_eq!(open.cause(), OpenCause::Failures);
        assert!(!open.was_sent());
        let outcome = open.outcome();
        assert_eq!(outcome.reason(), Reason::BreakerOpen);
        assert!(outcome.is_fatal() && !outcome.is_accepted());
        assert_eq!(outcome.retry_after(), Some(wait - waited));
    }
    // Refusals count for nothing.
    assert_eq!(breaker.snapshot().calls, 20);
}

/// A probe's success closes the breaker and the window starts over: the failures that opened it
/// are forgotten, so it takes 20 new calls to open it again.
#[tokio::test(start_paused = true)]
async fn a_probe_success_closes_and_the_window_starts_over() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(11));
    record(&breaker, UNAVAILABLE, 20);
    tokio::time::advance(open_wait(&breaker)).await;
    probe(&breaker).record(&Outcome::success(), &HeaderMap::new());
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!((snapshot.calls, snapshot.failures), (0, 0));
    assert_eq!((snapshot.retry_after, snapshot.probes), (None, 0));
    record(&breaker, UNAVAILABLE, 19);
    assert_eq!(breaker.state(), State::Closed);
    record(&breaker, UNAVAILABLE, 1);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.snapshot().opened, 2);
}

/// A probe that the backend accepted without success (a 429, a 400) closes the breaker too: the
/// backend is answering. A probe refused by a layer below (the throttle) decides nothing.
#[tokio::test(start_paused = true)]
async fn a_probe_answered_with_a_client_error_closes() {
    for (outcome, closes) in [
        (Outcome::retryable(Reason::RateLimited), true),
        (Outcome::fatal(Reason::BadRequest), true),
        (
            Outcome::fatal(Reason::Throttled).with_accepted(false),
            false,
        ),
    ] {
        let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(12));
        record(&breaker, UNAVAILABLE, 20);
        tokio::time::advance(open_wait(&breaker)).await;
        probe(&breaker).record(&outcome, &HeaderMap::new());
        let expected = if closes {
            State::Closed
        } else {
            State::HalfOpen
        };
        let snapshot = breaker.snapshot();
        assert_eq!(snapshot.state, expected, "{outcome}");
        assert_eq!((snapshot.opened, snapshot.probes), (1, 0), "{outcome}");
    }
}

/// An attempt let through while the breaker was closed, answered once the open wait is over,
/// closes it (the backend answers again); answered with a failure, or before the wait is over,
/// it changes nothing.
#[tokio::test(start_paused = true)]
async fn a_late_answer_from_before_the_open_closes_once_probes_may_go() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(13));
    let early: Vec<BreakerPermit> = (0..3).map(|_| breaker.try_acquire().unwrap()).collect();
    record(&breaker, UNAVAILABLE, 20);
    let wait = open_wait(&breaker);
    let mut early = early.into_iter();

    early
        .next()
        .unwrap()
        .record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Open, "before the wait is over");
    tokio::time::advance(wait).await;
    early
        .next()
        .unwrap()
        .record(&UNAVAILABLE, &HeaderMap::new());
    assert_eq!(breaker.state(), State::HalfOpen, "a late failure");
    assert_eq!(breaker.snapshot().opened, 1);
    early
        .next()
        .unwrap()
        .record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed, "a late success");
}

/// The snapshot: state, counts over the window (calls, health failures, answers: timeouts are
/// calls but no answers), attempts and probes in flight, how often and why it opened, and the
/// time left.
#[tokio::test(start_paused = true)]
async fn the_snapshot_reports_what_the_breaker_saw() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_seed(14));
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(
        (
            snapshot.calls,
            snapshot.failures,
            snapshot.answers,
            snapshot.in_flight
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(
        (snapshot.opened, snapshot.cause, snapshot.retry_after),
        (0, None, None)
    );
    assert_eq!(snapshot.window, Duration::from_secs(10));

    let held: Vec<BreakerPermit> = (0..4).map(|_| breaker.try_acquire().unwrap()).collect();
    record(&breaker, Outcome::success(), 6);
    record(&breaker, Outcome::retryable(Reason::RateLimited), 3);
    record(&breaker, Outcome::retryable(Reason::Timeout), 4);
    record(&breaker, UNAVAILABLE, 5);
    record(
        &breaker,
        Outcome::fatal(Reason::Throttled).with_accepted(false),
        7,
    );
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(
        (
            snapshot.calls,
            snapshot.failures,
            snapshot.answers,
            snapshot.in_flight
        ),
        (18, 9, 14, 4)
    );

    // Two more failures: 11 of 20.
    record(&breaker, UNAVAILABLE, 2);
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!((snapshot.calls, snapshot.failures), (20, 11));
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (1, Some(OpenCause::Failures))
    );
    let wait = snapshot.retry_after.unwrap();
    assert_jittered(wait, SECOND);
    drop(held);
    assert_eq!(breaker.snapshot().in_flight, 0);

    tokio::time::advance(wait).await;
    let probes = [probe(&breaker)];
    let snapshot = breaker.snapshot();
    assert_eq!(snapshot.state, State::HalfOpen);
    assert_eq!((snapshot.in_flight, snapshot.probes), (1, 1));
    // The next probe may go a lease (2 s) divided among the 3 slots later.
    assert_eq!(
        snapshot.retry_after,
        Some(Duration::from_nanos(666_666_666))
    );
    drop(probes);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.probes), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn failures_in_a_row_open_however_few_calls_the_window_holds() {
    let breaker = CircuitBreaker::new(BreakerConfig::default().with_consecutive_failures(Some(3)));
    // Two failures, a success, two failures: never three in a row.
    record(&breaker, UNAVAILABLE, 2);
    record(&breaker, Outcome::success(), 1);
    record(&breaker, UNAVAILABLE, 2);
    assert_eq!(breaker.state(), State::Closed);
    // Refusals below the breaker (a throttle's drop) are not failures and break no run.
    record(
        &breaker,
        Outcome::fatal(Reason::Throttled).with_accepted(false),
        1,
    );
    record(&breaker, UNAVAILABLE, 1);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(refusal(&breaker).cause(), OpenCause::ConsecutiveFailures);
    // Closed again by a probe, the count starts over.
    tokio::time::advance(2 * SECOND).await;
    probe(&breaker).record(&Outcome::success(), &HeaderMap::new());
    assert_eq!(breaker.state(), State::Closed);
    record(&breaker, UNAVAILABLE, 2);
    assert_eq!(breaker.state(), State::Closed);
    // Without the setting, 20 calls are needed.
    let by_ratio = CircuitBreaker::default();
    record(&by_ratio, UNAVAILABLE, 19);
    assert_eq!(by_ratio.state(), State::Closed);
}

/// Told to open (another replica's breaker of the backend opened), a closed breaker opens for
/// its own jittered wait, refuses until then, and comes back by a probe; one that is open
/// already is left as it is, its wait untouched.
#[tokio::test(start_paused = true)]
async fn opened_when_told_it_refuses_for_its_wait_then_probes() {
    let breaker = CircuitBreaker::new(
        BreakerConfig::default()
            .with_open_wait(SECOND, 3 * SECOND)
            .with_seed(7),
    );
    assert!(breaker.open_now());
    let wait = open_wait(&breaker);
    assert_jittered(wait, SECOND);
    let snapshot = breaker.snapshot();
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (1, Some(OpenCause::Told))
    );
    assert_eq!(refusal(&breaker).cause(), OpenCause::Told);

    // Open already: nothing changes.
    tokio::time::advance(wait / 2).await;
    assert!(!breaker.open_now());
    assert_eq!(breaker.snapshot().opened, 1);
    assert_eq!(open_wait(&breaker), wait - wait / 2);

    // After its wait, a probe; failed, the breaker opens again for twice the wait.
    tokio::time::advance(wait - wait / 2).await;
    assert_eq!(breaker.state(), State::HalfOpen);
    assert!(!breaker.open_now(), "half-open: its probes decide");
    probe(&breaker).record(&UNAVAILABLE, &HeaderMap::new());
    assert_jittered(open_wait(&breaker), 2 * SECOND);
    assert_eq!(breaker.snapshot().cause, Some(OpenCause::ProbeFailed));
}
