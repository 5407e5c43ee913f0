//! [`ResponseFuture`]: one request through the engine, as a path of states.
//!
//! ```text
//! Buffering ──▶ [Reserving] ─▶ [Pacing] ──▶ Calling ──▶ Classifying | Opening ──▶ (output)
//!   (body)            ▲                         │ error     │ retryable (an error event)
//!                     │                         └──────┬────┘
//!                   Ready ◀─────────────────────── Backoff
//! ```
//!
//! The states only wait, each for one thing, and hold what they wait with (the request waiting
//! for its rate-limit slot, the call in flight, the answer being read). The attempt itself
//! (`Attempt`: its retry grant, its slot, its guards' permits) is a value the ledger holds, not
//! a state's: the state moves at every step, the attempt stays where it is; and whatever the
//! request is dropped in, the attempt settles by its parts' own rules. Between two states, the
//! `Ledger` (the request's bookkeeping) takes one step, asking the guards (`admission`) whether
//! an attempt goes, the policy (`policy`) whether a failure is retried, and telling the `Watch`
//! what happened. The deadline is enforced over every state by one
//! timer, and over the body handed back.
//!
//! A hedge (see `hedge`) is a second path beside the request's own, from `Ready` to its answer:
//! each path is a *lane*, polled in turn, with its attempt in the ledger's place while it is
//! stepped (the other's set aside). The first lane to hand back an answer ends the request and
//! cancels the other; a lane whose attempt fails while the other is in flight is withdrawn, and
//! the other goes on alone.

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
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
use stormguard_stream::{Continuer, OpenStream, Opening, is_event_stream};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::admission::Refusal;
use crate::attempt::Due;
use crate::body::ReplayBody;
use crate::clock::AttemptTimedOut;
use crate::continuing::ContinueBy;
use crate::error::{Error, FailedAnswer};
use crate::layer::Config;
use crate::ledger::{Begin, Ledger, settle_on_usage};
use crate::policy::Decision;
use crate::template::{Clock, Origin};

/// What the future hands back.
pub(crate) type Output<RB> = Result<Response<ResponseBody<RB>>, Error>;

