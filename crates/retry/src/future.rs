//! [`ResponseFuture`]: one request through the engine, as a path of states.
//!
//! ```text
//! Buffering ──▶ [Admitting] ──▶ Calling ──▶ Classifying | Opening ──▶ (output)
//!   (body)            ▲   the guards   │ error     │ retryable (an error event)
//!                     │                └─────┬─────┘
//!                   Ready ◀──────────────── Backoff
//! ```
//!
//! Each attempt moves along a lane ([`AttemptLane`]): its state, which waits for one thing and holds what it
//! waits with, beside the [`Attempt`] itself (its ticket, its guards' passes, its clocks), which
//! stays where it is while the state moves at every step. A request has one lane, and a second
//! while a hedge races the first; the [`Race`] polls them and ends the request with the first to
//! finish. Between two states a lane asks the request's books ([`Ledger`]): the guards whether the
//! attempt goes, the policy whether a failure is retried, and the `Watch` what happened. Only
//! this module calls the service. One timer enforces the deadline over every lane, and wakes the
//! request for its attempts' head clocks and its hedge.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_breaker::Rejected;
use stormguard_classify::body::{ClassifyResponse, Prefix, ResponseBody, Tail, classify_response};
use stormguard_classify::{BoxError, Classify, Outcome, Reason};
use stormguard_jitter::Backoff;
use stormguard_stream::{OpenStream, Opening, is_event_stream};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::admission::{Admit, Ask, Refusal, Wait};
use crate::attempt::{Attempt, Due};
use crate::body::ReplayBody;
use crate::clock::{AttemptTimedOut, attempt_timeout};
use crate::config::Config;
use crate::continuing::Continue;
use crate::error::Error;
use crate::ledger::{Begin, Ledger, Output, settle_on_usage};
use crate::policy::Decision;
use crate::race::{Lap, Race};
use crate::route::{Report, Route};
use crate::template::{Clock, Origin};

pin_project! {
    /// The response future of [`ClientService`](crate::ClientService).
    ///
    /// Dropping it cancels the request wherever it is: an attempt in flight is dropped with its
    /// passes (the throttle counts it as not accepted, the breaker frees its place), a backoff
    /// simply ends, nothing further is sent, and a ticket the budget granted for an attempt never
    /// sent, or a rate-limit slot never used, is given back. A hedge in flight is dropped the
    /// same way.
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
        race: Race<AttemptLane<S::Future, B, RB, C>>,
        // The deadline's timer, made the first time the request has to wait: a call that answers
        // at once never touches the timer wheel. The attempts' clocks and the hedge's share it.
        #[pin]
        timer: Option<Sleep>,
        books: Books<S, B, C, Bk>,
    }
}

/// What the lanes of a request share: the service, the request's books, and who continues the
/// stream it hands back (taken when one is). `B`: the request body's type.
pub(crate) struct Books<S, B, C, Bk: Backoff> {
    service: S,
    ledger: Ledger<C, Bk>,
    continue_by: Option<Continue<S, C, Bk>>,
    body: PhantomData<fn(B)>,
}

