//! Misbehaving servers on real sockets: each backend is a raw `TcpListener` on 127.0.0.1 that
//! writes its HTTP/1.1 answer byte by byte, and the client is hyper-util's legacy client inside
//! `stormguard::ClientLayer` with a 2 s deadline (real time). Every case has one defined outcome,
//! reached within the deadline (or, where the deadline is what ends it, at the deadline), named
//! by its test.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stormguard::budget::RetryBudget;
use stormguard::classify::Reason;
use stormguard::classify::headers::X_SHOULD_RETRY;
use stormguard::deadline::DeadlineExceeded;
use stormguard::jitter::Constant;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard::{ClientLayer, GiveUpCause};
use stormguard_classify::{chain, outcome_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// The client's deadline, across all attempts.
const DEADLINE: Duration = Duration::from_secs(2);

/// Generous bound on any test: an outcome that takes longer is a hang.
const HANG: Duration = Duration::from_secs(10);

/// A backend answering every connection with `answer` once the request head has arrived. Returns
/// its address and the number of requests it received.
async fn backend<F, Fut>(answer: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (answer, counted) = (answer.clone(), counted.clone());
            tokio::spawn(async move {
                if read_head(&mut stream).await {
                    counted.fetch_add(1, Ordering::SeqCst);
                    answer(stream).await;
                }
            });
        }
    });
    (address, requests)
}

/// Reads until the end of a request head (the requests here are GETs without a body).
async fn read_head(stream: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut buffer = [0_u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return false,
            Ok(read) => head.extend_from_slice(&buffer[..read]),
        }
    }
    true
}

/// Writes `bytes`, ignoring a client that already hung up.
async fn write(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.write_all(bytes).await;
    let _ = stream.flush().await;
}

struct Setup {
    budget: RetryBudget,
    throttle: AdaptiveThrottle,
}

/// hyper-util's legacy client inside `stormguard::ClientLayer`.
type Guarded = stormguard::ClientService<
    Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    stormguard::classify::LlmClassifier,
    Constant,
>;

/// What a [`Guarded`] client answers a GET with.
type Outcome = Result<
    <Guarded as Service<Request<Full<Bytes>>>>::Response,
    <Guarded as Service<Request<Full<Bytes>>>>::Error,
>;

/// hyper-util's legacy client in the default pipeline, with a 2 s deadline and 50 ms between
/// attempts; the budget and throttle are returned for inspection.
fn client(setup: &Setup) -> Guarded {
    let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    ClientLayer::default()
        .with_budget(setup.budget.clone())
        .with_throttle(setup.throttle.clone())
        .with_backoff(Constant::new(Duration::from_millis(50)))
        .with_timeout(DEADLINE)
        .layer(hyper)
}

fn setup() -> Setup {
    Setup {
        budget: RetryBudget::default(),
        // A window longer than any test, so that counts do not age out while one runs.
        throttle: AdaptiveThrottle::new(
            ThrottleConfig::default()
                .with_k(2.0)
                .with_window(Duration::from_secs(60)),
        ),
    }
}