pin_project! {
    /// The response future of [`ClientService`](crate::ClientService).
    ///
    /// Dropping it cancels the request wherever it is: an attempt in flight is dropped with its
    /// permits (the throttle counts it as not accepted, the breaker frees its place), a backoff
    /// simply ends, nothing further is sent, and a retry or hedge the budget granted but that was
    /// never sent, or a rate-limit slot never used, is given back. A hedge in flight is dropped
    /// the same way.
    ///
    /// # Panics
    ///
    /// When polled after it completed, as a future may (tokio's `JoinHandle` does too).
    #[project = FutureProj]
    pub struct ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        state: State<S::Future, B, RB, C>,
        // The deadline's timer, made the first time the request has to wait: a call that answers
        // at once never touches the timer wheel. The attempts' clocks and the hedge's share it.
        #[pin]
        timer: Option<Sleep>,
        service: S,
        ledger: Ledger<C, Bk>,
        // How a stream handed back is continued, if it may be.
        continuer: Option<ContinueBy<S, C, Bk>>,
        // The hedge's lane while one is out: boxed, so that a request never hedged carries a
        // pointer and no second state.
        hedge: Option<Pin<Box<State<S::Future, B, RB, C>>>>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<F, B, RB, C>
    where
        RB: Body,
    {
        // Reading the request body to replay it; the readied service waits for it.
        Buffering { read: Prefix<B> },
        // Waiting out the delay before a retry.
        Backoff { #[pin] sleep: Sleep },
        // Waiting for the service to be ready for a retry, or a hedge.
        Ready,
        // Waiting for the rate limit's fleet (in Redis) to decide on the attempt's slot. The
        // request waits in a box (here and in `Pacing`): inline, it would make every state as
        // large as itself and a timer, and the state moves at every step of every request.
        Reserving { acquire: Acquire, request: Option<Box<Request<B>>> },
        // Waiting for the rate limit's slot; the readied service sends the attempt then.
        Pacing { #[pin] sleep: Sleep, request: Option<Box<Request<B>>> },
        // An attempt is in flight.
        Calling { #[pin] future: F },
        // Classifying the answer, reading the start of a failed response's body if need be.
        Classifying { answer: ClassifyResponse<RB, C> },
        // Reading an event stream up to its first content event.
        // (With when it began: the first-content clock learns how long it took.)
        Opening { open: Box<(OpenStream<RB>, Instant)>, head: Option<response::Parts> },
        // Ended before an attempt was sent: the output (an error, or the breaker's fallback)
        // waits for the first poll.
        Refused { output: Option<Output<RB>> },
        // The request's attempt failed while its hedge was in flight: the hedge's lane is the
        // request's now.
        Hedged,
        // A hedge not sent (a guard refused it): its lane ends at the next poll.
        Withdrawn,
        // The output was handed back.
        Done,
    }
}

impl<F, B, RB: Body, C> State<F, B, RB, C> {
    /// Whether an attempt of the lane is with the backend: sent, and its answer not judged yet.
    fn with_backend(&self) -> bool {
        matches!(
            self,
            Self::Calling { .. } | Self::Classifying { .. } | Self::Opening { .. }
        )
    }

    /// Whether an attempt of the lane waits for its first content: its head, or a stream's
    /// first content event. A hedge goes only then.
    fn waits_for_content(&self) -> bool {
        matches!(self, Self::Calling { .. } | Self::Opening { .. })
    }
}

/// What comes after a state: another state, or the end.
// Only ever returned, into the caller's slot: boxing the state would allocate at every step.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Step<F, B, RB: Body, C> {
    Next(State<F, B, RB, C>),
    Finish(Output<RB>),
    /// What the state waits for is not ready (from `poll_state` only: a step that is itself the
    /// poll's answer is made where it is matched, not made and then wrapped in a `Poll`).
    Wait,
    /// The lane's attempt is out of the request: it failed while the other attempt was in
    /// flight, or it was a hedge that was not sent. The other goes on.
    Withdrawn,
}

/// Which path of the request a step is on: its own, or its hedge's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    Lead,
    Hedge,
}

/// `ready!` for `poll_state`: what is not ready makes the step a [`Step::Wait`].
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
    pub(crate) fn new(
        mut service: S,
        config: Arc<Config<C, Bk>>,
        request: Request<B>,
        continuer: Option<ContinueBy<S, C, Bk>>,
    ) -> Self {
        let (head, body) = request.into_parts();
        let mut ledger = Ledger::new(config, head);
        let mut clock = Clock::default();
        let state = match ledger.begin(body, &mut clock) {
            Begin::Buffer(read) => State::Buffering { read },
            Begin::Send(request) => ledger.start(&mut service, request, &mut clock),
            Begin::Failed(error) => ledger.refuse(error),
        };
        Self {
            state,
            timer: None,
            service,
            ledger,
            continuer,
            hedge: None,
        }
    }
}

