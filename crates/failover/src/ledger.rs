//! [`Ledger`]: the books of one request across its backends, and what the failover decides between
//! two hops: which backend takes the request first, whether a hop's answer is handed back or the
//! request moves on (a cure, a refusal, a backend that keeps answering 429 or handed it on, one
//! that failed and is unhealthy now), whether the move fits the deadline and the budget, what ends
//! a request no backend answered, and when a hop is hedged. Nothing here calls a backend's engine:
//! the [future](crate::ResponseFuture) does, and acts on what these say.

use std::cell::OnceCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use stormguard_breaker::State;
use stormguard_budget::{RetryBudget, Ticket};
use stormguard_classify::body::{PartialBody, ResponseBody, Tail};
use stormguard_classify::{BoxError, Classify, Outcome, Reason};
use stormguard_deadline::Deadline;
use stormguard_deadline::clocks::{BodyShape, RequestShape, SharedBodyShape};
use stormguard_jitter::Backoff;
use stormguard_rate_limit::RateLimit;
use stormguard_retry::{Error, GiveUpCause, ReplayBody, Report, Route};
use stormguard_stream::Continuer;
use stormguard_stream::continuation::Format;
use tokio::time::Instant;

use crate::Backend;
use crate::balance::{Candidate, InFlight, rendezvous, two_choices};
use crate::marks::{Cure, NoBackend, mark};
use crate::record::{FailoverRecorder, Recorder};
use crate::shared::Shared;

/// What the failover hands back.
pub(crate) type Output<RB> = Result<Response<ResponseBody<RB>>, Error>;

/// Most backends a failover tells apart (the hops of one request are kept as bits).
pub(crate) const MAX_BACKENDS: usize = 64;

/// Makes the continuer of a stream that backend `from` served of the request with head `head` (as
/// it came, before any backend's adapter): it sends each continuation through the failover. A
/// plain function, so that a request that never streams costs a pointer.
pub(crate) type MakeContinuer<S, C, Bk> =
    fn(&Arc<Shared<S, C, Bk>>, usize, &Arc<Parts>) -> Continuer;

/// The books of one request across its backends.
pub(crate) struct Ledger<S, C, Bk> {
    pub(crate) shared: Arc<Shared<S, C, Bk>>,
    /// The retry budget every backend shares (the layer's).
    budget: RetryBudget,
    /// The request as it came (with its deadline), rebuilt for each backend.
    head: Arc<Parts>,
    /// The buffered body; `None` while it is read, or for a body sent once as a stream.
    body: Option<Bytes>,
    pub(crate) deadline: Option<Deadline>,
    /// Backends tried, as bits.
    tried: u64,
    /// For a continuation: the backend whose stream it continues.
    continues_from: Option<usize>,
    /// Whether any backend was sent an attempt: a move after that is a retry, drawn from the
    /// budget; before it, nothing was sent and moving on is free.
    sent: bool,
    /// Who continues the streams a hop hands back; none: nobody.
    continuer: Option<MakeContinuer<S, C, Bk>>,
    /// What pays for the first hop: a continuation's ticket.
    first_ticket: Option<Ticket>,
    /// What the body says of the request for the clocks, shared with the engines it is handed
    /// to unchanged: read the first time one of them or this ledger asks.
    body_shape: OnceCell<SharedBodyShape>,
}

/// One backend's turn with the request.
#[derive(Debug)]
pub(crate) struct Hop {
    pub(crate) backend: usize,
    pub(crate) started: Instant,
    /// It is a hedge.
    pub(crate) hedge: bool,
    /// Counted in flight by its backend's balancer while with its engine.
    pub(crate) in_flight: Option<InFlight>,
}

/// What comes after a hop.
pub(crate) enum Next<B, RB: Body> {
    /// The request goes to backend `to` (`ticket`: the budget's for the move, after an attempt
    /// was sent; `once`: the body as it streams, for a request sent once).
    Hop {
        to: usize,
        ticket: Option<Ticket>,
        once: Option<B>,
    },
    /// The request ends with this.
    Finish(Output<RB>),
    /// The hop failed while the other hop of a hedge was in flight: it leaves the race.
    Out,
}

