//! [`ResponseFuture`]: one request through the engine, as a path of states.
//!
//! ```text
//! Buffering ──▶ [Reserving] ─▶ [Pacing] ──▶ Calling ──▶ Classifying | Opening ──▶ (output)
//!   (body)            ▲                         │ error     │ retryable (an error event)
//!                     │                         └──────┬────┘
//!                   Ready ◀─────────────────────── Backoff
//! ```
//!
//! The states only wait, each for one thing, and hold what they wait with: the attempt in
//! flight ([`Attempt`]: its guards' permits, its retry grant) is a value of the `Calling`,
//! `Classifying` and `Opening` states, the attempt about to go ([`Next`]) of `Reserving` and
//! `Pacing`, so a request dropped anywhere settles them by the guards' own rules. Between two
//! states, the `Ledger` (the request's bookkeeping) takes one step, asking the guards
//! (`admission`) whether an attempt goes, the [policy](crate::policy) whether a failure is retried,
//! and telling the `Watch` what happened. The deadline is enforced over every state by one
//! timer, and over the body handed back.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_breaker::{BreakerOpen, Rejected};
use stormguard_classify::body::{ClassifyResponse, Prefix, ResponseBody, classify_response};
use stormguard_classify::{BoxError, Classify, Outcome, Reason};
use stormguard_jitter::Backoff;
use stormguard_rate_limit::{Acquire, RateLimited, Reservation};
use stormguard_stream::{OpenStream, Opening, is_event_stream};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::admission::Refusal;
use crate::attempt::{Attempt, Next};
use crate::body::ReplayBody;
use crate::error::{Error, FailedAnswer};
use crate::layer::Config;
use crate::ledger::{Begin, Ledger, settle_on_usage};
use crate::policy::{Decision, Grant};
use crate::template::{Clock, Origin};

/// What the future hands back.
pub(crate) type Output<RB> = Result<Response<ResponseBody<RB>>, Error>;

