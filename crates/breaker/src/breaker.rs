//! [`CircuitBreaker`]: the shared state behind the breaker layer and the engine's breaker, and the
//! [`BreakerPermit`] an attempt holds while it is in flight.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderMap;
use stormguard_classify::{GrpcCode, Outcome, Permit, Reason};
use stormguard_numbers::random::RandomSource;
use stormguard_numbers::window::{Age, SlidingWindow, Tagged};
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::{BreakerConfig, BreakerOpen, BulkheadFull, OpenCause, Rejected};

/// Slices of the window: the 10 s default slides in 1 s steps.
const SLICES: usize = 10;

/// The window's counter of verdicts: attempts that came back, or timed out.
const CALLS: usize = 0;
/// The window's counter of health failures.
const FAILURES: usize = 1;
/// The window's counter of answers: attempts that came back, whatever they said.
const ANSWERS: usize = 2;
/// Not a count: the quickest answer of the slice, in milliseconds plus one (0: none yet).
const QUICKEST: usize = 3;

/// How often, at most, an attempt asking for a permit checks for a stall.
const STALL_CHECK_EVERY: Duration = Duration::from_millis(50);

/// Longest wait the breaker schedules (open waits, leases): a day. Settings beyond it are taken
/// as a day, so that no instant overflows.
const LONGEST_WAIT: Duration = Duration::from_secs(86_400);

/// Open waits are stretched by a random factor in `[1, 1 + OPEN_JITTER)`: never shorter than the
/// configured wait or the server's hint, and clients that opened together probe apart.
const OPEN_JITTER: f64 = 0.25;

/// A circuit breaker for one backend, shared by every clone: see the [crate docs](crate) for the
/// algorithm.
///
/// Ask for a [`BreakerPermit`] before each attempt ([`try_acquire`](Self::try_acquire)), and
/// [`record`](BreakerPermit::record) the attempt's [`Outcome`] on it when the attempt ends. The
/// [`BreakerLayer`](crate::BreakerLayer) and the retry engine's `with_breaker` do both.
///
/// Cloning is cheap (an `Arc`). In the closed state, asking and recording take no lock: they
/// read and add to atomic counters. Opening, probing and closing take a short lock. Under
/// `--cfg stormguard_loom` the atomics and the lock are loom's models: `tests/loom.rs` explores
/// every interleaving of racing failures, ratio reads, probe admissions, the bulkhead and a
/// stall's cut.
#[derive(Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

/// Where the breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Attempts go through; the breaker counts how they end.
    Closed,
    /// Attempts are refused locally with [`BreakerOpen`] until the open wait ends.
    Open,
    /// The open wait ended: a few probe attempts go through, the rest are refused; a probe's
    /// success closes the breaker, its failure opens it again.
    HalfOpen,
}

impl State {
    /// A short snake_case name, for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// What the breaker saw, as returned by [`CircuitBreaker::snapshot`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct BreakerSnapshot {
    /// Where the breaker stands.
    pub state: State,
    /// Attempts over the window that came back or timed out (refused or abandoned ones are not
    /// counted).
    pub calls: u64,
    /// Health failures among them.
    pub failures: u64,
    /// Attempts over the window that came back, whatever they said (timeouts are not answers).
    pub answers: u64,
    /// Attempts in flight now.
    pub in_flight: u32,
    /// Probes in flight within their lease now.
    pub probes: u32,
    /// How many times the breaker opened since it was made.
    pub opened: u64,
    /// Why it last opened.
    pub cause: Option<OpenCause>,
    /// While open: how long until the next probe may go.
    pub retry_after: Option<Duration>,
    /// The window the counts cover.
    pub window: Duration,
}

