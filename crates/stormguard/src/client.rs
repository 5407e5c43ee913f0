//! The client pipeline: [`ClientLayer`].

use std::time::Duration;

use stormguard_adaptive_throttle::{
    AdaptiveThrottle, AdaptiveThrottleLayer, AdaptiveThrottleService,
};
use stormguard_budget::RetryBudget;
use stormguard_classify::{Classify, LlmClassifier};
use stormguard_deadline::client::ClientDeadline;
use stormguard_deadline::{DeadlineLayer, LlmDeadline};
use stormguard_jitter::{Backoff, FullJitter, HintPolicy};
use stormguard_retry::{Retry, RetryLayer};
use tower_layer::Layer;

/// Default deadline of a [`ClientLayer`] request, across all its attempts: 600 s, the default
/// request timeout of the official OpenAI and Anthropic SDKs. Long non-streaming generations fit;
/// use [`ClientLayer::llm_deadline`] to size it per request instead, or [`ClientLayer::timeout`]
/// for a backend with short calls.
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(600);

/// The whole client pipeline for `http::Request<B>` services, as one [`Layer`]:
///
/// ```text
/// request ─▶ deadline ─▶ retry ─────────────────────────────▶ adaptive throttle ─▶ backend
///            one for all   classify · budget · jitter · hints    per attempt: drop locally
///            attempts,     replay the body, attempt headers,     when the backend rejects
///            propagated    Idempotency-Key                       (SRE client-side throttling)
/// ```
///
/// * The **deadline** is outside the retry: one deadline spans every attempt, and the retry engine
///   never sleeps past it or starts an attempt that cannot finish. It is propagated downstream
///   (`x-request-timeout-ms`, `grpc-timeout`), re-stamped before each attempt.
/// * The **retry** engine retries only what its classifier calls retryable, asks the shared
///   [`RetryBudget`] before each retry (retries stay under 10% of successes), waits a full-jitter
///   backoff or the server's hint, and marks what it gives up on with `x-should-retry: false`.
/// * The **adaptive throttle** is inside the retry: every attempt is counted and may be dropped
///   locally (a `Throttled` error, never retried) while the backend rejects most of what it gets.
///
/// The deadline covers each attempt up to its response head, and the buffered error body of a
/// failed one. A successful response is handed over as soon as its head arrives, and reading its
/// body is the caller's to bound: a stream that has started is never cut short or restarted.
///
/// `ClientLayer::default()` is safe for LLM APIs out of the box: [`LlmClassifier`],
/// [`RetryBudget::default`] (10% of successes, 1 retry/s floor, 10 s window), [`FullJitter`]
/// (0.5 s .. 8 s), 3 attempts, hints up to 60 s, [`AdaptiveThrottle::default`], and a 600 s
/// deadline. Builder methods change one part at a time. The budget and the throttle are shared by
/// every clone of the layer and every service it builds; hand the same ones to several layers when
/// several clients call one backend.
///
/// ```
/// use std::time::Duration;
/// use stormguard::ClientLayer;
/// use stormguard::budget::RetryBudget;
/// use stormguard::throttle::AdaptiveThrottle;
///
/// let budget = RetryBudget::default();
/// let throttle = AdaptiveThrottle::default();
/// let layer = ClientLayer::default()
///     .budget(budget.clone())
///     .throttle(throttle.clone())
///     .max_attempts(4)
///     .timeout(Duration::from_secs(30));
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct ClientLayer<C = LlmClassifier, Bk = FullJitter, T = Duration> {
    deadline: DeadlineLayer<T>,
    retry: RetryLayer<C, Bk>,
    throttle: AdaptiveThrottle,
    classifier: C,
}

impl Default for ClientLayer {
    fn default() -> Self {
        let classifier = LlmClassifier::default();
        Self {
            deadline: DeadlineLayer::new(DEFAULT_CLIENT_TIMEOUT),
            retry: RetryLayer::new(),
            throttle: AdaptiveThrottle::default(),
            classifier,
        }
    }
}

impl ClientLayer {
    /// The default pipeline (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }
}