pin_project! {
    /// One attempt's path: what it waits for, and the attempt.
    pub(crate) struct AttemptLane<F, B, RB, C>
    where
        RB: Body,
    {
        #[pin]
        state: State<F, B, RB, C>,
        attempt: Attempt,
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
        Backoff { #[pin] sleep: Sleep },
        // Waiting for the service to be ready for a retry, or a hedge.
        Ready,
        // Waiting for a guard (the rate limit's fleet, or its slot) with the attempt's request,
        // boxed: inline, it would make every state as large as itself.
        Admitting { wait: Box<Wait>, request: Option<Box<Request<B>>> },
        // The attempt is in flight.
        Calling { #[pin] future: F },
        // Classifying the answer, reading the start of a failed response's body if need be.
        Classifying { answer: ClassifyResponse<RB, C> },
        // Reading an event stream up to its first content event (with when it began: the
        // first-content clock learns how long it took).
        Opening { open: Box<(OpenStream<RB>, Instant)>, head: Option<response::Parts> },
        // Ended before an attempt was sent: the output waits for the first poll.
        Refused { output: Option<Output<RB>> },
        Done,
    }
}

impl<F, B, RB: Body, C> State<F, B, RB, C> {
    /// Whether the lane's attempt is with the backend: sent, and its answer not judged yet.
    fn with_backend(&self) -> bool {
        matches!(
            self,
            Self::Calling { .. } | Self::Classifying { .. } | Self::Opening { .. }
        )
    }

    /// Whether the lane's attempt waits for its first content: its head, or a stream's first
    /// content event. A hedge goes only then.
    fn waits_for_content(&self) -> bool {
        matches!(self, Self::Calling { .. } | Self::Opening { .. })
    }
}

/// A request's lanes.
type Lanes<F, B, RB, C> = Race<AttemptLane<F, B, RB, C>>;

/// What comes after a state.
// Only ever returned, into the caller's slot: boxing the state would allocate at every step.
#[allow(clippy::large_enum_variant)]
enum Step<F, B, RB: Body, C> {
    Next(State<F, B, RB, C>),
    Finish(Output<RB>),
    /// The lane's attempt is out of the race (it failed while the other was in flight, or it is
    /// a hedge that was not sent).
    Out,
    /// What the state waits for is not ready.
    Wait,
}

/// `ready!` for a step: what is not ready makes the step a [`Step::Wait`].
macro_rules! wait {
    ($poll:expr) => {
        match $poll {
            Poll::Ready(ready) => ready,
            Poll::Pending => return Step::Wait,
        }
    };
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
    /// `route`: what a router above handed with the request, if one did.
    pub(crate) fn new(
        service: S,
        config: Arc<Config<C, Bk>>,
        request: Request<B>,
        continue_by: Continue<S, C, Bk>,
        route: Option<Route>,
    ) -> Self {
        let (head, body) = request.into_parts();
        let mut books = Books {
            service,
            ledger: Ledger::new(config, head),
            continue_by: Some(continue_by),
            body: PhantomData,
        };
        let mut attempt = Attempt::default();
        if let Some(route) = route {
            books.routed(route, &mut attempt);
        }
        let mut clock = Clock::default();
        let state = match books.ledger.begin(body, &mut clock) {
            Begin::Buffer(read) => State::Buffering { read },
            Begin::Send(request) => books.start(&mut attempt, request, &mut clock).into_state(),
            Begin::Failed(error) => books.end(Err(error)).into_state(),
        };
        Self {
            race: Race::new(AttemptLane { state, attempt }),
            timer: None,
            books,
        }
    }
}

impl<F, B, RB: Body, C> Step<F, B, RB, C> {
    /// The state a request starts in, from its first step (taken before its first poll: an
    /// ending waits for it).
    fn into_state(self) -> State<F, B, RB, C> {
        match self {
            Self::Next(state) => state,
            Self::Finish(output) => State::Refused {
                output: Some(output),
            },
            Self::Out | Self::Wait => State::Done,
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
            if let Poll::Ready(output) = this.race.as_mut().poll(this.books, cx) {
                return Poll::Ready(output);
            }
            // Waiting: the deadline bounds the wait, whatever the request waits for; each
            // attempt in flight has its head clock (its lane checks it when polled), and the
            // request its hedge's.
            let wake = this.books.wake_at(this.race.as_mut());
            match wake {
                Some(wake) => ready!(stormguard_deadline::poll_until(
                    this.timer.as_mut(),
                    wake,
                    cx
                )),
                None => return Poll::Pending,
            }
            if let Some(output) = this.books.expired(this.race.as_mut()) {
                return Poll::Ready(output);
            }
            this.books.hedge_if_due(this.race.as_mut());
        }
    }
}

/// The lanes' side of the race: one step at a time, the hedge's like the request's own.
impl<S, B, RB, C, Bk> crate::race::Lane<Books<S, B, C, Bk>> for AttemptLane<S::Future, B, RB, C>
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

    fn poll_lap(
        self: Pin<&mut Self>,
        books: &mut Books<S, B, C, Bk>,
        racing: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Lap<Output<RB>>> {
        let mut this = self.project();
        let _in = books.ledger.enter(this.attempt);
        let step = match books.poll_state(this.state.as_mut(), this.attempt, racing, cx) {
            // Waiting for its head: its clock may have fired.
            Step::Wait => match this.attempt.head_by {
                Due::At(at) if this.state.waits_for_head() && Instant::now() >= at => {
                    books.clock_fired(this.attempt, racing)
                }
                _ => Step::Wait,
            },
            step => step,
        };
        Poll::Ready(match step {
            Step::Wait => return Poll::Pending,
            Step::Next(state) => {
                this.state.set(state);
                Lap::Stepped
            }
            Step::Finish(output) => {
                this.state.set(State::Done);
                Lap::Finished(output)
            }
            Step::Out => Lap::Out,
        })
    }

    fn in_flight(&self) -> bool {
        self.state.with_backend()
    }

    /// Cancelled as a loser: the breaker frees its place and counts nothing, the throttle
    /// forgets it, its ticket and slot stay spent (it was sent: it cost what it cost). A hedge
    /// not sent yet is dropped when vacated, its ticket and slot given back.
    fn lose(self: Pin<&mut Self>, books: &mut Books<S, B, C, Bk>) {
        let attempt = self.project().attempt;
        if !attempt.sent {
            return;
        }
        let ledger = &mut books.ledger;
        ledger.watch.hedge_raced(!attempt.hedge);
        ledger.learn_lost(attempt);
        if ledger.watch.cancelled(&mut attempt.watch) {
            attempt.permits.forget();
        }
    }

    fn vacate(self: Pin<&mut Self>) {
        let mut this = self.project();
        this.state.set(State::Done);
        *this.attempt = Attempt::default();
    }
}

impl<F, B, RB: Body, C> State<F, B, RB, C> {
    /// Whether the attempt waits for its answer's head (what its head clock bounds).
    fn waits_for_head(&self) -> bool {
        matches!(self, Self::Calling { .. })
    }
}

impl<S, B, RB, C, Bk> Books<S, B, C, Bk>
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
    /// Polls what `state` waits for, and takes the step that follows (`racing`: the other lane's
    /// attempt is in flight).
    // Inlined into the lane's poll, the one place it is called: out of line, the body's reader
    // went with it, which cost the success path calls and copies (callgrind).
    #[inline(always)]
    fn poll_state(
        &mut self,
        state: Pin<&mut State<S::Future, B, RB, C>>,
        attempt: &mut Attempt,
        racing: bool,
        cx: &mut Context<'_>,
    ) -> Step<S::Future, B, RB, C> {
        match state.project() {
            StateProj::Buffering { read } => {
                let (bytes, tail, rest) = wait!(Pin::new(read).poll(cx));
                self.buffered(attempt, bytes, tail, rest)
            }
            StateProj::Backoff { sleep } => {
                wait!(sleep.poll(cx));
                Step::Next(State::Ready)
            }
            StateProj::Ready => match wait!(self.service.poll_ready(cx)) {
                Ok(()) => self.retry(attempt),
                Err(error) => self.not_ready(attempt, error.into()),
            },
            StateProj::Admitting { wait, request } => {
                let ledger = &self.ledger;
                let watch = &ledger.watch;
                let on_slot = &mut |start, limit: &_| watch.slot_reserved(start, limit);
                let guards = &ledger.config.guards;
                let admit = wait!(guards.poll_wait(wait, &mut attempt.permits, on_slot, cx));
                let request = *request.take().unwrap_or_else(polled_again);
                self.admitted(attempt, request, admit, true, &mut Clock::default())
            }
            StateProj::Calling { future } => match future.poll(cx) {
                Poll::Ready(result) => self.answered(attempt, racing, result),
                Poll::Pending => wait!(self.poll_cut(attempt, cx)),
            },
            StateProj::Classifying { answer } => match Pin::new(answer).poll(cx) {
                Poll::Ready((response, outcome)) => self.judged(attempt, racing, response, outcome),
                Poll::Pending => wait!(self.poll_cut(attempt, cx)),
            },
            StateProj::Opening { open, head } => match Pin::new(&mut open.0).poll(cx) {
                Poll::Ready(opening) => {
                    let head = head.take().unwrap_or_else(polled_again);
                    self.opened(attempt, racing, head, opening, open.1)
                }
                Poll::Pending => wait!(self.poll_cut(attempt, cx)),
            },
            StateProj::Refused { output } => {
                Step::Finish(output.take().unwrap_or_else(polled_again))
            }
            StateProj::Done => polled_again(),
        }
    }
}

/// The steps before an attempt is sent: its request, the deadline, the guards.
impl<S, B, RB, C, Bk> Books<S, B, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// A router above handed the request with `route`: its ticket is the first attempt's.
    fn routed(&mut self, route: Route, attempt: &mut Attempt) {
        self.ledger.routed(route.hand_off, route.continuation);
        attempt.ticket = route.ticket;
        self.continue_by = Some(match (route.continuation, route.continuer) {
            (false, Some(continuer)) => Continue::By(continuer),
            _ => Continue::Never,
        });
    }

    /// The request body was read up to the replay cap: the first attempt, made from it, goes.
    fn buffered(
        &mut self,
        attempt: &mut Attempt,
        bytes: Bytes,
        tail: Tail<B::Error>,
        rest: B,
    ) -> Step<S::Future, B, RB, C>
    where
        B::Error: Into<BoxError>,
    {
        let mut clock = Clock::default();
        match self.ledger.buffered(bytes, tail, rest, &mut clock) {
            Ok(request) => self.start(attempt, request, &mut clock),
            Err(error) => self.end(Err(error)),
        }
    }

    /// The service is ready: the retry, or the hedge, goes out, rebuilt from the template.
    fn retry(&mut self, attempt: &mut Attempt) -> Step<S::Future, B, RB, C> {
        let request = match &self.ledger.origin {
            Origin::Replay(template) => template.request(),
            Origin::Once(_) => {
                return self.end(Err(Error::unreadable_body("no request to send".into())));
            }
        };
        self.start(attempt, request, &mut Clock::default())
    }

    /// Starts `attempt` with `request`, if the deadline lets it: past its guards, at once or
    /// after a wait.
    fn start(
        &mut self,
        attempt: &mut Attempt,
        request: Request<B>,
        clock: &mut Clock,
    ) -> Step<S::Future, B, RB, C> {
        let ledger = &mut self.ledger;
        if ledger.out_of_time(clock) {
            if attempt.hedge {
                return self.hedge_not_sent(attempt, Reason::DeadlineExceeded);
            }
            ledger.watch.out_of_time();
            let sent = ledger.sent;
            return self.end(Err(Error::deadline_exceeded(sent)));
        }
        let deadline = ledger.deadline.map(|deadline| deadline.instant());
        let (head, body) = request.into_parts();
        let (origin, watch) = (&mut ledger.origin, &ledger.watch);
        let ask = Ask {
            head: &head,
            tokens: || origin.tokens(),
            deadline,
        };
        let on_slot = &mut |start, limit: &_| watch.slot_reserved(start, limit);
        let admit = ledger
            .config
            .guards
            .admit(&mut attempt.permits, ask, on_slot);
        self.admitted(
            attempt,
            Request::from_parts(head, body),
            admit,
            false,
            clock,
        )
    }

    /// The guards decided on `attempt` (`waited`: for a slot, so the time left it carries is
    /// stale): it goes, waits, or ends the request.
    fn admitted(
        &mut self,
        attempt: &mut Attempt,
        mut request: Request<B>,
        admit: Admit,
        waited: bool,
        clock: &mut Clock,
    ) -> Step<S::Future, B, RB, C> {
        match admit {
            Admit::Admitted => {}
            Admit::Wait(wait) => {
                let request = Some(Box::new(request));
                return Step::Next(State::Admitting { wait, request });
            }
            Admit::Refused(refusal) => {
                return self.refused(attempt, &request.into_parts().0, refusal);
            }
        }
        let ledger = &mut self.ledger;
        // A first attempt built from the template is stamped already (unless it waited since).
        if ledger.sent > 0 || !ledger.origin.is_replay() || waited {
            ledger.stamp().write(request.headers_mut(), clock);
        }
        ledger.sending(attempt, clock);
        let _in = ledger.watch.span(&attempt.watch).enter();
        Step::Next(State::Calling {
            future: self.service.call(request),
        })
    }

    /// A guard refused `attempt`: the request ends with the breaker's fallback or the error (a
    /// hedge is only not sent).
    fn refused(
        &mut self,
        attempt: &mut Attempt,
        head: &Parts,
        refusal: Refusal,
    ) -> Step<S::Future, B, RB, C> {
        if attempt.hedge {
            return self.hedge_not_sent(attempt, refusal.reason());
        }
        let ledger = &mut self.ledger;
        let sent = ledger.sent;
        ledger.watch.refused(&attempt.watch, refusal.reason(), sent);
        ledger.watch.health(&ledger.config.guards);
        let output = match refusal {
            Refusal::Breaker(rejected) => ledger.breaker_answer(head, rejected),
            Refusal::Throttled => Err(Error::throttled(sent)),
            Refusal::RateLimited(limited) => {
                Err(Error::refused(limited.outcome(), Box::new(limited), sent))
            }
        };
        self.end(output)
    }

    /// A hedge not sent: a guard refused it (`reason`), or the deadline came first. The
    /// request's attempt goes on alone.
    fn hedge_not_sent(&mut self, attempt: &Attempt, reason: Reason) -> Step<S::Future, B, RB, C> {
        self.ledger
            .watch
            .hedge_refused(&attempt.watch, Some(reason));
        Step::Out
    }

    /// The service failed to get ready for a retry, which therefore never went out (a hedge is
    /// only not sent).
    fn not_ready(&mut self, attempt: &mut Attempt, error: BoxError) -> Step<S::Future, B, RB, C> {
        let outcome = self.ledger.config.classifier.classify_error(&*error);
        if attempt.hedge {
            return self.hedge_not_sent(attempt, outcome.reason());
        }
        let sent = self.ledger.sent;
        self.end(Err(Error::failed(outcome, error, sent)))
    }

    /// The request ends with `output`: every ending of the path goes through here.
    fn end(&mut self, mut output: Output<RB>) -> Step<S::Future, B, RB, C> {
        self.ledger.finish(&mut output);
        Step::Finish(output)
    }
}

