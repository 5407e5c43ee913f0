//! [`RateLimit`]: the shared limit, its keys, and the [`Reservation`] and [`RateLimitPermit`] a request
//! holds.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use stormguard_classify::polled_after_completion;
use stormguard_classify::{Outcome, Permit, Reason};
use stormguard_numbers::window::SlidingWindow;
use tokio::time::Instant;

use crate::gcra::{Gcra, Slot};
use crate::learn::{Cubic, Stated, believed};
use crate::store::{FleetDimension, FleetStore, Store};
use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::{RateLimitCause, RateLimitConfig, RateLimited};

/// Picks a request's key in a keyed limit.
type KeyFn = dyn Fn(&Parts) -> Option<HeaderValue> + Send + Sync;

/// A requests- and tokens-per-minute rate limit, shared by every clone: see the [crate
/// docs](crate).
///
/// Before each attempt, [`reserve`](Self::reserve) a slot for it: a [`Reservation`] that says
/// when it may go (now, or after a wait within `max_wait` and the request's deadline), or
/// [`RateLimited`]. Wait until [`Reservation::start`], then [`send`](Reservation::send) it, and
/// tell the [`RateLimitPermit`] what the provider answered
/// ([`record`](stormguard_classify::Permit::record)). A reservation dropped before it is sent
/// gives its slot back. The retry engine's `with_rate_limit` and the
/// [`RateLimitLayer`](crate::RateLimitLayer) do all of this.
#[derive(Clone)]
pub struct RateLimit {
    shared: Arc<Shared>,
}

struct Shared {
    config: RateLimitConfig,
    origin: Instant,
    /// Whether the rate sent is counted: only a limit that may learn its request rate from 429s
    /// needs it (and the count is a write every thread shares).
    counts_sent: bool,
    /// The bucket of requests without a key.
    unkeyed: Arc<Bucket>,
    keyed: Option<Keyed>,
}

struct Keyed {
    key: Box<KeyFn>,
    buckets: Mutex<HashMap<HeaderValue, Arc<Bucket>>>,
}

/// One key's limit: a GCRA per dimension, and what it learned.
struct Bucket {
    requests: Gcra,
    tokens: Gcra,
    /// Requests sent over the last second (counted when they go, not when they reserve: a
    /// queue of reservations runs up to `max_wait` ahead of the rate the provider sees), for
    /// CUBIC.
    sent: SlidingWindow<1>,
    /// Set once a limit was learned for a dimension that has no configured one (so that
    /// reservations skip the lock otherwise).
    adaptive: AtomicBool,
    learned: Mutex<Learned>,
    /// When the bucket was last used, nanoseconds since the origin.
    used: AtomicU64,
    /// What the provider last said was left of each quota (requests, tokens): see [`Left`].
    left: [Left; 2],
    /// With a fleet: this replica's share of the limit (requests, tokens), which decides while
    /// Redis is away, and counts the slots Redis gives this replica while it answers.
    share: Option<[Gcra; 2]>,
    /// With a fleet: the units (requests, tokens) this replica holds reserved and has not sent,
    /// decided in Redis or on the share. They go whether Redis answers or not: the share counts
    /// them as spent when it decides (see [`Gcra::owe`]).
    reserved: [AtomicU64; 2],
    /// With a fleet: the bucket's keys in its store.
    fleet: Option<<FleetStore as Store>::Keys>,
}

/// What a bucket learned from the provider.
#[derive(Default)]
struct Learned {
    /// Limits the provider stated, a minute.
    requests: Option<u64>,
    tokens: Option<u64>,
    /// The request rate learned from 429s, when no limit was stated or configured.
    cubic: Option<Cubic>,
}

/// What a limit holds now, as returned by [`RateLimit::snapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitSnapshot {
    /// Requests a minute in force (configured, stated by the provider, or learned from its 429s);
    /// `None`: no limit.
    pub requests_per_minute: Option<u64>,
    /// Tokens a minute in force; `None`: no limit.
    pub tokens_per_minute: Option<u64>,
    /// Requests that could go at once now.
    pub requests_available: Option<u64>,
    /// Tokens that could go at once now.
    pub tokens_available: Option<u64>,
    /// Keys held (a keyed limit).
    pub keys: usize,
}

impl RateLimit {
    /// One limit for every request, with the settings of `config`.
    pub fn new(config: RateLimitConfig) -> Self {
        Self::build(config, None)
    }

