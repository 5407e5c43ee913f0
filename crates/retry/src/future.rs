//! [`ResponseFuture`]: one request through the engine, as a hand-written state machine.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Request, Response, Uri, Version, request, response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_adaptive_throttle::Throttled;
use stormguard_budget::Withdrawal;
use stormguard_classify::{BoxError, Classify, ERROR_BODY_LIMIT, Outcome, is_grpc};
use stormguard_deadline::{Deadline, DeadlineExceeded};
use stormguard_jitter::Backoff;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::attempt::{ensure_idempotency_key, is_idempotent, stamp_attempt};
use crate::body::{Collected, PartialBody, ReplayBody, ResponseBody, Tail};
use crate::error::{GaveUp, GiveUpCause, chain_contains};
use crate::layer::Config;
use crate::rules::RetryRules;
use stormguard_classify::headers::mark_do_not_retry;

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    ///
    /// Dropping it cancels the request wherever it is: an attempt in flight is dropped with it,
    /// a backoff sleep simply ends, nothing further is sent, and a retry withdrawn from the budget
    /// but not yet sent is given back.
    pub struct ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        Bk: Backoff,
    {
        #[pin]
        state: State<S::Future, B, RB>,
        service: S,
        engine: Engine<C, Bk>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, RB> {
        // Reading the request body (up to the replay cap) before the first attempt. The head
        // waits in the engine's template, the readied service in `ResponseFuture::service` (it
        // stays ready until called).
        Buffering {
            body: Option<B>,
            read: Collected,
        },
        // Waiting for a fresh clone of the service to be ready for a retry.
        PollReady,
        // An attempt is in flight.
        Calling {
            #[pin]
            future: F,
        },
        // Reading the start of an error response's body for the classifier.
        ReadingErrorBody {
            parts: Option<response::Parts>,
            body: Option<Pin<Box<RB>>>,
            read: Collected,
        },
        // Waiting out the delay before a retry.
        Backoff {
            #[pin]
            sleep: Sleep,
        },
        // The output was returned.
        Done,
    }
}

/// The per-request bookkeeping, apart from the pinned state.
struct Engine<C, Bk: Backoff> {
    config: Arc<Config<C, Bk>>,
    /// What every attempt is rebuilt from; `None` = the body cannot be replayed: one attempt.
    template: Option<Template>,
    /// Attempts sent so far.
    attempts: u32,
    /// The backoff schedule, made on the first retry (a request that succeeds never needs one).
    schedule: Option<Bk::Schedule>,
    deadline: Option<Deadline>,
    grpc: bool,
    /// When the attempt in flight started; only tracked under a deadline.
    attempt_started: Option<Instant>,
    /// How long the last finished attempt took; only tracked under a deadline.
    last_attempt: Duration,
    /// The budget's receipt for the latest retry granted.
    receipt: Option<Receipt>,
}

/// Where the latest granted retry stands, for giving its withdrawal back if it never goes out.
enum Receipt {
    /// Granted, not yet handed to the service: given back if the future is dropped (during the
    /// backoff, or because the service failed to get ready).
    Unsent(Withdrawal),
    /// Handed to the service: spent (it may be on its way), unless the throttle below answers
    /// that it dropped it unsent.
    InFlight(Withdrawal),
}

impl<C, Bk: Backoff> Drop for Engine<C, Bk> {
    fn drop(&mut self) {
        if let Some(Receipt::Unsent(withdrawal)) = self.receipt.take() {
            self.config.budget.refund(withdrawal);
        }
    }
}

/// A request's parts and buffered body, from which each attempt is rebuilt.
///
/// It lives inline in the response future, which moves a few times per request: what is rare
/// (trailers) is boxed to keep it small.
struct Template {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
    body: Bytes,
    /// Request trailers, if the body had any (rare: they are replayed after the bytes).
    trailers: Option<Box<HeaderMap>>,
}

/// What to do after an attempt.
enum Next<T> {
    /// Hand `T` to the caller.
    Return(T),
    /// Sleep this long, then retry.
    Retry(Duration),
}

/// The answer to "may this retryable failure be retried?".
enum Plan {
    Retry(Duration),
    /// The body was sent as a stream: only the caller can send the request again.
    NotReplayable,
    GiveUp(GiveUpCause),
}