struct Shared {
    config: BreakerConfig,
    window: SlidingWindow<4>,
    random: RandomSource,
    /// Where the nanosecond timestamps below count from.
    origin: Instant,
    /// Set while the breaker is closed: the lock-free path.
    closed: AtomicBool,
    in_flight: AtomicU32,
    /// Health failures in a row (while closed).
    consecutive: AtomicU32,
    /// When the number of attempts in flight last rose from zero.
    busy_since: AtomicU64,
    /// When the latest answer came back.
    last_answer: AtomicU64,
    /// When the next stall check is due.
    next_stall_check: AtomicU64,
    /// Bumped when a stall cuts the attempts in flight; a permit from an older generation is cut.
    generation: AtomicU64,
    cut: Arc<Notify>,
    control: Mutex<Control>,
}

/// The state machine, behind the lock.
struct Control {
    phase: Phase,
    /// Probes that failed since the breaker last closed: each doubles the open wait.
    reopens: u32,
    opened: u64,
    cause: Option<OpenCause>,
    /// Number of the latest opening, which the half-open period after it shares: the failure of
    /// a probe sent before the breaker last opened opens nothing.
    trial: u64,
    /// Number of the latest probe.
    probe_ids: u64,
}

enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        /// Probes in flight: (probe number, end of lease).
        leases: Vec<(u64, Instant)>,
        /// When the next probe may go: probes are spaced a lease apart, divided among the slots.
        next_probe: Instant,
    },
}

/// How an attempt's outcome counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The backend did its part: a success, an answer of the caller's making (4xx), or a rate
    /// limit (the rate limiter's business, not the breaker's).
    Healthy,
    /// A health failure: the backend did not accept the attempt (5xx, 529, a timeout, a
    /// transport error, an aborted stream).
    Failed,
    /// A layer below refused the attempt before it reached the backend: nothing to count.
    Unsent,
}

impl Verdict {
    fn of(outcome: &Outcome) -> Self {
        match outcome.reason() {
            Reason::Throttled
            | Reason::RetryBudgetExhausted
            | Reason::BreakerOpen
            | Reason::BulkheadFull
            | Reason::RateLimitedLocally => Verdict::Unsent,
            Reason::RateLimited | Reason::Grpc(GrpcCode::ResourceExhausted) => Verdict::Healthy,
            _ if outcome.is_success() || outcome.is_accepted() => Verdict::Healthy,
            _ => Verdict::Failed,
        }
    }
}

/// Whether an outcome is something that came back from the backend (a timeout is a silence).
fn is_answer(outcome: &Outcome) -> bool {
    !matches!(
        outcome.reason(),
        Reason::Timeout | Reason::DeadlineExceeded | Reason::Grpc(GrpcCode::DeadlineExceeded)
    )
}

impl CircuitBreaker {
    /// A breaker with the settings of `config`, closed.
    pub fn new(config: BreakerConfig) -> Self {
        let random = RandomSource::from_seed(config.seed());
        Self {
            shared: Arc::new(Shared {
                config,
                window: SlidingWindow::new(config.window(), SLICES),
                random,
                origin: Instant::now(),
                closed: AtomicBool::new(true),
                in_flight: AtomicU32::new(0),
                consecutive: AtomicU32::new(0),
                busy_since: AtomicU64::new(0),
                last_answer: AtomicU64::new(0),
                next_stall_check: AtomicU64::new(0),
                generation: AtomicU64::new(0),
                cut: Arc::new(Notify::new()),
                control: Mutex::new(Control {
                    phase: Phase::Closed,
                    reopens: 0,
                    opened: 0,
                    cause: None,
                    trial: 0,
                    probe_ids: 0,
                }),
            }),
        }
    }

    /// The settings this breaker was made with.
    pub fn config(&self) -> &BreakerConfig {
        &self.shared.config
    }

