//! [`StormguardMiddleware`]: the attempt loop.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};
use stormguard_adaptive_throttle::AdaptiveThrottle;
use stormguard_budget::{RetryBudget, Withdrawal};
use stormguard_classify::headers::mark_do_not_retry;
use stormguard_classify::{Classify, LlmClassifier, Outcome, Reason};
use stormguard_deadline::propagate::{DEFAULT_MARGIN, X_REQUEST_TIMEOUT_MS, format_timeout_ms};
use stormguard_deadline::{Deadline, DeadlineExceeded};
use stormguard_jitter::{Backoff, FullJitter, HintPolicy};
use stormguard_retry::{
    GiveUpCause, RetryRules, ensure_idempotency_key, is_idempotent, stamp_attempt,
};
use tokio::time::Instant;

use crate::error_body;

/// How many attempts a request gets by default (the first one included): 3, as in the SRE book
/// ("Handling Overload") and the OpenAI and Anthropic SDKs (2 retries).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// The deadline that spans every attempt of a request by default: 10 minutes, the default request
/// timeout of the official OpenAI and Anthropic SDKs, long enough for a large generation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// reqwest-middleware [`Middleware`] that gives a reqwest client stormguard's client protections.
///
/// Per request it:
/// - sets one [`Deadline`] for all attempts (from [`timeout`](Self::timeout), or a tighter one
///   the caller put into the middleware [`Extensions`]), stops when it cannot be met, and sends
///   the remaining time on every attempt as `x-request-timeout-ms`;
/// - adds an `Idempotency-Key` to requests whose method is not idempotent (POST, PATCH, ...;
///   RFC 9110 section 9.2.2) when they may be sent more than once (never replacing the caller's),
///   the same on every attempt, and `x-retry-attempt: N` (N = previous attempts) to every attempt;
/// - asks the [`AdaptiveThrottle`] before every attempt: a local drop fails at once with
///   [`Throttled`](stormguard_adaptive_throttle::Throttled) (inside
///   [`Error::Middleware`]), never reaches the server and is never retried;
/// - classifies every response (buffering up to
///   [`ERROR_BODY_LIMIT`](stormguard_classify::ERROR_BODY_LIMIT) bytes of a non-2xx body, the
///   caller still gets the whole body) and every error, records the outcome in the throttle,
///   deposits successes in the [`RetryBudget`];
/// - retries retryable failures only, at most [`max_attempts`](Self::max_attempts) attempts, each
///   retry withdrawn from the budget first, after a jittered delay or the server's hint (a hint
///   above the [`HintPolicy`]'s maximum or past the deadline ends the request);
/// - retries at this layer only: a failed response it gives up on (attempts spent, budget
///   refused, hint too long, deadline) carries `x-should-retry: false` (honoured by the official
///   OpenAI and Anthropic SDKs) and the [`GiveUpCause`] in its extensions, and a fatal failed
///   response (`429 insufficient_quota`, `400`, ...) carries `x-should-retry: false` too, as the
///   tower engine (`stormguard_retry`) does. A failed call (an error instead of a response) comes
///   back as it is, so that reqwest's `is_connect()` / `is_timeout()` keep working.
///
/// Requests this layer cannot retry go through once and come back unmarked, the decision being
/// the caller's: a body that cannot be cloned ([`Request::try_clone`] returns `None`: streaming
/// bodies), or [`max_attempts(1)`](Self::max_attempts).
///
/// The deadline bounds each attempt up to its response head (and the buffered error body); the
/// caller reads a successful body under reqwest's own timeouts. A retry is sent only if its delay
/// plus the duration of the last attempt fits in the time left.
///
/// Budget and throttle are shared by every clone of the middleware; hand the same ones to several
/// middlewares (or tower layers) that talk to the same backend.
#[derive(Clone, Debug)]
pub struct StormguardMiddleware<C = LlmClassifier, Bk = FullJitter> {
    classifier: C,
    backoff: Bk,
    budget: RetryBudget,
    throttle: AdaptiveThrottle,
    hint_policy: HintPolicy,
    /// Whether `hint_policy` was chosen by the user (else it follows the classifier's `max_hint`).
    hint_policy_chosen: bool,
    max_attempts: u32,
    timeout: Option<Duration>,
}

