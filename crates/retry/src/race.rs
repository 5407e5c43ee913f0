//! [`Race`]: up to two attempts of one request in flight, the request's own and a hedge beside
//! it, the first to answer ending the request.
//!
//! The engine races two attempts of a request on one backend ([`Hedging`]); a router above it
//! (a failover) races two backends' turns with the request. Both run through this one type, so
//! the rules are written once:
//!
//! 1. each lane is polled in turn, the request's path first; a lane that steps is polled again
//!    before the other;
//! 2. the first lane to finish (an answer, or an end no retry changes) ends the race, and the
//!    other [loses](Lane::lose): cancelled as the slower of two, which says nothing about its
//!    backend;
//! 3. a lane whose attempt fails while the other is in flight [leaves](Lap::Out) the race, and
//!    the other goes on alone, as the request's path from then on;
//! 4. a hedge that has not gone out yet is dropped when the path leaves its backend (a retry's
//!    backoff, say): it has nothing left to race;
//! 5. a hedge goes only when it is due and the [`Hedging`] rules grant it
//!    ([`hedge_due`](Race::hedge_due), [`grant_hedge`](Race::grant_hedge)): at most
//!    `max_hedges` per request, with more time left than the path has waited, and a ticket from
//!    the retry budget.
//!
//! A lane is a value that owns its attempt (its permits, its budget ticket, its clocks), so what
//! a loser holds goes back by the lane's own rules whoever races. The request's first lane lives
//! in the race; a hedge's is boxed, so that a request never hedged carries a pointer and no
//! second lane.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use stormguard_budget::{RetryBudget, Ticket};
use stormguard_deadline::clocks::{AttemptClocks, RequestShape};
use tokio::time::Instant;

use crate::hedge::{Hedging, NoHedge};

/// One lane of a [`Race`]: the path of one attempt, stepped with what the lanes share (`X`, the
/// request's books).
pub trait Lane<X> {
    /// What a lane that finishes hands back: the request's answer.
    type Output;

    /// Polls what the lane waits for and takes the steps that follow, until it waits again
    /// (`Pending`), finishes, leaves the race or takes a step the race may act on (`Ready`): one
    /// that leaves its backend (a lane may take the steps that keep it there in one lap). `racing`: the other
    /// lane's attempt is in flight, so a failure of this one only takes it out of the race.
    fn poll_lap(
        self: Pin<&mut Self>,
        books: &mut X,
        racing: bool,
        cx: &mut Context<'_>,
    ) -> Poll<Lap<Self::Output>>;

    /// Whether the lane's attempt is with its backend: sent, and its answer not judged yet.
    fn in_flight(&self) -> bool;

    /// The other lane finished first: this one is cancelled as a loser (its attempt's permits
    /// settled as a loser's, its ticket spent if it was sent, what it waited taught to its
    /// backend's clocks where that is a bound).
    fn lose(self: Pin<&mut Self>, books: &mut X);

    /// The lane is out of the race: it drops what it holds.
    fn vacate(self: Pin<&mut Self>);
}

/// What a [`Race`] reads of its request's path to time its hedge.
pub trait Waiting {
    /// When the lane's attempt was sent, if it waits for its first content (its answer's head,
    /// or a stream's first content event): what a hedge's delay counts from.
    fn waiting_since(self: Pin<&mut Self>) -> Option<Instant>;
}

/// What a lane's poll came to.
#[derive(Debug)]
pub enum Lap<T> {
    /// The lane took a step and is to be polled again.
    Stepped,
    /// The lane finished: the race is over, with this.
    Finished(T),
    /// The lane's attempt failed while the other was in flight: it leaves the race.
    Out,
}

/// Which place of the race holds a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// The race's own.
    Inline,
    /// The box, for a hedge.
    Boxed,
}

impl Place {
    fn other(self) -> Self {
        match self {
            Self::Inline => Self::Boxed,
            Self::Boxed => Self::Inline,
        }
    }
}

pin_project! {
    /// Up to two lanes of one request: see the [module docs](self).
    pub struct Race<L> {
        #[pin]
        inline: L,
        boxed: Option<Pin<Box<L>>>,
        // Whether the inline lane is in the race (it left it, or lost, otherwise).
        inline_on: bool,
        // Where the request's path is; the other place holds its hedge, if one is out.
        path: Place,
        // Hedges sent or on their way.
        hedges: u32,
        // When the path's attempt sent at the first instant is hedged (worked out once per
        // attempt; `None` once it was, or never).
        hedge_by: Option<(Instant, Option<Instant>)>,
    }
}

impl<L> Race<L> {
    /// A race of one lane, the request's path.
    #[inline]
    pub fn new(lane: L) -> Self {
        Self {
            inline: lane,
            boxed: None,
            inline_on: true,
            path: Place::Inline,
            hedges: 0,
            hedge_by: None,
        }
    }

    /// The lane in `place`, if one is there.
    fn lane(self: Pin<&mut Self>, place: Place) -> Option<Pin<&mut L>> {
        let this = self.project();
        match place {
            Place::Inline => (*this.inline_on).then_some(this.inline),
            Place::Boxed => this.boxed.as_mut().map(Pin::as_mut),
        }
    }

    fn lane_ref(&self, place: Place) -> Option<&L> {
        match place {
            Place::Inline => self.inline_on.then_some(&self.inline),
            Place::Boxed => self.boxed.as_deref(),
        }
    }

    /// The request's path.
    pub fn path(self: Pin<&mut Self>) -> Option<Pin<&mut L>> {
        let place = self.path;
        self.lane(place)
    }

    /// The hedge racing the path, if one is out.
    pub fn hedge(self: Pin<&mut Self>) -> Option<Pin<&mut L>> {
        let place = self.path.other();
        self.lane(place)
    }