    /// Asks to send one attempt: a [`BreakerPermit`] to hold while it is in flight, or why not.
    ///
    /// Closed, every attempt gets a permit (unless the bulkhead is full), and a stall is checked
    /// for first (at most every 50 ms). Open, none does until the open wait ends; then, half-open,
    /// probes do, one at a time, a lease apart divided among the probe slots.
    pub fn try_acquire(&self) -> Result<BreakerPermit, Rejected> {
        let shared = &*self.shared;
        let now = Instant::now();
        let role = shared.admit(now).map_err(Rejected::Open)?;
        let in_flight = shared.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Some(max) = shared.config.max_in_flight()
            && in_flight >= max
        {
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            if let Role::Probe { id, .. } = role {
                shared.lock().take_back_probe(id, now);
            }
            return Err(Rejected::Full(BulkheadFull::new(max)));
        }
        if in_flight == 0 {
            shared
                .busy_since
                .store(shared.nanos(now), Ordering::Release);
        }
        Ok(BreakerPermit {
            shared: Some(Arc::clone(&self.shared)),
            started: now,
            role,
            cut: None,
        })
    }

    /// Opens a closed breaker now, for its open wait, as its own failures would have
    /// ([`OpenCause::Told`]); returns whether it did (an open or half-open breaker is left as it
    /// is). For a breaker of a backend that another replica of a fleet saw fail: when its wait
    /// is over, this one comes back to the backend by probes, as that replica does, not with all
    /// its traffic at once.
    pub fn open_now(&self) -> bool {
        let shared = &*self.shared;
        let mut control = shared.lock();
        if !matches!(control.phase, Phase::Closed) {
            return false;
        }
        shared.open(&mut control, Instant::now(), OpenCause::Told, None);
        true
    }

    /// Where the breaker stands now (an open breaker whose wait is over reads as half-open: the
    /// next attempt would be a probe).
    pub fn state(&self) -> State {
        if self.shared.closed.load(Ordering::Acquire) {
            return State::Closed;
        }
        self.shared.lock().state(Instant::now())
    }

    /// The breaker's state and counts.
    pub fn snapshot(&self) -> BreakerSnapshot {
        let shared = &*self.shared;
        let now = Instant::now();
        let epoch = shared.window.epoch(now);
        let control = shared.lock();
        let state = control.state(now);
        let (probes, retry_after) = match &control.phase {
            Phase::Closed => (0, None),
            Phase::Open { until } => (0, Some(until.saturating_duration_since(now))),
            Phase::HalfOpen { leases, next_probe } => {
                let live = leases.iter().filter(|(_, end)| *end > now).count();
                let next = next_probe.saturating_duration_since(now);
                (u32::try_from(live).unwrap_or(u32::MAX), Some(next))
            }
        };
        BreakerSnapshot {
            state,
            calls: shared.window.sum(epoch, CALLS),
            failures: shared.window.sum(epoch, FAILURES),
            answers: shared.window.sum(epoch, ANSWERS),
            in_flight: shared.in_flight.load(Ordering::Acquire),
            probes,
            opened: control.opened,
            cause: control.cause,
            retry_after,
            window: shared.window.span(),
        }
    }
}

impl Default for CircuitBreaker {
    /// A breaker with [`BreakerConfig::default`]: right for an LLM API.
    fn default() -> Self {
        Self::new(BreakerConfig::default())
    }
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("config", &self.shared.config)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Control> {
        // The state machine stays consistent at every step: a panic elsewhere leaves it usable.
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `now` as nanoseconds since the breaker was made.
    fn nanos(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed).unwrap_or(u64::MAX)
    }

    /// Whether an attempt may go now, and as what.
    fn admit(&self, now: Instant) -> Result<Role, BreakerOpen> {
        // The generation before the state: a stall that opens the breaker after this read cuts
        // the attempt, and one that bumped the generation before it had already written `closed`
        // (`open` does it first), so the attempt is refused. Read after `closed`, a stall opening
        // in between would let the attempt in with the new generation: in flight on an open
        // breaker, and never cut.
        let generation = self.generation.load(Ordering::Acquire);
        if self.closed.load(Ordering::Acquire) {
            if !self.stalled(now) {
                return Ok(Role::Call { generation });
            }
            let mut control = self.lock();
            if matches!(control.phase, Phase::Closed) {
                self.open(&mut control, now, OpenCause::Stall, None);
            }
        }
        let mut control = self.lock();
        if matches!(control.phase, Phase::Closed) {
            // Closed again since the check above.
            return Ok(Role::Call {
                generation: self.generation.load(Ordering::Acquire),
            });
        }
        control.admit(now, &self.config)
    }

