//! Protection from the first request: a gateway built as the README builds one (an axum server
//! with `ServerLayer`, a failover from a primary to a backup over `ClientLayer::default()` with a
//! 30 s deadline and a stream guard idle for 30 s at most), its backends' clocks cold (nothing
//! learned: a restart, a new deployment), in front of real providers on loopback and read by a
//! reqwest caller, on the paused clock. The faults a cold gateway did not rescue, each answered
//! whole now, with its time; and the healthy slow answers a cold clock must not lose.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::body::Body;
use http_body_util::{BodyExt, Full};
use stormguard::deadline::Deadline;
use stormguard::failover::{Adapter, Backend, Failover};
use stormguard::stream::StreamPolicy;
use stormguard::{ClientLayer, ServerLayer};
use stormguard_tests::provider::{
    PATH, Plan, Provider, REQUEST, WORDS, chat_request, read, reqwest_post, resumes_at, text_of,
    whole_answer, words,
};
use stormguard_tests::{Reply, ScriptedBackend, Server, Sse, hyper_client, send};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const SECOND: Duration = Duration::from_secs(1);

/// The README's gateway in front of `primary` and `backup` (addresses), with a deadline of
/// `timeout`: every request relayed through the failover, every error answered by
/// `error_response`.
async fn gateway(primary: http::Uri, backup: http::Uri, timeout: Duration) -> Server {
    let backend = |name: &str, origin: &http::Uri| {
        Backend::new(name).with_adapter(Adapter::new().with_origin(origin.clone()))
    };
    let layer = ClientLayer::default()
        .with_timeout(timeout)
        .with_stream_policy(StreamPolicy::default().with_idle(Some(30 * SECOND)));
    let client = Failover::new(layer)
        .with_backend(backend("primary", &primary))
        .with_backend(backend("backup", &backup))
        .layer(hyper_client());
    let router = axum::Router::new()
        .fallback(move |request: axum::extract::Request| {
            let (client, primary) = (client.clone(), primary.clone());
            async move {
                let deadline = Deadline::of(&request);
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let mut upstream = chat_request(&primary);
                *upstream.body_mut() = Full::new(body);
                if let Some(deadline) = deadline {
                    deadline.apply_to(&mut upstream);
                }
                match client.oneshot(upstream).await {
                    Ok(response) => response.map(Body::new),
                    Err(error) => {
                        stormguard::error_response::<String>(&error, false).map(Body::from)
                    }
                }
            }
        })
        .layer(ServerLayer::default());
    Server::spawn(router).await
}

/// A backup that answers every request (a continuation from where it asks) at once.
async fn healthy_backup() -> Provider {
    Provider::spawn(|_, body| Plan::answer(resumes_at(body))).await
}

/// The README gateway's 30 s budget in front of `primary` and a healthy backup: what the caller
/// read, after how long, and the two providers.
async fn through_the_gateway(
    primary: Provider,
) -> (Duration, String, Option<String>, usize, usize) {
    let backup = healthy_backup().await;
    let server = gateway(primary.origin(), backup.origin(), 30 * SECOND).await;
    let started = Instant::now();
    let read = reqwest_post(&server.url(PATH), REQUEST).await;
    let took = started.elapsed();
    assert_eq!(read.status, 200, "{}", read.raw);
    assert_eq!(read.raw.matches("[DONE]").count(), 1, "{}", read.raw);
    let text = text_of(&read.raw);
    (took, text, read.backend, primary.hits(), backup.hits())
}

/// The provider accepts the request and never answers (120 s without a head). Cold, the stream's
/// first content is hedged at 10 s: the backup answers, within 15 s of the 30 s budget (it
/// waited out the deadline, a 504, before).
#[tokio::test(start_paused = true)]
async fn a_silent_provider_is_hedged_to_the_backup_at_the_cold_first_content_clock() {
    let primary = Provider::spawn(|_, _| Plan {
        head_after: 120 * SECOND,
        ..Plan::answer(1)
    })
    .await;
    let (took, text, backend, primary_hits, backup_hits) = through_the_gateway(primary).await;
    assert_eq!(text, whole_answer());
    assert_eq!(backend.as_deref(), Some("backup"));
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary_hits, backup_hits), (1, 1));
}

