//! `stormguard::grpc::ServiceConfigLayer` around a real tonic `Channel` (tonic-health's generated
//! client) against a tonic server on loopback that answers as each test scripts it: one test
//! per applied field of a gRFC A6 service config.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::grpc::{ServiceConfig, ServiceConfigLayer, ServiceConfigService};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::ServiceBuilder;

const MS: Duration = Duration::from_millis(1);

/// How the server answers one call: after `delay`, with `status` (`None`: SERVING).
#[derive(Clone)]
struct Answer {
    delay: Duration,
    status: Option<(Code, Option<&'static str>)>,
}

fn ok() -> Answer {
    Answer {
        delay: Duration::ZERO,
        status: None,
    }
}

fn fail(code: Code) -> Answer {
    Answer {
        delay: Duration::ZERO,
        status: Some((code, None)),
    }
}

/// A failure with `grpc-retry-pushback-ms: pushback`.
fn pushed_back(code: Code, pushback: &'static str) -> Answer {
    Answer {
        delay: Duration::ZERO,
        status: Some((code, Some(pushback))),
    }
}

impl Answer {
    fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// What the server saw of one call.
#[derive(Clone, Debug)]
struct Call {
    previous_attempts: Option<String>,
    grpc_timeout: Option<String>,
    at: Instant,
}

/// A health service answering its n-th call with the n-th answer (the last one from then on).
#[derive(Clone)]
struct Scripted {
    answers: Arc<Vec<Answer>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

#[tonic::async_trait]
impl Health for Scripted {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let text = |name: &str| {
            let value = request.metadata().get(name)?;
            value.to_str().ok().map(str::to_owned)
        };
        let call = Call {
            previous_attempts: text("grpc-previous-rpc-attempts"),
            grpc_timeout: text("grpc-timeout"),
            at: Instant::now(),
        };
        let number = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(call);
            calls.len()
        };
        let answer = self.answers[(number - 1).min(self.answers.len() - 1)].clone();
        tokio::time::sleep(answer.delay).await;
        match answer.status {
            None => Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving.into(),
            })),
            Some((code, pushback)) => {
                let mut status = Status::new(code, "scripted");
                if let Some(pushback) = pushback {
                    let value = pushback.parse().unwrap();
                    status
                        .metadata_mut()
                        .insert("grpc-retry-pushback-ms", value);
                }
                Err(status)
            }
        }
    }

    type WatchStream = tonic::codegen::BoxStream<HealthCheckResponse>;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not watched in these tests"))
    }
}

/// A tonic server on loopback, stopped when dropped.
struct GrpcServer {
    addr: SocketAddr,
    health: Scripted,
    task: JoinHandle<()>,
}

impl GrpcServer {
    async fn spawn(answers: impl IntoIterator<Item = Answer>) -> Self {
        let health = Scripted {
            answers: Arc::new(answers.into_iter().collect()),
            calls: Arc::default(),
        };
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        let served = health.clone();
        let task = tokio::spawn(async move {
            Server::builder()
                .add_service(HealthServer::new(served))
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
        Self { addr, health, task }
    }

    fn calls(&self) -> Vec<Call> {
        self.health.calls.lock().unwrap().clone()
    }

    /// A health client calling this server through `layer`.
    async fn client(
        &self,
        layer: ServiceConfigLayer,
    ) -> HealthClient<ServiceConfigService<Channel>> {
        let channel = Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(ServiceBuilder::new().layer(layer).service(channel))
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A service config whose one method config, for the health service's `Check`, says `policy`.
fn layer(policy: &str) -> ServiceConfigLayer {
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "grpc.health.v1.Health", "method": "Check"}}], {policy}}}]}}"#
    );
    ServiceConfigLayer::new(ServiceConfig::from_json(&json).unwrap())
}

/// A retry policy of `attempts` with a 10 ms backoff, retrying `codes`.
fn retry(attempts: u32, codes: &str) -> String {
    format!(
        r#""retryPolicy": {{"maxAttempts": {attempts}, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
            "backoffMultiplier": 1, "retryableStatusCodes": [{codes}]}}"#
    )
}

async fn check(
    client: &mut HealthClient<ServiceConfigService<Channel>>,
) -> Result<ServingStatus, Status> {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let response = client.check(request).await?;
    Ok(response.into_inner().status())
}

fn previous_attempts(calls: &[Call]) -> Vec<Option<&str>> {
    calls
        .iter()
        .map(|call| call.previous_attempts.as_deref())
        .collect()
}

