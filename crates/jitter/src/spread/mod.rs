//! Spread synchronised callers: delay each request's start by `U(0, max)`.
//!
//! Fleets that restart together, cron jobs firing on the minute and clients woken by the same event
//! all send their first request in the same instant. Backoff jitter only helps *retries*; this layer
//! spreads the first attempt too. A request passing through [`Spread`] waits a uniform random delay
//! in `[0, max)` (drawn per request), then goes to the inner service.
//!
//! # Readiness
//!
//! `poll_ready` passes the inner service's readiness through unchanged. `call` then takes the
//! *readied* service into the response future (the clone-and-swap idiom of tower's buffer-less
//! middlewares: a fresh clone stays behind for the next `poll_ready`) and calls it once the delay is
//! over. This is why `S: Clone` is required, and it means whatever the inner service reserved in
//! `poll_ready` (a concurrency-limit permit, a rate-limit token, a connection) is held during the
//! sleep. Put the [`SpreadLayer`] *outside* such limits when waiting requests should not hold them.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use stormguard_jitter::SpreadLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), std::convert::Infallible> {
//! let mut service = ServiceBuilder::new()
//!     .layer(SpreadLayer::new(Duration::from_millis(200)))
//!     .service(service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x + 1) }));
//! let start = tokio::time::Instant::now();
//! assert_eq!(service.ready().await?.call(1).await?, 2);
//! assert!(start.elapsed() < Duration::from_millis(200));
//! # Ok(())
//! # }
//! ```

mod future;
mod layer;

pub use future::ResponseFuture;
pub use layer::SpreadLayer;

use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

/// Delays each request's start by `U(0, max)`. See the [module docs](self); seeded through
/// [`SpreadLayer::with_seed`].
#[derive(Clone, Debug)]
pub struct Spread<S> {
    inner: S,
    spread: SpreadLayer,
}

impl<S> Spread<S> {
    /// Wraps `inner`; each request waits a uniform random delay in `[0, max)`.
    pub fn new(inner: S, max: Duration) -> Self {
        SpreadLayer::new(max).layer(inner)
    }

    /// The settings it was made with.
    pub fn spread(&self) -> &SpreadLayer {
        &self.spread
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Request> Service<Request> for Spread<S>
where
    S: Service<Request> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let delay = self.spread.draw();
        if delay.is_zero() {
            return ResponseFuture::calling(self.inner.call(request));
        }
        let fresh = self.inner.clone();
        let readied = std::mem::replace(&mut self.inner, fresh);
        ResponseFuture::sleeping(tokio::time::sleep(delay), readied, request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;
    use tower::{Layer, ServiceExt, service_fn};

    use stormguard_numbers::random::RandomSource;

    use super::*;
    use crate::strategy::uniform;

    /// The delays a layer seeded with `seed` draws, recomputed independently.
    fn expected_draws(seed: u64, max: Duration, n: usize) -> Vec<Duration> {
        let random = RandomSource::seeded(seed);
        (0..n)
            .map(|_| {
                uniform(
                    &mut random.rng(),
                    Duration::ZERO,
                    max - Duration::from_nanos(1),
                )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn inner_call_starts_no_earlier_than_the_drawn_delay() {
        let max = Duration::from_millis(500);
        let started = Arc::new(Mutex::new(Vec::new()));
        let log = started.clone();
        let inner = service_fn(move |i: usize| {
            log.lock().unwrap().push((i, Instant::now()));
            ready(Ok::<_, Infallible>(i))
        });
        let mut service = SpreadLayer::new(max).with_seed(77).layer(inner);
        let expected = expected_draws(77, max, 50);

        for (i, delay) in expected.iter().enumerate() {
            let t0 = Instant::now();
            let response = service.ready().await.unwrap().call(i).await.unwrap();
            assert_eq!(response, i);
            let (index, at) = started.lock().unwrap()[i];
            assert_eq!(index, i);
            let waited = at - t0;
            // The timer has millisecond resolution: the call starts at the drawn delay, rounded up
            // to the next millisecond.
            assert!(waited >= *delay, "request {i}: {waited:?} < {delay:?}");
            assert!(
                waited <= *delay + Duration::from_millis(1),
                "request {i}: {waited:?}"
            );
            // The draw is below `max`; rounded up to the timer's millisecond, the start is at most
            // `max`.
            assert!(*delay < max, "request {i}: drew {delay:?}");
            assert!(waited <= max, "request {i}: {waited:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn delays_spread_across_the_window() {
        let max = Duration::from_secs(1);
        let t0 = Instant::now();
        let service = SpreadLayer::new(max)
            .with_seed(5)
            .layer(service_fn(move |()| {
                ready(Ok::<_, Infallible>(t0.elapsed()))
            }));
        let mut calls = Vec::new();
        for _ in 0..1000 {
            calls.push(tokio::spawn(service.clone().oneshot(())));
        }
        let mut deciles = [0u32; 10];
        for call in calls {
            let started = call.await.unwrap().unwrap();
            assert!(started <= max, "{started:?}");
            deciles[((started.as_secs_f64() * 10.0) as usize).min(9)] += 1;
        }
        // 100 expected per decile (standard deviation ~9.5).
        for (i, count) in deciles.iter().enumerate() {
            assert!((60..=140).contains(count), "decile {i}: {count}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn zero_max_calls_at_once() {
        let t0 = Instant::now();
        let mut service = Spread::new(
            service_fn(move |()| ready(Ok::<_, Infallible>(t0.elapsed()))),
            Duration::ZERO,
        );
        let waited = service.ready().await.unwrap().call(()).await.unwrap();
        assert_eq!(waited, Duration::ZERO);
    }

    /// A service that must be made ready before each call, like a connection pool handing out a
    /// reserved connection.
    #[derive(Clone)]
    struct Reserving {
        reserved: bool,
    }

    impl Service<u32> for Reserving {
        type Response = u32;
        type Error = &'static str;
        type Future = Ready<Result<u32, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.reserved = true;
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: u32) -> Self::Future {
            let reserved = std::mem::replace(&mut self.reserved, false);
            ready(if reserved {
                Ok(request)
            } else {
                Err("called without poll_ready")
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_readied_service_makes_the_delayed_call() {
        let mut service = SpreadLayer::new(Duration::from_millis(100))
            .with_seed(1)
            .layer(Reserving { reserved: false });
        for i in 0..20 {
            let response = service.ready().await.unwrap().call(i).await;
            assert_eq!(response, Ok(i));
        }
    }
}
