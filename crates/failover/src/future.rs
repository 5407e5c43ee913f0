//! [`ResponseFuture`]: one request through the failover, as a path of states.
//!
//! ```text
//! Buffering ──▶ Ready ──▶ Calling ──▶ (output)
//!   (body)        ▲          │ the backend failed, or refused, or an error has a cure
//!                 └──────────┘ the next backend, within the deadline and the budget
//! ```
//!
//! Each hop is one backend's engine, which retries on that backend as its policy allows, handed
//! the request with a [`Route`](stormguard_retry::Route) and answering with a
//! [`Report`](stormguard_retry::Report); what happens between hops is decided by [`Ledger`]. The
//! engine enforces the deadline once it has the request; while a backend's engine is not ready to
//! take it, the failover does.
//!
//! A hop moves along a lane ([`HopLane`]) of the engine's [`Race`]: with hedging on, a hop that
//! has produced no content after the hedge's delay gets a second hop beside it, on the next
//! healthy backend (the same one when there is no other), and the race's rules are the engine's
//! (the first to answer is handed back, the other loses; a hop that fails while the other is in
//! flight leaves the race).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use stormguard_budget::Ticket;
use stormguard_classify::body::Prefix;
use stormguard_classify::polled_after_completion;
use stormguard_classify::{BoxError, Classify, Outcome, Reason};
use stormguard_deadline::DeadlineExceeded;
use stormguard_jitter::Backoff;
use stormguard_retry::race::{Lane, Lap, Race, Waiting};
use stormguard_retry::{ClientService, Error, NoHedge, NotContinuing, ReplayBody, Report, Routed};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::ledger::{Hop, Ledger, MakeContinuer, Next, Output};
use crate::shared::Shared;

pin_project! {
    /// The response future of [`FailoverService`](crate::FailoverService).
    ///
    /// Dropping it cancels the request wherever it is: the engine of the backend in flight
    /// counts its attempt as not accepted, and a ticket the budget granted for a move that was
    /// never sent is given back.
    pub struct ResponseFuture<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        race: Race<HopLane<S, B, RB, C, Bk>>,
        // When the hop in flight is hedged, made the first time one is due.
        #[pin]
        hedge_timer: Option<Sleep>,
        ledger: Ledger<S, C, Bk>,
        body: PhantomData<fn(B)>,
    }
}

pin_project! {
    /// One hop's path: what it waits for, and the hop.
    pub(crate) struct HopLane<S, B, RB, C, Bk>
    where
        S: Service<Request<B>>,
        RB: Body,
        Bk: Backoff,
    {
        #[pin]
        state: State<S, B, RB, C, Bk>,
        hop: Hop,
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
        // first time the engine is not ready at once), with the ticket that pays for the move.
        Ready {
            client: ClientService<S, C, Bk, NotContinuing>,
            request: Option<Request<B>>,
            ticket: Option<Ticket>,
            #[pin]
            expiry: Option<Sleep>,
        },
        // A backend's engine has the request.
        Calling { #[pin] turn: Routed<S, B, RB, C, Bk> },
        Done,
    }
}

/// A request's lanes.
type Lanes<S, B, RB, C, Bk> = Race<HopLane<S, B, RB, C, Bk>>;

/// The panic of a failover future polled after it completed.
fn polled_again<T>() -> T {
    polled_after_completion("failover ResponseFuture")
}

impl<S, B, RB, C, Bk> ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    B: ReplayBody,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    /// `request`, routed over `shared`'s backends (`continuer`: who continues the streams its
    /// hops hand back; `continues`: for a continuation, the backend whose stream it continues and
    /// the ticket that pays for it).
    pub(crate) fn new(
        shared: Arc<Shared<S, C, Bk>>,
        request: Request<B>,
        continuer: Option<MakeContinuer<S, C, Bk>>,
        continues: Option<(usize, Ticket)>,
    ) -> Self {
        let (head, body) = request.into_parts();
        let cap = shared.layer.max_replay_body();
        let lane = HopLane {
            state: State::Buffering {
                read: Prefix::new(body, cap),
            },
            hop: Hop::new(0, false),
        };
        Self {
            race: Race::new(lane),
            hedge_timer: None,
            ledger: Ledger::new(shared, head, continuer, continues),
            body: PhantomData,
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
            if let Poll::Ready(output) = this.race.as_mut().poll(this.ledger, cx) {
                return Poll::Ready(output);
            }
            // Waiting: a hop with its engine is hedged once its delay has passed.
            let Some(due) = hedge_clock(this.race.as_mut(), this.ledger) else {
                return Poll::Pending;
            };
            ready!(stormguard_deadline::poll_until(
                this.hedge_timer.as_mut(),
                due,
                cx
            ));
            start_hedge(this.race.as_mut(), this.ledger, cx);
        }
    }
}

