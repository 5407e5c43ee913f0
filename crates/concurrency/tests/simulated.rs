//! Declarative cases on a simulated provider (slots, a queue, 429 over it, streams holding their
//! slots until their bodies end), run on tokio's paused clock: each asserts ranges of the limit
//! and of the attempts in flight, as Vector's adaptive concurrency tests do.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use stormguard_concurrency::{ConcurrencyConfig, ConcurrencyLimit};
use support::{Case, Phase, run};

fn phase(at: f64, slots: u32, latency_ms: u64) -> Phase {
    Phase {
        at,
        slots,
        latency: Duration::from_millis(latency_ms),
    }
}

fn limit() -> ConcurrencyLimit {
    ConcurrencyLimit::new(ConcurrencyConfig::default())
}

/// More demand than the provider's 20 slots (40 requests a second of 1 s streams want 40 in
/// flight): the limit settles just above the slots plus the queue's room, so the provider stays
/// busy and almost nothing is answered 429.
#[tokio::test(start_paused = true)]
async fn settles_at_the_slots_of_a_saturated_provider() {
    let case = Case {
        phases: vec![phase(0.0, 20, 1_000)],
        queue: 5,
        rate: 40.0,
        seconds: 60.0,
    };
    let run = run(&case, limit()).await;
    let (low, high) = run.limit_range(20.0, 60.0);
    assert!(low >= 17 && high <= 30, "limit {low}..{high}");
    let in_flight = run.mean_in_flight(20.0, 60.0);
    assert!(
        (18.0..=27.0).contains(&in_flight),
        "in flight {in_flight:.1}"
    );
    // What the slots allow: 20 streams of 1 s on average, 20 a second, 800 in the last 40 s.
    assert!(run.completed >= 1_100, "{run:?}");
    let rejected = run.rejected as f64 / run.offered as f64;
    assert!(rejected < 0.01, "429s: {} of {}", run.rejected, run.offered);
}

/// The provider's latency triples (800 ms to 2,500 ms) with its slots unchanged: the limit does
/// not shrink for it (a latency-based limit would), it stays at the slots.
#[tokio::test(start_paused = true)]
async fn a_latency_step_does_not_shrink_the_limit() {
    let case = Case {
        phases: vec![phase(0.0, 30, 800), phase(20.0, 30, 2_500)],
        queue: 5,
        rate: 50.0,
        seconds: 50.0,
    };
    let run = run(&case, limit()).await;
    let before = run.mean_limit(10.0, 20.0);
    let after = run.mean_limit(30.0, 50.0);
    assert!((27.0..=38.0).contains(&before), "before {before:.1}");
    assert!((27.0..=38.0).contains(&after), "after {after:.1}");
    let in_flight = run.mean_in_flight(30.0, 50.0);
    assert!(
        (27.0..=37.5).contains(&in_flight),
        "in flight {in_flight:.1}"
    );
}

/// The provider's slots are halved (40 to 20) at 30 s: the limit follows them down within
/// seconds, and the 429s of the step stay a sliver of the load.
#[tokio::test(start_paused = true)]
async fn follows_the_capacity_halved() {
    let case = Case {
        phases: vec![phase(0.0, 40, 1_000), phase(30.0, 20, 1_000)],
        queue: 5,
        rate: 60.0,
        seconds: 60.0,
    };
    let run = run(&case, limit()).await;
    let before = run.mean_limit(20.0, 30.0);
    assert!((38.0..=50.0).contains(&before), "before {before:.1}");
    let settled = run.settled_at(30.0, 60.0, 17, 28).unwrap();
    assert!(settled < 40.0, "settled at {settled:.1} s");
    let in_flight = run.mean_in_flight(40.0, 60.0);
    assert!(
        (17.0..=25.0).contains(&in_flight),
        "in flight {in_flight:.1}"
    );
    let rejected = run.rejected as f64 / run.offered as f64;
    assert!(rejected < 0.01, "429s: {} of {}", run.rejected, run.offered);
}

/// An application-limited client (2 requests a second of 1 s streams: 2 in flight) never grows
/// its limit, however long it runs.
#[tokio::test(start_paused = true)]
async fn idle_time_does_not_grow_the_limit() {
    let case = Case {
        phases: vec![phase(0.0, 100, 1_000)],
        queue: 0,
        rate: 2.0,
        seconds: 120.0,
    };
    let run = run(&case, limit()).await;
    assert_eq!(run.limit_range(0.0, 130.0), (20, 20));
    assert_eq!((run.grown, run.shrunk), (0, 0));
    assert_eq!(run.completed, 240);
}

/// A provider that takes nothing for 20 s (no slots, no queue: every attempt is answered 429)
/// drives the limit to its floor; once it has 30 slots again, the limit leaves the floor at once
/// and climbs back, one slot per round trip.
#[tokio::test(start_paused = true)]
async fn never_stays_at_the_minimum_after_a_recovery() {
    let case = Case {
        phases: vec![phase(0.0, 0, 1_000), phase(20.0, 30, 1_000)],
        queue: 0,
        rate: 40.0,
        seconds: 60.0,
    };
    let run = run(&case, limit()).await;
    assert_eq!(run.limit_range(10.0, 20.0), (3, 3));
    let (low, _) = run.limit_range(25.0, 60.0);
    assert!(low >= 5, "still at {low} 5 s after the recovery");
    let (_, high) = run.limit_range(55.0, 60.0);
    assert!(high >= 25, "only {high} 35 s after the recovery");
}
