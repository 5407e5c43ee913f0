//! A sliding window of event counters in time slices, lock-free: the one the retry budget and
//! the adaptive throttle both count in.
//!
//! Time since the window was created is cut into slices of `span / slices`; slice number `e` (its
//! *epoch*) lives in slot `e % slices`. Every counter is one `AtomicU64` that packs the low 32
//! bits of the epoch it counts for (the *tag*, high half) with the count (low half). A counter
//! whose tag is not the epoch a reader expects is stale and reads as zero; the first writer of a
//! new epoch replaces the whole word by compare-and-swap, so moving a slot on to a new slice and
//! counting into it is one atomic step: two threads can never both reset a slot, nor can one
//! reset it while another's count is lost.
//!
//! Counts decay with the window: a slice leaves the sums `span` after it began, one slice at a
//! time, so nothing waits for a periodic reset and there is no cliff. Slots are aligned to 128
//! bytes (two cache lines, as adjacent-line prefetchers pull pairs), so the slot every thread is
//! writing shares no line with its neighbours.
//!
//! The atomics are loom's model atomics under `--cfg stormguard_loom` (`tests/loom.rs` explores
//! every interleaving of racing increments, decrements and rotations).

use std::time::Duration;

use tokio::time::Instant;

use crate::sync::{AtomicU64, Ordering};

/// Shortest slice: shorter windows are rounded up to a millisecond per slice.
const MIN_SLICE: Duration = Duration::from_millis(1);

/// How far below `u32::MAX` a count must be for [`Counter::increment`] to add without a
/// compare-and-swap: more threads than this would have to add at the same instant to carry into
/// the tag.
const ADD_HEADROOM: u32 = 1 << 16;

/// A window of `K` counters per slice (for the retry budget: deposits, withdrawals, refusals; for
/// the throttle: requests and accepts).
#[derive(Debug)]
pub struct SlidingWindow<const K: usize> {
    start: Instant,
    slice_nanos: u128,
    span: Duration,
    slots: Box<[Slot<K>]>,
}

/// One slot: the counters of the slice it currently holds, on a cache line pair of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Slot<const K: usize>([Counter; K]);

impl<const K: usize> SlidingWindow<K> {
    /// A window of `span` cut into `slices` slices (at least one, each at least a millisecond),
    /// starting now. The span used is a whole number of slices: see [`span`](Self::span).
    pub fn new(span: Duration, slices: usize) -> Self {
        let slices = slices.max(1);
        let count = u32::try_from(slices).unwrap_or(u32::MAX);
        let slice = span.checked_div(count).unwrap_or(MIN_SLICE).max(MIN_SLICE);
        Self {
            start: Instant::now(),
            slice_nanos: slice.as_nanos(),
            span: slice.saturating_mul(count),
            slots: (0..slices)
                .map(|_| Slot(std::array::from_fn(|_| Counter::default())))
                .collect(),
        }
    }

    /// The window's length, as used: a whole number of slices.
    pub fn span(&self) -> Duration {
        self.span
    }

