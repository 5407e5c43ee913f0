//! [`ResponseFuture`]: one request through the failover, as a state machine.
//!
//! ```text
//! Buffering ──▶ Ready ──▶ Calling ──▶ (output)
//!   (body)        ▲          │ the backend failed, or refused, or an error has a cure
//!                 └──────────┘ the next backend, within the deadline and the budget
//! ```
//!
//! Each hop is one backend's engine, which retries on that backend as its policy allows; what
//! happens between hops is decided by [`Hops`]. The engine enforces the deadline once it has
//! the request; while a backend's engine is not ready to take it, the failover does.
//!
//! With hedging on, a hop that has produced no content after the hedge's delay gets a second
//! hop beside it, on the next healthy backend (the same one when there is no other): a hedge,
//! whose engine future waits in its own lane. The first of the two to answer is handed back and
//! the other is cancelled as a loser ([`stormguard_retry::ResponseFuture::lose`]); a hop that
//! fails while the other is in flight is withdrawn, and the other goes on alone (see `hedge`).

use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_budget::{RetryBudget, Withdrawal};
use stormguard_classify::body::{PartialBody, Prefix, ResponseBody, Tail};
use stormguard_classify::{BoxError, Classify, Outcome, Reason};
use stormguard_deadline::{Deadline, DeadlineExceeded};
use stormguard_jitter::Backoff;
use stormguard_rate_limit::RateLimit;
use stormguard_retry::{ClientService, Error, FailedAnswer, GiveUpCause, ReplayBody};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::balance::{Candidate, InFlight, rendezvous, two_choices};
use crate::layer::Shared;
use crate::marks::{Cure, NoBackend, mark};

type Output<RB> = Result<Response<ResponseBody<RB>>, Error>;

/// Most backends a failover tells apart (the hops of one request are kept as bits).
pub(crate) const MAX_BACKENDS: usize = 64;

pin_project! {
    /// The response future of [`FailoverService`](crate::FailoverService).
    ///
    /// Dropping it cancels the request wherever it is: the engine of the backend in flight
    /// counts its attempt as not accepted, and a failover the budget granted but that was never
    /// sent is given back.
    #[project = FutureProj]
    pub struct ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        state: State<S, B, RB, C, Bk>,
        hops: Hops<S, B, RB, C, Bk>,
        // The hedge's hop while one is out: a second backend's engine with the request, boxed
        // so that a request never hedged carries a pointer and no second engine future.
        hedge: Option<Pin<Box<stormguard_retry::ResponseFuture<S, B, RB, C, Bk>>>>,
        // When the hop in flight is hedged, made the first time one is due.
        #[pin]
        hedge_timer: Option<Sleep>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        // Reading the request body, to send it to each backend it reaches.
        Buffering { read: Prefix<B> },
        // Waiting for a backend's engine to be ready, until the deadline (its timer made the
        // first time the engine is not ready at once).
        Ready {
            client: ClientService<S, C, Bk>,
            request: Option<Request<B>>,
            #[pin]
            expiry: Option<Sleep>,
        },
        // A backend's engine has the request.
        Calling { #[pin] future: stormguard_retry::ResponseFuture<S, B, RB, C, Bk> },
        // The hop failed while its hedge was in flight: the hedge's hop is the request's now.
        Hedged,
        Done,
    }
}

/// What comes after a hop: the next, or the end. Made and moved once per step (the engine's
/// future, in `Next`, is as large as it is wherever it goes).
#[allow(clippy::large_enum_variant)]
enum Step<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    Next(State<S, B, RB, C, Bk>),
    Finish(Output<RB>),
    /// The hop failed while the other hop of a hedge was in flight: the other goes on.
    Withdrawn,
}

/// How a hop hands the request to a backend's engine: continuing its streams or not (see
/// [`FailoverService::call_without_continuation`](crate::FailoverService::call_without_continuation)).
pub(crate) type Call<S, B, RB, C, Bk> = fn(
    &mut ClientService<S, C, Bk>,
    Request<B>,
    &Arc<Shared<S, C, Bk>>,
    usize,
) -> stormguard_retry::ResponseFuture<S, B, RB, C, Bk>;