impl Default for StormguardMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl StormguardMiddleware {
    /// The middleware with LLM-safe defaults: [`LlmClassifier`], [`FullJitter`] (500 ms .. 8 s),
    /// a fresh [`RetryBudget`] and [`AdaptiveThrottle`], [`DEFAULT_MAX_ATTEMPTS`] attempts, a
    /// [`DEFAULT_TIMEOUT`] deadline, and server hints followed up to the classifier's
    /// [`max_hint`](Classify::max_hint).
    pub fn new() -> Self {
        let classifier = LlmClassifier::default();
        Self {
            hint_policy: HintPolicy::default().with_max(classifier.max_hint()),
            hint_policy_chosen: false,
            classifier,
            backoff: FullJitter::default(),
            budget: RetryBudget::default(),
            throttle: AdaptiveThrottle::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout: Some(DEFAULT_TIMEOUT),
        }
    }
}

impl<C, Bk> StormguardMiddleware<C, Bk> {
    /// Uses `classifier` to tell successes, retryable and fatal failures apart. Unless a
    /// [`hint_policy`](Self::hint_policy) was chosen, server hints above the classifier's
    /// [`max_hint`](Classify::max_hint) end the request.
    pub fn classifier<C2: Classify>(self, classifier: C2) -> StormguardMiddleware<C2, Bk> {
        let hint_policy = if self.hint_policy_chosen {
            self.hint_policy
        } else {
            HintPolicy::default().with_max(classifier.max_hint())
        };
        StormguardMiddleware {
            classifier,
            backoff: self.backoff,
            budget: self.budget,
            throttle: self.throttle,
            hint_policy,
            hint_policy_chosen: self.hint_policy_chosen,
            max_attempts: self.max_attempts,
            timeout: self.timeout,
        }
    }

    /// Uses `backoff` for the delays between attempts when the server gives no hint.
    pub fn backoff<Bk2>(self, backoff: Bk2) -> StormguardMiddleware<C, Bk2> {
        StormguardMiddleware {
            classifier: self.classifier,
            backoff,
            budget: self.budget,
            throttle: self.throttle,
            hint_policy: self.hint_policy,
            hint_policy_chosen: self.hint_policy_chosen,
            max_attempts: self.max_attempts,
            timeout: self.timeout,
        }
    }

    /// Draws retries from `budget` (shared with whoever else holds a clone of it).
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Throttles every attempt with `throttle` (shared with whoever else holds a clone of it).
    pub fn throttle(mut self, throttle: AdaptiveThrottle) -> Self {
        self.throttle = throttle;
        self
    }

    /// How server hints (`Retry-After`, `retry-after-ms`, ...) replace the computed delay.
    pub fn hint_policy(mut self, hint_policy: HintPolicy) -> Self {
        self.hint_policy = hint_policy;
        self.hint_policy_chosen = true;
        self
    }

    /// At most `attempts` attempts per request, the first one included (0 counts as 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// One deadline of `timeout` for all attempts of a request.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// No deadline of the middleware's own: only one the caller puts into the [`Extensions`].
    pub fn no_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// The retry budget, to read its [`snapshot`](RetryBudget::snapshot).
    pub fn retry_budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The adaptive throttle, to read its [`snapshot`](AdaptiveThrottle::snapshot).
    pub fn adaptive_throttle(&self) -> &AdaptiveThrottle {
        &self.throttle
    }
}

/// What one attempt produced, with its classification.
struct Attempt {
    result: Result<Response>,
    outcome: Outcome,
}