/// The steps after an attempt comes back: judging it, and retrying or handing it back.
impl<S, B, RB, C, Bk> Books<S, B, C, Bk>
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
    /// `attempt` came back: a response is classified next, an error is judged now.
    fn answered(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        result: Result<Response<RB>, S::Error>,
    ) -> Step<S::Future, B, RB, C> {
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                let error = error.into();
                let outcome = self.ledger.config.classifier.classify_error(&*error);
                return self.failed(attempt, racing, outcome, error);
            }
        };
        let (head, body) = response.into_parts();
        let ledger = &mut self.ledger;
        let config = &ledger.config;
        if config.classifier.needs_body(&head) {
            ledger.timed(attempt);
            let response = Response::from_parts(head, body);
            let answer = classify_response(&ledger.config.classifier, response);
            return Step::Next(State::Classifying { answer });
        }
        // Judged on its head alone (every success): at once; an event stream once its first
        // content event came.
        let outcome = config.classifier.classify_http(&head, &[]);
        let streaming = outcome.is_success() && is_event_stream(&head.headers);
        if outcome.is_success() && attempt.head_by != Due::Unset {
            ledger.learn_head(attempt, streaming);
        }
        // `streaming` first: the policy is copied out only for a stream.
        if streaming && let Some(policy) = config.streams {
            let mut open = stormguard_stream::open(body, ledger.stream_policy(policy));
            if ledger.watch.counts_usage() {
                open = open.counting_usage();
            }
            return Step::Next(State::Opening {
                open: Box::new((open, Instant::now())),
                head: Some(head),
            });
        }
        let response = Response::from_parts(head, ResponseBody::new(body));
        self.judged(attempt, racing, response, outcome)
    }

    /// `attempt` failed without a response, with `outcome`: fatal, given up on, or retried (out
    /// of the race, while the other attempt is in flight).
    fn failed(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        outcome: Outcome,
        error: BoxError,
    ) -> Step<S::Future, B, RB, C> {
        let ledger = &mut self.ledger;
        ledger.timed(attempt);
        ledger.record(attempt, &outcome, &HeaderMap::new(), None);
        if racing {
            return self.out(attempt);
        }
        let sent = ledger.sent;
        if !outcome.is_retryable() {
            return self.end(Err(Error::failed(outcome, error, sent)));
        }
        match ledger.decide(attempt, &outcome) {
            Decision::Retry { delay, ticket } => retry_after(attempt, delay, ticket),
            Decision::NotReplayable => self.end(Err(Error::failed(outcome, error, sent))),
            Decision::GiveUp(cause) => self.end(Err(Error::given_up(outcome, error, sent, cause))),
        }
    }

    /// An event stream was read up to its first content event (handed back, its guards told how
    /// it ends when it ends), or failed before it (judged like a failed response).
    fn opened(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        head: response::Parts,
        opening: Opening<RB>,
        since: Instant,
    ) -> Step<S::Future, B, RB, C> {
        let stream = match opening {
            Opening::Open(stream) => stream,
            Opening::Failed {
                outcome,
                read,
                rest,
            } => {
                self.ledger.watch.stream_failed();
                let response = Response::from_parts(head, ResponseBody::from_read(read, rest));
                return self.judged(attempt, racing, response, outcome);
            }
        };
        let ledger = &mut self.ledger;
        if let Some(clocks) = &ledger.config.clocks
            && stream.events() > 0
        {
            clocks.record_first_content(since.elapsed());
            if let Some(took) = attempt.in_flight() {
                clocks.record_to_first_content(true, took);
            }
        }
        let continue_by = &mut self.continue_by;
        let given = matches!(continue_by, Some(Continue::By(_)));
        let service = &self.service;
        let continuer = |config: &_| continue_by.take()?.continuer(service, config);
        let body = ledger.guard_stream(attempt, stream, continuer, given);
        let response = Response::from_parts(head, body);
        self.judged(attempt, racing, response, Outcome::success())
    }

    /// A response was classified: hand it back, or retry.
    fn judged(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        mut response: Response<ResponseBody<RB>>,
        outcome: Outcome,
    ) -> Step<S::Future, B, RB, C> {
        let ledger = &mut self.ledger;
        let usage = ledger.record(
            attempt,
            &outcome,
            response.headers(),
            Some(response.status()),
        );
        if outcome.is_success() {
            // A success ends the request: how long it took matters only before a retry.
            ledger.config.policy.succeeded();
            let recorder = ledger.usage_recorder(&response);
            if usage.is_some() || recorder.is_some() {
                response = settle_on_usage(response, usage, recorder);
            }
            return self.end(Ok(response));
        }
        ledger.timed(attempt);
        if racing {
            return self.out(attempt);
        }
        let cause = match outcome.is_retryable() {
            false => None,
            true => match ledger.decide(attempt, &outcome) {
                // The retry answers instead: this response is dropped.
                Decision::Retry { delay, ticket } => return retry_after(attempt, delay, ticket),
                Decision::NotReplayable => None,
                Decision::GiveUp(cause) => Some(cause),
            },
        };
        ledger.hand_back_failure(&mut response, outcome, cause);
        self.end(Ok(response))
    }

    /// `attempt` failed while the other attempt of the request was in flight: it leaves the
    /// race, and the other goes on alone.
    fn out(&mut self, attempt: &Attempt) -> Step<S::Future, B, RB, C> {
        if attempt.hedge {
            self.ledger.watch.hedge_failed();
        }
        Step::Out
    }

    /// Ready when a stall opened the breaker and cut `attempt` in flight (waiting for its
    /// answer, or for the error body it is read to be classified by): then the request ends as
    /// if refused.
    fn poll_cut(
        &mut self,
        attempt: &mut Attempt,
        cx: &mut Context<'_>,
    ) -> Poll<Step<S::Future, B, RB, C>> {
        let open = ready!(attempt.permits.poll_cut(cx));
        let ledger = &mut self.ledger;
        (ledger.watch).unanswered(&mut attempt.watch, Reason::BreakerOpen);
        let rejected = Rejected::Open(open);
        let output = match (ledger.origin.head(), &ledger.config.fallback) {
            (Some(head), Some(_)) => ledger.breaker_answer(head, rejected),
            _ => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                ledger.sent,
            )),
        };
        Poll::Ready(self.end(output))
    }

    /// `attempt`'s head clock fired while it waited for its answer: if the request can go on
    /// (see `RetryPolicy::may_go_on`), the attempt is abandoned (dropped with the state this
    /// step replaces), a timeout for its guards, and the request goes on as after any failure of
    /// its attempt; if not, it keeps the attempt, which may still answer within the deadline.
    fn clock_fired(&mut self, attempt: &mut Attempt, racing: bool) -> Step<S::Future, B, RB, C> {
        if !self.ledger.may_go_on(racing) {
            attempt.head_by = Due::Never;
            return Step::Wait;
        }
        let after = attempt.in_flight().unwrap_or_default();
        self.failed(
            attempt,
            racing,
            attempt_timeout(),
            Box::new(AttemptTimedOut::new(after)),
        )
    }
}

