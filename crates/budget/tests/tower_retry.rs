//! `RetryBudget` as the budget of a plain `tower::retry::Retry`.
#![allow(clippy::unwrap_used)]

use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use stormguard_budget::{BudgetConfig, RetryBudget};
use tower::retry::budget::Budget;
use tower::retry::{Policy, Retry};
use tower::{Service, ServiceExt, service_fn};

/// Retries failures while the budget allows; deposits successes. Knows the budget only through
/// tower's `Budget` trait.
#[derive(Clone)]
struct BudgetPolicy<B> {
    budget: B,
}

impl<B: Budget> Policy<u32, &'static str, &'static str> for BudgetPolicy<B> {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut u32,
        result: &mut Result<&'static str, &'static str>,
    ) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) => self.budget.withdraw().then(|| ready(())),
        }
    }

    fn clone_request(&mut self, req: &u32) -> Option<u32> {
        Some(*req)
    }
}

/// A backend that answers `ok` to requests below `healthy_below` and fails the rest; counts calls.
fn backend(
    calls: Arc<AtomicU32>,
) -> impl tower::Service<
    u32,
    Response = &'static str,
    Error = &'static str,
    Future = Ready<Result<&'static str, &'static str>>,
> + Clone {
    service_fn(move |req: u32| {
        calls.fetch_add(1, Ordering::Relaxed);
        ready(if req < 1000 {
            Ok("ok")
        } else {
            Err("unavailable")
        })
    })
}

#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_budget_is_spent() {
    let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
    let calls = Arc::new(AtomicU32::new(0));
    let policy = BudgetPolicy {
        budget: budget.clone(),
    };
    let mut service = Retry::new(policy, backend(calls.clone()));

    // 30 successes earn 3 retries.
    for req in 0..30 {
        assert_eq!(service.ready().await.unwrap().call(req).await, Ok("ok"));
    }
    assert_eq!(calls.load(Ordering::Relaxed), 30);

    // A failing request is retried 3 times (4 calls), then the budget says no.
    assert_eq!(
        service.ready().await.unwrap().call(1000).await,
        Err("unavailable")
    );
    assert_eq!(calls.load(Ordering::Relaxed), 34);
    // The next failure gets no retry at all.
    assert_eq!(
        service.ready().await.unwrap().call(1001).await,
        Err("unavailable")
    );
    assert_eq!(calls.load(Ordering::Relaxed), 35);

    let snapshot = budget.snapshot();
    assert_eq!(
        (snapshot.deposits, snapshot.withdrawals, snapshot.rejected),
        (30, 3, 2)
    );

    // Once the successes age out of the window and new ones come in, retries come back.
    tokio::time::advance(Duration::from_secs(10)).await;
    for req in 0..10 {
        assert_eq!(service.ready().await.unwrap().call(req).await, Ok("ok"));
    }
    let before = calls.load(Ordering::Relaxed);
    assert_eq!(
        service.ready().await.unwrap().call(1002).await,
        Err("unavailable")
    );
    assert_eq!(calls.load(Ordering::Relaxed), before + 2);
}