    /// The epoch (slice number since the window was created) that `now` falls in.
    pub fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        // A slice is at least a millisecond: the count fits a u64 for 584 million years.
        u64::try_from(elapsed / self.slice_nanos).unwrap_or(u64::MAX)
    }

    /// The epoch of the current time.
    pub fn epoch_now(&self) -> u64 {
        self.epoch(Instant::now())
    }

    /// Counter `which` (below `K`) of the slot that holds slice `epoch`.
    pub fn counter(&self, epoch: u64, which: usize) -> &Counter {
        // The remainder is below the slot count, a usize.
        let slot = &self.slots[(epoch % self.slots.len() as u64) as usize];
        &slot.0[which]
    }

    /// Counts one event in counter `which` at `epoch`.
    pub fn add(&self, epoch: u64, which: usize) {
        self.counter(epoch, which).increment(epoch);
    }

    /// Counter `which` summed over the window's earlier slices: those that, with `epoch`, make up
    /// the window ending at `epoch` (`epoch` itself left out).
    pub fn sum_before(&self, epoch: u64, which: usize) -> u64 {
        (1..self.slots.len() as u64)
            .map_while(|back| epoch.checked_sub(back))
            .map(|slice| u64::from(self.counter(slice, which).load().count_at(slice)))
            .sum()
    }

    /// Counter `which` summed over the window ending at `epoch`, `epoch` included.
    pub fn sum(&self, epoch: u64, which: usize) -> u64 {
        let current = self.counter(epoch, which).load().count_at(epoch);
        u64::from(current) + self.sum_before(epoch, which)
    }

    /// Every counter summed over the window ending at `epoch`, in one pass over the slots (each
    /// slot's counters read in their order): what [`sum`](Self::sum) gives for each, for half
    /// the reads when a caller needs them all.
    pub fn sums(&self, epoch: u64) -> [u64; K] {
        let mut sums = [0; K];
        for back in 0..self.slots.len() as u64 {
            let Some(slice) = epoch.checked_sub(back) else {
                break;
            };
            let slot = &self.slots[(slice % self.slots.len() as u64) as usize];
            for (sum, counter) in sums.iter_mut().zip(&slot.0) {
                *sum += u64::from(counter.load().count_at(slice));
            }
        }
        sums
    }

    /// Forgets every count: the window starts over, empty, at `epoch`.
    pub fn clear(&self, epoch: u64) {
        // A tag one whole window old reads as stale and is replaced by the next writer.
        let stale = Tagged::new(epoch.wrapping_sub(self.slots.len() as u64), 0);
        for slot in self.slots.iter() {
            for counter in &slot.0 {
                counter.0.store(stale.0, Ordering::SeqCst);
            }
        }
    }
}

/// A packed (epoch tag, count) word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tagged(u64);

/// Where a word's tag stands relative to the epoch a caller works in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Age {
    /// The word counts for this very epoch.
    Current(u32),
    /// The word belongs to an older epoch: it reads as zero and may be replaced.
    Stale,
    /// The word was already moved on to this later epoch: the caller's clock reading is behind.
    Ahead(u64),
}

impl Tagged {
    /// The word for `count` events in `epoch`. Tags keep the low 32 bits of the epoch: a slot in
    /// use is rewritten at least once a window, so a live tag is never confused with one 2^32
    /// slices away.
    pub const fn new(epoch: u64, count: u32) -> Self {
        Tagged(((epoch as u32 as u64) << 32) | count as u64)
    }

    const fn tag(self) -> u32 {
        (self.0 >> 32) as u32
    }

    const fn count(self) -> u32 {
        self.0 as u32
    }

    /// How this word relates to `epoch`.
    pub fn age(self, epoch: u64) -> Age {
        // Wrapping distance between the two 32-bit tags, read as signed.
        let behind = (epoch as u32).wrapping_sub(self.tag()) as i32;
        match behind {
            0 => Age::Current(self.count()),
            1.. => Age::Stale,
            _ => Age::Ahead(epoch.saturating_add(u64::from(behind.unsigned_abs()))),
        }
    }

    /// The count this word contributes to `epoch`: zero unless it is tagged with that epoch.
    pub fn count_at(self, epoch: u64) -> u32 {
        match self.age(epoch) {
            Age::Current(count) => count,
            Age::Stale | Age::Ahead(_) => 0,
        }
    }
}