    /// One limit per key: `key` picks a request's key from its head (a header: the caller's API
    /// key, a model or provider name set by a layer above); requests with no key share one
    /// limit. Every key gets the settings of `config`, learns on its own, and is forgotten when
    /// room is needed after it was idle (see [`RateLimitConfig::with_keys`]).
    ///
    /// ```
    /// use stormguard_rate_limit::{RateLimit, RateLimitConfig};
    ///
    /// let per_caller = RateLimit::keyed(
    ///     RateLimitConfig::default().with_requests_per_minute(Some(60)),
    ///     |head| head.headers.get("x-api-key").cloned(),
    /// );
    /// # let _ = per_caller;
    /// ```
    pub fn keyed<F>(config: RateLimitConfig, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<HeaderValue> + Send + Sync + 'static,
    {
        Self::build(
            config,
            Some(Keyed {
                key: Box::new(key),
                buckets: Mutex::new(HashMap::new()),
            }),
        )
    }

    fn build(config: RateLimitConfig, keyed: Option<Keyed>) -> Self {
        let origin = Instant::now();
        Self {
            shared: Arc::new(Shared {
                unkeyed: Arc::new(Bucket::new(&config, 0, None)),
                counts_sent: config.learning() && config.requests_per_minute().is_none(),
                config,
                origin,
                keyed,
            }),
        }
    }

    /// The settings this limit was made with.
    pub fn config(&self) -> &RateLimitConfig {
        &self.shared.config
    }

    /// Whether requests must be weighed in tokens (a tokens-per-minute limit is configured or was
    /// stated by the provider): when not, [`reserve`](Self::reserve) ignores the weight and the
    /// body need not be read for it.
    pub fn weighs_tokens(&self, head: &Parts) -> bool {
        self.shared.config.tokens_per_minute().is_some() || {
            let key = self
                .shared
                .bucket_of(head, self.shared.nanos(Instant::now()));
            self.shared.bucket(&key).tokens.per_minute().is_some()
        }
    }

    /// Reserves a slot for the request with head `head`, weighing `tokens`, that may wait until
    /// `deadline` at most (and never longer than `max_wait`).
    ///
    /// The slot is taken in every dimension at once, first come first served: a request that
    /// waits keeps its place ahead of those that come after it. Refused with [`RateLimited`] when
    /// the slot would come too late (nothing is taken then) or the request weighs more tokens
    /// than a minute's quota.
    pub fn reserve(
        &self,
        head: &Parts,
        tokens: u64,
        deadline: Option<Instant>,
    ) -> Result<Reservation, RateLimited> {
        let (key, tokens) = self.weigh(head, tokens)?;
        self.decide_here(key, tokens, deadline)
    }

    /// Reserves a slot as [`reserve`](Self::reserve) does, deciding where the limit's state is:
    /// in this process, or with a [fleet](crate::Fleet) in Redis (one round trip, or the local
    /// share when Redis is away or slower than the fleet's timeout). The decision is ready at
    /// once ([`Acquire::now`]) unless Redis is asked.
    pub fn acquire(&self, head: &Parts, tokens: u64, deadline: Option<Instant>) -> Acquire {
        if let Some(fleet) = self.shared.config.store() {
            return match self.weigh(head, tokens) {
                Ok((key, tokens)) => self.ask(fleet, key, tokens, deadline),
                Err(limited) => Acquire::decided(Err(limited)),
            };
        }
        Acquire::decided(self.reserve(head, tokens, deadline))
    }

    /// The bucket of the request with head `head` (`None`: the unkeyed one) and the tokens it
    /// weighs there, or its refusal if it is heavier than the bucket's minute.
    fn weigh(&self, head: &Parts, tokens: u64) -> Result<(Option<Arc<Bucket>>, u64), RateLimited> {
        let shared = &*self.shared;
        let at = shared.nanos(Instant::now());
        let key = shared.bucket_of(head, at);
        let bucket = shared.bucket(&key);
        if key.is_some() {
            bucket.used.store(at, Ordering::Relaxed);
        }
        bucket.adapt(shared, at);
        let Some(per_minute) = bucket.tokens.per_minute() else {
            return Ok((key, 0));
        };
        if tokens > per_minute {
            let cause = RateLimitCause::TooHeavy { tokens, per_minute };
            return Err(RateLimited::new(Duration::from_secs(60), cause));
        }
        Ok((key, tokens))
    }

    /// Decides in this process: on the whole limit, or, with a fleet, on this replica's share.
    fn decide_here(
        &self,
        key: Option<Arc<Bucket>>,
        tokens: u64,
        deadline: Option<Instant>,
    ) -> Result<Reservation, RateLimited> {
        let shared = &*self.shared;
        let now = Instant::now();
        let at = shared.nanos(now);
        let bucket = shared.bucket(&key);
        if let Some(share) = bucket.local_share(shared, at) {
            shared.decided_locally();
            bucket.owe_reserved(share, at);
        }
        let [requests, token_gcra] = bucket.dimensions(true);
        let max_wait = nanos_of(shared.max_wait(now, deadline));
        let refused =
            |wait: u64| RateLimited::new(Duration::from_nanos(wait), RateLimitCause::Wait);
        let request_slot = requests.reserve(at, 1, max_wait).map_err(refused)?;
        let token_slot = match token_gcra.reserve(at, tokens, max_wait) {
            Ok(slot) => slot,
            Err(wait) => {
                requests.give_back(request_slot);
                return Err(refused(wait));
            }
        };
        let start = request_slot.start.max(token_slot.start);
        let taken = Taken::Here {
            share: bucket.share.is_some(),
            requests: request_slot,
            tokens: token_slot,
        };
        Ok(Reservation {
            permit: RateLimitPermit::new(Arc::clone(&self.shared), key, tokens, at, taken),
            start: shared.origin + Duration::from_nanos(start),
        })
    }

    /// Asks the fleet's Redis for the slot: a decision to wait for, or the local share's at once
    /// while Redis is away.
    fn ask(
        &self,
        fleet: &FleetStore,
        key: Option<Arc<Bucket>>,
        tokens: u64,
        deadline: Option<Instant>,
    ) -> Acquire {
        let shared = &*self.shared;
        let now = Instant::now();
        let at = shared.nanos(now);
        let bucket = shared.bucket(&key);
        let dimensions = [
            FleetDimension::of(&bucket.requests, 1),
            FleetDimension::of(&bucket.tokens, tokens),
        ];
        let blocked =
            [&bucket.requests, &bucket.tokens].map(|gcra| gcra.blocked().saturating_sub(at));
        let Some(keys) = &bucket.fleet else {
            return Acquire::decided(self.decide_here(key, tokens, deadline));
        };
        let max_wait = nanos_of(shared.max_wait(now, deadline));
        let Some(call) = fleet.reserve(keys, blocked, &dimensions, max_wait) else {
            return Acquire::decided(self.decide_here(key, tokens, deadline));
        };
        let limit = self.clone();
        Acquire::asking(Box::pin(async move {
            match call.await {
                Some(reply) => limit.decided_in_fleet(key, tokens, deadline, &reply, dimensions),
                // Past the timeout the reply is never read: the share's decision is the only
                // one. The slot the script may still take in Redis stays taken there: it is the
                // fleet's count of the request the share lets go.
                None => limit.decide_here(key, tokens, deadline),
            }
        }))
    }

    /// The fleet's decision, from the script's reply.
    fn decided_in_fleet(
        &self,
        key: Option<Arc<Bucket>>,
        tokens: u64,
        deadline: Option<Instant>,
        reply: &[String],
        mut dimensions: [FleetDimension; 2],
    ) -> Result<Reservation, RateLimited> {
        let number = |i: usize| reply.get(i).and_then(|text| text.parse::<u64>().ok());
        let (Some(wait), Some(replicas)) = (number(1), number(2)) else {
            // Not the script's reply: decide here.
            return self.decide_here(key, tokens, deadline);
        };
        if let Some(fleet) = self.shared.config.store() {
            fleet.decided(u32::try_from(replicas).unwrap_or(u32::MAX));
        }
        let wait = Duration::from_micros(wait);
        if reply.first().map(String::as_str) != Some("1") {
            return Err(RateLimited::new(wait, RateLimitCause::Wait));
        }
        let now = Instant::now();
        for (shape, end) in dimensions.iter_mut().zip(reply.iter().skip(3)) {
            shape.end.clone_from(end);
        }
        let at = self.shared.nanos(now);
        // The share counts this replica's slots from Redis: if Redis goes away, the slots it
        // gave still go, and the share's bucket is no fuller than empty after the last of them.
        // Until each is sent or given back, the share also counts it as held (`reserved`).
        if let Some(share) = self.shared.bucket(&key).local_share(&self.shared, at) {
            let start = at.saturating_add(nanos_of(wait));
            for ((gcra, shape), units) in share.iter().zip(&mut dimensions).zip([1, tokens]) {
                shape.share = gcra.charge(start, units);
            }
        }
        let taken = Taken::Fleet(Box::new(dimensions));
        Ok(Reservation {
            permit: RateLimitPermit::new(Arc::clone(&self.shared), key, tokens, at, taken),
            start: now + wait,
        })
    }

    /// The share of its quota the limit could let go at once, from 0 (none: the quota is spent,
    /// or the limit is pacing) to 1 (its whole bucket, or no limit known): the lower of its
    /// dimensions, each the lower of its own bucket's level and what the provider last said was
    /// left (`x-ratelimit-remaining-*` / `anthropic-ratelimit-*-remaining` over the limit, until
    /// its reset). Of the unkeyed bucket. A balancer sends less to a backend with less headroom
    /// before it meets a 429.
    pub fn headroom(&self) -> f64 {
        let at = self.shared.nanos(Instant::now());
        self.shared.unkeyed.headroom(at)
    }

    /// The limit of requests without a key (the only one of an unkeyed limit).
    pub fn snapshot(&self) -> RateLimitSnapshot {
        let shared = &*self.shared;
        let at = shared.nanos(Instant::now());
        let bucket = &shared.unkeyed;
        let keys = shared.keyed.as_ref().map_or(0, |keyed| keyed.lock().len());
        RateLimitSnapshot {
            requests_per_minute: bucket.requests.per_minute(),
            tokens_per_minute: bucket.tokens.per_minute(),
            requests_available: bucket.requests.level(at).map(|(_, free)| free),
            tokens_available: bucket.tokens.level(at).map(|(_, free)| free),
            keys,
        }
    }
}

impl Default for RateLimit {
    /// A limit with no configured numbers: it learns them from the provider.
    fn default() -> Self {
        Self::new(RateLimitConfig::default())
    }
}

impl fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("config", &self.shared.config)
            .field("keyed", &self.shared.keyed.is_some())
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Shared {
    fn nanos(&self, now: Instant) -> u64 {
        nanos_of(now.saturating_duration_since(self.origin))
    }

    /// The longest a request reserving at `now` may wait for its slot.
    fn max_wait(&self, now: Instant, deadline: Option<Instant>) -> Duration {
        let max_wait = self.config.max_wait();
        deadline.map_or(max_wait, |deadline| {
            max_wait.min(deadline.saturating_duration_since(now))
        })
    }

    /// The replicas sharing the limit: 1 without a fleet.
    fn replicas(&self) -> u32 {
        self.config.store().map_or(1, Store::share)
    }

    /// Counts a decision made on the local share of a fleet's quota.
    fn decided_locally(&self) {
        if let Some(fleet) = self.config.store() {
            fleet.decided_locally();
        }
    }

    /// The bucket of a key (`None`: the unkeyed one).
    fn bucket<'a>(&'a self, key: &'a Option<Arc<Bucket>>) -> &'a Bucket {
        key.as_deref().unwrap_or(&self.unkeyed)
    }

    /// The bucket of the request with head `head`: its key's (made if new), or `None` for the
    /// unkeyed one.
    fn bucket_of(&self, head: &Parts, at: u64) -> Option<Arc<Bucket>> {
        let keyed = self.keyed.as_ref()?;
        let key = (keyed.key)(head)?;
        let mut buckets = keyed.lock();
        if let Some(bucket) = buckets.get(&key) {
            return Some(Arc::clone(bucket));
        }
        let (max_keys, idle) = self.config.keys();
        if buckets.len() >= max_keys {
            // Forget the idle keys; if none is, the least recently used.
            let idle_since = at.saturating_sub(nanos_of(idle));
            buckets.retain(|_, bucket| bucket.used.load(Ordering::Relaxed) > idle_since);
            if buckets.len() >= max_keys
                && let Some(oldest) = buckets
                    .iter()
                    .min_by_key(|(_, bucket)| bucket.used.load(Ordering::Relaxed))
                    .map(|(key, _)| key.clone())
            {
                buckets.remove(&oldest);
            }
        }
        let bucket = Arc::new(Bucket::new(&self.config, at, Some(key.as_bytes())));
        buckets.insert(key, Arc::clone(&bucket));
        Some(bucket)
    }
}

impl Keyed {
    fn lock(&self) -> MutexGuard<'_, HashMap<HeaderValue, Arc<Bucket>>> {
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Bucket {
    /// A bucket for the key `key` (`None`: the unkeyed bucket).
    fn new(config: &RateLimitConfig, at: u64, key: Option<&[u8]>) -> Self {
        let fleet = config.store().map(|fleet| fleet.keys(key));
        let share = fleet.as_ref().map(|_| {
            let dimension = || Gcra::new(None, config.burst());
            [dimension(), dimension()]
        });
        Self {
            share,
            reserved: [AtomicU64::new(0), AtomicU64::new(0)],
            fleet,
            requests: Gcra::new(config.requests_per_minute(), config.burst()),
            tokens: Gcra::new(config.tokens_per_minute(), config.burst()),
            sent: SlidingWindow::new(Duration::from_secs(1), 10),
            adaptive: AtomicBool::new(false),
            learned: Mutex::new(Learned::default()),
            used: AtomicU64::new(at),
            left: [Left::default(), Left::default()],
        }
    }

    /// The share of the bucket it could take at `at`, the lower of its dimensions, of its own
    /// pacing and of what the provider last said was left (1: nothing known, or no limit).
    fn headroom(&self, at: u64) -> f64 {
        let paced = [&self.requests, &self.tokens].map(|gcra| match gcra.level(at) {
            Some((burst, free)) if burst > 0 => free as f64 / burst as f64,
            _ => 1.0,
        });
        let stated = self.left.each_ref().map(|left| left.at(at));
        paced.into_iter().chain(stated).fold(1.0, f64::min)
    }

    /// With a fleet, this replica's share of the limit (requests, tokens), made to follow the
    /// limit's rates and blocks as they are at `at`.
    fn local_share(&self, shared: &Shared, at: u64) -> Option<&[Gcra; 2]> {
        let share = self.share.as_ref()?;
        let (replicas, burst) = (shared.replicas(), shared.config.burst());
        share[0].follow(&self.requests, replicas, burst, at);
        share[1].follow(&self.tokens, replicas, burst, at);
        Some(share)
    }

    /// Charges a fleet's local share, at `at`, with every unit this replica holds reserved and
    /// has not sent: the slots Redis gave it before it went away (or whose answers came before
    /// the share's decisions) go all the same, and the share's bucket holds no more than its
    /// room less them.
    fn owe_reserved(&self, share: &[Gcra; 2], at: u64) {
        for (gcra, reserved) in share.iter().zip(&self.reserved) {
            gcra.owe(at, reserved.load(Ordering::Acquire));
        }
    }

    /// With a fleet, counts `units` (requests, tokens) as reserved and not sent.
    fn hold(&self, units: [u64; 2]) {
        if self.share.is_some() {
            for (reserved, units) in self.reserved.iter().zip(units) {
                reserved.fetch_add(units, Ordering::AcqRel);
            }
        }
    }

    /// With a fleet, counts `units` held by [`hold`](Self::hold) as sent or given back.
    fn release(&self, units: [u64; 2]) {
        if self.share.is_some() {
            for (reserved, units) in self.reserved.iter().zip(units) {
                let _ = reserved.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    Some(n.saturating_sub(units))
                });
            }
        }
    }

