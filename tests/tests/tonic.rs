//! `ClientLayer` around a real tonic `Channel`, with tonic-health's generated client, against a
//! tonic server on loopback whose health service fails on purpose.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::budget::{BudgetConfig, RetryBudget};
use stormguard::{ClientLayer, ServerLayer};
use stormguard_tests::{
    assert_outage_within_floor, fast_client_layer, outage_budget, unthrottled_client_layer,
};
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

/// What the server saw of one call.
#[derive(Clone, Debug)]
struct Call {
    service: String,
    previous_attempts: Option<String>,
    grpc_timeout: Option<String>,
    idempotency_key: Option<String>,
    at: Instant,
}

/// A health service that fails its first `failures` calls with `failure()` and records every call.
#[derive(Clone)]
struct FlakyHealth {
    failures: usize,
    /// How long each call takes before answering.
    delay: Duration,
    failure: fn() -> Status,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl FlakyHealth {
    fn new(failures: usize, failure: fn() -> Status) -> Self {
        Self {
            failures,
            failure,
            calls: Arc::default(),
            delay: Duration::ZERO,
        }
    }

    fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl Health for FlakyHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let metadata = request.metadata();
        let text = |name: &str| {
            metadata
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let call = Call {
            service: request.get_ref().service.clone(),
            previous_attempts: text("grpc-previous-rpc-attempts"),
            grpc_timeout: text("grpc-timeout"),
            idempotency_key: text("idempotency-key"),
            at: Instant::now(),
        };
        let number = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(call);
            calls.len()
        };
        tokio::time::sleep(self.delay).await;
        if number <= self.failures {
            return Err((self.failure)());
        }
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving.into(),
        }))
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
    task: JoinHandle<()>,
}

impl GrpcServer {
    /// Serves `health` behind a `ServerLayer` whose budget never sheds (a floor of 1000 retries
    /// per second): these tests are about the client.
    async fn spawn(health: FlakyHealth) -> Self {
        Self::spawn_with(
            health,
            ServerLayer::default().with_budget(RetryBudget::new(
                BudgetConfig::default().with_min_per_sec(1000),
            )),
        )
        .await
    }

