//! [`AttemptLane`]: one attempt's path, as a list of states.
//!
//! ```text
//! Buffering ──▶ [Admitting] ──▶ Calling ──▶ Classifying | Opening ──▶ (output)
//!   (body)            ▲   the guards   │ error     │ retryable (an error event)
//!                     │                └─────┬─────┘
//!                   Ready ◀──────────────── Backoff
//! ```
//!
//! A lane is a state, which waits for one thing and holds what it waits with, beside the
//! [`Attempt`] itself (its ticket, its guards' passes, its clocks), which stays where it is while
//! the state moves at every step. Each arm of [`Books::poll_state`] polls what its state waits
//! for and asks the request's books ([`Ledger`]) for a [`Verdict`]: the guards whether the
//! attempt goes, the policy whether a failure is retried, the `Watch` told what happened. Only
//! this module calls the service. A request's lanes run in a [`Race`](crate::race::Race) (see
//! the [future](crate::ResponseFuture)).

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_budget::Ticket;
use stormguard_classify::body::{ClassifyResponse, Prefix, ResponseBody, Tail, classify_response};
use stormguard_classify::polled_after_completion;
use stormguard_classify::{BoxError, Classify};
use stormguard_jitter::Backoff;
use stormguard_stream::OpenStream;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::admission::{Admit, Ask, Wait};
use crate::attempt::{Attempt, Due};
use crate::body::ReplayBody;
use crate::continuing::Continue;
use crate::error::Error;
use crate::ledger::{Begin, Ledger, Output};
use crate::observe::Watch;
use crate::race::{Lane, Lap, Waiting};
use crate::route::Route;
use crate::template::{Now, Origin, tokens_unread};
use crate::verdict::Verdict;

/// What the lanes of a request share: the service, the request's books, who continues the
/// stream it hands back (taken when one is), and where the lane that ends the request leaves its
/// output (a place of the caller's: carried out through the race, it would be copied at each
/// step of the way).
pub(crate) struct Books<'a, S, B, RB: Body, C, Bk: Backoff> {
    pub(crate) service: &'a mut S,
    pub(crate) ledger: &'a mut Ledger<C, Bk>,
    pub(crate) continue_by: &'a mut Option<Continue<S, C, Bk>>,
    pub(crate) output: &'a mut Option<Output<RB>>,
    pub(crate) body: PhantomData<fn(B)>,
}

pin_project! {
    /// One attempt's path: what it waits for, and the attempt.
    #[project = AttemptLaneProj]
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
        // The request ended before its first poll (refused, out of time): its output waits.
        Ended { output: Option<Output<RB>> },
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

    /// Whether the attempt waits for its first content: its head, or a stream's first content
    /// event. A hedge goes only then.
    fn waits_for_content(&self) -> bool {
        matches!(self, Self::Calling { .. } | Self::Opening { .. })
    }
}

/// What comes after a state.
// Only ever returned, into the caller's slot: boxing the state would allocate at every step.
#[allow(clippy::large_enum_variant)]
enum Step<F, B, RB: Body, C> {
    Next(State<F, B, RB, C>),
    /// The request ended: its output is in the books.
    Finish,
    /// The lane's attempt is out of the race.
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

/// The panic of the engine's future polled after it completed.
pub(crate) fn polled_again<T>() -> T {
    polled_after_completion("ResponseFuture")
}

impl<F, B, RB: Body, C> Step<F, B, RB, C> {
    /// The state a request starts in, from its first step (taken before its first poll: an
    /// ending, `output`, waits for it).
    fn first(self, output: &mut Option<Output<RB>>) -> State<F, B, RB, C> {
        match self {
            Self::Next(state) => state,
            Self::Finish => State::Ended {
                output: output.take(),
            },
            Self::Out | Self::Wait => State::Done,
        }
    }
}

impl<F, B, RB: Body, C> AttemptLaneProj<'_, F, B, RB, C> {
    /// The lane ended the request (its output is in the books): what it waited for is dropped.
    fn finish(&mut self) -> Lap<()> {
        self.state.set(State::Done);
        Lap::Finished(())
    }
}