/// The request's clocks: when it wakes, what the deadline ends, when a hedge goes.
impl<S, B, RB, C, Bk> Books<S, B, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// When the request is woken if nothing else wakes it: the earliest of the deadline, the
    /// head clocks of its attempts waiting for their heads, and its hedge's; never without any.
    fn wake_at(&mut self, mut race: Pin<&mut Lanes<S::Future, B, RB, C>>) -> Option<Instant> {
        let mut wake = self.ledger.deadline.map(|deadline| deadline.instant());
        let ledger = &mut self.ledger;
        race.as_mut().for_each(|lane| {
            let lane = lane.project();
            if lane.state.waits_for_head() {
                wake = earliest(wake, ledger.head_clock(lane.attempt));
            }
        });
        earliest(wake, self.hedge_clock(race))
    }

    /// When the request's path is hedged, if it waits for its content and no hedge is out:
    /// worked out once per attempt, the first time it waits.
    fn hedge_clock(&mut self, mut race: Pin<&mut Lanes<S::Future, B, RB, C>>) -> Option<Instant> {
        let hedging = self.ledger.config.hedging?;
        let (Some(path), None) = race.lanes() else {
            return None;
        };
        if !path.state.waits_for_content() || !self.ledger.origin.is_replay() {
            return None;
        }
        match path.attempt.hedge_by {
            Due::At(at) => return Some(at),
            Due::Never => return None,
            Due::Unset => {}
        }
        // Sent in this same poll, if no deadline timed it already.
        let started = path.attempt.started.unwrap_or_else(Instant::now);
        let streaming = self.ledger.streaming();
        let clocks = self.ledger.config.clocks.as_ref();
        let due = race.hedge_due(&hedging, started, clocks, streaming);
        let attempt = race.as_mut().path()?.project().attempt;
        attempt.started = Some(started);
        attempt.hedge_by = due.map_or(Due::Never, Due::At);
        due
    }

    /// If the path's hedge is due: a hedge goes beside it, when the request has attempts left
    /// and the race's rules grant it. Asked once per attempt.
    fn hedge_if_due(&mut self, mut race: Pin<&mut Lanes<S::Future, B, RB, C>>) {
        let Some(hedging) = self.ledger.config.hedging else {
            return;
        };
        let Some(path) = race.as_mut().path() else {
            return;
        };
        let attempt = path.project().attempt;
        if !matches!(attempt.hedge_by, Due::At(at) if Instant::now() >= at) {
            return;
        }
        attempt.hedge_by = Due::Never;
        let ledger = &self.ledger;
        if ledger.sent >= ledger.config.policy.max_attempts {
            return;
        }
        let waited = attempt.in_flight().unwrap_or_default();
        let deadline = ledger.deadline.map(|deadline| deadline.instant());
        let budget = &ledger.config.policy.budget;
        match race.grant_hedge(&hedging, waited, deadline, budget) {
            Ok(ticket) => {
                let hedge = AttemptLane {
                    state: State::Ready,
                    attempt: Attempt::hedge(ticket),
                };
                race.start_hedge(hedge);
            }
            Err(crate::hedge::NoHedge::Budget) => {
                let path = race.lanes().0.map(|path| &path.attempt.watch);
                if let Some(watch) = path {
                    ledger.watch.hedge_refused(watch, None);
                }
            }
            Err(crate::hedge::NoHedge::Spent) => {}
        }
    }

    /// If the deadline has passed: the request ends, every attempt in flight timed out (a health
    /// failure for the breaker), and dropping the lanes cancels what is in flight.
    fn expired(&mut self, mut race: Pin<&mut Lanes<S::Future, B, RB, C>>) -> Option<Output<RB>> {
        let deadline = self.ledger.deadline?;
        if Instant::now() < deadline.instant() {
            return None;
        }
        let watch = &mut self.ledger.watch;
        race.as_mut().for_each(|lane| {
            let mut lane = lane.project();
            lane.attempt.permits.time_out();
            watch.unanswered(&mut lane.attempt.watch, Reason::DeadlineExceeded);
            lane.state.set(State::Done);
        });
        let mut output = Err(Error::deadline_exceeded(self.ledger.sent));
        self.ledger.finish(&mut output);
        Some(output)
    }
}

