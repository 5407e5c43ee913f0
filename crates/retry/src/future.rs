//! [`ResponseFuture`]: one request through the engine, as a state machine.
//!
//! ```text
//! Buffering ──▶ [Reserving] ─▶ [Pacing] ──▶ Calling ──▶ Classifying | Opening ──▶ (output)
//!   (body)            ▲                         │ error     │ retryable (an error event)
//!                     │                         └──────┬────┘
//!                   Ready ◀─────────────────────── Backoff
//! ```
//!
//! `Opening` reads an event stream up to its first content event (`stormguard_stream`).
//! The states only wait; what happens between them is decided by [`Attempts`], which holds the
//! request's bookkeeping (its template, the attempts sent, the deadline, the budget's receipt,
//! what is owed to the throttle, the breaker's permit). The deadline is enforced over every state
//! by one timer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode, response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_adaptive_throttle::ThrottlePermit;
use stormguard_breaker::{BreakerPermit, Rejected};
use stormguard_budget::Withdrawal;
use stormguard_classify::body::{
    ClassifyResponse, PartialBody, Prefix, ResponseBody, Tail, classify_response,
};
use stormguard_classify::headers::mark_do_not_retry;
use stormguard_classify::{BoxError, Classify, Outcome, Permit, Reason, is_grpc};
use stormguard_deadline::TokenEstimate;
use stormguard_deadline::{Deadline, propagate};
use stormguard_jitter::{Backoff, HintDecision};
use stormguard_rate_limit::{Acquire, RateLimited, Reservation};
use stormguard_stream::{self as stream, OpenStream, Opening, is_event_stream};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::attempt::{ensure_idempotency_key, is_idempotent, stamp_attempt};
use crate::body::ReplayBody;
use crate::error::{Error, FailedAnswer, GiveUpCause};
use crate::layer::{Config, SharedTimeout};
use crate::observe::Watch;

/// What the future hands back.
type Output<RB> = Result<Response<ResponseBody<RB>>, Error>;