/// In the extensions of a continuation the failover sends: the backend whose stream it
/// continues, which takes it only when no other healthy backend that takes a prefill can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ContinuesFrom(pub(crate) usize);

/// The bookkeeping of one request across its backends.
pub(crate) struct Hops<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    pub(crate) shared: Arc<Shared<S, C, Bk>>,
    /// How each hop is handed to its backend's engine.
    call: Call<S, B, RB, C, Bk>,
    /// The retry budget every backend shares (the layer's).
    pub(crate) budget: RetryBudget,
    /// The request as it came (with its deadline), rebuilt for each backend.
    pub(crate) head: Parts,
    /// The buffered body; `None` while it is read, or for a body sent once as a stream.
    pub(crate) body: Option<Bytes>,
    pub(crate) deadline: Option<Deadline>,
    /// Backends tried, as bits.
    pub(crate) tried: u64,
    /// For a continuation: the backend whose stream it continues.
    pub(crate) continues_from: Option<usize>,
    /// Whether any backend was sent an attempt: a failover after that is a retry, drawn from
    /// the budget; before it, nothing was sent and moving on is free.
    sent: bool,
    /// The hop the path steps.
    pub(crate) hop: Hop,
    /// The other hop while a hedge is out, set aside while the path steps the one in
    /// [`hop`](Self::hop): the hedge's while it steps the request's own, the other way round
    /// while it steps the hedge's.
    pub(crate) aside: Option<Hop>,
    /// Hedges sent.
    pub(crate) hedges: u32,
    /// When the hop the path steps is hedged, if it is and has not been yet.
    pub(crate) hedge_by: Option<Instant>,
}

/// One backend's turn with the request.
#[derive(Debug)]
pub(crate) struct Hop {
    /// The backend.
    pub(crate) backend: usize,
    /// When it started.
    pub(crate) started: Instant,
    /// The budget's grant for it (a move after an attempt was sent, or a hedge), given back if
    /// it sends nothing.
    pub(crate) withdrawal: Option<Withdrawal>,
    /// Whether it was handed to its engine (which may have sent it).
    pub(crate) calling: bool,
    /// It is a hedge.
    pub(crate) hedge: bool,
    /// Counted in flight by its backend's balancer while with its engine.
    pub(crate) in_flight: Option<InFlight>,
}

impl Hop {
    pub(crate) fn new(backend: usize, withdrawal: Option<Withdrawal>) -> Self {
        Self {
            backend,
            started: Instant::now(),
            withdrawal,
            calling: false,
            hedge: false,
            in_flight: None,
        }
    }
}

impl<S, B, RB, C, Bk> ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    pub(crate) fn new(hops: Hops<S, B, RB, C, Bk>, read: Prefix<B>) -> Self {
        Self {
            state: State::Buffering { read },
            hops,
            hedge: None,
            hedge_timer: None,
        }
    }
}

impl<S, B, RB, C, Bk> Future for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    type Output = Output<RB>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // The request's hop, then its hedge's if one is out: each step taken, until both
            // wait.
            if let Poll::Ready(step) = this.poll_lead(cx) {
                match this.lead_step(step) {
                    ControlFlow::Break(output) => return Poll::Ready(output),
                    ControlFlow::Continue(()) => continue,
                }
            }
            if let Some(step) = this.poll_hedge(cx) {
                match this.hedge_step(step) {
                    ControlFlow::Break(output) => return Poll::Ready(output),
                    ControlFlow::Continue(()) => continue,
                }
            }
            // Waiting: a hop with its engine is hedged once its delay has passed.
            ready!(this.poll_hedge_timer(cx));
            this.start_hedge(cx);
        }
    }
}