/// The hops' side of the race: a backend's engine at a time, the hedge's like the request's own.
impl<S, B, RB, C, Bk> Lane<Ledger<S, C, Bk>> for HopLane<S, B, RB, C, Bk>
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

    fn poll_lap(
        self: Pin<&mut Self>,
        ledger: &mut Ledger<S, C, Bk>,
        racing: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Lap<Output<RB>>> {
        let mut this = self.project();
        let next = match this.state.as_mut().project() {
            StateProj::Buffering { read } => {
                let (bytes, tail, rest) = ready!(Pin::new(read).poll(cx));
                ledger.buffered(bytes, tail, rest)
            }
            StateProj::Ready {
                client,
                request,
                ticket,
                expiry,
            } => {
                let ready = match client.poll_ready(cx) {
                    Poll::Ready(ready) => ready,
                    Poll::Pending => {
                        ready!(poll_expiry(ledger, expiry, cx));
                        Err(out_of_time())
                    }
                };
                match (ready, request.take()) {
                    (Ok(()), Some(request)) => {
                        let hop = &mut *this.hop;
                        hop.in_flight = Some(ledger.shared.engines[hop.backend].load.start());
                        let turn =
                            client.route(request, ledger.route_for(hop.backend, ticket.take()));
                        this.state.set(State::Calling { turn });
                        return Poll::Ready(Lap::Stepped);
                    }
                    (Err(error), _) => {
                        let report = Report::of_error(&error);
                        ledger.after(this.hop, Err(error), &report, racing)
                    }
                    (Ok(()), None) => polled_again(),
                }
            }
            StateProj::Calling { turn } => {
                let (output, report) = ready!(turn.poll(cx));
                ledger.after(this.hop, output, &report, racing)
            }
            StateProj::Done => polled_again(),
        };
        Poll::Ready(match next {
            Next::Hop { to, ticket, once } => {
                *this.hop = Hop::new(to, false);
                let request = Some(ledger.request_for(to, once));
                let client = ledger.shared.engines[to].client.clone();
                this.state.set(State::Ready {
                    client,
                    request,
                    ticket,
                    expiry: None,
                });
                Lap::Stepped
            }
            Next::Finish(output) => {
                this.state.set(State::Done);
                Lap::Finished(output)
            }
            Next::Out => Lap::Out,
        })
    }

    fn in_flight(&self) -> bool {
        matches!(self.state, State::Calling { .. })
    }

    /// The other hop answered first: this one's engine cancels its attempts as losers. The
    /// request's own hop, when its hedge wins, teaches its backend what it waited; a hedge that
    /// loses, nothing.
    fn lose(self: Pin<&mut Self>, ledger: &mut Ledger<S, C, Bk>) {
        let this = self.project();
        if let StateProj::Calling { turn } = this.state.project() {
            turn.lose();
        }
        let hop = &*this.hop;
        if hop.hedge {
            ledger.hedged(hop.backend, "cancelled");
        } else {
            ledger.learn_lost(hop.backend, hop.started);
        }
    }

    fn vacate(self: Pin<&mut Self>) {
        self.project().state.set(State::Done);
    }
}