pin_project! {
    /// The response future of [`ClientService`](crate::ClientService).
    ///
    /// Dropping it cancels the request wherever it is: an attempt in flight is dropped with it
    /// (and counted by the throttle as not accepted), a backoff simply ends, nothing further is
    /// sent, and a retry the budget granted but that was never sent is given back.
    pub struct ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        state: State<S::Future, B, RB, C>,
        // The deadline's timer, made the first time the request has to wait: a call that answers
        // at once never touches the timer wheel.
        #[pin]
        timer: Option<Sleep>,
        service: S,
        attempts: Attempts<C, Bk>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, RB, C>
    where
        RB: Body,
    {
        // Reading the request body to replay it; the readied service waits for it.
        Buffering { read: Prefix<B> },
        // Waiting for the service to be ready for a retry.
        Ready,
        // Waiting for the rate limit's fleet (in Redis) to decide on the attempt's slot. The
        // request waits in a box (here and in `Pacing`): inline, it would make every state as
        // large as itself and a timer, and the state moves at every step of every request.
        Reserving { acquire: Acquire, request: Option<Box<Request<B>>> },
        // Waiting for the rate limit's slot; the readied service sends the request then.
        Pacing { #[pin] sleep: Sleep, request: Option<Box<Request<B>>> },
        // An attempt is in flight.
        Calling { #[pin] future: F },
        // Classifying the answer, reading the start of a failed response's body if need be.
        Classifying { answer: ClassifyResponse<RB, C> },
        // Reading an event stream up to its first content event.
        Opening { open: Box<OpenStream<RB>>, head: Option<response::Parts> },
        // Waiting out the delay before a retry.
        Backoff { #[pin] sleep: Sleep },
        // Ended before the attempt was sent: the output (an error, or the breaker's fallback)
        // waits for the first poll.
        Refused { output: Option<Output<RB>> },
        // The output was handed back.
        Done,
    }
}

/// What comes after a state: another state, or the end.
enum Step<F, B, RB: Body, C> {
    Next(State<F, B, RB, C>),
    Finish(Output<RB>),
}

/// The bookkeeping of one request across its attempts.
struct Attempts<C, Bk: Backoff> {
    config: Arc<Config<C, Bk>>,
    /// What every attempt is rebuilt from; `None` when the request can be sent only once (its
    /// body too large or endless to buffer).
    template: Option<Template>,
    /// Attempts handed to the service so far.
    sent: u32,
    /// The backoff schedule, made on the first retry (a request that succeeds never needs one).
    schedule: Option<Bk::Schedule>,
    deadline: Option<Deadline>,
    grpc: bool,
    /// When the attempt in flight was sent (tracked under a deadline only).
    started: Option<Instant>,
    /// How long the last finished attempt took (tracked under a deadline only).
    last_attempt: Duration,
    /// The budget's receipt for the latest retry, until it is known to have reached the backend.
    receipt: Option<Receipt>,
    /// The throttle's permit for the attempt in flight.
    throttled: Option<ThrottlePermit>,
    /// The breaker's permit for the attempt in flight.
    permit: Option<BreakerPermit>,
    /// The rate limit's slot for the attempt about to go, then its permit while it is in flight.
    pace: Option<Reservation>,
    paced: Option<stormguard_rate_limit::RateLimitPermit>,
    /// The request's weight in tokens, estimated once from its body for the rate limit.
    tokens: Option<u64>,
    /// The rate limit's permit of a success whose weight is corrected to the usage it reports.
    settle: Option<stormguard_rate_limit::Usage>,
    /// The head of a request sent once as a stream, kept for the breaker's fallback (the
    /// template holds it otherwise).
    head: Option<Box<Parts>>,
    /// Its spans, log lines and metrics.
    watch: Watch,
}

/// Where the latest granted retry stands.
enum Receipt {
    /// Granted, not yet handed to the service: given back if it never is.
    Unsent(Withdrawal),
    /// Handed to the service: spent, unless a layer below answers that it dropped it unsent.
    Sent(Withdrawal),
}

/// A request's head and buffered body, from which each attempt is rebuilt.
struct Template {
    head: Parts,
    body: Bytes,
    /// Request trailers, if the body had any (replayed after the bytes).
    trailers: Option<HeaderMap>,
}

impl<S, B, RB, C, Bk> ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// `service` must be ready: it serves the first attempt (now, or once the body is read).
    pub(crate) fn new(mut service: S, config: Arc<Config<C, Bk>>, request: Request<B>) -> Self {
        let (mut head, body) = request.into_parts();
        let cap = config.max_replay_body;
        let reads_body = config
            .timeout
            .as_ref()
            .is_some_and(|source| source.reads_body());
        // Buffer what could be sent again, or what the deadline estimate reads.
        let buffer = (config.max_attempts > 1 || reads_body)
            && body.size_hint().lower() <= u64::try_from(cap).unwrap_or(u64::MAX);
        let mut attempts = Attempts::new(config, &head);
        let mut clock = Clock::default();
        let state = if buffer && !body.is_end_stream() {
            if reads_body {
                // The layer's own deadline waits for the body; one already on the request holds.
                attempts.deadline = Deadline::from_extensions(&head.extensions);
            } else {
                attempts.set_deadline(&mut head, None, &mut clock);
            }
            attempts.template = Some(Template::new(head));
            State::Buffering {
                read: Prefix::new(body, cap),
            }
        } else if buffer {
            attempts.set_deadline(&mut head, Some(&[]), &mut clock);
            attempts.template = Some(Template::new(head));
            let request = attempts.seal(Bytes::new(), None, &mut clock);
            attempts.start(&mut service, request, &mut clock)
        } else {
            attempts.set_deadline(&mut head, None, &mut clock);
            attempts.start(&mut service, Request::from_parts(head, body), &mut clock)
        };
        Self {
            state,
            timer: None,
            service,
            attempts,
        }
    }
}

impl<S, B, RB, C, Bk> Future for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    C: Classify,
    Bk: Backoff,
{
    type Output = Output<RB>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let _in = this.attempts.watch.enter();
            let step = match this.state.as_mut().project() {
                StateProj::Buffering { read } => match Pin::new(read).poll(cx) {
                    Poll::Ready((bytes, tail, rest)) => {
                        this.attempts.buffered(this.service, bytes, tail, rest)
                    }
                    Poll::Pending => break,
                },
                StateProj::Reserving { acquire, request } => match Pin::new(acquire).poll(cx) {
                    Poll::Ready(decision) => match request.take() {
                        Some(request) => Step::Next(this.attempts.paced(
                            this.service,
                            *request,
                            decision,
                            &mut Clock::default(),
                        )),
                        None => panic!("stormguard's ResponseFuture polled after it completed"),
                    },
                    Poll::Pending => break,
                },
                StateProj::Pacing { sleep, request } => match sleep.poll(cx) {
                    Poll::Ready(()) => match request.take() {
                        Some(request) => Step::Next(this.attempts.send(
                            this.service,
                            *request,
                            true,
                            &mut Clock::default(),
                        )),
                        None => panic!("stormguard's ResponseFuture polled after it completed"),
                    },
                    Poll::Pending => break,
                },
                StateProj::Ready => match this.service.poll_ready(cx) {
                    Poll::Ready(Ok(())) => Step::Next(this.attempts.retry(this.service)),
                    Poll::Ready(Err(error)) => {
                        Step::Finish(Err(this.attempts.not_ready(error.into())))
                    }
                    Poll::Pending => break,
                },
                StateProj::Calling { future } => match future.poll(cx) {
                    Poll::Ready(result) => this.attempts.answered(result),
                    Poll::Pending => match this.attempts.poll_cut(cx) {
                        Some(output) => Step::Finish(output),
                        None => break,
                    },
                },
                StateProj::Opening { open, head } => match Pin::new(&mut **open).poll(cx) {
                    Poll::Ready(opening) => match head.take() {
                        Some(head) => this.attempts.opened(head, opening),
                        None => panic!("stormguard's ResponseFuture polled after it completed"),
                    },
                    Poll::Pending => match this.attempts.poll_cut(cx) {
                        Some(output) => Step::Finish(output),
                        None => break,
                    },
                },
                StateProj::Classifying { answer } => match Pin::new(answer).poll(cx) {
                    Poll::Ready((response, outcome)) => this.attempts.judged(response, outcome),
                    Poll::Pending => match this.attempts.poll_cut(cx) {
                        Some(output) => Step::Finish(output),
                        None => break,
                    },
                },
                StateProj::Backoff { sleep } => match sleep.poll(cx) {
                    Poll::Ready(()) => Step::Next(State::Ready),
                    Poll::Pending => break,
                },
                StateProj::Refused { output } => match output.take() {
                    Some(output) => Step::Finish(output),
                    None => panic!("stormguard's ResponseFuture polled after it completed"),
                },
                StateProj::Done => panic!("stormguard's ResponseFuture polled after it completed"),
            };
            match step {
                Step::Next(state) => this.state.set(state),
                Step::Finish(output) => {
                    this.state.set(State::Done);
                    this.attempts.watch.finished(&output, this.attempts.sent);
                    return Poll::Ready(output);
                }
            }
        }
        // Waiting: the deadline bounds the wait, whatever the request waits for. (It may have
        // been set, or tightened, since the timer was made: an estimate from the body.)
        let Some(deadline) = this.attempts.deadline.map(|deadline| deadline.instant()) else {
            return Poll::Pending;
        };
        match this.timer.as_mut().as_pin_mut() {
            Some(timer) if timer.deadline() == deadline => {}
            Some(timer) => timer.reset(deadline),
            None => this.timer.set(Some(tokio::time::sleep_until(deadline))),
        }
        if let Some(timer) = this.timer.as_pin_mut() {
            ready!(timer.poll(cx));
        }
        // Dropping the state cancels what is in flight.
        this.state.set(State::Done);
        let output = Err(this.attempts.expired());
        this.attempts.watch.finished(&output, this.attempts.sent);
        Poll::Ready(output)
    }
}