impl<S, B, RB, C, Bk> ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    C: Classify,
    Bk: Backoff,
{
    /// `service` must be ready: it serves the first attempt (now, or once the body is read).
    pub(crate) fn new(mut service: S, config: Arc<Config<C, Bk>>, request: Request<B>) -> Self {
        let cap = u64::try_from(config.max_replay_body).unwrap_or(u64::MAX);
        let may_retry = config.max_attempts > 1;
        let mut engine = Engine {
            deadline: Deadline::of(&request),
            grpc: is_grpc(request.headers()),
            config,
            template: None,
            attempts: 0,
            schedule: None,
            attempt_started: None,
            last_attempt: Duration::ZERO,
            receipt: None,
        };
        let state = if !may_retry || request.body().size_hint().lower() > cap {
            // Too big to buffer (or nothing to retry): sent once, untouched.
            State::Calling {
                future: engine.start(&mut service, request),
            }
        } else if request.body().is_end_stream() {
            let (parts, _) = request.into_parts();
            engine.template = Some(Template::hold(parts));
            let request = engine.seal_template(Bytes::new(), None);
            State::Calling {
                future: engine.start(&mut service, request),
            }
        } else {
            let (parts, body) = request.into_parts();
            engine.template = Some(Template::hold(parts));
            State::Buffering {
                body: Some(body),
                read: Collected::default(),
            }
        };
        Self {
            state,
            service,
            engine,
        }
    }
}

impl<S, B, RB, C, Bk> Future for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes>,
    C: Classify,
    Bk: Backoff,
{
    type Output = Result<Response<ResponseBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Buffering { body, read } => {
                    let Some(reading) = body.as_mut() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let cap = this.engine.config.max_replay_body;
                    let end = ready!(poll_request_prefix(reading, read, cap, cx));
                    let Some(body) = body.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let read = std::mem::take(read).into_bytes();
                    let request = match end {
                        Tail::Ended => this.engine.seal_template(read, None),
                        Tail::Trailers(trailers) => {
                            this.engine.seal_template(read, Some(Box::new(trailers)))
                        }
                        // Longer than the cap: sent once, untouched, what was read followed by
                        // the rest. Without a template there is nothing to retry from.
                        Tail::Open => {
                            let Some(template) = this.engine.template.take() else {
                                return Poll::Ready(Err(polled_after_completion()));
                            };
                            template
                                .into_request(B::from_partial(PartialBody::new(read, None, body)))
                        }
                        Tail::Failed(error) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(error.into()));
                        }
                    };
                    let future = this.engine.start(this.service, request);
                    this.state.set(State::Calling { future });
                }
                StateProj::PollReady => {
                    if let Err(error) = ready!(this.service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(error.into()));
                    }
                    let Some(request) = this.engine.retry_request() else {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let future = this.engine.start(this.service, request);
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => {
                    let result = ready!(future.poll(cx));
                    let next = match result {
                        Ok(response) => {
                            let (parts, body) = response.into_parts();
                            if this.engine.config.classifier.needs_body(&parts) {
                                this.engine.attempt_finished();
                                this.state.set(State::ReadingErrorBody {
                                    parts: Some(parts),
                                    body: Some(Box::pin(body)),
                                    read: Collected::default(),
                                });
                                continue;
                            }
                            let outcome =
                                this.engine.config.classifier.classify_response(&parts, &[]);
                            if !outcome.is_success() {
                                // Only a failure can lead to a retry, the one thing the
                                // attempt's duration is for: a success skips the clock.
                                this.engine.attempt_finished();
                            }
                            let response = Response::from_parts(parts, ResponseBody::new(body));
                            this.engine.judge_response(outcome, response).map_return(Ok)
                        }
                        Err(error) => {
                            this.engine.attempt_finished();
                            this.engine.judge_error(error.into()).map_return(Err)
                        }
                    };
                    match next {
                        Next::Return(output) => {
                            this.state.set(State::Done);
                            return Poll::Ready(output);
                        }
                        Next::Retry(delay) => wait(this.state.as_mut(), this.service, delay),
                    }
                }
                StateProj::ReadingErrorBody { parts, body, read } => {
                    let Some(reading) = body.as_mut() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let end = ready!(poll_error_prefix(reading.as_mut(), read, cx));
                    let (Some(parts), Some(body)) = (parts.take(), body.take()) else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let read = std::mem::take(read);
                    let seen = &read.as_slice()[..read.len().min(ERROR_BODY_LIMIT)];
                    let outcome = this
                        .engine
                        .config
                        .classifier
                        .classify_response(&parts, seen);
                    let body = PartialBody::after_read(read.into_bytes(), end, body);
                    let response = Response::from_parts(parts, ResponseBody::buffered(body));
                    match this.engine.judge_response(outcome, response) {
                        Next::Return(response) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(response));
                        }
                        Next::Retry(delay) => wait(this.state.as_mut(), this.service, delay),
                    }
                }
                StateProj::Backoff { sleep } => {
                    ready!(sleep.poll(cx));
                    refresh(this.service);
                    this.state.set(State::PollReady);
                }
                StateProj::Done => return Poll::Ready(Err(polled_after_completion())),
            }
        }
    }
}