impl Hop {
    pub(crate) fn new(backend: usize, hedge: bool) -> Self {
        Self {
            backend,
            started: Instant::now(),
            hedge,
            in_flight: None,
        }
    }
}

impl<S, C: Classify, Bk: Backoff> Ledger<S, C, Bk> {
    pub(crate) fn new(
        shared: Arc<Shared<S, C, Bk>>,
        head: Parts,
        continuer: Option<MakeContinuer<S, C, Bk>>,
        continues: Option<(usize, Ticket)>,
    ) -> Self {
        let (continues_from, first_ticket) = continues.unzip();
        Self {
            budget: shared.layer.budget().clone(),
            shared,
            head: Arc::new(head),
            body: None,
            deadline: None,
            tried: 0,
            continues_from,
            sent: false,
            continuer,
            first_ticket,
            body_shape: OnceCell::new(),
        }
    }

    /// The body was read: one deadline for every backend, then the first hop.
    pub(crate) fn buffered<B, RB>(
        &mut self,
        bytes: Bytes,
        tail: Tail<B::Error>,
        rest: B,
    ) -> Next<B, RB>
    where
        B: ReplayBody,
        B::Error: Into<BoxError>,
        RB: Body,
    {
        let timeout = self.shared.layer.timeout_for(&self.head, Some(&bytes));
        if let Some(timeout) = timeout {
            Deadline::after(timeout)
                .apply_to_extensions(&mut Arc::make_mut(&mut self.head).extensions);
        }
        self.deadline = Deadline::from_extensions(&self.head.extensions);
        let Some(first) = self.next_healthy() else {
            return self.end(None, None);
        };
        let once = match tail {
            Tail::Ended => {
                self.body = Some(bytes);
                None
            }
            Tail::Failed(error) => {
                let outcome = Outcome::fatal(Reason::BadRequest).with_accepted(false);
                return Next::Finish(Err(Error::refused(outcome, error.into(), 0)));
            }
            // Trailers, or a body longer than the replay cap: sent once, to the first backend.
            tail => Some(B::from_partial(PartialBody::new(bytes, tail, rest))),
        };
        Next::Hop {
            to: first,
            ticket: self.first_ticket.take(),
            once,
        }
    }

    /// The request for backend `index`, rewritten for it (`once`: the body as it streams).
    pub(crate) fn request_for<B: ReplayBody>(
        &mut self,
        index: usize,
        once: Option<B>,
    ) -> Request<B> {
        self.tried |= 1 << index;
        let adapter = self.shared.engines[index].backend.adapter();
        let mut head = Parts::clone(&self.head);
        let body = match (once, &self.body) {
            (Some(once), _) => {
                adapter.apply_head(&mut head);
                once
            }
            (None, body) => {
                let body = body
                    .as_ref()
                    .map_or_else(Bytes::new, |body| adapter.apply(&mut head, body));
                B::from_bytes(body)
            }
        };
        Request::from_parts(head, body)
    }

    /// How backend `index`'s engine is handed the request (`ticket`: what pays for the turn): a
    /// fired clock hands it on to the next backend, a continuation is marked as one, and the
    /// streams of a request in a format the engine continues are continued through the failover.
    pub(crate) fn route_for(&self, index: usize, ticket: Option<Ticket>) -> Route {
        let mut route = Route::new().with_hand_off();
        if let Some(ticket) = ticket {
            route = route.with_ticket(ticket);
        }
        // The engine's clocks size the request from what this one read, if the backend sends
        // the body as it came.
        let backend = &self.shared.engines[index].backend;
        if backend.clocks().is_some() && backend.adapter().keeps_body() && self.body.is_some() {
            route = route.with_body_shape(self.shared_body_shape().clone());
        }
        if self.continues_from.is_some() {
            return route.as_continuation();
        }
        // Asked only when a 429 moves a request: another backend is free to take it.
        if self.shared.hand_off_429 && self.another_free(index) {
            route = route.with_hand_off_429();
        }
        match self.continuer {
            Some(make) if Format::of_request(&self.head).is_some() => {
                route.with_continuer(make(&self.shared, index, &self.head))
            }
            _ => route,
        }
    }