impl<F, B, RB: Body, C> AttemptLane<F, B, RB, C> {
    /// A hedge's lane, paid for with `ticket`: it goes once the service is ready.
    pub(crate) fn hedge(ticket: Ticket) -> Self {
        Self {
            state: State::Ready,
            attempt: Attempt::hedge(ticket),
        }
    }

    /// When its attempt is abandoned for want of its head, if it waits for one.
    pub(crate) fn head_clock<Bk: Backoff>(
        self: Pin<&mut Self>,
        ledger: &mut Ledger<C, Bk>,
    ) -> Option<Instant>
    where
        C: Classify,
    {
        let lane = self.project();
        matches!(*lane.state, State::Calling { .. })
            .then(|| ledger.head_clock(lane.attempt))
            .flatten()
    }

    /// The request's deadline passed: its attempt, if in flight, timed out, and what it waits
    /// for is dropped.
    pub(crate) fn expire<Bk: Backoff>(self: Pin<&mut Self>, ledger: &mut Ledger<C, Bk>)
    where
        C: Classify,
    {
        let mut lane = self.project();
        ledger.expire(lane.attempt);
        lane.state.set(State::Done);
    }

    /// The request lost a router's race: its attempt, if in flight, is cancelled as a loser's.
    pub(crate) fn cancel(self: Pin<&mut Self>, watch: &Watch) {
        let mut lane = self.project();
        if watch.cancelled(&mut lane.attempt.watch) {
            lane.attempt.permits.forget();
        }
        lane.state.set(State::Done);
    }

    /// How long its attempt has waited, if it is timed.
    pub(crate) fn waited(&self) -> Option<std::time::Duration> {
        self.attempt.in_flight()
    }

    /// What the watch keeps of its attempt.
    pub(crate) fn watch(&self) -> &crate::observe::AttemptWatch {
        &self.attempt.watch
    }

    /// What the lane waits for, in words.
    pub(crate) fn describe(&self) -> &'static str {
        match &self.state {
            State::Buffering { .. } => "buffering the request body",
            State::Backoff { .. } => "backing off",
            State::Ready => "waiting for the service",
            State::Admitting { .. } => "waiting for the guards",
            State::Calling { .. } => "calling",
            State::Classifying { .. } => "classifying the answer",
            State::Opening { .. } => "reading a stream up to its first content",
            State::Ended { .. } => "ended",
            State::Done => "done",
        }
    }
}

impl<F, B, RB: Body, C> Waiting for AttemptLane<F, B, RB, C> {
    fn waiting_since(self: Pin<&mut Self>) -> Option<Instant> {
        let lane = self.project();
        // Sent in this same poll, if no deadline timed it already.
        (lane.state.waits_for_content())
            .then(|| *lane.attempt.started.get_or_insert_with(Instant::now))
    }
}

impl<S, B, RB, C, Bk> Books<'_, S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// The request's first lane, after its first step with the request's `body` (`route`: what a
    /// router above handed with it).
    #[inline(always)]
    pub(crate) fn begin(
        &mut self,
        body: B,
        route: Option<Route>,
    ) -> AttemptLane<S::Future, B, RB, C> {
        let mut attempt = Attempt::default();
        if let Some(route) = route {
            self.routed(route, &mut attempt);
        }
        let mut now = Now::default();
        let state = match self.ledger.begin(body, &mut now) {
            Begin::Buffer(read) => State::Buffering { read },
            Begin::Send(request) => {
                let step = self.start(&mut attempt, request, &mut now);
                step.first(self.output)
            }
            Begin::Failed(error) => {
                let verdict = Verdict::End(Err(error));
                self.verdict(&mut attempt, verdict).first(self.output)
            }
        };
        AttemptLane { state, attempt }
    }
}

