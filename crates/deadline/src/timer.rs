//! [`poll_until`]: the lazily made timer of a future that waits until an instant.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// Ready once `at` has come, on the timer in `timer`: made the first time it is polled (a
/// request answered at once never touches tokio's timer wheel) and moved when `at` moves (a
/// deadline tightened, an attempt's clock due earlier), without making another.
///
/// ```
/// use std::pin::pin;
/// use std::time::Duration;
/// use tokio::time::{Instant, Sleep};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut timer = pin!(None::<Sleep>);
/// let at = Instant::now() + Duration::from_secs(1);
/// std::future::poll_fn(|cx| stormguard_deadline::poll_until(timer.as_mut(), at, cx)).await;
/// assert_eq!(Instant::now(), at);
/// # }
/// ```
pub fn poll_until(
    mut timer: Pin<&mut Option<Sleep>>,
    at: Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    match timer.as_mut().as_pin_mut() {
        Some(sleep) if sleep.deadline() == at => {}
        Some(sleep) => sleep.reset(at),
        None => timer.set(Some(tokio::time::sleep_until(at))),
    }
    match timer.as_pin_mut() {
        Some(sleep) => sleep.poll(cx),
        None => Poll::Pending,
    }
}