    /// Whether the backend has been silent, with attempts in flight, for far longer than its
    /// answers before the silence make plausible: longer than the minimum silence, than the
    /// quickest answer of the window that ended with the last answer, and long enough for that
    /// window's answer rate to have promised the configured number of answers (no more answers
    /// can be missed than attempts are in flight).
    ///
    /// The silence runs from the last answer, or from when attempts went out again after none
    /// were in flight. It is judged by the window ending at the last answer (whose answer slots
    /// nothing has written since), so a silence does not drain the rate it is judged by; and only
    /// if that answer came within a window of the attempts going out: after a longer idle spell
    /// there is no recent rate to judge by.
    fn stalled(&self, now: Instant) -> bool {
        let (min_silence, answers_missed) = self.config.stall_detection();
        let in_flight = self.in_flight.load(Ordering::Acquire);
        if !answers_missed.is_finite() || in_flight == 0 {
            return false;
        }
        let at = self.nanos(now);
        let due = self.next_stall_check.load(Ordering::Acquire);
        let next = at.saturating_add(nanos_of(STALL_CHECK_EVERY));
        if at < due
            || self
                .next_stall_check
                .compare_exchange(due, next, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return false;
        }
        let last_answer = self.last_answer.load(Ordering::Acquire);
        let busy_since = self.busy_since.load(Ordering::Acquire);
        let silence = Duration::from_nanos(at.saturating_sub(last_answer.max(busy_since)));
        let span = self.window.span();
        if silence <= min_silence || busy_since.saturating_sub(last_answer) > nanos_of(span) {
            return false;
        }
        let before = self
            .window
            .epoch(self.origin + Duration::from_nanos(last_answer));
        let answers = self.window.sum(before, ANSWERS);
        let promised = silence.as_secs_f64() * answers as f64 / span.as_secs_f64();
        if answers == 0 || promised.min(f64::from(in_flight)) < answers_missed {
            return false;
        }
        self.quickest(before)
            .is_none_or(|quickest| silence > quickest)
    }

    /// The quickest answer over the window ending at `epoch`.
    fn quickest(&self, epoch: u64) -> Option<Duration> {
        (0..SLICES as u64)
            .map_while(|back| epoch.checked_sub(back))
            .map(|slice| self.window.counter(slice, QUICKEST).load().count_at(slice))
            .filter(|&millis| millis > 0)
            .min()
            .map(|millis| Duration::from_millis(u64::from(millis - 1)))
    }

    /// Notes an answer that took `took` in the slice `epoch`, if it is the slice's quickest.
    fn note_quickest(&self, mut epoch: u64, took: Duration) {
        let millis = u32::try_from(took.as_millis())
            .unwrap_or(u32::MAX - 1)
            .min(u32::MAX - 1)
            + 1;
        let counter = self.window.counter(epoch, QUICKEST);
        loop {
            let current = counter.load();
            match current.age(epoch) {
                Age::Current(best) if best != 0 && best <= millis => return,
                Age::Current(_) | Age::Stale => {
                    if counter.swap_if(current, Tagged::new(epoch, millis)) {
                        return;
                    }
                }
                Age::Ahead(later) => epoch = later,
            }
        }
    }

