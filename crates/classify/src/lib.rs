//! Failure classification for tower services: did a request succeed, can a retry help, when does
//! the server want it, and did the backend accept the request at all?
//!
//! # The problem
//! Every layer that reacts to results (retry, budget, adaptive throttle, circuit breaker) must
//! tell a retryable failure from a fatal one. Getting it wrong is what turns a blip into a retry
//! storm: retrying a 4xx (bad request, expired key, exhausted quota, a prompt longer than the
//! context window) never helps, burns money and can trip a provider's abuse detection, while not
//! retrying a 503 loses availability. Servers also say *when* to retry (`retry-after`,
//! `retry-after-ms`, `grpc-retry-pushback-ms`, rate-limit reset headers, Gemini's `RetryInfo`),
//! and whether to retry at all (`x-should-retry`). This crate answers those questions once, as an
//! [`Outcome`], so no layer re-implements status checks.
//!
//! # The rules
//! - HTTP status ([`HttpClassifier`]): 408, 409, 429, 5xx (but 501, 505) are retryable; other
//!   4xx are fatal; 429, 408 and retryable 5xx are *not accepted* (the backend rejected or failed
//!   the work), other answers are. Semantics from RFC 9110 section 15; the retryable set matches
//!   the official OpenAI and Anthropic SDKs (408, 409, 429, >= 500).
//! - gRPC status ([`GrpcClassifier`]): `grpc-status` from the headers of trailers-only responses;
//!   `UNAVAILABLE` and `INTERNAL` retryable, `RESOURCE_EXHAUSTED` only with a server hint, the rest
//!   fatal; `grpc-retry-pushback-ms` per gRFC A6 ("gRPC Retry Design"). See the table of
//!   [`GrpcClassifier`].
//! - Transport errors ([`TransportClassifier`]): `std::io::Error` kinds anywhere in the source
//!   chain, tower's and tokio's `Elapsed`; unknown errors are retryable and not accepted.
//! - LLM provider error bodies ([`LlmClassifier`], the default): the JSON error bodies of OpenAI,
//!   Anthropic and Gemini / Vertex AI, as documented in their API references ("Error codes",
//!   "Errors", "Troubleshooting" pages), refine the status: 429 `insufficient_quota` is fatal,
//!   429 `rate_limit_exceeded` retryable, 400 `context_length_exceeded` fatal with its own reason,
//!   Gemini `RetryInfo.retryDelay` is a hint, a Gemini daily `QuotaFailure` is fatal.
//! - Headers override: `x-should-retry: true | false` flips the verdict either way (OpenAI and
//!   Anthropic SDKs honour it first). Hints by precedence: `retry-after-ms` > `retry-after`
//!   (RFC 9110 section 10.2.3, with the three HTTP-date formats of section 5.6.7) >
//!   `grpc-retry-pushback-ms` > body `RetryInfo` > `x-ratelimit-reset-*` /
//!   `anthropic-ratelimit-*-reset`. See [`hint`].
//!
//! Hints are reported as parsed (bounded by [`hint::HINT_CEILING`], one day): the retry engine's
//! hint policy, not the classifier, decides that a hint above its maximum (default
//! [`hint::DEFAULT_MAX_HINT`], 60 s) means "do not retry".
//!
//! # Decisions worth knowing
//! - *Accepted* means "the backend did the work and answered". Rate limits, overload,
//!   unavailability, timeouts and transport failures are not accepted; fatal answers (quota,
//!   billing, bad requests, auth) are, so that a client-side throttle does not hide an
//!   informative error behind local drops. Exceptions: gRPC `DEADLINE_EXCEEDED` and
//!   `RESOURCE_EXHAUSTED` are fatal without a hint yet not accepted (the server refused or ran out
//!   of time).
//! - A body only ever makes a verdict *stricter*: quota, billing, spend-limit, context-length and
//!   content-policy errors are fatal under any status; a body never turns a fatal status
//!   retryable. Only the server's `x-should-retry` does that.
//! - When two server signals conflict, the one that sends less traffic wins:
//!   `grpc-retry-pushback-ms: -1` is not undone by `x-should-retry: true`.
//! - A Gemini `RESOURCE_EXHAUSTED` naming a *daily* quota (`...PerDay...` in a `QuotaFailure` or
//!   `ErrorInfo`) is fatal even though Gemini attaches a `RetryInfo` to it: the delay belongs to
//!   the per-minute window, and the day's quota is still empty after it. Per-minute quotas are
//!   retryable with the `RetryInfo` delay.
//! - `x-should-retry` is ignored on successes (2xx and 3xx): a success is never retried.
//! - A truncated or non-JSON body is not an error: the status decides alone.
//!
//! # Using a classifier
//! Layers take any [`Classify`] (or a [`MakeClassify`], which picks a classifier per request;
//! every `Classify` is one). [`body::classify_response`] classifies a response the way every
//! stormguard layer does: from the head when [`needs_body`](Classify::needs_body) says so, else
//! from the head and at most [`ERROR_BODY_LIMIT`] bytes of the body, handing the caller the whole
//! response all the same. Layers that only see `Result` get failures as errors through
//! [`ClassifyLayer`].
//!
//! # The vocabulary every layer shares
//! Every stormguard crate depends on this one, and takes from it what must be spelled once:
//!
//! - [`headers`]: every header name stormguard reads or writes, and the "do not retry" mark;
//! - [`Failure`], [`chain`] and [`outcome_of`]: how stormguard's errors say what they are (an
//!   [`Outcome`] in their source chain), found by one bounded walk down the chain;
//! - [`refusal_response`] and [`error_response`]: the one shape of an answer stormguard gives in
//!   place of a backend's (HTTP and gRPC);
//! - [`Permit`]: the one protocol by which every guard admits an attempt and learns how it ended;
//! - [`body`]: reading the start of a body without taking it from its next reader.
//!
//! Event streams (the SSE parser, the stream guard) are `stormguard-stream`'s: it classifies an
//! error event after a `200` with the rules of error bodies,
//! [`LlmClassifier::classify_without_status`].
//!
//! ```
//! use http::Response;
//! use stormguard_classify::{Classify, LlmClassifier, Reason};
//!
//! let classifier = LlmClassifier::default();
//! let (parts, ()) = Response::builder().status(529).body(()).unwrap().into_parts();
//! let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
//! assert!(classifier.needs_body(&parts));
//! let outcome = classifier.classify_http(&parts, body);
//! assert!(outcome.is_retryable());
//! assert!(!outcome.is_accepted());
//! assert_eq!(outcome.reason(), Reason::Overloaded);
//! assert_eq!(outcome.reason().as_str(), "overloaded");
//!
//! let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
//! assert!(classifier.classify_error(&io).is_retryable());
//! ```