/// Move on to the retry after `delay`. A zero delay skips the timer: tokio rounds every sleep up
/// to its next 1 ms tick, so `sleep(0)` would still wait up to a millisecond.
fn wait<S: Clone, F, B, RB>(
    mut state: Pin<&mut State<F, B, RB>>,
    service: &mut S,
    delay: Duration,
) {
    if delay.is_zero() {
        refresh(service);
        state.set(State::PollReady);
    } else {
        state.set(State::Backoff {
            sleep: tokio::time::sleep(delay),
        });
    }
}

/// A fresh handle for the retry (tower: a clone is not ready until polled).
fn refresh<S: Clone>(service: &mut S) {
    let fresh = service.clone();
    *service = fresh;
}

impl<T> Next<T> {
    fn map_return<U>(self, f: impl FnOnce(T) -> U) -> Next<U> {
        match self {
            Self::Return(value) => Next::Return(f(value)),
            Self::Retry(delay) => Next::Retry(delay),
        }
    }
}

impl<C: Classify, Bk: Backoff> Engine<C, Bk> {
    /// Complete the held template with the buffered body, and build the first attempt from it.
    /// (A future polled after completion has no template: an empty request it will never send.)
    fn seal_template<B: ReplayBody>(
        &mut self,
        body: Bytes,
        trailers: Option<Box<HeaderMap>>,
    ) -> Request<B> {
        let grpc = self.grpc;
        let Some(template) = self.template.as_mut() else {
            return Request::new(B::from_bytes(Bytes::new()));
        };
        if !grpc && !is_idempotent(&template.method) {
            ensure_idempotency_key(&mut template.headers);
        }
        // The first attempt's number goes into the template: each attempt's copy of the headers
        // then has its number already, and a retry replaces it in place (adding a header to a
        // copy, which has no spare room, would grow it).
        stamp_attempt(&mut template.headers, 0, grpc);
        template.body = body;
        template.trailers = trailers;
        template.request()
    }

    /// A retry, rebuilt from the template, its deadline header re-stamped with the time left.
    fn retry_request<B: ReplayBody>(&self) -> Option<Request<B>> {
        let mut request = self.template.as_ref()?.request();
        stormguard_deadline::propagate::refresh(&mut request);
        Some(request)
    }

    /// Number the attempt, start the clock if there is a deadline, and send it.
    fn start<S, B>(&mut self, service: &mut S, mut request: Request<B>) -> S::Future
    where
        S: Service<Request<B>>,
    {
        // A first attempt built from the template carries its number already.
        if self.attempts > 0 || self.template.is_none() {
            stamp_attempt(request.headers_mut(), self.attempts, self.grpc);
        }
        // The retry is handed to the service (see `Receipt::InFlight`).
        if let Some(Receipt::Unsent(withdrawal)) = self.receipt.take() {
            self.receipt = Some(Receipt::InFlight(withdrawal));
        }
        self.attempts = self.attempts.saturating_add(1);
        if self.deadline.is_some() {
            self.attempt_started = Some(Instant::now());
        }
        service.call(request)
    }

    fn attempt_finished(&mut self) {
        if let Some(started) = self.attempt_started.take() {
            self.last_attempt = started.elapsed();
        }
    }

    fn judge_response<RB>(
        &mut self,
        outcome: Outcome,
        mut response: Response<RB>,
    ) -> Next<Response<RB>> {
        if outcome.is_success() {
            self.config.budget.deposit();
            return Next::Return(response);
        }
        if !outcome.is_retryable() {
            // Fatal: no retry can help, here or above. Marked when this layer was the one that
            // could have retried (a replayable request).
            if self.template.is_some() {
                self.mark_final(&mut response);
            }
            return Next::Return(response);
        }
        match self.plan(&outcome) {
            Plan::Retry(delay) => Next::Retry(delay),
            Plan::NotReplayable => Next::Return(response),
            Plan::GiveUp(cause) => {
                self.mark_final(&mut response);
                response.extensions_mut().insert(cause);
                Next::Return(response)
            }
        }
    }

    fn mark_final<RB>(&self, response: &mut Response<RB>) {
        let grpc = self.grpc || is_grpc(response.headers());
        mark_do_not_retry(response.headers_mut(), grpc);
    }