impl<S, B, RB, C, Bk> FutureProj<'_, S, B, RB, C, Bk>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    /// Polls what the request's own hop waits for, and the step it leads to.
    fn poll_lead(&mut self, cx: &mut Context<'_>) -> Poll<Step<S, B, RB, C, Bk>> {
        let hops = &mut *self.hops;
        Poll::Ready(match self.state.as_mut().project() {
            StateProj::Buffering { read } => {
                let (bytes, tail, rest) = ready!(Pin::new(read).poll(cx));
                hops.buffered(bytes, tail, rest)
            }
            StateProj::Ready {
                client,
                request,
                expiry,
            } => {
                let ready = match client.poll_engine_ready(cx) {
                    Poll::Ready(ready) => ready,
                    Poll::Pending => {
                        ready!(hops.poll_expiry(expiry, cx));
                        Err(out_of_time())
                    }
                };
                match (ready, request.take()) {
                    (Ok(()), Some(request)) => {
                        hops.hop.calling = true;
                        hops.hop.in_flight =
                            Some(hops.shared.routes[hops.hop.backend].load.start());
                        hops.hedge_by = hops.hedge_due();
                        let index = hops.hop.backend;
                        let future = (hops.call)(client, request, &hops.shared, index);
                        Step::Next(State::Calling { future })
                    }
                    (Err(error), _) => hops.after(Err(error)),
                    (Ok(()), None) => polled_again(),
                }
            }
            StateProj::Calling { future } => {
                let result = ready!(future.poll(cx));
                hops.after(result)
            }
            // The hedge's hop answers for the request.
            StateProj::Hedged => return Poll::Pending,
            StateProj::Done => polled_again(),
        })
    }

    /// Takes the step the request's own hop led to.
    fn lead_step(&mut self, step: Step<S, B, RB, C, Bk>) -> ControlFlow<Output<RB>> {
        match step {
            Step::Next(state) => self.state.set(state),
            Step::Finish(output) => {
                if let Some(mut hedge) = self.hedge.take() {
                    hedge.as_mut().lose();
                    self.hops.hedge_lost();
                }
                self.state.set(State::Done);
                return ControlFlow::Break(output);
            }
            Step::Withdrawn => {
                self.hops.withdraw();
                self.state.set(State::Hedged);
            }
        }
        ControlFlow::Continue(())
    }

    /// Polls the hedge's hop, if one is out: the step its answer leads to, taken with its hop
    /// in the place of the one the path steps (the request's own set aside, if it is in
    /// flight).
    fn poll_hedge(&mut self, cx: &mut Context<'_>) -> Option<Step<S, B, RB, C, Bk>> {
        let hedge = self.hedge.as_mut()?;
        let Poll::Ready(result) = hedge.as_mut().poll(cx) else {
            return None;
        };
        *self.hedge = None;
        self.hops.switch();
        Some(self.hops.after(result))
    }

    /// Takes the step the hedge's hop led to.
    fn hedge_step(&mut self, step: Step<S, B, RB, C, Bk>) -> ControlFlow<Output<RB>> {
        match step {
            Step::Finish(output) => {
                if let StateProj::Calling { future } = self.state.as_mut().project() {
                    future.lose();
                }
                self.hops.hedge_won();
                self.state.set(State::Done);
                ControlFlow::Break(output)
            }
            Step::Withdrawn => {
                self.hops.withdraw();
                ControlFlow::Continue(())
            }
            // The hedge's hop was the request's only one, and it moves on.
            Step::Next(state) => {
                self.hops.switch();
                self.state.set(state);
                ControlFlow::Continue(())
            }
        }
    }

    /// Ready when the hop in flight is due to be hedged; never when it is not.
    fn poll_hedge_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.hops.hedge_by {
            Some(at) => stormguard_deadline::poll_until(self.hedge_timer.as_mut(), at, cx),
            None => Poll::Pending,
        }
    }

    /// The hop in flight is due to be hedged: a hedge goes to the next healthy backend (the same
    /// one when there is no other), if the policy lets it and that backend's engine is ready.
    fn start_hedge(&mut self, cx: &mut Context<'_>) {
        self.hops.hedge_by = None;
        let calling = matches!(self.state.as_ref().get_ref(), State::Calling { .. });
        if !calling || self.hedge.is_some() {
            return;
        }
        let Some((index, withdrawal)) = self.hops.hedge() else {
            return;
        };
        let mut client = self.hops.shared.routes[index].client.clone();
        if !matches!(client.poll_engine_ready(cx), Poll::Ready(Ok(()))) {
            self.hops.budget.refund(withdrawal);
            return;
        }
        let request = self.hops.request_for(index);
        self.hops.hedge_sent(index, withdrawal);
        let future = (self.hops.call)(&mut client, request, &self.hops.shared, index);
        *self.hedge = Some(Box::pin(future));
    }
}