impl<S, B, RB, C, Bk> ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// Ends the request as the loser of a race for the same answer (a failover's hedge on
    /// another backend answered first): each of its attempts in flight is cancelled as a loser
    /// (the throttle forgets it, the breaker frees its place, its budget withdrawal and rate-limit
    /// slot stay spent: it was sent), not as one its caller abandoned, and what it waited teaches
    /// its backend's time to first content. Polling the future afterwards panics.
    pub fn lose(self: Pin<&mut Self>) {
        let mut this = self.project();
        this.ledger.lose_all();
        this.state.set(State::Done);
        *this.hedge = None;
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
            // The request's own lane: its attempt is in the ledger's place. Each arm takes its
            // step in place: a step bound first and matched after would move the state once
            // more, at every step of every request.
            {
                let _in = this.ledger.enter();
                let state = this.state.as_mut();
                let continuer = &mut *this.continuer;
                match poll_state::<_, _, _, _, _, true>(
                    state,
                    this.service,
                    this.ledger,
                    continuer,
                    cx,
                ) {
                    Step::Next(state) => {
                        this.state.set(state);
                        // No longer with the backend: a hedge not sent yet has nothing to race.
                        if this.hedge.is_some() && !this.state.as_ref().get_ref().with_backend() {
                            this.drop_hedge();
                        }
                        continue;
                    }
                    Step::Finish(output) => {
                        this.state.set(State::Done);
                        if this.hedge.is_some() {
                            this.end_race();
                        }
                        return Poll::Ready(output);
                    }
                    Step::Withdrawn => {
                        this.ledger.withdraw();
                        this.state.set(State::Hedged);
                        continue;
                    }
                    Step::Wait => {}
                }
            }
            // The hedge's lane, if one is out.
            match this.poll_hedge(cx) {
                Some(ControlFlow::Break(output)) => return Poll::Ready(output),
                Some(ControlFlow::Continue(())) => continue,
                None => {}
            }
            // Waiting: the deadline bounds the wait, whatever the request waits for, and each
            // attempt in flight has its head clock, and the request its hedge's.
            ready!(this.poll_timer(cx));
            if let ControlFlow::Break(output) = this.clocks_fired() {
                return Poll::Ready(output);
            }
        }
    }
}