impl<C: Classify, Bk: Backoff> Attempts<C, Bk> {
    fn new(config: Arc<Config<C, Bk>>, head: &Parts) -> Self {
        // The calls come before the struct: a call between its fields, were it to unwind, would
        // leave the fields before it to drop, so those would be built aside and copied in (the
        // template's 352 bytes, on every request).
        let watch = Watch::new(config.name.as_ref());
        let grpc = is_grpc(&head.headers);
        Self {
            watch,
            config,
            template: None,
            sent: 0,
            schedule: None,
            deadline: None,
            grpc,
            started: None,
            last_attempt: Duration::ZERO,
            receipt: None,
            throttled: None,
            permit: None,
            pace: None,
            paced: None,
            tokens: None,
            settle: None,
            head: None,
        }
    }

    /// Sets the request's deadline from the layer's timeout (`body`: the buffered body, for a
    /// timeout that reads it); a tighter deadline already on the request wins.
    fn set_deadline(&mut self, head: &mut Parts, body: Option<&[u8]>, clock: &mut Clock) {
        self.deadline = deadline_of(self.config.timeout.as_ref(), head, body, clock);
    }

    /// The request body was read up to the replay cap: the first attempt goes out.
    fn buffered<S, B, F, RB>(
        &mut self,
        service: &mut S,
        bytes: Bytes,
        tail: Tail<B::Error>,
        rest: B,
    ) -> Step<F, B, RB, C>
    where
        S: Service<Request<B>, Response = Response<RB>, Future = F>,
        B: ReplayBody,
        B::Error: Into<BoxError>,
        RB: Body,
    {
        let read_twice = || Error::unreadable_body("request body read twice".into());
        let reads_body = self.config.timeout.as_ref().is_some_and(|s| s.reads_body());
        let mut clock = Clock::default();
        let trailers = match tail {
            Tail::Ended => None,
            Tail::Trailers(trailers) => Some(trailers),
            Tail::Failed(error) => return Step::Finish(Err(Error::unreadable_body(error.into()))),
            // Longer than the cap: sent once, untouched, what was read followed by the rest.
            Tail::Open => {
                let Some(mut template) = self.template.take() else {
                    return Step::Finish(Err(read_twice()));
                };
                if reads_body {
                    self.set_deadline(&mut template.head, None, &mut clock);
                }
                let body = B::from_partial(PartialBody::new(bytes, Tail::Open, rest));
                let request = Request::from_parts(template.head, body);
                return Step::Next(self.start(service, request, &mut clock));
            }
        };
        // The template is completed where it is: taken out and put back, it would be copied
        // twice.
        let Some(template) = &mut self.template else {
            return Step::Finish(Err(read_twice()));
        };
        if reads_body {
            let timeout = self.config.timeout.as_ref();
            self.deadline = deadline_of(timeout, &mut template.head, Some(&bytes), &mut clock);
        }
        let request = self.seal(bytes, trailers, &mut clock);
        Step::Next(self.start(service, request, &mut clock))
    }