/// A future may panic when polled after it completed; this one says so.
fn polled_again<T>() -> T {
    panic!("stormguard's failover ResponseFuture polled after it completed")
}

impl<S, B, RB, C, Bk> Hops<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    pub(crate) fn new(
        shared: Arc<Shared<S, C, Bk>>,
        head: Parts,
        call: Call<S, B, RB, C, Bk>,
    ) -> Self {
        let continues_from = head.extensions.get::<ContinuesFrom>().map(|from| from.0);
        Self {
            call,
            budget: shared.layer.budget().clone(),
            shared,
            head,
            body: None,
            deadline: None,
            tried: 0,
            continues_from,
            sent: false,
            hop: Hop::new(0, None),
            aside: None,
            hedges: 0,
            hedge_by: None,
        }
    }

    /// The body was read: one deadline for every backend, then the first hop.
    fn buffered(&mut self, bytes: Bytes, tail: Tail<B::Error>, rest: B) -> Step<S, B, RB, C, Bk>
    where
        S: Service<Request<B>> + Clone,
        B: ReplayBody,
        B::Error: Into<BoxError>,
        RB: Body,
    {
        let timeout = self.shared.layer.timeout_for(&self.head, Some(&bytes));
        if let Some(timeout) = timeout {
            Deadline::after(timeout).apply_to_extensions(&mut self.head.extensions);
        }
        self.deadline = Deadline::from_extensions(&self.head.extensions);
        let Some(first) = self.next_healthy() else {
            return self.end(None);
        };
        match tail {
            Tail::Ended => {
                self.body = Some(bytes);
                self.hop(first, None)
            }
            Tail::Failed(error) => {
                let outcome = Outcome::fatal(Reason::BadRequest).with_accepted(false);
                Step::Finish(Err(Error::refused(outcome, error.into(), 0)))
            }
            // Trailers, or a body longer than the replay cap: sent once, to the first backend.
            tail => {
                let body = B::from_partial(PartialBody::new(bytes, tail, rest));
                self.tried |= 1 << first;
                self.hop = Hop::new(first, None);
                let route = &self.shared.routes[first];
                let mut head = self.head.clone();
                route.backend.adapter().apply_head(&mut head);
                Step::Next(State::Ready {
                    client: route.client.clone(),
                    request: Some(Request::from_parts(head, body)),
                    expiry: None,
                })
            }
        }
    }

    /// Sends the request to backend `index`, rewritten for it (`withdrawal`: the budget's grant
    /// for the move).
    fn hop(&mut self, index: usize, withdrawal: Option<Withdrawal>) -> Step<S, B, RB, C, Bk>
    where
        S: Service<Request<B>> + Clone,
        B: ReplayBody,
        RB: Body,
    {
        self.tried |= 1 << index;
        self.hop = Hop::new(index, withdrawal);
        Step::Next(State::Ready {
            client: self.shared.routes[index].client.clone(),
            request: Some(self.request_for(index)),
            expiry: None,
        })
    }

    /// The request, rewritten for backend `index`.
    pub(crate) fn request_for(&self, index: usize) -> Request<B>
    where
        B: ReplayBody,
    {
        let route = &self.shared.routes[index];
        let mut head = self.head.clone();
        let body = self.body.as_ref().map_or_else(Bytes::new, |body| {
            route.backend.adapter().apply(&mut head, body)
        });
        Request::from_parts(head, B::from_bytes(body))
    }

    /// A hop ended: hand its answer back, or go on to another backend; withdrawn, if it failed
    /// while the other hop of a hedge is in flight.
    fn after(&mut self, result: Output<RB>) -> Step<S, B, RB, C, Bk>
    where
        S: Service<Request<B>> + Clone,
        B: ReplayBody,
        RB: Body,
    {
        let took = self.hop.started.elapsed();
        self.hedge_by = None;
        self.hop.in_flight = None;
        let (outcome, attempts) = judged(&result);
        // The balancer learns how long the backend took to answer, or to time out.
        if attempts > 0 && (outcome.is_success() || outcome.reason() == Reason::Timeout) {
            self.shared.routes[self.hop.backend].load.observe(took);
        }
        self.settle_withdrawal(attempts);
        if !outcome.is_success() && self.racing() {
            return Step::Withdrawn;
        }
        if !outcome.is_success() {
            self.share_cooldown();
        }
        let route = &self.shared.routes[self.hop.backend];
        let result = result.map(|mut response| {
            mark(
                &mut response,
                route.backend.shared_name(),
                route.backend.mark(),
            );
            response
        });
        if outcome.is_success() {
            return Step::Finish(result);
        }
        // The engine's own error for the passed deadline (cut in flight, or out of time before
        // its next attempt): no backend can answer in time any more, whoever had the request.
        if result.is_err() && outcome.reason() == Reason::DeadlineExceeded {
            return self.end(Some(result));
        }
        // A body sent once as a stream is gone: no other backend can be sent it.
        if self.body.is_none() {
            return self.end(Some(result));
        }
        let next = match Cure::of(&outcome) {
            Some(cure) => self.cure(cure),
            None if self.leaves(&result, &outcome) => self.next_healthy(),
            None => return Step::Finish(result),
        };
        let Some(next) = next else {
            return self.end(Some(result));
        };
        if !self.fits(took, attempts) {
            return self.end(Some(result));
        }
        let withdrawal = match self.sent {
            true => match self.budget.try_withdraw() {
                Some(withdrawal) => Some(withdrawal),
                None => return self.end(Some(result)),
            },
            false => None,
        };
        let to = self.shared.routes[next].backend.name();
        moved(route.backend.shared_name(), to, outcome.reason());
        self.hop(next, withdrawal)
    }

    /// The budget's grant for the hop that ended: given back if its engine sent nothing, spent
    /// if it sent an attempt (a move after that is a retry).
    fn settle_withdrawal(&mut self, attempts: u32) {
        if attempts == 0 {
            if let Some(withdrawal) = self.hop.withdrawal.take() {
                self.budget.refund(withdrawal);
            }
        } else {
            self.hop.withdrawal = None;
            self.sent = true;
        }
    }

    /// Whether the request leaves the backend that failed it with `outcome`, for the next: the
    /// backend refused it (its breaker, throttle, bulkhead or rate limit, before or after an
    /// attempt was sent), keeps answering 429, handed it on (an attempt's clock fired), rejects
    /// the prefill of a continuation (learned: not asked again), or failed and is now left
    /// (its breaker opened: failures in a row); not one that failed once.
    fn leaves(&self, result: &Output<RB>, outcome: &Outcome) -> bool {
        let route = &self.shared.routes[self.hop.backend];
        let refused = is_local_refusal(outcome.reason());
        let failed = !refused && failed_on_backend(result, outcome);
        let rejects_prefill =
            self.continues_from.is_some() && outcome.reason() == Reason::BadRequest;
        if rejects_prefill {
            route.client.reject_prefill();
        }
        refused
            || keeps_answering_429(result)
            || gave_up(result) == Some(GiveUpCause::HandedOn)
            || rejects_prefill
            || failed && !route.backend.is_healthy()
    }

    /// The backend configured for `cure`, if it was not tried yet.
    fn cure(&self, cure: Cure) -> Option<usize> {
        let (_, index) = self.shared.cures.iter().find(|(known, _)| *known == cure)?;
        (self.tried & (1 << index) == 0).then_some(*index)
    }

    /// The next backend to take the request: in the first rank with a healthy backend not
    /// tried yet, the one the balancer picks among those (see `balance`). For a continuation,
    /// one that takes an assistant prefill, and the backend whose stream it continues only when
    /// no other can.
    pub(crate) fn next_healthy(&self) -> Option<usize> {
        let continuation = self.continues_from.is_some();
        let takes = |index: usize| {
            let route = &self.shared.routes[index];
            index < MAX_BACKENDS
                && self.tried & (1 << index) == 0
                && route.backend.is_healthy()
                && !(continuation && route.client.rejects_prefill())
                && !self.cooling(index)
        };
        self.choose(|index| Some(index) != self.continues_from && takes(index))
            .or_else(|| self.continues_from.filter(|from| takes(*from)))
    }

    /// The backend of the first rank that has one that `may` take the request: the only one,
    /// or the balancer's pick (the sticky key's backend, else the cheaper of two drawn).
    fn choose(&self, may: impl Fn(usize) -> bool) -> Option<usize> {
        let shared = &*self.shared;
        let routes = &shared.routes;
        for rank in &shared.ranks {
            let mut open = [Candidate::default(); MAX_BACKENDS];
            let mut count = 0;
            for index in rank.clone().filter(|index| may(*index)) {
                let weight = routes[index].backend.weight();
                open[count] = Candidate { index, weight };
                count += 1;
            }
            let open = &open[..count];
            match open {
                [] => continue,
                // A rank of one (an ordered failover's every rank) has nothing to weigh.
                [only] => return Some(only.index),
                _ => {}
            }
            let name = |index: usize| routes[index].backend.name();
            if let Some(key) = shared.sticky.as_ref().and_then(|key| key(&self.head)) {
                return rendezvous(key, open, name);
            }
            let cost = |index: usize| {
                let backend = &routes[index].backend;
                let headroom = backend.rate_limit().map_or(1.0, RateLimit::headroom);
                routes[index].load.cost(backend.weight(), headroom)
            };
            return two_choices(open, cost, &shared.random);
        }
        None
    }

    /// Ready once the request's deadline has passed; never without one.
    fn poll_expiry(&self, expiry: Pin<&mut Option<Sleep>>, cx: &mut Context<'_>) -> Poll<()> {
        match self.deadline {
            Some(deadline) => stormguard_deadline::poll_until(expiry, deadline.instant(), cx),
            None => Poll::Pending,
        }
    }

    /// Whether another hop fits in the time left: as long as an attempt of the last one took.
    fn fits(&self, took: Duration, attempts: u32) -> bool {
        let Some(deadline) = self.deadline else {
            return true;
        };
        let attempt = took / attempts.max(1);
        Instant::now()
            .checked_add(attempt)
            .is_some_and(|finish| finish < deadline.instant())
    }

    /// No other backend: the last one's answer (`None`: no backend could be tried), or the
    /// degraded answer instead of a failure no backend could avoid.
    fn end(&mut self, last: Option<Output<RB>>) -> Step<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
    {
        let why = match &last {
            Some(Ok(response)) => response
                .extensions()
                .get::<FailedAnswer>()
                .map_or_else(Outcome::success, FailedAnswer::outcome),
            Some(Err(error)) => error.outcome(),
            None => no_backend(),
        };
        // A request at fault (bad, unauthorized) is answered as it is, degraded or not.
        let degradable = !matches!(
            why.reason(),
            Reason::BadRequest
                | Reason::Unauthorized
                | Reason::Forbidden
                | Reason::NotFound
                | Reason::PayloadTooLarge
                | Reason::Unprocessable
                | Reason::Conflict
                | Reason::ClientError
        );
        if let Some(degraded) = &self.shared.degraded
            && degradable
            && !why.is_success()
        {
            if self.tried != 0 {
                let from = self.shared.routes[self.hop.backend].backend.shared_name();
                moved(from, DEGRADED, why.reason());
            }
            return Step::Finish(Ok(degraded.answer(&self.head, &why)));
        }
        match last {
            Some(Err(error)) if !self.sent && is_local_refusal(error.outcome().reason()) => {
                Step::Finish(Err(self.no_backend_error()))
            }
            Some(last) => Step::Finish(last),
            None => Step::Finish(Err(self.no_backend_error())),
        }
    }

    fn no_backend_error(&self) -> Error {
        let tried = self.tried.count_ones() as usize;
        Error::refused(no_backend(), Box::new(NoBackend { tried }), 0)
    }
}

