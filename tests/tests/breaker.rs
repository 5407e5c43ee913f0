//! The circuit breaker in the client engine, on real sockets: a hyper-util client against a
//! loopback provider that goes silent (a black hole) and comes back, a reqwest-middleware client
//! against 503s, and an axum gateway that answers the open breaker for its upstream.
//!
//! These run on real time, so the breaker is configured with short settings, every wait is
//! bounded by a timeout, and the assertions are about order and counts, never speed.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http::HeaderMap;
use http::StatusCode;
use reqwest_middleware::ClientBuilder;
use stormguard::breaker::{
    BreakerConfig, BreakerOpen, CircuitBreaker, Fallback, OpenCause, Rejected, State,
};
use stormguard::classify::Permit;
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::classify::{LocalAnswer, Outcome, Reason, chain};
use stormguard::reqwest::StormguardMiddleware;
use stormguard::{ClientLayer, ClientService};
use stormguard_tests::{
    BlackHoleProvider, CHAT_REQUEST, HyperClient, PROVIDER_ANSWER, Reply, ScriptedBackend, Server,
    body_text, chat_post, fast_backoff, hyper_client,
};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout};
use tower::{Layer, ServiceExt};

const PATH: &str = "/v1/chat/completions";

/// What the tests' fallback answers with.
const DEGRADED: &str = r#"{"choices":[],"degraded":true}"#;

/// The longest any phase of a test may take before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A breaker sized for a test on real time: a 1 s window, judged from 5 calls; a silence of
/// 300 ms with attempts in flight is a stall (at the tests' 50 requests per second, the 1 s
/// window promises 5 answers in 100 ms); open for 500 ms at first; one probe at a time, leased
/// for 300 ms.
fn short_breaker() -> CircuitBreaker {
    CircuitBreaker::new(
        BreakerConfig::default()
            .with_window(Duration::from_secs(1))
            .with_min_calls(5)
            .with_stall_detection(Duration::from_millis(300), 5.0)
            .with_open_wait(Duration::from_millis(500), Duration::from_secs(1))
            .with_probes(1, Duration::from_millis(300)),
    )
}

/// A fallback that answers 200 with [`DEGRADED`] and says in `x-fallback` whether the attempt
/// was cut in flight or refused before it was sent.
fn fallback() -> Fallback {
    Fallback::new(|_head, rejected| {
        let why = match rejected {
            Rejected::Open(open) if open.was_sent() => "cut",
            Rejected::Open(_) => "refused",
            Rejected::Full(_) => "bulkhead",
        };
        http::Response::builder()
            .header("x-fallback", why)
            .body(Bytes::from_static(DEGRADED.as_bytes()))
            .unwrap()
    })
}

/// How a request ended, as its caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// The provider answered, with this status.
    Provider(u16),
    /// The fallback answered for an attempt cut in flight.
    Cut,
    /// The fallback answered for a request refused before it was sent.
    Refused,
    /// The engine failed the request, for this reason.
    Failed(Reason),
}

/// Sends a chat request to `url` through `client`, and says how it ended.
async fn call(client: &ClientService<HyperClient>, url: &str) -> Answer {
    match client.clone().oneshot(chat_post(url)).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let fallback = response.extensions().get::<LocalAnswer>().is_some();
            let kind = response.headers().get("x-fallback").cloned();
            let local = response.body().is_local();
            let body = body_text(response).await;
            match kind {
                Some(kind) if fallback && local && body == DEGRADED => match kind.as_bytes() {
                    b"cut" => Answer::Cut,
                    b"refused" => Answer::Refused,
                    other => panic!("unexpected fallback {other:?}"),
                },
                _ => {
                    assert_eq!(body, PROVIDER_ANSWER);
                    Answer::Provider(status)
                }
            }
        }
        Err(error) => Answer::Failed(error.reason()),
    }
}

/// The hyper-util client behind the engine with `breaker`, the tests' fallback and a 3 s
/// deadline (so that an attempt nothing cuts ends within the test).
fn guarded(breaker: &CircuitBreaker) -> ClientService<HyperClient> {
    ClientLayer::default()
        .with_timeout(Duration::from_secs(3))
        .with_breaker(breaker.clone())
        .with_fallback(fallback())
        .layer(hyper_client())
}