impl<S, B, RB, C, Bk> FutureProj<'_, S, B, RB, C, Bk>
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
    /// Polls what the hedge's attempt waits for, if one is out, and takes the step it leads to:
    /// `None` while it waits, else whether the request ends.
    fn poll_hedge(&mut self, cx: &mut Context<'_>) -> Option<ControlFlow<Output<RB>>> {
        let switched = self.enter_lane(Lane::Hedge)?;
        let state = self.hedge.as_mut()?.as_mut();
        let _in = self.ledger.enter();
        let polled = poll_state::<_, _, _, _, _, false>(
            state,
            self.service,
            self.ledger,
            self.continuer,
            cx,
        );
        drop(_in);
        match polled {
            Step::Wait => {
                self.leave_lane(switched);
                None
            }
            step => Some(self.take_step(Lane::Hedge, step, switched)),
        }
    }

    /// Puts the attempt of `lane` in the ledger's place: whether it had to be switched in
    /// (`None`: no hedge is out). The lead's attempt is there already; the hedge's is, once the
    /// lead's failed.
    fn enter_lane(&mut self, lane: Lane) -> Option<bool> {
        match lane {
            Lane::Lead => Some(false),
            Lane::Hedge => {
                self.hedge.as_ref()?;
                let switch = self.ledger.aside.is_some();
                if switch {
                    self.ledger.switch();
                }
                Some(switch)
            }
        }
    }

    /// Puts the lead's attempt back in the ledger's place, if the hedge's was `switched` in.
    fn leave_lane(&mut self, switched: bool) {
        if switched {
            self.ledger.switch();
        }
    }

    /// Takes `step`, which the attempt on `lane` (in the ledger's place, `switched` there) led
    /// to: the request ends (the other attempt cancelled), the lane is withdrawn, or it moves.
    /// (The request's own lane takes its steps in `poll`, in place; its fired clocks here.)
    fn take_step(
        &mut self,
        lane: Lane,
        step: Step<S::Future, B, RB, C>,
        switched: bool,
    ) -> ControlFlow<Output<RB>> {
        let state = match step {
            Step::Finish(output) => {
                self.state.set(State::Done);
                self.end_race();
                return ControlFlow::Break(output);
            }
            Step::Withdrawn => {
                self.ledger.withdraw();
                match lane {
                    Lane::Lead => self.state.set(State::Hedged),
                    Lane::Hedge => *self.hedge = None,
                }
                return ControlFlow::Continue(());
            }
            Step::Next(state) => state,
            Step::Wait => {
                self.leave_lane(switched);
                return ControlFlow::Continue(());
            }
        };
        let with_backend = state.with_backend();
        match (lane, self.hedge.as_mut()) {
            (Lane::Lead, Some(_)) if !with_backend => {
                self.drop_hedge();
                self.state.set(state);
            }
            (Lane::Lead, _) => self.state.set(state),
            // The hedge is the request's only attempt, and failed: its retry is the request's
            // path.
            (Lane::Hedge, Some(_)) if !switched && !with_backend => {
                *self.hedge = None;
                self.state.set(state);
            }
            (Lane::Hedge, Some(hedge)) => hedge.set(state),
            (Lane::Hedge, None) => {}
        }
        self.leave_lane(switched);
        ControlFlow::Continue(())
    }

    /// The request ended while a hedge was out: the other attempt of the race lost.
    fn end_race(&mut self) {
        self.ledger.cancel_aside();
        *self.hedge = None;
    }

    /// Drops the hedge's lane, not sent yet: its grant and its slot go back.
    fn drop_hedge(&mut self) {
        self.ledger.aside = None;
        *self.hedge = None;
    }

    /// Ready when the earliest of the deadline, the attempts' head clocks and the hedge's clock
    /// has come; never without any.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.ledger.deadline.map(|deadline| deadline.instant());
        let [lead, hedge] = self.head_clocks();
        let hedge_by = self.hedge_clock();
        match [deadline, lead, hedge, hedge_by]
            .into_iter()
            .flatten()
            .min()
        {
            Some(wake) => stormguard_deadline::poll_until(self.timer.as_mut(), wake, cx),
            None => Poll::Pending,
        }
    }

    /// When each lane's attempt is abandoned for want of its head, if it waits for one.
    fn head_clocks(&mut self) -> [Option<Instant>; 2] {
        [Lane::Lead, Lane::Hedge].map(|lane| {
            let switched = self.enter_lane(lane)?;
            let calling = match lane {
                Lane::Lead => self.state.as_ref().get_ref(),
                Lane::Hedge => self.hedge.as_ref()?.as_ref().get_ref(),
            };
            let head_by = matches!(calling, State::Calling { .. })
                .then(|| self.ledger.head_clock())
                .flatten();
            self.leave_lane(switched);
            head_by
        })
    }

    /// When the request's attempt is hedged, if it waits for its content and no hedge is out.
    fn hedge_clock(&mut self) -> Option<Instant> {
        let waits = self.state.as_ref().get_ref().waits_for_content();
        (waits && self.hedge.is_none())
            .then(|| self.ledger.hedge_clock())
            .flatten()
    }

    /// The timer fired: the deadline passed (the request ends, every attempt in flight timed
    /// out), or an attempt's head clock fired, or the hedge is due.
    fn clocks_fired(&mut self) -> ControlFlow<Output<RB>> {
        let now = Instant::now();
        if self
            .ledger
            .deadline
            .is_some_and(|deadline| now >= deadline.instant())
        {
            // Dropping the states cancels what is in flight.
            self.state.set(State::Done);
            *self.hedge = None;
            return ControlFlow::Break(self.ledger.expired());
        }
        for (lane, head_by) in [Lane::Lead, Lane::Hedge]
            .into_iter()
            .zip(self.head_clocks())
        {
            if head_by.is_none_or(|head_by| now < head_by) {
                continue;
            }
            let Some(switched) = self.enter_lane(lane) else {
                continue;
            };
            match self.ledger.clock_fired() {
                Some(step) => return self.take_step(lane, step, switched),
                // Kept: it may still answer.
                None => self.leave_lane(switched),
            }
        }
        if self.hedge_clock().is_some_and(|hedge_by| now >= hedge_by) && self.ledger.hedge() {
            *self.hedge = Some(Box::pin(State::Ready));
        }
        ControlFlow::Continue(())
    }
}