    /// Opens the breaker from the closed or half-open state.
    fn open(&self, control: &mut Control, now: Instant, cause: OpenCause, hint: Option<Duration>) {
        let (base, max) = self.config.open_wait();
        let wait = match hint {
            // The server said when: follow it, up to the longest wait.
            Some(hint) => hint.min(max),
            None => {
                let doublings = 2u32.saturating_pow(control.reopens.min(31));
                base.saturating_mul(doublings).min(max)
            }
        };
        let wait = wait.min(LONGEST_WAIT);
        let wait = wait.mul_f64(1.0 + OPEN_JITTER * self.random.f64());
        control.phase = Phase::Open {
            until: later(now, wait),
        };
        control.opened = control.opened.saturating_add(1);
        control.trial = control.trial.wrapping_add(1);
        control.cause = Some(cause);
        self.closed.store(false, Ordering::Release);
        if cause == OpenCause::Stall && self.config.cancel_on_stall() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.cut.notify_waiters();
        }
    }

    /// Closes the breaker: the window starts over, and so does the growth of the open wait.
    fn close(&self, control: &mut Control, now: Instant) {
        control.phase = Phase::Closed;
        control.reopens = 0;
        self.consecutive.store(0, Ordering::Release);
        self.window.clear(self.window.epoch(now));
        self.last_answer.store(self.nanos(now), Ordering::Release);
        self.closed.store(true, Ordering::Release);
    }

    /// Counts an attempt that ended with `outcome` after `took`, and moves the state machine.
    fn record(&self, role: Role, outcome: &Outcome, took: Duration) {
        let now = Instant::now();
        let verdict = Verdict::of(outcome);
        let answer = verdict != Verdict::Unsent && is_answer(outcome);
        if verdict != Verdict::Unsent {
            let epoch = self.window.epoch(now);
            self.window.add(epoch, CALLS);
            if verdict == Verdict::Failed {
                self.window.add(epoch, FAILURES);
            }
            if answer {
                self.window.add(epoch, ANSWERS);
                self.note_quickest(epoch, took);
                self.last_answer
                    .fetch_max(self.nanos(now), Ordering::AcqRel);
            }
        }
        let closed = self.closed.load(Ordering::Acquire);
        if closed && self.in_a_row(role, verdict) {
            let mut control = self.lock();
            if matches!(control.phase, Phase::Closed) {
                let hint = outcome.retry_after();
                self.open(&mut control, now, OpenCause::ConsecutiveFailures, hint);
            }
            return;
        }
        match (role, verdict) {
            (Role::Probe { id, trial }, _) => {
                let mut control = self.lock();
                control.release(id);
                let half_open = control.state(now) == State::HalfOpen;
                match verdict {
                    // A probe's success closes, even one past its lease.
                    Verdict::Healthy if half_open => self.close(&mut control, now),
                    // A probe answered with a failure opens again, if nothing else did since it
                    // went. A probe's silence (its deadline) is no answer: its slot went to the
                    // next probe when its lease ended.
                    Verdict::Failed if half_open && trial == control.trial && answer => {
                        control.reopens = control.reopens.saturating_add(1);
                        let hint = outcome.retry_after();
                        self.open(&mut control, now, OpenCause::ProbeFailed, hint);
                    }
                    _ => {}
                }
            }
            // Judged on every call, not only failures: 10 failures then 10 successes are half
            // of 20 calls too.
            (Role::Call { .. }, Verdict::Failed | Verdict::Healthy)
                if closed && self.ratio_reached(now) =>
            {
                let mut control = self.lock();
                if matches!(control.phase, Phase::Closed) {
                    // Only a failure's hint says when the backend expects to be back.
                    let hint = outcome.retry_after().filter(|_| verdict == Verdict::Failed);
                    self.open(&mut control, now, OpenCause::Failures, hint);
                }
            }
            (Role::Call { .. }, Verdict::Healthy) if !closed => {
                // An answer from before the breaker opened, arriving once probes may go: the
                // backend answers again.
                let mut control = self.lock();
                if matches!(control.state(now), State::HalfOpen) {
                    self.close(&mut control, now);
                }
            }
            _ => {}
        }
    }

    /// Counts a call's health failures in a row: whether they reached the configured count.
    fn in_a_row(&self, role: Role, verdict: Verdict) -> bool {
        let (Some(limit), Role::Call { .. }) = (self.config.consecutive_failures(), role) else {
            return false;
        };
        match verdict {
            Verdict::Failed => self.consecutive.fetch_add(1, Ordering::AcqRel) + 1 >= limit,
            Verdict::Healthy => {
                self.consecutive.store(0, Ordering::Release);
                false
            }
            Verdict::Unsent => false,
        }
    }

    /// Whether the window holds enough calls, and enough of them failed, to open.
    fn ratio_reached(&self, now: Instant) -> bool {
        let epoch = self.window.epoch(now);
        // Failures first: each is counted as a call before it is counted as a failure, so the
        // calls read next include those of every failure read, however many other threads add
        // in between (read the other way round, calls added meanwhile would be missing, and 20%
        // of failures could read as 50%).
        let failures = self.window.sum(epoch, FAILURES);
        let calls = self.window.sum(epoch, CALLS);
        calls >= u64::from(self.config.min_calls())
            && failures as f64 >= self.config.failure_ratio() * calls as f64
    }

    /// An attempt ended without a verdict (abandoned, or cut by a stall).
    fn leave(&self, role: Role) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Role::Probe { id, .. } = role {
            self.lock().release(id);
        }
    }
}