    /// Completes the template with the buffered body and builds the first attempt from it: a
    /// non-idempotent request that may be sent more than once gets its idempotency key here,
    /// once for all attempts.
    fn seal<B: ReplayBody>(
        &mut self,
        body: Bytes,
        trailers: Option<HeaderMap>,
        clock: &mut Clock,
    ) -> Request<B> {
        let may_retry = self.config.max_attempts > 1;
        let grpc = self.grpc;
        let stamp = self.stamp();
        let Some(template) = self.template.as_mut() else {
            return Request::new(B::from_bytes(body));
        };
        if may_retry && !grpc && !is_idempotent(&template.head.method) {
            ensure_idempotency_key(&mut template.head.headers);
        }
        // What the first attempt carries goes into the template: every attempt's copy of the
        // headers then has room for it, and a retry replaces it in place (inserting into a copy,
        // which has no spare room, would grow it).
        stamp.write(&mut template.head.headers, clock);
        template.body = body;
        template.trailers = trailers;
        template.request()
    }

    /// Starts an attempt, if the deadline lets it: at once, or after the rate limit's wait.
    fn start<S, B, F, RB>(
        &mut self,
        service: &mut S,
        request: Request<B>,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        let deadline = self.deadline.map(|deadline| deadline.instant());
        if deadline.is_some_and(|deadline| clock.now() >= deadline) {
            self.watch.out_of_time();
            return self.refuse(Err(Error::deadline_exceeded(self.sent)));
        }
        if let Some(limit) = &self.config.rate_limit {
            let (head, body) = request.into_parts();
            let tokens = match self.tokens {
                Some(tokens) => tokens,
                None if limit.weighs_tokens(&head) => {
                    let body = self.template.as_ref().map_or(&[][..], |t| &t.body[..]);
                    *self.tokens.insert(TokenEstimate::of(body).total())
                }
                None => 0,
            };
            let mut acquire = limit.acquire(&head, tokens, deadline);
            let request = Request::from_parts(head, body);
            return match acquire.now() {
                Some(decision) => self.paced(service, request, decision, clock),
                None => State::Reserving {
                    acquire,
                    request: Some(Box::new(request)),
                },
            };
        }
        self.send(service, request, false, clock)
    }

    /// Sends an attempt once the rate limit decided on its slot: at once, after a wait, or not
    /// at all.
    fn paced<S, B, F, RB>(
        &mut self,
        service: &mut S,
        request: Request<B>,
        decision: Result<Reservation, RateLimited>,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        match decision {
            Ok(reservation) => {
                let start = reservation.start();
                self.pace = Some(reservation);
                #[cfg(feature = "metrics")]
                if let Some(limit) = &self.config.rate_limit {
                    let wait = start.saturating_duration_since(Instant::now());
                    self.watch.meter().paced(wait, limit);
                }
                // Read after the reservation: a slot free now starts at the limit's own
                // reading of the clock, later than this step's, and waiting for it would
                // still cost a timer rounded up to the next millisecond.
                if start > Instant::now() {
                    return State::Pacing {
                        sleep: tokio::time::sleep_until(start),
                        request: Some(Box::new(request)),
                    };
                }
                self.send(service, request, false, clock)
            }
            Err(limited) => {
                self.watch.refused(Reason::RateLimitedLocally, self.sent);
                let error = Error::refused(limited.outcome(), Box::new(limited), self.sent);
                self.refuse(Err(error))
            }
        }
    }

