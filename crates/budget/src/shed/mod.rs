//! Server side: shed retried requests once retries exceed the budget.
//!
//! A server behind many clients cannot make them retry less, but it can refuse their retries
//! cheaply when retries stop being a small fraction of its traffic. [`ShedRetriesLayer`] keeps a
//! [`RetryBudget`] of the server's own successes:
//!
//! * every response that is a success (2xx, and for gRPC no error `grpc-status` in the headers)
//!   is deposited;
//! * every request that says it is a retry (see [`previous_attempts`]) withdraws one retry; when
//!   the budget refuses, the request is answered at once, **without calling the handler**, with
//!   stormguard's one refusal ([`refusal_response`](stormguard_classify::refusal_response) for
//!   the reason `retry_budget_exhausted`),
//!   which tells the client not to retry again:
//!   * HTTP: `503 Service Unavailable` with `x-should-retry: false` (honoured by the official
//!     OpenAI and Anthropic SDKs and by stormguard's own retry engine);
//!   * gRPC (request `content-type: application/grpc...`): a trailers-only response, HTTP `200`
//!     with `content-type: application/grpc`, `grpc-status: 14` (UNAVAILABLE),
//!     `grpc-message: retry budget exhausted` and `grpc-retry-pushback-ms: -1`, which tells a
//!     gRFC A6 client not to retry;
//! * first attempts are never shed here: they are the traffic the budget exists to protect.
//!
//! A handler's errors pass through unchanged (so an axum `Router`, which needs `Infallible`,
//! still gets it), and neither errors nor non-2xx responses deposit.
//!
//! ```
//! use axum::{Router, routing::get};
//! use stormguard_budget::{BudgetConfig, RetryBudget, ShedRetriesLayer};
//!
//! // Retries may be at most 10% of recent successes, with no floor.
//! let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", get(|| async { "ok" }))
//!     .layer(ShedRetriesLayer::new(budget.clone()));
//! # let _ = app;
//! ```

mod future;
mod layer;

use std::task::{Context, Poll};

use http::{Request, Response};
use stormguard_classify::{Outcome, Reason, headers, is_grpc};
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::layer::ShedRetriesLayer;
use crate::{RetryBudget, previous_attempts};

/// What a shed retry is, for [`refusal_response`](stormguard_classify::refusal_response): refused
/// for the retry budget, and not accepted (the handler never saw it).
const SHED: Outcome = Outcome::fatal(Reason::RetryBudgetExhausted).with_accepted(false);

/// The service built by [`ShedRetriesLayer`]: passes first attempts and budgeted retries to
/// `inner`, sheds the other retries, deposits successes.
#[derive(Clone, Debug)]
pub struct ShedRetries<S> {
    inner: S,
    budget: RetryBudget,
}

impl<S> ShedRetries<S> {
    /// Wrap `inner`, drawing on `budget`.
    pub fn new(inner: S, budget: RetryBudget) -> Self {
        Self { inner, budget }
    }

    /// The budget this service draws on.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ShedRetries<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let previous = previous_attempts(request.headers());
        if previous > 0 && !self.budget.withdraw() {
            let grpc = is_grpc(request.headers());
            tracing::debug!(
                previous_attempts = previous,
                grpc,
                "retry shed: server retry budget exhausted"
            );
            return ResponseFuture::shed(grpc);
        }
        ResponseFuture::called(self.inner.call(request), self.budget.clone())
    }
}

