//! The simulated provider: a tower `Service` with a fixed number of GPU slots and a queue.
//!
//! # Model
//! - **Slots.** The provider runs at most `capacity` requests at once. A request takes the slot
//!   that frees first (first come, first served); its start time is known when it arrives, so the
//!   model needs no task of its own, only a timer for the answer, and costs O(1) per attempt
//!   (slot release times are kept per millisecond in a calendar).
//! - **Service time.** Log-normal around the median of the current health (800 ms healthy,
//!   2500 ms degraded in the `seed` scenario).
//! - **Errors.** An admitted request fails with 500 with the current error rate, at a uniformly
//!   random point of its service time (it held the slot until then).
//! - **Overload.** When every slot is busy, requests wait: latency grows. Past capacity the
//!   provider also thrashes: a request admitted while in-flight work (running + queued) exceeds
//!   the slots by a share `x` fails with 503 at the end of its service time with probability
//!   `x / overload_error_span` (all of them at 25% over): errors rise sharply, and the failed work
//!   still cost its slot. A request that would wait longer than `max_queue_wait` is shed at once
//!   with 529.
//! - **Abandoned work.** A client that times out drops its response future, but the request keeps
//!   its slot until its service time is over: prefill cannot be cancelled. This is what makes
//!   overload *metastable*: once queue waits exceed clients' timeouts, every answer arrives after
//!   its caller left, goodput is zero while the provider is fully busy, and retried load keeps it
//!   that way for as long as it stays above capacity. The field's provider fell over this way.
//! - **Capacity steps** (the `capacity` scenario): the median service time steps up with the
//!   slots unchanged, then the slots are cut (the first to free are taken away; the work on them
//!   runs to its end). Its queue holds `max_queue` requests at most: with every slot busy and the
//!   queue full, an attempt is answered 429 at once, without `Retry-After`, and costs no slot.
//! - **Outage.** Every attempt gets 503 at once; requests in flight when it starts fail with 503
//!   at that moment and free their slots.
//! - **Refusing** (the `balance-fleet` scenario's dying deployment). Every attempt that arrives
//!   in the window gets 503 at once; requests in flight when it starts are served to the end.
//! - **Quota.** A token bucket (`per_sec`, one second of burst) in front of the slots; requests
//!   without a token get 429 with `Retry-After` at once and cost no slot.
//! - **Quota of requests and tokens a minute** (the `burst` scenario), enforced per second as
//!   providers do (OpenAI's documentation calls it quantization: 60,000 requests a minute may be
//!   enforced as 1,000 a second): one token bucket per dimension, refilled continuously at the
//!   quota / 60 a second and holding one second's worth, full at the start. A request is admitted
//!   when both hold what it weighs, 1 request and its tokens (prompt and `max_tokens`, as OpenAI
//!   counts a request when it admits it, read from [`TOKENS`]), and takes both; otherwise it gets
//!   429 at once, costs no slot, and its `Retry-After` is the time until both would hold it, in
//!   whole seconds rounded up (at least 1 s: the bucket refills within one). The levels are exact
//!   (integers), so that a client limit configured with the same numbers never meets a 429 from
//!   rounding.
//!
//!   Every answer (200, 429 and errors alike, as OpenAI's) carries OpenAI's headers, computed
//!   when the attempt is admitted or refused: `x-ratelimit-limit-{requests,tokens}` (the quota a
//!   minute), `x-ratelimit-remaining-{requests,tokens}` (the minute's quota less what the bucket
//!   is short of full) and `x-ratelimit-reset-{requests,tokens}` (a Go duration, `6ms`: the time
//!   until the bucket is full again). One request from a full bucket thus reads `9999` and `6ms`
//!   on a quota of 10,000 a minute, as OpenAI's do. Like OpenAI's, they describe the minute: the
//!   per-second enforcement does not show in them, `remaining` never falls below the minute's
//!   quota less one second's worth (9,833 of 10,000), and a client can meet a 429 while they say
//!   thousands are left. What a client learns from them is the limits.
//! - **Black hole.** The provider accepts connections and never answers: an attempt that arrives
//!   in the window hangs until its client drops it, and costs no slot (the provider lost it);
//!   requests in flight when it starts are lost the same way and free their slots at that moment.
//!   Attempts that arrive after the window are answered as usual.
//! - **Outage, then black hole** (the `failover` scenario's primary): the outage for the first
//!   half of the window (work in flight when it starts fails with 503 then), the black hole for
//!   the second. A second provider (the scenario's [`secondary`](crate::scenario::Scenario::secondary))
//!   is another model of its own, healthy throughout; [`crate::router`] sends it its requests.
//! - **Streams** (the `streams` scenario): a success is streamed as `text/event-stream`
//!   ([`crate::event_stream`]): its head and opening chunk go out when the provider starts on the
//!   request, then one content event every 100 ms for its service time, and it holds its slot
//!   until it ends. In the fault window a share of the streams fails with an error event when the
//!   first content was due (the slot is free then), and a share is cut after some content (a
//!   connection reset, the slot free then); the provider counts both, and, for a stream that
//!   failed before content, whether another attempt of the request followed. A request whose
//!   last message is the assistant's (a continuation's prefill) is answered from where the
//!   prefill ends, as a real model goes on from it ([`crate::event_stream`]'s continuation); it
//!   is otherwise an attempt like any other (its own service time, the same faults).
//! - **Silence and slow first tokens** (the `silent` scenario's primary): its streams start
//!   after a drawn wait ([`StreamStart`]: the head 200 ms after the provider starts on the
//!   request, the first content event 300 ms after the head, at the median). In the fault window a share of the attempts gets no head for the fault's silence
//!   (20 s), holding its slot all along (a stuck replica), and is then answered as usual; a
//!   share of the streams waits 10 s to 20 s after its head for its first content event. The
//!   provider counts both.
//! - **Open attempts.** Apart from the provider's own load, the model counts the attempts the
//!   clients hold open: sent, and not yet answered, dropped (timed out) or cut. A black hole
//!   frees nothing when a client drops an attempt, but the client's connection is gone.
//!
//! Each request carries its logical id in [`REQUEST_ID`], so the provider can count retries and
//! check that a retry does not come back before the `Retry-After` it was given.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use stormguard::classify::headers::{
    X_RATELIMIT_LIMIT_REQUESTS, X_RATELIMIT_LIMIT_TOKENS, X_RATELIMIT_REMAINING_REQUESTS,
    X_RATELIMIT_REMAINING_TOKENS, X_RATELIMIT_RESET_REQUESTS, X_RATELIMIT_RESET_TOKENS,
};
use tokio::time::{Instant, Sleep};
use tower::Service;

use crate::event_stream::{ErrorForm, EventStream, StreamFate, StreamPlan, first_token};
use crate::json_body::{ERROR_BODY, OK_BODY, OVERLOADED_BODY, RATE_LIMITED_BODY, UNAVAILABLE_BODY};
use crate::scenario::{FaultKind, Scenario, StreamShape, StreamStart};

/// Request header carrying the logical request's id (the same on every attempt).
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-storm-request-id");

/// Request header carrying the request's weight in tokens (prompt and `max_tokens`), which the
/// provider counts against a token quota. Its body says the same to a client that weighs it (see
/// `sim`); the header spares the provider parsing it.
pub(crate) const TOKENS: HeaderName = HeaderName::from_static("x-storm-tokens");

/// Status the provider sheds with when its queue is full (Anthropic's "overloaded").
pub(crate) const STATUS_OVERLOADED: u16 = 529;

/// Resolution of the provider's fine-grained counts ([`BackendStats::fine`]): 100 ms, ten times
/// finer than the per-second buckets, to time how fast a client cuts its traffic.
pub const FINE_BUCKET: Duration = Duration::from_millis(100);

/// Ids above this are not tracked per request (a bound on memory, far above any run).
const MAX_TRACKED_IDS: usize = 1 << 27;

/// What the provider did with one second of attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Attempts that arrived.
    pub attempts: u64,
    /// Attempts whose logical request had been seen before.
    pub retries: u64,
    /// Attempts that found every slot busy (they waited or were shed).
    pub delayed: u64,
    /// Attempts shed with 529.
    pub shed: u64,
    /// Attempts answered 200.
    pub ok: u64,
    /// Attempts answered 429 (Too Many Requests).
    pub rate_limited: u64,
    /// Attempts sent while another attempt of the same request was still open (see
    /// [`BackendStats::hedges`]).
    pub hedges: u64,
}

/// What the provider saw in one [`FINE_BUCKET`] (100 ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FineBucket {
    /// Attempts that arrived (measured ones, as in [`Bucket`]).
    pub attempts: u64,
    /// Most attempts open at once (see [`BackendStats::peak_open`]).
    pub peak_open: u64,
}

/// Everything the provider counted during a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BackendStats {
    /// One entry per second of the run, by arrival time of the attempt.
    pub buckets: Vec<Bucket>,
    /// One entry per [`FINE_BUCKET`] (100 ms) of the run.
    pub fine: Vec<FineBucket>,
    /// Most requests in flight (running or queued) at once.
    pub peak_in_flight: u64,
    /// Most attempts open at once, client side: sent and not yet answered, dropped or cut (the
    /// connections the clients hold). Every attempt counts, measured or not.
    pub peak_open: u64,
    /// Retries that arrived before the `Retry-After` their request was given had passed.
    pub early_retries: u64,
    /// Attempts that were retries of a request already seen (hedges among them).
    pub retries: u64,
    /// Attempts sent while another attempt of the same request was still open, client side (not
    /// yet answered, dropped or ended): hedges, whoever sent them. A retry sent after its
    /// request's attempt failed is none.
    pub hedges: u64,
    /// All attempts.
    pub attempts: u64,
    /// Attempts answered 429 (Too Many Requests).
    pub rate_limited: u64,
    /// Streams that failed with an error event before any content (see
    /// [`FaultKind::StreamErrors`]).
    pub streams_failed_before_content: u64,
    /// Of those, the ones another attempt of the same request followed (a retry, or a restart).
    pub streams_failed_retried: u64,
    /// Streams cut after some content.
    pub streams_cut: u64,
    /// Attempts kept silent, without a head for the fault's silence (see [`FaultKind::Silent`]).
    pub silent: u64,
    /// Streams slow to their first content event: drawn in the slow tail of their start
    /// ([`StreamStart::slow`]), or as late as the slow tail of a [`FaultKind::Silent`] fault's
    /// shortest wait (10 s) after their head, or later.
    pub slow_first_tokens: u64,
    /// Attempts that arrived in each millisecond of the fault window, from its start, where the
    /// provider is dead in it ([`FaultKind::is_dead`]): what reached it after any instant of its
    /// fault (the balance-fleet scenario counts them from when a replica saw it die). Empty for
    /// the other faults.
    pub fault_attempts_ms: Vec<u64>,
}

