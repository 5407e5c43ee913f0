//! A sliding window of request and accept counts, kept in time slices, lock-free.
//!
//! The window is a ring of [`SLICES`] buckets. Time since the window was created is cut into
//! slices of `window / SLICES`; slice number `e` lives in bucket `e % SLICES`. Each counter is one
//! `AtomicU64` that packs the slice it belongs to (low 32 bits of `e`, the *tag*, in the high half)
//! with the count (low half). A counter whose tag is older than the current slice is stale: the
//! first writer of the new slice replaces it with `(tag, 1)` in one compare-and-swap, so a
//! rollover never loses a concurrent increment and never needs a lock. Readers add up the
//! counters whose tag lies within the last `SLICES` slices; everything older has aged out.
//!
//! Counts therefore decay with the window: a slice leaves the sum `window` after it began, so
//! nothing waits for a periodic reset.
//!
//! Buckets are aligned to 128 bytes (two cache lines, as adjacent-line prefetchers pull pairs) so
//! that the bucket all threads are writing does not share a line with its neighbours.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Number of slices a window is cut into: the window slides in steps of `window / SLICES`.
///
/// Twenty slices make a 2 s window slide in 100 ms steps: counts age out at most 5% of a window
/// late, while a read of the whole window stays twenty cache lines.
pub(crate) const SLICES: usize = 20;

/// Shortest slice: windows shorter than `SLICES` ms are rounded up to it.
const MIN_SLICE: Duration = Duration::from_millis(1);

const COUNT_MASK: u64 = 0xFFFF_FFFF;

/// One slice: its requests and accepts, on a line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Bucket {
    requests: AtomicU64,
    accepts: AtomicU64,
}

/// Which counter of a bucket to touch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    /// Requests offered (sent or dropped).
    Requests,
    /// Requests the backend accepted.
    Accepts,
}

/// Requests and accepts summed over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) requests: u64,
    pub(crate) accepts: u64,
}

/// The position of `now` in the ring: which bucket, and the tag that marks the slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slice {
    index: usize,
    tag: u32,
}

impl Slice {
    /// A non-zero number naming this slice (its tag + 1), for marks that 0 means "unset".
    pub(crate) fn calm_mark(self) -> u64 {
        u64::from(self.tag) + 1
    }
}

/// Lock-free sliding window of request and accept counts.
#[derive(Debug)]
pub(crate) struct Window {
    buckets: Box<[Bucket]>,
    slice_nanos: u128,
    span: Duration,
    start: Instant,
}

impl Window {
    /// A window of `span` (rounded to a whole number of slices, at least `SLICES` ms), starting now.
    pub(crate) fn new(span: Duration) -> Self {
        let slice = span
            .checked_div(SLICES as u32)
            .unwrap_or(MIN_SLICE)
            .max(MIN_SLICE);
        let buckets = (0..SLICES).map(|_| Bucket::default()).collect();
        Self {
            buckets,
            slice_nanos: slice.as_nanos(),
            span: slice.saturating_mul(SLICES as u32),
            start: Instant::now(),
        }
    }

    /// The window's length, as used (a whole number of slices).
    pub(crate) fn span(&self) -> Duration {
        self.span
    }

    /// The slice `now` falls in.
    pub(crate) fn slice(&self, now: Instant) -> Slice {
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        // Both conversions are exact for any process lifetime: the slice count of a u128 of
        // nanoseconds divided by at least a millisecond fits a u64 for 584 million years.
        let epoch = u64::try_from(elapsed / self.slice_nanos).unwrap_or(u64::MAX);
        Slice {
            index: (epoch % SLICES as u64) as usize,
            tag: epoch as u32,
        }
    }

