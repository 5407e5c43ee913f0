//! [`ResponseFuture`]: one request through the engine.
//!
//! A request is one or two attempts in a [`Race`]: its own lane ([`AttemptLane`], the path of
//! states each attempt moves along), and a hedge's beside it once the request has waited past
//! its hedge's delay for its first content. The race polls the lanes and ends the request with
//! the first to finish, whose output the lanes' books hold ([`Books`]). Between two polls the
//! request waits on one timer, for the earliest of its deadline (which ends every lane), its
//! attempts' head clocks (which the lanes check when polled) and its hedge's.

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
use stormguard_classify::{BoxError, Classify};
use stormguard_jitter::Backoff;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::body::ReplayBody;
use crate::config::Config;
use crate::continuing::Continue;
use crate::error::Error;
use crate::hedge::NoHedge;
use crate::lane::{AttemptLane, Books, polled_again};
use crate::ledger::{Ledger, Output};
use crate::race::Race;
use crate::route::{Report, Route};
use crate::verdict::Verdict;

/// A request's lanes.
type Lanes<F, B, RB, C> = Race<AttemptLane<F, B, RB, C>>;

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
        race: Lanes<S::Future, B, RB, C>,
        // The deadline's timer, made the first time the request has to wait: a call that answers
        // at once never touches the timer wheel. The attempts' clocks and the hedge's share it.
        #[pin]
        timer: Option<Sleep>,
        // What the lanes share (see `Books`).
        service: S,
        ledger: Ledger<C, Bk>,
        continue_by: Option<Continue<S, C, Bk>>,
        body: PhantomData<fn(B)>,
    }
}

/// The lanes' view of what they share, in a projected future, with `$output` for the output.
macro_rules! books {
    ($this:expr, $output:expr) => {
        Books {
            service: $this.service,
            ledger: $this.ledger,
            continue_by: $this.continue_by,
            output: $output,
            body: PhantomData,
        }
    };
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
        let (mut service, mut continue_by) = (service, Some(continue_by));
        let mut ledger = Ledger::new(config, head);
        let mut output = None;
        let mut books = Books {
            service: &mut service,
            ledger: &mut ledger,
            continue_by: &mut continue_by,
            output: &mut output,
            body: PhantomData,
        };
        let lane = books.begin(body, route);
        Self {
            race: Race::new(lane),
            timer: None,
            service,
            ledger,
            continue_by,
            body: PhantomData,
        }
    }

    /// What the request came to, for a router above, once it ended with `output`.
    pub(crate) fn report(&self, output: &Output<RB>) -> Report {
        self.ledger.report(output)
    }

    /// Ends the request as the loser of a router's race: each attempt in flight is cancelled
    /// as a loser (see [`Routed::lose`](crate::Routed::lose)).
    pub(crate) fn lose(self: Pin<&mut Self>) {
        let this = self.project();
        let watch = &this.ledger.watch;
        this.race.for_each(|lane| lane.cancel(watch));
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
        let mut output = None;
        let mut books = books!(this, &mut output);
        loop {
            if this.race.as_mut().poll(&mut books, cx).is_ready() {
                return Poll::Ready(output.take().unwrap_or_else(polled_again));
            }
            // Waiting: the deadline bounds the wait, whatever the request waits for; each
            // attempt waiting for its head has its head clock (its lane checks it when polled),
            // and the request its hedge's.
            let Some(wake) = wake_at(this.race.as_mut(), &mut books) else {
                return Poll::Pending;
            };
            ready!(stormguard_deadline::poll_until(
                this.timer.as_mut(),
                wake,
                cx
            ));
            if let Some(output) = expired(this.race.as_mut(), &mut books) {
                return Poll::Ready(output);
            }
            hedge_if_due(this.race.as_mut(), &mut books);
        }
    }
}

/// When the request is woken if nothing else wakes it: the earliest of the deadline, the head
/// clocks of its attempts waiting for their heads, and its hedge's; never without any.
fn wake_at<S, B, RB, C, Bk>(
    mut race: Pin<&mut Lanes<S::Future, B, RB, C>>,
    books: &mut Books<'_, S, B, RB, C, Bk>,
) -> Option<Instant>
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
    let ledger = &mut books.ledger;
    let mut wake = ledger.deadline.map(|deadline| deadline.instant());
    race.as_mut()
        .for_each(|lane| wake = earliest(wake, lane.head_clock(ledger)));
    let hedging = ledger.config.hedging.filter(|_| ledger.origin.is_replay());
    let hedge = hedging.and_then(|hedging| {
        let config = Arc::clone(&ledger.config);
        let clocks = || (config.clocks.as_ref(), ledger.shape());
        race.hedge_clock(&hedging, clocks)
    });
    earliest(wake, hedge)
}

/// If the path's hedge is due: a hedge goes beside it, when the request has attempts left and
/// the race's rules grant it.
fn hedge_if_due<S, B, RB, C, Bk>(
    mut race: Pin<&mut Lanes<S::Future, B, RB, C>>,
    books: &mut Books<'_, S, B, RB, C, Bk>,
) where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    let ledger = &books.ledger;
    let Some(hedging) = ledger.config.hedging else {
        return;
    };
    if !race.as_mut().hedge_due() || ledger.sent >= ledger.config.policy.max_attempts {
        return;
    }
    let Some(waited) = race.lanes().0.and_then(AttemptLane::waited) else {
        return;
    };
    let deadline = ledger.deadline.map(|deadline| deadline.instant());
    let policy = &ledger.config.policy;
    // gRPC's retry tokens, when on, hold hedges back as they do retries (gRFC A6).
    let granted = match policy.tokens_allow() {
        true => race.grant_hedge(&hedging, waited, deadline, &policy.budget),
        false => Err(NoHedge::Budget),
    };
    match granted {
        Ok(ticket) => race.start_hedge(AttemptLane::hedge(ticket)),
        Err(NoHedge::Budget) => {
            if let Some(path) = race.lanes().0 {
                ledger.watch.hedge_refused(path.watch(), None);
            }
        }
        Err(NoHedge::Spent) => {}
    }
}

/// If the deadline has passed: the request ends, every attempt in flight timed out (a health
/// failure for the breaker), and dropping the lanes cancels what is in flight.
fn expired<S, B, RB, C, Bk>(
    mut race: Pin<&mut Lanes<S::Future, B, RB, C>>,
    books: &mut Books<'_, S, B, RB, C, Bk>,
) -> Option<Output<RB>>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Body,
    C: Classify,
    Bk: Backoff,
{
    let ledger = &mut books.ledger;
    let deadline = ledger.deadline?;
    if Instant::now() < deadline.instant() {
        return None;
    }
    race.as_mut().for_each(|lane| lane.expire(ledger));
    let sent = ledger.sent;
    match ledger.end(Err(Error::deadline_exceeded(sent))) {
        Verdict::End(output) => Some(output),
        Verdict::Retry(..) | Verdict::Out => None,
    }
}

/// The earlier of two instants, either of which may be missing.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
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
        f.debug_struct("ResponseFuture")
            .field("state", &path.map_or("done", AttemptLane::describe))
            .field("attempts", &self.ledger.sent)
            .field("hedged", &hedge.is_some())
            .field("deadline", &self.ledger.deadline)
            .finish()
    }
}
