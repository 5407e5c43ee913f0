//! The sliding window's storage: tagged counters in cache-line-sized slots.
//!
//! Every counter is one `AtomicU64` holding the epoch (slice number) it belongs to in its high 32
//! bits and the count in its low 32 bits. A counter whose tag is not the epoch a reader expects is
//! stale and reads as zero; a writer that finds a stale tag replaces the whole word by compare-and-
//! swap, so rotating a slot into a new epoch and counting into it is a single atomic step and two
//! threads can never both reset (or one reset and one lose) the same slot.

use crate::sync::{AtomicU64, Ordering};

/// Number of sub-buckets the window is divided into: each covers `ttl / SLICES`.
pub(crate) const SLICES: usize = 10;

/// Pads (and aligns) a value to its own cache line pair, so counters written by different threads
/// at different rates never share a line (128 bytes: adjacent-line prefetch on x86-64 and the
/// 128-byte lines of recent Apple cores).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// A packed (epoch tag, count) word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tagged(u64);

/// Where a word's tag stands relative to the epoch a caller is working in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Age {
    /// The word counts for this very epoch.
    Current(u32),
    /// The word belongs to an older epoch: it reads as zero and may be reset.
    Stale,
    /// The word was already rotated into this later epoch: the caller's clock reading is behind.
    Ahead(u64),
}

impl Tagged {
    /// The word for `count` events in `epoch`. Tags keep the low 32 bits of the epoch: a slot is
    /// rewritten at least every `SLICES` epochs while in use, so a live tag is never confused with
    /// one 2^32 slices away.
    pub(crate) const fn new(epoch: u64, count: u32) -> Self {
        Tagged(((epoch as u32 as u64) << 32) | count as u64)
    }

    const fn tag(self) -> u32 {
        (self.0 >> 32) as u32
    }

    const fn count(self) -> u32 {
        self.0 as u32
    }

    /// How this word relates to `epoch`.
    pub(crate) fn age(self, epoch: u64) -> Age {
        // Wrapping distance between the two 32-bit tags, read as signed.
        let behind = (epoch as u32).wrapping_sub(self.tag()) as i32;
        match behind {
            0 => Age::Current(self.count()),
            1.. => Age::Stale,
            _ => Age::Ahead(epoch.saturating_add(u64::from(behind.unsigned_abs()))),
        }
    }

    /// The count this word contributes to `epoch`: zero unless it is tagged with that epoch.
    pub(crate) fn count_at(self, epoch: u64) -> u32 {
        match self.age(epoch) {
            Age::Current(count) => count,
            Age::Stale | Age::Ahead(_) => 0,
        }
    }
}

/// How far below `u32::MAX` a count must be for [`Counter::increment`] to add without a
/// compare-and-swap: more threads than this would have to add at the same instant to carry into
/// the tag.
const ADD_HEADROOM: u32 = 1 << 16;

/// One tagged counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn load(&self) -> Tagged {
        Tagged(self.0.load(Ordering::SeqCst))
    }

    /// Replace `current` by `new` if nobody changed the word in between.
    pub(crate) fn swap_if(&self, current: Tagged, new: Tagged) -> bool {
        self.0
            .compare_exchange_weak(current.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Count one event in `epoch` (or in the later epoch the slot has already moved to: the event
    /// is then linearised at this write, which happens after that epoch began). Saturates at
    /// `u32::MAX` per slice.
    pub(crate) fn increment(&self, mut epoch: u64) {
        loop {
            let current = self.load();
            let count = match current.age(epoch) {
                // The common case, a slot already in this epoch: one atomic add, which no other
                // thread can make fail (a compare-and-swap fails and goes round again whenever
                // another thread counted in between, which is what threads sharing a budget
                // do). Should the slot move on to a later epoch between the load and the add, the
                // add counts there, as above. Far from `u32::MAX`, concurrent adds cannot carry
                // into the tag; close to it, the compare-and-swap below saturates exactly.
                Age::Current(count) if count < u32::MAX - ADD_HEADROOM => {
                    self.0.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Age::Current(count) => count,
                Age::Stale => 0,
                Age::Ahead(later) => {
                    epoch = later;
                    continue;
                }
            };
            if count == u32::MAX || self.swap_if(current, Tagged::new(epoch, count + 1)) {
                return;
            }
        }
    }

    /// Take back one event previously counted in `epoch`. Does nothing if the slot has since moved
    /// on to another epoch (the event expired with it).
    pub(crate) fn decrement(&self, epoch: u64) {
        loop {
            let current = self.load();
            let Age::Current(count @ 1..) = current.age(epoch) else {
                return;
            };
            if self.swap_if(current, Tagged::new(epoch, count - 1)) {
                return;
            }
        }
    }
}

/// The counters of one slice of the window. Deposits (every successful response) are written far
/// more often than retries, so they get a line of their own.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) deposits: Padded<Counter>,
    pub(crate) retries: Padded<RetryCounters>,
}

/// The retry-path counters of one slice.
#[derive(Debug, Default)]
pub(crate) struct RetryCounters {
    pub(crate) withdrawals: Counter,
    pub(crate) rejected: Counter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_compare_by_wrapping_distance() {
        let word = Tagged::new(7, 3);
        assert_eq!(word.age(7), Age::Current(3));
        assert_eq!(word.age(8), Age::Stale);
        assert_eq!(word.age(17), Age::Stale);
        assert_eq!(word.age(5), Age::Ahead(7));
        assert_eq!(word.count_at(7), 3);
        assert_eq!(word.count_at(17), 0);

        // Across the 32-bit wrap of the tag.
        let wrapped = Tagged::new(u64::from(u32::MAX) + 1, 2);
        assert_eq!(wrapped.age(u64::from(u32::MAX) + 1), Age::Current(2));
        assert_eq!(
            wrapped.age(u64::from(u32::MAX)),
            Age::Ahead(u64::from(u32::MAX) + 1)
        );
        assert_eq!(
            Tagged::new(u64::from(u32::MAX), 1).age(u64::from(u32::MAX) + 2),
            Age::Stale
        );
    }

    #[test]
    fn increment_rotates_stale_slots_and_saturates() {
        let counter = Counter::default();
        counter.increment(0);
        counter.increment(0);
        assert_eq!(counter.load().count_at(0), 2);

        // Ten slices later the same slot is reused: the old count is gone, not added to.
        counter.increment(10);
        assert_eq!(counter.load().count_at(10), 1);
        assert_eq!(counter.load().count_at(0), 0);

        // A writer whose clock reading is behind counts into the slot's newer epoch.
        counter.increment(9);
        assert_eq!(counter.load().count_at(10), 2);

        let full = Counter(AtomicU64::new(Tagged::new(3, u32::MAX).0));
        full.increment(3);
        assert_eq!(full.load().count_at(3), u32::MAX);
    }

    #[test]
    fn decrement_only_touches_its_own_epoch() {
        let counter = Counter::default();
        counter.increment(4);
        counter.increment(4);
        counter.decrement(4);
        assert_eq!(counter.load().count_at(4), 1);
        counter.decrement(14);
        assert_eq!(counter.load().count_at(4), 1);
        counter.decrement(4);
        counter.decrement(4);
        assert_eq!(counter.load().count_at(4), 0);
    }

    #[test]
    fn slots_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<Padded<Counter>>() >= 128);
        assert!(std::mem::size_of::<Slot>() >= 256);
    }
}