#[tokio::test]
async fn listed_codes_are_retried_with_previous_attempts_and_others_are_not() {
    let server = GrpcServer::spawn([fail(Code::Unavailable), fail(Code::Unavailable), ok()]).await;
    let mut client = server.client(layer(&retry(4, r#""UNAVAILABLE""#))).await;
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    assert_eq!(
        previous_attempts(&server.calls()),
        [None, Some("1"), Some("2")]
    );

    // INTERNAL is retryable by stormguard's default gRPC rules, but not listed here.
    let server = GrpcServer::spawn([fail(Code::Internal), ok()]).await;
    let mut client = server.client(layer(&retry(4, r#""UNAVAILABLE""#))).await;
    assert_eq!(check(&mut client).await.unwrap_err().code(), Code::Internal);
    assert_eq!(server.calls().len(), 1);

    // And a code listed by number is retried.
    let server = GrpcServer::spawn([fail(Code::Aborted), ok()]).await;
    let mut client = server.client(layer(&retry(2, "10"))).await;
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    assert_eq!(server.calls().len(), 2);
}

#[tokio::test]
async fn max_attempts_caps_the_call_at_five_and_the_last_failure_says_do_not_retry() {
    let server = GrpcServer::spawn([fail(Code::Unavailable)]).await;
    // 7 is taken as 5 (gRFC A6).
    let mut client = server.client(layer(&retry(7, r#""UNAVAILABLE""#))).await;
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        previous_attempts(&server.calls()),
        [None, Some("1"), Some("2"), Some("3"), Some("4")]
    );
    // Whoever is above must not retry it again.
    let pushback = status.metadata().get("grpc-retry-pushback-ms").unwrap();
    assert_eq!(pushback, "-1");

    let server = GrpcServer::spawn([fail(Code::Unavailable)]).await;
    let mut client = server.client(layer(&retry(2, r#""UNAVAILABLE""#))).await;
    assert!(check(&mut client).await.is_err());
    assert_eq!(server.calls().len(), 2);
}

/// gRPC's backoff: before retry n, `min(initialBackoff × backoffMultiplier^(n-1), maxBackoff)`
/// within ±20%. A real server runs on the real clock: the lower bounds are exact (a timer never
/// fires early), the upper ones leave 100 ms for the loopback round trip and the scheduler (the
/// exact bounds are checked on the paused clock in `crates/retry/tests/grpc.rs`).
#[tokio::test]
async fn backoff_grows_by_the_multiplier_up_to_the_maximum_within_twenty_percent() {
    let server = GrpcServer::spawn([fail(Code::Unavailable)]).await;
    let policy = r#""retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.3s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#;
    let mut client = server.client(layer(policy)).await;
    assert!(check(&mut client).await.is_err());
    let calls = server.calls();
    assert_eq!(calls.len(), 5);
    for (n, ceiling) in [100, 200, 300, 300].into_iter().enumerate() {
        let gap = calls[n + 1].at - calls[n].at;
        let (low, high) = (ceiling * 8 / 10, ceiling * 12 / 10 + 100);
        assert!(
            gap >= low * MS && gap <= high * MS,
            "retry {}: {gap:?} outside {low}..{high} ms",
            n + 1
        );
    }
}

#[tokio::test]
async fn a_hedge_goes_after_the_hedging_delay_and_the_first_ok_wins() {
    let slow = ok().after(Duration::from_secs(3));
    let server = GrpcServer::spawn([slow, ok()]).await;
    let policy = r#""hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.2s"}"#;
    let mut client = server.client(layer(policy)).await;
    let started = Instant::now();
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the hedge answered: {took:?}"
    );
    let calls = server.calls();
    assert_eq!(previous_attempts(&calls), [None, Some("1")]);
    // Timed where the server saw the calls: the first one reached it a moment after the
    // client's hedge clock started, so the gap can be a little under the 200 ms delay.
    let hedged_after = calls[1].at - calls[0].at;
    assert!(
        hedged_after >= 150 * MS && hedged_after < 400 * MS,
        "{hedged_after:?}"
    );
}

#[tokio::test]
async fn a_non_fatal_status_sends_the_next_hedge_at_once_and_a_fatal_one_ends_the_call() {
    let server = GrpcServer::spawn([fail(Code::Unavailable), ok()]).await;
    let policy = r#""hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "1s",
        "nonFatalStatusCodes": ["UNAVAILABLE"]}"#;
    let mut client = server.client(layer(policy)).await;
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    let calls = server.calls();
    assert_eq!(calls.len(), 2);
    let next_after = calls[1].at - calls[0].at;
    assert!(
        next_after < 500 * MS,
        "not the 1 s hedging delay: {next_after:?}"
    );

    let server = GrpcServer::spawn([fail(Code::InvalidArgument), ok()]).await;
    let mut client = server.client(layer(policy)).await;
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(server.calls().len(), 1);
}

/// `retryThrottling` with 4 tokens: retries go while more than 2 are left. The first call fails
/// (3 left, a retry goes), fails again (2 left: no more); the next call fails (1 left) and is
/// not retried at all; a success gives back 0.5.
#[tokio::test]
async fn throttling_stops_retries_after_failures_and_successes_refill_it() {
    let server = GrpcServer::spawn([
        fail(Code::Unavailable),
        fail(Code::Unavailable),
        fail(Code::Unavailable),
        ok(),
    ])
    .await;
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{}}], {}}}],
            "retryThrottling": {{"maxTokens": 4, "tokenRatio": 0.5}}}}"#,
        retry(5, r#""UNAVAILABLE""#)
    );
    let layer = ServiceConfigLayer::new(ServiceConfig::from_json(&json).unwrap());
    let tokens = layer.retry_tokens().unwrap().clone();
    let mut client = server.client(layer).await;
    assert!(check(&mut client).await.is_err());
    assert_eq!(server.calls().len(), 2);
    assert_eq!(tokens.tokens(), 2.0);
    assert!(check(&mut client).await.is_err());
    assert_eq!(
        server.calls().len(),
        3,
        "no retry once the tokens are at half"
    );
    assert_eq!(tokens.tokens(), 1.0);
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    assert_eq!(tokens.tokens(), 1.5);
}

#[tokio::test]
async fn the_timeout_is_sent_as_grpc_timeout_and_ends_a_slow_call() {
    let server = GrpcServer::spawn([ok()]).await;
    let mut client = server.client(layer(r#""timeout": "2s""#)).await;
    check(&mut client).await.unwrap();
    let calls = server.calls();
    let sent = calls[0].grpc_timeout.as_deref().unwrap();
    let sent = stormguard::deadline::propagate::parse_grpc_timeout(sent.as_bytes()).unwrap();
    // The time left, less the 50 ms margin.
    assert!(
        sent <= Duration::from_millis(1950) && sent > Duration::from_millis(1800),
        "{sent:?}"
    );

    let server = GrpcServer::spawn([ok().after(Duration::from_secs(5))]).await;
    let policy = format!(
        r#""timeout": "0.2s", {}"#,
        retry(3, r#""DEADLINE_EXCEEDED""#)
    );
    let mut client = server.client(layer(&policy)).await;
    let started = Instant::now();
    let status = check(&mut client).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    // The server ends it at the 150 ms it was sent (tonic's server honours grpc-timeout), or the
    // client's own deadline at 200 ms: never the 5 s the answer would take.
    assert!(
        took >= 150 * MS && took < Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(server.calls().len(), 1, "the deadline spans every attempt");
}

#[tokio::test]
async fn pushback_sets_the_delay_and_a_negative_one_stops_retries() {
    let server = GrpcServer::spawn([pushed_back(Code::Unavailable, "300"), ok()]).await;
    let mut client = server.client(layer(&retry(3, r#""UNAVAILABLE""#))).await;
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    let calls = server.calls();
    let waited = calls[1].at - calls[0].at;
    assert!(waited >= 300 * MS && waited < 700 * MS, "{waited:?}");

    for stop in ["-1", "later"] {
        let server = GrpcServer::spawn([pushed_back(Code::Unavailable, stop), ok()]).await;
        let mut client = server.client(layer(&retry(3, r#""UNAVAILABLE""#))).await;
        assert_eq!(
            check(&mut client).await.unwrap_err().code(),
            Code::Unavailable
        );
        assert_eq!(server.calls().len(), 1, "{stop}");
    }

    // A negative pushback stops hedges too: nothing more is sent after it.
    let server = GrpcServer::spawn([pushed_back(Code::Unavailable, "-1"), ok()]).await;
    let policy = r#""hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s",
        "nonFatalStatusCodes": ["UNAVAILABLE"]}"#;
    let mut client = server.client(layer(policy)).await;
    assert_eq!(
        check(&mut client).await.unwrap_err().code(),
        Code::Unavailable
    );
    tokio::time::sleep(200 * MS).await;
    assert_eq!(server.calls().len(), 1);
}

#[tokio::test]
async fn a_method_without_a_config_is_sent_once() {
    let server = GrpcServer::spawn([fail(Code::Unavailable), ok()]).await;
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "grpc.health.v1.Health", "method": "Watch"}}], {}}}]}}"#,
        retry(3, r#""UNAVAILABLE""#)
    );
    let mut client = server
        .client(ServiceConfigLayer::new(
            ServiceConfig::from_json(&json).unwrap(),
        ))
        .await;
    assert_eq!(
        check(&mut client).await.unwrap_err().code(),
        Code::Unavailable
    );
    assert_eq!(server.calls().len(), 1);
    // The default's 600 s deadline still applies (the `ClientLayer` it is built on).
    assert!(server.calls()[0].grpc_timeout.is_some());
}

/// Where the engine's hedging differs from gRFC A6's (see `ServiceConfigLayer`): two attempts in
/// flight at most, so a third is not sent at 2 × hedgingDelay while both are still running.
#[tokio::test]
async fn at_most_two_attempts_are_in_flight_at_once() {
    let server = GrpcServer::spawn([ok().after(Duration::from_millis(500))]).await;
    let policy = r#""hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.1s"}"#;
    let mut client = server.client(layer(policy)).await;
    let started = Instant::now();
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    let took = started.elapsed();
    assert!(
        took >= 500 * MS && took < 600 * MS,
        "the first answer: {took:?}"
    );
    assert_eq!(previous_attempts(&server.calls()), [None, Some("1")]);
}
