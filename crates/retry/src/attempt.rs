//! [`Attempt`]: one attempt of a request as a value, before it is sent and while it is in flight.

use std::time::Duration;

use stormguard_rate_limit::Reservation;
use tokio::time::Instant;

use crate::admission::Permits;
use crate::observe::AttemptWatch;
use crate::policy::Grant;

/// One attempt of a request. Before it is sent: the budget's grant if it is a retry or a hedge,
/// and its rate-limit slot once reserved. In flight: its guards' permits, its grant, when it
/// started, when its clocks are due, and its span. Each part settles itself by its own rules
/// when it is dropped untold (a grant never sent and a slot never used are given back; see
/// [`Permits`] for the guards'), so a request dropped anywhere owes nothing.
///
/// It is the ledger's, not a state's: the states move at every step of a request, and this
/// stays where it is. A request has two while a hedge races its first attempt.
#[derive(Default)]
pub(crate) struct Attempt {
    pub(crate) grant: Option<Grant>,
    pub(crate) slot: Option<Reservation>,
    pub(crate) permits: Permits,
    /// When it was sent (tracked under a deadline, which the retry decision needs, and once it
    /// waits for its answer, which its clocks need).
    pub(crate) started: Option<Instant>,
    /// When its head clock fires, worked out the first time it waits for its answer.
    pub(crate) head_by: Due,
    /// When the request hedges it, if it has produced no content by then: worked out the first
    /// time it waits, with hedging on.
    pub(crate) hedge_by: Due,
    /// It is a hedge: a second attempt, sent while the first waits.
    pub(crate) hedge: bool,
    /// It was handed to the service.
    pub(crate) sent: bool,
    /// Its span, and what the metrics time of it.
    pub(crate) watch: AttemptWatch,
}

/// When a clock of an attempt in flight is due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Due {
    /// Not worked out yet: the attempt has not waited. An answer that comes at the first poll
    /// never needs it, and teaches the clocks nothing: it did not wait on the backend (a cache,
    /// a service that answers locally).
    #[default]
    Unset,
    /// At this instant.
    At(Instant),
    /// Never.
    Never,
}

impl Attempt {
    /// A hedge, with the budget's grant for it.
    pub(crate) fn hedge(grant: Grant) -> Self {
        Self {
            grant: Some(grant),
            hedge: true,
            ..Self::default()
        }
    }

    /// How long the attempt took until now, the first time it is asked.
    pub(crate) fn took(&mut self) -> Option<Duration> {
        self.started.take().map(|started| started.elapsed())
    }

    /// How long the attempt has been in flight, if it is timed.
    pub(crate) fn in_flight(&self) -> Option<Duration> {
        self.started.map(|started| started.elapsed())
    }
}