impl Control {
    /// The state at `now`: an open breaker whose wait is over is half-open.
    fn state(&self, now: Instant) -> State {
        match self.phase {
            Phase::Closed => State::Closed,
            Phase::Open { until } if now < until => State::Open,
            Phase::Open { .. } | Phase::HalfOpen { .. } => State::HalfOpen,
        }
    }

    /// Lets a probe through if the breaker is (or just became) half-open and a slot is free.
    fn admit(&mut self, now: Instant, config: &BreakerConfig) -> Result<Role, BreakerOpen> {
        let cause = self.cause.unwrap_or(OpenCause::Failures);
        if let Phase::Open { until } = self.phase {
            if now < until {
                return Err(BreakerOpen::new(until - now, cause, false));
            }
            self.phase = Phase::HalfOpen {
                leases: Vec::new(),
                next_probe: now,
            };
        }
        let (probes, lease) = config.probes();
        let trial = self.trial;
        let Phase::HalfOpen { leases, next_probe } = &mut self.phase else {
            // Only ever called on an open or half-open breaker.
            return Err(BreakerOpen::new(Duration::ZERO, cause, false));
        };
        leases.retain(|(_, end)| *end > now);
        let slots = usize::try_from(probes).unwrap_or(usize::MAX);
        if leases.len() >= slots || now < *next_probe {
            let free = if leases.len() >= slots {
                leases.iter().map(|(_, end)| *end).min().unwrap_or(now)
            } else {
                now
            };
            let wait = free.max(*next_probe).saturating_duration_since(now);
            return Err(BreakerOpen::new(wait, cause, false));
        }
        self.probe_ids = self.probe_ids.wrapping_add(1);
        let id = self.probe_ids;
        leases.push((id, later(now, lease)));
        *next_probe = later(now, lease / probes);
        Ok(Role::Probe { id, trial })
    }

    /// Frees a probe's slot (if its lease has not ended yet).
    fn release(&mut self, id: u64) {
        if let Phase::HalfOpen { leases, .. } = &mut self.phase {
            leases.retain(|(probe, _)| *probe != id);
        }
    }

    /// Takes back a probe let through at `admitted` that was never sent (the bulkhead was full):
    /// its slot, and its turn, unless another probe went since.
    fn take_back_probe(&mut self, id: u64, admitted: Instant) {
        self.release(id);
        if self.probe_ids == id
            && let Phase::HalfOpen { next_probe, .. } = &mut self.phase
        {
            *next_probe = admitted;
        }
    }
}

/// `now + wait`, for a wait of a day at most (longer ones are taken as a day): no overflow.
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait.min(LONGEST_WAIT)).unwrap_or(now)
}

fn nanos_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// What an attempt was let through as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// An attempt of the closed state, cut if a stall bumps the breaker past its generation.
    Call { generation: u64 },
    /// A half-open probe: its number, and that of the opening it probes after.
    Probe { id: u64, trial: u64 },
}