    /// The requests and tokens that decide here: the whole limit, or (`share`) a fleet's local
    /// share.
    fn dimensions(&self, share: bool) -> [&Gcra; 2] {
        match (&self.share, share) {
            (Some([requests, tokens]), true) => [requests, tokens],
            _ => [&self.requests, &self.tokens],
        }
    }

    fn learned(&self) -> MutexGuard<'_, Learned> {
        self.learned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests sent over the last second; by the fleet, when there is one (this replica's
    /// times the replicas: a balanced fleet's).
    fn sent_rate(&self, shared: &Shared) -> f64 {
        self.sent.sum(self.sent.epoch_now(), 0) as f64 * f64::from(shared.replicas())
    }

    /// Moves the request rate along its CUBIC curve, if it is learned from 429s.
    fn adapt(&self, shared: &Shared, at: u64) {
        if !self.adaptive.load(Ordering::Acquire) {
            return;
        }
        let learned = self.learned();
        if let Some(cubic) = learned.cubic {
            let rate = cubic.rate(seconds(at), self.sent_rate(shared));
            self.requests
                .set_rate(Some(per_minute(rate)), shared.config.burst());
        }
    }

    /// Learns from one response of the provider, to a request reserved at `reserved`.
    fn learn(&self, shared: &Shared, headers: &HeaderMap, outcome: &Outcome, reserved: u64) {
        let config = &shared.config;
        let at = shared.nanos(Instant::now());
        let stated = Stated::read(headers, SystemTime::now());
        // Quotas the provider says are spent: nothing goes before they are whole again.
        for ((gcra, left), quota) in [&self.requests, &self.tokens]
            .into_iter()
            .zip(&self.left)
            .zip([stated.requests, stated.tokens])
        {
            if let Some(spent_for) = quota.spent_for() {
                gcra.block_until(at.saturating_add(nanos_of(spent_for)));
            }
            if let Some((share, holds)) = quota.left() {
                left.set(share, at.saturating_add(nanos_of(holds)));
            }
        }
        let throttled = outcome.reason() == Reason::RateLimited;
        if throttled && let Some(hint) = outcome.retry_after().and_then(believed) {
            self.requests.block_until(at.saturating_add(nanos_of(hint)));
        }
        let unknown_requests = config.requests_per_minute().is_none();
        let unknown_tokens = config.tokens_per_minute().is_none();
        if !(unknown_requests && (stated.requests.limit.is_some() || throttled)
            || unknown_tokens && stated.tokens.limit.is_some())
        {
            return;
        }
        let mut learned = self.learned();
        if unknown_requests && let Some(limit) = stated.requests.limit {
            if learned.requests != Some(limit) {
                self.requests
                    .set_rate(Some(clamp_u32(limit)), config.burst());
                learned.requests = Some(limit);
            }
            learned.cubic = None;
        } else if unknown_requests
            && throttled
            && learned.requests.is_none()
            && learned
                .cubic
                .is_none_or(|cubic| cubic.paced(seconds(reserved)))
        {
            // No numbers at all: CUBIC from the rate that met this 429. A 429 to a request
            // reserved before the last cut met the rate already cut: it says nothing new.
            let rate = self.requests.per_minute().map(|n| n as f64 / 60.0);
            learned.cubic = Some(Cubic::throttled(seconds(at), self.sent_rate(shared), rate));
            self.adaptive.store(true, Ordering::Release);
        }
        if unknown_tokens
            && let Some(limit) = stated.tokens.limit
            && learned.tokens != Some(limit)
        {
            self.tokens.set_rate(Some(clamp_u32(limit)), config.burst());
            learned.tokens = Some(limit);
        }
        self.adaptive
            .store(learned.cubic.is_some(), Ordering::Release);
    }
}

/// What a provider last said was left of one quota, as a share of it (`f64` bits), and until
/// when that holds (nanoseconds since the origin; 0: nothing said). Two atomics, written apart:
/// a reader that meets one of two concurrent writes reads another recent figure, which is all a
/// headroom needs.
#[derive(Debug, Default)]
struct Left {
    share: AtomicU64,
    until: AtomicU64,
}

impl Left {
    fn set(&self, share: f64, until: u64) {
        self.share.store(share.to_bits(), Ordering::Relaxed);
        self.until.store(until, Ordering::Relaxed);
    }