/// The lanes' side of the race: one step at a time, the hedge's like the request's own.
impl<'a, S, B, RB, C, Bk> Lane<Books<'a, S, B, RB, C, Bk>> for AttemptLane<S::Future, B, RB, C>
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
    /// The output is left in the books.
    type Output = ();

    #[inline]
    fn poll_lap(
        self: Pin<&mut Self>,
        books: &mut Books<'a, S, B, RB, C, Bk>,
        racing: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Lap<()>> {
        let mut this = self.project();
        let _in = books.ledger.enter(this.attempt);
        // Each step taken where it is matched: a step bound first and matched after would move
        // the state once more, at every step of every request.
        loop {
            match books.poll_state(this.state.as_mut(), this.attempt, racing, cx) {
                Step::Next(state) => this.state.set(state),
                Step::Finish => return Poll::Ready(this.finish()),
                Step::Out => return Poll::Ready(Lap::Out),
                Step::Wait => {
                    // Waiting for its head: its clock may have fired.
                    let Due::At(at) = this.attempt.head_by else {
                        return Poll::Pending;
                    };
                    if !matches!(*this.state, State::Calling { .. }) || Instant::now() < at {
                        return Poll::Pending;
                    }
                    let Some(verdict) = books.ledger.clock_fired(this.attempt, racing) else {
                        return Poll::Pending;
                    };
                    match books.verdict(this.attempt, verdict) {
                        Step::Next(state) => this.state.set(state),
                        Step::Finish => return Poll::Ready(this.finish()),
                        Step::Out => return Poll::Ready(Lap::Out),
                        Step::Wait => return Poll::Pending,
                    }
                }
            }
            // An attempt just sent is polled at once, in the same lap: the race acts only on a
            // step that leaves the backend (and a lap more was a call more per request).
            if !this.state.with_backend() {
                return Poll::Ready(Lap::Stepped);
            }
        }
    }

    fn in_flight(&self) -> bool {
        self.state.with_backend()
    }

    /// Cancelled as a loser: the breaker frees its place and counts nothing, the throttle
    /// forgets it, its ticket and slot stay spent (it was sent: it cost what it cost). A hedge
    /// not sent yet is dropped when vacated, its ticket and slot given back.
    fn lose(self: Pin<&mut Self>, books: &mut Books<'a, S, B, RB, C, Bk>) {
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

impl<S, B, RB, C, Bk> Books<'_, S, B, RB, C, Bk>
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
        let verdict = match state.project() {
            StateProj::Buffering { read } => {
                let (bytes, tail, rest) = wait!(Pin::new(read).poll(cx));
                return self.buffered(attempt, bytes, tail, rest);
            }
            StateProj::Backoff { sleep } => {
                wait!(sleep.poll(cx));
                return Step::Next(State::Ready);
            }
            StateProj::Ready => match wait!(self.service.poll_ready(cx)) {
                Ok(()) => return self.retry(attempt),
                Err(error) => self.ledger.not_ready(attempt, error.into()),
            },
            StateProj::Admitting { wait, request } => {
                let (guards, watch) = (&self.ledger.config.guards, &self.ledger.watch);
                let on_slot = &mut |start, limit: &_| watch.slot_reserved(start, limit);
                let admit = wait!(guards.poll_wait(wait, &mut attempt.permits, on_slot, cx));
                let request = *request.take().unwrap_or_else(polled_again);
                return self.admitted(attempt, request, admit, true, &mut Now::default());
            }
            StateProj::Calling { future } => match future.poll(cx) {
                Poll::Ready(result) => return self.answered(attempt, racing, result),
                Poll::Pending => return self.poll_cut(attempt, cx),
            },
            StateProj::Classifying { answer } => match Pin::new(answer).poll(cx) {
                Poll::Ready((response, outcome)) => {
                    self.ledger.judged(attempt, racing, response, outcome)
                }
                Poll::Pending => return self.poll_cut(attempt, cx),
            },
            StateProj::Opening { open, head } => match Pin::new(&mut open.0).poll(cx) {
                Poll::Ready(opening) => {
                    let head = head.take().unwrap_or_else(polled_again);
                    let continue_by = &mut *self.continue_by;
                    let given = matches!(continue_by, Some(Continue::By(_)));
                    let service = &*self.service;
                    let continuer = |config: &_| continue_by.take()?.continuer(service, config);
                    let since = open.1;
                    (self.ledger).opened(attempt, racing, head, opening, since, continuer, given)
                }
                Poll::Pending => return self.poll_cut(attempt, cx),
            },
            StateProj::Ended { output } => {
                *self.output = Some(output.take().unwrap_or_else(polled_again));
                return Step::Finish;
            }
            StateProj::Done => polled_again(),
        };
        self.verdict(attempt, verdict)
    }

    /// `attempt` waits for its answer: a stall that opens the breaker cuts it.
    fn poll_cut(
        &mut self,
        attempt: &mut Attempt,
        cx: &mut Context<'_>,
    ) -> Step<S::Future, B, RB, C> {
        let open = wait!(attempt.permits.poll_cut(cx));
        let verdict = self.ledger.cut(attempt, open);
        self.verdict(attempt, verdict)
    }

    /// `attempt` came back: a response is classified next (an event stream read up to its first
    /// content event), an error is judged now.
    #[inline(always)]
    fn answered(
        &mut self,
        attempt: &mut Attempt,
        racing: bool,
        result: Result<Response<RB>, S::Error>,
    ) -> Step<S::Future, B, RB, C> {
        let ledger = &mut self.ledger;
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                let error = error.into();
                let outcome = ledger.config.classifier.classify_error(&*error);
                let verdict = ledger.failed(attempt, racing, outcome, error);
                return self.verdict(attempt, verdict);
            }
        };
        let (head, body) = response.into_parts();
        let config = &ledger.config;
        if config.classifier.needs_body(&head) {
            ledger.timed(attempt);
            let response = Response::from_parts(head, body);
            let answer = classify_response(&ledger.config.classifier, response);
            return Step::Next(State::Classifying { answer });
        }
        // Judged on its head alone (every success): at once; an event stream once its first
        // content event came.
        let (outcome, event_stream) = config.classifier.classify_head(&head);
        let streaming = outcome.is_success() && event_stream;
        if outcome.is_success() && attempt.head_by != Due::Unset {
            ledger.learn_head(attempt, streaming);
        }
        // `streaming` first: the policy is copied out only for a stream.
        if streaming && let Some(policy) = config.streams {
            let can = matches!(
                self.continue_by,
                Some(Continue::Engine(_) | Continue::By(_))
            );
            let given = matches!(self.continue_by, Some(Continue::By(_)));
            let policy = ledger.stream_policy(policy, can, given);
            let mut open = stormguard_stream::open(body, policy);
            if ledger.watch.counts_usage() {
                open = open.counting_usage();
            }
            if let Some(gaps) = ledger.watch.chunk_gaps() {
                open = open.timing_gaps(gaps);
            }
            let open = Box::new((open, Instant::now()));
            let head = Some(head);
            return Step::Next(State::Opening { open, head });
        }
        let response = Response::from_parts(head, ResponseBody::new(body));
        if outcome.is_success() {
            // Written where the output waits: carried out through a verdict, the answer of
            // nearly every request would be copied at each step of the way (callgrind).
            let response = ledger.succeeded(attempt, response, &outcome);
            *self.output = Some(Ok(response));
            if let Some(output) = self.output {
                ledger.finish(output);
            }
            return Step::Finish;
        }
        let verdict = ledger.judged(attempt, racing, response, outcome);
        self.verdict(attempt, verdict)
    }
}