/// Polls what the request waits for, and takes the step that follows (`LEAD`: on the request's
/// own lane; a hedge's never reads the request body, being made from the buffered template).
// Inlined into both lanes' polls, and the hedge's without the body's reading: called from two
// places, it was left out of line, and the body's reader with it, which cost the success path
// 230 instructions of calls and copies (callgrind).
#[inline(always)]
fn poll_state<S, B, RB, C, Bk, const LEAD: bool>(
    state: Pin<&mut State<S::Future, B, RB, C>>,
    service: &mut S,
    ledger: &mut Ledger<C, Bk>,
    continuer: &mut Option<ContinueBy<S, C, Bk>>,
    cx: &mut Context<'_>,
) -> Step<S::Future, B, RB, C>
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
    match state.project() {
        StateProj::Buffering { read } if LEAD => {
            let (bytes, tail, rest) = wait!(Pin::new(read).poll(cx));
            ledger.buffered(service, bytes, tail, rest)
        }
        StateProj::Buffering { .. } => polled_again(),
        StateProj::Backoff { sleep } => {
            wait!(sleep.poll(cx));
            Step::Next(State::Ready)
        }
        StateProj::Ready => match wait!(service.poll_ready(cx)) {
            Ok(()) => Step::Next(ledger.retry(service)),
            Err(error) => ledger.not_ready(error.into()),
        },
        StateProj::Reserving { acquire, request } => {
            let decision = wait!(Pin::new(acquire).poll(cx));
            let request = *request.take().unwrap_or_else(polled_again);
            Step::Next(ledger.reserved(service, request, decision, &mut Clock::default()))
        }
        StateProj::Pacing { sleep, request } => {
            wait!(sleep.poll(cx));
            let request = *request.take().unwrap_or_else(polled_again);
            Step::Next(ledger.send(service, request, true, &mut Clock::default()))
        }
        StateProj::Calling { future } => match future.poll(cx) {
            Poll::Ready(result) => ledger.answered(result),
            Poll::Pending => wait!(ledger.poll_cut(cx)),
        },
        StateProj::Classifying { answer } => match Pin::new(answer).poll(cx) {
            Poll::Ready((response, outcome)) => ledger.judged(response, outcome),
            Poll::Pending => wait!(ledger.poll_cut(cx)),
        },
        StateProj::Opening { open, head } => match Pin::new(&mut open.0).poll(cx) {
            Poll::Ready(opening) => {
                let head = head.take().unwrap_or_else(polled_again);
                let config = Arc::clone(&ledger.config);
                let given = continuer.as_ref().is_some_and(ContinueBy::is_given);
                let continuer = move || Some(continuer.take()?.continuer(service, &config));
                ledger.opened(head, opening, open.1, (given, continuer))
            }
            Poll::Pending => wait!(ledger.poll_cut(cx)),
        },
        StateProj::Refused { output } => Step::Finish(output.take().unwrap_or_else(polled_again)),
        // The hedge's lane answers for the request.
        StateProj::Hedged => Step::Wait,
        StateProj::Withdrawn => Step::Withdrawn,
        StateProj::Done => polled_again(),
    }
}