    /// The share left at `at`: 1 once what was said no longer holds.
    fn at(&self, at: u64) -> f64 {
        if at >= self.until.load(Ordering::Relaxed) {
            return 1.0;
        }
        f64::from_bits(self.share.load(Ordering::Relaxed))
    }
}

/// A slot reserved for one request: wait until [`start`](Self::start), then
/// [`send`](Self::send) it. Dropped unsent (the caller gave up waiting, a layer below refused the
/// request), it gives the slot back as far as no two requests then share one: all of it if no
/// request reserved after it, else at most the room a one-unit request leaves in the bucket.
pub struct Reservation {
    permit: RateLimitPermit,
    start: Instant,
}

impl Reservation {
    /// When the request may go.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The request goes: the slot is spent.
    pub fn send(self) -> RateLimitPermit {
        let mut permit = self.permit;
        permit.unsent = false;
        let bucket = permit.shared.bucket(&permit.key);
        bucket.release([1, permit.tokens]);
        if permit.shared.counts_sent {
            bucket.sent.add(bucket.sent.epoch_now(), 0);
        }
        permit
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("start", &self.start)
            .field("tokens", &self.permit.tokens)
            .finish()
    }
}

/// A decision on a request's slot, as [`RateLimit::acquire`] returns it: ready at once
/// ([`now`](Self::now)) unless the limit asks its fleet's Redis, then a future to await.
pub struct Acquire {
    admission: Admission,
}

enum Admission {
    Made(Option<Result<Reservation, RateLimited>>),
    Asking(Pin<Box<dyn Future<Output = Result<Reservation, RateLimited>> + Send>>),
}

impl Acquire {
    fn decided(result: Result<Reservation, RateLimited>) -> Self {
        Self {
            admission: Admission::Made(Some(result)),
        }
    }