impl<S, B, RB, C, Bk> Drop for Hops<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn drop(&mut self) {
        // A move or a hedge granted and never handed to its backend's engine goes back; one
        // handed over may have been sent, and stays spent.
        for hop in std::iter::once(&mut self.hop).chain(&mut self.aside) {
            if let Some(withdrawal) = hop.withdrawal.take()
                && !hop.calling
            {
                self.budget.refund(withdrawal);
            }
        }
    }
}

impl<S, B, RB, C, Bk> fmt::Debug for Hops<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hops")
            .field("tried", &self.tried.count_ones())
            .field("hop", &self.hop)
            .field("hedged", &self.aside.is_some())
            .finish()
    }
}

/// The `to` of a move to the degraded answer.
const DEGRADED: &str = "degraded";

/// A request moves from backend `from` to `to` for `reason`: logged at DEBUG (the engines log
/// the failures themselves) and counted (feature `metrics`).
fn moved(from: &Arc<str>, to: &str, reason: Reason) {
    tracing::debug!(from = &**from, to, reason = reason.as_str(), "failing over");
    #[cfg(feature = "metrics")]
    metrics::counter!(
        stormguard_retry::metrics::FAILOVERS,
        "from" => metrics::SharedString::from(Arc::clone(from)),
        "to" => to.to_owned(),
        "reason" => reason.as_str()
    )
    .increment(1);
}

