//! What every clone of a [`FailoverService`](crate::FailoverService) shares: its backends, each
//! with its engine and what the balancer knows of it, and the failover's settings.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::request::Parts;
use stormguard_numbers::random::RandomSource;
use stormguard_retry::{ClientLayer, ClientService, Hedging, NotContinuing};
use tokio::time::Instant;

use crate::balance::Load;
use crate::{Backend, Cooldowns, Cure, Degraded};

/// What a sticky key is read with (see [`Failover::with_sticky_key`](crate::Failover::with_sticky_key)).
pub(crate) type StickyKey = Arc<dyn for<'a> Fn(&'a Parts) -> Option<&'a [u8]> + Send + Sync>;

/// What every clone of a failover service shares.
pub(crate) struct Shared<S, C, Bk> {
    pub(crate) layer: ClientLayer<C, Bk, NotContinuing>,
    pub(crate) engines: Vec<Engine<S, C, Bk>>,
    pub(crate) cures: Vec<(Cure, usize)>,
    pub(crate) degraded: Option<Degraded>,
    pub(crate) hedging: Option<Hedging>,
    /// The engines of each rank, in order.
    pub(crate) ranks: Vec<Range<usize>>,
    pub(crate) sticky: Option<StickyKey>,
    /// The balancer's draws.
    pub(crate) random: RandomSource,
    pub(crate) cooldowns: Option<Cooldowns>,
    /// A 429 moves the request to another backend free for it at once, and the backend that
    /// answered it cools (see [`Failover::with_hand_off_429`](crate::Failover::with_hand_off_429)).
    pub(crate) hand_off_429: bool,
    /// What the engines' cooling after a 429 is counted from.
    pub(crate) epoch: Instant,
}

/// A backend, its engine, and what the failover learned of it.
pub(crate) struct Engine<S, C, Bk> {
    pub(crate) backend: Backend,
    pub(crate) client: ClientService<S, C, Bk, NotContinuing>,
    pub(crate) load: Arc<Load>,
    /// How many times its breaker had opened when its cooldown was last shared.
    pub(crate) published: AtomicU64,
    /// Whether it was found to reject an assistant prefill (it answered a continuation 400, or
    /// its backend says so): it is not asked to continue a stream again.
    prefill_rejected: AtomicBool,
    /// Until when it cools after a 429, in nanoseconds after its failover's epoch (0: it never
    /// answered one): the other backends free for a request take it first until then.
    cools_until: AtomicU64,
}

impl<S, C, Bk> Engine<S, C, Bk> {
    pub(crate) fn new(backend: Backend, client: ClientService<S, C, Bk, NotContinuing>) -> Self {
        let prefill_rejected = AtomicBool::new(!backend.takes_prefill());
        Self {
            backend,
            client,
            load: Arc::default(),
            published: AtomicU64::new(0),
            prefill_rejected,
            cools_until: AtomicU64::new(0),
        }
    }

    /// Whether its backend takes an assistant prefill, as far as is known.
    pub(crate) fn takes_prefill(&self) -> bool {
        !self.prefill_rejected.load(Ordering::Relaxed)
    }

    /// It answered 429: it cools for `wait` from now (a longer cooling it was given holds).
    pub(crate) fn cool_for(&self, epoch: Instant, wait: Duration) {
        let until = Instant::now().checked_add(wait).map_or(u64::MAX, |until| {
            nanos(until.saturating_duration_since(epoch))
        });
        self.cools_until.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether it is cooling after a 429 (the clock is read only if it ever answered one).
    pub(crate) fn cooling_after_429(&self, epoch: Instant) -> bool {
        let until = self.cools_until.load(Ordering::Relaxed);
        until != 0 && nanos(epoch.elapsed()) < until
    }

    /// Its backend answered a continuation 400: it takes no prefill.
    pub(crate) fn reject_prefill(&self) {
        self.prefill_rejected.store(true, Ordering::Relaxed);
    }
}

/// `duration` in nanoseconds, saturated.
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The engines of each rank, from each backend's rank (in order, never decreasing).
pub(crate) fn ranges(ranks: &[usize]) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    for (index, rank) in ranks.iter().enumerate() {
        match ranges.last_mut() {
            Some(last) if ranks.get(last.start) == Some(rank) => last.end = index + 1,
            _ => ranges.push(index..index + 1),
        }
    }
    ranges
}