mod admission;
pub mod body;
mod classify;
mod completed;
mod failure;
mod grpc;
pub mod headers;
pub mod hint;
mod llm;
mod outcome;
mod refusal;
mod status;
mod transport;
pub mod usage;

pub use self::admission::Permit;
pub use self::body::is_event_stream;
pub use self::classify::{ClassifiedError, ClassifyLayer, ClassifyService, ResponseFuture};
pub use self::completed::polled_after_completion;
pub use self::failure::{Failure, MAX_CHAIN, chain, outcome_of};
pub use self::grpc::{GrpcClassifier, GrpcCode, GrpcCodes, ListedCodesClassifier, is_grpc};
pub use self::llm::LlmClassifier;
pub use self::outcome::{Outcome, Reason, Verdict};
pub use self::refusal::{AsError, LocalAnswer, error_response, refusal_response};
pub use self::status::{HttpClassifier, status_outcome};
pub use self::transport::{TransportClassifier, classify_io};

/// The error type across stormguard layers, as tower uses it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Cap on how many bytes of a non-2xx body an engine buffers for classification (64 KiB): provider
/// error bodies are a few hundred bytes; anything longer is not an error body worth reading.
/// Classifiers never read past it.
pub const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Classifies responses and errors into [`Outcome`]s. Layers take any `Classify`.
pub trait Classify: Clone + Send + Sync + 'static {
    /// Classify a response head plus the buffered (possibly empty, possibly truncated) body.
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome;

    /// Classify an error returned by the service instead of a response (walk `source()` chain).
    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome;

    /// Classify a response by its head alone, and say whether it is an event stream (its
    /// `content-type` is `text/event-stream`): what the retry engine asks of every answer whose
    /// body it does not read first ([`needs_body`](Classify::needs_body) false). The default is
    /// `classify_http(parts, &[])` and [`is_event_stream`](body::is_event_stream);
    /// [`LlmClassifier`] reads the content type once for both.
    fn classify_head(&self, parts: &http::response::Parts) -> (Outcome, bool) {
        let outcome = self.classify_http(parts, &[]);
        (outcome, body::is_event_stream(&parts.headers))
    }

    /// Should the engine buffer this response's body (up to [`ERROR_BODY_LIMIT`]) before
    /// classifying? Default: true for 4xx and 5xx responses that are not gRPC.
    fn needs_body(&self, parts: &http::response::Parts) -> bool {
        parts.status.as_u16() >= 400 && !is_grpc(&parts.headers)
    }
}

/// Makes a [`Classify`] per request, like tower-http's `MakeClassifier`: a layer calls
/// [`make_classifier`](MakeClassify::make_classifier) with each request and classifies that
/// request's response with the result. Every `Classify` is a `MakeClassify` that returns a clone
/// of itself; implement it directly to choose by method, path or headers.
///
/// ```
/// use http::{Method, Request};
/// use stormguard_classify::{HttpClassifier, LlmClassifier, MakeClassify};
///
/// /// Health checks are plain HTTP; everything else may carry provider error bodies.
/// #[derive(Clone)]
/// struct ByPath;
///
/// #[derive(Clone)]
/// enum Either { Http(HttpClassifier), Llm(LlmClassifier) }
/// # impl stormguard_classify::Classify for Either {
/// #     fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> stormguard_classify::Outcome {
/// #         match self { Either::Http(c) => c.classify_http(parts, body), Either::Llm(c) => c.classify_http(parts, body) }
/// #     }
/// #     fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> stormguard_classify::Outcome {
/// #         stormguard_classify::TransportClassifier.classify_error(error)
/// #     }
/// # }
/// # use stormguard_classify::Classify;
///
/// impl MakeClassify for ByPath {
///     type Classifier = Either;
///     fn make_classifier<B>(&self, request: &Request<B>) -> Either {
///         if request.uri().path() == "/health" {
///             Either::Http(HttpClassifier)
///         } else {
///             Either::Llm(LlmClassifier::default())
///         }
///     }
/// }
/// let request = Request::builder().uri("/health").body(()).unwrap();
/// assert!(matches!(ByPath.make_classifier(&request), Either::Http(_)));
/// ```
pub trait MakeClassify: Clone + Send + Sync + 'static {
    /// The classifier made for each request.
    type Classifier: Classify;

    /// The classifier for this request's response.
    fn make_classifier<B>(&self, request: &http::Request<B>) -> Self::Classifier;
}

impl<C: Classify> MakeClassify for C {
    type Classifier = C;

    fn make_classifier<B>(&self, _request: &http::Request<B>) -> C {
        self.clone()
    }
}