/// The steps before an attempt is sent: the deadline, the guards.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// The service is ready: the retry goes out, rebuilt from the template.
    fn retry<S, B, F, RB>(&mut self, service: &mut S) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        B: ReplayBody,
        RB: Body,
    {
        let request = match &self.origin {
            Origin::Replay(template) => template.request(),
            Origin::Once(_) => {
                return self.refuse(Error::unreadable_body("no request to send".into()));
            }
        };
        self.start(service, request, &mut Clock::default())
    }

    /// Starts an attempt, if the deadline lets it: at once, or after the rate limit's wait.
    pub(crate) fn start<S, B, F, RB>(
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
            if self.attempt.hedge {
                return self.hedge_not_sent(Reason::DeadlineExceeded);
            }
            self.watch.out_of_time();
            return self.refuse(Error::deadline_exceeded(self.sent));
        }
        if self.config.guards.rate_limit.is_none() {
            return self.send(service, request, false, clock);
        }
        let (head, body) = request.into_parts();
        let origin = &mut self.origin;
        let reserved = (self.config.guards).reserve(&head, || origin.tokens(), deadline);
        let request = Request::from_parts(head, body);
        let Some(mut acquire) = reserved else {
            return self.send(service, request, false, clock);
        };
        match acquire.now() {
            Some(decision) => self.reserved(service, request, decision, clock),
            None => State::Reserving {
                acquire,
                request: Some(Box::new(request)),
            },
        }
    }

    /// The rate limit decided on the attempt's slot: it goes at once, after a wait, or not at
    /// all.
    fn reserved<S, B, F, RB>(
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
        let slot = match decision {
            Ok(slot) => slot,
            Err(_) if self.attempt.hedge => {
                return self.hedge_not_sent(Reason::RateLimitedLocally);
            }
            Err(limited) => {
                let attempt = &self.attempt.watch;
                self.watch
                    .refused(attempt, Reason::RateLimitedLocally, self.sent);
                return self.refuse(Error::refused(
                    limited.outcome(),
                    Box::new(limited),
                    self.sent,
                ));
            }
        };
        let start = slot.start();
        self.watch.slot_reserved(start, &self.config.guards);
        self.attempt.slot = Some(slot);
        // Read after the reservation: a slot free now starts at the limit's own reading of the
        // clock, later than this step's, and waiting for it would still cost a timer rounded up
        // to the next millisecond.
        if start > Instant::now() {
            return State::Pacing {
                sleep: tokio::time::sleep_until(start),
                request: Some(Box::new(request)),
            };
        }
        self.send(service, request, false, clock)
    }

    /// Sends the attempt, if the breaker and the throttle let it go (`waited`: for its
    /// rate-limit slot, so the time left it carries is stale).
    fn send<S, B, F, RB>(
        &mut self,
        service: &mut S,
        mut request: Request<B>,
        waited: bool,
        clock: &mut Clock,
    ) -> State<F, B, RB, C>
    where
        S: Service<Request<B>, Future = F>,
        RB: Body,
    {
        let attempt = &mut self.attempt;
        let admitted = self
            .config
            .guards
            .admit(attempt.slot.take(), &mut attempt.permits);
        if let Err(refusal) = admitted {
            return self.refused(&request.into_parts().0, refusal);
        }
        // A first attempt built from the template is stamped already (unless it waited since).
        if self.sent > 0 || !self.origin.is_replay() || waited {
            self.stamp().write(request.headers_mut(), clock);
        }
        if let Some(grant) = &mut self.attempt.grant {
            grant.send();
        }
        let attempt = &mut self.attempt;
        attempt.started = self.deadline.is_some().then(|| clock.now());
        attempt.head_by = Due::Unset;
        attempt.hedge_by = Due::Unset;
        attempt.sent = true;
        self.sent = self.sent.saturating_add(1);
        let name = self.config.name.as_deref();
        (self.watch).sending(&mut attempt.watch, self.sent, name, attempt.hedge);
        let _in = self.watch.span(&self.attempt.watch).enter();
        State::Calling {
            future: service.call(request),
        }
    }

    /// A guard refused the attempt: the request ends with the breaker's fallback or the error.
    fn refused<F, B, RB: Body>(&mut self, head: &Parts, refusal: Refusal) -> State<F, B, RB, C> {
        if self.attempt.hedge {
            return self.hedge_not_sent(refusal.reason());
        }
        self.watch
            .refused(&self.attempt.watch, refusal.reason(), self.sent);
        self.watch.health(&self.config.guards);
        let output = match refusal {
            Refusal::Breaker(rejected) => self.breaker_answer(head, rejected),
            Refusal::Throttled => Err(Error::throttled(self.sent)),
        };
        self.refused_with(output)
    }

    /// The request ends before an attempt is sent, with `error`.
    fn refuse<F, B, RB: Body>(&mut self, error: Error) -> State<F, B, RB, C> {
        self.refused_with(Err(error))
    }

    /// The request ends before an attempt is sent, with `output`, handed back at the next poll
    /// (finished already: see `Ledger::end`).
    fn refused_with<F, B, RB: Body>(&mut self, mut output: Output<RB>) -> State<F, B, RB, C> {
        self.finish(&mut output);
        State::Refused {
            output: Some(output),
        }
    }
}

