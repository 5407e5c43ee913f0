//! Failover between real axum providers on loopback, through a hyper client: who answers, what
//! each provider receives, and how many attempts it takes.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::classify::headers::{X_STORMGUARD_BACKEND, X_STORMGUARD_DEGRADED};
use stormguard::classify::{LocalAnswer, Reason};
use stormguard::failover::{
    Adapter, Answered, Backend, Cure, Degraded, Failover, FailoverService, NoBackend,
};
use stormguard_tests::{
    HyperClient, PROVIDER_ANSWER, RATE_LIMITED, Reply, ScriptedBackend, chat_post,
    fast_client_layer, hyper_client, outage_budget,
};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

const PATH: &str = "/v1/chat/completions";

const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;

const BAD_REQUEST: &str = r#"{"error":{"message":"'messages' is required","type":"invalid_request_error","param":"messages","code":null}}"#;

fn ok() -> Reply {
    Reply::status(200).json(PROVIDER_ANSWER)
}

fn unavailable() -> Reply {
    Reply::status(503)
}

/// A backend named `name` at `provider`, asked for `model`.
fn backup(name: &str, provider: &ScriptedBackend, model: &str) -> Backend {
    Backend::new(name).with_adapter(
        Adapter::new()
            .with_origin(provider.url("").parse().unwrap())
            .with_model(model),
    )
}

/// The failover of the tests: the primary is the request's own URI, then the backups, with the
/// fast backoff and the outage budget (10 free retries).
fn failover(backups: Vec<Backend>) -> Failover {
    let mut failover =
        Failover::new(fast_client_layer(outage_budget())).with_backend(Backend::new("primary"));
    for backup in backups {
        failover = failover.with_backend(backup);
    }
    failover
}

