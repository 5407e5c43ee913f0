//! [`Attempt`]: one attempt of a request as a value, before it is sent and while it is in flight.

use std::time::Duration;

use stormguard_rate_limit::Reservation;
use tokio::time::Instant;

use crate::admission::Permits;
use crate::policy::Grant;

/// The request's current attempt. Before it is sent: the budget's grant if it is a retry, and its
/// rate-limit slot once reserved. In flight: its guards' permits, its grant, when it started.
/// Each part settles itself by its own rules when it is dropped untold (a grant never sent and a
/// slot never used are given back; see [`Permits`] for the guards'), so a request dropped
/// anywhere owes nothing.
///
/// It is the ledger's, not a state's: the states move at every step of a request, and this
/// stays where it is.
#[derive(Default)]
pub(crate) struct Attempt {
    pub(crate) grant: Option<Grant>,
    pub(crate) slot: Option<Reservation>,
    pub(crate) permits: Permits,
    /// When it was sent (tracked under a deadline only: the retry decision needs it then).
    pub(crate) started: Option<Instant>,
}

impl Attempt {
    /// How long the attempt took until now, the first time it is asked.
    pub(crate) fn took(&mut self) -> Option<Duration> {
        self.started.take().map(|started| started.elapsed())
    }
}
