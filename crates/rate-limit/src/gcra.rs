//! [`Gcra`]: one dimension of a rate limit (requests, or tokens), as the generic cell rate
//! algorithm's virtual scheduling, lock-free.

use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

/// One dimension of a limit: `rate` units per second, a bucket of `burst` units.
///
/// The state is one instant, the *theoretical arrival time* (TAT): when the bucket will be full
/// again if nothing more is taken. Taking `w` units moves it `w / rate` later; time catches up
/// with it. A request of `w` units may go at the earliest instant `t` at which the bucket holds
/// them, `TAT - t <= (burst - w) / rate`; one heavier than the bucket waits for it to be full
/// and leaves it in debt. This is the virtual-scheduling form of the generic cell rate
/// algorithm (ITU-T I.371, GCRA), weighted, with a reservation in place of a yes/no: the answer
/// is *when*, and the caller decides whether that is soon enough.
///
/// Instants are nanoseconds since the limit's origin; the TAT moves by compare-and-swap, so
/// concurrent reservations are ordered (first come, first served) and never over-admit. Under
/// `--cfg stormguard_loom` the atomics are loom's models: `tests/loom.rs` explores every
/// interleaving of racing reservations, give-backs, usage corrections and a learned rate.
#[derive(Debug)]
pub(crate) struct Gcra {
    /// Theoretical arrival time, in nanoseconds since the origin.
    tat: AtomicU64,
    /// Nanoseconds per unit (`1 / rate`, rounded up); 0: no limit.
    interval: AtomicU64,
    /// The rate as set, units a minute (0: no limit), which the rounded interval would misreport.
    per_minute: AtomicU64,
    /// Units the bucket holds.
    burst: AtomicU64,
    /// Nothing goes before this instant, in nanoseconds since the origin (0: no block): the
    /// provider said its quota is spent until then. Kept apart from the TAT so that it holds
    /// whatever the rate, even none, and whatever rate is learned after it.
    blocked: AtomicU64,
}

/// A reservation: when the units may go, and what they cost (to give back).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Nanoseconds since the origin at which the request may go.
    pub(crate) start: u64,
    /// Nanoseconds the reservation moved the TAT.
    pub(crate) cost: u64,
    /// The TAT it left: while it still is, no reservation came after it.
    pub(crate) end: u64,
}

impl Gcra {
    /// A dimension of `per_minute` units a minute (`None`: no limit), with a bucket of `burst`
    /// worth of them (at least one unit).
    pub(crate) fn new(per_minute: Option<u32>, burst: Duration) -> Self {
        let gcra = Self {
            tat: AtomicU64::new(0),
            interval: AtomicU64::new(0),
            per_minute: AtomicU64::new(0),
            burst: AtomicU64::new(1),
            blocked: AtomicU64::new(0),
        };
        gcra.set_rate(per_minute, burst);
        gcra
    }

    /// Changes the rate to `per_minute` units a minute (`None` or 0: no limit), keeping the
    /// debt already taken.
    pub(crate) fn set_rate(&self, per_minute: Option<u32>, burst: Duration) {
        let Some(per_minute) = per_minute.filter(|&n| n > 0) else {
            self.interval.store(0, Ordering::Release);
            self.per_minute.store(0, Ordering::Release);
            return;
        };
        // Rounded up: a limit that runs a few nanoseconds per unit slow never outpaces the
        // provider's, one that runs fast meets a 429 now and then.
        let interval = 60_000_000_000_u64.div_ceil(u64::from(per_minute));
        let units = (u128::from(per_minute) * burst.as_nanos() / 60_000_000_000).max(1);
        self.burst
            .store(u64::try_from(units).unwrap_or(u64::MAX), Ordering::Release);
        self.interval.store(interval.max(1), Ordering::Release);
        self.per_minute
            .store(u64::from(per_minute), Ordering::Release);
    }

    /// The rate in units a minute, if limited.
    pub(crate) fn per_minute(&self) -> Option<u64> {
        match self.per_minute.load(Ordering::Acquire) {
            0 => None,
            per_minute => Some(per_minute),
        }
    }