/// The failed attempt's retry goes after `delay`, paid for with `ticket`: it takes the lane's
/// attempt's place. A zero delay skips the timer (tokio rounds every sleep up to its next 1 ms
/// tick, so `sleep(0)` would still wait).
fn retry_after<F, B, RB: Body, C>(
    attempt: &mut Attempt,
    delay: Duration,
    ticket: Option<stormguard_budget::Ticket>,
) -> Step<F, B, RB, C> {
    *attempt = Attempt::paid(ticket);
    Step::Next(if delay.is_zero() {
        State::Ready
    } else {
        State::Backoff {
            sleep: tokio::time::sleep(delay),
        }
    })
}

/// The earlier of two instants, either of which may be missing.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pin_project! {
    /// The future of [`ClientService::route`](crate::ClientService::route): the engine's answer
    /// to a router above, with its [`Report`].
    pub struct Routed<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        inner: ResponseFuture<S, B, RB, C, Bk>,
    }
}

impl<S, B, RB, C, Bk> Routed<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    pub(crate) fn new(inner: ResponseFuture<S, B, RB, C, Bk>) -> Self {
        Self { inner }
    }

    /// Ends the turn as the loser of a race for the same answer (another backend answered
    /// first): each of its attempts in flight is cancelled as a loser (the throttle forgets it,
    /// the breaker frees its place, its ticket and slot stay spent: it was sent), not as one
    /// its caller abandoned. Polling it afterwards panics.
    pub fn lose(self: Pin<&mut Self>) {
        let inner = self.project().inner.project();
        let watch = &inner.books.ledger.watch;
        inner.race.for_each(|lane| {
            let mut lane = lane.project();
            if watch.cancelled(&mut lane.attempt.watch) {
                lane.attempt.permits.forget();
            }
            lane.state.set(State::Done);
        });
    }
}