/// The steps after an attempt comes back: judging it, and retrying or handing it back.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// An attempt came back: a response is classified next, an error is judged now.
    fn answered<F, B, RB, E>(&mut self, result: Result<Response<RB>, E>) -> Step<F, B, RB, C>
    where
        RB: Body<Data = Bytes>,
        RB::Error: Into<BoxError>,
        E: Into<BoxError>,
    {
        let response = match result {
            Ok(response) => response,
            Err(error) => return self.failed(error.into()),
        };
        let (head, body) = response.into_parts();
        if self.config.classifier.needs_body(&head) {
            self.timed();
            let response = Response::from_parts(head, body);
            let answer = classify_response(&self.config.classifier, response);
            return Step::Next(State::Classifying { answer });
        }
        // Judged on its head alone (every success): at once; an event stream once its first
        // content event came.
        let outcome = self.config.classifier.classify_http(&head, &[]);
        let streaming = outcome.is_success() && is_event_stream(&head.headers);
        if outcome.is_success() && self.attempt.head_by != Due::Unset {
            self.learn_head(streaming);
        }
        // `streaming` first: the policy is copied out only for a stream.
        if streaming && let Some(policy) = self.config.streams {
            let mut open = stormguard_stream::open(body, self.stream_policy(policy));
            if self.watch.counts_usage() {
                open = open.counting_usage();
            }
            return Step::Next(State::Opening {
                open: Box::new((open, Instant::now())),
                head: Some(head),
            });
        }
        self.judged(Response::from_parts(head, ResponseBody::new(body)), outcome)
    }

    /// The attempt failed without a response: fatal, given up on, or retried.
    fn failed<F, B, RB: Body>(&mut self, error: BoxError) -> Step<F, B, RB, C> {
        let outcome = self.config.classifier.classify_error(&*error);
        self.failed_as(outcome, error)
    }

    /// The attempt failed without a response, with `outcome`.
    fn failed_as<F, B, RB: Body>(
        &mut self,
        outcome: Outcome,
        error: BoxError,
    ) -> Step<F, B, RB, C> {
        self.timed();
        self.record(&outcome, &HeaderMap::new(), None);
        if self.racing() {
            return Step::Withdrawn;
        }
        if !outcome.is_retryable() {
            return self.end(Err(Error::failed(outcome, error, self.sent)));
        }
        match self.decide(&outcome) {
            Decision::Retry { delay, .. } => Step::Next(wait(delay)),
            Decision::NotReplayable => self.end(Err(Error::failed(outcome, error, self.sent))),
            Decision::GiveUp(cause) => {
                self.end(Err(Error::given_up(outcome, error, self.sent, cause)))
            }
        }
    }

    /// An event stream was read up to its first content event (handed back, the breaker told
    /// how it ends when it ends), or failed before it (judged like a failed response).
    fn opened<F, B, RB>(
        &mut self,
        head: response::Parts,
        opening: Opening<RB>,
        since: Instant,
        continuer: (bool, impl FnOnce() -> Option<Continuer>),
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
                return self.judged(response, outcome);
            }
        };
        if let Some(clocks) = self.clocks()
            && stream.events() > 0
        {
            clocks.record_first_content(since.elapsed());
            if let Some(took) = self.attempt.in_flight() {
                clocks.record_to_first_content(true, took);
            }
        }
        let body = self.guard_stream(stream, continuer);
        let response = Response::from_parts(head, body);
        self.judged(response, Outcome::success())
    }

    /// A response was classified: hand it back, or retry.
    fn judged<F, B, RB: Body>(
        &mut self,
        mut response: Response<ResponseBody<RB>>,
        outcome: Outcome,
    ) -> Step<F, B, RB, C> {
        let usage = self.record(&outcome, response.headers(), Some(response.status()));
        if outcome.is_success() {
            // A success ends the request: how long it took matters only before a retry.
            self.config.policy.succeeded();
            // A stream's usage is recorded when it ends, by its guard.
            let recorder = (self.watch.counts_usage() && !is_event_stream(response.headers()))
                .then(|| self.watch.usage_recorder())
                .flatten();
            if usage.is_some() || recorder.is_some() {
                response = settle_on_usage(response, usage, recorder);
            }
            return self.end(Ok(response));
        }
        self.timed();
        if self.racing() {
            return Step::Withdrawn;
        }
        if !outcome.is_retryable() {
            // Fatal: no retry helps, here or above. Marked when this layer could have retried.
            if self.origin.is_replay() && self.config.policy.may_retry() {
                self.mark_final(&mut response);
            }
        } else {
            match self.decide(&outcome) {
                // The retry answers instead: this response is dropped.
                Decision::Retry { delay, .. } => return Step::Next(wait(delay)),
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
        self.end(Ok(response))
    }
}

/// The endings that are not an answer: a cut, the deadline, a service that failed to get ready.
impl<C: Classify, Bk: Backoff> Ledger<C, Bk> {
    /// Ready when a stall opened the breaker and cut the attempt in flight (waiting for its
    /// answer, or for the error body it is read to be classified by): then the request ends as
    /// if refused.
    fn poll_cut<F, B, RB: Body>(&mut self, cx: &mut Context<'_>) -> Poll<Step<F, B, RB, C>> {
        let open: BreakerOpen = ready!(self.attempt.permits.poll_cut(cx));
        (self.watch).unanswered(&mut self.attempt.watch, Reason::BreakerOpen);
        let rejected = Rejected::Open(open);
        let output = match (self.origin.head(), &self.config.fallback) {
            (Some(head), Some(_)) => self.breaker_answer(head, rejected),
            _ => Err(Error::refused(
                rejected.outcome(),
                rejected.into_error(),
                self.sent,
            )),
        };
        Poll::Ready(self.end(output))
    }

    /// The attempt's head clock fired while it waited for its answer: if the request can go on
    /// (see `Ledger::may_go_on`), the attempt is abandoned (dropped with the state this step
    /// replaces), a timeout for its guards, and the request goes on as after any failure of its
    /// attempt; if not, it keeps the attempt, which may still answer within the deadline
    /// (`None`: wait on, with no clock).
    fn clock_fired<F, B, RB: Body>(&mut self) -> Option<Step<F, B, RB, C>> {
        if !self.may_go_on() {
            self.attempt.head_by = Due::Never;
            return None;
        }
        let after = self.attempt.in_flight().unwrap_or_default();
        let error = Box::new(AttemptTimedOut::new(after));
        Some(self.failed_as(crate::clock::attempt_timeout(), error))
    }

    /// The deadline passed while the request waited: an attempt in flight timed out, which the
    /// breaker counts as a health failure.
    fn expired<RB: Body>(&mut self) -> Output<RB> {
        let aside = self.aside.as_deref_mut();
        for attempt in std::iter::once(&mut self.attempt).chain(aside) {
            attempt.permits.timed_out();
            (self.watch).unanswered(&mut attempt.watch, Reason::DeadlineExceeded);
        }
        let mut output = Err(Error::deadline_exceeded(self.sent));
        self.finish(&mut output);
        output
    }
}

/// Waits `delay` before the retry; a zero delay skips the timer (tokio rounds every sleep up
/// to its next 1 ms tick, so `sleep(0)` would still wait).
fn wait<F, B, RB: Body, C>(delay: Duration) -> State<F, B, RB, C> {
    if delay.is_zero() {
        State::Ready
    } else {
        State::Backoff {
            sleep: tokio::time::sleep(delay),
        }
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
            State::Ready => "waiting for the service",
            State::Reserving { .. } => "asking the rate limit's fleet",
            State::Pacing { .. } => "waiting for the rate limit",
            State::Calling { .. } => "calling",
            State::Classifying { .. } => "classifying the answer",
            State::Opening { .. } => "reading a stream up to its first content",
            State::Refused { .. } => "refused",
            State::Hedged => "waiting for the hedge",
            State::Withdrawn => "a hedge not sent",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempts", &self.ledger.sent)
            .field("hedged", &self.hedge.is_some())
            .field("deadline", &self.ledger.deadline)
            .finish()
    }
}