/// An attempt the breaker let through, following stormguard's admission protocol
/// ([`Permit`](stormguard_classify::Permit)): hold it while the attempt is in flight, then
/// [`record`](stormguard_classify::Permit::record) how it ended. The attempt is counted in the
/// window (a health failure, or not), and the state machine moves: a probe's success closes the
/// breaker, its failure opens it again; a call that leaves the window at its failure ratio opens
/// it.
///
/// Dropped without a record, the attempt counts for nothing (the caller gave up: that says
/// nothing about the backend), and its place in flight, or its probe slot, is freed. While the
/// attempt is in flight, poll [`poll_cut`](Self::poll_cut): it tells when a stall opened the
/// breaker and the attempt should be dropped.
pub struct BreakerPermit {
    /// `None` once the permit is settled.
    shared: Option<Arc<Shared>>,
    started: Instant,
    role: Role,
    /// Registered for the stall's cut, on the first poll.
    cut: Option<Pin<Box<OwnedNotified>>>,
}

impl BreakerPermit {
    /// Whether this attempt is a half-open probe.
    pub fn is_probe(&self) -> bool {
        matches!(self.role, Role::Probe { .. })
    }

    /// Ready with the error for the attempt when a stall opened the breaker since the attempt was
    /// let through (and the breaker cuts attempts on a stall): drop the attempt then. The permit
    /// is settled by it: recording afterwards does nothing.
    ///
    /// Pending otherwise, with `cx`'s waker registered for the stall. Probes are never cut.
    pub fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<BreakerOpen> {
        let Role::Call { generation } = self.role else {
            return Poll::Pending;
        };
        let Some(shared) = &self.shared else {
            return Poll::Pending;
        };
        if !shared.config.cancel_on_stall() || !shared.config.stall_detection().1.is_finite() {
            return Poll::Pending;
        }
        loop {
            let cut = self
                .cut
                .get_or_insert_with(|| Box::pin(Arc::clone(&shared.cut).notified_owned()));
            // Registered before the generation is read: a stall after the read wakes this task.
            cut.as_mut().enable();
            if shared.generation.load(Ordering::Acquire) != generation {
                break;
            }
            if cut.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Woken: read the generation again with a fresh registration.
            self.cut = None;
        }
        let shared = Arc::clone(shared);
        let retry_after = match &shared.lock().phase {
            Phase::Open { until } => until.saturating_duration_since(Instant::now()),
            Phase::Closed | Phase::HalfOpen { .. } => Duration::ZERO,
        };
        self.settle();
        Poll::Ready(BreakerOpen::new(retry_after, OpenCause::Stall, true))
    }

    /// Ends the permit without a verdict.
    fn settle(&mut self) {
        self.cut = None;
        if let Some(shared) = self.shared.take() {
            shared.leave(self.role);
        }
    }
}

impl Permit for BreakerPermit {
    fn record(mut self, outcome: &Outcome, _headers: &HeaderMap) {
        if let Some(shared) = self.shared.take() {
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            shared.record(self.role, outcome, self.started.elapsed());
        }
    }
}

impl Drop for BreakerPermit {
    fn drop(&mut self) {
        self.settle();
    }
}

