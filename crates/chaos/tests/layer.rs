//! The chaos layer over a provider that always answers, on tokio's paused clock: each fault at
//! its rate (seeded, so the same calls every run), on its schedule, stream faults at their
//! event, both placements, and nothing at all when no fault is configured.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use stormguard_chaos::{ChaosBody, ChaosLayer, ErrorAnswer, Fault, FaultKind, Provider};
use stormguard_classify::{BoxError, Classify, Reason, TransportClassifier};
use stormguard_test_kit::ScriptedBody;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// The provider's event stream, in chunks that split events anywhere: five events (a role
/// chunk, three words, the end).
const STREAM: [&str; 4] = [
    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"One\"}}]}\n",
    "\ndata: {\"choices\":[{\"delta\":{\"content\":\" two\"}}]}\n\nda",
    "ta: {\"choices\":[{\"delta\":{\"content\":\" three\"}}]}\n\n",
    "data: [DONE]\n\n",
];
const WHOLE: &str = r#"{"choices":[{"message":{"content":"One two three"}}]}"#;

/// Where each event of [`STREAM`] ends, in its bytes.
fn event_ends() -> Vec<usize> {
    let stream = STREAM.concat();
    stream.match_indices("\n\n").map(|(at, _)| at + 2).collect()
}

/// A provider that answers at once: [`STREAM`] to a request with `accept: text/event-stream`,
/// [`WHOLE`] to the others.
fn provider()
-> impl Service<Request<()>, Response = Response<ScriptedBody>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|request: Request<()>| async move {
        let streaming = request.headers().contains_key(http::header::ACCEPT);
        let (content_type, chunks): (_, Vec<&str>) = if streaming {
            ("text/event-stream", STREAM.to_vec())
        } else {
            ("application/json", vec![WHOLE])
        };
        let mut response = Response::new(ScriptedBody::chunks(chunks));
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        Ok(response)
    })
}

fn request(path: &str, streaming: bool) -> Request<()> {
    let mut request = Request::post(path).body(()).unwrap();
    if streaming {
        request
            .headers_mut()
            .insert(http::header::ACCEPT, "text/event-stream".parse().unwrap());
    }
    request
}

const CHAT: &str = "/v1/chat/completions";
const CALLS: usize = 1_000;
/// How many of [`CALLS`] calls a fault at 10% hits with seed 42: every fault below, since each
/// layer draws the same sequence. Exact (a seeded draw), and within two standard deviations
/// (9.5) of the expected 100 (so is [`STREAMS_HIT_AT_SEED_42`]).
const HIT_AT_SEED_42: usize = 94;

/// What a caller saw of one call.
#[derive(Debug)]
enum Seen {
    /// The answer, its status and whole body (or the body's error, after what it sent).
    Answer(u16, String, Option<String>),
    Error(BoxError),
    /// Nothing, for an hour.
    Silence,
}

/// Makes one call through `client` and reads its answer to the end. A head that does not come
/// within an hour is a silence; a body frame that does not, a stall.
async fn call<S>(client: &mut S, request: Request<()>) -> (Seen, Duration)
where
    S: Service<Request<()>, Response = Response<ChaosBody<ScriptedBody>>, Error = BoxError>,
{
    let started = Instant::now();
    let answer = client.ready().await.unwrap().call(request);
    let response = match tokio::time::timeout(HOUR, answer).await {
        Err(_) => return (Seen::Silence, started.elapsed()),
        Ok(Err(error)) => return (Seen::Error(error), started.elapsed()),
        Ok(Ok(response)) => response,
    };
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut text = Vec::new();
    let failed = loop {
        match tokio::time::timeout(HOUR, body.frame()).await {
            Err(_) => break Some("stalled".to_owned()),
            Ok(None) => break None,
            Ok(Some(Ok(frame))) => text.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Ok(Some(Err(error))) => break Some(error.to_string()),
        }
    };
    let seen = Seen::Answer(status, String::from_utf8(text).unwrap(), failed);
    (seen, started.elapsed())
}