/// The head and the role chunk at once, the first token after 20 s: hedged at 10 s, answered by
/// the backup (20.9 s from the primary before).
#[tokio::test(start_paused = true)]
async fn a_first_token_after_20_s_is_hedged_to_the_backup_at_10_s() {
    let primary = Provider::spawn(|_, _| {
        let mut plan = Plan::answer(1);
        plan.steps.insert(1, Sse::Wait(20 * SECOND));
        plan
    })
    .await;
    let (took, text, backend, primary_hits, backup_hits) = through_the_gateway(primary).await;
    assert_eq!(text, whole_answer());
    assert_eq!(backend.as_deref(), Some("backup"));
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary_hits, backup_hits), (1, 1));
}

/// After 20 tokens the stream stalls for 30 s, then closes. Cold, a 10 s gap cuts it and the
/// backup continues it from the 20 tokens: each word once, within 45 s (a cut at the 30 s idle
/// limit, with the deadline spent, before).
#[tokio::test(start_paused = true)]
async fn a_stream_stalled_after_20_tokens_is_continued_at_the_cold_gap_clock() {
    let primary = Provider::spawn(|_, _| {
        let mut steps = words(1, 20, false);
        steps.push(Sse::Wait(30 * SECOND));
        Plan::stream(steps)
    })
    .await;
    let (took, text, backend, primary_hits, backup_hits) = through_the_gateway(primary).await;
    assert_eq!(text, whole_answer());
    assert_eq!(backend.as_deref(), Some("primary"));
    // 20 words 10 ms apart, the 10 s gap, the backup's 40 words.
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary_hits, backup_hits), (1, 1));
}

/// A model thinking for 90 s, a keep-alive comment every 5 s, then its answer.
fn thinking(_: usize, _: &str) -> Plan {
    let mut steps = vec![];
    for _ in 0..18 {
        steps.push(Sse::Wait(5 * SECOND));
        steps.push(send(": keep-alive\n\n"));
    }
    steps.extend(words(1, WORDS, true));
    Plan::stream(steps)
}

/// Two providers thinking for 90 s behind the gateway, with a 300 s budget: what the caller read
/// of `request`, after how long, and how many requests each provider saw.
async fn thinking_twice(request: &str) -> (Duration, String, Option<String>, usize, usize) {
    let (primary, backup) = (
        Provider::spawn(thinking).await,
        Provider::spawn(thinking).await,
    );
    let server = gateway(primary.origin(), backup.origin(), 300 * SECOND).await;
    let started = Instant::now();
    let read = reqwest_post(&server.url(PATH), request).await;
    let took = started.elapsed();
    let text = text_of(&read.raw);
    (took, text, read.backend, primary.hits(), backup.hits())
}

/// A reasoning model thinking for 90 s, keep-alives flowing, both providers alike. Cold, with
/// reasoning asked for, the hedge goes at 60 s and the primary, still running, answers first at
/// 90 s: delivered whole, with one hedge.
#[tokio::test(start_paused = true)]
async fn a_healthy_stream_after_90_s_of_keep_alives_is_delivered_whole_with_one_hedge() {
    let request = REQUEST.replace(
        r#""stream":true"#,
        r#""stream":true,"reasoning_effort":"high""#,
    );
    let (took, text, backend, primary_hits, backup_hits) = thinking_twice(&request).await;
    assert_eq!(text, whole_answer());
    assert_eq!(backend.as_deref(), Some("primary"));
    assert!((90 * SECOND..91 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary_hits, backup_hits), (1, 1));
}

/// The same thinking with no reasoning asked for (a model that reasons unasked): the hedge goes
/// at 10 s, and the primary still answers first, whole.
#[tokio::test(start_paused = true)]
async fn a_model_thinking_unasked_is_hedged_at_10_s_and_still_answers_first() {
    let (took, text, backend, primary_hits, backup_hits) = thinking_twice(REQUEST).await;
    assert_eq!(text, whole_answer());
    assert_eq!(backend.as_deref(), Some("primary"));
    assert!((90 * SECOND..91 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary_hits, backup_hits), (1, 1));
}