    /// Count one event of `counter` in `slice`.
    pub(crate) fn add(&self, slice: Slice, counter: Counter) {
        let bucket = &self.buckets[slice.index];
        let cell = match counter {
            Counter::Requests => &bucket.requests,
            Counter::Accepts => &bucket.accepts,
        };
        let mut current = cell.load(Ordering::Relaxed);
        loop {
            let tag = tag_of(current);
            // Same slice, or a newer one written by a thread that read the clock later than we
            // did: the event belongs to the window either way, so count it where it is.
            if tag == slice.tag || is_newer(tag, slice.tag) {
                if current & COUNT_MASK == COUNT_MASK {
                    return; // 2^32 - 1 events in one slice: saturate rather than carry into the tag
                }
                cell.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // Stale: this bucket still holds a slice that has aged out. Start the new slice.
            match cell.compare_exchange_weak(
                current,
                pack(slice.tag, 1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Requests and accepts over the window that ends with `slice`.
    pub(crate) fn totals(&self, slice: Slice) -> Totals {
        let mut totals = Totals::default();
        for bucket in self.buckets.iter() {
            // Accepts first: `record` counts the request before its accept, so reading in the
            // opposite order cannot catch an accept whose request is not counted yet.
            totals.accepts = totals.accepts.saturating_add(live_count(
                bucket.accepts.load(Ordering::Acquire),
                slice.tag,
            ));
            totals.requests = totals.requests.saturating_add(live_count(
                bucket.requests.load(Ordering::Acquire),
                slice.tag,
            ));
        }
        // Every accept is also a request. A slice rolling over between the loads above could
        // still skew one bucket's pair; the window never reports more accepts than requests.
        totals.accepts = totals.accepts.min(totals.requests);
        totals
    }

    /// Forget every count: the window restarts empty at `slice`.
    pub(crate) fn clear(&self, slice: Slice) {
        // A tag one full window old reads as aged out and is replaced by the next writer.
        let expired = pack(slice.tag.wrapping_sub(SLICES as u32), 0);
        for bucket in self.buckets.iter() {
            bucket.requests.store(expired, Ordering::Relaxed);
            bucket.accepts.store(expired, Ordering::Relaxed);
        }
    }
}

fn pack(tag: u32, count: u64) -> u64 {
    (u64::from(tag) << 32) | (count & COUNT_MASK)
}

fn tag_of(cell: u64) -> u32 {
    (cell >> 32) as u32
}

/// Is `tag` a later slice than `than` (wrapping, as tags are the low 32 bits of the slice number)?
fn is_newer(tag: u32, than: u32) -> bool {
    (tag.wrapping_sub(than) as i32) > 0
}

/// The count of `cell` if its slice is among the `SLICES` ending with `current`, else zero.
fn live_count(cell: u64, current: u32) -> u64 {
    if current.wrapping_sub(tag_of(cell)) < SLICES as u32 {
        cell & COUNT_MASK
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_age_out_one_slice_at_a_time() {
        let window = Window::new(Duration::from_secs(2));
        assert_eq!(window.span(), Duration::from_secs(2));
        for _ in 0..10 {
            window.add(window.slice(Instant::now()), Counter::Requests);
        }
        window.add(window.slice(Instant::now()), Counter::Accepts);
        tokio::time::advance(Duration::from_millis(1_000)).await;
        for _ in 0..5 {
            window.add(window.slice(Instant::now()), Counter::Requests);
        }
        let now = window.slice(Instant::now());
        assert_eq!(
            window.totals(now),
            Totals {
                requests: 15,
                accepts: 1
            }
        );

        // The first slice leaves the window 2 s after it began; the second one stays.
        tokio::time::advance(Duration::from_millis(999)).await;
        let totals = window.totals(window.slice(Instant::now()));
        assert_eq!(
            totals,
            Totals {
                requests: 15,
                accepts: 1
            }
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let totals = window.totals(window.slice(Instant::now()));
        assert_eq!(
            totals,
            Totals {
                requests: 5,
                accepts: 0
            }
        );
        tokio::time::advance(Duration::from_millis(1_000)).await;
        let totals = window.totals(window.slice(Instant::now()));
        assert_eq!(totals, Totals::default());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_bucket_starts_from_zero() {
        let window = Window::new(Duration::from_secs(2));
        for _ in 0..7 {
            window.add(window.slice(Instant::now()), Counter::Requests);
        }
        // Exactly one window later the same bucket is reused for a new slice.
        tokio::time::advance(Duration::from_secs(2)).await;
        window.add(window.slice(Instant::now()), Counter::Requests);
        let totals = window.totals(window.slice(Instant::now()));
        assert_eq!(totals.requests, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn clear_forgets_everything_and_counting_resumes() {
        let window = Window::new(Duration::from_secs(2));
        for _ in 0..30 {
            window.add(window.slice(Instant::now()), Counter::Requests);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        let now = window.slice(Instant::now());
        assert_eq!(window.totals(now).requests, 30);
        window.clear(now);
        assert_eq!(window.totals(now), Totals::default());
        window.add(now, Counter::Requests);
        window.add(now, Counter::Accepts);
        assert_eq!(
            window.totals(now),
            Totals {
                requests: 1,
                accepts: 1
            }
        );
    }

    #[test]
    fn degenerate_spans_are_rounded_up() {
        let window = Window::new(Duration::ZERO);
        assert_eq!(window.span(), MIN_SLICE * SLICES as u32);
        let window = Window::new(Duration::from_nanos(1_999));
        assert_eq!(window.span(), MIN_SLICE * SLICES as u32);
        let window = Window::new(Duration::MAX);
        assert!(window.span() > Duration::from_secs(1 << 40));
    }

    #[test]
    fn tags_compare_across_wraparound() {
        assert!(is_newer(0, u32::MAX));
        assert!(is_newer(5, 3));
        assert!(!is_newer(3, 5));
        assert!(!is_newer(u32::MAX, 0));
        assert_eq!(live_count(pack(u32::MAX, 4), 2), 4);
        assert_eq!(live_count(pack(u32::MAX - 20, 4), 0), 0);
    }
}