const HOUR: Duration = Duration::from_secs(3_600);
const MESSAGES: &str = "/v1/messages";

/// [`CALLS`] calls of `streaming` requests to `path` through `chaos`, one after the other: what
/// the caller saw of each, and how long it took.
async fn run(chaos: &ChaosLayer, path: &str, streaming: bool) -> Vec<(Seen, Duration)> {
    let mut client = chaos.layer(provider());
    let mut seen = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        seen.push(call(&mut client, request(path, streaming)).await);
    }
    seen
}

/// Whether the call was answered untouched: the provider's answer, whole, at once.
fn untouched(streaming: bool, (seen, took): &(Seen, Duration)) -> bool {
    let expected = if streaming {
        STREAM.concat()
    } else {
        WHOLE.to_owned()
    };
    matches!(seen, Seen::Answer(200, text, None) if *text == expected) && took.is_zero()
}

/// The numbers of the calls `kind` was injected into, checking that each of them shows it as
/// it should (for a request to `path`) and that every other call went through untouched.
fn hits(kind: FaultKind, path: &str, streaming: bool, seen: &[(Seen, Duration)]) -> Vec<usize> {
    let provider = Provider::of_path(path);
    let stream = STREAM.concat();
    let ends = event_ends();
    let upto = |events: u32| match events {
        0 => "",
        n => &stream[..ends[n as usize - 1]],
    };
    let mut hits = Vec::new();
    for (n, call) in seen.iter().enumerate() {
        if untouched(streaming, call) {
            continue;
        }
        let (seen, took) = call;
        let shown = match (kind, seen) {
            (FaultKind::Answer(answer), Seen::Answer(status, text, None)) => {
                *status == answer.status().as_u16() && text == answer.body(provider)
            }
            (FaultKind::Latency(delay), Seen::Answer(200, text, None)) => {
                *took == delay && *text == WHOLE
            }
            (FaultKind::Silence, Seen::Silence) => *took == HOUR,
            (FaultKind::Reset, Seen::Error(error)) => {
                let outcome = TransportClassifier.classify_error(&**error);
                outcome.is_retryable()
                    && outcome.reason() == Reason::Transport
                    && error
                        .downcast_ref::<std::io::Error>()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
            }
            (FaultKind::ErrorBeforeContent, Seen::Answer(200, text, None)) => {
                text.as_bytes() == provider.error_event()
            }
            (FaultKind::CutAfter(events), Seen::Answer(200, text, Some(error))) => {
                text == upto(events) && error.contains("connection reset")
            }
            (FaultKind::StallAfter(events), Seen::Answer(200, text, Some(stalled))) => {
                text == upto(events) && stalled == "stalled"
            }
            (FaultKind::MalformedAfter(events), Seen::Answer(200, text, None)) => {
                let malformed = String::from_utf8(provider.malformed_event().to_vec()).unwrap();
                *text
                    == format!(
                        "{}{malformed}{}",
                        upto(events),
                        &stream[upto(events).len()..]
                    )
            }
            _ => false,
        };
        assert!(
            shown,
            "{kind} on call {n} to {path}: {seen:?} after {took:?}"
        );
        hits.push(n);
    }
    hits
}

#[tokio::test(start_paused = true)]
async fn a_layer_without_faults_passes_every_call_through_untouched() {
    let chaos = ChaosLayer::new();
    for streaming in [false, true] {
        for call in run(&chaos, CHAT, streaming).await {
            assert!(untouched(streaming, &call), "{call:?}");
        }
    }
    let snapshot = chaos.snapshot();
    assert_eq!(snapshot.calls, 2 * CALLS as u64);
    assert_eq!((snapshot.in_flight, snapshot.injected()), (0, 0));
    assert!(snapshot.faults.is_empty() && chaos.seed().is_none());
}