    /// Sends an attempt, if the breaker and the throttle let it go (`paced`: after a wait for
    /// the rate limit, so its headers are stamped again).
    fn send<S, B, F, RB>(
        &mut self,
        service: &mut S,
        mut request: Request<B>,
        paced: bool,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        // The rate limit's slot: spent if the attempt goes, given back (dropped) if not.
        let reservation = self.pace.take();
        if self.deadline.is_some() {
            self.started = Some(clock.now());
        }
        if let Some(breaker) = &self.config.breaker {
            match breaker.try_acquire() {
                Ok(permit) => self.permit = Some(permit),
                Err(rejected) => {
                    self.watch.refused(rejected.outcome().reason(), self.sent);
                    self.health();
                    let output = self.breaker_answer(&request.into_parts().0, rejected);
                    return self.refuse(output);
                }
            }
            if self.template.is_none() && self.config.fallback.is_some() {
                let (head, body) = request.into_parts();
                self.head = Some(Box::new(head.clone()));
                request = Request::from_parts(head, body);
            }
        }
        if let Some(throttle) = &self.config.throttle {
            // A half-open breaker's probe is not the throttle's to drop: a throttle still full of
            // the outage would otherwise hold the breaker open. It learns from the probe's answer.
            let probe = self.permit.as_ref().is_some_and(BreakerPermit::is_probe);
            let admitted = if probe {
                Ok(throttle.exempt())
            } else {
                throttle.try_acquire()
            };
            match admitted {
                Ok(permit) => self.throttled = Some(permit),
                Err(_) => {
                    // The breaker's permit goes unrecorded: the attempt was never sent.
                    self.permit = None;
                    self.watch.refused(Reason::Throttled, self.sent);
                    self.health();
                    return self.refuse(Err(Error::throttled(self.sent)));
                }
            }
        }
        self.paced = reservation.map(Reservation::send);
        // A first attempt built from the template is stamped already (unless it waited since).
        if self.sent > 0 || self.template.is_none() || paced {
            self.stamp().write(request.headers_mut(), clock);
        }
        if let Some(Receipt::Unsent(withdrawal)) = self.receipt.take() {
            self.receipt = Some(Receipt::Sent(withdrawal));
        }
        self.sent = self.sent.saturating_add(1);
        self.watch.sending(self.sent, self.config.name.as_deref());
        let _in = self.watch.span().enter();
        let future = service.call(request);
        State::Calling { future }
    }

    /// The request ends without this attempt: a retry granted for it is given back.
    fn refuse<F, B, RB: Body>(&mut self, output: Output<RB>) -> State<F, B, RB, C> {
        self.give_back();
        State::Refused {
            output: Some(output),
        }
    }

    /// The answer for a request the breaker refused or cut: the fallback's, or the error.
    fn breaker_answer<RB: Body>(&self, head: &Parts, rejected: Rejected) -> Output<RB> {
        match &self.config.fallback {
            Some(fallback) => Ok(fallback.answer(head, &rejected)),
            None => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        }
    }

    /// Whether a stall opened the breaker and cut the attempt in flight (waiting for its
    /// answer, or for the error body it is read to be classified by): then the request ends as
    /// if refused. The throttle is not told about the attempt: it learns from answers, and a
    /// black hole's silence would only leave it drops to unlearn after the recovery.
    fn poll_cut<RB: Body>(&mut self, cx: &mut Context<'_>) -> Option<Output<RB>> {
        let open = match self.permit.as_mut()?.poll_cut(cx) {
            Poll::Ready(open) => open,
            Poll::Pending => return None,
        };
        self.permit = None;
        if let Some(throttled) = self.throttled.take() {
            throttled.forget();
        }
        self.watch.unanswered(Reason::BreakerOpen);
        let rejected = Rejected::Open(open);
        let head = match (&self.template, &self.head) {
            (Some(template), _) => Some(&template.head),
            (None, head) => head.as_deref(),
        };
        Some(match (head, &self.config.fallback) {
            (Some(head), Some(_)) => self.breaker_answer(head, rejected),
            _ => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        })
    }

    /// The service is ready: the retry goes out, rebuilt from the template.
    fn retry<S, B, F, RB>(&mut self, service: &mut S) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        B: ReplayBody,
        RB: Body,
    {
        match self.template.as_ref().map(Template::request) {
            Some(request) => self.start(service, request, &mut Clock::default()),
            None => self.refuse(Err(Error::unreadable_body("no request to send".into()))),
        }
    }

    /// The service failed to get ready for a retry, which therefore never went out.
    fn not_ready(&mut self, error: BoxError) -> Error {
        self.give_back();
        let outcome = self.config.classifier.classify_error(&*error);
        Error::failed(outcome, error, self.sent)
    }

    /// The deadline passed while the request waited: an attempt in flight timed out, which the
    /// breaker counts as a health failure.
    fn expired(&mut self) -> Error {
        if let Some(permit) = self.permit.take() {
            let timeout = Outcome::retryable(Reason::DeadlineExceeded).with_accepted(false);
            permit.record(&timeout, &HeaderMap::new());
        }
        self.watch.unanswered(Reason::DeadlineExceeded);
        self.abandon();
        Error::deadline_exceeded(self.sent)
    }