    fn asking(
        future: Pin<Box<dyn Future<Output = Result<Reservation, RateLimited>> + Send>>,
    ) -> Self {
        Self {
            admission: Admission::Asking(future),
        }
    }

    /// The decision, if it was made without waiting for Redis (always, without a fleet).
    pub fn now(&mut self) -> Option<Result<Reservation, RateLimited>> {
        match &mut self.admission {
            Admission::Made(made) => made.take(),
            Admission::Asking(_) => None,
        }
    }
}

impl Future for Acquire {
    type Output = Result<Reservation, RateLimited>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.admission {
            Admission::Made(made) => match made.take() {
                Some(result) => Poll::Ready(result),
                None => polled_after_completion("rate limit Acquire"),
            },
            Admission::Asking(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let asking = !matches!(self.admission, Admission::Made(_));
        f.debug_struct("Acquire").field("asking", &asking).finish()
    }
}

/// A request that went ([`Reservation::send`]), following stormguard's admission protocol
/// ([`Permit`]): told the attempt's outcome and its answer's headers, the limit learns from them
/// (the limits the provider states, a quota it says is spent, a 429 and its `Retry-After`; see the
/// crate docs). Dropped untold, the slot stays spent: the request went. With a
/// [fleet](crate::Fleet), a spent quota and a `Retry-After` are written to Redis at once (in the
/// background), for every replica.
pub struct RateLimitPermit {
    shared: Arc<Shared>,
    /// The key's bucket (`None`: the unkeyed one).
    key: Option<Arc<Bucket>>,
    /// The tokens the request was weighed at.
    tokens: u64,
    /// When it was reserved, nanoseconds since the origin.
    reserved: u64,
    /// What the reservation took, and where.
    taken: Taken,
    /// The request was not sent (yet): what it took is given back if it never is.
    unsent: bool,
}

/// What a reservation took, and where.
enum Taken {
    /// From the bucket in this process: the whole limit, or (`share`) a fleet's local share.
    Here {
        share: bool,
        requests: Slot,
        tokens: Slot,
    },
    /// From the fleet's bucket in its store: the requests' and tokens' dimensions and the TATs left.
    Fleet(Box<[FleetDimension; 2]>),
}

impl RateLimitPermit {
    fn new(
        shared: Arc<Shared>,
        key: Option<Arc<Bucket>>,
        tokens: u64,
        reserved: u64,
        taken: Taken,
    ) -> Self {
        shared.bucket(&key).hold([1, tokens]);
        Self {
            shared,
            key,
            tokens,
            reserved,
            taken,
            unsent: true,
        }
    }