#[tokio::test(start_paused = true)]
async fn each_call_fault_hits_its_rate_of_the_calls_and_the_same_calls_every_run() {
    let mut kinds: Vec<FaultKind> = ANSWERS.into_iter().map(FaultKind::Answer).collect();
    kinds.extend([
        FaultKind::Latency(Duration::from_millis(250)),
        FaultKind::Silence,
        FaultKind::Reset,
    ]);
    let mut first: Option<Vec<usize>> = None;
    for kind in kinds {
        for path in [CHAT, MESSAGES] {
            let chaos = ChaosLayer::new()
                .with_seed(42)
                .with_fault(Fault::new(kind, 0.1));
            // A stream fault beside it takes nothing from the calls' share.
            let chaos = chaos.with_fault(Fault::new(FaultKind::CutAfter(1), 1.0));
            let hits = hits(kind, path, false, &run(&chaos, path, false).await);
            assert_eq!(hits.len(), HIT_AT_SEED_42, "{kind} to {path}");
            let snapshot = chaos.snapshot();
            assert_eq!(snapshot.faults[0].injected, hits.len() as u64, "{kind}");
            // Whole answers: the stream fault never acts.
            assert_eq!(snapshot.faults[1].injected, 0, "{kind}");
            assert_eq!(snapshot.in_flight, 0, "{kind}");
            // The same seed, the same calls, whatever the fault.
            match &first {
                Some(first) => assert_eq!(&hits, first, "{kind} to {path}"),
                None => first = Some(hits),
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn each_stream_fault_acts_at_its_event_in_its_rate_of_the_streams() {
    let kinds = [
        FaultKind::ErrorBeforeContent,
        FaultKind::CutAfter(0),
        FaultKind::CutAfter(3),
        FaultKind::StallAfter(2),
        FaultKind::MalformedAfter(1),
        FaultKind::MalformedAfter(3),
    ];
    for kind in kinds {
        for path in [CHAT, MESSAGES] {
            let chaos = ChaosLayer::new()
                .with_seed(42)
                .with_fault(Fault::new(kind, 0.1));
            let hits = hits(kind, path, true, &run(&chaos, path, true).await);
            assert_eq!(hits.len(), STREAMS_HIT_AT_SEED_42, "{kind} to {path}");
            let snapshot = chaos.snapshot();
            assert_eq!(snapshot.faults[0].injected, hits.len() as u64, "{kind}");
            assert_eq!(snapshot.in_flight, 0, "{kind}");
        }
    }
    // A stream that ends before the fault's place goes through whole, and counts nothing.
    let beyond = ChaosLayer::new().with_fault(Fault::new(FaultKind::CutAfter(6), 1.0));
    for call in run(&beyond, CHAT, true).await {
        assert!(untouched(true, &call), "{call:?}");
    }
    assert_eq!(beyond.snapshot().injected(), 0);
}

/// How many of [`CALLS`] streams a stream fault at 10% hits with seed 42 (the second draw of
/// each call).
const STREAMS_HIT_AT_SEED_42: usize = 86;

#[tokio::test(start_paused = true)]
async fn a_fault_acts_from_its_start_for_its_duration_and_never_outside() {
    let unavailable = FaultKind::Answer(ErrorAnswer::Unavailable);
    let chaos = ChaosLayer::new().with_fault(
        Fault::new(unavailable, 1.0)
            .with_start(Duration::from_secs(10))
            .with_duration(Some(Duration::from_secs(5))),
    );
    let origin = chaos.origin();
    let mut client = chaos.layer(provider());
    // One call every 100 ms for 20 s: those of 10 s to 15 s (excluded) fail, no other.
    for tenth in 0..200_u32 {
        tokio::time::sleep_until(origin + Duration::from_millis(100) * tenth).await;
        let on = chaos.faults()[0].is_on(Instant::now() - origin);
        assert_eq!(on, (100..150).contains(&tenth), "{tenth}");
        let (seen, _) = call(&mut client, request(CHAT, false)).await;
        let failed = matches!(seen, Seen::Answer(503, _, None));
        assert_eq!(failed, on, "{tenth}: {seen:?}");
    }
    assert_eq!(chaos.snapshot().injected(), 50);
    assert!(!chaos.snapshot().faults[0].on);

    // The schedule counts from the origin the layer is given.
    let later = Instant::now() + Duration::from_secs(60);
    let chaos = ChaosLayer::new()
        .with_origin(later)
        .with_fault(Fault::new(unavailable, 1.0));
    let mut client = chaos.layer(provider());
    assert!(untouched(
        false,
        &call(&mut client, request(CHAT, false)).await
    ));
    tokio::time::sleep_until(later).await;
    let (seen, _) = call(&mut client, request(CHAT, false)).await;
    assert!(matches!(seen, Seen::Answer(503, _, None)), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn a_silence_or_a_stall_stays_in_flight_until_its_caller_drops_it() {
    let chaos = ChaosLayer::new().with_fault(Fault::new(FaultKind::Silence, 1.0));
    let mut client = chaos.layer(provider());
    let mut pending = Box::pin(client.ready().await.unwrap().call(request(CHAT, false)));
    assert!(tokio::time::timeout(HOUR, &mut pending).await.is_err());
    assert_eq!(chaos.snapshot().in_flight, 1);
    drop(pending);
    assert_eq!(chaos.snapshot().in_flight, 0);

    let chaos = ChaosLayer::new().with_fault(Fault::new(FaultKind::StallAfter(1), 1.0));
    let mut client = chaos.layer(provider());
    let response = client.ready().await.unwrap().call(request(CHAT, true));
    let mut body = response.await.unwrap().into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first.len(), event_ends()[0]);
    assert!(tokio::time::timeout(HOUR, body.frame()).await.is_err());
    assert_eq!(chaos.snapshot().in_flight, 1);
    drop(body);
    assert_eq!(
        (chaos.snapshot().in_flight, chaos.snapshot().injected()),
        (0, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn in_front_of_a_server_a_reset_is_an_answer_whose_body_fails() {
    let chaos = ChaosLayer::for_server()
        .with_seed(1)
        .with_fault(Fault::new(FaultKind::Reset, 0.5))
        .with_fault(Fault::new(FaultKind::Answer(ErrorAnswer::Overloaded), 0.5));
    let router = axum::Router::new()
        .route(MESSAGES, axum::routing::post(|| async { "ok" }))
        .layer(chaos.clone());
    let (mut resets, mut overloaded) = (0, 0);
    for _ in 0..100 {
        let request = Request::post(MESSAGES)
            .body(axum::body::Body::empty())
            .unwrap();
        let Ok(response) = router.clone().oneshot(request).await;
        match response.status().as_u16() {
            200 => {
                let error = response.into_body().collect().await.unwrap_err();
                let io = stormguard_classify::chain(&error)
                    .find_map(|link| link.downcast_ref::<std::io::Error>());
                assert_eq!(
                    io.map(std::io::Error::kind),
                    Some(std::io::ErrorKind::ConnectionReset)
                );
                resets += 1;
            }
            529 => {
                let body = response.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(
                    body,
                    ErrorAnswer::Overloaded.body(Provider::Anthropic).as_bytes()
                );
                overloaded += 1;
            }
            status => panic!("{status}"),
        }
    }
    let snapshot = chaos.snapshot();
    assert_eq!(resets + overloaded, 100);
    assert_eq!(
        [snapshot.faults[0].injected, snapshot.faults[1].injected],
        [resets, overloaded]
    );
    assert_eq!(snapshot.in_flight, 0);
}

const ANSWERS: [ErrorAnswer; 7] = [
    ErrorAnswer::RateLimited { retry_after: None },
    ErrorAnswer::RateLimited {
        retry_after: Some(Duration::from_millis(1_500)),
    },
    ErrorAnswer::QuotaExhausted,
    ErrorAnswer::ContextTooLong,
    ErrorAnswer::ServerError,
    ErrorAnswer::Unavailable,
    ErrorAnswer::Overloaded,
];

/// The calls of [`run`] that a reset at 10% hit, with `seed`.
async fn resets_with(seed: u64) -> Vec<usize> {
    let chaos = ChaosLayer::new()
        .with_seed(seed)
        .with_fault(Fault::new(FaultKind::Reset, 0.1));
    hits(
        FaultKind::Reset,
        CHAT,
        false,
        &run(&chaos, CHAT, false).await,
    )
}

#[tokio::test(start_paused = true)]
async fn a_seed_replays_the_same_calls_and_another_seed_other_calls() {
    let (first, again, other) = (
        resets_with(42).await,
        resets_with(42).await,
        resets_with(43).await,
    );
    assert_eq!(first, again);
    assert_eq!(first.len(), HIT_AT_SEED_42);
    assert_ne!(first, other);
    // Another seed, another sample of the same rate: within two standard deviations of 100.
    assert!((81..=119).contains(&other.len()), "{}", other.len());
    let shared = first.iter().filter(|n| other.contains(n)).count();
    // Two independent samples of 10% share about 10% of their calls.
    assert!(shared < 30, "{shared} calls hit with both seeds");
}

#[tokio::test(start_paused = true)]
async fn odd_settings_are_brought_to_safe_ones_and_never_panic() {
    // Rates outside 0..=1, infinite or not a number.
    for (rate, brought) in [
        (f64::INFINITY, 1.0),
        (f64::NEG_INFINITY, 0.0),
        (f64::NAN, 0.0),
        (2.0, 1.0),
        (-0.5, 0.0),
        (f64::MIN_POSITIVE, f64::MIN_POSITIVE),
    ] {
        assert_eq!(Fault::new(FaultKind::Reset, rate).rate(), brought, "{rate}");
    }
    // Schedules at the ends of time: a start no run reaches, an end past `Duration::MAX`
    // (for ever), a duration of nothing (never on).
    let unreached = Fault::new(FaultKind::Reset, 1.0).with_start(Duration::MAX);
    let for_ever = Fault::new(FaultKind::Reset, 1.0)
        .with_start(Duration::from_secs(1))
        .with_duration(Some(Duration::MAX));
    let empty = Fault::new(FaultKind::Reset, 1.0).with_duration(Some(Duration::ZERO));
    assert!(!unreached.is_on(Duration::from_secs(100 * 365 * 86_400)));
    assert!(!for_ever.is_on(Duration::ZERO) && for_ever.is_on(Duration::MAX));
    assert!(!empty.is_on(Duration::ZERO) && !empty.is_on(Duration::MAX));

    // Through a layer, with the lowest seed: none of them acts, nor a cut after more events than
    // any stream has.
    let chaos = ChaosLayer::new()
        .with_seed(0)
        .with_fault(unreached)
        .with_fault(empty)
        .with_fault(Fault::new(FaultKind::CutAfter(u32::MAX), 1.0));
    for call in run(&chaos, CHAT, true).await {
        assert!(untouched(true, &call), "{call:?}");
    }
    assert_eq!(chaos.snapshot().injected(), 0);

    // The longest latency there is, with the highest seed: the call waits, like a silence, until
    // its caller gives up, and is let go of then.
    let chaos = ChaosLayer::new()
        .with_seed(u64::MAX)
        .with_fault(Fault::new(FaultKind::Latency(Duration::MAX), 1.0));
    let mut client = chaos.layer(provider());
    let (seen, took) = call(&mut client, request(CHAT, false)).await;
    assert!(matches!(seen, Seen::Silence) && took == HOUR, "{seen:?}");
    assert_eq!(
        (chaos.snapshot().in_flight, chaos.snapshot().injected()),
        (0, 1)
    );

    // An origin a century away: nothing is on before it.
    let origin = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
    let chaos = ChaosLayer::new()
        .with_origin(origin)
        .with_fault(Fault::new(FaultKind::Silence, 1.0));
    let mut client = chaos.layer(provider());
    assert!(untouched(
        false,
        &call(&mut client, request(CHAT, false)).await
    ));
    assert!(!chaos.snapshot().faults[0].on);
}