    /// An attempt came back: a response is classified next, an error is judged now.
    fn answered<F, B, RB, E>(&mut self, result: Result<Response<RB>, E>) -> Step<F, B, RB, C>
    where
        RB: Body<Data = Bytes>,
        RB::Error: Into<BoxError>,
        E: Into<BoxError>,
    {
        let error = match result {
            Ok(response) => {
                let (head, body) = response.into_parts();
                if self.config.classifier.needs_body(&head) {
                    self.attempt_finished();
                    let response = Response::from_parts(head, body);
                    let answer = classify_response(&self.config.classifier, response);
                    return Step::Next(State::Classifying { answer });
                }
                // Judged on its head alone (every success): at once; an event stream once its
                // first content event came.
                let outcome = self.config.classifier.classify_http(&head, &[]);
                if let Some(policy) = self.config.streams
                    && outcome.is_success()
                    && is_event_stream(&head.headers)
                {
                    let mut open = stream::open(body, policy);
                    if self.config.resume.is_some() && self.template.is_some() {
                        open = open.keeping_content();
                    }
                    return Step::Next(State::Opening {
                        open: Box::new(open),
                        head: Some(head),
                    });
                }
                return self.judged(Response::from_parts(head, ResponseBody::new(body)), outcome);
            }
            Err(error) => error.into(),
        };
        self.attempt_finished();
        let outcome = self.config.classifier.classify_error(&*error);
        self.record(&outcome, &HeaderMap::new(), None);
        if !outcome.is_retryable() {
            return Step::Finish(Err(Error::failed(outcome, error, self.sent)));
        }
        match self.plan(&outcome) {
            Plan::Retry(delay) => Step::Next(self.wait(delay)),
            Plan::NotReplayable => Step::Finish(Err(Error::failed(outcome, error, self.sent))),
            Plan::GiveUp(cause) => {
                Step::Finish(Err(Error::given_up(outcome, error, self.sent, cause)))
            }
        }
    }