fn models(provider: &ScriptedBackend) -> Vec<String> {
    provider
        .seen()
        .iter()
        .map(|seen| {
            let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
            body["model"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Sends a chat request through `client`, addressed to `primary`; the answer's body read.
async fn send(
    client: &mut FailoverService<HyperClient>,
    primary: &ScriptedBackend,
) -> Result<http::Response<Bytes>, stormguard::Error> {
    let response = client
        .ready()
        .await
        .unwrap()
        .call(chat_post(&primary.url(PATH)))
        .await?;
    let (head, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Ok(http::Response::from_parts(head, body))
}

fn text(response: &http::Response<Bytes>) -> &str {
    std::str::from_utf8(response.body()).unwrap()
}

fn answered_by<B>(response: &http::Response<B>) -> &str {
    let header = response.headers()[X_STORMGUARD_BACKEND].to_str().unwrap();
    let extension = response.extensions().get::<Answered>().unwrap().backend();
    assert_eq!(header, extension);
    header
}

#[tokio::test]
async fn a_healthy_primary_answers_everything() {
    let primary = ScriptedBackend::spawn([ok()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let mut client =
        failover(vec![backup("secondary", &secondary, "backup-1")]).layer(hyper_client());
    for _ in 0..10 {
        let response = send(&mut client, &primary).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(answered_by(&response), "primary");
    }
    assert_eq!(primary.hits(), 10);
    assert_eq!(secondary.hits(), 0);
    // The primary gets the request as it was sent.
    assert!(models(&primary).iter().all(|model| model == "gpt-4o-mini"));
}

#[tokio::test]
async fn one_blip_is_retried_on_the_primary_not_failed_over() {
    let primary = ScriptedBackend::spawn([unavailable(), ok()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let mut client =
        failover(vec![backup("secondary", &secondary, "backup-1")]).layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "primary");
    assert_eq!(primary.hits(), 2);
    assert_eq!(secondary.hits(), 0);
}

#[tokio::test]
async fn a_primary_failing_three_times_in_a_row_is_left_for_the_backup() {
    let primary = ScriptedBackend::spawn([unavailable()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let mut client =
        failover(vec![backup("secondary", &secondary, "backup-1")]).layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "secondary");
    // Three attempts on the primary (its breaker opened on the third failure in a row), then
    // one on the backup, adapted: its model, at its address.
    assert_eq!(primary.hits(), 3);
    assert_eq!(secondary.hits(), 1);
    assert_eq!(models(&secondary), ["backup-1"]);
    // While the primary's breaker is open, requests go straight to the backup.
    for _ in 0..5 {
        let response = send(&mut client, &primary).await.unwrap();
        assert_eq!(answered_by(&response), "secondary");
    }
    assert_eq!(primary.hits(), 3);
    assert_eq!(secondary.hits(), 6);
    let healthy: Vec<bool> = client.backends().map(Backend::is_healthy).collect();
    assert_eq!(healthy, [false, true]);
}

#[tokio::test]
async fn a_prompt_too_long_goes_to_the_larger_model_at_once() {
    let primary = ScriptedBackend::spawn([Reply::status(400).json(OPENAI_CONTEXT)]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let large = ScriptedBackend::spawn([ok()]).await;
    let mut client = failover(vec![
        backup("secondary", &secondary, "backup-1"),
        backup("large", &large, "gpt-4o-1m"),
    ])
    .with_cure(Cure::ContextTooLong, "large")
    .layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "large");
    // Not retried on the primary (no retry helps), not sent to the secondary (it would not
    // help either), and the primary is healthy: it answered.
    assert_eq!((primary.hits(), secondary.hits(), large.hits()), (1, 0, 1));
    assert_eq!(models(&large), ["gpt-4o-1m"]);
    assert!(client.backends().all(Backend::is_healthy));
}

#[tokio::test]
async fn a_bad_request_is_answered_as_it_is() {
    let primary = ScriptedBackend::spawn([Reply::status(400).json(BAD_REQUEST)]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let degraded = Degraded::new(|_, _| http::Response::new(Bytes::from_static(b"degraded")));
    let mut client = failover(vec![backup("secondary", &secondary, "backup-1")])
        .with_degraded(degraded)
        .layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(answered_by(&response), "primary");
    assert!(response.extensions().get::<LocalAnswer>().is_none());
    assert!(text(&response).contains("'messages' is required"));
    assert_eq!((primary.hits(), secondary.hits()), (1, 0));
}

/// A key the provider refuses (401, then 403 for a key without access to the model) is set
/// aside: the request goes on to the next backend at once, and no later request is sent to it.
#[tokio::test]
async fn a_backend_refusing_its_credentials_is_set_aside_for_good() {
    for status in [401, 403] {
        let refused = Reply::status(status).json(
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        );
        let primary = ScriptedBackend::spawn([refused]).await;
        let secondary = ScriptedBackend::spawn([ok()]).await;
        let mut client =
            failover(vec![backup("secondary", &secondary, "backup-1")]).layer(hyper_client());
        for _ in 0..5 {
            let response = send(&mut client, &primary).await.unwrap();
            assert_eq!(response.status(), 200, "{status}");
            assert_eq!(answered_by(&response), "secondary");
        }
        // Asked once, never retried on, never asked again.
        assert_eq!((primary.hits(), secondary.hits()), (1, 5), "{status}");
        let aside: Vec<bool> = client.backends().map(Backend::is_set_aside).collect();
        assert_eq!(aside, [true, false], "{status}");
    }
}

/// Alone, a backend refusing its credentials hands its answer back as it is.
#[tokio::test]
async fn a_lone_backend_refusing_its_credentials_hands_back_its_401() {
    let primary = ScriptedBackend::spawn([Reply::status(401)]).await;
    let mut client = failover(vec![]).layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(primary.hits(), 1);
    assert!(client.backends().all(Backend::is_set_aside));
}

#[tokio::test]
async fn when_every_provider_fails_the_answer_is_the_degraded_one() {
    let primary = ScriptedBackend::spawn([unavailable()]).await;
    let secondary = ScriptedBackend::spawn([unavailable()]).await;
    let degraded = Degraded::new(|_, why| {
        let body = format!(r#"{{"choices":[],"why":"{}"}}"#, why.reason().as_str());
        http::Response::new(Bytes::from(body))
    });
    let mut client = failover(vec![backup("secondary", &secondary, "backup-1")])
        .with_degraded(degraded)
        .layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[X_STORMGUARD_DEGRADED], "true");
    let why = response
        .extensions()
        .get::<LocalAnswer>()
        .unwrap()
        .outcome();
    assert_eq!(why.reason(), Reason::Unavailable);
    assert_eq!(text(&response), r#"{"choices":[],"why":"unavailable"}"#);
    // Three attempts each: both breakers opened.
    assert_eq!((primary.hits(), secondary.hits()), (3, 3));
    // Now no backend is healthy: degraded at once, nothing sent.
    let response = send(&mut client, &primary).await.unwrap();
    let why = response
        .extensions()
        .get::<LocalAnswer>()
        .unwrap()
        .outcome();
    assert_eq!(why.reason(), Reason::NoBackend);
    assert_eq!((primary.hits(), secondary.hits()), (3, 3));
}

#[tokio::test]
async fn without_a_degraded_answer_no_backend_is_a_503_with_retry_after() {
    let primary = ScriptedBackend::spawn([unavailable()]).await;
    let secondary = ScriptedBackend::spawn([unavailable()]).await;
    let mut client =
        failover(vec![backup("secondary", &secondary, "backup-1")]).layer(hyper_client());
    // The first request meets both failures: the last backend's answer is handed back.
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(answered_by(&response), "secondary");
    // The next finds no healthy backend.
    let error = send(&mut client, &primary).await.unwrap_err();
    assert_eq!(error.reason(), Reason::NoBackend);
    assert_eq!(error.attempts(), 0);
    let refusal: http::Response<()> = stormguard::error_response(&error, false);
    assert_eq!(refusal.status(), 503);
    assert_eq!(refusal.headers()["retry-after"], "1");
    assert_eq!(refusal.headers()["x-should-retry"], "false");
    let no_backend = error.downcast_source::<NoBackend>().unwrap();
    assert_eq!(no_backend.tried(), 0);
}

#[tokio::test]
async fn an_empty_budget_stops_the_failover_as_it_stops_retries() {
    let primary = ScriptedBackend::spawn([unavailable()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    // No retry at all: one attempt on the primary, and no failover after it.
    let budget = stormguard::budget::RetryBudget::new(
        BudgetConfig::default().with_min_per_sec(0).with_ratio(0.0),
    );
    let mut client = Failover::new(fast_client_layer(budget).with_max_attempts(5))
        .with_backend(Backend::new("primary").with_breaker(
            stormguard::breaker::CircuitBreaker::new(
                stormguard::breaker::BreakerConfig::default().with_consecutive_failures(Some(1)),
            ),
        ))
        .with_backend(backup("secondary", &secondary, "backup-1"))
        .layer(hyper_client());
    // The 503 opened the primary's breaker, which refused the retry: that refusal is the
    // answer, as the budget has nothing for a failover.
    let error = send(&mut client, &primary).await.unwrap_err();
    assert_eq!(error.reason(), Reason::BreakerOpen);
    assert_eq!(error.attempts(), 1);
    assert_eq!((primary.hits(), secondary.hits()), (1, 0));
    // The next request starts on the backup: nothing was sent to the primary, so nothing is
    // drawn from the budget.
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(answered_by(&response), "secondary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_threads_fail_over_with_a_bounded_number_of_attempts() {
    let primary = ScriptedBackend::spawn([unavailable()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let client = failover(vec![backup("secondary", &secondary, "backup-1")]).layer(hyper_client());
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let client = client.clone();
        let url = primary.url(PATH);
        callers.spawn(async move {
            for _ in 0..50 {
                let response = client.clone().oneshot(chat_post(&url)).await.unwrap();
                assert_eq!(response.status(), 200);
                assert_eq!(answered_by(&response), "secondary");
            }
        });
    }
    while let Some(caller) = callers.join_next().await {
        caller.unwrap();
    }
    // Every request answered by the backup, once. The dead primary saw only the attempts of
    // the requests in flight when its breaker opened (at most 4, at most 3 attempts each), not
    // 200 x 3.
    assert_eq!(secondary.hits(), 200);
    assert!(primary.hits() <= 4 * 3, "{}", primary.hits());
    assert!(primary.hits() >= 3, "{}", primary.hits());
}

#[tokio::test]
async fn a_reqwest_client_fails_over_through_the_same_engine() {
    let primary = ScriptedBackend::spawn([unavailable()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let middleware = stormguard::reqwest::StormguardMiddleware::failover(failover(vec![backup(
        "secondary",
        &secondary,
        "backup-1",
    )]));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build();
    for _ in 0..3 {
        let response = client
            .post(primary.url(PATH))
            .header("content-type", "application/json")
            .body(stormguard_tests::CHAT_REQUEST)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[X_STORMGUARD_BACKEND], "secondary");
        assert_eq!(response.text().await.unwrap(), PROVIDER_ANSWER);
    }
    // Three attempts on the primary for the first request (then its breaker opened), none after.
    assert_eq!((primary.hits(), secondary.hits()), (3, 3));
    assert_eq!(models(&secondary), ["backup-1"; 3]);
}

/// OpenAI's 429 for a request-rate limit, without Retry-After.
fn rate_limited() -> Reply {
    Reply::status(429).json(RATE_LIMITED)
}

/// `Failover::new(ClientLayer::default())` over the primary (the request's own URI) and
/// `secondary`, with every default (3 attempts, a 60 s hint maximum, the default backoff and
/// breakers): the retry budget is the test's, to count what the request drew from it.
fn default_failover(
    budget: &RetryBudget,
    secondary: &ScriptedBackend,
) -> FailoverService<HyperClient> {
    Failover::new(stormguard::ClientLayer::default().with_budget(budget.clone()))
        .with_backend(Backend::new("primary"))
        .with_backend(backup("secondary", secondary, "backup-1"))
        .layer(hyper_client())
}

/// A 429 without Retry-After on every attempt: the primary is left once its engine gave up, at
/// one request, though it stays healthy (a 429 is no health failure: its breaker stays closed).
#[tokio::test(start_paused = true)]
async fn a_primary_answering_429_to_every_attempt_is_left_for_the_backup() {
    let primary = ScriptedBackend::spawn([rate_limited()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let budget = RetryBudget::default();
    let mut client = default_failover(&budget, &secondary);
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!(text(&response), PROVIDER_ANSWER);
    assert_eq!((primary.hits(), secondary.hits()), (3, 1));
    // Two retries on the primary and the move: three withdrawals from the one budget.
    assert_eq!(budget.snapshot().withdrawals, 3);
    assert!(client.backends().all(Backend::is_healthy));
    // Healthy, the primary is tried first again, and left again.
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!((primary.hits(), secondary.hits()), (6, 2));
}

/// `Retry-After: 120`, above the hint policy's 60 s maximum: no retry on the primary, the
/// backup at once.
#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_the_hint_maximum_leaves_the_primary_at_once() {
    let primary = ScriptedBackend::spawn([rate_limited().header("retry-after", "120")]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let mut client = default_failover(&RetryBudget::default(), &secondary);
    let started = Instant::now();
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!((primary.hits(), secondary.hits()), (1, 1));
    // Not a moment waited for the 120 s (on the paused clock).
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
}

/// `Retry-After: 30`, within the hint maximum, but the request has 10 s left: the primary's
/// engine gives up on it (its deadline), and the backup answers in time.
#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_the_deadline_leaves_the_primary_at_once() {
    let primary = ScriptedBackend::spawn([rate_limited().header("retry-after", "30")]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let layer = stormguard::ClientLayer::default().with_timeout(Duration::from_secs(10));
    let mut client = Failover::new(layer)
        .with_backend(Backend::new("primary"))
        .with_backend(backup("secondary", &secondary, "backup-1"))
        .layer(hyper_client());
    let started = Instant::now();
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!((primary.hits(), secondary.hits()), (1, 1));
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
}

/// A 429 the retry cured is no reason to leave the primary.
#[tokio::test(start_paused = true)]
async fn a_429_cured_by_the_retry_stays_on_the_primary() {
    let primary = ScriptedBackend::spawn([rate_limited(), ok()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let mut client = default_failover(&RetryBudget::default(), &secondary);
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "primary");
    assert_eq!((primary.hits(), secondary.hits()), (2, 0));
}

/// Both providers answer 429 with `Retry-After: 1`: each gets its three attempts, waiting the
/// second asked before each retry, and the caller gets the backup's 429 with its Retry-After,
/// marked final.
#[tokio::test(start_paused = true)]
async fn when_every_provider_answers_429_the_caller_gets_the_last_one() {
    let limited = || rate_limited().header("retry-after", "1");
    let primary = ScriptedBackend::spawn([limited()]).await;
    let secondary = ScriptedBackend::spawn([limited()]).await;
    let budget = RetryBudget::default();
    let mut client = default_failover(&budget, &secondary);
    let started = Instant::now();
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(answered_by(&response), "secondary");
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(text(&response), RATE_LIMITED);
    assert_eq!((primary.hits(), secondary.hits()), (3, 3));
    // Two retries on each and the move between them.
    assert_eq!(budget.snapshot().withdrawals, 5);
    // Four waits of 1 s, each with at most 10% of jitter.
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(4), "{waited:?}");
    assert!(waited < Duration::from_millis(4_500), "{waited:?}");
}

/// The move off a provider in 429 is a retry like any other: with nothing in the budget there
/// is neither a retry nor a move, and the caller gets the 429.
#[tokio::test(start_paused = true)]
async fn an_empty_budget_keeps_the_429_of_the_primary() {
    let primary = ScriptedBackend::spawn([rate_limited()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let empty = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.0));
    let mut client = default_failover(&empty, &secondary);
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(answered_by(&response), "primary");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!((primary.hits(), secondary.hits()), (1, 0));
}

/// A body above the replay cap is sent once, as a stream: its 429 is the answer, as no other
/// backend could be sent the body again.
#[tokio::test(start_paused = true)]
async fn a_body_sent_once_stays_with_its_429() {
    let primary = ScriptedBackend::spawn([rate_limited()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let layer = stormguard::ClientLayer::default().with_max_replay_body(16);
    let mut client = Failover::new(layer)
        .with_backend(Backend::new("primary"))
        .with_backend(backup("secondary", &secondary, "backup-1"))
        .layer(hyper_client());
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(answered_by(&response), "primary");
    assert_eq!((primary.hits(), secondary.hits()), (1, 0));
    assert_eq!(
        primary.seen()[0].body,
        stormguard_tests::CHAT_REQUEST.as_bytes()
    );
}

/// 503, 503, then 429: not a 429 on every attempt, and the primary is still healthy (two health
/// failures in a row, one under the three that open its breaker; a 429 is none). As before the
/// 429 rule, its failure is the answer: the 429, marked final, after three attempts, and
/// nothing sent to the backup.
#[tokio::test(start_paused = true)]
async fn a_429_after_503s_on_a_healthy_primary_is_the_answer() {
    let primary = ScriptedBackend::spawn([unavailable(), unavailable(), rate_limited()]).await;
    let secondary = ScriptedBackend::spawn([ok()]).await;
    let mut client = default_failover(&RetryBudget::default(), &secondary);
    let response = send(&mut client, &primary).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(answered_by(&response), "primary");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!((primary.hits(), secondary.hits()), (3, 0));
    assert!(client.backends().all(Backend::is_healthy));
}

/// Without a failover, the engine alone hands back the 429 with its Retry-After after its three
/// attempts, marked final, as it always has.
#[tokio::test(start_paused = true)]
async fn without_a_failover_the_429_is_handed_back_after_three_attempts() {
    let provider = ScriptedBackend::spawn([rate_limited().header("retry-after", "1")]).await;
    let client = stormguard::ClientLayer::default().layer(hyper_client());
    let started = Instant::now();
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(
        response.extensions().get::<stormguard::GiveUpCause>(),
        Some(&stormguard::GiveUpCause::AttemptsExhausted)
    );
    assert_eq!(provider.hits(), 3);
    // Two waits of 1 s, each with at most 10% of jitter.
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(waited < Duration::from_millis(2_300), "{waited:?}");
}

/// `key-a` (the request's own URI) then `key-b` at `key_b`, in order, with every default but
/// [`Failover::with_hand_off_429`]: the budget is the test's, to count what a request drew.
fn handing_off(budget: &RetryBudget, key_b: &ScriptedBackend) -> FailoverService<HyperClient> {
    Failover::new(stormguard::ClientLayer::default().with_budget(budget.clone()))
        .with_backend(Backend::new("key-a"))
        .with_backend(backup("key-b", key_b, "backup-1"))
        .with_hand_off_429()
        .layer(hyper_client())
}

/// Sends `count` requests one after the other; each is answered 200 by `key-b` at once.
async fn all_by_key_b(
    client: &mut FailoverService<HyperClient>,
    key_a: &ScriptedBackend,
    count: usize,
) {
    for _ in 0..count {
        let started = Instant::now();
        let response = send(client, key_a).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(answered_by(&response), "key-b");
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}

/// Key A answers 429 with `Retry-After: 5`: the request goes to key B at once (2 attempts, the
/// move the one draw on the budget, no wait), and A, cooling for its 5 s, is sent nothing until
/// they have passed; then it is first again.
#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_moves_to_the_other_key_at_once_and_cools_for_the_hint() {
    let key_a = ScriptedBackend::spawn([rate_limited().header("retry-after", "5")]).await;
    let key_b = ScriptedBackend::spawn([ok()]).await;
    let budget = RetryBudget::default();
    let mut client = handing_off(&budget, &key_b);
    all_by_key_b(&mut client, &key_a, 1).await;
    assert_eq!((key_a.hits(), key_b.hits()), (1, 1));
    assert_eq!(budget.snapshot().withdrawals, 1);
    assert_eq!(
        key_a.seen()[0].body,
        stormguard_tests::CHAT_REQUEST.as_bytes()
    );
    assert_eq!(models(&key_b), ["backup-1"]);
    // Cooling: 4 more requests within the 5 s, none to A.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        all_by_key_b(&mut client, &key_a, 1).await;
    }
    assert_eq!((key_a.hits(), key_b.hits()), (1, 5));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    all_by_key_b(&mut client, &key_a, 1).await;
    assert_eq!((key_a.hits(), key_b.hits()), (2, 6));
}

/// Key A answers 429 without a hint: the same move at once, and A cools for
/// `Backend::DEFAULT_429_COOLDOWN` (1 s).
#[tokio::test(start_paused = true)]
async fn a_429_without_a_hint_moves_at_once_and_cools_for_a_second() {
    assert_eq!(Backend::DEFAULT_429_COOLDOWN, Duration::from_secs(1));
    let key_a = ScriptedBackend::spawn([rate_limited()]).await;
    let key_b = ScriptedBackend::spawn([ok()]).await;
    let budget = RetryBudget::default();
    let mut client = handing_off(&budget, &key_b);
    all_by_key_b(&mut client, &key_a, 3).await;
    assert_eq!((key_a.hits(), key_b.hits()), (1, 3));
    assert_eq!(budget.snapshot().withdrawals, 1);
    tokio::time::sleep(Duration::from_millis(900)).await;
    all_by_key_b(&mut client, &key_a, 1).await;
    assert_eq!((key_a.hits(), key_b.hits()), (1, 4));
    tokio::time::sleep(Duration::from_millis(100)).await;
    all_by_key_b(&mut client, &key_a, 1).await;
    assert_eq!((key_a.hits(), key_b.hits()), (2, 5));
}

/// One key only: nowhere to move, so its engine does what it does alone: waits out the 1 s
/// asked (and its jitter, at most 10%) and retries there, and the retry answers.
#[tokio::test(start_paused = true)]
async fn with_one_key_a_429_is_waited_out_and_retried_on_it() {
    let key_a = ScriptedBackend::spawn([rate_limited().header("retry-after", "1"), ok()]).await;
    let mut client = Failover::new(stormguard::ClientLayer::default())
        .with_backend(Backend::new("key-a"))
        .with_hand_off_429()
        .layer(hyper_client());
    let started = Instant::now();
    let response = send(&mut client, &key_a).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(answered_by(&response), "key-a");
    assert_eq!(key_a.hits(), 2);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert!(waited < Duration::from_millis(1_150), "{waited:?}");
}

/// A throttle that drops the retry after a 429 (K = 1, no minimum rate: after one 429 it drops
/// half of what it gets while the 429 is in its 2 s window; seeded, it drops that retry).
fn dropping_throttle() -> stormguard::throttle::AdaptiveThrottle {
    let config = stormguard::throttle::ThrottleConfig::default()
        .with_k(1.0)
        .with_min_rate(0.0)
        .with_max_probability(1.0)
        .with_seed(THROTTLE_SEED);
    stormguard::throttle::AdaptiveThrottle::new(config)
}

/// A seed whose first draw drops at a probability of one half.
const THROTTLE_SEED: u64 = 0;

/// Key A answers 429 with `Retry-After: 1` (within the throttle's 2 s window); its throttle drops the retry, and key B is not
/// there: the caller gets A's 429 with its Retry-After and `x-should-retry: false`, never a 503
/// of the throttle's, after 1 attempt.
#[tokio::test(start_paused = true)]
async fn a_throttled_retry_of_a_429_hands_back_the_429_not_a_503() {
    let key_a = ScriptedBackend::spawn([rate_limited().header("retry-after", "1")]).await;
    let mut client = Failover::new(stormguard::ClientLayer::default())
        .with_backend(Backend::new("key-a").with_throttle(dropping_throttle()))
        .with_hand_off_429()
        .layer(hyper_client());
    let response = send(&mut client, &key_a).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(answered_by(&response), "key-a");
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(text(&response), RATE_LIMITED);
    assert_eq!(key_a.hits(), 1);
}

/// The engine alone does the same: the throttle's refusal of the retry never hides the 429.
#[tokio::test(start_paused = true)]
async fn without_a_failover_a_throttled_retry_of_a_429_hands_back_the_429() {
    let provider = ScriptedBackend::spawn([rate_limited().header("retry-after", "1")]).await;
    let client = stormguard::ClientLayer::default()
        .with_throttle(dropping_throttle())
        .layer(hyper_client());
    let response = client
        .oneshot(chat_post(&provider.url(PATH)))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, RATE_LIMITED.as_bytes());
    assert_eq!(provider.hits(), 1);
}

/// A stream cut on the first backend (its key and path prefix set by its adapter) and continued
/// on a backend without a key is sent there as the caller sent it, rewritten only by that
/// backend's adapter: never with the first backend's key, nor under its path prefix.
#[tokio::test(start_paused = true)]
async fn a_continuation_carries_only_its_own_backends_key_and_path() {
    use stormguard_tests::provider::{Plan, Provider, chunk, read, whole_answer, words};
    // The first backend sends words 1 to 20 and closes: no finish, no [DONE].
    let first = Provider::spawn(|_, _| Plan::stream(words(1, 20, false))).await;
    let mut rest: String = (21..=60)
        .map(|word| chunk(&format!(r#"{{"content":"w{word} "}}"#), "null"))
        .collect();
    rest.push_str(&chunk("{}", r#""stop""#));
    rest.push_str("data: [DONE]\n\n");
    let keyless = ScriptedBackend::spawn([Reply::status(200)
        .header("content-type", "text/event-stream")
        .body(rest)])
    .await;
    let keyed = Adapter::new()
        .with_origin(first.origin())
        .with_header(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer sk-first-only"),
        )
        .with_head(|head| {
            let mut parts = head.uri.clone().into_parts();
            let path = format!("/first-prefix{}", head.uri.path());
            parts.path_and_query = Some(path.parse().unwrap());
            head.uri = http::Uri::from_parts(parts).unwrap();
        });
    let keyless_adapter = Adapter::new().with_origin(keyless.url("").parse().unwrap());
    let failover = Failover::new(stormguard::ClientLayer::default())
        .with_backend(Backend::new("first").with_adapter(keyed))
        .with_backend(Backend::new("keyless").with_adapter(keyless_adapter))
        .layer(hyper_client());
    let request = stormguard_test_kit::post(PATH, stormguard_tests::provider::REQUEST);
    let response = failover.oneshot(request).await.unwrap();
    let answer = read(response.into_body()).await;
    assert_eq!(answer.text, whole_answer());
    assert_eq!(answer.done, 1);
    let seen = keyless.seen();
    assert_eq!(seen.len(), 1, "one continuation");
    assert_eq!(seen[0].uri.path(), PATH);
    assert_eq!(seen[0].headers.get(http::header::AUTHORIZATION), None);
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    let prefill = body["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(prefill["role"], "assistant");
}