/// The deadline passed before a backend's engine was ready to take the request: the error the
/// engine gives a request out of time before its first attempt, with nothing sent.
fn out_of_time() -> Error {
    let outcome = Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false);
    Error::refused(outcome, Box::new(DeadlineExceeded::new()), 0)
}

/// The outcome of a request no backend could take: 503, retry in a second (the backends'
/// first open wait).
fn no_backend() -> Outcome {
    Outcome::fatal(Reason::NoBackend)
        .with_accepted(false)
        .with_retry_after(Some(Duration::from_secs(1)))
}

/// Why the backend's engine gave up on the request, if it did.
fn gave_up<RB: Body>(result: &Output<RB>) -> Option<GiveUpCause> {
    match result {
        Ok(response) => response.extensions().get::<GiveUpCause>().copied(),
        Err(error) => error.gave_up(),
    }
}

/// Whether a request was refused on this side, never reaching the backend.
fn is_local_refusal(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::BreakerOpen | Reason::BulkheadFull | Reason::Throttled | Reason::RateLimitedLocally
    )
}

/// How the engine judged a hop, and the attempts it sent.
fn judged<RB: Body>(result: &Output<RB>) -> (Outcome, u32) {
    match result {
        // A success carries no verdict: the engine marks only what it hands back failed.
        Ok(response) => match response.extensions().get::<FailedAnswer>() {
            Some(failed) => (failed.outcome(), failed.attempts()),
            None => (Outcome::success(), 1),
        },
        Err(error) => (error.outcome(), error.attempts()),
    }
}