pin_project! {
    /// The response future of [`ClientService`](crate::ClientService).
    ///
    /// Dropping it cancels the request wherever it is: an attempt in flight is dropped with its
    /// permits (the throttle counts it as not accepted, the breaker frees its place), a backoff
    /// simply ends, nothing further is sent, and a retry the budget granted but that was never
    /// sent, or a rate-limit slot never used, is given back.
    ///
    /// # Panics
    ///
    /// When polled after it completed, as a future may (tokio's `JoinHandle` does too).
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
        ledger: Ledger<C, Bk>,
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
        // Waiting out the delay before a retry.
        Backoff { #[pin] sleep: Sleep, grant: Option<Grant> },
        // Waiting for the service to be ready for a retry.
        Ready { grant: Option<Grant> },
        // Waiting for the rate limit's fleet (in Redis) to decide on the attempt's slot. The
        // attempt waits in a box (here and in `Pacing`): inline, it would make every state as
        // large as itself and a timer, and the state moves at every step of every request.
        Reserving { acquire: Acquire, next: Option<Box<Next<B>>> },
        // Waiting for the rate limit's slot; the readied service sends the attempt then.
        Pacing { #[pin] sleep: Sleep, next: Option<Box<Next<B>>> },
        // An attempt is in flight.
        Calling { #[pin] future: F, attempt: Attempt },
        // Classifying the answer, reading the start of a failed response's body if need be.
        Classifying { answer: ClassifyResponse<RB, C>, attempt: Attempt },
        // Reading an event stream up to its first content event.
        Opening { open: Box<OpenStream<RB>>, head: Option<response::Parts>, attempt: Attempt },
        // Ended before an attempt was sent: the output (an error, or the breaker's fallback)
        // waits for the first poll.
        Refused { output: Option<Output<RB>> },
        // The output was handed back.
        Done,
    }
}

/// What comes after a state: another state, or the end.
// Only ever returned, into the caller's slot: boxing the state would allocate at every step.
#[allow(clippy::large_enum_variant)]
enum Step<F, B, RB: Body, C> {
    Next(State<F, B, RB, C>),
    Finish(Output<RB>),
}

/// A future may panic when polled after it completed; this one says so.
fn polled_again<T>() -> T {
    panic!("stormguard's ResponseFuture polled after it completed")
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
        let mut ledger = Ledger::new(config, request.headers());
        let mut clock = Clock::default();
        let state = match ledger.begin(request, &mut clock) {
            Begin::Buffer(read) => State::Buffering { read },
            Begin::Send(request) => {
                ledger.start(&mut service, Next::new(request, None), &mut clock)
            }
        };
        Self {
            state,
            timer: None,
            service,
            ledger,
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
            let _in = this.ledger.watch.enter();
            match poll_state(this.state.as_mut(), this.service, this.ledger, cx) {
                Poll::Ready(Step::Next(state)) => this.state.set(state),
                Poll::Ready(Step::Finish(output)) => {
                    this.state.set(State::Done);
                    return Poll::Ready(this.ledger.finish(output));
                }
                Poll::Pending => break,
            }
        }
        // Waiting: the deadline bounds the wait, whatever the request waits for. (It may have
        // been set, or tightened, since the timer was made: an estimate from the body.)
        let Some(deadline) = this.ledger.deadline.map(|deadline| deadline.instant()) else {
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
        let attempt = this.state.as_mut().take_attempt();
        // Dropping the state cancels what is in flight.
        this.state.set(State::Done);
        let output = Err(this.ledger.expired(attempt));
        Poll::Ready(this.ledger.finish(output))
    }
}

/// Polls what the request waits for, and takes the step that follows.
fn poll_state<S, B, RB, C, Bk>(
    state: Pin<&mut State<S::Future, B, RB, C>>,
    service: &mut S,
    ledger: &mut Ledger<C, Bk>,
    cx: &mut Context<'_>,
) -> Poll<Step<S::Future, B, RB, C>>
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
    Poll::Ready(match state.project() {
        StateProj::Buffering { read } => {
            let (bytes, tail, rest) = ready!(Pin::new(read).poll(cx));
            let mut clock = Clock::default();
            match ledger.buffered(bytes, tail, rest, &mut clock) {
                Ok(request) => {
                    Step::Next(ledger.start(service, Next::new(request, None), &mut clock))
                }
                Err(error) => Step::Finish(Err(error)),
            }
        }
        StateProj::Backoff { sleep, grant } => {
            ready!(sleep.poll(cx));
            Step::Next(State::Ready {
                grant: grant.take(),
            })
        }
        StateProj::Ready { grant } => match ready!(service.poll_ready(cx)) {
            Ok(()) => Step::Next(ledger.retry(service, grant.take())),
            Err(error) => Step::Finish(Err(ledger.not_ready(error.into()))),
        },
        StateProj::Reserving { acquire, next } => {
            let decision = ready!(Pin::new(acquire).poll(cx));
            let next = *next.take().unwrap_or_else(polled_again);
            Step::Next(ledger.paced(service, next, decision, &mut Clock::default()))
        }
        StateProj::Pacing { sleep, next } => {
            ready!(sleep.poll(cx));
            let next = *next.take().unwrap_or_else(polled_again);
            Step::Next(ledger.send(service, next, &mut Clock::default()))
        }
        StateProj::Calling { future, attempt } => match future.poll(cx) {
            Poll::Ready(result) => ledger.answered(std::mem::take(attempt), result),
            Poll::Pending => Step::Finish(ready!(ledger.poll_cut(attempt, cx))),
        },
        StateProj::Classifying { answer, attempt } => match Pin::new(answer).poll(cx) {
            Poll::Ready((response, outcome)) => {
                ledger.judged(std::mem::take(attempt), response, outcome)
            }
            Poll::Pending => Step::Finish(ready!(ledger.poll_cut(attempt, cx))),
        },
        StateProj::Opening {
            open,
            head,
            attempt,
        } => match Pin::new(&mut **open).poll(cx) {
            Poll::Ready(opening) => {
                let head = head.take().unwrap_or_else(polled_again);
                ledger.opened(std::mem::take(attempt), head, opening)
            }
            Poll::Pending => Step::Finish(ready!(ledger.poll_cut(attempt, cx))),
        },
        StateProj::Refused { output } => Step::Finish(output.take().unwrap_or_else(polled_again)),
        StateProj::Done => polled_again(),
    })
}

impl<F, B, RB: Body, C> State<F, B, RB, C> {
    /// The attempt in flight, if the request is waiting for one.
    fn take_attempt(self: Pin<&mut Self>) -> Option<Attempt> {
        match self.project() {
            StateProj::Calling { attempt, .. }
            | StateProj::Classifying { attempt, .. }
            | StateProj::Opening { attempt, .. } => Some(std::mem::take(attempt)),
            _ => None,
        }
    }
}

/// The steps before an attempt is sent: the deadline, the guards.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// The service is ready: the retry goes out, rebuilt from the template.
    fn retry<S, B, F, RB>(&mut self, service: &mut S, grant: Option<Grant>) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        B: ReplayBody,
        RB: Body,
    {
        let request = match &self.origin {
            Origin::Replay(template) => template.request(),
            Origin::Once(_) => return refuse(Error::unreadable_body("no request to send".into())),
        };
        self.start(service, Next::new(request, grant), &mut Clock::default())
    }

    /// Starts an attempt, if the deadline lets it: at once, or after the rate limit's wait.
    fn start<S, B, F, RB>(
        &mut self,
        service: &mut S,
        next: Next<B>,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        let deadline = self.deadline.map(|deadline| deadline.instant());
        if deadline.is_some_and(|deadline| clock.now() >= deadline) {
            self.watch.out_of_time();
            return refuse(Error::deadline_exceeded(self.sent));
        }
        if self.config.guards.rate_limit.is_none() {
            return self.send(service, next, clock);
        }
        let Next { request, grant, .. } = next;
        let (head, body) = request.into_parts();
        let origin = &mut self.origin;
        let reserved = (self.config.guards).reserve(&head, || origin.tokens(), deadline);
        let next = Next::new(Request::from_parts(head, body), grant);
        let Some(mut acquire) = reserved else {
            return self.send(service, next, clock);
        };
        match acquire.now() {
            Some(decision) => self.paced(service, next, decision, clock),
            None => State::Reserving {
                acquire,
                next: Some(Box::new(next)),
            },
        }
    }

    /// The rate limit decided on the attempt's slot: it goes at once, after a wait, or not at
    /// all.
    fn paced<S, B, F, RB>(
        &mut self,
        service: &mut S,
        mut next: Next<B>,
        decision: Result<Reservation, RateLimited>,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        let slot = match decision {
            Ok(slot) => slot,
            Err(limited) => {
                self.watch.refused(Reason::RateLimitedLocally, self.sent);
                return refuse(Error::refused(
                    limited.outcome(),
                    Box::new(limited),
                    self.sent,
                ));
            }
        };
        let start = slot.start();
        self.watch.paced(start, &self.config.guards);
        next.slot = Some(slot);
        // Read after the reservation: a slot free now starts at the limit's own reading of the
        // clock, later than this step's, and waiting for it would still cost a timer rounded up
        // to the next millisecond.
        if start > Instant::now() {
            next.waited = true;
            return State::Pacing {
                sleep: tokio::time::sleep_until(start),
                next: Some(Box::new(next)),
            };
        }
        self.send(service, next, clock)
    }

    /// Sends the attempt, if the breaker and the throttle let it go.
    fn send<S, B, F, RB>(
        &mut self,
        service: &mut S,
        next: Next<B>,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        let Next {
            mut request,
            mut grant,
            slot,
            waited,
        } = next;
        let permits = match self.config.guards.admit(slot) {
            Ok(permits) => permits,
            Err(refusal) => return self.refused(&request.into_parts().0, refusal),
        };
        // A first attempt built from the template is stamped already (unless it waited since).
        if self.sent > 0 || !self.origin.is_replay() || waited {
            self.stamp().write(request.headers_mut(), clock);
        }
        if let Some(grant) = &mut grant {
            grant.send();
        }
        let started = self.deadline.is_some().then(|| clock.now());
        self.sent = self.sent.saturating_add(1);
        self.watch.sending(self.sent, self.config.name.as_deref());
        let _in = self.watch.span().enter();
        State::Calling {
            future: service.call(request),
            attempt: Attempt {
                permits,
                grant,
                started,
            },
        }
    }

    /// A guard refused the attempt: the request ends with the breaker's fallback or the error.
    fn refused<F, B, RB: Body>(&mut self, head: &Parts, refusal: Refusal) -> State<F, B, RB, C> {
        self.watch.refused(refusal.reason(), self.sent);
        self.watch.health(&self.config.guards);
        let output = match refusal {
            Refusal::Breaker(rejected) => self.breaker_answer(head, rejected),
            Refusal::Throttled => Err(Error::throttled(self.sent)),
        };
        State::Refused {
            output: Some(output),
        }
    }
}