impl<C, Bk> StormguardMiddleware<C, Bk>
where
    C: Classify,
    Bk: Backoff,
{
    async fn execute(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let deadline = self.deadline(extensions);
        let retries_allowed = self.may_retry(&request);
        if retries_allowed && !is_idempotent(request.method()) {
            ensure_idempotency_key(request.headers_mut());
        }

        let mut schedule = self.backoff.schedule();
        let mut previous: u32 = 0;
        // The budget's receipt for the retry about to be sent: given back if it is not sent after
        // all (the caller drops this future during the delay, the deadline passes, the throttle
        // drops it), spent once it goes out.
        let mut unspent = Unspent {
            budget: &self.budget,
            withdrawal: None,
        };
        loop {
            if deadline.is_some_and(|deadline| deadline.is_expired()) {
                return Err(Error::middleware(DeadlineExceeded::new()));
            }
            let attempts = previous.saturating_add(1);
            let spare = if retries_allowed && attempts < self.max_attempts {
                request.try_clone()
            } else {
                None
            };
            stamp(&mut request, previous, deadline);
            self.throttle.try_acquire().map_err(Error::middleware)?;
            unspent.spend();

            let started = Instant::now();
            let Attempt { result, outcome } = self
                .attempt(request, &mut *extensions, next.clone(), deadline)
                .await;
            let took = started.elapsed();
            self.throttle.record(outcome.is_accepted());
            if outcome.is_success() {
                self.budget.deposit();
                return result;
            }
            if !outcome.is_retryable() {
                // Marked too when this layer could have retried: an SDK above would otherwise
                // retry a `429 insufficient_quota` for nothing.
                return if retries_allowed {
                    result.map(mark_final)
                } else {
                    result
                };
            }
            if !retries_allowed {
                // Not this layer's decision: the caller may still retry what it can replay.
                return result;
            }

            let scheduled = schedule.next().unwrap_or_else(|| self.backoff.cap());
            let rules = RetryRules {
                max_attempts: self.max_attempts,
                hint_policy: &self.hint_policy,
                budget: &self.budget,
            };
            let granted = match rules.decide(&outcome, attempts, scheduled, deadline, took) {
                Ok(granted) => granted,
                Err(cause) => return give_up(result, cause),
            };
            unspent.withdrawal = Some(granted.withdrawal);
            let Some(next_request) = spare else {
                // Only when the body could not be cloned after all: the caller decides.
                return result;
            };
            drop(result);
            tokio::time::sleep(granted.delay).await;
            request = next_request;
            previous = attempts;
        }
    }

    /// Whether `request` may be sent more than once: more than one attempt allowed and a body
    /// that can be replayed (none, or one held in memory).
    fn may_retry(&self, request: &Request) -> bool {
        self.max_attempts > 1 && request.body().is_none_or(|body| body.as_bytes().is_some())
    }

    /// The deadline for a request: the configured timeout, or the caller's, whichever is tighter.
    fn deadline(&self, extensions: &Extensions) -> Option<Deadline> {
        let configured = self.timeout.map(Deadline::after);
        match (configured, Deadline::from_extensions(extensions)) {
            (Some(ours), Some(theirs)) => Some(ours.min(theirs)),
            (ours, theirs) => ours.or(theirs),
        }
    }

    /// Sends one attempt and classifies what comes back, within the deadline.
    async fn attempt(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        deadline: Option<Deadline>,
    ) -> Attempt {
        let send = async {
            match next.run(request, extensions).await {
                Ok(response) => self.classify_response(response).await,
                Err(error) => {
                    let outcome = self.classify_error(&error);
                    Attempt {
                        result: Err(error),
                        outcome,
                    }
                }
            }
        };
        match deadline {
            None => send.await,
            Some(deadline) => match tokio::time::timeout_at(deadline.instant(), send).await {
                Ok(attempt) => attempt,
                Err(_elapsed) => Attempt {
                    result: Err(Error::middleware(DeadlineExceeded::new())),
                    // Not retryable: the deadline is spent. Not accepted: the backend did not answer.
                    outcome: Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false),
                },
            },
        }
    }

    async fn classify_response(&self, mut response: Response) -> Attempt {
        // Lend the head to the classifier without copying it: the headers move out and back.
        let (mut parts, ()) = http::Response::new(()).into_parts();
        parts.status = response.status();
        parts.version = response.version();
        std::mem::swap(&mut parts.headers, response.headers_mut());
        std::mem::swap(&mut parts.extensions, response.extensions_mut());

        let outcome = if self.classifier.needs_body(&parts) {
            match error_body::read_head(&mut response).await {
                Ok(head) => {
                    let outcome = self
                        .classifier
                        .classify_response(&parts, head.for_classifier());
                    give_back(&mut parts, &mut response);
                    response = error_body::restore(response, head);
                    return Attempt {
                        result: Ok(response),
                        outcome,
                    };
                }
                Err(error) => {
                    let outcome = self.classify_reqwest_error(&error);
                    return Attempt {
                        result: Err(Error::Reqwest(error)),
                        outcome,
                    };
                }
            }
        } else {
            self.classifier.classify_response(&parts, &[])
        };
        give_back(&mut parts, &mut response);
        Attempt {
            result: Ok(response),
            outcome,
        }
    }

    fn classify_error(&self, error: &Error) -> Outcome {
        match error {
            Error::Reqwest(error) => self.classify_reqwest_error(error),
            Error::Middleware(error) => {
                let error: &(dyn std::error::Error + Send + Sync + 'static) = error.as_ref();
                self.classifier.classify_error(error)
            }
        }
    }

    /// reqwest knows its connect errors and timeouts better than a walk down the source chain.
    fn classify_reqwest_error(&self, error: &reqwest::Error) -> Outcome {
        if error.is_connect() {
            Outcome::retryable(Reason::Transport).with_accepted(false)
        } else if error.is_timeout() {
            Outcome::retryable(Reason::Timeout).with_accepted(false)
        } else {
            self.classifier.classify_error(error)
        }
    }
}