/// A whole (non-streaming) answer of 4,000 tokens that takes 100 s: its cold head clock is
/// sized by the request (10 s + 4,000 x 28 ms), so it is neither cut nor hedged.
#[tokio::test(start_paused = true)]
async fn a_whole_answer_of_4000_tokens_taking_100_s_is_delivered_without_a_hedge() {
    let answer = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}"#;
    let reply = Reply::status(200).json(answer).delay(100 * SECOND);
    let (primary, backup) = (
        ScriptedBackend::spawn([reply.clone()]).await,
        ScriptedBackend::spawn([reply]).await,
    );
    let origin = |backend: &ScriptedBackend| backend.url("").parse().unwrap();
    let server = gateway(origin(&primary), origin(&backup), 300 * SECOND).await;
    let request =
        r#"{"model":"m","max_tokens":4000,"messages":[{"role":"user","content":"write"}]}"#;
    let started = Instant::now();
    let read = reqwest_post(&server.url(PATH), request).await;
    let took = started.elapsed();
    assert_eq!((read.status, read.raw.as_str()), (200, answer));
    assert_eq!(read.backend.as_deref(), Some("primary"));
    assert!((100 * SECOND..101 * SECOND).contains(&took), "{took:?}");
    assert_eq!((primary.hits(), backup.hits()), (1, 0));
}

/// Without a failover, the cold hedge goes to the same backend: its first attempt silent, its
/// second answers at once.
#[tokio::test(start_paused = true)]
async fn a_single_backend_is_hedged_to_itself_while_cold() {
    let provider = Provider::spawn(|n, _| Plan {
        head_after: if n == 0 { 120 * SECOND } else { Duration::ZERO },
        ..Plan::answer(1)
    })
    .await;
    let client = ClientLayer::default()
        .with_timeout(30 * SECOND)
        .layer(hyper_client());
    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    assert_eq!(read(response.into_body()).await.text, whole_answer());
    let took = started.elapsed();
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!(provider.hits(), 2);
}

/// Without a failover, a stream stalled after 20 tokens is cut at the cold gap and continued by
/// the engine through the same backend, each word once.
#[tokio::test(start_paused = true)]
async fn a_single_backend_continues_a_stalled_stream_at_the_cold_gap() {
    let provider = Provider::spawn(|n, body| match n {
        0 => {
            let mut steps = words(1, 20, false);
            steps.push(Sse::Stall);
            Plan::stream(steps)
        }
        _ => Plan::answer(resumes_at(body)),
    })
    .await;
    let client = ClientLayer::default()
        .with_timeout(30 * SECOND)
        .layer(hyper_client());
    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    let read = read(response.into_body()).await;
    let took = started.elapsed();
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!((read.text, read.done), (whole_answer(), 1));
    assert!((10 * SECOND..11 * SECOND).contains(&took), "{took:?}");
    assert_eq!(provider.hits(), 2);
}

/// A healthy stream that pauses 15 s after 20 tokens, where a cut would lose it: a layer that
/// does not continue streams, and a request that asks for reasoning (its thinking cannot be a
/// prefill). The cold gap cuts neither: each is delivered whole by its one attempt.
#[tokio::test(start_paused = true)]
async fn a_pause_is_never_cut_cold_where_the_stream_would_not_be_continued() {
    let pausing = |_: usize, _: &str| {
        let mut steps = words(1, 20, false);
        steps.push(Sse::Wait(15 * SECOND));
        steps.extend(words(21, WORDS, true).into_iter().skip(1));
        Plan::stream(steps)
    };
    let reasoning = REQUEST.replace(
        r#""stream":true"#,
        r#""stream":true,"reasoning_effort":"low""#,
    );
    let request = |provider: &Provider, body: &str| {
        let mut request = chat_request(&provider.origin());
        *request.body_mut() = Full::from(body.to_owned());
        request
    };
    let not_continued = Provider::spawn(pausing).await;
    let client = (ClientLayer::default().without_continuation())
        .with_timeout(30 * SECOND)
        .layer(hyper_client());
    let response = client
        .oneshot(request(&not_continued, REQUEST))
        .await
        .unwrap();
    let not_continued_read = read(response.into_body()).await;
    let thinking = Provider::spawn(pausing).await;
    let client = (ClientLayer::default())
        .with_timeout(30 * SECOND)
        .layer(hyper_client());
    let response = client
        .oneshot(request(&thinking, &reasoning))
        .await
        .unwrap();
    let thinking_read = read(response.into_body()).await;
    for read in [not_continued_read, thinking_read] {
        assert!(read.error.is_none(), "{:?}", read.error);
        assert_eq!((read.text, read.done), (whole_answer(), 1));
    }
    assert_eq!((not_continued.hits(), thinking.hits()), (1, 1));
}