impl<C: Classify, Bk: Backoff, T> ClientLayer<C, Bk, T> {
    /// At most `n` attempts per request, the first included (default 3).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.retry = self.retry.max_attempts(n);
        self
    }

    /// Draw retries on `budget` (shared state: hand the same budget to every client of a backend).
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.retry = self.retry.budget(budget);
        self
    }

    /// Throttle attempts with `throttle` (shared state: one per backend).
    pub fn throttle(mut self, throttle: AdaptiveThrottle) -> Self {
        self.throttle = throttle;
        self
    }

    /// How server hints (Retry-After and friends) are applied, and the longest one honoured.
    pub fn hint_policy(mut self, policy: HintPolicy) -> Self {
        self.retry = self.retry.hint_policy(policy);
        self
    }

    /// Requests with bodies up to `bytes` are buffered and replayed on retry (default 1 MiB).
    pub fn max_replay_body(mut self, bytes: usize) -> Self {
        self.retry = self.retry.max_replay_body(bytes);
        self
    }

    /// One fixed deadline of `timeout` for each request, across all its attempts.
    pub fn timeout(self, timeout: Duration) -> ClientLayer<C, Bk, Duration> {
        ClientLayer {
            deadline: DeadlineLayer::new(timeout),
            retry: self.retry,
            throttle: self.throttle,
            classifier: self.classifier,
        }
    }

    /// Size each request's deadline from its LLM request body (prompt size and `max_tokens`):
    /// see [`LlmDeadline`]. Needs request bodies that implement `From<Bytes>`.
    pub fn llm_deadline(self, estimate: LlmDeadline) -> ClientLayer<C, Bk, LlmDeadline> {
        ClientLayer {
            deadline: DeadlineLayer::llm(estimate),
            retry: self.retry,
            throttle: self.throttle,
            classifier: self.classifier,
        }
    }

    /// Replace the deadline part with any [`DeadlineLayer`] (margin, propagation, source).
    pub fn deadline<T2>(self, deadline: DeadlineLayer<T2>) -> ClientLayer<C, Bk, T2> {
        ClientLayer {
            deadline,
            retry: self.retry,
            throttle: self.throttle,
            classifier: self.classifier,
        }
    }

    /// Use `backoff` between attempts (default [`FullJitter::default`]).
    pub fn backoff<Bk2: Backoff>(self, backoff: Bk2) -> ClientLayer<C, Bk2, T> {
        ClientLayer {
            deadline: self.deadline,
            retry: self.retry.backoff(backoff),
            throttle: self.throttle,
            classifier: self.classifier,
        }
    }

    /// The shared retry budget, e.g. to read its [`snapshot`](RetryBudget::snapshot).
    pub fn retry_budget(&self) -> &RetryBudget {
        self.retry.retry_budget()
    }

    /// The shared throttle, e.g. to read its [`snapshot`](AdaptiveThrottle::snapshot).
    pub fn adaptive_throttle(&self) -> &AdaptiveThrottle {
        &self.throttle
    }
}

impl<C: Classify, Bk: Backoff, T> ClientLayer<C, Bk, T> {
    /// Decide what succeeded, what may be retried and what the backend accepted with `classifier`
    /// (used by both the retry engine and the throttle).
    pub fn classifier<C2: Classify>(self, classifier: C2) -> ClientLayer<C2, Bk, T> {
        ClientLayer {
            deadline: self.deadline,
            retry: self.retry.classifier(classifier.clone()),
            throttle: self.throttle,
            classifier,
        }
    }
}

/// The service a [`ClientLayer`] builds around `S`.
pub type Client<S, C = LlmClassifier, Bk = FullJitter, T = Duration> =
    ClientDeadline<Retry<AdaptiveThrottleService<S, C>, C, Bk>, T>;

impl<S, C: Clone, Bk, T: Clone> Layer<S> for ClientLayer<C, Bk, T> {
    type Service = Client<S, C, Bk, T>;

    fn layer(&self, inner: S) -> Self::Service {
        let throttled = AdaptiveThrottleLayer::new(self.throttle.clone())
            .with_classifier(self.classifier.clone())
            .layer(inner);
        self.deadline.layer(self.retry.layer(throttled))
    }
}
