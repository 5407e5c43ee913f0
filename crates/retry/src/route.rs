//! The engine as one backend of a router above it (a failover over several backends, or one of
//! a user's own): what the router hands it with a request ([`Route`]) and what it gets back with
//! the answer ([`Report`]), through [`ClientService::route`](crate::ClientService::route).
//!
//! A router needs more than the answer to decide what comes next: whether the engine sent
//! anything (a move after nothing was sent is free), how it judged the last attempt, why it
//! stopped retrying, and whether the server answered 429 to every attempt (a backend that keeps
//! rate-limiting the request is left at once). And the engine needs more than the request: that
//! a timeout is better handed to the next backend than retried here, the budget's ticket the
//! router drew for the move, and who continues the streams it hands back.

use std::fmt;

use stormguard_budget::Ticket;
use stormguard_classify::Outcome;
use stormguard_deadline::clocks::SharedBodyShape;
use stormguard_stream::Continuer;

use crate::error::{Error, GiveUpCause};

/// How a router hands a request to one backend's engine.
///
/// ```
/// use stormguard_retry::Route;
///
/// // A fired clock ends the engine's turn: the router takes the request to its next backend.
/// let route = Route::new().with_hand_off();
/// # let _ = route;
/// ```
#[derive(Default)]
pub struct Route {
    pub(crate) hand_off: bool,
    pub(crate) hand_off_429: bool,
    pub(crate) ticket: Option<Ticket>,
    pub(crate) continuer: Option<Continuer>,
    pub(crate) continuation: bool,
    pub(crate) body_shape: Option<SharedBodyShape>,
}

impl Route {
    /// A request handed on as [`Service::call`](tower_service::Service::call) sends it, but that
    /// the engine never continues its streams by itself.
    pub fn new() -> Self {
        Self::default()
    }

    /// An attempt whose clock fires without an answer ends the engine's turn
    /// ([`GiveUpCause::HandedOn`]) instead of being retried on this backend: the router takes the
    /// request elsewhere at once.
    #[must_use]
    pub fn with_hand_off(mut self) -> Self {
        self.hand_off = true;
        self
    }

    /// A 429 the server answers ends the engine's turn ([`GiveUpCause::HandedOn`]) instead of
    /// being retried on this backend after its wait: the router has another backend (another
    /// key, another deployment) that takes the request at once. The 429 is handed back, for the
    /// router to answer with if the move cannot be made.
    #[must_use]
    pub fn with_hand_off_429(mut self) -> Self {
        self.hand_off_429 = true;
        self
    }

    /// The budget's ticket the router drew for this turn (a move after an attempt was sent
    /// elsewhere, a hedge on this backend): the turn's first attempt's, given back if that
    /// attempt is never sent.
    #[must_use]
    pub fn with_ticket(mut self, ticket: Ticket) -> Self {
        self.ticket = Some(ticket);
        self
    }

    /// What the router reads of the request's body for its clocks, shared with the engine's:
    /// whichever asks first reads the body, once for both (and for the router's other backends).
    /// Only for a body the router hands on unchanged: one it rewrites for this backend is read
    /// by the engine on its own.
    #[must_use]
    pub fn with_body_shape(mut self, shape: SharedBodyShape) -> Self {
        self.body_shape = Some(shape);
        self
    }

    /// Continue the event streams this turn hands back through `continuer`, which sends each
    /// continuation where the router chooses (at most `max_attempts - 1` per stream). Without
    /// one, a stream cut after content ends with its in-band error event.
    #[must_use]
    pub fn with_continuer(mut self, continuer: Continuer) -> Self {
        self.continuer = Some(continuer);
        self
    }

    /// The request continues a stream: its own stream is never continued (the stream it
    /// continues goes on from all it received), and the metrics count its usage as a
    /// continuation's.
    #[must_use]
    pub fn as_continuation(mut self) -> Self {
        self.continuation = true;
        self
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("hand_off", &self.hand_off)
            .field("hand_off_429", &self.hand_off_429)
            .field("ticket", &self.ticket)
            .field("continuer", &self.continuer.is_some())
            .field("continuation", &self.continuation)
            .finish()
    }
}

/// What an engine's turn with a request came to, handed to the router with the answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    pub(crate) outcome: Outcome,
    pub(crate) attempts: u32,
    pub(crate) gave_up: Option<GiveUpCause>,
    pub(crate) rate_limited_throughout: bool,
}

impl Report {
    /// What the engine reports for a request that ended with `error` (a router's own error for a
    /// request it could not hand to the engine reads the same).
    pub fn of_error(error: &Error) -> Self {
        Self {
            outcome: error.outcome(),
            attempts: error.attempts(),
            gave_up: error.gave_up(),
            rate_limited_throughout: error.rate_limited_throughout(),
        }
    }

    /// How the last attempt was judged (success for an answer handed back as one; a local
    /// refusal's when no attempt was sent).
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Attempts sent (0: the engine refused the request before sending anything).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the engine stopped retrying a retryable failure, when it did.
    pub fn gave_up(&self) -> Option<GiveUpCause> {
        self.gave_up
    }

    /// Whether the server answered 429 to every attempt sent, the last one included (a refusal
    /// of this side's own rate limit is no 429 from the server): the backend is rate-limiting
    /// the request whatever the retries do. Its breaker cannot say so (a 429 is no health
    /// failure), nor can its throttle at a few requests a second.
    pub fn rate_limited_throughout(&self) -> bool {
        self.rate_limited_throughout
    }
}