    /// Hop `hop` ended with `output`, as its engine reported it: hand the answer back, or go on
    /// to another backend; out of the race, if it failed while the other hop of a hedge was in
    /// flight (`racing`).
    pub(crate) fn after<B, RB: Body>(
        &mut self,
        hop: &mut Hop,
        output: Output<RB>,
        report: &Report,
        racing: bool,
    ) -> Next<B, RB> {
        let took = hop.started.elapsed();
        hop.in_flight = None;
        let (outcome, attempts) = (report.outcome(), report.attempts());
        let engine = &self.shared.engines[hop.backend];
        // The balancer learns how long the backend took to answer, or to time out.
        if attempts > 0 && (outcome.is_success() || outcome.reason() == Reason::Timeout) {
            engine.load.observe(took);
        }
        self.sent |= attempts > 0;
        if self.shared.hand_off_429 && output.is_ok() && outcome.reason() == Reason::RateLimited {
            let wait = outcome
                .retry_after()
                .unwrap_or(Backend::DEFAULT_429_COOLDOWN);
            engine.cool_for(self.shared.epoch, wait);
        }
        if !outcome.is_success() && racing {
            if hop.hedge {
                self.hedged(hop.backend, "failed");
            }
            return Next::Out;
        }
        if !outcome.is_success() {
            self.share_cooldown_of(hop.backend);
        }
        let output = output.map(|mut response| {
            mark(
                &mut response,
                engine.backend.shared_name(),
                engine.backend.mark(),
            );
            response
        });
        if outcome.is_success() {
            if racing && hop.hedge {
                self.hedged(hop.backend, "won");
            }
            return Next::Finish(output);
        }
        self.move_on(hop.backend, output, report, took)
    }

    /// Hop on backend `from` failed with `output` after `took`: the next backend takes the
    /// request if the failure calls for one, the deadline fits another hop and the budget pays
    /// for it; else the request ends.
    fn move_on<B, RB: Body>(
        &mut self,
        from: usize,
        output: Output<RB>,
        report: &Report,
        took: Duration,
    ) -> Next<B, RB> {
        let outcome = report.outcome();
        // The engine's own error for the passed deadline (cut in flight, or out of time before
        // its next attempt): no backend can answer in time any more, whoever had the request.
        if output.is_err() && outcome.reason() == Reason::DeadlineExceeded {
            return self.end(Some((output, *report)), Some(from));
        }
        // A body sent once as a stream is gone: no other backend can be sent it.
        if self.body.is_none() {
            return self.end(Some((output, *report)), Some(from));
        }
        let next = match Cure::of(&outcome) {
            Some(cure) => self.cure(cure),
            None if self.leaves(from, output.is_ok(), report) => self.next_healthy(),
            None => return Next::Finish(output),
        };
        let Some(to) = next else {
            return self.end(Some((output, *report)), Some(from));
        };
        if !self.fits(took, report.attempts()) {
            return self.end(Some((output, *report)), Some(from));
        }
        let ticket = match self.sent {
            true => match self.budget.ticket() {
                Some(ticket) => Some(ticket),
                None => return self.end(Some((output, *report)), Some(from)),
            },
            false => None,
        };
        let engines = &self.shared.engines;
        moved(
            engines[from].backend.shared_name(),
            engines[to].backend.name(),
            outcome.reason(),
        );
        Next::Hop {
            to,
            ticket,
            once: None,
        }
    }