/// Does this response count as a success for the budget? 2xx, and no gRPC error status in the
/// headers (a trailers-only gRPC error). A gRPC call that fails later, in its trailers, has
/// already been counted: the budget cannot wait for the end of a stream.
fn is_success<B>(response: &Response<B>) -> bool {
    response.status().is_success()
        && response
            .headers()
            .get(headers::GRPC_STATUS)
            .is_none_or(|status| status.as_bytes().trim_ascii() == b"0")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use crate::BudgetConfig;

    use http::{HeaderValue, StatusCode, header};
    use stormguard_classify::headers::{GRPC_PREVIOUS_RPC_ATTEMPTS, X_RETRY_ATTEMPT};
    use tower::{ServiceExt, service_fn};
    use tower_layer::Layer;

    use super::*;

    /// A handler that answers with the status named by the path (`/200`, `/500`, ...) and, for
    /// `/grpc/N`, a gRPC trailers-only response with `grpc-status: N`. Counts its calls.
    fn app(
        budget: &RetryBudget,
        calls: &Arc<AtomicU32>,
    ) -> ShedRetries<
        impl Service<Request<()>, Response = Response<String>, Error = std::convert::Infallible> + Clone,
    > {
        let calls = calls.clone();
        let handler = service_fn(move |request: Request<()>| {
            calls.fetch_add(1, Ordering::Relaxed);
            let path = request.uri().path().to_owned();
            async move {
                let mut response = Response::new(String::from("handled"));
                if let Some(code) = path.strip_prefix("/grpc/") {
                    let fields = response.headers_mut();
                    fields.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/grpc"),
                    );
                    if !code.is_empty() {
                        fields.insert(headers::GRPC_STATUS, HeaderValue::from_str(code).unwrap());
                    }
                } else {
                    *response.status_mut() =
                        StatusCode::from_bytes(path.trim_start_matches('/').as_bytes()).unwrap();
                }
                Ok(response)
            }
        });
        ShedRetriesLayer::new(budget.clone()).layer(handler)
    }

    fn request(path: &str, previous_attempts: Option<&'static str>) -> Request<()> {
        let mut builder = Request::builder().uri(path);
        if let Some(previous) = previous_attempts {
            builder = builder.header(X_RETRY_ATTEMPT, previous);
        }
        builder.body(()).unwrap()
    }

    async fn send<S>(service: &mut S, request: Request<()>) -> Response<String>
    where
        S: Service<Request<()>, Response = Response<String>, Error = std::convert::Infallible>,
    {
        service.ready().await.unwrap().call(request).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn first_attempts_are_never_shed() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = app(&budget, &calls);
        for _ in 0..50 {
            let response = send(&mut service, request("/500", None)).await;
            assert_eq!(response.status(), 500);
            let response = send(&mut service, request("/500", Some("0"))).await;
            assert_eq!(response.status(), 500);
        }
        assert_eq!(calls.load(Ordering::Relaxed), 100);
        // Failures deposit nothing, first attempts withdraw nothing.
        let snapshot = budget.snapshot();
        assert_eq!((snapshot.deposits, snapshot.withdrawals), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_beyond_the_budget_never_reach_the_handler() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = app(&budget, &calls);
        for _ in 0..20 {
            assert_eq!(
                send(&mut service, request("/200", None)).await.status(),
                200
            );
        }
        // 20 successes × 0.1: two retries get through (and fail again: no deposit).
        for _ in 0..2 {
            let response = send(&mut service, request("/503", Some("1"))).await;
            assert_eq!(response.status(), 503);
            assert_eq!(response.headers().get(headers::X_SHOULD_RETRY), None);
        }
        assert_eq!(calls.load(Ordering::Relaxed), 22);

        let shed = send(&mut service, request("/200", Some("2"))).await;
        assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(shed.headers()[headers::X_SHOULD_RETRY], "false");
        assert_eq!(shed.body(), "");
        assert_eq!(calls.load(Ordering::Relaxed), 22);
        assert_eq!(budget.snapshot().rejected, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn budget_follows_the_window() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = app(&budget, &calls);
        for _ in 0..20 {
            send(&mut service, request("/200", None)).await;
        }
        // The successes age out of the 10 s window: the earned retries go with them.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(budget.snapshot().deposits, 0);
        let shed = send(&mut service, request("/200", Some("1"))).await;
        assert_eq!(shed.status(), 503);
        assert_eq!(calls.load(Ordering::Relaxed), 20);

        // Traffic recovers: ten new successes earn one retry.
        for _ in 0..10 {
            send(&mut service, request("/200", None)).await;
        }
        assert_eq!(
            send(&mut service, request("/500", Some("1")))
                .await
                .status(),
            500
        );
        assert_eq!(
            send(&mut service, request("/500", Some("1")))
                .await
                .status(),
            503
        );
        assert_eq!(calls.load(Ordering::Relaxed), 31);
    }

    #[tokio::test(start_paused = true)]
    async fn grpc_retries_are_shed_with_unavailable_and_no_pushback() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = app(&budget, &calls);
        let request = Request::builder()
            .uri("/grpc/")
            .header(header::CONTENT_TYPE, "application/grpc+proto")
            .header(GRPC_PREVIOUS_RPC_ATTEMPTS, "1")
            .body(())
            .unwrap();
        let shed = send(&mut service, request).await;
        assert_eq!(shed.status(), StatusCode::OK);
        // Every refusal stormguard writes says `application/grpc`, whatever the request's flavour.
        assert_eq!(shed.headers()[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(shed.headers()[headers::GRPC_STATUS], "14");
        assert_eq!(
            shed.headers()[headers::GRPC_MESSAGE],
            "retry budget exhausted"
        );
        assert_eq!(shed.body(), "");
        assert_eq!(shed.headers()[headers::GRPC_RETRY_PUSHBACK_MS], "-1");
        assert_eq!(shed.headers().get(headers::X_SHOULD_RETRY), None);
        assert_eq!(calls.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn only_successes_deposit() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = app(&budget, &calls);
        // (path, deposits?)
        let cases = [
            ("/200", true),
            ("/204", true),
            ("/grpc/", true),
            ("/grpc/0", true),
            ("/grpc/14", false),
            ("/grpc/8", false),
            ("/grpc/abc", false),
            ("/301", false),
            ("/404", false),
            ("/429", false),
            ("/500", false),
            ("/529", false),
        ];
        for (path, deposits) in cases {
            let before = budget.snapshot().deposits;
            send(&mut service, request(path, None)).await;
            assert_eq!(
                budget.snapshot().deposits - before,
                u64::from(deposits),
                "{path}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn errors_pass_through_and_do_not_deposit() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(1.0));
        let mut service =
            ShedRetriesLayer::new(budget.clone()).layer(service_fn(|_: Request<()>| async {
                Err::<Response<String>, _>("connection reset")
            }));
        let error = service
            .ready()
            .await
            .unwrap()
            .call(request("/", None))
            .await
            .unwrap_err();
        assert_eq!(error, "connection reset");
        assert_eq!(budget.snapshot().deposits, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn unreadable_attempt_headers_count_as_retries() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = app(&budget, &calls);
        for hostile in ["", "-1", "abc", "123456789012345678901234567890"] {
            let response = send(&mut service, request("/200", Some(hostile))).await;
            assert_eq!(response.status(), 503, "{hostile:?}");
        }
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        assert_eq!(budget.snapshot().rejected, 4);
    }
}