/// One tagged counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// The word as it is now. Inlined: the throttle's sums read 40 of these per request from
    /// another crate, where a call each cost 169 instructions per request.
    #[inline]
    pub fn load(&self) -> Tagged {
        Tagged(self.0.load(Ordering::SeqCst))
    }

    /// Replaces `current` by `new` if nobody changed the word in between.
    pub fn swap_if(&self, current: Tagged, new: Tagged) -> bool {
        self.0
            .compare_exchange_weak(current.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Counts one event in `epoch`, or in the later epoch the slot has already moved to (the
    /// event then counts at this write, which happens after that epoch began). Saturates at
    /// `u32::MAX` per slice.
    pub fn increment(&self, mut epoch: u64) {
        loop {
            let current = self.load();
            let count = match current.age(epoch) {
                // A slot already in this epoch: one atomic add, which no other thread can make
                // fail. Should the slot move on between the load and the add, the add counts in
                // the newer epoch, as above. Far from `u32::MAX` concurrent adds cannot carry into
                // the tag; close to it, the compare-and-swap below saturates exactly.
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

    /// Takes back one event counted in `epoch`. Does nothing if the slot has since moved on to
    /// another epoch (the event expired with it) or holds no event.
    pub fn decrement(&self, epoch: u64) {
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

#[cfg(all(test, not(stormguard_loom)))]
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

    #[tokio::test(start_paused = true)]
    async fn counts_age_out_one_slice_at_a_time() {
        let window = SlidingWindow::<2>::new(Duration::from_secs(2), 20);
        assert_eq!(window.span(), Duration::from_secs(2));
        for _ in 0..10 {
            window.add(window.epoch_now(), 0);
        }
        window.add(window.epoch_now(), 1);
        tokio::time::advance(Duration::from_millis(1_000)).await;
        for _ in 0..5 {
            window.add(window.epoch_now(), 0);
        }
        let now = window.epoch_now();
        assert_eq!((window.sum(now, 0), window.sum(now, 1)), (15, 1));
        assert_eq!(window.sum_before(now, 0), 10);

        // The first slice leaves the window 2 s after it began; the second one stays.
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(window.sum(window.epoch_now(), 0), 15);
        tokio::time::advance(Duration::from_millis(1)).await;
        let now = window.epoch_now();
        assert_eq!((window.sum(now, 0), window.sum(now, 1)), (5, 0));
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert_eq!(window.sum(window.epoch_now(), 0), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_slot_starts_from_zero_and_clear_forgets_everything() {
        let window = SlidingWindow::<1>::new(Duration::from_secs(2), 20);
        for _ in 0..7 {
            window.add(window.epoch_now(), 0);
        }
        // Exactly one window later the same slot is reused for a new slice.
        tokio::time::advance(Duration::from_secs(2)).await;
        window.add(window.epoch_now(), 0);
        assert_eq!(window.sum(window.epoch_now(), 0), 1);

        let window = SlidingWindow::<1>::new(Duration::from_secs(2), 20);
        for _ in 0..30 {
            window.add(window.epoch_now(), 0);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        let now = window.epoch_now();
        assert_eq!(window.sum(now, 0), 30);
        window.clear(now);
        assert_eq!(window.sum(now, 0), 0);
        window.add(now, 0);
        assert_eq!(window.sum(now, 0), 1);
    }

    #[test]
    fn degenerate_spans_are_rounded_up_and_slots_get_lines_of_their_own() {
        let window = SlidingWindow::<2>::new(Duration::ZERO, 20);
        assert_eq!(window.span(), MIN_SLICE * 20);
        let window = SlidingWindow::<2>::new(Duration::from_nanos(1_999), 20);
        assert_eq!(window.span(), MIN_SLICE * 20);
        let window = SlidingWindow::<2>::new(Duration::MAX, 0);
        assert!(window.span() > Duration::from_secs(1 << 40));
        assert!(std::mem::align_of::<Slot<3>>() >= 128);
    }

    #[tokio::test(start_paused = true)]
    async fn one_pass_sums_every_counter_as_each_own_sum_does() {
        // 4 slices of 1 s: counts over 6 s, of which the last 4 are in the window.
        let window = SlidingWindow::<2>::new(Duration::from_secs(4), 4);
        for second in 0..6u64 {
            for _ in 0..=second {
                window.add(window.epoch_now(), 0);
            }
            window.add(window.epoch_now(), 1);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let epoch = window.epoch_now() - 1;
        // Seconds 2 to 5: 3 + 4 + 5 + 6 requests, one accept each.
        assert_eq!(window.sums(epoch), [18, 4]);
        assert_eq!(
            window.sums(epoch),
            [window.sum(epoch, 0), window.sum(epoch, 1)]
        );
        // At epoch 1 only two slices exist.
        assert_eq!(window.sums(1), [window.sum(1, 0), window.sum(1, 1)]);
    }
}
