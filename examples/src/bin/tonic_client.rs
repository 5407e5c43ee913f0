//! A tonic client wrapped in stormguard's `ClientLayer`, against a local tonic server whose first
//! calls fail with UNAVAILABLE (a server still warming up). Prints every attempt the server saw
//! and the final status, then exits.
//!
//! ```text
//! cargo run -p stormguard-examples --bin tonic_client
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Layer, Service, ServiceBuilder};

/// Calls the server fails before it starts answering.
const WARM_UP_FAILURES: u32 = 2;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let log = Arc::new(CallLog::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .layer(WarmUpLayer {
                failures_left: Arc::new(AtomicU32::new(WARM_UP_FAILURES)),
                log: log.clone(),
            })
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let protected = ServiceBuilder::new()
        .layer(
            stormguard::ClientLayer::default()
                .with_backoff(stormguard::jitter::FullJitter::new(
                    Duration::from_millis(20),
                    Duration::from_millis(200),
                ))
                .with_timeout(Duration::from_secs(5)),
        )
        .service(channel);
    let mut client = HealthClient::new(protected);

    let answer = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;

    println!("server saw {} attempts:", log.len());
    for (n, entry) in log.entries().iter().enumerate() {
        println!("  #{n}: grpc-previous-rpc-attempts {entry}");
    }
    match answer {
        Ok(response) => println!(
            "final status: OK, serving status {:?}",
            response.into_inner().status()
        ),
        Err(status) => println!("final status: {:?} {}", status.code(), status.message()),
    }
    Ok(())
}

/// What the server saw of each call: its `grpc-previous-rpc-attempts` header.
#[derive(Default)]
struct CallLog(Mutex<Vec<String>>);

impl CallLog {
    fn push(&self, entry: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    fn entries(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Fails the first calls with UNAVAILABLE, then lets them through.
#[derive(Clone)]
struct WarmUpLayer {
    failures_left: Arc<AtomicU32>,
    log: Arc<CallLog>,
}

impl<S> Layer<S> for WarmUpLayer {
    type Service = WarmUp<S>;

    fn layer(&self, inner: S) -> WarmUp<S> {
        WarmUp {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
struct WarmUp<S> {
    inner: S,
    layer: WarmUpLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for WarmUp<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let previous = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .and_then(|value| value.to_str().ok())
            .unwrap_or("(none)")
            .to_owned();
        self.layer.log.push(previous);
        let warming_up = self
            .layer
            .failures_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if warming_up {
            let status = tonic::Status::unavailable("warming up");
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(self.inner.call(request))
    }
}
