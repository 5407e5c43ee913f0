#![allow(clippy::unwrap_used)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Request, Response};
use tower::{Layer, ServiceExt, service_fn};

use super::{ClassifiedError, ClassifyLayer};
use crate::{
    BoxError, Classify, GrpcCode, LlmClassifier, MakeClassify, Reason, TransportClassifier,
};

fn respond(status: u16, body: &'static str) -> Result<Response<&'static str>, BoxError> {
    Ok(Response::builder().status(status).body(body).unwrap())
}

fn llm_layer() -> ClassifyLayer<LlmClassifier> {
    ClassifyLayer::new(LlmClassifier::default())
}

#[tokio::test]
async fn successes_pass_through_untouched() {
    let service = llm_layer().layer(service_fn(|_: Request<()>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(200)
                .header("x-id", "7")
                .body("hello")
                .unwrap(),
        )
    }));
    let response = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-id"], "7");
    assert_eq!(*response.body(), "hello");
}

#[tokio::test]
async fn retryable_responses_become_errors_with_the_response() {
    let service = llm_layer().layer(service_fn(|_: Request<()>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(503)
                .header("retry-after", "2")
                .body("busy")
                .unwrap(),
        )
    }));
    let error = service.oneshot(Request::new(())).await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("response 503 Service Unavailable classified as retryable")
    );
    let failure = error.downcast::<ClassifiedError<&str>>().unwrap();
    assert!(failure.outcome().is_retryable());
    assert!(!failure.outcome().is_accepted());
    assert_eq!(
        failure.outcome().retry_after(),
        Some(std::time::Duration::from_secs(2))
    );
    assert_eq!(failure.status(), 503);
    assert_eq!(failure.headers()["retry-after"], "2");
    let response = failure.into_response();
    assert_eq!(*response.body(), "busy");
}

#[tokio::test]
async fn fatal_responses_become_errors_too() {
    let service = llm_layer().layer(service_fn(|_: Request<()>| async { respond(401, "") }));
    let error = service.oneshot(Request::new(())).await.unwrap_err();
    let failure = error.downcast_ref::<ClassifiedError<&str>>().unwrap();
    assert!(failure.outcome().is_fatal());
    assert_eq!(failure.outcome().reason(), Reason::Unauthorized);
}

#[tokio::test]
async fn only_the_head_is_classified() {
    // The body says insufficient_quota, but the layer does not buffer bodies: a 429 head is a
    // retryable rate limit.
    let body = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let service = llm_layer().layer(service_fn(move |_: Request<()>| async move {
        respond(429, body)
    }));
    let error = service.oneshot(Request::new(())).await.unwrap_err();
    let failure = error.downcast_ref::<ClassifiedError<&str>>().unwrap();
    assert_eq!(failure.outcome().reason(), Reason::RateLimited);
    assert!(failure.outcome().is_retryable());
}

#[tokio::test]
async fn grpc_trailers_only_failures_become_errors() {
    let service = llm_layer().layer(service_fn(|_: Request<()>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "14")
                .body(())
                .unwrap(),
        )
    }));
    let error = service.oneshot(Request::new(())).await.unwrap_err();
    let failure = error.downcast_ref::<ClassifiedError<()>>().unwrap();
    assert_eq!(
        failure.outcome().reason(),
        Reason::Grpc(GrpcCode::Unavailable)
    );
}

#[derive(Debug)]
struct BackendDown;

impl fmt::Display for BackendDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("backend down")
    }
}

impl std::error::Error for BackendDown {}

#[tokio::test]
async fn service_errors_pass_through() {
    let service = llm_layer().layer(service_fn(|_: Request<()>| async {
        Err::<Response<()>, _>(BackendDown)
    }));
    let error = service.oneshot(Request::new(())).await.unwrap_err();
    assert!(error.is::<BackendDown>());
}