    /// What corrects the request's token weight to the usage its answer reports, once the answer
    /// is read: `Some` when the limit counts tokens and
    /// [corrects](RateLimitConfig::with_usage_correction) them.
    pub fn usage(&self) -> Option<Usage> {
        if self.tokens == 0 || !self.shared.config.usage_correction() {
            return None;
        }
        let place = match &self.taken {
            Taken::Here { share, .. } => Place::Here { share: *share },
            Taken::Fleet(dimensions) => Place::Fleet {
                interval: dimensions[1].interval.clone(),
            },
        };
        Some(Usage {
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
            tokens: self.tokens,
            place,
        })
    }

    /// The tokens the request was weighed at (0 when the limit does not count tokens).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

impl Permit for RateLimitPermit {
    fn record(self, outcome: &Outcome, headers: &HeaderMap) {
        if !self.shared.config.learning() {
            return;
        }
        let bucket = self.shared.bucket(&self.key);
        let blocked = [bucket.requests.blocked(), bucket.tokens.blocked()];
        bucket.learn(&self.shared, headers, outcome, self.reserved);
        if let (Some(fleet), Some(keys)) = (self.shared.config.store(), &bucket.fleet)
            && [bucket.requests.blocked(), bucket.tokens.blocked()] != blocked
        {
            // The provider said its quota is spent: every replica is to know now.
            let at = self.shared.nanos(Instant::now());
            let blocked =
                [&bucket.requests, &bucket.tokens].map(|gcra| gcra.blocked().saturating_sub(at));
            fleet.block(keys, blocked);
        }
    }
}

impl Drop for RateLimitPermit {
    fn drop(&mut self) {
        if !self.unsent {
            return;
        }
        let bucket = self.shared.bucket(&self.key);
        bucket.release([1, self.tokens]);
        match &self.taken {
            Taken::Here {
                share,
                requests,
                tokens,
            } => {
                let [request_gcra, token_gcra] = bucket.dimensions(*share);
                request_gcra.give_back(*requests);
                token_gcra.give_back(*tokens);
            }
            Taken::Fleet(dimensions) => {
                if let Some(share) = &bucket.share {
                    for (gcra, shape) in share.iter().zip(dimensions.iter()) {
                        gcra.give_back(shape.share);
                    }
                }
                if let (Some(fleet), Some(keys)) = (self.shared.config.store(), &bucket.fleet) {
                    fleet.give_back(keys, dimensions);
                }
            }
        }
    }
}

impl fmt::Debug for RateLimitPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitPermit")
            .field("tokens", &self.tokens)
            .finish()
    }
}

/// What corrects one request's token weight to the usage its answer reported
/// ([`RateLimitPermit::usage`]).
pub struct Usage {
    shared: Arc<Shared>,
    key: Option<Arc<Bucket>>,
    /// The tokens the request was weighed at.
    tokens: u64,
    place: Place,
}

/// Where the request's tokens were taken.
enum Place {
    /// From this process's bucket: the whole limit, or (`share`) a fleet's local share.
    Here { share: bool },
    /// From the fleet's bucket in its store, at this interval per token.
    Fleet { interval: String },
}

impl Usage {
    /// Corrects the request's weight to the `tokens` it really used (the response's `usage`):
    /// the difference is taken from, or given back to, the tokens of the minute.
    ///
    /// A usage above a minute's quota counts as the minute's quota: the provider admits no
    /// request heavier than that (nor does [`RateLimit::reserve`]), and the count comes from the
    /// network: a garbled or hostile one (2^64 - 1 tokens) would otherwise hold every request
    /// for centuries.
    pub fn settle(self, tokens: u64) {
        let bucket = self.shared.bucket(&self.key);
        let tokens = tokens.min(bucket.tokens.per_minute().unwrap_or(u64::MAX));
        let difference = i128::from(tokens) - i128::from(self.tokens);
        let difference =
            i64::try_from(difference).unwrap_or(if difference > 0 { i64::MAX } else { i64::MIN });
        match &self.place {
            Place::Here { share } => {
                let at = self.shared.nanos(Instant::now());
                bucket.dimensions(*share)[1].adjust(at, difference);
            }
            // The share keeps the weight it was charged: its charge may have been cut short at
            // an empty bucket, and giving back tokens it never took would leave it fuller than
            // this replica left it.
            Place::Fleet { interval } => {
                if let (Some(fleet), Some(keys)) = (self.shared.config.store(), &bucket.fleet) {
                    fleet.adjust(keys, interval, difference);
                }
            }
        }
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Usage")
            .field("tokens", &self.tokens)
            .finish()
    }
}

fn nanos_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn seconds(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

/// A rate a second as a whole number a minute, at least 1.
fn per_minute(rate: f64) -> u32 {
    let minute = (rate * 60.0).round();
    if minute >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        (minute as u32).max(1)
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    //! A fleet's local share on the paused clock. Redis's decisions come from a stand-in for the
    //! script, a GCRA of the fleet's numbers in this process, fed to the replica as the script's
    //! replies; no server is asked.

    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Fleet;

    /// 100 a second for the fleet; a replica's share of three is 33.3 a second (one every
    /// 30 ms) with a bucket of 33.
    const PER_MINUTE: u32 = 6_000;
    const REPLICAS: u32 = 3;
    /// Tasks that each take every slot they are given: the replica wants far more than its share.
    const TASKS: usize = 4;
    const SECOND: Duration = Duration::from_secs(1);

    fn share_rate() -> f64 {
        f64::from(PER_MINUTE / REPLICAS) / 60.0
    }

    /// A replica of three, never connected: nothing listens on port 1, and nothing asks it.
    fn replica() -> RateLimit {
        let fleet = Fleet::new("redis://127.0.0.1:1/")
            .unwrap()
            .with_replicas(Some(REPLICAS));
        RateLimit::new(
            RateLimitConfig::default()
                .with_requests_per_minute(Some(PER_MINUTE))
                .without_learning()
                .with_fleet(fleet),
        )
    }

    /// The fleet's bucket, as the script keeps it in Redis.
    fn redis() -> Arc<Gcra> {
        Arc::new(Gcra::new(Some(PER_MINUTE), RateLimitConfig::DEFAULT_BURST))
    }

    /// Decides in `redis` as the script would, and hands the replica the script's reply.
    fn from_redis(limit: &RateLimit, redis: &Gcra) -> Result<Reservation, RateLimited> {
        let shared = &*limit.shared;
        let at = shared.nanos(Instant::now());
        let replicas = REPLICAS.to_string();
        let reply = match redis.reserve(at, 1, nanos_of(shared.config.max_wait())) {
            Ok(slot) => {
                let wait = crate::fleet::micros(slot.start - at).to_string();
                vec!["1".into(), wait, replicas, String::new(), String::new()]
            }
            Err(wait) => vec!["0".into(), crate::fleet::micros(wait).to_string(), replicas],
        };
        let bucket = &shared.unkeyed;
        let dimensions = [
            FleetDimension::of(&bucket.requests, 1),
            FleetDimension::of(&bucket.tokens, 0),
        ];
        limit.decided_in_fleet(None, 0, None, &reply, dimensions)
    }

    /// Where a slot was decided.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Place {
        Redis,
        Share,
    }

    /// `tasks` tasks take every slot they are given until `until` (since now), deciding in
    /// `redis` while `answers` (the time since now) says Redis answers, on the share otherwise:
    /// when each slot started, since now, and where it was decided. A task refused (its slot
    /// would come later than it may wait) asks again when told, 50 ms at most.
    async fn drive(
        limit: &RateLimit,
        redis: &Arc<Gcra>,
        tasks: usize,
        answers: fn(Duration) -> bool,
        until: Duration,
    ) -> Vec<(Duration, Place)> {
        let begin = Instant::now();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let mut running = tokio::task::JoinSet::new();
        for _ in 0..tasks {
            let (limit, redis, starts) = (limit.clone(), Arc::clone(redis), Arc::clone(&starts));
            running.spawn(async move {
                while begin.elapsed() < until {
                    let (decision, place) = if answers(begin.elapsed()) {
                        (from_redis(&limit, &redis), Place::Redis)
                    } else {
                        (limit.decide_here(None, 0, None), Place::Share)
                    };
                    let reservation = match decision {
                        Ok(reservation) => reservation,
                        Err(limited) => {
                            let retry_after = limited.retry_after().min(SECOND / 20);
                            tokio::time::sleep(retry_after).await;
                            continue;
                        }
                    };
                    tokio::time::sleep_until(reservation.start()).await;
                    let started = reservation.start() - begin;
                    if started >= until {
                        break;
                    }
                    drop(reservation.send());
                    starts.lock().unwrap().push((started, place));
                }
            });
        }
        while let Some(task) = running.join_next().await {
            task.unwrap();
        }
        let mut starts = starts.lock().unwrap().clone();
        starts.sort_unstable_by_key(|(started, _)| *started);
        starts
    }

    /// The slots that started from `from` on (decided in `place`, if given).
    fn count(starts: &[(Duration, Place)], from: Duration, place: Option<Place>) -> usize {
        starts
            .iter()
            .filter(|(started, at)| *started >= from && place.is_none_or(|place| place == *at))
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn redis_away_for_4_s_leaves_a_replica_over_its_share_no_more_than_its_share() {
        let limit = replica();
        // Redis answers for 2 s, in which the replica, alone, takes the fleet's whole quota
        // (three times its share); then it is away for 4 s.
        let starts = drive(&limit, &redis(), TASKS, |t| t < 2 * SECOND, 6 * SECOND).await;
        let admitted = count(&starts, 2 * SECOND, None);
        // The slots Redis gave before it went away (one a task, at most) still go. On top of
        // them, the share's rate over the 4 s and nothing of its bucket: the replica spent far
        // more than its share's bucket through Redis in the second before.
        let budget = share_rate() * 4.0 + TASKS as f64 + 1.0;
        assert!(
            admitted as f64 <= budget,
            "admitted {admitted} in 4 s on a share of {:.1} a second: budget {budget:.1} ({} \
             decided in Redis, {} on the share)",
            share_rate(),
            count(&starts, 2 * SECOND, Some(Place::Redis)),
            count(&starts, 2 * SECOND, Some(Place::Share)),
        );
        // And the share does pace the rest: no refusals, at its rate.
        assert!(admitted as f64 >= share_rate() * 4.0 * 0.95, "{admitted}");
    }

    #[tokio::test(start_paused = true)]
    async fn one_late_answer_releases_no_burst_on_top_of_the_fleets_bucket() {
        let limit = replica();
        // One decision at 2 s is answered past the timeout (5 ms): it and every decision in
        // the 25 ms Redis is then left alone for are made on the share.
        let starts = drive(
            &limit,
            &redis(),
            TASKS,
            |t| !(2 * SECOND..2 * SECOND + Duration::from_millis(5 + 25)).contains(&t),
            4 * SECOND,
        )
        .await;
        let admitted = starts.len();
        let on_the_share = count(&starts, Duration::ZERO, Some(Place::Share));
        // The fleet's bucket at once, then its rate, as Redis decided; the share adds what it
        // gives each task that asked it in the pause (one slot each, at the share's pace from
        // the replica's last slot in Redis), never its bucket.
        let allowance = f64::from(PER_MINUTE) / 60.0 * (1.0 + 4.0);
        assert!(
            admitted as f64 <= allowance + TASKS as f64,
            "admitted {admitted} in 4 s for a fleet allowance of {allowance}: {on_the_share} on \
             the share"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_never_heard_from_redis_paces_at_its_share_from_the_start() {
        let limit = replica();
        // Redis never answers (a replica started while it was away, or whose first answers
        // came too late). It may have restarted: what it took before is unknown.
        let starts = drive(&limit, &redis(), TASKS, |_| false, 4 * SECOND).await;
        let admitted = starts.len();
        // One at once, then the share's rate: no bucket on top of what the fleet may have taken.
        let budget = 1.0 + share_rate() * 4.0;
        assert!(
            admitted as f64 <= budget,
            "admitted {admitted} in 4 s on a share of {:.1} a second: budget {budget:.1}",
            share_rate()
        );
        assert!(admitted as f64 >= share_rate() * 4.0 * 0.95, "{admitted}");
    }

    /// What the other replicas of three leave this one in Redis: two thirds of the quota,
    /// twice its share.
    fn redis_leaving_two_thirds() -> Arc<Gcra> {
        let per_minute = PER_MINUTE * 2 / REPLICAS;
        Arc::new(Gcra::new(Some(per_minute), RateLimitConfig::DEFAULT_BURST))
    }

    #[tokio::test(start_paused = true)]
    async fn slots_reserved_in_redis_before_it_went_away_are_charged_to_the_share() {
        let limit = replica();
        // Tasks enough to hold every slot Redis gives within the 2 s a request may wait: when
        // Redis goes away, at 2 s, the replica holds 133 slots reserved there for the next 2 s
        // (twice its share's rate), four seconds of its share. They go; then it is away for 4 s.
        let starts = drive(
            &limit,
            &redis_leaving_two_thirds(),
            150,
            |t| t < 2 * SECOND,
            6 * SECOND,
        )
        .await;
        let admitted = count(&starts, 2 * SECOND, None);
        let reserved = count(&starts, 2 * SECOND, Some(Place::Redis));
        // What the share allows over the 4 s, the slots reserved in Redis included: its rate,
        // and its bucket (33) once.
        let allowance = share_rate() * 4.0 + 33.0;
        assert!(
            admitted as f64 <= allowance + 1.0,
            "admitted {admitted} in 4 s away ({reserved} reserved in Redis before), on a share \
             of {:.1} a second: allowance {allowance:.1}",
            share_rate(),
        );
        assert!(
            reserved >= 120,
            "{reserved} reserved in Redis before it went away"
        );
        // No stall: at least the share's rate over the phase, and its rate once the reserved
        // slots are paid for (their 4 s of the share end by 6 s).
        assert!(admitted as f64 >= share_rate() * 4.0 * 0.95, "{admitted}");
        let last_second = count(&starts, 5 * SECOND, None);
        assert!(
            last_second as f64 >= share_rate() * 0.95,
            "{last_second} in the last second"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slots_reserved_in_redis_between_two_losses_are_charged_to_the_share() {
        /// When Redis answers again, for 100 ms.
        const BACK: std::ops::Range<Duration> =
            Duration::from_millis(2_500)..Duration::from_millis(2_600);
        let limit = replica();
        // Away at 2 s for half a second, back for 100 ms (Redis gives slots after those it gave
        // before, 2 s ahead at most), then away again for 4 s: what the replica holds reserved
        // then, from Redis or from its share, is the share's.
        let starts = drive(
            &limit,
            &redis_leaving_two_thirds(),
            150,
            |t| t < 2 * SECOND || BACK.contains(&t),
            BACK.end + 4 * SECOND,
        )
        .await;
        let admitted = count(&starts, BACK.end, None);
        let reserved = count(&starts, BACK.end, Some(Place::Redis));
        let allowance = share_rate() * 4.0 + 33.0;
        assert!(
            admitted as f64 <= allowance + 1.0,
            "admitted {admitted} in 4 s away ({reserved} reserved in Redis): allowance \
             {allowance:.1}"
        );
        assert!(admitted as f64 >= share_rate() * 4.0 * 0.95, "{admitted}");
    }
}