impl fmt::Debug for BreakerPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerPermit")
            .field("probe", &self.is_probe())
            .field("started", &self.started)
            .field("settled", &self.shared.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason a classifier gives, as it gives it, and how the breaker counts it: what the
    /// backend did not accept is a failure, rate limits and the caller's mistakes are healthy
    /// answers, local refusals were never sent, and timeouts are failures but no answers.
    #[test]
    fn every_reason_counts_as_the_docs_say() {
        let (retryable, fatal) = (Outcome::retryable, Outcome::fatal);
        let local = |reason| Outcome::fatal(reason).with_accepted(false);
        let cases = [
            (Outcome::success(), Verdict::Healthy, true),
            (retryable(Reason::RateLimited), Verdict::Healthy, true),
            (
                retryable(Reason::Grpc(GrpcCode::ResourceExhausted)),
                Verdict::Healthy,
                true,
            ),
            (fatal(Reason::QuotaExhausted), Verdict::Healthy, true),
            (fatal(Reason::ContextTooLong), Verdict::Healthy, true),
            (fatal(Reason::ContentFiltered), Verdict::Healthy, true),
            (fatal(Reason::BadRequest), Verdict::Healthy, true),
            (fatal(Reason::Unauthorized), Verdict::Healthy, true),
            (fatal(Reason::Forbidden), Verdict::Healthy, true),
            (fatal(Reason::NotFound), Verdict::Healthy, true),
            (fatal(Reason::PayloadTooLarge), Verdict::Healthy, true),
            (fatal(Reason::Unprocessable), Verdict::Healthy, true),
            (fatal(Reason::ClientError), Verdict::Healthy, true),
            (
                retryable(Reason::Conflict).with_accepted(true),
                Verdict::Healthy,
                true,
            ),
            (fatal(Reason::ServerError), Verdict::Healthy, true),
            (retryable(Reason::Overloaded), Verdict::Failed, true),
            (retryable(Reason::Unavailable), Verdict::Failed, true),
            (retryable(Reason::ServerError), Verdict::Failed, true),
            (retryable(Reason::Transport), Verdict::Failed, true),
            (
                retryable(Reason::Grpc(GrpcCode::Unavailable)),
                Verdict::Failed,
                true,
            ),
            (local(Reason::ServerSaidNoRetry), Verdict::Failed, true),
            (retryable(Reason::Other), Verdict::Failed, true),
            (retryable(Reason::Timeout), Verdict::Failed, false),
            (local(Reason::DeadlineExceeded), Verdict::Failed, false),
            (
                retryable(Reason::Grpc(GrpcCode::DeadlineExceeded)),
                Verdict::Failed,
                false,
            ),
            (local(Reason::Throttled), Verdict::Unsent, true),
            (local(Reason::RetryBudgetExhausted), Verdict::Unsent, true),
            (local(Reason::BreakerOpen), Verdict::Unsent, true),
            (local(Reason::BulkheadFull), Verdict::Unsent, true),
            (local(Reason::RateLimitedLocally), Verdict::Unsent, true),
        ];
        for (outcome, verdict, answer) in cases {
            assert_eq!(Verdict::of(&outcome), verdict, "{outcome}");
            assert_eq!(is_answer(&outcome), answer, "{outcome}");
        }
    }

    /// The quickest answer is the least over the window's slices, kept to the millisecond (an
    /// answer in under a millisecond counts as 0 ms, not as none), and leaves the window with its
    /// slice; absurd durations saturate.
    #[test]
    fn the_quickest_answer_is_the_windows_least_and_leaves_with_its_slice() {
        let breaker = CircuitBreaker::default();
        let shared = &*breaker.shared;
        assert_eq!(shared.quickest(0), None);
        shared.note_quickest(0, Duration::from_secs(75));
        shared.note_quickest(0, Duration::from_millis(70_400));
        shared.note_quickest(0, Duration::from_secs(80));
        assert_eq!(shared.quickest(0), Some(Duration::from_millis(70_400)));
        shared.note_quickest(3, Duration::from_secs(72));
        assert_eq!(shared.quickest(3), Some(Duration::from_millis(70_400)));
        assert_eq!(shared.quickest(9), Some(Duration::from_millis(70_400)));
        assert_eq!(shared.quickest(10), Some(Duration::from_secs(72)));
        shared.note_quickest(12, Duration::from_micros(300));
        assert_eq!(shared.quickest(12), Some(Duration::ZERO));
        assert_eq!(shared.quickest(13), Some(Duration::ZERO));
        assert_eq!(shared.quickest(22), None);
        shared.note_quickest(30, Duration::MAX);
        let saturated = Duration::from_millis(u64::from(u32::MAX - 1));
        assert_eq!(shared.quickest(30), Some(saturated));
    }
}