    /// Nanoseconds per unit and units the bucket holds, if limited.
    pub(crate) fn shape(&self) -> Option<(u64, u64)> {
        match self.interval.load(Ordering::Acquire) {
            0 => None,
            interval => Some((interval, self.burst.load(Ordering::Acquire))),
        }
    }

    /// The instant before which nothing goes (0: no block).
    pub(crate) fn blocked(&self) -> u64 {
        self.blocked.load(Ordering::Acquire)
    }

    /// Makes this dimension a share of `whole`: `1 / replicas` of its rate, and its block.
    ///
    /// A share that had no rate starts empty at `now` (a request of one unit may go then, the
    /// rest at the share's rate): the replica may have just started, or restarted, and what the
    /// fleet took in the last bucket's worth of time is not known here, so a full bucket could
    /// go on top of a fleet's bucket already spent.
    pub(crate) fn follow(&self, whole: &Gcra, replicas: u32, burst: Duration, now: u64) {
        let share = whole
            .per_minute()
            .map(|per_minute| (per_minute / u64::from(replicas.max(1))).max(1));
        let had_rate = self.per_minute().is_some();
        if share != self.per_minute() {
            let share = share.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            self.set_rate(share, burst);
        }
        if !had_rate && share.is_some() {
            let interval = self.interval.load(Ordering::Acquire);
            let burst = self.burst.load(Ordering::Acquire);
            self.tat
                .fetch_max(tat_empty_at(now, interval, burst), Ordering::AcqRel);
        }
        self.block_until(whole.blocked());
    }