impl BackendStats {
    fn bucket(&mut self, second: usize) -> &mut Bucket {
        if self.buckets.len() <= second {
            self.buckets.resize(second + 1, Bucket::default());
        }
        &mut self.buckets[second]
    }

    /// The counts of several providers taken as one (the deployments of a balance scenario):
    /// every count and bucket summed; the peaks (in flight, open) summed too, the most the
    /// providers together could have held at once.
    pub(crate) fn merged(all: &[BackendStats]) -> BackendStats {
        let mut merged = BackendStats::default();
        for stats in all {
            for (second, bucket) in stats.buckets.iter().enumerate() {
                let sum = merged.bucket(second);
                sum.attempts += bucket.attempts;
                sum.retries += bucket.retries;
                sum.delayed += bucket.delayed;
                sum.shed += bucket.shed;
                sum.ok += bucket.ok;
                sum.rate_limited += bucket.rate_limited;
                sum.hedges += bucket.hedges;
            }
            if merged.fine.len() < stats.fine.len() {
                merged.fine.resize(stats.fine.len(), FineBucket::default());
            }
            for (sum, fine) in merged.fine.iter_mut().zip(&stats.fine) {
                sum.attempts += fine.attempts;
                sum.peak_open += fine.peak_open;
            }
            merged.peak_in_flight += stats.peak_in_flight;
            merged.peak_open += stats.peak_open;
            merged.early_retries += stats.early_retries;
            merged.retries += stats.retries;
            merged.hedges += stats.hedges;
            merged.attempts += stats.attempts;
            merged.rate_limited += stats.rate_limited;
            merged.streams_failed_before_content += stats.streams_failed_before_content;
            merged.streams_failed_retried += stats.streams_failed_retried;
            merged.streams_cut += stats.streams_cut;
            merged.silent += stats.silent;
            merged.slow_first_tokens += stats.slow_first_tokens;
        }
        merged
    }
}

/// The provider's answer to one attempt, decided when it arrives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Decision {
    /// Status of the answer.
    pub status: StatusCode,
    /// When the answer is sent, in microseconds from the start of the run; `None`: never (a
    /// black hole swallowed the attempt, whose status is then 504, what a proxy would say).
    pub respond_at_us: Option<u64>,
    /// `Retry-After` sent with the answer.
    pub retry_after: Option<Duration>,
    /// Whether the attempt found every slot busy (it waited, or was shed).
    pub queued: bool,
    /// What the answer's rate-limit headers say, under a quota of requests and tokens a minute.
    pub rate_limit: Option<RateLimitState>,
    /// A success streamed as `text/event-stream` (where the scenario streams): the stream, which
    /// starts at `respond_at_us`.
    pub stream: Option<StreamPlan>,
    /// Whether the provider kept the attempt silent: no head for the fault's silence
    /// ([`FaultKind::Silent`]).
    pub silent: bool,
    /// Whether its stream is slow to its first content event: as late as the slow tail of a
    /// [`FaultKind::Silent`] fault's shortest wait, or later.
    pub slow_first_token: bool,
}

impl Decision {
    /// An answer sent at once, at `now_us`, by a provider that gave the attempt no slot.
    fn at_once(now_us: u64, status: StatusCode, retry_after: Option<Duration>) -> Decision {
        Decision {
            status,
            respond_at_us: Some(now_us),
            retry_after,
            queued: false,
            rate_limit: None,
            stream: None,
            silent: false,
            slow_first_token: false,
        }
    }
}

/// One dimension of a quota as the provider's headers state it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuotaState {
    /// The quota a minute (`x-ratelimit-limit-*`).
    pub limit: u64,
    /// The minute's quota less what the bucket is short of full (`x-ratelimit-remaining-*`).
    pub remaining: u64,
    /// How long until the bucket is full again (`x-ratelimit-reset-*`).
    pub reset: Duration,
}

/// The quota of requests and tokens a minute as an answer's headers state it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RateLimitState {
    /// Requests.
    pub requests: QuotaState,
    /// Tokens.
    pub tokens: QuotaState,
}

/// Parts of a unit a [`QuotaBucket`] counts in: 60,000,000, so that a microsecond refills exactly
/// `per_minute` parts.
const PARTS_PER_UNIT: u64 = 60_000_000;

/// One dimension of a quota a minute (requests, or tokens), enforced per second: a token bucket
/// refilled continuously at `per_minute` / 60 units a second, holding one second's worth. Exact:
/// its level counts [`PARTS_PER_UNIT`]ths of a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QuotaBucket {
    per_minute: u64,
    /// What the bucket holds, in parts.
    level: u64,
    /// When `level` was brought up to date, microseconds from the start.
    at_us: u64,
}

impl QuotaBucket {
    /// A full bucket of `per_minute` units a minute (at least 1).
    fn full(per_minute: u32) -> QuotaBucket {
        let mut bucket = QuotaBucket {
            per_minute: u64::from(per_minute.max(1)),
            level: 0,
            at_us: 0,
        };
        bucket.level = bucket.capacity();
        bucket
    }

    /// One second's worth, in parts: `per_minute / 60` units.
    fn capacity(&self) -> u64 {
        self.per_minute.saturating_mul(1_000_000)
    }

    fn refill(&mut self, now_us: u64) {
        let elapsed = now_us.saturating_sub(self.at_us);
        self.level = self
            .level
            .saturating_add(elapsed.saturating_mul(self.per_minute))
            .min(self.capacity());
        self.at_us = self.at_us.max(now_us);
    }

    /// What `units` need, in parts: a request heavier than one second's worth needs a full bucket
    /// (and empties it).
    fn need(&self, units: u64) -> u64 {
        units.saturating_mul(PARTS_PER_UNIT).min(self.capacity())
    }

    /// Microseconds until the bucket holds `units` (0: it does now).
    fn wait_us(&self, units: u64) -> u64 {
        self.need(units)
            .saturating_sub(self.level)
            .div_ceil(self.per_minute)
    }

    fn take(&mut self, units: u64) {
        self.level = self.level.saturating_sub(self.need(units));
    }

    /// What the headers say now.
    fn state(&self) -> QuotaState {
        let short = self.capacity() - self.level.min(self.capacity());
        QuotaState {
            limit: self.per_minute,
            remaining: self
                .per_minute
                .saturating_sub(short.div_ceil(PARTS_PER_UNIT)),
            reset: Duration::from_micros(short.div_ceil(self.per_minute)),
        }
    }
}

/// A quota of requests and tokens a minute, enforced per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProviderQuota {
    requests: QuotaBucket,
    tokens: QuotaBucket,
}

impl ProviderQuota {
    /// Admits a request of `tokens` at `now_us` (taking from both buckets), or says how long
    /// until both would hold it.
    fn admit(&mut self, now_us: u64, tokens: u64) -> Result<(), Duration> {
        self.requests.refill(now_us);
        self.tokens.refill(now_us);
        let wait = self.requests.wait_us(1).max(self.tokens.wait_us(tokens));
        if wait > 0 {
            return Err(Duration::from_micros(wait));
        }
        self.requests.take(1);
        self.tokens.take(tokens);
        Ok(())
    }