    /// The request's path and its hedge, to read.
    pub fn lanes(&self) -> (Option<&L>, Option<&L>) {
        (self.lane_ref(self.path), self.lane_ref(self.path.other()))
    }

    /// Calls `f` with each lane: the request's path, then its hedge, if one is out.
    pub fn for_each(mut self: Pin<&mut Self>, mut f: impl FnMut(Pin<&mut L>)) {
        for place in [self.path, self.path.other()] {
            if let Some(lane) = self.as_mut().lane(place) {
                f(lane);
            }
        }
    }

    /// Hedges sent or on their way.
    pub fn hedges(&self) -> u32 {
        self.hedges
    }

    /// Starts `hedge` beside the path, in the free place.
    pub fn start_hedge(mut self: Pin<&mut Self>, hedge: L) {
        let mut this = self.as_mut().project();
        *this.hedges = this.hedges.saturating_add(1);
        match this.path.other() {
            Place::Boxed => *this.boxed = Some(Box::pin(hedge)),
            Place::Inline => {
                this.inline.set(hedge);
                *this.inline_on = true;
            }
        }
    }

    /// Polls the lanes until both wait or one finishes the race: see the [module docs](self).
    #[inline]
    pub fn poll<X>(mut self: Pin<&mut Self>, books: &mut X, cx: &mut Context<'_>) -> Poll<L::Output>
    where
        L: Lane<X>,
    {
        // A race of one lane (a request never hedged) is that lane's path, step after step.
        while self.boxed.is_none() && self.inline_on {
            let this = self.as_mut().project();
            match ready!(this.inline.poll_lap(books, false, cx)) {
                Lap::Finished(output) => return Poll::Ready(output),
                Lap::Stepped => {}
                Lap::Out => self.as_mut().take(Place::Inline),
            }
        }
        self.poll_two(books, cx)
    }

    /// Polls a race of two lanes, the path first.
    fn poll_two<X>(mut self: Pin<&mut Self>, books: &mut X, cx: &mut Context<'_>) -> Poll<L::Output>
    where
        L: Lane<X>,
    {
        'laps: loop {
            for place in [self.path, self.path.other()] {
                let racing = self
                    .lane_ref(place.other())
                    .is_some_and(|other| other.in_flight());
                let Some(lane) = self.as_mut().lane(place) else {
                    continue;
                };
                let Poll::Ready(lap) = lane.poll_lap(books, racing, cx) else {
                    continue;
                };
                match lap {
                    Lap::Finished(output) => {
                        if let Some(loser) = self.as_mut().lane(place.other()) {
                            loser.lose(books);
                        }
                        self.as_mut().take(place.other());
                        return Poll::Ready(output);
                    }
                    Lap::Out => {
                        self.as_mut().take(place);
                        *self.as_mut().project().path = place.other();
                    }
                    Lap::Stepped => {
                        let path = self.path;
                        let left_backend = place == path
                            && !self.lane_ref(place).is_some_and(|lane| lane.in_flight());
                        let hedge_unsent = self
                            .lane_ref(place.other())
                            .is_some_and(|hedge| !hedge.in_flight());
                        if left_backend && hedge_unsent {
                            self.as_mut().take(place.other());
                        }
                    }
                }
                continue 'laps;
            }
            return Poll::Pending;
        }
    }

    /// Takes the lane out of `place`, dropping what it holds.
    fn take<X>(mut self: Pin<&mut Self>, place: Place)
    where
        L: Lane<X>,
    {
        let this = self.as_mut().project();
        match place {
            Place::Boxed => *this.boxed = None,
            Place::Inline => {
                if std::mem::take(this.inline_on) {
                    this.inline.vacate();
                }
            }
        }
    }

    /// When the path gets a hedge by `hedging`'s rules, if it waits for its first content and
    /// no hedge races it: its delay (fixed, learned from `clocks`, its backend's, or their cold
    /// limit; the request shaped as the clocks read it) after the path's attempt was sent,
    /// worked out once per attempt; never once the request's hedges are spent, or for a delay
    /// with nothing to go by.
    pub fn hedge_clock<'c>(
        mut self: Pin<&mut Self>,
        hedging: &Hedging,
        clocks: impl FnOnce() -> (Option<&'c AttemptClocks>, RequestShape),
    ) -> Option<Instant>
    where
        L: Waiting,
    {
        if self.lane_ref(self.path.other()).is_some() || self.hedges >= hedging.max_hedges() {
            return None;
        }
        let since = self.as_mut().path()?.waiting_since()?;
        let this = self.project();
        match this.hedge_by {
            Some((sent, due)) if *sent == since => *due,
            _ => {
                let (clocks, shape) = clocks();
                // Worked out once: a delay learned later is not this attempt's.
                let delay = hedging.delay_for(clocks, shape);
                let due = delay.and_then(|delay| since.checked_add(delay));
                *this.hedge_by = Some((since, due));
                due
            }
        }
    }

    /// Whether the path's hedge is due (its clock has come): once per attempt.
    pub fn hedge_due(self: Pin<&mut Self>) -> bool {
        let hedge_by = self.project().hedge_by;
        match hedge_by {
            Some((_, due)) if due.is_some_and(|due| Instant::now() >= due) => {
                *due = None;
                true
            }
            _ => false,
        }
    }

    /// The path waited `waited` and is due: the budget's ticket for its hedge, if one goes by
    /// `hedging`'s rules (hedges left, more time left before `deadline` than was waited, the
    /// budget grants it), or why not.
    pub fn grant_hedge(
        &self,
        hedging: &Hedging,
        waited: Duration,
        deadline: Option<Instant>,
        budget: &RetryBudget,
    ) -> Result<Ticket, NoHedge> {
        hedging.grant(self.hedges, waited, deadline, budget)
    }
}