/// Sends `count` requests one after another, 20 ms apart, and expects the provider's answer to
/// each.
async fn healthy_traffic(
    client: &ClientService<HyperClient>,
    provider: &BlackHoleProvider,
    count: usize,
) {
    for _ in 0..count {
        assert_eq!(
            call(client, &provider.url(PATH)).await,
            Answer::Provider(200)
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a request every 20 ms, each in its own task, until the breaker stops being closed;
/// returns the tasks.
async fn until_open(
    client: &ClientService<HyperClient>,
    provider: &BlackHoleProvider,
    breaker: &CircuitBreaker,
) -> JoinSet<Answer> {
    let mut tasks = JoinSet::new();
    let opened = timeout(PATIENCE, async {
        while breaker.state() == State::Closed {
            let (client, url) = (client.clone(), provider.url(PATH));
            tasks.spawn(async move { call(&client, &url).await });
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(opened.is_ok(), "the silence never opened the breaker");
    tasks
}

#[tokio::test]
async fn a_black_hole_is_cut_answered_locally_and_probed_back() {
    let provider = BlackHoleProvider::spawn().await;
    let breaker = short_breaker();
    let client = guarded(&breaker);

    // Healthy: every request answered by the provider.
    healthy_traffic(&client, &provider, 50).await;
    assert_eq!(provider.requests(), 50);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.state, snapshot.failures), (State::Closed, 0));

    // The provider goes silent; requests keep coming until the silence opens the breaker.
    let (requests, connections) = (provider.requests(), provider.connections());
    provider.go_silent();
    let tasks = until_open(&client, &provider, &breaker).await;
    let sent = tasks.len();
    let answers = timeout(PATIENCE, tasks.join_all()).await.unwrap();
    // Every request sent into the silence was cut by the stall and answered by the fallback
    // (or, sent as the breaker opened, refused): none waited for its 3 s deadline.
    let cut = answers.iter().filter(|a| **a == Answer::Cut).count();
    let refused = answers.iter().filter(|a| **a == Answer::Refused).count();
    assert_eq!(cut + refused, sent, "{answers:?}");
    assert!(cut >= 1, "{answers:?}");
    // What reached the provider: requests on connections it had open, and new connections it
    // swallowed. Each is one of the cut attempts.
    let reached = provider.requests() - requests + provider.connections() - connections;
    assert!((1..=cut).contains(&reached), "{reached} reached, {cut} cut");
    let snapshot = breaker.snapshot();
    assert_eq!(
        (snapshot.opened, snapshot.cause),
        (1, Some(OpenCause::Stall))
    );
    assert_eq!(snapshot.in_flight, 0);
    eprintln!(
        "black hole: {sent} requests into the silence, {cut} cut in flight, {refused} refused"
    );

    // Open: requests are answered at once by the fallback, and open no connection.
    let (requests, connections) = (provider.requests(), provider.connections());
    let mut while_open = 0;
    while while_open < 10 && breaker.state() == State::Open {
        assert_eq!(call(&client, &provider.url(PATH)).await, Answer::Refused);
        while_open += 1;
    }
    assert!(while_open >= 1, "the breaker was no longer open");
    assert_eq!(provider.requests(), requests);
    assert_eq!(provider.connections(), connections);

    // The provider answers again: the first probe closes the breaker, and the traffic is back.
    provider.resume();
    let back = timeout(PATIENCE, async {
        loop {
            let answer = call(&client, &provider.url(PATH)).await;
            if answer == Answer::Provider(200) {
                break;
            }
            assert_eq!(answer, Answer::Refused);
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "the breaker never closed");
    assert_eq!(breaker.state(), State::Closed);
    let requests = provider.requests();
    healthy_traffic(&client, &provider, 10).await;
    assert_eq!(provider.requests(), requests + 10);
    assert_eq!(breaker.snapshot().opened, 1);
}

#[tokio::test]
async fn a_probe_lost_in_the_black_hole_does_not_hold_the_way_back() {
    let provider = BlackHoleProvider::spawn().await;
    let breaker = short_breaker();
    let client = guarded(&breaker);
    healthy_traffic(&client, &provider, 50).await;
    provider.go_silent();
    let tasks = until_open(&client, &provider, &breaker).await;
    timeout(PATIENCE, tasks.join_all()).await.unwrap();

    // Still silent when the open wait ends: the first probe goes into the black hole.
    let (requests, connections) = (provider.requests(), provider.connections());
    let half_open = timeout(PATIENCE, async {
        while breaker.state() == State::Open {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(half_open.is_ok());
    let (lost_client, url) = (client.clone(), provider.url(PATH));
    let lost = tokio::spawn(async move { call(&lost_client, &url).await });
    let reached = timeout(PATIENCE, async {
        while provider.requests() + provider.connections() == requests + connections {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "the probe never reached the provider");
    assert_eq!(breaker.snapshot().probes, 1);

    // The provider comes back: once the lost probe's lease is over, the next probe finds it,
    // long before the lost one gives up.
    provider.resume();
    let back = timeout(PATIENCE, async {
        while call(&client, &provider.url(PATH)).await != Answer::Provider(200) {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "the breaker never closed");
    assert_eq!(breaker.state(), State::Closed);
    assert!(!lost.is_finished(), "the lost probe ended first");
    // Probes are not cut: the lost one ends at its deadline.
    let lost = timeout(PATIENCE, lost).await.unwrap().unwrap();
    assert_eq!(lost, Answer::Failed(Reason::DeadlineExceeded));
    assert_eq!(breaker.snapshot().in_flight, 0);
}

/// A reqwest-middleware client with the engine, drawing on `layer`.
fn reqwest_client(layer: ClientLayer) -> reqwest_middleware::ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(StormguardMiddleware::new(layer))
        .build()
}

/// The refusal in a reqwest-middleware error's source chain.
fn breaker_open(error: &reqwest_middleware::Error) -> &BreakerOpen {
    chain(error)
        .find_map(|link| link.downcast_ref::<BreakerOpen>())
        .unwrap_or_else(|| panic!("no BreakerOpen in {error:?}"))
}

#[tokio::test]
async fn reqwest_503s_open_the_breaker_and_its_refusals_are_errors() {
    let backend = ScriptedBackend::spawn([Reply::status(503)]).await;
    let breaker = short_breaker();
    let client = reqwest_client(
        ClientLayer::default()
            .with_backoff(fast_backoff())
            .with_breaker(breaker.clone()),
    );
    let post = || {
        client
            .post(backend.url(PATH))
            .header("content-type", "application/json")
            .body(CHAT_REQUEST)
            .send()
    };

    // Three attempts of the first request, two of the second: the fifth 503 opens the breaker,
    // which refuses the second request's retry.
    let response = post().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(backend.hits(), 3);
    let error = post().await.unwrap_err();
    assert_eq!(backend.hits(), 5);
    assert!(!breaker_open(&error).was_sent());
    assert_eq!(breaker_open(&error).cause(), OpenCause::Failures);
    let reqwest_middleware::Error::Middleware(engine) = error else {
        panic!("a refusal is the engine's own error: {error:?}");
    };
    let engine = engine.downcast::<stormguard::Error>().unwrap();
    assert_eq!(
        (engine.reason(), engine.attempts()),
        (Reason::BreakerOpen, 2)
    );

    // Open: refused before anything is sent.
    let error = post().await.unwrap_err();
    let open = breaker_open(&error);
    assert!(open.retry_after() <= Duration::from_millis(625), "{open}");
    assert_eq!(backend.hits(), 5);
    let snapshot = breaker.snapshot();
    assert_eq!((snapshot.calls, snapshot.failures), (5, 5));
}

#[tokio::test]
async fn reqwest_gets_the_fallback_while_the_breaker_is_open() {
    let backend = ScriptedBackend::spawn([Reply::status(200)]).await;
    let breaker = short_breaker();
    let failure = Outcome::retryable(Reason::Unavailable).with_accepted(false);
    for _ in 0..5 {
        breaker
            .try_acquire()
            .unwrap()
            .record(&failure, &HeaderMap::new());
    }
    let client = reqwest_client(
        ClientLayer::default()
            .with_breaker(breaker.clone())
            .with_fallback(fallback()),
    );

    let response = client.post(backend.url(PATH)).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-fallback"], "refused");
    // An answer of the caller's own, for the URL the caller asked.
    assert_eq!(response.url().as_str(), backend.url(PATH));
    let answer = response.extensions().get::<LocalAnswer>().unwrap();
    assert_eq!(answer.outcome().reason(), Reason::BreakerOpen);
    assert_eq!(response.text().await.unwrap(), DEGRADED);
    assert_eq!(backend.hits(), 0);
}

#[derive(Clone)]
struct Gateway {
    upstream: String,
    client: ClientService<HyperClient>,
}

/// Forwards a chat request upstream, and answers for the engine's errors by returning them.
async fn forward(Extract(gateway): Extract<Gateway>) -> Result<Response, stormguard::Error> {
    let response = gateway.client.oneshot(chat_post(&gateway.upstream)).await?;
    Ok(response.map(Body::new))
}

#[tokio::test]
async fn a_gateway_answers_an_open_breaker_with_503_retry_after_and_do_not_retry() {
    let upstream = ScriptedBackend::spawn([Reply::status(503)]).await;
    // Open for 30 s (stretched by up to 25%) once two calls failed; one attempt per request.
    let breaker = CircuitBreaker::new(
        BreakerConfig::default()
            .with_min_calls(2)
            .with_open_wait(Duration::from_secs(30), Duration::from_secs(60)),
    );
    let gateway = Gateway {
        upstream: upstream.url(PATH),
        client: ClientLayer::default()
            .with_max_attempts(1)
            .with_breaker(breaker.clone())
            .layer(hyper_client()),
    };
    let router = Router::new().route(PATH, post(forward)).with_state(gateway);
    let gateway = Server::spawn(router).await;
    let caller = hyper_client();

    // The upstream's own 503s, passed on.
    for _ in 0..2 {
        let response = caller.request(chat_post(&gateway.url(PATH))).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get("retry-after").is_none());
    }
    assert_eq!(breaker.state(), State::Open);

    // The gateway's own: the breaker refused, and says when to come back.
    let response = caller.request(chat_post(&gateway.url(PATH))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (30..=38).contains(&retry_after),
        "retry-after: {retry_after}"
    );
    assert_eq!(upstream.hits(), 2);
}