/// The steps before an attempt is sent: its request, the deadline, the guards, the service.
impl<S, B, RB, C, Bk> Books<'_, S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// A router above handed the request with `route`: its ticket pays for the first attempt.
    fn routed(&mut self, route: Route, attempt: &mut Attempt) {
        self.ledger.routed(&route);
        attempt.ticket = route.ticket;
        *self.continue_by = Some(match (route.continuation, route.continuer) {
            (false, Some(continuer)) => Continue::By(continuer),
            _ => Continue::Never,
        });
    }

    /// The request body was read up to the replay cap: the first attempt, made from it, goes.
    #[inline(always)]
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
        let mut now = Now::default();
        match self.ledger.buffered(bytes, tail, rest, &mut now) {
            Ok(request) => self.start(attempt, request, &mut now),
            Err(error) => self.verdict(attempt, Verdict::End(Err(error))),
        }
    }

    /// The service is ready: the retry, or the hedge, goes out, rebuilt from the template.
    #[inline(always)]
    fn retry(&mut self, attempt: &mut Attempt) -> Step<S::Future, B, RB, C> {
        let request = match &self.ledger.origin {
            Origin::Replay(template) => template.request(),
            Origin::Once(_) => {
                let error = Error::unreadable_body("no request to send".into());
                return self.verdict(attempt, Verdict::End(Err(error)));
            }
        };
        self.start(attempt, request, &mut Now::default())
    }

    /// Starts `attempt` with `request`, if the deadline lets it: past its guards (what they
    /// read of a request that can be sent again is its template), at once or after a wait.
    #[inline(always)]
    fn start(
        &mut self,
        attempt: &mut Attempt,
        request: Request<B>,
        now: &mut Now,
    ) -> Step<S::Future, B, RB, C> {
        let ledger = &mut self.ledger;
        if ledger.out_of_time(now) {
            let verdict = ledger.too_late(attempt);
            return self.verdict(attempt, verdict);
        }
        let deadline = ledger.deadline.map(|deadline| deadline.instant());
        let (guards, watch) = (&ledger.config.guards, &ledger.watch);
        let on_slot = &mut |start, limit: &_| watch.slot_reserved(start, limit);
        let permits = &mut attempt.permits;
        let (admit, request) = match &mut ledger.origin {
            Origin::Replay(template) => {
                let (head, tokens) = template.head_and_tokens();
                let ask = Ask {
                    head,
                    tokens,
                    deadline,
                };
                (guards.admit(permits, ask, on_slot), request)
            }
            Origin::Once(_) => {
                let (head, body) = request.into_parts();
                let ask = Ask {
                    head: &head,
                    tokens: tokens_unread,
                    deadline,
                };
                let admit = guards.admit(permits, ask, on_slot);
                (admit, Request::from_parts(head, body))
            }
        };
        self.admitted(attempt, request, admit, false, now)
    }

    /// The guards decided on `attempt` (`waited`: for a slot, so the time left it carries is
    /// stale): it goes, waits, or ends the request.
    #[inline(always)]
    fn admitted(
        &mut self,
        attempt: &mut Attempt,
        mut request: Request<B>,
        admit: Admit,
        waited: bool,
        now: &mut Now,
    ) -> Step<S::Future, B, RB, C> {
        let ledger = &mut self.ledger;
        match admit {
            Admit::Admitted => {}
            Admit::Wait(wait) => {
                let request = Some(Box::new(request));
                return Step::Next(State::Admitting { wait, request });
            }
            Admit::Refused(refusal) => {
                let verdict = ledger.refused(attempt, &request.into_parts().0, refusal);
                return self.verdict(attempt, verdict);
            }
        }
        // A first attempt built from the template is stamped already (unless it waited since).
        if ledger.sent > 0 || !ledger.origin.is_replay() || waited {
            ledger.stamp().write(request.headers_mut(), now);
        }
        ledger.sending(attempt, now);
        let _in = ledger.watch.span(&attempt.watch).enter();
        Step::Next(State::Calling {
            future: self.service.call(request),
        })
    }

    /// Acts on `verdict` for `attempt`: a retry takes the attempt's place and waits, an ending is
    /// left for the request to hand back, an attempt out of the race leaves it.
    #[inline]
    fn verdict(
        &mut self,
        attempt: &mut Attempt,
        verdict: Verdict<RB>,
    ) -> Step<S::Future, B, RB, C> {
        match verdict {
            Verdict::End(output) => {
                *self.output = Some(output);
                Step::Finish
            }
            Verdict::Retry(delay, ticket) => {
                *attempt = Attempt::paid(ticket);
                // A zero delay skips the timer: tokio rounds every sleep up to its next 1 ms
                // tick, so `sleep(0)` would still wait.
                Step::Next(match delay.is_zero() {
                    true => State::Ready,
                    false => State::Backoff {
                        sleep: tokio::time::sleep(delay),
                    },
                })
            }
            Verdict::Out => Step::Out,
        }
    }
}