impl<S, B, RB, C, Bk> Future for Routed<S, B, RB, C, Bk>
where
    ResponseFuture<S, B, RB, C, Bk>: Future<Output = Output<RB>>,
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
    C: Classify,
{
    type Output = (Output<RB>, Report);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.project().inner;
        let output = ready!(inner.as_mut().poll(cx));
        let report = inner.project().books.ledger.report(&output);
        Poll::Ready((output, report))
    }
}

impl<S, B, RB, C, Bk> fmt::Debug for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, hedge) = self.race.lanes();
        let state = match path.map(|lane| &lane.state) {
            Some(State::Buffering { .. }) => "buffering the request body",
            Some(State::Backoff { .. }) => "backing off",
            Some(State::Ready) => "waiting for the service",
            Some(State::Admitting { .. }) => "waiting for the guards",
            Some(State::Calling { .. }) => "calling",
            Some(State::Classifying { .. }) => "classifying the answer",
            Some(State::Opening { .. }) => "reading a stream up to its first content",
            Some(State::Refused { .. }) => "refused",
            Some(State::Done) | None => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempts", &self.books.ledger.sent)
            .field("hedged", &hedge.is_some())
            .field("deadline", &self.books.ledger.deadline)
            .finish()
    }
}

impl<S, B, RB, C, Bk> fmt::Debug for Routed<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Routed").field(&self.inner).finish()
    }
}