    fn judge_error(&mut self, error: BoxError) -> Next<BoxError> {
        // stormguard's own local rejections are final: retrying a throttled request would defeat
        // the throttle, and a request past its deadline cannot succeed.
        if chain_contains::<Throttled>(&*error) {
            // Dropped before it reached the backend: a retry that was never sent is given back.
            if let Some(Receipt::InFlight(withdrawal)) = self.receipt.take() {
                self.config.budget.refund(withdrawal);
            }
            return Next::Return(error);
        }
        if chain_contains::<DeadlineExceeded>(&*error) {
            return Next::Return(error);
        }
        let outcome = self.config.classifier.classify_error(&*error);
        if !outcome.is_retryable() {
            return Next::Return(error);
        }
        match self.plan(&outcome) {
            Plan::Retry(delay) => Next::Retry(delay),
            Plan::NotReplayable => Next::Return(error),
            Plan::GiveUp(cause) => Next::Return(Box::new(GaveUp::new(
                self.attempts,
                outcome.reason(),
                cause,
                error,
            ))),
        }
    }

    /// Decide whether a retryable failure is retried, and after how long ([`RetryRules`]).
    fn plan(&mut self, outcome: &Outcome) -> Plan {
        if self.template.is_none() {
            return Plan::NotReplayable;
        }
        let backoff = &self.config.backoff;
        let scheduled = self
            .schedule
            .get_or_insert_with(|| backoff.schedule())
            .next()
            .unwrap_or_else(|| backoff.cap());
        let rules = RetryRules {
            max_attempts: self.config.max_attempts,
            hint_policy: &self.config.hint_policy,
            budget: &self.config.budget,
        };
        match rules.decide(
            outcome,
            self.attempts,
            scheduled,
            self.deadline,
            self.last_attempt,
        ) {
            Ok(granted) => {
                self.receipt = Some(Receipt::Unsent(granted.withdrawal));
                Plan::Retry(granted.delay)
            }
            Err(cause) => Plan::GiveUp(cause),
        }
    }
}

impl Template {
    /// Hold a request's head while its body is read.
    fn hold(parts: request::Parts) -> Self {
        Self {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            extensions: parts.extensions,
            body: Bytes::new(),
            trailers: None,
        }
    }

    /// The held head with `body`, as it came.
    fn into_request<B>(self, body: B) -> Request<B> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers;
        *request.extensions_mut() = self.extensions;
        request
    }

    fn request<B: ReplayBody>(&self) -> Request<B> {
        let body = match &self.trailers {
            None => B::from_bytes(self.body.clone()),
            Some(trailers) => B::from_partial(PartialBody::new(
                self.body.clone(),
                Some(HeaderMap::clone(trailers)),
                B::from_bytes(Bytes::new()),
            )),
        };
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.clone();
        *request.extensions_mut() = self.extensions.clone();
        request
    }
}

/// Read a request body until it ends (`Ended`/`Trailers`: replayable) or what was read exceeds
/// `cap` (`Open`: send once).
fn poll_request_prefix<B: ReplayBody>(
    body: &mut B,
    read: &mut Collected,
    cap: usize,
    cx: &mut Context<'_>,
) -> Poll<Tail<B::Error>> {
    loop {
        if body.is_end_stream() {
            return Poll::Ready(Tail::Ended);
        }
        match ready!(Pin::new(&mut *body).poll_frame(cx)) {
            None => return Poll::Ready(Tail::Ended),
            Some(Err(error)) => return Poll::Ready(Tail::Failed(error)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    read.push(data);
                    if read.len() > cap {
                        return Poll::Ready(Tail::Open);
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        return Poll::Ready(Tail::Trailers(trailers));
                    }
                }
            },
        }
    }
}

/// Read an error response's body until it ends or [`ERROR_BODY_LIMIT`] bytes were read.
fn poll_error_prefix<RB: Body<Data = Bytes>>(
    mut body: Pin<&mut RB>,
    read: &mut Collected,
    cx: &mut Context<'_>,
) -> Poll<Tail<RB::Error>> {
    loop {
        if read.len() >= ERROR_BODY_LIMIT {
            return Poll::Ready(Tail::Open);
        }
        if body.is_end_stream() {
            return Poll::Ready(Tail::Ended);
        }
        match ready!(body.as_mut().poll_frame(cx)) {
            None => return Poll::Ready(Tail::Ended),
            Some(Err(error)) => return Poll::Ready(Tail::Failed(error)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => read.push(data),
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        return Poll::Ready(Tail::Trailers(trailers));
                    }
                }
            },
        }
    }
}

fn polled_after_completion() -> BoxError {
    "stormguard retry future polled after completion".into()
}

impl<S, B, RB, C, Bk> fmt::Debug for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Buffering { .. } => "buffering request body",
            State::PollReady => "waiting for service readiness",
            State::Calling { .. } => "calling",
            State::ReadingErrorBody { .. } => "reading error body",
            State::Backoff { .. } => "backing off",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempts", &self.engine.attempts)
            .field("deadline", &self.engine.deadline)
            .finish()
    }
}
