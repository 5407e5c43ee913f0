//! The incidents that fall between the guards, each against real axum providers on loopback, on
//! the paused clock: a provider that never answers, a slow first token, a stream cut or stalled
//! half way, a continuation the backend rejects, a stream that loses its terminal event. Each
//! test asserts what the caller gets, when, and how many attempts each provider saw; the 429
//! incidents are in `failover.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use stormguard::ClientLayer;
use stormguard::deadline::clocks::AttemptClocks;
use stormguard::failover::{Adapter, Backend, Failover};
use stormguard::stream::{InterruptCause, StreamInterrupted};
use stormguard_tests::provider::{
    PATH, Plan, Provider, REQUEST, WORDS, backend_of, chat_request, fresh_client, gateway, read,
    reqwest_post, resumes_at, text_of, warm_up, whole_answer, words,
};
use stormguard_tests::{Server, Sse, hyper_client, send};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_provider_that_never_answers_is_left_for_the_backup_at_its_head_clock() {
    let primary = Provider::spawn(|n, _| Plan {
        head_after: if n < 1 {
            Duration::from_secs(1000)
        } else {
            Duration::ZERO
        },
        ..Plan::answer(1)
    })
    .await;
    let backup = Provider::spawn(|_, body| Plan::answer(resumes_at(body))).await;
    // What twenty healthy answers taught the primary's clocks: heads at 100 ms.
    let learned = AttemptClocks::default();
    for _ in 0..20 {
        learned.record_head(true, Duration::from_millis(100));
    }
    let client = gateway(ClientLayer::default(), &primary, &backup, learned);

    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(backend_of(&response), "backup");
    assert_eq!(read(response.into_body()).await.text, whole_answer());
    // The head of a stream: 20 heads at once learned, the 3 s floor; not the 30 s deadline.
    assert!(
        (Duration::from_secs(3)..Duration::from_millis(3100)).contains(&took),
        "{took:?}"
    );
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn without_the_clocks_a_silent_provider_takes_the_whole_deadline() {
    let primary = Provider::spawn(|_, _| Plan {
        head_after: Duration::from_secs(1000),
        ..Plan::answer(1)
    })
    .await;
    let backup = Provider::spawn(|_, _| Plan::answer(1)).await;
    let layer = ClientLayer::default().without_clocks().without_hedging();
    let client = gateway(layer, &primary, &backup, AttemptClocks::default());
    let started = Instant::now();
    let error = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert_eq!(
        error.reason(),
        stormguard::classify::Reason::DeadlineExceeded
    );
    assert_eq!((primary.hits(), backup.hits()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_first_token_later_than_the_clock_sends_the_request_to_the_backup() {
    let primary = Provider::spawn(|n, _| {
        let mut plan = Plan::answer(1);
        if n == 0 {
            // The head and the role chunk at once, the first word after 20 s.
            plan.steps.insert(1, Sse::Wait(Duration::from_secs(20)));
        }
        plan
    })
    .await;
    let backup = Provider::spawn(|_, _| Plan::answer(1)).await;
    // What twenty healthy answers taught the primary's clocks: first words at 10 ms.
    let learned = AttemptClocks::default();
    for _ in 0..20 {
        learned.record_first_content(Duration::from_millis(10));
    }
    let client = gateway(ClientLayer::default(), &primary, &backup, learned);

    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(backend_of(&response), "backup");
    assert_eq!(read(response.into_body()).await.text, whole_answer());
    // First content learned at 10 ms: the 5 s floor, then the backup's first word.
    assert!(
        (Duration::from_secs(5)..Duration::from_millis(5100)).contains(&took),
        "{took:?}"
    );
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_after_40_of_60_tokens_is_continued_each_token_once() {
    let provider = Provider::spawn(|n, body| match n {
        0 => {
            let mut steps = words(1, 40, false);
            steps.push(Sse::Wait(Duration::from_millis(10)));
            steps.push(Sse::Cut);
            Plan::stream(steps)
        }
        _ => Plan::answer(resumes_at(body)),
    })
    .await;
    let client = ClientLayer::default().layer(hyper_client());
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    let read = read(response.into_body()).await;
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!(read.text, whole_answer());
    assert_eq!((read.done, read.error_event), (1, false));
    assert!(read.ids.iter().all(|id| id == "c1") && read.ids.len() > WORDS);
    assert_eq!(provider.hits(), 2);
    // The continuation: the 40 words as the assistant's prefill, 100 - 40 tokens left.
    let continuation: serde_json::Value =
        serde_json::from_str(&provider.bodies.lock().unwrap()[1]).unwrap();
    let prefill: String = (1..=40).map(|word| format!("w{word} ")).collect();
    assert_eq!(continuation["messages"][1]["content"], prefill.as_str());
    assert_eq!(continuation["max_tokens"], 60);
}

#[tokio::test(start_paused = true)]
async fn a_stream_stalled_half_way_is_continued_at_its_gap_clock() {
    let provider = Provider::spawn(|n, body| match n {
        20 => {
            let mut steps = words(1, 40, false);
            steps.push(Sse::Stall);
            Plan::stream(steps)
        }
        _ => Plan::answer(resumes_at(body)),
    })
    .await;
    let client = ClientLayer::default().layer(fresh_client());
    warm_up(&client, &provider.origin()).await;
    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    let read = read(response.into_body()).await;
    let took = started.elapsed();
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!((read.text, read.done), (whole_answer(), 1));
    // 40 words at 10 ms, then the 5 s gap floor (gaps learned at 10 ms), then the other 20
    // words: not the 60 s idle limit.
    assert!(
        (Duration::from_millis(5400)..Duration::from_millis(5700)).contains(&took),
        "{took:?}"
    );
    assert_eq!(provider.hits(), 22);
}

#[tokio::test(start_paused = true)]
async fn without_the_clocks_a_stalled_stream_waits_out_the_idle_limit() {
    let provider = Provider::spawn(|_, _| {
        let mut steps = words(1, 40, false);
        steps.push(Sse::Stall);
        Plan::stream(steps)
    })
    .await;
    let layer = ClientLayer::default()
        .without_clocks()
        .without_continuation();
    let client = layer.layer(fresh_client());
    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&provider.origin()))
        .await
        .unwrap();
    let read = read(response.into_body()).await;
    // 40 words at 10 ms, then the stream guard's 60 s of silence.
    assert_eq!(started.elapsed(), Duration::from_millis(60_400));
    assert!(read.error_event);
    let error = read.error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert!(matches!(interrupted.cause(), InterruptCause::Idle(_)));
    assert_eq!(provider.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_prefill_rejected_ends_with_the_original_cause_and_is_not_asked_again() {
    let provider = Provider::spawn(|n, _| match n {
        1 => Plan {
            status: 400,
            ..Plan::stream(vec![send(
                r#"{"error":{"message":"assistant prefill not supported","type":"invalid_request_error"}}"#,
            )])
        },
        _ => {
            let mut steps = words(1, 40, false);
            steps.push(Sse::Wait(Duration::from_millis(10)));
            steps.push(Sse::Cut);
            Plan::stream(steps)
        }
    })
    .await;
    let client = ClientLayer::default().layer(hyper_client());
    for (request, hits) in [(1, 2), (2, 3)] {
        let response = client
            .clone()
            .oneshot(chat_request(&provider.origin()))
            .await
            .unwrap();
        let read = read(response.into_body()).await;
        let prefill: String = (1..=40).map(|word| format!("w{word} ")).collect();
        assert_eq!(read.text, prefill, "request {request}");
        // The in-band error event, then the typed error with the cut as its cause, not the 400.
        assert!(read.error_event, "request {request}");
        let error = read.error.unwrap();
        let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
        assert!(matches!(interrupted.cause(), InterruptCause::Reset(_)));
        assert_eq!(interrupted.events(), 40);
        // The second request is not continued: the backend rejects prefills.
        assert_eq!(provider.hits(), hits, "request {request}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_loses_its_terminal_event_is_finished_or_continued() {
    let provider = Provider::spawn(|n, body| match n {
        // Finished (its finish chunk) and no `[DONE]`: ended at once with one.
        0 => {
            let mut steps = words(1, WORDS, true);
            steps.pop();
            Plan::stream(steps)
        }
        // Neither finished nor ended: continued.
        1 => Plan::stream(words(1, 40, false)),
        _ => Plan::answer(resumes_at(body)),
    })
    .await;
    let client = ClientLayer::default().layer(hyper_client());
    for hits in [1, 3] {
        let response = client
            .clone()
            .oneshot(chat_request(&provider.origin()))
            .await
            .unwrap();
        let read = read(response.into_body()).await;
        assert!(read.error.is_none(), "{:?}", read.error);
        assert_eq!((read.text, read.done), (whole_answer(), 1));
        assert_eq!(provider.hits(), hits);
    }
}

/// An axum gateway on loopback that relays every request to `origin` through `client` (the
/// engine or a failover), answering stormguard's own errors as `error_response` does.
async fn serve_gateway<S, B>(client: S, origin: http::Uri) -> Server
where
    S: tower::Service<http::Request<Full<Bytes>>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    S::Error: stormguard::classify::AsError + Send,
    B: http_body::Body<Data = Bytes, Error = stormguard::classify::BoxError> + Send + 'static,
{
    let router = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (client, origin) = (client.clone(), origin.clone());
        async move {
            let (head, body) = request.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let mut upstream = chat_request(&origin);
            *upstream.body_mut() = Full::new(body);
            upstream.headers_mut().extend(head.headers);
            match client.oneshot(upstream).await {
                Ok(response) => response.map(axum::body::Body::new),
                Err(error) => {
                    stormguard::error_response::<String>(&error, false).map(axum::body::Body::from)
                }
            }
        }
    });
    Server::spawn(router).await
}

#[tokio::test(start_paused = true)]
async fn a_reqwest_client_reads_a_cut_stream_whole_through_an_axum_gateway() {
    let provider = cutting_primary().await;
    let client = ClientLayer::default().layer(hyper_client());
    let gateway = serve_gateway(client, provider.origin()).await;
    let answer = reqwest_post(&gateway.url(PATH), REQUEST).await.raw;
    assert_eq!(text_of(&answer), whole_answer());
    assert_eq!(answer.matches("[DONE]").count(), 1);
    assert_eq!(provider.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_reqwest_client_gets_the_backups_answer_at_the_head_clock_through_an_axum_gateway() {
    let primary = Provider::spawn(|_, _| Plan {
        head_after: Duration::from_secs(1000),
        ..Plan::answer(1)
    })
    .await;
    let backup = Provider::spawn(|_, _| Plan::answer(1)).await;
    let client = gateway(ClientLayer::default(), &primary, &backup, quick_heads());
    let gateway = serve_gateway(client, primary.origin()).await;
    let started = Instant::now();
    let answer = reqwest_post(&gateway.url(PATH), REQUEST).await.raw;
    assert_eq!(text_of(&answer), whole_answer());
    // 3 s to the head clock, then the backup's 60 words at 10 ms.
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(3600)..Duration::from_millis(3800)).contains(&took),
        "{took:?}"
    );
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_reqwest_client_reads_the_in_band_error_of_a_stream_that_cannot_be_completed() {
    let provider = Provider::spawn(|_, _| {
        let mut steps = words(1, 40, false);
        steps.push(Sse::Wait(Duration::from_millis(10)));
        steps.push(Sse::Cut);
        Plan::stream(steps)
    })
    .await;
    let client = ClientLayer::default()
        .without_continuation()
        .layer(hyper_client());
    let gateway = serve_gateway(client, provider.origin()).await;
    let answer = reqwest_post(&gateway.url(PATH), REQUEST).await.raw;
    let prefill: String = (1..=40).map(|word| format!("w{word} ")).collect();
    assert_eq!(text_of(&answer), prefill);
    // What an SDK raises on: OpenAI's error frame, saying how much came.
    let error = answer
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .find_map(|data| {
            serde_json::from_str::<serde_json::Value>(data)
                .ok()?
                .get("error")
                .cloned()
        })
        .unwrap();
    assert_eq!(error["type"], "stream_interrupted");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("(reset) after 40 content events"),
        "{message}"
    );
    assert_eq!(answer.matches("[DONE]").count(), 0);
}

/// A primary that cuts its first answer after 40 words, and answers continuations.
async fn cutting_primary() -> Provider {
    Provider::spawn(|n, body| match n {
        0 => {
            let mut steps = words(1, 40, false);
            steps.push(Sse::Wait(Duration::from_millis(10)));
            steps.push(Sse::Cut);
            Plan::stream(steps)
        }
        _ => Plan::answer(resumes_at(body)),
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn under_a_failover_a_cut_stream_is_continued_by_the_next_backend() {
    let primary = cutting_primary().await;
    let backup = Provider::spawn(|_, body| Plan::answer(resumes_at(body))).await;
    let client = gateway(
        ClientLayer::default(),
        &primary,
        &backup,
        AttemptClocks::default(),
    );
    let response = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    assert_eq!(backend_of(&response), "primary");
    let read = read(response.into_body()).await;
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!((read.text, read.done), (whole_answer(), 1));
    // The primary's own ids throughout, though the backup wrote the second half.
    assert!(read.ids.iter().all(|id| id == "c1"));
    assert_eq!((primary.hits(), backup.hits()), (1, 1));
    let continuation: serde_json::Value =
        serde_json::from_str(&backup.bodies.lock().unwrap()[0]).unwrap();
    let prefill: String = (1..=40).map(|word| format!("w{word} ")).collect();
    assert_eq!(continuation["messages"][1]["content"], prefill.as_str());
}

#[tokio::test(start_paused = true)]
async fn under_a_failover_a_backend_that_rejects_the_prefill_is_passed_over() {
    let primary = cutting_primary().await;
    let backup = Provider::spawn(|_, _| Plan {
        status: 400,
        ..Plan::stream(vec![send(
            r#"{"error":{"message":"final assistant content not supported","type":"invalid_request_error"}}"#,
        )])
    })
    .await;
    let client = gateway(
        ClientLayer::default(),
        &primary,
        &backup,
        AttemptClocks::default(),
    );
    let response = client
        .clone()
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    let read = read(response.into_body()).await;
    // The backup's 400 sent the continuation back to the primary, which took it.
    assert!(read.error.is_none(), "{:?}", read.error);
    assert_eq!((read.text, read.done), (whole_answer(), 1));
    assert_eq!((primary.hits(), backup.hits()), (2, 1));
}

/// Clocks taught that this backend's stream heads come within 100 ms.
fn quick_heads() -> AttemptClocks {
    let learned = AttemptClocks::default();
    for _ in 0..20 {
        learned.record_head(true, Duration::from_millis(100));
    }
    learned
}

#[tokio::test(start_paused = true)]
async fn a_fired_clock_retries_when_it_can_and_keeps_the_attempt_when_it_cannot() {
    // The first attempt's head comes after 20 s, any other's at once.
    let slow_first = || {
        Provider::spawn(|n, _| Plan {
            head_after: Duration::from_secs(if n == 0 { 20 } else { 0 }),
            ..Plan::answer(1)
        })
    };
    for (attempts, answered_at, hits) in [(3, 3, 2), (1, 20, 1)] {
        let provider = slow_first().await;
        let client = ClientLayer::default()
            .with_backoff(stormguard::jitter::Constant::new(Duration::ZERO))
            .with_clocks(quick_heads())
            .with_max_attempts(attempts)
            .layer(fresh_client());
        let started = Instant::now();
        let response = client
            .oneshot(chat_request(&provider.origin()))
            .await
            .unwrap();
        let took = started.elapsed();
        // With attempts left: abandoned at the 3 s clock, retried. With none: kept, and its
        // answer at 20 s is the caller's, not a timeout at 3 s.
        let at = Duration::from_secs(answered_at);
        assert!(
            (at..at + Duration::from_millis(100)).contains(&took),
            "{took:?}"
        );
        assert_eq!(read(response.into_body()).await.text, whole_answer());
        assert_eq!(provider.hits(), hits, "{attempts} attempts");
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_configured_without_prefill_is_never_asked_to_continue() {
    let primary = cutting_primary().await;
    let backup = Provider::spawn(|_, body| Plan::answer(resumes_at(body))).await;
    let backend = |name: &str, provider: &Provider| {
        Backend::new(name).with_adapter(Adapter::new().with_origin(provider.origin()))
    };
    let client = Failover::new(ClientLayer::default())
        .with_backend(backend("primary", &primary))
        .with_backend(backend("backup", &backup).without_prefill())
        .layer(hyper_client());
    let response = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    let read = read(response.into_body()).await;
    // The continuation went to the primary, the backup never saw a prefill.
    assert_eq!((read.text, read.done), (whole_answer(), 1));
    assert_eq!((primary.hits(), backup.hits()), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn without_the_clocks_a_slow_first_token_is_waited_for() {
    let primary = Provider::spawn(|_, _| {
        let mut plan = Plan::answer(1);
        plan.steps.insert(1, Sse::Wait(Duration::from_secs(20)));
        plan
    })
    .await;
    let backup = Provider::spawn(|_, _| Plan::answer(1)).await;
    let layer = ClientLayer::default().without_clocks().without_hedging();
    let client = gateway(layer, &primary, &backup, AttemptClocks::default());
    let started = Instant::now();
    let response = client
        .oneshot(chat_request(&primary.origin()))
        .await
        .unwrap();
    // The role chunk at once, then 20 s to the first word: the request waits them out.
    let took = started.elapsed();
    assert!(
        (Duration::from_secs(20)..Duration::from_millis(20_100)).contains(&took),
        "{took:?}"
    );
    assert_eq!(backend_of(&response), "primary");
    assert_eq!(read(response.into_body()).await.text, whole_answer());
    assert_eq!((primary.hits(), backup.hits()), (1, 0));
}