fn get(address: SocketAddr) -> Request<Full<Bytes>> {
    Request::get(format!("http://{address}/v1/models"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A backend that writes `bytes` and then holds the connection open, silent, past any test.
async fn write_then_stall(bytes: &'static [u8]) -> (SocketAddr, Arc<AtomicUsize>) {
    backend(move |mut stream| async move {
        write(&mut stream, bytes).await;
        tokio::time::sleep(HANG * 2).await;
    })
    .await
}

/// A backend that writes `bytes` and then closes the connection.
async fn write_then_close(bytes: &'static [u8]) -> (SocketAddr, Arc<AtomicUsize>) {
    backend(move |mut stream| async move {
        write(&mut stream, bytes).await;
        drop(stream);
    })
    .await
}

/// Sends a GET to `address` through a fresh [`client`] for `setup`; a hang fails the test.
async fn send(setup: &Setup, address: SocketAddr) -> Outcome {
    tokio::time::timeout(HANG, client(setup).oneshot(get(address)))
        .await
        .unwrap()
}

/// Checks what the throttle counted: `requests` attempts, `accepts` of them accepted.
fn assert_throttle_counted(setup: &Setup, requests: u64, accepts: u64) {
    let throttled = setup.throttle.snapshot();
    assert_eq!((throttled.requests, throttled.accepts), (requests, accepts));
}

/// Did the connection close before the announced body length (an `UnexpectedEof` io error in the
/// source chain)?
fn is_cut_short(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(error).any(|link| {
        link.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
    })
}

/// Does `error`'s source chain hold an `E`?
fn chain_has<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    chain(error).any(|link| link.is::<E>())
}

/// A 200 whose body stalls after 10 of its announced 100 bytes: the response is a success, handed
/// to the caller as soon as its head arrives (well within the deadline), and its first 10 bytes
/// are readable. The deadline holds to the body's last byte: at the 2 s deadline the stalled body
/// ends with `DeadlineExceeded` (its outcome `deadline_exceeded`), and nothing after it. Never
/// retried.
#[tokio::test]
async fn a_200_that_stalls_mid_body_is_handed_over_and_its_body_ends_at_the_deadline() {
    let (address, requests) = write_then_stall(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ncontent-type: application/json\r\n\r\n0123456789",
    )
    .await;
    let setup = setup();
    let started = Instant::now();
    let response = send(&setup, address).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() < DEADLINE,
        "head took {:?}",
        started.elapsed()
    );
    let mut body = response.into_body();
    let first = tokio::time::timeout(HANG, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        first.into_data().unwrap(),
        Bytes::from_static(b"0123456789")
    );
    let cut = tokio::time::timeout(HANG, body.frame()).await.unwrap();
    let ended = started.elapsed();
    let error = cut.unwrap().unwrap_err();
    assert_eq!(
        outcome_of(&*error).map(|outcome| outcome.reason()),
        Some(Reason::DeadlineExceeded)
    );
    assert!(chain_has::<DeadlineExceeded>(&*error), "{error:?}");
    assert!(
        ended >= DEADLINE && ended < DEADLINE + Duration::from_millis(500),
        "cut after {ended:?}"
    );
    assert!(body.frame().await.is_none());
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    assert_eq!(setup.budget.snapshot().deposits, 1);
    assert_eq!(setup.budget.snapshot().withdrawals, 0);
}

/// A 503 whose error body stalls: the engine reads the error body (to classify it) inside the
/// deadline, so the request fails with `DeadlineExceeded` at the 2 s deadline, not later, and
/// the stalled attempt is not retried (no time is left).
#[tokio::test]
async fn a_503_whose_error_body_stalls_fails_with_deadline_exceeded_at_the_deadline() {
    let (address, requests) = write_then_stall(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 100\r\ncontent-type: application/json\r\n\r\n{\"error\":",
    )
    .await;
    let setup = setup();
    let started = Instant::now();
    let error = send(&setup, address).await.unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(error.reason(), Reason::DeadlineExceeded, "{error}");
    assert!(chain_has::<DeadlineExceeded>(&error), "{error}");
    assert!(elapsed >= DEADLINE, "gave up early, after {elapsed:?}");
    assert!(
        elapsed < DEADLINE + Duration::from_secs(2),
        "took {elapsed:?}"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    assert_eq!(setup.budget.snapshot().withdrawals, 0);
    // The attempt was counted once by the throttle, as not accepted.
    assert_throttle_counted(&setup, 1, 0);
}

/// A 200 whose connection is closed after 10 of 100 body bytes: the response is handed over (a
/// stream that started is never restarted), the 10 bytes are read, then the body read fails with
/// an unexpected-EOF error. One request.
#[tokio::test]
async fn a_200_reset_mid_body_is_handed_over_and_its_body_fails_after_the_bytes_sent() {
    let (address, requests) =
        write_then_close(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789").await;
    let setup = setup();
    let response = send(&setup, address).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut read = Vec::new();
    let error = loop {
        match tokio::time::timeout(HANG, body.frame()).await.unwrap() {
            Some(Ok(frame)) => read.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(error)) => break error,
            None => panic!("the body ended cleanly after {} bytes", read.len()),
        }
    };
    assert_eq!(read, b"0123456789");
    assert!(is_cut_short(&*error), "{error:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

/// A 500 whose connection is closed in the middle of its error body: the engine classifies what
/// it read (a 500 is retryable), retries, and after the third such answer hands the last one back
/// marked `x-should-retry: false`; its body yields the bytes read, then the transport error.
#[tokio::test]
async fn a_500_reset_mid_error_body_is_retried_then_handed_back_marked_final() {
    let (address, requests) = write_then_close(
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 100\r\n\r\n{\"error\":",
    )
    .await;
    let setup = setup();
    let response = send(&setup, address).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    assert_eq!(setup.budget.snapshot().withdrawals, 2);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(
        first.into_data().unwrap(),
        Bytes::from_static(b"{\"error\":")
    );
    let rest = body.frame().await.unwrap();
    let error = rest.unwrap_err();
    assert!(is_cut_short(&*error), "{error:?}");
}

/// A 200 `text/event-stream` whose first event is `event: error` (how streaming LLM APIs report a
/// failure after the stream started): the stream guard reads it before anyone sees it, and it is
/// a failure like a 529: retried (3 attempts), counted as not accepted, and, once the retries run
/// out, handed back as it came, marked final.
#[tokio::test]
async fn a_200_event_stream_carrying_an_error_event_is_retried_like_a_529() {
    const EVENTS: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let (address, requests) = backend(|mut stream| async move {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            EVENTS.len()
        );
        write(&mut stream, head.as_bytes()).await;
        write(&mut stream, EVENTS).await;
    })
    .await;
    let setup = setup();
    let response = send(&setup, address).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[X_SHOULD_RETRY], "false");
    let body = tokio::time::timeout(HANG, response.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(body, Bytes::from_static(EVENTS));
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    let spent = setup.budget.snapshot();
    assert_eq!((spent.deposits, spent.withdrawals), (0, 2));
    assert_throttle_counted(&setup, 3, 0);
}

/// A response head with 10,000 headers: hyper refuses it (more headers than it parses) with a
/// parse error, which reaches the caller as an error, never a panic. Such an error is unknown to
/// the transport classifier, so it is retryable: the engine tries three times and then gives up
/// (attempts exhausted) with an error whose source chain holds hyper's error. All within the
/// deadline.
#[tokio::test]
async fn ten_thousand_response_headers_fail_as_a_classified_error_after_three_attempts() {
    let (address, requests) = backend(|mut stream| async move {
        let mut head = String::from("HTTP/1.1 200 OK\r\n");
        for n in 0..10_000 {
            head.push_str(&format!("x-header-{n}: {n}\r\n"));
        }
        head.push_str("content-length: 0\r\n\r\n");
        write(&mut stream, head.as_bytes()).await;
    })
    .await;
    let setup = setup();
    let started = Instant::now();
    let error = send(&setup, address).await.unwrap_err();
    assert!(started.elapsed() < DEADLINE, "took {:?}", started.elapsed());
    assert_eq!(
        error.gave_up(),
        Some(GiveUpCause::AttemptsExhausted),
        "{error:?}"
    );
    assert_eq!(error.attempts(), 3);
    let hyper = chain(&error)
        .find(|link| link.is::<hyper_util::client::legacy::Error>())
        .unwrap_or_else(|| panic!("{error:?}"));
    assert!(format!("{hyper:?}").contains("Parse"), "{hyper:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    assert_throttle_counted(&setup, 3, 0);
}
