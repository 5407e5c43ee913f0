//! [`RoundRobin`]: each request to the next of several services in turn, whatever became of the
//! ones before it.
//!
//! The `round-robin` row of the balance scenarios sends each request to the next deployment in
//! turn, as a load balancer that knows nothing of its backends does; the balance-fleet scenario
//! sends each request to the next replica of its gateway in turn, as the load balancer in front
//! of a fleet does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tower::Service;
use tower::util::Oneshot;

/// Each call to the next of `services` in turn (the first call to the first). Clones share the
/// turn. Each call readies a clone of its service and calls it ([`Oneshot`]), so that a
/// service's readiness is never taken by another's call.
pub(crate) struct RoundRobin<S> {
    services: Arc<[S]>,
    next: Arc<AtomicUsize>,
}

impl<S> RoundRobin<S> {
    /// Calls to `services` in turn. At least one.
    pub(crate) fn new(services: Vec<S>) -> RoundRobin<S> {
        assert!(!services.is_empty(), "a round robin over no service");
        RoundRobin {
            services: services.into(),
            next: Arc::default(),
        }
    }

    /// The services, in turn order.
    #[cfg(test)]
    pub(crate) fn services(&self) -> &[S] {
        &self.services
    }
}

impl<S> Clone for RoundRobin<S> {
    fn clone(&self) -> Self {
        RoundRobin {
            services: Arc::clone(&self.services),
            next: Arc::clone(&self.next),
        }
    }
}

impl<S, R> Service<R> for RoundRobin<S>
where
    S: Service<R> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Oneshot<S, R>;

    /// Always ready: the service whose turn it is is readied by the call's future.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.services.len();
        Oneshot::new(self.services[turn].clone(), request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn each_call_goes_to_the_next_service_and_clones_share_the_turn() {
        let named =
            |name: &'static str| tower::service_fn(move |_: ()| async move { Ok::<_, ()>(name) });
        let turns = RoundRobin::new(vec![named("a"), named("b"), named("c")]);
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(turns.clone().oneshot(()).await.unwrap());
        }
        assert_eq!(answers, ["a", "b", "c", "a"]);
        assert_eq!(turns.services().len(), 3);
    }
}