    /// Serves `health` behind `layer`.
    async fn spawn_with(health: FlakyHealth, layer: ServerLayer) -> Self {
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        let task = tokio::spawn(async move {
            Server::builder()
                .layer(layer)
                .add_service(HealthServer::new(health))
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
        Self { addr, task }
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn unavailable() -> Status {
    Status::unavailable("overloaded")
}

fn unavailable_with_pushback() -> Status {
    let mut status = Status::unavailable("overloaded, come back in 50 ms");
    status
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", "50".parse().unwrap());
    status
}

fn invalid_argument() -> Status {
    Status::invalid_argument("no such service name")
}

/// The deadline `call` carried in its `grpc-timeout` header.
fn sent_timeout(call: &Call) -> Duration {
    let sent = call.grpc_timeout.as_deref().unwrap();
    stormguard::deadline::propagate::parse_grpc_timeout(sent.as_bytes()).unwrap()
}

/// A health client calling `server` through `layer`.
async fn guarded_client(
    server: &GrpcServer,
    layer: ClientLayer,
) -> HealthClient<stormguard::ClientService<Channel>> {
    let channel = ServiceBuilder::new()
        .layer(layer)
        .service(server.channel().await);
    HealthClient::new(channel)
}

fn check_request() -> HealthCheckRequest {
    HealthCheckRequest {
        service: "stormguard.test.Echo".to_owned(),
    }
}

#[tokio::test]
async fn two_unavailable_then_serving_succeeds_with_previous_rpc_attempts() {
    let health = FlakyHealth::new(2, unavailable);
    let server = GrpcServer::spawn(health.clone()).await;
    let budget = RetryBudget::default();
    let layer = fast_client_layer(budget.clone()).with_timeout(Duration::from_secs(5));
    let mut client = guarded_client(&server, layer).await;

    let response = client.check(check_request()).await.unwrap();

    assert_eq!(response.get_ref().status(), ServingStatus::Serving);
    let calls = health.calls();
    assert_eq!(calls.len(), 3);
    let previous: Vec<_> = calls
        .iter()
        .map(|c| c.previous_attempts.as_deref())
        .collect();
    assert_eq!(previous, [None, Some("1"), Some("2")]);
    // The request message was replayed intact on every attempt.
    assert!(calls.iter().all(|c| c.service == "stormguard.test.Echo"));
    // gRPC calls never carry an Idempotency-Key.
    assert!(calls.iter().all(|c| c.idempotency_key.is_none()));
    // The deadline travels as grpc-timeout: at most the 5 s minus the 50 ms margin, re-stamped
    // (smaller) on each retry.
    let timeouts: Vec<Duration> = calls.iter().map(sent_timeout).collect();
    assert!(timeouts[0] <= Duration::from_millis(4950), "{timeouts:?}");
    assert!(timeouts[0] > Duration::from_millis(4000), "{timeouts:?}");
    assert!(timeouts[1] < timeouts[0] && timeouts[2] < timeouts[1]);
    assert_eq!(budget.snapshot().withdrawals, 2);
}

#[tokio::test]
async fn invalid_argument_is_not_retried() {
    let health = FlakyHealth::new(1, invalid_argument);
    let server = GrpcServer::spawn(health.clone()).await;
    let mut client = guarded_client(&server, fast_client_layer(RetryBudget::default())).await;

    let status = client.check(check_request()).await.unwrap_err();

    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(health.calls().len(), 1);
}

#[tokio::test]
async fn retry_pushback_is_honoured() {
    let health = FlakyHealth::new(1, unavailable_with_pushback);
    let server = GrpcServer::spawn(health.clone()).await;
    let mut client = guarded_client(&server, fast_client_layer(RetryBudget::default())).await;

    let response = client.check(check_request()).await.unwrap();

    assert_eq!(response.get_ref().status(), ServingStatus::Serving);
    let calls = health.calls();
    assert_eq!(calls.len(), 2);
    let gap = calls[1].at - calls[0].at;
    assert!(gap >= Duration::from_millis(50), "retried after {gap:?}");
}

#[tokio::test]
async fn total_outage_is_amplified_no_more_than_the_budget_floor() {
    const REQUESTS: usize = 100;
    let floor = 10;
    let budget = outage_budget();
    let health = FlakyHealth::new(usize::MAX, unavailable);
    let server = GrpcServer::spawn(health.clone()).await;
    let mut client = guarded_client(&server, unthrottled_client_layer(budget.clone())).await;

    for _ in 0..REQUESTS {
        let status = client.check(check_request()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        // What the engine gave up on tells the caller not to retry (gRFC A6).
        assert_eq!(
            status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .map(|v| v.to_str().unwrap()),
            Some("-1")
        );
    }

    assert_outage_within_floor("tonic", REQUESTS, health.calls().len(), floor);
    assert_eq!(budget.snapshot().withdrawals, 10);
}

#[tokio::test]
async fn a_server_layer_sheds_retries_beyond_its_budget_and_the_client_stops() {
    // No floor and no successes: the server sheds every retry.
    let server_budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let health = FlakyHealth::new(usize::MAX, unavailable);
    let server = GrpcServer::spawn_with(
        health.clone(),
        ServerLayer::default().with_budget(server_budget.clone()),
    )
    .await;
    let mut client = guarded_client(&server, fast_client_layer(RetryBudget::default())).await;

    let status = client.check(check_request()).await.unwrap_err();

    // Attempt 1 ran the handler; the retry (grpc-previous-rpc-attempts: 1) was shed with
    // UNAVAILABLE + grpc-retry-pushback-ms: -1, and the client did not spend its third attempt.
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "retry budget exhausted");
    assert_eq!(health.calls().len(), 1);
    let snapshot = server_budget.snapshot();
    assert_eq!((snapshot.withdrawals, snapshot.rejected), (0, 1));
}

#[tokio::test]
async fn a_client_deadline_ends_a_slow_call_without_a_retry() {
    let health = FlakyHealth::new(0, unavailable).slow(Duration::from_secs(30));
    let server = GrpcServer::spawn(health.clone()).await;
    let layer = fast_client_layer(RetryBudget::default()).with_timeout(Duration::from_millis(200));
    let mut client = guarded_client(&server, layer).await;

    let status = client.check(check_request()).await.unwrap_err();

    // tonic's Channel enforces the stamped `grpc-timeout` (200 ms minus the 50 ms margin) itself
    // and reports its own expiry as CANCELLED; stormguard's deadline gives DEADLINE_EXCEEDED.
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    let calls = health.calls();
    assert_eq!(calls.len(), 1, "no retry once the deadline is spent");
    let sent = sent_timeout(&calls[0]);
    assert!(sent <= Duration::from_millis(150), "{sent:?}");
}
