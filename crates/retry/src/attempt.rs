//! One attempt as a value: [`Next`] before it is sent, [`Attempt`] while it is in flight. A
//! request's states hold their attempt, so that dropping the request anywhere settles what the
//! attempt holds (its permits, its retry grant, its rate-limit slot) by the guards' own rules.

use std::time::Duration;

use http::Request;
use stormguard_rate_limit::Reservation;
use tokio::time::Instant;

use crate::admission::Permits;
use crate::policy::Grant;

/// An attempt about to go: the request, the budget's grant if it is a retry, and its rate-limit
/// slot once reserved. Dropped unsent, the grant and the slot are given back.
pub(crate) struct Next<B> {
    pub(crate) request: Request<B>,
    pub(crate) grant: Option<Grant>,
    pub(crate) slot: Option<Reservation>,
    /// It waited for its slot: the time left it carries is stale.
    pub(crate) waited: bool,
}

/// An attempt in flight: its guards' permits, its grant, and when it started.
#[derive(Default)]
pub(crate) struct Attempt {
    pub(crate) permits: Permits,
    pub(crate) grant: Option<Grant>,
    /// When it was sent (tracked under a deadline only: the retry decision needs it then).
    pub(crate) started: Option<Instant>,
}

impl<B> Next<B> {
    pub(crate) fn new(request: Request<B>, grant: Option<Grant>) -> Self {
        Self {
            request,
            grant,
            slot: None,
            waited: false,
        }
    }
}

impl Attempt {
    /// How long the attempt took until now, the first time it is asked.
    pub(crate) fn took(&mut self) -> Option<Duration> {
        self.started.take().map(|started| started.elapsed())
    }
}
