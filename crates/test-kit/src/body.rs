//! [`ScriptedBody`]: a body that plays its steps in order.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// One step of a [`ScriptedBody`].
#[derive(Debug)]
enum Step {
    /// A data frame.
    Data(Bytes),
    /// A wait, timed from when the step is reached.
    Delay(Duration),
    /// A wait until an instant.
    Until(Instant),
    /// The body fails with this error.
    Error(io::Error),
    /// One `Pending`, the task woken at once.
    Yield,
    /// Nothing ever again: neither a frame nor the end.
    Hang,
}

/// A body that plays its steps in order, then ends: data frames, waits on tokio's clock (so a
/// test on the paused clock drives them exactly), an error, one `Pending`, or a hang.
///
/// It can hold a token while it lives ([`holding`](Self::holding)), to count the bodies still
/// alive, and count itself cancelled when dropped before its end ([`watched`](Self::watched)).
///
/// ```
/// use std::time::Duration;
///
/// use stormguard_test_kit::ScriptedBody;
///
/// // Two chunks a second apart, then a reset connection.
/// let body = ScriptedBody::new()
///     .data("data: one\n\n")
///     .delay(Duration::from_secs(1))
///     .data("data: two\n\n")
///     .error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
/// # drop(body);
/// ```
#[derive(Default)]
pub struct ScriptedBody {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
    hint: SizeHint,
    cancelled: Option<Arc<AtomicUsize>>,
    token: Option<Arc<dyn Any + Send + Sync>>,
}

impl ScriptedBody {
    /// A body with no steps: it ends at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// A body of `chunks`, one data frame each, then the end.
    pub fn chunks<I>(chunks: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<Bytes>,
    {
        chunks.into_iter().fold(Self::new(), Self::data)
    }

    /// A body whose first frame never comes (nor its end).
    pub fn hanging() -> Self {
        Self::new().hang()
    }

    /// Then a data frame of `data`.
    pub fn data(mut self, data: impl Into<Bytes>) -> Self {
        self.steps.push_back(Step::Data(data.into()));
        self
    }

    /// Then a wait of `delay` (`tokio::time::sleep`), timed from when the body reaches this step.
    /// A zero delay is no step at all.
    pub fn delay(mut self, delay: Duration) -> Self {
        if !delay.is_zero() {
            self.steps.push_back(Step::Delay(delay));
        }
        self
    }

    /// Then a wait until `at` (`tokio::time::sleep_until`).
    pub fn until(mut self, at: Instant) -> Self {
        self.steps.push_back(Step::Until(at));
        self
    }

    /// Then `error`: the body fails, and ends there.
    pub fn error(mut self, error: io::Error) -> Self {
        self.steps.push_back(Step::Error(error));
        self
    }

    /// Then one `Pending` (the task woken at once) before going on, as a body still arriving
    /// from the network.
    pub fn yield_once(mut self) -> Self {
        self.steps.push_back(Step::Yield);
        self
    }

    /// Then nothing ever again, as a peer that stopped sending: `Pending` at every poll, never
    /// the end. Steps after it are never reached.
    pub fn hang(mut self) -> Self {
        self.steps.push_back(Step::Hang);
        self
    }

    /// The same body, announcing `hint` as its size, true or not (unknown unless set).
    pub fn size_hint(mut self, hint: SizeHint) -> Self {
        self.hint = hint;
        self
    }

    /// The same body, counting one into `cancelled` if it is dropped before its end: while a step
    /// is left to play (a hang never ends). An error is an end.
    pub fn watched(mut self, cancelled: &Arc<AtomicUsize>) -> Self {
        self.cancelled = Some(Arc::clone(cancelled));
        self
    }

    /// The same body, holding `token` while it lives: the token's strong count tells how many of
    /// the bodies holding it are still alive.
    pub fn holding<T: Any + Send + Sync>(mut self, token: &Arc<T>) -> Self {
        let token: Arc<T> = Arc::clone(token);
        self.token = Some(token);
        self
    }
}

impl Body for ScriptedBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(sleep) = this.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
            }
            let Some(step) = this.steps.pop_front() else {
                return Poll::Ready(None);
            };
            match step {
                Step::Data(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Step::Delay(delay) => this.sleep = Some(Box::pin(tokio::time::sleep(delay))),
                Step::Until(at) => this.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
                Step::Error(error) => {
                    this.steps.clear();
                    return Poll::Ready(Some(Err(error)));
                }
                Step::Yield => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Step::Hang => {
                    this.steps.push_front(Step::Hang);
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty() && self.sleep.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

impl Drop for ScriptedBody {
    fn drop(&mut self) {
        if let Some(cancelled) = self.cancelled.take()
            && !self.is_end_stream()
        {
            cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl fmt::Debug for ScriptedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedBody")
            .field("steps", &self.steps)
            .field("waiting", &self.sleep.is_some())
            .field("hint", &self.hint)
            .field("watched", &self.cancelled.is_some())
            .finish_non_exhaustive()
    }
}

/// A body of these bytes in one frame (none if they are empty), its size unknown unless set.
impl From<Bytes> for ScriptedBody {
    fn from(bytes: Bytes) -> Self {
        if bytes.is_empty() {
            return Self::new();
        }
        Self::new().data(bytes)
    }
}

/// A body of this text in one frame (none if it is empty), its size unknown unless set.
impl From<&'static str> for ScriptedBody {
    fn from(text: &'static str) -> Self {
        Self::from(Bytes::from_static(text.as_bytes()))
    }
}

/// A body of this text in one frame (none if it is empty), its size unknown unless set.
impl From<String> for ScriptedBody {
    fn from(text: String) -> Self {
        Self::from(Bytes::from(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn steps_play_in_order_on_the_paused_clock() {
        let start = Instant::now();
        let mut body = ScriptedBody::new()
            .data("a")
            .delay(Duration::from_secs(2))
            .yield_once()
            .data("b")
            .error(io::Error::other("reset"))
            .data("never");
        let first = body.frame().await;
        assert_eq!(
            first
                .map(|f| f.map(|f| f.into_data().ok()))
                .transpose()
                .ok(),
            Some(Some(Some(Bytes::from("a"))))
        );
        let second = body.frame().await;
        assert!(matches!(second, Some(Ok(_))));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(matches!(body.frame().await, Some(Err(_))));
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hang_never_ends_and_a_drop_before_the_end_is_counted() {
        let cancelled = Arc::new(AtomicUsize::new(0));
        let mut body = ScriptedBody::new().data("a").hang().watched(&cancelled);
        assert!(body.frame().await.is_some());
        let hung = tokio::time::timeout(Duration::from_secs(3600), body.frame()).await;
        assert!(hung.is_err());
        assert!(!body.is_end_stream());
        drop(body);
        assert_eq!(cancelled.load(Ordering::SeqCst), 1);

        let whole = ScriptedBody::chunks(["a", "b"]).watched(&cancelled);
        let bytes = whole.collect().await.map(|c| c.to_bytes()).ok();
        assert_eq!(bytes, Some(Bytes::from("ab")));
        assert_eq!(
            cancelled.load(Ordering::SeqCst),
            1,
            "read to its end: not cancelled"
        );
    }

    #[test]
    fn a_held_token_lives_as_long_as_the_body() {
        let token = Arc::new(());
        let body = ScriptedBody::new().holding(&token);
        assert_eq!(Arc::strong_count(&token), 2);
        drop(body);
        assert_eq!(Arc::strong_count(&token), 1);
    }
}