/// The steps after an attempt comes back: judging it, and retrying or handing it back.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// An attempt came back: a response is classified next, an error is judged now.
    fn answered<F, B, RB, E>(
        &mut self,
        mut attempt: Attempt,
        result: Result<Response<RB>, E>,
    ) -> Step<F, B, RB, C>
    where
        RB: Body<Data = Bytes>,
        RB::Error: Into<BoxError>,
        E: Into<BoxError>,
    {
        let response = match result {
            Ok(response) => response,
            Err(error) => return self.failed(attempt, error.into()),
        };
        let (head, body) = response.into_parts();
        if self.config.classifier.needs_body(&head) {
            self.timed(&mut attempt);
            let response = Response::from_parts(head, body);
            let answer = classify_response(&self.config.classifier, response);
            return Step::Next(State::Classifying { answer, attempt });
        }
        // Judged on its head alone (every success): at once; an event stream once its first
        // content event came.
        let outcome = self.config.classifier.classify_http(&head, &[]);
        if let Some(policy) = self.config.streams
            && outcome.is_success()
            && is_event_stream(&head.headers)
        {
            let mut open = stormguard_stream::open(body, policy);
            if self.config.resume.is_some() && self.origin.is_replay() {
                open = open.keeping_content();
            }
            return Step::Next(State::Opening {
                open: Box::new(open),
                head: Some(head),
                attempt,
            });
        }
        self.judged(
            attempt,
            Response::from_parts(head, ResponseBody::new(body)),
            outcome,
        )
    }

    /// The attempt failed without a response: fatal, given up on, or retried.
    fn failed<F, B, RB: Body>(
        &mut self,
        mut attempt: Attempt,
        error: BoxError,
    ) -> Step<F, B, RB, C> {
        self.timed(&mut attempt);
        let outcome = self.config.classifier.classify_error(&*error);
        self.record(attempt, &outcome, &HeaderMap::new(), None);
        if !outcome.is_retryable() {
            return Step::Finish(Err(Error::failed(outcome, error, self.sent)));
        }
        match self.decide(&outcome) {
            Decision::Retry { delay, grant } => Step::Next(wait(delay, grant)),
            Decision::NotReplayable => Step::Finish(Err(Error::failed(outcome, error, self.sent))),
            Decision::GiveUp(cause) => {
                Step::Finish(Err(Error::given_up(outcome, error, self.sent, cause)))
            }
        }
    }

    /// An event stream was read up to its first content event (handed back, the breaker told
    /// how it ends when it ends), or failed before it (judged like a failed response).
    fn opened<F, B, RB>(
        &mut self,
        mut attempt: Attempt,
        head: response::Parts,
        opening: Opening<RB>,
    ) -> Step<F, B, RB, C>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let stream = match opening {
            Opening::Open(stream) => stream,
            Opening::Failed {
                outcome,
                read,
                rest,
            } => {
                self.watch.stream_failed();
                let response = Response::from_parts(head, ResponseBody::from_read(read, rest));
                return self.judged(attempt, response, outcome);
            }
        };
        let body = self.guard_stream(&mut attempt, stream);
        let response = Response::from_parts(head, body);
        self.judged(attempt, response, Outcome::success())
    }

    /// A response was classified: hand it back, or retry.
    fn judged<F, B, RB: Body>(
        &mut self,
        mut attempt: Attempt,
        mut response: Response<ResponseBody<RB>>,
        outcome: Outcome,
    ) -> Step<F, B, RB, C> {
        let took = attempt.took();
        let usage = self.record(
            attempt,
            &outcome,
            response.headers(),
            Some(response.status()),
        );
        if outcome.is_success() {
            self.config.policy.succeeded();
            if let Some(usage) = usage {
                response = settle_on_usage(response, usage);
            }
            return Step::Finish(Ok(response));
        }
        if let Some(took) = took {
            self.retries.attempt_took(took);
        }
        if !outcome.is_retryable() {
            // Fatal: no retry helps, here or above. Marked when this layer could have retried.
            if self.origin.is_replay() && self.config.policy.may_retry() {
                self.mark_final(&mut response);
            }
        } else {
            match self.decide(&outcome) {
                // The retry answers instead: this response is dropped.
                Decision::Retry { delay, grant } => return Step::Next(wait(delay, grant)),
                Decision::NotReplayable => {}
                Decision::GiveUp(cause) => {
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
}

/// The endings that are not an answer: a cut, the deadline, a service that failed to get ready.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// Ready when a stall opened the breaker and cut the attempt in flight (waiting for its
    /// answer, or for the error body it is read to be classified by): then the request ends as
    /// if refused.
    fn poll_cut<RB: Body>(
        &mut self,
        attempt: &mut Attempt,
        cx: &mut Context<'_>,
    ) -> Poll<Output<RB>> {
        let open: BreakerOpen = ready!(attempt.permits.poll_cut(cx));
        self.watch.unanswered(Reason::BreakerOpen);
        let rejected = Rejected::Open(open);
        Poll::Ready(match (self.origin.head(), &self.config.fallback) {
            (Some(head), Some(_)) => self.breaker_answer(head, rejected),
            _ => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        })
    }

    /// The deadline passed while the request waited: an attempt in flight timed out, which the
    /// breaker counts as a health failure.
    fn expired(&mut self, attempt: Option<Attempt>) -> Error {
        if let Some(attempt) = attempt {
            attempt.permits.timed_out();
        }
        self.watch.unanswered(Reason::DeadlineExceeded);
        Error::deadline_exceeded(self.sent)
    }
}

/// Waits `delay` before the retry; a zero delay skips the timer (tokio rounds every sleep up
/// to its next 1 ms tick, so `sleep(0)` would still wait).
fn wait<F, B, RB: Body, C>(delay: Duration, grant: Option<Grant>) -> State<F, B, RB, C> {
    if delay.is_zero() {
        State::Ready { grant }
    } else {
        State::Backoff {
            sleep: tokio::time::sleep(delay),
            grant,
        }
    }
}

/// The request ends before an attempt is sent, with `error`.
fn refuse<F, B, RB: Body, C>(error: Error) -> State<F, B, RB, C> {
    State::Refused {
        output: Some(Err(error)),
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
            State::Backoff { .. } => "backing off",
            State::Ready { .. } => "waiting for the service",
            State::Reserving { .. } => "asking the rate limit's fleet",
            State::Pacing { .. } => "waiting for the rate limit",
            State::Calling { .. } => "calling",
            State::Classifying { .. } => "classifying the answer",
            State::Opening { .. } => "reading a stream up to its first content",
            State::Refused { .. } => "refused",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempts", &self.ledger.sent)
            .field("deadline", &self.ledger.deadline)
            .finish()
    }
}