/// Whether the backend keeps answering 429 to this request: 429 on every attempt, or a 429
/// whose wait is beyond what the request can wait (a Retry-After above the hint policy's
/// maximum, or a wait the deadline cannot fit), so that the engine gave up on it. Such a backend
/// is left for the next at once: its breaker never opens on 429s (no health failure) and its
/// throttle drops nothing at a few requests a second, so nothing else would ever leave it. A
/// wait of its own rate limit beyond its maximum is a local refusal, left as every refusal is.
fn keeps_answering_429<RB: Body>(result: &Output<RB>) -> bool {
    let (outcome, throughout) = match result {
        Ok(response) => {
            let Some(failed) = response.extensions().get::<FailedAnswer>() else {
                return false;
            };
            (failed.outcome(), failed.rate_limited_throughout())
        }
        Err(error) => (error.outcome(), error.rate_limited_throughout()),
    };
    let waits_too_long = matches!(
        gave_up(result),
        Some(GiveUpCause::HintTooLong | GiveUpCause::Deadline)
    );
    outcome.reason() == Reason::RateLimited && (throughout || waits_too_long)
}

/// Whether a hop's failure was the backend's: a retryable answer the engine gave up on, or an
/// error it gave up on or could not retry.
fn failed_on_backend<RB: Body>(result: &Output<RB>, outcome: &Outcome) -> bool {
    match result {
        Ok(_) => outcome.is_retryable() || !outcome.is_accepted(),
        Err(error) => {
            error.gave_up().is_some()
                || outcome.is_retryable()
                || matches!(
                    outcome.reason(),
                    Reason::BreakerOpen | Reason::Unavailable | Reason::Transport | Reason::Timeout
                )
        }
    }
}