    /// An event stream was read up to its first content event (handed back, the breaker told
    /// how it ends when it ends), or failed before it (judged like a failed response).
    fn opened<F, B, RB>(&mut self, head: response::Parts, opening: Opening<RB>) -> Step<F, B, RB, C>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        match opening {
            Opening::Open(mut stream) => {
                // The breaker learns how the stream ends, and the metrics count it.
                let permit = self.permit.take();
                #[cfg(feature = "metrics")]
                let count = Some(self.watch.meter().stream_end());
                #[cfg(not(feature = "metrics"))]
                let count: Option<fn(&Outcome)> = None;
                if permit.is_some() || count.is_some() {
                    *stream = (*stream).with_at_end(move |outcome| {
                        if let Some(permit) = permit {
                            permit.record(outcome, &HeaderMap::new());
                        }
                        if let Some(count) = count {
                            count(outcome);
                        }
                    });
                }
                if let (Some(resume), Some(template)) = (&self.config.resume, &self.template) {
                    let (head, body) = (template.head.clone(), template.body.clone());
                    *stream = (*stream).with_resume(resume.clone(), head, body);
                }
                let response = Response::from_parts(head, ResponseBody::boxed(*stream));
                self.judged(response, Outcome::success())
            }
            Opening::Failed {
                outcome,
                read,
                rest,
            } => {
                #[cfg(feature = "metrics")]
                self.watch.meter().stream_failed();
                let response = Response::from_parts(head, ResponseBody::from_read(read, rest));
                self.judged(response, outcome)
            }
        }
    }

    /// A response was classified: hand it back, or retry.
    fn judged<F, B, RB: Body>(
        &mut self,
        mut response: Response<ResponseBody<RB>>,
        outcome: Outcome,
    ) -> Step<F, B, RB, C> {
        self.record(&outcome, response.headers(), Some(response.status()));
        if outcome.is_success() {
            // A success ends the request: how long it took matters only before a retry.
            self.config.budget.deposit();
            if let Some(usage) = self.settle.take() {
                response = settle_on_usage(response, usage);
            }
            return Step::Finish(Ok(response));
        }
        self.attempt_finished();
        if !outcome.is_retryable() {
            // Fatal: no retry helps, here or above. Marked when this layer could have retried.
            if self.could_retry() {
                self.mark_final(&mut response);
            }
        } else {
            match self.plan(&outcome) {
                // The retry answers instead: this response is dropped.
                Plan::Retry(delay) => return Step::Next(self.wait(delay)),
                Plan::NotReplayable => {}
                Plan::GiveUp(cause) => {
                    self.mark_final(&mut response);
                    response.extensions_mut().insert(cause);
                }
            }
        }
        // A failure handed back carries its verdict, for a layer above (a failover) to judge.
        response
            .extensions_mut()
            .insert(FailedAnswer::new(outcome, self.sent));
        Step::Finish(Ok(response))
    }

    /// Waits `delay` before the retry; a zero delay skips the timer (tokio rounds every sleep up
    /// to its next 1 ms tick, so `sleep(0)` would still wait).
    fn wait<F, B, RB: Body>(&self, delay: Duration) -> State<F, B, RB, C> {
        if delay.is_zero() {
            State::Ready
        } else {
            State::Backoff {
                sleep: tokio::time::sleep(delay),
            }
        }
    }

    /// Whether this layer could have sent the request again.
    fn could_retry(&self) -> bool {
        self.template.is_some() && self.config.max_attempts > 1
    }

    fn mark_final<RB>(&self, response: &mut Response<RB>) {
        let grpc = self.grpc || is_grpc(response.headers());
        mark_do_not_retry(response.headers_mut(), grpc);
    }

    /// Tells the breaker and the throttle how the attempt ended, and settles the retry's
    /// receipt: a retry that a layer below refused locally never reached the backend, so the
    /// budget gets it back.
    fn record(&mut self, outcome: &Outcome, headers: &HeaderMap, status: Option<StatusCode>) {
        self.watch.answered(outcome, status);
        if let Some(permit) = self.permit.take() {
            permit.record(outcome, headers);
        }
        if let Some(paced) = self.paced.take() {
            if outcome.is_success() {
                self.settle = paced.usage();
            }
            paced.record(outcome, headers);
        }
        if let Some(throttled) = self.throttled.take() {
            throttled.record(outcome, headers);
        }
        if let Some(Receipt::Sent(withdrawal)) = self.receipt.take()
            && matches!(
                outcome.reason(),
                Reason::Throttled
                    | Reason::BreakerOpen
                    | Reason::BulkheadFull
                    | Reason::RateLimitedLocally
            )
        {
            self.config.budget.refund(withdrawal);
        }
        self.health();
    }

    /// The throttle's and the breaker's state, for the metrics.
    fn health(&self) {
        #[cfg(feature = "metrics")]
        self.watch
            .meter()
            .health(self.config.throttle.as_ref(), self.config.breaker.as_ref());
    }

    /// What the next attempt carries.
    fn stamp(&self) -> Stamp {
        let propagated = self.deadline.filter(|_| self.config.propagation);
        Stamp {
            sent: self.sent,
            grpc: self.grpc,
            time_left: propagated.map(|deadline| (deadline, self.config.margin)),
        }
    }

    /// Times the attempt that just ended (under a deadline), for the retry decision.
    fn attempt_finished(&mut self) {
        if let Some(started) = self.started.take() {
            self.last_attempt = started.elapsed();
        }
    }

    /// Whether a retryable failure is retried, and after how long.
    ///
    /// Checks, cheapest first and the one with a side effect last: that this layer may send the
    /// request again at all (a buffered body, more than one attempt allowed); attempts left; the server's hint (one above the policy's maximum ends the
    /// request); the deadline (the retry must start after its delay and still have as long as
    /// the last attempt took); the budget (a withdrawal). Each retry is logged at WARN with the
    /// attempt number and the reason, a give-up as `log` says.
    fn plan(&mut self, outcome: &Outcome) -> Plan {
        if !self.could_retry() {
            return Plan::NotReplayable;
        }
        let reason = outcome.reason();
        match self.decide(outcome) {
            Ok((delay, withdrawal)) => {
                self.receipt = withdrawal.map(Receipt::Unsent);
                self.watch.retrying(self.sent, reason, delay);
                Plan::Retry(delay)
            }
            Err(cause) => {
                self.watch.giving_up(self.sent, reason, cause);
                Plan::GiveUp(cause)
            }
        }
    }

    fn decide(&mut self, outcome: &Outcome) -> Result<(Duration, Option<Withdrawal>), GiveUpCause> {
        let config = &*self.config;
        if self.sent >= config.max_attempts {
            return Err(GiveUpCause::AttemptsExhausted);
        }
        // The breaker is open (this failure may have opened it): the retry goes at once, to be
        // refused (and answered by the fallback, or a failover above moves on), with no wait
        // and nothing drawn from the budget for it.
        if config
            .breaker
            .as_ref()
            .is_some_and(|breaker| breaker.state() == stormguard_breaker::State::Open)
        {
            return Ok((Duration::ZERO, None));
        }
        let delay = match outcome.retry_after() {
            Some(hint) => match config.hint_policy.apply(hint) {
                HintDecision::RetryAfter(delay) => delay,
                HintDecision::TooLong { .. } => return Err(GiveUpCause::HintTooLong),
            },
            None => {
                let backoff = &config.backoff;
                let schedule = self.schedule.get_or_insert_with(|| backoff.schedule());
                schedule.next().unwrap_or_else(|| backoff.cap())
            }
        };
        if let Some(deadline) = self.deadline {
            let finish = Instant::now()
                .checked_add(delay)
                .and_then(|start| start.checked_add(self.last_attempt));
            if finish.is_none_or(|finish| finish >= deadline.instant()) {
                return Err(GiveUpCause::Deadline);
            }
        }
        let Some(withdrawal) = config.budget.try_withdraw() else {
            return Err(GiveUpCause::BudgetExhausted);
        };
        Ok((delay, Some(withdrawal)))
    }
}