    /// Counts `units` that go at `start` on a decision made elsewhere (a fleet's Redis gave this
    /// replica the slot), whether the bucket holds them or not, but leaves the bucket no emptier
    /// than empty at `start` with them taken. Older debt is forgotten: a replica that took more
    /// than its share through Redis (the others were idle) had it counted in the fleet's bucket,
    /// and its share only has to keep its own later decisions from going on top of that. Debt
    /// for slots still to go is not forgotten: [`owe`](Self::owe) counts them when the share
    /// decides.
    /// Returns what the bucket was charged, to give back as a reservation's slot is.
    pub(crate) fn charge(&self, start: u64, units: u64) -> Slot {
        let interval = self.interval.load(Ordering::Acquire);
        let cost = units.saturating_mul(interval);
        if cost == 0 {
            return Slot::default();
        }
        let empty = tat_empty_at(start, interval, self.burst.load(Ordering::Acquire));
        let next = |tat: u64| tat.max(tat.max(start).min(empty).saturating_add(cost));
        let (Ok(previous) | Err(previous)) =
            self.tat
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| Some(next(tat)));
        let end = next(previous);
        Slot {
            start,
            cost: end - previous,
            end,
        }
    }

    /// Counts `units` that are reserved and still to go, wherever they were decided (slots a
    /// fleet's Redis gave this replica go whether Redis answers or not): at `now` the bucket
    /// holds no more than its room less them, as if each had been taken here at `now`. Unlike
    /// [`charge`](Self::charge), nothing of them is forgotten: they have not gone yet.
    pub(crate) fn owe(&self, now: u64, units: u64) {
        let cost = units.saturating_mul(self.interval.load(Ordering::Acquire));
        if cost == 0 {
            return;
        }
        self.tat
            .fetch_max(now.saturating_add(cost), Ordering::AcqRel);
    }

    /// Reserves `units` at `now`, if they can go within `max_wait`: the slot, or how long until
    /// they could (nothing is taken then).
    pub(crate) fn reserve(&self, now: u64, units: u64, max_wait: u64) -> Result<Slot, u64> {
        let interval = self.interval.load(Ordering::Acquire);
        let blocked = self.blocked.load(Ordering::Acquire);
        if interval == 0 || units == 0 {
            let start = now.max(blocked);
            if start - now > max_wait {
                return Err(start - now);
            }
            return Ok(Slot {
                start,
                cost: 0,
                end: 0,
            });
        }
        let burst = self.burst.load(Ordering::Acquire);
        let cost = units.saturating_mul(interval);
        // The debt the bucket may hold before the request: its room, less the request.
        let room = burst.saturating_sub(units).saturating_mul(interval);
        let floor = empty_at(blocked, interval, burst);
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let start = now.max(tat.max(floor).saturating_sub(room));
            let wait = start - now;
            if wait > max_wait {
                return Err(wait);
            }
            let next = tat.max(floor).max(now).saturating_add(cost);
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Slot {
                        start,
                        cost,
                        end: next,
                    });
                }
                Err(current) => tat = current,
            }
        }
    }

    /// Gives back what a reservation took, for a request that was never sent.
    ///
    /// The last reservation gives back all it took. One with reservations after it gives back
    /// no more than the room a request of one unit leaves in the bucket, `burst - 1` units: those
    /// after it keep their slots, and with a bucket of one unit the next request would otherwise
    /// get the same slot as the last (a request of one unit a second, the slot at 1 s given back
    /// while another waits for 2 s: the next would get 2 s too). What is not given back is
    /// the slot itself, which nobody takes.
    pub(crate) fn give_back(&self, slot: Slot) {
        if slot.cost == 0 {
            return;
        }
        let interval = self.interval.load(Ordering::Acquire);
        let room = self
            .burst
            .load(Ordering::Acquire)
            .saturating_sub(1)
            .saturating_mul(interval);
        // Never below zero; a TAT in the past is an empty debt either way.
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                let back = if tat == slot.end {
                    slot.cost
                } else {
                    slot.cost.min(room)
                };
                Some(tat.saturating_sub(back))
            });
    }

    /// Takes `units` more (positive) or gives back `-units` (negative) after the fact: a
    /// request's weight corrected once its real usage is known.
    pub(crate) fn adjust(&self, now: u64, units: i64) {
        let interval = self.interval.load(Ordering::Acquire);
        let cost = units.unsigned_abs().saturating_mul(interval);
        if cost == 0 {
            return;
        }
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(if units > 0 {
                    tat.max(now).saturating_add(cost)
                } else {
                    tat.saturating_sub(cost)
                })
            });
    }

    /// Makes the bucket empty until `until` at least: the provider said so (no quota left until
    /// its reset, or a `Retry-After`). Nothing goes before it, and the bucket fills from empty
    /// at the rate in force then.
    pub(crate) fn block_until(&self, until: u64) {
        self.blocked.fetch_max(until, Ordering::AcqRel);
    }

    /// Units the bucket holds, and units it could take now.
    pub(crate) fn level(&self, now: u64) -> Option<(u64, u64)> {
        let interval = self.interval.load(Ordering::Acquire);
        if interval == 0 {
            return None;
        }
        let burst = self.burst.load(Ordering::Acquire);
        let floor = empty_at(self.blocked.load(Ordering::Acquire), interval, burst);
        let tat = self.tat.load(Ordering::Acquire).max(floor);
        let debt = tat.saturating_sub(now).div_ceil(interval);
        Some((burst, burst.saturating_sub(debt)))
    }
}

/// The TAT of a bucket empty at `blocked` (0: no block): a request of one unit may go then.
fn empty_at(blocked: u64, interval: u64, burst: u64) -> u64 {
    if blocked == 0 {
        return 0;
    }
    tat_empty_at(blocked, interval, burst)
}