    /// Whether the request leaves backend `from`, which failed it as `report` says (`answered`:
    /// with a response), for the next: the backend refused it (its breaker, throttle, bulkhead or
    /// rate limit, before or after an attempt was sent), refuses the failover's credentials (a
    /// 401 or 403: set aside for good), keeps answering 429, handed it on (an attempt's clock
    /// fired, or a 429 while another backend was free), rejects the prefill of a continuation
    /// (learned: not asked again), or failed and is now left (its breaker opened: failures in a
    /// row); not one that failed once.
    fn leaves(&self, from: usize, answered: bool, report: &Report) -> bool {
        let engine = &self.shared.engines[from];
        let reason = report.outcome().reason();
        if answered && matches!(reason, Reason::Unauthorized | Reason::Forbidden) {
            if engine.backend.set_aside() {
                tracing::warn!(
                    backend = engine.backend.name(),
                    reason = reason.as_str(),
                    "backend set aside: it refuses the credentials it is sent; no request goes to it again"
                );
            }
            return true;
        }
        let refused = reason.is_local_refusal();
        let failed = !refused && failed_on_backend(answered, report);
        let rejects_prefill = self.continues_from.is_some() && reason == Reason::BadRequest;
        if rejects_prefill {
            engine.reject_prefill();
        }
        refused
            || keeps_answering_429(report)
            || report.gave_up() == Some(GiveUpCause::HandedOn)
            || rejects_prefill
            || failed && !engine.backend.is_healthy()
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
    /// A backend cooling after a 429 is taken only when no other can.
    pub(crate) fn next_healthy(&self) -> Option<usize> {
        let next = |cooled| {
            let takes = |index: usize| self.takes(index, cooled);
            self.choose(|index| Some(index) != self.continues_from && takes(index))
                .or_else(|| self.continues_from.filter(|from| takes(*from)))
        };
        next(true).or_else(|| self.shared.hand_off_429.then(|| next(false)).flatten())
    }

    /// Whether backend `index` may take the request next: not tried yet, not left for a shared
    /// cooldown, healthy, taking a prefill for a continuation, and (`cooled`) not cooling after
    /// a 429.
    fn takes(&self, index: usize, cooled: bool) -> bool {
        let engine = &self.shared.engines[index];
        let shared = &*self.shared;
        index < MAX_BACKENDS
            && self.tried & (1 << index) == 0
            && !self.cooling(index)
            && engine.backend.is_healthy()
            && (self.continues_from.is_none() || engine.takes_prefill())
            && !(cooled && shared.hand_off_429 && engine.cooling_after_429(shared.epoch))
    }

    /// Whether a backend other than `index` is free for the request: one a 429 on `index` is
    /// handed on to at once.
    fn another_free(&self, index: usize) -> bool {
        (0..self.shared.engines.len()).any(|other| other != index && self.takes(other, true))
    }

    /// The backend of the first rank that has one that `may` take the request: the only one,
    /// or the balancer's pick (the sticky key's backend, else the cheaper of two drawn).
    fn choose(&self, may: impl Fn(usize) -> bool) -> Option<usize> {
        let shared = &*self.shared;
        let engines = &shared.engines;
        for rank in &shared.ranks {
            let mut open = [Candidate::default(); MAX_BACKENDS];
            let mut count = 0;
            for index in rank.clone().filter(|index| may(*index)) {
                let weight = engines[index].backend.weight();
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
            let name = |index: usize| engines[index].backend.name();
            if let Some(key) = shared.sticky.as_ref().and_then(|key| key(&self.head)) {
                return rendezvous(key, open, name);
            }
            let cost = |index: usize| {
                let backend = &engines[index].backend;
                let headroom = backend.rate_limit().map_or(1.0, RateLimit::headroom);
                engines[index].load.cost(backend.weight(), headroom)
            };
            return two_choices(open, cost, &shared.random);
        }
        None
    }

    /// Whether another hop fits in the time left: as long as an attempt of the last one took.
    fn fits(&self, took: Duration, attempts: u32) -> bool {
        let attempt = took / attempts.max(1);
        self.deadline
            .is_none_or(|deadline| deadline.fits(Duration::ZERO, attempt))
    }

    /// No other backend: the last one's answer (`None`: no backend could be tried; `from`: the
    /// backend that gave it), or the degraded answer instead of a failure no backend could avoid.
    pub(crate) fn end<B, RB: Body>(
        &mut self,
        last: Option<(Output<RB>, Report)>,
        from: Option<usize>,
    ) -> Next<B, RB> {
        let why = match &last {
            Some((_, report)) => report.outcome(),
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
            if let Some(from) = from {
                let from = self.shared.engines[from].backend.shared_name();
                moved(from, DEGRADED, why.reason());
            }
            return Next::Finish(Ok(degraded.answer(&self.head, &why)));
        }
        match last {
            Some((Err(error), _)) if !self.sent && error.outcome().reason().is_local_refusal() => {
                Next::Finish(Err(self.no_backend_error()))
            }
            Some((last, _)) => Next::Finish(last),
            None => Next::Finish(Err(self.no_backend_error())),
        }
    }

    fn no_backend_error(&self) -> Error {
        let tried = self.tried.count_ones() as usize;
        Error::refused(no_backend(), Box::new(NoBackend { tried }), 0)
    }

    /// When hop `hop` is hedged, if hedging is on (the race's rules say whether one is due):
    /// never for a continuation (it goes to the one backend chosen for its prefill) or a body
    /// sent once.
    pub(crate) fn hedgeable(&self) -> bool {
        self.shared.hedging.is_some() && self.body.is_some() && self.continues_from.is_none()
    }

    /// What the request is, as backend `index`'s clocks read it (without clocks or a body: a
    /// whole answer, unsized).
    pub(crate) fn shape(&self, index: usize) -> RequestShape {
        let clocks = self.shared.engines[index].backend.clocks();
        match (clocks, self.body_shape()) {
            (Some(clocks), Some(body)) => body.sized(&clocks.settings().whole),
            _ => RequestShape::new(false, Duration::MAX),
        }
    }

    /// What the buffered body says of the request, read once for every backend's clocks and
    /// the engines of those that send it unchanged (`None` before the body is read, or for a
    /// body sent as it streams).
    fn body_shape(&self) -> Option<BodyShape> {
        let body = self.body.as_ref()?;
        Some(self.shared_body_shape().get_or_read(&self.head.uri, body))
    }

    /// The reading of the body this ledger shares with the engines.
    fn shared_body_shape(&self) -> &SharedBodyShape {
        self.body_shape.get_or_init(SharedBodyShape::default)
    }

    /// The hop on backend `index`, which had waited for its first content since `started`,
    /// lost a race: what it waited teaches its backend's time to first content as a lower bound
    /// (it waited past the hedge's delay, and would have taken longer still).
    pub(crate) fn learn_lost(&self, index: usize, started: Instant) {
        let clocks = self.shared.engines[index].backend.clocks();
        if let (Some(clocks), Some(body)) = (clocks, self.body_shape()) {
            clocks.record_to_first_content(body.streaming(), started.elapsed());
        }
    }

    /// Whether backend `index` is left for a cooldown another replica (or this one) shared;
    /// first shares this replica's, if its breaker of that backend opened since it last did (so
    /// that the fleet learns of it at this replica's next decision, not when the request whose
    /// attempt opened it is done with that backend, after its engine's backoff).
    ///
    /// The breaker of a backend the fleet left opens here too, if it is closed
    /// ([`CircuitBreaker::open_now`](stormguard_breaker::CircuitBreaker::open_now)): when the
    /// cooldown ends, each replica comes back to the backend by its breaker's probes, and the
    /// first probe to fail shares the next cooldown before the others send theirs. A replica
    /// whose breaker stayed closed would send the backend all its traffic again, and find out
    /// by failures of its own, as if it shared nothing.
    fn cooling(&self, index: usize) -> bool {
        let Some(cooldowns) = &self.shared.cooldowns else {
            return false;
        };
        self.share_cooldown_of(index);
        let engine = &self.shared.engines[index];
        if !cooldowns.cooling(engine.backend.name()) {
            return false;
        }
        let breaker = engine.backend.breaker();
        if breaker.open_now() {
            // The fleet's cooldown, not one of this replica's own to share.
            let opened = breaker.snapshot().opened;
            engine.published.fetch_max(opened, Ordering::Relaxed);
        }
        true
    }

    /// If backend `index`'s breaker opened since its cooldown was last shared, shares it, for
    /// as long as the breaker lets no probe through.
    fn share_cooldown_of(&self, index: usize) {
        let Some(cooldowns) = &self.shared.cooldowns else {
            return;
        };
        let engine = &self.shared.engines[index];
        let breaker = engine.backend.breaker();
        if breaker.state() != State::Open {
            return;
        }
        let snapshot = breaker.snapshot();
        let published = engine
            .published
            .fetch_max(snapshot.opened, Ordering::Relaxed);
        if let Some(wait) = snapshot.retry_after
            && published < snapshot.opened
        {
            cooldowns.publish(engine.backend.name(), wait);
        }
    }

    /// Counts a hedge's `event` on the backend at `index`: logged at DEBUG, and counted
    /// (`stormguard.hedges`, feature `metrics`) under that backend's name.
    pub(crate) fn hedged(&self, index: usize, event: &'static str) {
        let name: &Arc<str> = self.shared.engines[index].backend.shared_name();
        tracing::debug!(backend = &**name, event, "hedge");
        FailoverRecorder::hedged(name, event);
    }

    /// The budget every backend shares.
    pub(crate) fn budget(&self) -> &RetryBudget {
        &self.budget
    }
}

/// The `to` of a move to the degraded answer.
const DEGRADED: &str = "degraded";

/// A request moves from backend `from` to `to` for `reason`: logged at DEBUG (the engines log
/// the failures themselves) and counted (feature `metrics`).
fn moved(from: &Arc<str>, to: &str, reason: Reason) {
    tracing::debug!(from = &**from, to, reason = reason.as_str(), "failing over");
    FailoverRecorder::moved(from, to, reason);
}

/// The outcome of a request no backend could take: 503, retry in a second (the backends'
/// first open wait).
fn no_backend() -> Outcome {
    Outcome::fatal(Reason::NoBackend)
        .with_accepted(false)
        .with_retry_after(Some(Duration::from_secs(1)))
}

/// Whether the backend keeps answering 429 to this request: 429 on every attempt, or a 429
/// whose wait is beyond what the request can wait (a Retry-After above the hint policy's
/// maximum, or a wait the deadline cannot fit), so that the engine gave up on it. Such a backend
/// is left for the next at once: its breaker never opens on 429s (no health failure) and its
/// throttle drops nothing at a few requests a second, so nothing else would ever leave it. A
/// wait of its own rate limit beyond its maximum is a local refusal, left as every refusal is.
fn keeps_answering_429(report: &Report) -> bool {
    let waits_too_long = matches!(
        report.gave_up(),
        Some(GiveUpCause::HintTooLong | GiveUpCause::Deadline)
    );
    report.outcome().reason() == Reason::RateLimited
        && (report.rate_limited_throughout() || waits_too_long)
}

/// Whether a hop's failure was the backend's (`answered`: it came with a response): a
/// retryable answer the engine gave up on, or an error it gave up on or could not retry.
fn failed_on_backend(answered: bool, report: &Report) -> bool {
    let outcome = report.outcome();
    if answered {
        return outcome.is_retryable() || !outcome.is_accepted();
    }
    report.gave_up().is_some()
        || outcome.is_retryable()
        || matches!(
            outcome.reason(),
            Reason::BreakerOpen | Reason::Unavailable | Reason::Transport | Reason::Timeout
        )
}