    fn state(&self) -> RateLimitState {
        RateLimitState {
            requests: self.requests.state(),
            tokens: self.tokens.state(),
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Track {
    attempts: u32,
    /// Its attempts open now, client side.
    open: u32,
    /// Whether the last attempt's stream failed before any content.
    failed_before_content: bool,
    /// Microseconds from the start before which a retry is early (0: no hint given).
    hinted_until_us: u64,
}

/// The provider's state, advanced by [`Model::admit_weighing`] one attempt at a time.
///
/// Times are microseconds from the start of the run; the model never reads a clock itself,
/// which keeps it testable without a runtime.
pub(crate) struct Model {
    scenario: Scenario,
    rng: SmallRng,
    /// When each slot frees, per millisecond.
    slots: Calendar,
    /// When each admitted request ends, per millisecond (to count requests in flight).
    ends: Calendar,
    tokens: f64,
    tokens_at_us: u64,
    /// The quota of requests and tokens a minute, if the provider has one.
    quota: Option<ProviderQuota>,
    requests: Vec<Track>,
    stats: BackendStats,
    /// Attempts of requests with this id or above are served but not counted.
    counted_ids: Option<usize>,
    /// Attempts open now, client side.
    open: u64,
}

impl Model {
    /// A provider for `scenario`, all slots free at time zero.
    pub fn new(scenario: &Scenario) -> Model {
        let capacity = scenario.capacity.max(1) as usize;
        let burst = match scenario.fault.kind {
            FaultKind::Quota { per_sec, .. } => per_sec,
            _ => 0.0,
        };
        Model {
            scenario: scenario.clone(),
            rng: SmallRng::seed_from_u64(scenario.seed ^ 0x5eed_bac0_e7d0_0001),
            slots: Calendar::with_events_at_zero(capacity),
            ends: Calendar::default(),
            tokens: burst,
            tokens_at_us: micros(scenario.fault.start),
            quota: scenario.provider_quota().map(|quota| ProviderQuota {
                requests: QuotaBucket::full(quota.requests_per_minute),
                tokens: QuotaBucket::full(quota.tokens_per_minute),
            }),
            requests: Vec::new(),
            stats: BackendStats::default(),
            counted_ids: None,
            open: 0,
        }
    }

    /// What the provider has counted so far.
    pub(crate) fn stats(&self) -> &BackendStats {
        &self.stats
    }

    /// From now on, count only attempts of requests whose id is below `id` (the rest are load
    /// that keeps the provider busy while the measured requests finish).
    pub(crate) fn count_ids_below(&mut self, id: u64) {
        self.counted_ids = Some(usize::try_from(id).unwrap_or(usize::MAX));
    }

    /// Requests running or queued at `now_us`.
    pub(crate) fn in_flight(&mut self, now_us: u64) -> u64 {
        self.ends.discard_through(ms_floor(now_us))
    }

    /// Attempts open now, client side: admitted and not [closed](Model::close) yet.
    #[cfg(test)]
    pub fn open(&self) -> u64 {
        self.open
    }

    /// The client is done with an attempt of request `id` at `now_us`: it was answered, dropped
    /// or cut.
    pub(crate) fn close(&mut self, now_us: u64, id: Option<usize>) {
        if let Some(track) = id.and_then(|id| self.requests.get_mut(id)) {
            track.open = track.open.saturating_sub(1);
        }
        self.step_open(now_us, false);
    }

    /// One attempt more (`up`) or fewer open at `now_us`; returns the fine bucket of `now_us`.
    fn step_open(&mut self, now_us: u64, up: bool) -> &mut FineBucket {
        let before = self.open;
        self.open = if up {
            before + 1
        } else {
            before.saturating_sub(1)
        };
        self.stats.peak_open = self.stats.peak_open.max(self.open);
        let index = usize::try_from(now_us / micros(FINE_BUCKET)).unwrap_or(usize::MAX);
        let fine = &mut self.stats.fine;
        if fine.len() <= index {
            // The buckets since the last step held `before` throughout.
            let carried = FineBucket {
                attempts: 0,
                peak_open: before,
            };
            fine.resize(index + 1, carried);
        }
        let bucket = &mut fine[index];
        bucket.peak_open = bucket.peak_open.max(before).max(self.open);
        bucket
    }

    /// [`admit_weighing`](Model::admit_weighing) an attempt that weighs no tokens.
    #[cfg(test)]
    pub(crate) fn admit(&mut self, now_us: u64, id: Option<usize>) -> Decision {
        self.admit_weighing(now_us, id, 0)
    }

    /// Decide the answer to an attempt of logical request `id` arriving at `now_us`, which weighs
    /// `tokens` against a token quota; the attempt is open until [`close`](Model::close)d.
    pub(crate) fn admit_weighing(
        &mut self,
        now_us: u64,
        id: Option<usize>,
        tokens: u64,
    ) -> Decision {
        let counted = match (self.counted_ids, id) {
            (Some(limit), Some(id)) => id < limit,
            (Some(_), None) => false,
            (None, _) => true,
        };
        let second = (now_us / 1_000_000) as usize;
        self.step_open(now_us, true).attempts += u64::from(counted);
        if counted {
            self.stats.attempts += 1;
            self.stats.bucket(second).attempts += 1;
            self.track(now_us, second, id);
            self.count_in_fault(now_us);
        }
        let mut decision = self.decide(now_us, id, tokens);
        decision.rate_limit = self.quota.as_ref().map(ProviderQuota::state);
        if counted && let Some(stream) = decision.stream {
            self.count_stream(stream.fate, id);
        }
        if counted {
            self.stats.silent += u64::from(decision.silent);
            self.stats.slow_first_tokens += u64::from(decision.slow_first_token);
            let limited = decision.status == StatusCode::TOO_MANY_REQUESTS;
            self.stats.rate_limited += u64::from(limited);
            let bucket = self.stats.bucket(second);
            bucket.delayed += u64::from(decision.queued);
            bucket.shed += u64::from(decision.status.as_u16() == STATUS_OVERLOADED);
            bucket.ok += u64::from(decision.status == StatusCode::OK);
            bucket.rate_limited += u64::from(limited);
        }
        let in_flight = self.in_flight(now_us);
        self.stats.peak_in_flight = self.stats.peak_in_flight.max(in_flight);
        decision
    }

    fn decide(&mut self, now_us: u64, id: Option<usize>, tokens: u64) -> Decision {
        if let Some(refusal) = self.refuse(now_us, id, tokens) {
            return refusal;
        }
        let slots = self.scenario.slots_at(Duration::from_micros(now_us)).max(1);
        // Slots taken away go with the first to free: the work on them runs to its end.
        while self.slots.pending > u64::from(slots) {
            self.slots.take_earliest();
        }
        let in_flight = self.in_flight(now_us);
        if let Some(queue) = self.scenario.max_queue
            && in_flight >= u64::from(slots) + u64::from(queue)
        {
            return Decision::at_once(now_us, StatusCode::TOO_MANY_REQUESTS, None);
        }
        let load = in_flight as f64 / f64::from(slots.max(1));
        let max_wait = micros(self.scenario.max_queue_wait);
        let Some(earliest) = self.slots.earliest() else {
            return Decision::at_once(now_us, overloaded(), None);
        };
        let start = (earliest as u64).saturating_mul(1_000).max(now_us);
        let queued = start > now_us;
        if start - now_us > max_wait {
            return Decision {
                queued,
                ..Decision::at_once(now_us, overloaded(), None)
            };
        }

        // A silent attempt holds its slot from `start`, and is served after the silence.
        let silence = self.silence(Duration::from_micros(now_us));
        let served = start.saturating_add(silence);
        let (mut status, mut end, mut stream) = self.serve(now_us, served, load);
        let mut slot_free = end;
        let mut respond_at_us = Some(end);
        let fault = self.scenario.fault;
        let crash = micros(fault.start);
        if fault.kind.loses_in_flight() && now_us < crash && crash < end {
            // In flight when the provider dies: lost, and its slot with it. A stream whose head
            // goes out before an outage is reset then; anything else fails then (an outage) or
            // hangs (a black hole).
            end = crash;
            slot_free = start.max(crash);
            let refuses = fault.refuses_at(fault.start);
            let started = stream.as_mut().filter(|plan| {
                refuses && status == StatusCode::OK && served + micros(plan.head) < crash
            });
            (status, respond_at_us) = match (started, fault.kind) {
                (Some(plan), _) => {
                    let head_at = served + micros(plan.head);
                    plan.fate = StreamFate::LostAt(Duration::from_micros(crash - head_at));
                    (status, respond_at_us)
                }
                (None, FaultKind::Outage | FaultKind::OutageThenBlackhole) => {
                    (StatusCode::SERVICE_UNAVAILABLE, Some(crash))
                }
                (None, _) => (StatusCode::GATEWAY_TIMEOUT, None),
            };
        }
        self.slots.take_earliest();
        self.slots.add(ms_ceil(slot_free));
        self.ends.add(ms_ceil(end));
        // A stream's head goes out when the provider starts on it, or its drawn wait later.
        let stream = stream.filter(|_| status == StatusCode::OK);
        if let Some(plan) = stream {
            respond_at_us = Some(served.saturating_add(micros(plan.head)));
        }
        Decision {
            status,
            respond_at_us,
            retry_after: None,
            queued,
            rate_limit: None,
            stream,
            silent: silence > 0,
            slow_first_token: stream.is_some_and(|plan| self.is_slow(&plan)),
        }
    }

    /// How long the provider keeps an attempt arriving at `at` silent, in microseconds: the
    /// fault's silence for a share of the attempts in a [`FaultKind::Silent`] window, else 0
    /// (and nothing drawn).
    fn silence(&mut self, at: Duration) -> u64 {
        let fault = self.scenario.fault;
        match fault.kind {
            FaultKind::Silent {
                silent, silence, ..
            } if fault.contains(at) && self.rng.random::<f64>() < silent => micros(silence),
            _ => 0,
        }
    }

    /// Whether `plan`'s first content event was drawn in the slow tail of its start, or comes
    /// as late as the slow tail of a [`FaultKind::Silent`] fault's shortest wait after its head,
    /// or later (a healthy one, at 300 ms at the median, never does).
    fn is_slow(&self, plan: &StreamPlan) -> bool {
        if plan.slow {
            return true;
        }
        match self.scenario.fault.kind {
            FaultKind::Silent {
                slow_first_token: (shortest, _),
                ..
            } => plan.first_content >= shortest,
            _ => false,
        }
    }

    /// The answer to an attempt arriving at `now_us` that the fault or a quota keeps from the
    /// slots: 503 at once in an outage, no answer in a black hole, 429 where a quota has no room
    /// for it. `None` when it goes on to the slots.
    fn refuse(&mut self, now_us: u64, id: Option<usize>, tokens: u64) -> Option<Decision> {
        let at = Duration::from_micros(now_us);
        let fault = self.scenario.fault;
        if fault.refuses_at(at) {
            return Some(Decision::at_once(
                now_us,
                StatusCode::SERVICE_UNAVAILABLE,
                None,
            ));
        }
        if fault.swallows_at(at) {
            return Some(Decision {
                respond_at_us: None,
                ..Decision::at_once(now_us, StatusCode::GATEWAY_TIMEOUT, None)
            });
        }
        if let FaultKind::Quota {
            per_sec,
            retry_after,
        } = fault.kind
            && fault.contains(at)
            && !self.take_token(now_us, per_sec)
        {
            return Some(self.rate_limited(now_us, id, retry_after));
        }
        // A quota of requests and tokens is the provider's own: in force at every moment.
        if let Some(quota) = self.quota.as_mut()
            && let Err(wait) = quota.admit(now_us, tokens)
        {
            let hint = Duration::from_secs(retry_after_secs(wait).max(1));
            return Some(self.rate_limited(now_us, id, hint));
        }
        None
    }

    /// A 429 at `now_us` with `Retry-After: retry_after`; a retry of request `id` sooner is early.
    fn rate_limited(&mut self, now_us: u64, id: Option<usize>, retry_after: Duration) -> Decision {
        if let Some(track) = id.and_then(|id| self.requests.get_mut(id)) {
            track.hinted_until_us = now_us.saturating_add(micros(retry_after));
        }
        Decision::at_once(now_us, StatusCode::TOO_MANY_REQUESTS, Some(retry_after))
    }

    /// How an attempt arriving at `now_us` that starts on its slot at `start` (µs) ends, the
    /// provider at `load` (in-flight work / slots): its status, when it ends, and, for a success
    /// where the scenario streams, its stream. Past its slots the provider thrashes (503 after
    /// the service time); else the attempt fails with 500, partway through, at the health's
    /// error rate.
    fn serve(
        &mut self,
        now_us: u64,
        start: u64,
        load: f64,
    ) -> (StatusCode, u64, Option<StreamPlan>) {
        let at = Duration::from_micros(now_us);
        let health = self.scenario.health_at(at);
        let service = service_time_us(&mut self.rng, health.median, self.scenario.sigma);
        let thrashing = ((load - 1.0) / self.scenario.overload_error_span).clamp(0.0, 1.0);
        let (status, end) = if thrashing > 0.0 && self.rng.random::<f64>() < thrashing {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                start.saturating_add(service),
            )
        } else if self.rng.random::<f64>() < health.error_rate {
            let failed_after = (service as f64 * self.rng.random::<f64>()) as u64;
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                start.saturating_add(failed_after),
            )
        } else {
            (StatusCode::OK, start.saturating_add(service))
        };
        // A streamed success holds its slot until the stream ends, or fails.
        if let Some(shape) = self.scenario.stream
            && status == StatusCode::OK
        {
            let plan = self.stream_plan(at, shape, Duration::from_micros(service));
            let length = plan.head.saturating_add(plan.length());
            return (status, start.saturating_add(micros(length)), Some(plan));
        }
        (status, end, None)
    }

    /// The stream of a success arriving at `at` that takes `service`: whole, unless it arrives in
    /// a [`FaultKind::StreamErrors`] window (see [`Model::stream_fate`]); starting as the shape
    /// says (see [`Model::stream_start`]).
    fn stream_plan(&mut self, at: Duration, shape: StreamShape, service: Duration) -> StreamPlan {
        let mut plan = StreamPlan::new(shape, service, StreamFate::Complete);
        let fault = self.scenario.fault;
        if let FaultKind::StreamErrors {
            before_content,
            cut,
        } = fault.kind
            && fault.contains(at)
        {
            plan.fate = self.stream_fate(before_content, cut, plan.events);
        }
        if let Some(start) = shape.start {
            self.stream_start(at, start, &mut plan);
        }
        plan
    }

    /// Draw how long `plan`, of a stream arriving at `at`, takes to start: its head and first
    /// content event log-normal around `start`'s medians (at its sigma, or the scenario's); for
    /// the share of the attempts in `start`'s slow tail, the first content event its factor
    /// times as late from the start (the head as drawn); and in a [`FaultKind::Silent`] window,
    /// for a share of the streams, the first content event after the fault's slow wait instead.
    fn stream_start(&mut self, at: Duration, start: StreamStart, plan: &mut StreamPlan) {
        let sigma = start.sigma.unwrap_or(self.scenario.sigma);
        let head = service_time_us(&mut self.rng, start.head, sigma);
        let mut first = service_time_us(&mut self.rng, start.first_token, sigma);
        if let Some(slow) = start.slow
            && self.rng.random::<f64>() < slow.share
        {
            let late = (head.saturating_add(first) as f64 * slow.factor).round() as u64;
            first = late.saturating_sub(head);
            plan.slow = true;
        }
        plan.head = Duration::from_micros(head);
        plan.first_content = Duration::from_micros(first);
        let fault = self.scenario.fault;
        if let FaultKind::Silent {
            slow,
            slow_first_token: (shortest, longest),
            ..
        } = fault.kind
            && fault.contains(at)
            && self.rng.random::<f64>() < slow
        {
            let wait = self
                .rng
                .random_range(micros(shortest)..=micros(longest).max(micros(shortest)));
            plan.first_content = Duration::from_micros(wait);
        }
    }

    /// How a stream of `events` content events that starts in a [`FaultKind::StreamErrors`]
    /// window ends: before content with probability `before_content` (half in Anthropic's form,
    /// half in OpenAI's), cut with probability `cut` (after 1 to `events` of its events,
    /// uniformly), else whole.
    fn stream_fate(&mut self, before_content: f64, cut: f64, events: u32) -> StreamFate {
        let draw: f64 = self.rng.random();
        if draw < before_content / 2.0 {
            StreamFate::ErrorBeforeContent(ErrorForm::Anthropic)
        } else if draw < before_content {
            StreamFate::ErrorBeforeContent(ErrorForm::OpenAi)
        } else if draw < before_content + cut {
            StreamFate::CutAfter(self.rng.random_range(1..=events.max(1)))
        } else {
            StreamFate::Complete
        }
    }

    /// Count a measured stream that fails, and mark a request whose stream failed before content
    /// (its next attempt is a retry of that failure).
    fn count_stream(&mut self, fate: StreamFate, id: Option<usize>) {
        match fate {
            StreamFate::ErrorBeforeContent(_) => {
                self.stats.streams_failed_before_content += 1;
                if let Some(track) = id.and_then(|id| self.requests.get_mut(id)) {
                    track.failed_before_content = true;
                }
            }
            StreamFate::CutAfter(_) => self.stats.streams_cut += 1,
            // The provider's death, not a fault of its streams.
            StreamFate::LostAt(_) | StreamFate::Complete => {}
        }
    }

    /// Count an attempt arriving at `now_us` in its millisecond of the fault window, if the
    /// provider is dead in it.
    fn count_in_fault(&mut self, now_us: u64) {
        let fault = self.scenario.fault;
        if !(fault.kind.is_dead() && fault.contains(Duration::from_micros(now_us))) {
            return;
        }
        let ms = ms_floor(now_us.saturating_sub(micros(fault.start)));
        let series = &mut self.stats.fault_attempts_ms;
        if series.len() <= ms {
            series.resize(ms + 1, 0);
        }
        series[ms] += 1;
    }

    fn track(&mut self, now_us: u64, second: usize, id: Option<usize>) {
        let Some(id) = id.filter(|id| *id < MAX_TRACKED_IDS) else {
            return;
        };
        if self.requests.len() <= id {
            self.requests.resize(id + 1, Track::default());
        }
        let track = &mut self.requests[id];
        if track.open > 0 {
            self.stats.hedges += 1;
            self.stats.bucket(second).hedges += 1;
        }
        track.open = track.open.saturating_add(1);
        if track.attempts > 0 {
            self.stats.retries += 1;
            self.stats.bucket(second).retries += 1;
            if now_us < track.hinted_until_us {
                self.stats.early_retries += 1;
            }
            if std::mem::take(&mut track.failed_before_content) {
                self.stats.streams_failed_retried += 1;
            }
        }
        track.attempts = track.attempts.saturating_add(1);
    }

    fn take_token(&mut self, now_us: u64, per_sec: f64) -> bool {
        let elapsed = now_us.saturating_sub(self.tokens_at_us) as f64 / 1e6;
        self.tokens = (self.tokens + elapsed * per_sec).min(per_sec.max(1.0));
        self.tokens_at_us = self.tokens_at_us.max(now_us);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// `Retry-After` in whole seconds, rounded up (RFC 9110 has no fractions).
fn retry_after_secs(after: Duration) -> u64 {
    after.as_secs() + u64::from(after.subsec_nanos() > 0)
}

/// A duration as Go writes it, as OpenAI's `x-ratelimit-reset-*` headers do, to the millisecond
/// (rounded up): `0s`, `6ms`, `1s`, `1.5s`, `6m0s`.
pub(crate) fn go_duration(duration: Duration) -> String {
    let ms = duration.as_micros().div_ceil(1_000);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (minutes, ms) = (ms / 60_000, ms % 60_000);
    let mut seconds = format!("{}.{:03}", ms / 1_000, ms % 1_000);
    while seconds.ends_with('0') {
        seconds.pop();
    }
    if seconds.ends_with('.') {
        seconds.pop();
    }
    if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

fn overloaded() -> StatusCode {
    StatusCode::from_u16(STATUS_OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

fn ms_floor(us: u64) -> usize {
    usize::try_from(us / 1_000).unwrap_or(usize::MAX)
}

fn ms_ceil(us: u64) -> usize {
    usize::try_from(us.div_ceil(1_000)).unwrap_or(usize::MAX)
}

/// Events counted per millisecond and consumed in time order (a calendar queue): O(1) amortized
/// per event, where a heap of 40,000 slots would cost a cache miss per level.
#[derive(Clone, Debug, Default)]
struct Calendar {
    counts: Vec<u32>,
    /// Every bucket before it is empty.
    cursor: usize,
    pending: u64,
}

impl Calendar {
    fn with_events_at_zero(n: usize) -> Calendar {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        Calendar {
            counts: vec![n],
            cursor: 0,
            pending: u64::from(n),
        }
    }

    /// Add an event at `ms` (or at the cursor, if `ms` is already behind it).
    fn add(&mut self, ms: usize) {
        let ms = ms.max(self.cursor);
        if self.counts.len() <= ms {
            self.counts.resize(ms + 1, 0);
        }
        self.counts[ms] += 1;
        self.pending += 1;
    }

    /// The millisecond of the earliest event, if any.
    fn earliest(&mut self) -> Option<usize> {
        if self.pending == 0 {
            return None;
        }
        while self.counts.get(self.cursor).is_some_and(|c| *c == 0) {
            self.cursor += 1;
        }
        Some(self.cursor)
    }

    /// Remove the earliest event.
    fn take_earliest(&mut self) {
        if self.earliest().is_some() {
            self.counts[self.cursor] -= 1;
            self.pending -= 1;
        }
    }

    /// Drop every event at or before `ms`; returns how many are left.
    fn discard_through(&mut self, ms: usize) -> u64 {
        let end = ms.saturating_add(1).min(self.counts.len());
        while self.cursor < end {
            self.pending -= u64::from(self.counts[self.cursor]);
            self.counts[self.cursor] = 0;
            self.cursor += 1;
        }
        self.pending
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A log-normal draw around `median` (Box-Muller for the normal), in microseconds.
fn service_time_us(rng: &mut SmallRng, median: Duration, sigma: f64) -> u64 {
    let u1 = 1.0 - rng.random::<f64>(); // (0, 1]: ln is finite
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let factor = (sigma * z).exp();
    (median.as_micros() as f64 * factor).round() as u64
}

/// The body of the provider's answers: one JSON body, or, where the scenario streams, an event
/// stream for a success.
pub(crate) type ProviderBody = Either<Full<Bytes>, EventStream>;

/// The provider as a tower service; clones share one [`Model`].
#[derive(Clone)]
pub(crate) struct Backend {
    model: Arc<Mutex<Model>>,
    epoch: Instant,
}

impl Backend {
    /// A provider for `scenario` whose time zero is `epoch`.
    pub fn new(scenario: &Scenario, epoch: Instant) -> Backend {
        Backend {
            model: Arc::new(Mutex::new(Model::new(scenario))),
            epoch,
        }
    }

    /// Lock the model (to read its counts).
    pub fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Microseconds since the provider's time zero.
    fn now_us(&self) -> u64 {
        micros(Instant::now().saturating_duration_since(self.epoch))
    }
}

/// Requests carry a body the provider can read at once, without a task to wait in: every client
/// here sends a `Full` one. The provider reads it for a stream, to know where the answer starts
/// ([`first_token`]).
impl<B> Service<Request<B>> for Backend
where
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Response<ProviderBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let now_us = self.now_us();
        let id = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let tokens = req
            .headers()
            .get(TOKENS)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let mut decision = self.model().admit_weighing(now_us, id, tokens);
        if let Some(plan) = decision.stream.as_mut() {
            plan.first_token = first_token_of(req.body_mut());
        }
        let delay = decision
            .respond_at_us
            .filter(|at| *at > now_us)
            .map(|at| tokio::time::sleep_until(self.epoch + Duration::from_micros(at)));
        ResponseFuture {
            delay,
            answer: Some(decision).filter(|decision| decision.respond_at_us.is_some()),
            open: Some(OpenAttempt {
                backend: self.clone(),
                id,
            }),
        }
    }
}

/// Where the answer to a request with `body` starts ([`first_token`]): after the prefill of a
/// continuation. Read only for a stream, which numbers its tokens, and only what the body holds
/// at once: it is polled with a waker that wakes nothing, as a `Full` needs none, and a body
/// that would make the provider wait is read as far as it is ready (the model has no task to
/// wait in).
fn first_token_of<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> u64 {
    let mut cx = Context::from_waker(Waker::noop());
    let mut bytes = Vec::new();
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut *body).poll_frame(&mut cx) {
        if let Ok(data) = frame.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    first_token(&bytes)
}

/// An attempt the client holds open; closed in the model when the answer is handed over (a
/// stream: when it ends) or the client drops the attempt, whichever comes first.
pub(crate) struct OpenAttempt {
    backend: Backend,
    /// Its request's id.
    id: Option<usize>,
}

impl Drop for OpenAttempt {
    fn drop(&mut self) {
        let now_us = self.backend.now_us();
        self.backend.model().close(now_us, self.id);
    }
}

/// The answer of `decision`, built when it is sent (a stream starts then).
fn respond(decision: Decision) -> Response<ProviderBody> {
    if let Some(plan) = decision.stream {
        let mut response = Response::new(Either::Right(EventStream::new(plan)));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        return response;
    }
    let body: &'static [u8] = match decision.status.as_u16() {
        200 => OK_BODY,
        429 => RATE_LIMITED_BODY,
        503 => UNAVAILABLE_BODY,
        STATUS_OVERLOADED => OVERLOADED_BODY,
        _ => ERROR_BODY,
    };
    let mut response = Response::new(Either::Left(Full::new(Bytes::from_static(body))));
    *response.status_mut() = decision.status;
    if decision.status != StatusCode::OK {
        // Error bodies are classified, so they say what they are. (Successes skip the header: one
        // allocation per answer fewer, and nothing reads it.)
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(after) = decision.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    }
    if let Some(state) = decision.rate_limit {
        let headers = response.headers_mut();
        for (quota, limit, remaining, reset) in [
            (
                state.requests,
                X_RATELIMIT_LIMIT_REQUESTS,
                X_RATELIMIT_REMAINING_REQUESTS,
                X_RATELIMIT_RESET_REQUESTS,
            ),
            (
                state.tokens,
                X_RATELIMIT_LIMIT_TOKENS,
                X_RATELIMIT_REMAINING_TOKENS,
                X_RATELIMIT_RESET_TOKENS,
            ),
        ] {
            headers.insert(limit, HeaderValue::from(quota.limit));
            headers.insert(remaining, HeaderValue::from(quota.remaining));
            if let Ok(value) = HeaderValue::try_from(go_duration(quota.reset)) {
                headers.insert(reset, value);
            }
        }
    }
    response
}

pin_project! {
    /// Response future of [`Backend`]: the answer, held back until its time, or never (a black
    /// hole).
    pub(crate) struct ResponseFuture {
        #[pin]
        delay: Option<Sleep>,
        // `None` while the attempt is open: swallowed by a black hole.
        answer: Option<Decision>,
        // `None` once the answer was handed over.
        open: Option<OpenAttempt>,
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ProviderBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(delay) = this.delay.as_pin_mut() {
            ready!(delay.poll(cx));
        }
        match this.answer.take() {
            Some(decision) => {
                let mut response = respond(decision);
                // A stream keeps the attempt open until it ends.
                if let Either::Right(stream) = response.body_mut() {
                    stream.hold_open(this.open.take());
                }
                drop(this.open.take());
                Poll::Ready(Ok(response))
            }
            // Never answered: the client's timeout or deadline ends the wait, or nothing does.
            None if this.open.is_some() => Poll::Pending,
            None => panic!("backend response polled after completion"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenario::{BALANCE_FLEET_DYING, DEGRADED_MEDIAN, HEALTHY_MEDIAN};
    use crate::scenarios;

    const SECOND: u64 = 1_000_000;

    fn median_us(mut values: Vec<u64>) -> u64 {
        values.sort_unstable();
        values[values.len() / 2]
    }

    /// Offer `qps` for `secs` seconds (evenly spaced) and return (latencies of 200s, statuses).
    fn offer(model: &mut Model, qps: u64, from_s: u64, secs: u64) -> (Vec<u64>, Vec<u16>) {
        let gap = SECOND / qps;
        let mut latencies = Vec::new();
        let mut statuses = Vec::new();
        for i in 0..qps * secs {
            let now = from_s * SECOND + i * gap;
            let d = model.admit(now, Some(i as usize));
            statuses.push(d.status.as_u16());
            if d.status == StatusCode::OK {
                latencies.push(d.respond_at_us.unwrap() - now);
            }
        }
        (latencies, statuses)
    }

    /// A healthy provider (its fault moved out of the way).
    fn healthy(qps: f64, capacity: u32) -> Scenario {
        let mut scenario = scenarios::SEED
            .scenario()
            .with_qps(qps)
            .with_capacity(capacity);
        scenario.fault.start = Duration::from_secs(1_000);
        scenario.fault.end = Duration::from_secs(1_001);
        scenario
    }

    fn share(statuses: &[u16], status: u16) -> f64 {
        statuses.iter().filter(|s| **s == status).count() as f64 / statuses.len() as f64
    }

    #[test]
    fn calendar_hands_out_events_in_time_order() {
        let mut calendar = Calendar::with_events_at_zero(2);
        calendar.add(5);
        calendar.add(3);
        let mut order = Vec::new();
        while let Some(ms) = calendar.earliest() {
            order.push(ms);
            calendar.take_earliest();
        }
        assert_eq!(order, [0, 0, 3, 5]);
        calendar.add(1); // behind the cursor: counted at the cursor
        calendar.add(9);
        assert_eq!(calendar.earliest(), Some(5));
        assert_eq!(calendar.discard_through(8), 1);
        assert_eq!(calendar.discard_through(9), 0);
        assert_eq!(calendar.earliest(), None);
    }

    #[test]
    fn under_capacity_the_median_latency_is_the_healthy_800_ms() {
        let scenario = scenarios::SEED.scenario().with_qps(1_000.0);
        let mut model = Model::new(&scenario);
        let (latencies, statuses) = offer(&mut model, 1_000, 0, 5);
        let median = median_us(latencies) as f64 / 1e3;
        let target = HEALTHY_MEDIAN.as_millis() as f64;
        assert!(
            (median - target).abs() < 0.03 * target,
            "median {median} ms"
        );
        assert!(share(&statuses, 200) > 0.999);
        assert_eq!(
            model.stats().buckets[2].delayed,
            0,
            "no queueing under capacity"
        );
    }

    #[test]
    fn degraded_window_steps_latency_and_errors() {
        let scenario = scenarios::SEED.scenario().with_qps(1_000.0);
        let mut model = Model::new(&scenario);
        let (latencies, statuses) = offer(&mut model, 1_000, 12, 10);
        let median = median_us(latencies) as f64 / 1e3;
        let target = DEGRADED_MEDIAN.as_millis() as f64;
        assert!(
            (median - target).abs() < 0.03 * target,
            "median {median} ms"
        );
        let errors = share(&statuses, 500);
        assert!((0.04..0.06).contains(&errors), "error share {errors}");
        assert!(
            model.stats().peak_in_flight < u64::from(scenario.capacity),
            "still under capacity"
        );
    }

    #[test]
    fn above_capacity_latency_grows_then_errors_rise_sharply() {
        let scenario = healthy(1_000.0, 1_000);
        let mut model = Model::new(&scenario);
        // Healthy: 1,000 slots / 0.91 s mean = about 1,100 req/s. Offer 2,000 req/s for 10 s.
        let (_, statuses) = offer(&mut model, 2_000, 0, 10);
        assert!(
            share(&statuses[..1_000], 200) > 0.99,
            "the first 0.5 s fits in the slots"
        );
        let second = |s: usize| &statuses[s * 2_000..(s + 1) * 2_000];
        assert!(
            share(second(2), 200) < 0.05,
            "25% over capacity, every admitted request fails"
        );
        assert!(share(second(2), 503) > 0.95);
        assert!(
            share(second(9), 529) > 0.4,
            "the queue is full: shed at once"
        );
        let stats = model.stats();
        assert!(stats.buckets[9].delayed > 1_990, "{:?}", stats.buckets[9]);
        let peak = stats.peak_in_flight as f64 / 1_000.0;
        assert!(
            (5.5..7.5).contains(&peak),
            "slots + about 5 s of queue: {peak}"
        );
    }

    #[test]
    fn overload_outlasts_the_surge_that_caused_it() {
        // 900 req/s is well under the 1,100 req/s the slots complete...
        let scenario = healthy(1_000.0, 1_000);
        let mut calm = Model::new(&scenario);
        let (_, statuses) = offer(&mut calm, 900, 0, 20);
        assert!(share(&statuses, 200) > 0.999);
        // ...but after a 10 s surge the same 900 req/s keeps failing: the queue of work nobody
        // waits for any more drains at only 200 req/s.
        let mut surged = Model::new(&scenario);
        offer(&mut surged, 2_000, 0, 10);
        let (_, after) = offer(&mut surged, 900, 10, 10);
        assert!(
            share(&after, 200) < 0.05,
            "goodput after the surge: {}",
            share(&after, 200)
        );
    }

    #[test]
    fn outage_answers_503_at_once_and_cuts_work_in_flight() {
        let scenario = scenarios::OUTAGE.scenario().with_qps(100.0);
        let mut model = Model::new(&scenario);
        let before = model.admit(19_900_000, Some(0));
        assert_eq!(before.status.as_u16(), 503);
        assert_eq!(before.respond_at_us, Some(20 * SECOND));
        let during = model.admit(25 * SECOND, Some(1));
        assert_eq!(
            (during.status.as_u16(), during.respond_at_us),
            (503, Some(25 * SECOND))
        );
        let after = model.admit(30 * SECOND, Some(2));
        assert_eq!(after.status.as_u16(), 200);
    }

    #[test]
    fn a_refusing_deployment_finishes_its_work_in_flight_and_refuses_the_rest() {
        let fleet = scenarios::BALANCE_FLEET.scenario().with_qps(100.0);
        let dying = fleet.deployment(BALANCE_FLEET_DYING).unwrap();
        let mut model = Model::new(&dying);
        let caught = model.admit(19_900_000, Some(0));
        assert_eq!(caught.status, StatusCode::OK, "in flight at 20 s: served");
        assert!(caught.respond_at_us.unwrap() > 20 * SECOND);
        let during = model.admit(25 * SECOND, Some(1));
        assert_eq!(
            (during.status.as_u16(), during.respond_at_us),
            (503, Some(25 * SECOND))
        );
        // Counted in its millisecond of the fault: 5 s after it started.
        let counted = &model.stats().fault_attempts_ms;
        assert_eq!((counted.len(), counted.iter().sum::<u64>()), (5_001, 1));
    }

    #[test]
    fn blackhole_never_answers_what_arrives_in_it_or_is_in_flight_when_it_starts() {
        let scenario = scenarios::BLACKHOLE.scenario().with_qps(100.0);
        let mut model = Model::new(&scenario);
        let early = model.admit(10 * SECOND, Some(0));
        assert_eq!(early.status, StatusCode::OK);
        assert!(early.respond_at_us.unwrap() < 15 * SECOND);
        let caught = model.admit(19_900_000, Some(1));
        assert_eq!(caught.respond_at_us, None, "in flight at 20 s: lost");
        let during = model.admit(25 * SECOND, Some(2));
        assert_eq!(during.respond_at_us, None);
        assert_eq!(
            model.in_flight(25 * SECOND),
            0,
            "the provider holds none of them"
        );
        let after = model.admit(30 * SECOND, Some(3));
        assert_eq!(after.status, StatusCode::OK);
        assert!(after.respond_at_us.unwrap() > 30 * SECOND);
        assert_eq!(model.open(), 4, "nobody closed an attempt yet");
    }

    #[test]
    fn failover_primary_fails_what_is_in_flight_refuses_then_swallows_then_serves() {
        let scenario = scenarios::FAILOVER.scenario().with_qps(100.0);
        let mut model = Model::new(&scenario);
        let caught = model.admit(19_900_000, Some(0));
        assert_eq!(
            (caught.status.as_u16(), caught.respond_at_us),
            (503, Some(20 * SECOND)),
            "in flight at 20 s: lost with 503, as in an outage"
        );
        let refused = model.admit(25 * SECOND, Some(1));
        assert_eq!(
            (refused.status.as_u16(), refused.respond_at_us),
            (503, Some(25 * SECOND))
        );
        let swallowed = model.admit(27_500_000, Some(2));
        assert_eq!(swallowed.respond_at_us, None, "a black hole from 27.5 s");
        let after = model.admit(35 * SECOND, Some(3));
        assert_eq!(after.status, StatusCode::OK);
        // The secondary serves throughout.
        let mut secondary = Model::new(&scenario.secondary().unwrap());
        for (id, at) in [20, 25, 30].into_iter().enumerate() {
            let answer = secondary.admit(at * SECOND, Some(id));
            assert_eq!(answer.status, StatusCode::OK, "{at} s");
            assert!(answer.respond_at_us.unwrap() > at * SECOND);
        }
    }

    #[test]
    fn open_attempts_are_counted_until_closed_with_the_peak_of_each_100_ms() {
        let scenario = healthy(100.0, 100);
        let mut model = Model::new(&scenario);
        const MS: u64 = 1_000;
        model.admit(0, Some(0));
        model.admit(50 * MS, Some(1));
        model.admit(150 * MS, Some(2));
        model.close(160 * MS, Some(0));
        model.close(420 * MS, Some(1));
        assert_eq!(model.open(), 1);
        let stats = model.stats();
        assert_eq!(stats.peak_open, 3);
        let peaks: Vec<u64> = stats.fine.iter().map(|b| b.peak_open).collect();
        // 0..100 ms: 2; 100..200 ms: 3 (then 2); 200..400 ms: 2 throughout; 400..500 ms: 2 then 1.
        assert_eq!(peaks, [2, 3, 2, 2, 2]);
        let attempts: Vec<u64> = stats.fine.iter().map(|b| b.attempts).collect();
        assert_eq!(attempts, [2, 1, 0, 0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_stays_open_until_answered_or_dropped() {
        let scenario = scenarios::BLACKHOLE.scenario().with_qps(100.0);
        let backend = Backend::new(&scenario, Instant::now());
        let request = || Request::new(Full::new(Bytes::new()));
        // Healthy: open until the answer is handed over.
        let answered = backend.clone().call(request());
        assert_eq!(backend.model().open(), 1);
        let response = answered.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(backend.model().open(), 0);
        // In the black hole: pending until the client gives up, then closed.
        tokio::time::advance(Duration::from_secs(25)).await;
        let hung = backend.clone().call(request());
        let waited = tokio::time::timeout(Duration::from_secs(4), hung).await;
        assert!(waited.is_err(), "never answered");
        assert_eq!(backend.model().open(), 0, "dropped by its timeout");
        assert_eq!(backend.model().stats().peak_open, 1);
    }

    #[test]
    fn quota_answers_429_with_retry_after_and_counts_early_retries() {
        let scenario = scenarios::QUOTA.scenario().with_qps(1_000.0);
        let mut model = Model::new(&scenario);
        let (_, statuses) = offer(&mut model, 1_000, 12, 8);
        // One second of burst (750) lasts 3 s at a 250/s deficit; then a quarter is refused.
        let limited = share(&statuses[4_000..], 429);
        assert!((0.2..0.3).contains(&limited), "429 share {limited}");
        let mut limited_ids = statuses
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == 429)
            .map(|(i, _)| i);
        let (a, b) = (limited_ids.next().unwrap(), limited_ids.next().unwrap());
        let sent_at = |id: usize| 12 * SECOND + id as u64 * 1_000;
        model.admit(sent_at(a) + 1_000_000, Some(a));
        assert_eq!(
            model.stats().early_retries,
            1,
            "a retry 1 s after `Retry-After: 2` is early"
        );
        model.admit(sent_at(b) + 2_100_000, Some(b));
        assert_eq!(
            model.stats().early_retries,
            1,
            "a retry after the hint is not early"
        );
        assert_eq!(model.stats().retries, 2);
        let response = respond(Decision {
            status: StatusCode::TOO_MANY_REQUESTS,
            respond_at_us: Some(0),
            retry_after: Some(Duration::from_secs(2)),
            queued: false,
            rate_limit: None,
            stream: None,
            silent: false,
            slow_first_token: false,
        });
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        assert!(
            response.headers().get(X_RATELIMIT_LIMIT_REQUESTS).is_none(),
            "no quota a minute, no header"
        );
    }

    /// The burst scenario's provider with a quota of 600 requests and 60,000 tokens a minute: 10
    /// requests and 1,000 tokens a second, a bucket of one second's worth of each.
    fn quota_a_minute() -> Model {
        let mut scenario = scenarios::BURST.scenario();
        scenario.fault.kind = FaultKind::RateLimit {
            requests_per_minute: 600,
            tokens_per_minute: 60_000,
        };
        Model::new(&scenario)
    }

    #[test]
    fn quota_a_minute_admits_a_second_at_once_then_refills_continuously() {
        let mut model = quota_a_minute();
        for id in 0..10 {
            assert_eq!(model.admit_weighing(0, Some(id), 10).status, StatusCode::OK);
        }
        // The 11th finds the request bucket empty: 429 at once, `Retry-After` rounded up to 1 s.
        let refused = model.admit_weighing(0, Some(10), 10);
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.respond_at_us, Some(0));
        assert_eq!(refused.retry_after, Some(Duration::from_secs(1)));
        assert!(!refused.queued);
        // One request comes back every 100 ms, exactly.
        let status = |model: &mut Model, at: u64, id: usize| {
            model.admit_weighing(at, Some(id), 10).status.as_u16()
        };
        assert_eq!(status(&mut model, 99_999, 11), 429);
        assert_eq!(status(&mut model, 100_000, 12), 200);
        assert_eq!(status(&mut model, 100_000, 13), 429);
        // At 20 requests a second from 1 s to 10.95 s, the 9 the bucket gathered from 0.1 s to
        // 1 s go, and the 99.5 it refills in 9.95 s (99 whole ones).
        let admitted = (0..200)
            .filter(|i| status(&mut model, SECOND + i * 50_000, 100 + *i as usize) == 200)
            .count();
        assert_eq!(admitted, 9 + 99);
        // Idle, the bucket fills up to one second's worth, no more.
        let burst = (0..20)
            .filter(|i| status(&mut model, 30 * SECOND, 300 + i) == 200)
            .count();
        assert_eq!(burst, 10);
    }

    #[test]
    fn quota_a_minute_weighs_tokens_at_admission() {
        let mut model = quota_a_minute();
        let status = |model: &mut Model, at: u64, id: usize, tokens: u64| {
            model.admit_weighing(at, Some(id), tokens).status.as_u16()
        };
        assert_eq!(status(&mut model, 0, 0, 900), 200);
        // 100 tokens left: a request of 200 is refused though requests are left; 100 fit.
        let refused = model.admit_weighing(0, Some(1), 200);
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(status(&mut model, 0, 2, 100), 200);
        // 200 tokens are back 200 ms later.
        assert_eq!(status(&mut model, 199_999, 3, 200), 429);
        assert_eq!(status(&mut model, 200_000, 4, 200), 200);
        // Heavier than a second's worth: it goes with a full bucket (1.2 s), and empties it.
        assert_eq!(status(&mut model, 1_199_999, 5, 5_000), 429);
        assert_eq!(status(&mut model, 1_200_000, 6, 5_000), 200);
        assert_eq!(status(&mut model, 1_200_000, 7, 1), 429);
        // A request the provider does not weigh counts against requests only.
        assert_eq!(status(&mut model, 1_200_000, 8, 0), 200);
    }

    #[test]
    fn every_answer_states_the_quota_a_minute_as_openai_does() {
        let mut model = quota_a_minute();
        let first = model.admit_weighing(0, Some(0), 100);
        let state = first.rate_limit.unwrap();
        // One request of ten, 100 tokens of 1,000: whole again in 100 ms.
        assert_eq!(
            state.requests,
            QuotaState {
                limit: 600,
                remaining: 599,
                reset: Duration::from_millis(100)
            }
        );
        assert_eq!(
            state.tokens,
            QuotaState {
                limit: 60_000,
                remaining: 59_900,
                reset: Duration::from_millis(100)
            }
        );
        let response = respond(first);
        let header = |name: &HeaderName| response.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header(&X_RATELIMIT_LIMIT_REQUESTS), "600");
        assert_eq!(header(&X_RATELIMIT_REMAINING_REQUESTS), "599");
        assert_eq!(header(&X_RATELIMIT_RESET_REQUESTS), "100ms");
        assert_eq!(header(&X_RATELIMIT_LIMIT_TOKENS), "60000");
        assert_eq!(header(&X_RATELIMIT_REMAINING_TOKENS), "59900");
        assert_eq!(header(&X_RATELIMIT_RESET_TOKENS), "100ms");
        assert!(response.headers().get(RETRY_AFTER).is_none());
        // A 429 carries them too, with `Retry-After`; `remaining` is the minute's, not zero.
        for id in 1..10 {
            model.admit_weighing(0, Some(id), 10);
        }
        let refused = respond(model.admit_weighing(0, Some(10), 10));
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()[RETRY_AFTER], "1");
        assert_eq!(refused.headers()[X_RATELIMIT_REMAINING_REQUESTS], "590");
        assert_eq!(refused.headers()[X_RATELIMIT_RESET_REQUESTS], "1s");
        // stormguard reads the resets back.
        assert_eq!(
            stormguard::classify::hint::go_duration(b"100ms"),
            Some(Duration::from_millis(100))
        );
    }

    #[test]
    fn resets_are_written_as_go_durations() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1), "1ms"),
            (Duration::from_millis(6), "6ms"),
            (Duration::from_millis(999), "999ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_millis(61_250), "1m1.25s"),
            (Duration::from_secs(360), "6m0s"),
        ];
        for (duration, text) in cases {
            assert_eq!(go_duration(duration), text);
            assert_eq!(
                stormguard::classify::hint::go_duration(text.as_bytes()),
                Some(Duration::from_micros(
                    duration.as_micros().div_ceil(1_000) as u64 * 1_000
                )),
                "{text}"
            );
        }
    }

    #[test]
    fn attempts_answered_429_are_counted_when_measured() {
        let mut model = quota_a_minute();
        for id in 0..15 {
            model.admit_weighing(0, Some(id), 10);
        }
        model.count_ids_below(20);
        // Unmeasured load is served (and refused) but not counted.
        model.admit_weighing(500_000, Some(25), 10);
        // A second's worth of tokens, then a request that finds none left.
        model.admit_weighing(2 * SECOND, Some(3), 1_000);
        model.admit_weighing(2 * SECOND, Some(4), 10);
        let stats = model.stats();
        assert_eq!(stats.rate_limited, 6);
        assert_eq!(stats.buckets[0].rate_limited, 5);
        assert_eq!(stats.buckets[2].rate_limited, 1);
        assert_eq!((stats.buckets[0].ok, stats.buckets[2].ok), (10, 1));
        assert_eq!(stats.attempts, 17);
    }

    #[test]
    fn streams_fail_in_their_window_before_content_or_mid_stream() {
        let scenario = scenarios::STREAMS.scenario();
        let mut model = Model::new(&scenario);
        // 500 attempts a second (the scenario's load), from 10 s to 20 s and from 20 s to 40 s.
        let plans = |model: &mut Model, from_s: u64, secs: u64, first: usize| {
            (0..secs * 500)
                .map(|i| {
                    let now = from_s * SECOND + i * 2_000;
                    let decision = model.admit(now, Some(first + i as usize));
                    assert_eq!(decision.status, StatusCode::OK);
                    assert_eq!(decision.respond_at_us, Some(now), "the head at the start");
                    decision.stream.unwrap()
                })
                .collect::<Vec<StreamPlan>>()
        };
        let before = plans(&mut model, 10, 10, 0);
        assert!(before.iter().all(|p| p.fate == StreamFate::Complete));
        // The answers last 4 s at the median: 40 content events of 100 ms.
        let mut events: Vec<u32> = before.iter().map(|p| p.events).collect();
        events.sort_unstable();
        assert!((38..=42).contains(&events[events.len() / 2]), "{events:?}");
        let during = plans(&mut model, 20, 20, 5_000);
        let share = |fate: fn(&StreamFate) -> bool| {
            during.iter().filter(|p| fate(&p.fate)).count() as f64 / during.len() as f64
        };
        let anthropic = share(|f| *f == StreamFate::ErrorBeforeContent(ErrorForm::Anthropic));
        let openai = share(|f| *f == StreamFate::ErrorBeforeContent(ErrorForm::OpenAi));
        let cut = share(|f| matches!(f, StreamFate::CutAfter(_)));
        assert!(
            (0.04..0.06).contains(&(anthropic + openai)),
            "{anthropic} {openai}"
        );
        assert!(anthropic > 0.015 && openai > 0.015, "{anthropic} {openai}");
        assert!((0.006..0.014).contains(&cut), "{cut}");
        for plan in &during {
            if let StreamFate::CutAfter(k) = plan.fate {
                assert!((1..=plan.events).contains(&k), "{plan:?}");
            }
        }
        let stats = model.stats().clone();
        let failed = during
            .iter()
            .filter(|p| matches!(p.fate, StreamFate::ErrorBeforeContent(_)))
            .count() as u64;
        assert_eq!(stats.streams_failed_before_content, failed);
        assert_eq!(
            stats.streams_cut,
            (cut * during.len() as f64).round() as u64
        );
        assert_eq!(stats.streams_failed_retried, 0);
        // Another attempt of a request whose stream failed before content is its retry; one of
        // a request whose stream was whole is not counted so.
        let failed_id = 5_000
            + during
                .iter()
                .position(|p| matches!(p.fate, StreamFate::ErrorBeforeContent(_)))
                .unwrap();
        model.admit(41 * SECOND, Some(failed_id));
        model.admit(41 * SECOND, Some(0));
        model.admit(42 * SECOND, Some(failed_id));
        assert_eq!(model.stats().streams_failed_retried, 1);
        assert_eq!(model.stats().retries, 3);
    }

    /// The silent scenario's attempts, 300 a second for `secs` seconds from `from_s`: how long
    /// each success waited for its head, and its stream (the 0.01% of 500s left out).
    fn silent_attempts(model: &mut Model, from_s: u64, secs: u64) -> Vec<(u64, StreamPlan)> {
        (0..secs * 300)
            .filter_map(|i| {
                let now = from_s * SECOND + i * 3_333;
                let decision = model.admit(now, Some((from_s * 300 + i) as usize));
                let stream = decision.stream?;
                Some((decision.respond_at_us.unwrap() - now, stream))
            })
            .collect()
    }

    #[test]
    fn silent_streams_start_late_and_in_the_fault_some_are_silent_or_slow() {
        let scenario = scenarios::SILENT.scenario();
        let mut model = Model::new(&scenario);
        // Healthy: the head after 200 ms and the first token 300 ms after it, at the median.
        let before = silent_attempts(&mut model, 5, 10);
        let median = |values: Vec<u64>| median_us(values) as f64 / 1e3;
        let heads = median(before.iter().map(|(head, _)| *head).collect());
        let firsts = median(
            before
                .iter()
                .map(|(_, p)| micros(p.first_content))
                .collect(),
        );
        assert!((190.0..210.0).contains(&heads), "{heads}");
        assert!((285.0..315.0).contains(&firsts), "{firsts}");
        assert!(before.iter().all(|(head, p)| *head == micros(p.head)));
        assert_eq!(
            (model.stats().silent, model.stats().slow_first_tokens),
            (0, 0)
        );
        // In the fault: 30% wait 20 s more for their head, 2% 10 s to 20 s for their first token.
        let during = silent_attempts(&mut model, 20, 20);
        let silent: Vec<_> = during
            .iter()
            .filter(|(head, _)| *head > 20 * SECOND)
            .collect();
        let share = silent.len() as f64 / during.len() as f64;
        assert!((0.28..0.32).contains(&share), "{share}");
        assert!(
            silent
                .iter()
                .all(|(head, p)| *head == 20 * SECOND + micros(p.head))
        );
        let slow: Vec<_> = during
            .iter()
            .filter(|(_, p)| p.first_content >= Duration::from_secs(10))
            .collect();
        let share = slow.len() as f64 / during.len() as f64;
        assert!((0.015..0.025).contains(&share), "{share}");
        assert!(
            slow.iter()
                .all(|(_, p)| p.first_content <= Duration::from_secs(20))
        );
        let stats = model.stats();
        // Counted over every attempt: a silent one may also be one of the rare 500s.
        let silent = silent.len() as u64;
        assert!((silent..=silent + 2).contains(&stats.silent), "{stats:?}");
        assert_eq!(stats.slow_first_tokens, slow.len() as u64);
        // A silent attempt holds its slot through its silence, then through its stream.
        let in_flight = model.in_flight(40 * SECOND);
        assert!(in_flight > 1_500, "{in_flight}");
        // After the fault, healthy again.
        let after = silent_attempts(&mut model, 45, 2);
        let slow = Duration::from_secs(10);
        assert!(
            after
                .iter()
                .all(|(head, p)| *head < 5 * SECOND && p.first_content < slow)
        );
    }

    #[test]
    fn tail_streams_start_after_half_a_second_and_one_in_seventy_ten_times_later() {
        let scenario = scenarios::TAIL.scenario();
        let mut model = Model::new(&scenario);
        // 100,000 attempts before the outage, 10 a millisecond.
        let starts: Vec<StreamPlan> = (0..100_000_u64)
            .filter_map(|i| model.admit(i * 100, Some(i as usize)).stream)
            .collect();
        assert!(starts.len() > 99_900, "all but the rare 500s");
        let to_first_token = |p: &StreamPlan| micros(p.head + p.first_content);
        let (slow, fast): (Vec<&StreamPlan>, Vec<&StreamPlan>) =
            starts.iter().partition(|p| p.slow);
        // 1.5% slow, drawn per attempt: about 1,500, give or take 3 standard deviations.
        assert!((1_385..1_615).contains(&slow.len()), "{}", slow.len());
        assert_eq!(model.stats().slow_first_tokens, slow.len() as u64);
        // About half a second to the first token, narrow: the p99 under 1 s.
        let mut fast: Vec<u64> = fast.iter().map(|p| to_first_token(p)).collect();
        fast.sort_unstable();
        let at = |q: f64| fast[(q * fast.len() as f64) as usize] as f64 / 1e3;
        assert!((490.0..525.0).contains(&at(0.5)), "{}", at(0.5));
        assert!((650.0..750.0).contains(&at(0.95)), "{}", at(0.95));
        assert!(at(0.99) < 1_000.0, "{}", at(0.99));
        // The slow ones: ten times their draw, about 5 s; the head as drawn (200 ms).
        let slow_first: Vec<u64> = slow.iter().map(|p| to_first_token(p)).collect();
        let median = median_us(slow_first) as f64 / 1e3;
        assert!((4_800.0..5_300.0).contains(&median), "{median}");
        let heads = median_us(slow.iter().map(|p| micros(p.head)).collect()) as f64 / 1e3;
        assert!((185.0..215.0).contains(&heads), "{heads}");
    }

    #[test]
    fn a_stream_in_flight_when_the_outage_starts_is_reset_then_and_one_without_a_head_fails() {
        let scenario = scenarios::TAIL.scenario().with_qps(100.0);
        let mut model = Model::new(&scenario);
        let crash = 30 * SECOND;
        // Arrived 2 s before the outage: its head long out, its stream reset at the crash.
        let early = model.admit(crash - 2 * SECOND, Some(0));
        let plan = early.stream.unwrap();
        assert_eq!(early.status, StatusCode::OK);
        let head_at = early.respond_at_us.unwrap();
        if micros(plan.head) + micros(plan.length()) > 2 * SECOND {
            assert_eq!(
                plan.fate,
                StreamFate::LostAt(Duration::from_micros(crash - head_at))
            );
        }
        // Arrived 1 ms before it: no head yet, a 503 at the crash.
        let late = model.admit(crash - 1_000, Some(1));
        assert_eq!(late.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(late.respond_at_us, Some(crash));
        assert!(late.stream.is_none());
        assert_eq!(
            model.stats().streams_cut,
            0,
            "the provider died: no fault of its streams"
        );
    }

    #[test]
    fn an_attempt_sent_while_another_of_its_request_is_open_is_a_hedge() {
        let scenario = scenarios::TAIL.scenario().with_qps(100.0);
        let mut model = Model::new(&scenario);
        model.admit(0, Some(0));
        // A second attempt while the first is open: a hedge, and a repeat of the request.
        model.admit(700_000, Some(0));
        assert_eq!((model.stats().hedges, model.stats().retries), (1, 1));
        // Both closed; a third attempt after them (a retry) is none.
        model.close(1_200_000, Some(0));
        model.close(1_200_000, Some(0));
        model.admit(1_300_000, Some(0));
        model.admit(1_300_000, Some(1));
        let stats = model.stats();
        assert_eq!((stats.hedges, stats.retries), (1, 2));
        assert_eq!(stats.buckets[0].hedges, 1);
    }

    #[test]
    fn a_stream_holds_its_slot_until_it_ends_or_fails() {
        let mut scenario = scenarios::STREAMS.scenario().with_capacity(1);
        let mut model = Model::new(&scenario);
        let first = model.admit(0, Some(0));
        let length = micros(first.stream.unwrap().length());
        assert_eq!(model.in_flight(length - 1_000), 1);
        // The second waits for the slot: its head comes when the first stream has ended.
        let second = model.admit(1_000, Some(1));
        assert!(second.queued);
        assert_eq!(second.respond_at_us, Some(length.div_ceil(1_000) * 1_000));
        // A stream failing before content frees its slot when its error event goes out.
        scenario.fault.start = Duration::ZERO;
        scenario.fault.kind = FaultKind::StreamErrors {
            before_content: 1.0,
            cut: 0.0,
        };
        let mut failing = Model::new(&scenario);
        let failed = failing.admit(0, Some(0));
        assert_eq!(failed.stream.unwrap().length(), Duration::from_millis(100));
        assert_eq!(failing.in_flight(100_000), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_streamed_answer_keeps_its_attempt_open_until_it_ends() {
        use http_body_util::BodyExt;
        let scenario = scenarios::STREAMS.scenario().with_qps(10.0);
        let backend = Backend::new(&scenario, Instant::now());
        let response = backend
            .clone()
            .call(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        assert_eq!(backend.model().open(), 1, "open while it streams");
        let Either::Right(stream) = response.into_body() else {
            panic!("a stream");
        };
        let length = stream.plan().length();
        let started = Instant::now();
        let body = stream.collect().await.unwrap().to_bytes();
        assert_eq!(started.elapsed(), length);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
        assert_eq!(backend.model().open(), 0);
        // Dropped half way, it is closed as well.
        let response = backend
            .clone()
            .call(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(backend.model().open(), 1);
        drop(response);
        assert_eq!(backend.model().open(), 0);
        // Where the scenario does not stream, a success is one JSON body, as before.
        let seed = Backend::new(&scenarios::SEED.scenario(), Instant::now());
        let response = seed
            .clone()
            .call(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert!(matches!(response.body(), Either::Left(_)));
        assert!(response.headers().get(CONTENT_TYPE).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_continuation_is_answered_from_where_its_prefill_ends() {
        use http_body_util::BodyExt;
        let scenario = scenarios::STREAMS.scenario().with_qps(10.0);
        let backend = Backend::new(&scenario, Instant::now());
        let send = |body: &'static str| {
            let mut request = Request::new(Full::new(Bytes::from_static(body.as_bytes())));
            request
                .headers_mut()
                .insert(REQUEST_ID, HeaderValue::from(7));
            backend.clone().call(request)
        };
        let first_chunk = |response: Response<ProviderBody>| async move {
            let Either::Right(stream) = response.into_body() else {
                panic!("a stream");
            };
            let first_token = stream.plan().first_token;
            let mut stream = std::pin::pin!(stream);
            stream.frame().await.unwrap().unwrap(); // the role
            let chunk = stream.frame().await.unwrap().unwrap().into_data().unwrap();
            (first_token, String::from_utf8(chunk.to_vec()).unwrap())
        };
        let original = r#"{"messages":[{"role":"user","content":"Summarise the incident."}]}"#;
        let (from, chunk) = first_chunk(send(original).await.unwrap()).await;
        assert_eq!(from, 0);
        assert!(chunk.contains(r#""content":" t0 t1 t2 t3 t4""#), "{chunk}");
        let continuation = r#"{"messages":[{"role":"user","content":"Summarise the incident."},{"role":"assistant","content":" t0 t1 t2 t3 t4 t5 t6"}]}"#;
        let (from, chunk) = first_chunk(send(continuation).await.unwrap()).await;
        assert_eq!(from, 7);
        assert!(
            chunk.contains(r#""content":" t7 t8 t9 t10 t11""#),
            "{chunk}"
        );
        // Another attempt of the same request, in the provider's count.
        assert_eq!(backend.model().stats().retries, 1);
    }
}