/// A retry withdrawn from the budget and not yet sent: refunded if dropped unspent.
struct Unspent<'a> {
    budget: &'a RetryBudget,
    withdrawal: Option<Withdrawal>,
}

impl Unspent<'_> {
    /// The retry goes out: the withdrawal stands.
    fn spend(&mut self) {
        self.withdrawal = None;
    }
}

impl Drop for Unspent<'_> {
    fn drop(&mut self) {
        if let Some(withdrawal) = self.withdrawal.take() {
            self.budget.refund(withdrawal);
        }
    }
}

/// The response a retryable failure ends with when the rules refuse a retry: it is marked
/// (`x-should-retry: false`, and the [`GiveUpCause`] in its extensions); an error comes back as it
/// is, so that reqwest's `is_connect()` / `is_timeout()` keep working.
fn give_up(result: Result<Response>, cause: GiveUpCause) -> Result<Response> {
    result.map(|response| {
        let mut response = mark_final(response);
        response.extensions_mut().insert(cause);
        response
    })
}

/// Marks a failed response so that no layer above retries it.
fn mark_final(mut response: Response) -> Response {
    mark_do_not_retry(response.headers_mut(), false);
    response
}

/// Puts the head lent to the classifier back into the response.
fn give_back(parts: &mut http::response::Parts, response: &mut Response) {
    std::mem::swap(&mut parts.headers, response.headers_mut());
    std::mem::swap(&mut parts.extensions, response.extensions_mut());
}

/// Stamps an attempt with its number and the time left.
fn stamp(request: &mut Request, previous: u32, deadline: Option<Deadline>) {
    let headers = request.headers_mut();
    stamp_attempt(headers, previous, false);
    if let Some(deadline) = deadline {
        // The same safety margin as the tower `DeadlineLayer`: the next hop gives up first.
        let left = deadline.remaining().saturating_sub(DEFAULT_MARGIN);
        headers.insert(X_REQUEST_TIMEOUT_MS, format_timeout_ms(left));
    }
}

/// The trait is declared with `async_trait`; this is the signature it expands to, written out so
/// that no macro crate is needed.
impl<C, Bk> Middleware for StormguardMiddleware<C, Bk>
where
    C: Classify,
    Bk: Backoff,
{
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        req: Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> Pin<Box<dyn Future<Output = Result<Response>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.execute(req, extensions, next))
    }
}