/// The TAT of a bucket empty at `at` (a request of one unit may go then), whatever instant that
/// is.
fn tat_empty_at(at: u64, interval: u64, burst: u64) -> u64 {
    at.saturating_add(burst.saturating_sub(1).saturating_mul(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_burst_goes_at_once_and_the_rest_is_paced() {
        // 600 a minute = 10 a second, a bucket of one second's worth.
        let gcra = Gcra::new(Some(600), Duration::from_secs(1));
        for _ in 0..10 {
            assert_eq!(gcra.reserve(0, 1, 0).map(|slot| slot.start), Ok(0));
        }
        // The 11th waits 100 ms, and is refused if it may not wait that long.
        assert_eq!(gcra.reserve(0, 1, SECOND / 20), Err(SECOND / 10));
        assert_eq!(gcra.reserve(0, 1, SECOND).map(|s| s.start), Ok(SECOND / 10));
        let last = gcra.reserve(0, 1, SECOND);
        assert_eq!(last.map(|s| s.start), Ok(SECOND / 5));
        // Giving the last one back frees its place for the next.
        gcra.give_back(last.unwrap_or_else(|wait| panic!("{wait}")));
        assert_eq!(gcra.reserve(0, 1, SECOND).map(|s| s.start), Ok(SECOND / 5));
    }

    #[test]
    fn a_request_heavier_than_the_bucket_waits_for_it_to_be_full() {
        // 6,000 tokens a minute = 100 a second, a bucket of 100.
        let gcra = Gcra::new(Some(6_000), Duration::from_secs(1));
        assert_eq!(gcra.reserve(0, 50, 0).map(|s| s.start), Ok(0));
        // 300 tokens: waits until the 50 taken are back (0.5 s), then leaves 3 s of debt.
        assert_eq!(
            gcra.reserve(0, 300, 10 * SECOND).map(|s| s.start),
            Ok(SECOND / 2)
        );
        assert_eq!(gcra.level(SECOND / 2), Some((100, 0)));
        // Its 3 s of debt end at 3.5 s: at 3 s, 50 tokens are back.
        assert_eq!(gcra.level(3 * SECOND), Some((100, 50)));
    }

    #[test]
    fn no_limit_admits_everything_at_once() {
        let gcra = Gcra::new(None, Duration::from_secs(1));
        for _ in 0..1_000 {
            assert_eq!(gcra.reserve(5, 1_000_000, 0).map(|s| s.start), Ok(5));
        }
        assert_eq!(gcra.per_minute(), None);
        assert_eq!(gcra.level(5), None);
    }

    #[test]
    fn blocking_moves_the_next_start_to_the_given_instant() {
        let gcra = Gcra::new(Some(60), Duration::from_secs(1));
        gcra.block_until(7 * SECOND);
        assert_eq!(
            gcra.reserve(0, 1, 10 * SECOND).map(|s| s.start),
            Ok(7 * SECOND)
        );
        // An earlier block changes nothing.
        gcra.block_until(SECOND);
        assert_eq!(
            gcra.reserve(0, 1, 10 * SECOND).map(|s| s.start),
            Ok(8 * SECOND)
        );
    }

    #[test]
    fn a_share_starts_empty_and_counts_slots_decided_elsewhere_down_to_empty() {
        // 600 a minute for three: a share of 200, one every 300 ms, a bucket of 3.
        let whole = Gcra::new(Some(600), Duration::from_secs(1));
        let share = Gcra::new(None, Duration::from_secs(1));
        share.follow(&whole, 3, Duration::from_secs(1), 0);
        // Empty from the start: one at once, the next 300 ms later.
        assert_eq!(share.level(0), Some((3, 1)));
        // Full by 1 s; then ten slots decided elsewhere, at the whole's pace (every 100 ms):
        // the share is in debt for them no further than empty just after the last one.
        assert_eq!(share.level(SECOND), Some((3, 3)));
        for n in 0..10 {
            share.charge(SECOND + n * SECOND / 10, 1);
        }
        let last = SECOND + 9 * SECOND / 10;
        assert_eq!(
            share.reserve(last, 1, SECOND).map(|s| s.start),
            Ok(last + 3 * SECOND / 10)
        );
        // A charged slot given back (its request never went) leaves the share as it was.
        let slot = share.charge(10 * SECOND, 1);
        assert_eq!(share.level(10 * SECOND), Some((3, 2)));
        share.give_back(slot);
        assert_eq!(share.level(10 * SECOND), Some((3, 3)));
    }

    #[test]
    fn adjustments_take_or_give_back_after_the_fact() {
        let gcra = Gcra::new(Some(6_000), Duration::from_secs(1));
        assert!(gcra.reserve(0, 100, 0).is_ok());
        assert_eq!(gcra.level(0), Some((100, 0)));
        gcra.adjust(0, -60);
        assert_eq!(gcra.level(0), Some((100, 60)));
        gcra.adjust(0, 30);
        assert_eq!(gcra.level(0), Some((100, 30)));
    }
}
