//! Providers scripted in memory for the failover's tests: one service answering each request by
//! its host's script (`primary.test`, `secondary.test`), counting what each saw.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use stormguard_classify::headers::X_REQUEST_TIMEOUT_MS;
use tokio::time::{Instant, Sleep};

pub const MS: Duration = Duration::from_millis(1);

/// What a scripted provider answers, and what it saw.
#[derive(Clone, Debug)]
pub struct Provider {
    /// The status it answers; 0: it never answers.
    pub status: u16,
    pub delay: Duration,
    pub hits: u32,
    /// The `x-request-timeout-ms` of each request.
    pub time_left: Vec<u64>,
}

/// Providers by host: `primary.test`, `secondary.test`.
#[derive(Clone, Default)]
pub struct Providers(Arc<Mutex<HashMap<String, Provider>>>);

impl Providers {
    pub fn new(primary: u16, secondary: u16) -> Self {
        let providers = Self::default();
        providers.set("primary.test", primary, Duration::ZERO);
        providers.set("secondary.test", secondary, Duration::ZERO);
        providers
    }

    pub fn set(&self, host: &str, status: u16, delay: Duration) {
        let mut all = self.0.lock().unwrap();
        let provider = all.entry(host.to_owned()).or_insert(Provider {
            status,
            delay,
            hits: 0,
            time_left: Vec::new(),
        });
        provider.status = status;
        provider.delay = delay;
    }

    pub fn get(&self, host: &str) -> Provider {
        self.0.lock().unwrap()[host].clone()
    }

    pub fn hits(&self) -> (u32, u32) {
        (
            self.get("primary.test").hits,
            self.get("secondary.test").hits,
        )
    }

    pub fn service(&self) -> Scripted {
        Scripted {
            providers: self.clone(),
            ready_at: None,
            wait: None,
        }
    }

    /// The service, not ready before `at` (a connection pool, or a concurrency limit with no
    /// slot free, until then).
    pub fn service_ready_at(&self, at: Instant) -> Scripted {
        Scripted {
            ready_at: Some(at),
            ..self.service()
        }
    }
}

/// The providers as one service: each request answered by its host's script.
pub struct Scripted {
    providers: Providers,
    ready_at: Option<Instant>,
    /// Each clone waits for readiness on a timer of its own.
    wait: Option<Pin<Box<Sleep>>>,
}

impl Clone for Scripted {
    fn clone(&self) -> Self {
        Self {
            providers: self.providers.clone(),
            ready_at: self.ready_at,
            wait: None,
        }
    }
}

impl tower::Service<Request<Full<Bytes>>> for Scripted {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        let Some(at) = self.ready_at else {
            return Poll::Ready(Ok(()));
        };
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        wait.as_mut().poll(cx).map(Ok)
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let host = request.uri().host().unwrap_or_default().to_owned();
        let (status, delay) = {
            let mut all = self.providers.0.lock().unwrap();
            let provider = all.get_mut(&host).unwrap();
            provider.hits += 1;
            let left = request
                .headers()
                .get(X_REQUEST_TIMEOUT_MS)
                .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
            provider.time_left.extend(left);
            (provider.status, provider.delay)
        };
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if status == 0 {
                std::future::pending::<()>().await;
            }
            let response = Response::builder()
                .status(status)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            Ok(response)
        })
    }
}

/// A chat request to the primary.
pub fn request() -> Request<Full<Bytes>> {
    Request::post("http://primary.test/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")))
        .unwrap()
}