#[tokio::test]
async fn the_outcome_survives_boxing() {
    let service = llm_layer().layer(service_fn(|_: Request<()>| async { respond(529, "") }));
    let error = service.oneshot(Request::new(())).await.unwrap_err();
    // A layer that does not know the body type still reads the classification.
    let outcome = LlmClassifier::default().classify_error(&*error);
    assert_eq!(outcome.reason(), Reason::Overloaded);
    assert!(outcome.is_retryable());
    assert!(!outcome.is_accepted());
}

/// Health checks only care about connectivity; everything else is an LLM call.
#[derive(Clone)]
struct ByPath;

#[derive(Clone)]
enum PathClassifier {
    Health(TransportClassifier),
    Llm(LlmClassifier),
}

impl Classify for PathClassifier {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> crate::Outcome {
        match self {
            PathClassifier::Health(c) => c.classify_http(parts, body),
            PathClassifier::Llm(c) => c.classify_http(parts, body),
        }
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> crate::Outcome {
        crate::transport::classify_error(error)
    }
}

impl MakeClassify for ByPath {
    type Classifier = PathClassifier;

    fn make_classifier<B>(&self, request: &Request<B>) -> PathClassifier {
        if request.uri().path() == "/health" {
            PathClassifier::Health(TransportClassifier)
        } else {
            PathClassifier::Llm(LlmClassifier::default())
        }
    }
}

#[tokio::test]
async fn request_aware_classifiers() {
    let service =
        ClassifyLayer::new(ByPath).layer(service_fn(|_: Request<()>| async { respond(503, "") }));
    let health = Request::builder().uri("/health").body(()).unwrap();
    assert_eq!(service.clone().oneshot(health).await.unwrap().status(), 503);
    let chat = Request::builder().uri("/v1/chat").body(()).unwrap();
    assert!(service.oneshot(chat).await.is_err());
}

/// tower's own retry, which only sees `Result`, retries what the classifier calls retryable.
#[derive(Clone)]
struct RetryClassified(usize);

impl tower::retry::Policy<Request<()>, Response<&'static str>, BoxError> for RetryClassified {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _request: &mut Request<()>,
        result: &mut Result<Response<&'static str>, BoxError>,
    ) -> Option<Self::Future> {
        let retryable = match result {
            Ok(_) => false,
            Err(error) => LlmClassifier::default()
                .classify_error(&**error)
                .is_retryable(),
        };
        (retryable && self.0 > 0).then(|| {
            self.0 -= 1;
            std::future::ready(())
        })
    }

    fn clone_request(&mut self, request: &Request<()>) -> Option<Request<()>> {
        Some(
            Request::builder()
                .uri(request.uri().clone())
                .body(())
                .unwrap(),
        )
    }
}

#[tokio::test]
async fn tower_retry_sees_classified_failures() {
    let calls = Arc::new(AtomicUsize::new(0));
    let backend = {
        let calls = calls.clone();
        service_fn(move |_: Request<()>| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if call < 2 {
                    respond(503, "busy")
                } else {
                    respond(200, "done")
                }
            }
        })
    };
    let service =
        tower::retry::RetryLayer::new(RetryClassified(5)).layer(llm_layer().layer(backend));
    let response = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(*response.body(), "done");
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // A fatal answer is not retried: one call.
    let calls = Arc::new(AtomicUsize::new(0));
    let backend = {
        let calls = calls.clone();
        service_fn(move |_: Request<()>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { respond(400, "bad") }
        })
    };
    let service =
        tower::retry::RetryLayer::new(RetryClassified(5)).layer(llm_layer().layer(backend));
    assert!(service.oneshot(Request::new(())).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn classified_error_is_send_sync_for_send_bodies() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    // A body that is Send but not Sync still makes a BoxError.
    assert_send_sync::<ClassifiedError<std::cell::Cell<u8>>>();
    let error = ClassifiedError::new(
        Response::new(()).into_parts().0,
        std::cell::Cell::new(3),
        crate::Outcome::retryable(Reason::Unavailable),
    );
    let boxed: BoxError = Box::new(error);
    assert!(format!("{boxed:?}").contains("Unavailable"));
}
