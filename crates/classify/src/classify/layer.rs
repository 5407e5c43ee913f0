use tower_layer::Layer;

use super::ClassifyService;
use crate::LlmClassifier;

/// Turns responses the classifier calls failures into [`ClassifiedError`](super::ClassifiedError)s.
/// `M` is a [`MakeClassify`](crate::MakeClassify): any [`Classify`](crate::Classify) works, or a
/// maker that picks a classifier per request.
///
/// Many tower layers look only at `Result`: tower's own `retry` (its `Policy` sees `Err`),
/// `load_shed`, most circuit breakers. To them an HTTP `503` or a gRPC trailers-only `UNAVAILABLE`
/// is an `Ok`. Put `ClassifyLayer` *below* such a layer and every response the classifier calls a
/// failure (retryable or fatal) comes out as `Err(`[`ClassifiedError`](super::ClassifiedError)`)`, which carries the
/// response and its [`Outcome`](crate::Outcome); successes pass through untouched, and errors of
/// the inner service pass through boxed as [`BoxError`](crate::BoxError).
///
/// It classifies the response head only, with an empty body: buffering bodies would add latency
/// and memory to every failure, and a layer that only reads `Result` cannot use a body anyway. So
/// with [`LlmClassifier`](crate::LlmClassifier) a 429 is a retryable failure even when its body
/// says `insufficient_quota`; an engine that must tell those apart reads the body itself (the
/// [`Classify`](crate::Classify) contract, with [`ERROR_BODY_LIMIT`](crate::ERROR_BODY_LIMIT)).
///
/// Do not put it in front of stormguard's own retry engine or adaptive throttle: they classify
/// responses themselves (with the body) and would only see an error where a response was. The
/// [`Failure`](crate::Failure) in each [`ClassifiedError`](super::ClassifiedError)'s source chain keeps the outcome
/// readable by any classifier's `classify_error` all the same.
///
/// ```
/// use http::{Request, Response};
/// use stormguard_classify::{BoxError, ClassifiedError, ClassifyLayer, LlmClassifier};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let backend = service_fn(|_req: Request<()>| async {
///     Ok::<_, BoxError>(Response::builder().status(503).body("busy").unwrap())
/// });
/// let service = ClassifyLayer::new(LlmClassifier::default()).layer(backend);
/// let error = service.oneshot(Request::new(())).await.unwrap_err();
/// let failure = error.downcast::<ClassifiedError<&str>>().unwrap();
/// assert!(failure.outcome().is_retryable());
/// assert_eq!(failure.into_response().status(), 503);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassifyLayer<M = LlmClassifier> {
    make_classifier: M,
}

impl<M> ClassifyLayer<M> {
    /// A layer classifying with `make_classifier` (a classifier, or a maker of one per request).
    pub const fn new(make_classifier: M) -> Self {
        ClassifyLayer { make_classifier }
    }
}

impl<S, M: Clone> Layer<S> for ClassifyLayer<M> {
    type Service = ClassifyService<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        ClassifyService::new(inner, self.make_classifier.clone())
    }
}