impl<C, Bk: Backoff> Attempts<C, Bk> {
    /// Gives back a retry granted and never sent.
    fn give_back(&mut self) {
        if let Some(Receipt::Unsent(withdrawal)) = self.receipt.take() {
            self.config.budget.refund(withdrawal);
        }
    }

    /// The request ends wherever it is: an attempt in flight was not accepted, a retry not yet
    /// sent is given back.
    fn abandon(&mut self) {
        // Dropped untold, the throttle's permit counts the attempt as not accepted.
        self.throttled = None;
        self.give_back();
    }
}

impl<C, Bk: Backoff> Drop for Attempts<C, Bk> {
    fn drop(&mut self) {
        self.abandon();
    }
}

/// The response, whose body corrects the rate limit's token weight to the `usage` it reports,
/// once its reader has read it.
fn settle_on_usage<RB: Body>(
    response: Response<ResponseBody<RB>>,
    usage: stormguard_rate_limit::Usage,
) -> Response<ResponseBody<RB>> {
    response.map(|body| {
        body.watched(stormguard_rate_limit::USAGE_BODY_LIMIT, move |bytes| {
            if let Some(used) = stormguard_rate_limit::usage_tokens(bytes) {
                usage.settle(used);
            }
        })
    })
}

/// The request's deadline: `timeout`'s for it from now (`body`: the buffered body, for a
/// timeout that reads it), written into its extensions, unless a tighter one is there already.
fn deadline_of(
    timeout: Option<&SharedTimeout>,
    head: &mut Parts,
    body: Option<&[u8]>,
    clock: &mut Clock,
) -> Option<Deadline> {
    if let Some(timeout) = timeout.and_then(|source| source.timeout(head, body)) {
        Deadline::after_from(clock.now(), timeout).apply_to_extensions(&mut head.extensions);
    }
    Deadline::from_extensions(&head.extensions)
}

/// What the next attempt carries: its number (`sent` attempts went before it) and, when the
/// layer propagates it, the time left until the deadline, minus the layer's margin.
struct Stamp {
    sent: u32,
    grpc: bool,
    time_left: Option<(Deadline, Duration)>,
}

impl Stamp {
    fn write(&self, headers: &mut HeaderMap, clock: &mut Clock) {
        stamp_attempt(headers, self.sent, self.grpc);
        if let Some((deadline, margin)) = self.time_left {
            let left = deadline.instant().saturating_duration_since(clock.now());
            propagate::stamp_headers(headers, left.saturating_sub(margin));
        }
    }
}

/// The time of one step of a request, read from the clock at most once, and only if the step
/// needs it (a request with no deadline never reads it to be sent).
#[derive(Default)]
struct Clock(Option<Instant>);

impl Clock {
    fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// The answer to "may this retryable failure be retried?".
enum Plan {
    Retry(Duration),
    /// This layer cannot send the request again (its body was sent as a stream, or one attempt
    /// is all it may send): the decision is the caller's.
    NotReplayable,
    GiveUp(GiveUpCause),
}

impl Template {
    fn new(head: Parts) -> Self {
        Self {
            head,
            body: Bytes::new(),
            trailers: None,
        }
    }

    /// An attempt: the head and the buffered body, as they were.
    fn request<B: ReplayBody>(&self) -> Request<B> {
        let body = match &self.trailers {
            None => B::from_bytes(self.body.clone()),
            Some(trailers) => B::from_partial(PartialBody::new(
                self.body.clone(),
                Tail::Trailers(trailers.clone()),
                B::from_bytes(Bytes::new()),
            )),
        };
        Request::from_parts(self.head.clone(), body)
    }
}

impl<S, B, RB, C, Bk> fmt::Debug for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Buffering { .. } => "buffering the request body",
            State::Ready => "waiting for the service",
            State::Reserving { .. } => "asking the rate limit's fleet",
            State::Pacing { .. } => "waiting for the rate limit",
            State::Calling { .. } => "calling",
            State::Classifying { .. } => "classifying the answer",
            State::Opening { .. } => "reading a stream up to its first content",
            State::Backoff { .. } => "backing off",
            State::Refused { .. } => "refused",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempts", &self.attempts.sent)
            .field("deadline", &self.attempts.deadline)
            .finish()
    }
}