impl<S, B, RB, C, Bk> Waiting for HopLane<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn waiting_since(self: Pin<&mut Self>) -> Option<Instant> {
        matches!(self.state, State::Calling { .. }).then_some(self.hop.started)
    }
}

/// When the request's path is hedged, if it is with its engine and no hedge is out: worked out
/// once per hop, the first time it waits.
fn hedge_clock<S, B, RB, C, Bk>(
    race: Pin<&mut Lanes<S, B, RB, C, Bk>>,
    ledger: &Ledger<S, C, Bk>,
) -> Option<Instant>
where
    S: Service<Request<B>>,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    let hedging = ledger.shared.hedging.filter(|_| ledger.hedgeable())?;
    let backend = race.lanes().0?.hop.backend;
    let clocks = || {
        let clocks = ledger.shared.engines[backend].backend.clocks();
        (clocks, ledger.shape(backend))
    };
    race.hedge_clock(&hedging, clocks)
}

/// The path's hedge is due: a hedge goes to the next healthy backend (the same one when there is
/// no other), if the race's rules grant it and that backend's engine is ready at once.
fn start_hedge<S, B, RB, C, Bk>(
    mut race: Pin<&mut Lanes<S, B, RB, C, Bk>>,
    ledger: &mut Ledger<S, C, Bk>,
    cx: &mut Context<'_>,
) where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    C: Classify + Clone,
    Bk: Backoff + Clone,
{
    let Some(hedging) = ledger.shared.hedging else {
        return;
    };
    if !race.as_mut().hedge_due() {
        return;
    }
    let Some(hop) = race.lanes().0.map(|path| &path.hop) else {
        return;
    };
    let (from, waited) = (hop.backend, hop.started.elapsed());
    let deadline = ledger.deadline.map(|deadline| deadline.instant());
    let ticket = match race.grant_hedge(&hedging, waited, deadline, ledger.budget()) {
        Ok(ticket) => ticket,
        Err(NoHedge::Budget) => return ledger.hedged(from, "budget"),
        Err(NoHedge::Spent) => return,
    };
    let to = ledger.next_healthy().unwrap_or(from);
    let mut client = ledger.shared.engines[to].client.clone();
    // Not ready at once: the hedge is not sent, its ticket given back.
    if !matches!(client.poll_ready(cx), Poll::Ready(Ok(()))) {
        return;
    }
    let request = ledger.request_for(to, None);
    let mut hop = Hop::new(to, true);
    hop.in_flight = Some(ledger.shared.engines[to].load.start());
    ledger.hedged(to, "sent");
    let turn = client.route(request, ledger.route_for(to, Some(ticket)));
    race.start_hedge(HopLane {
        state: State::Calling { turn },
        hop,
    });
}

/// Ready once the request's deadline has passed; never without one.
fn poll_expiry<S, C, Bk>(
    ledger: &Ledger<S, C, Bk>,
    expiry: Pin<&mut Option<Sleep>>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    match ledger.deadline {
        Some(deadline) => stormguard_deadline::poll_until(expiry, deadline.instant(), cx),
        None => Poll::Pending,
    }
}

/// The deadline passed before a backend's engine was ready to take the request: the error the
/// engine gives a request out of time before its first attempt, with nothing sent.
fn out_of_time() -> Error {
    let outcome = Outcome::fatal(Reason::DeadlineExceeded).with_accepted(false);
    Error::refused(outcome, Box::new(DeadlineExceeded::new()), 0)
}

impl<S, B, RB, C, Bk> fmt::Debug for ResponseFuture<S, B, RB, C, Bk>
where
    S: Service<Request<B>>,
    RB: Body,
    Bk: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, hedge) = self.race.lanes();
        f.debug_struct("ResponseFuture")
            .field("hop", &path.map(|lane| &lane.hop))
            .field("hedged", &hedge.is_some())
            .finish()
    }
}
