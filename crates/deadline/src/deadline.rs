//! The [`Deadline`] value: one absolute point in time shared by every attempt of a request.

use std::time::Duration;

use tokio::time::Instant;

/// Fallbacks for `now + timeout` when the sum does not fit an `Instant`: the first that fits wins.
/// Any of them is "never" for practical purposes.
const FAR_FUTURES: [Duration; 3] = [
    Duration::from_secs(100 * 365 * 24 * 3600),
    Duration::from_secs(365 * 24 * 3600),
    Duration::from_secs(24 * 3600),
];

/// The instant by which a request must be answered, across all of its attempts.
///
/// A deadline is absolute (a point on `tokio::time::Instant`), not a timeout: every retry, every
/// hop and every layer reads the same point, so time spent in earlier attempts or in a queue is
/// counted once. It travels with the request in its extensions ([`Deadline::of`],
/// [`Deadline::apply_to`]); layers read it from there rather than keep a copy of their own. When two
/// deadlines meet, the earlier (tighter) one wins.
///
/// ```
/// use std::time::Duration;
/// use stormguard_deadline::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut request = http::Request::new(());
/// Deadline::after(Duration::from_secs(30)).apply_to(&mut request);
/// Deadline::after(Duration::from_secs(2)).apply_to(&mut request); // tighter: wins
/// Deadline::after(Duration::from_secs(60)).apply_to(&mut request); // looser: ignored
/// let deadline = Deadline::of(&request).expect("a deadline was set");
/// assert_eq!(deadline.remaining(), Duration::from_secs(2));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    instant: Instant,
}

impl Deadline {
    /// A deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Self { instant }
    }

    /// A deadline `timeout` from now. A timeout too large to represent becomes a deadline in the far
    /// future (a century, or the furthest the platform clock allows), never a panic.
    pub fn after(timeout: Duration) -> Self {
        Self::after_from(Instant::now(), timeout)
    }

    /// [`after`](Self::after), counted from `now` (for a caller that has read the clock already).
    pub fn after_from(now: Instant, timeout: Duration) -> Self {
        let instant = std::iter::once(timeout)
            .chain(FAR_FUTURES.iter().map(|far| timeout.min(*far)))
            .find_map(|timeout| now.checked_add(timeout))
            .unwrap_or(now);
        Self::at(instant)
    }

    /// The point in time.
    pub fn instant(&self) -> Instant {
        self.instant
    }

    /// Time left until the deadline; zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.instant.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed (it passes at its instant).
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.instant
    }

    /// Whether an attempt that starts after `delay` and takes `attempt` ends before the deadline:
    /// what a retry, a hedge or a move to another backend must fit, so that a request never
    /// sleeps past its deadline and never starts an attempt it cannot finish.
    pub fn fits(&self, delay: Duration, attempt: Duration) -> bool {
        Instant::now()
            .checked_add(delay)
            .and_then(|start| start.checked_add(attempt))
            .is_some_and(|finish| finish < self.instant)
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        Ord::min(self, other)
    }

    /// The deadline stored in a request's extensions, if any.
    pub fn of<B>(request: &http::Request<B>) -> Option<Deadline> {
        Self::from_extensions(request.extensions())
    }

    /// The deadline stored in extensions (of a request's `Parts`, say), if any.
    pub fn from_extensions(extensions: &http::Extensions) -> Option<Deadline> {
        extensions.get::<Deadline>().copied()
    }

    /// Stores this deadline in the request's extensions, keeping the tighter one if the request
    /// already carries a deadline.
    pub fn apply_to<B>(self, request: &mut http::Request<B>) {
        self.apply_to_extensions(request.extensions_mut());
    }

    /// Stores this deadline in extensions, keeping the tighter one if there already is one.
    pub fn apply_to_extensions(self, extensions: &mut http::Extensions) {
        let tighter = Self::from_extensions(extensions).map_or(self, |existing| existing.min(self));
        extensions.insert(tighter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn remaining_counts_down_to_zero_and_expires_at_the_instant() {
        let deadline = Deadline::after(Duration::from_millis(1500));
        assert_eq!(deadline.remaining(), Duration::from_millis(1500));
        assert!(!deadline.is_expired());
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert_eq!(deadline.remaining(), Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(deadline.is_expired());
        assert_eq!(deadline.remaining(), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(deadline.remaining(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn huge_timeouts_saturate_instead_of_panicking() {
        let deadline = Deadline::after(Duration::MAX);
        assert!(deadline.remaining() >= Duration::from_secs(24 * 3600));
        assert!(!deadline.is_expired());
    }

    #[tokio::test(start_paused = true)]
    async fn min_and_apply_keep_the_tighter_deadline() {
        let near = Deadline::after(Duration::from_secs(1));
        let far = Deadline::after(Duration::from_secs(9));
        assert_eq!(near.min(far), near);
        assert_eq!(far.min(near), near);

        let mut request = http::Request::new(());
        assert_eq!(Deadline::of(&request), None);
        far.apply_to(&mut request);
        assert_eq!(Deadline::of(&request), Some(far));
        near.apply_to(&mut request);
        assert_eq!(Deadline::of(&request), Some(near));
        far.apply_to(&mut request);
        assert_eq!(Deadline::of(&request), Some(near));
    }

    #[tokio::test(start_paused = true)]
    async fn stamping_again_later_writes_the_smaller_time_left() {
        use crate::propagate::stamp;
        use stormguard_classify::headers::X_REQUEST_TIMEOUT_MS;

        let mut request = http::Request::new(());
        Deadline::after(Duration::from_secs(30)).apply_to(&mut request);
        assert!(stamp(&mut request, Duration::from_millis(200)));
        assert_eq!(request.headers()[X_REQUEST_TIMEOUT_MS], "29800");

        // A tighter deadline applied later, then a stamp 1 s on: 5 s - 1 s - 200 ms.
        Deadline::after(Duration::from_secs(5)).apply_to(&mut request);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(stamp(&mut request, Duration::from_millis(200)));
        assert_eq!(request.headers()[X_REQUEST_TIMEOUT_MS], "3800");

        // A copy of the deadline on another request stamps the same time left.
        let mut copied = http::Request::new(());
        Deadline::of(&request)
            .expect("deadline")
            .apply_to(&mut copied);
        assert!(stamp(&mut copied, Duration::from_millis(200)));
        assert_eq!(copied.headers()[X_REQUEST_TIMEOUT_MS], "3800");
    }
}
