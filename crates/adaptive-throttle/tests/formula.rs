//! The SRE formula, checked number by number on a paused clock:
//! `P_drop = max(0, (requests - K * accepts) / (requests + 1))`, capped, zero below the minimum
//! rate.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, ThrottleSnapshot};

mod support;
use support::answer;

const TICK: Duration = Duration::from_millis(1);

/// The formula, computed independently from a snapshot's counts: K = 2, capped at `cap`, zero
/// below the default minimum rate (5 per second, 10 requests in the 2 s window).
fn expected(snapshot: &ThrottleSnapshot, cap: f64) -> f64 {
    let requests = snapshot.requests as f64;
    let accepts = snapshot.accepts as f64;
    if requests < 10.0 {
        return 0.0;
    }
    ((requests - 2.0 * accepts) / (requests + 1.0)).clamp(0.0, cap)
}

/// Sent requests compared with the sum of pass probabilities: returns (sent, expected, sigma).
#[derive(Default)]
struct Tally {
    sent: f64,
    expected: f64,
    variance: f64,
}

impl Tally {
    fn add(&mut self, p_drop: f64, sent: bool) {
        self.sent += f64::from(u8::from(sent));
        self.expected += 1.0 - p_drop;
        self.variance += p_drop * (1.0 - p_drop);
    }

    /// Sent within four standard deviations (plus one request) of what the formula predicts.
    fn assert_matches(&self, what: &str) {
        let tolerance = 4.0 * self.variance.sqrt() + 1.0;
        println!(
            "{what}: sent {}, formula predicts {:.1} +- {tolerance:.1}",
            self.sent, self.expected
        );
        assert!(
            (self.sent - self.expected).abs() <= tolerance,
            "{what}: sent {} but the formula predicts {:.1} +- {tolerance:.1}",
            self.sent,
            self.expected
        );
    }
}

/// Offer `seconds` of 1,000 requests per second to a backend that rejects everything; check
/// that every probability is the formula's, and that what passes matches it statistically.
async fn dead_backend(throttle: &AdaptiveThrottle, cap: f64, seconds: u32) -> Tally {
    let mut tally = Tally::default();
    for ms in 0..seconds * 1_000 {
        let snapshot = throttle.snapshot();
        assert_eq!(snapshot.probability, expected(&snapshot, cap), "at {ms} ms");
        let permit = throttle.try_acquire();
        let sent = permit.is_ok();
        if let Ok(permit) = permit {
            answer(permit, false);
        }
        // Statistics once the window has filled (2 s).
        if ms >= 2_000 {
            tally.add(snapshot.probability, sent);
        }
        tokio::time::advance(TICK).await;
    }
    tally
}

/// The plain formula (no cap): once the window has filled, a dead backend sees about one request
/// per window (`1 / (requests + 1)` of 2,000 requests), i.e. about 0.05% of the offered load.
#[tokio::test(start_paused = true)]
async fn dead_backend_gets_what_the_plain_formula_lets_through() {
    let throttle = AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_k(2.0)
            .with_window(Duration::from_secs(2))
            .with_max_probability(1.0)
            .with_seed(1),
    );
    let tally = dead_backend(&throttle, 1.0, 60).await;
    tally.assert_matches("plain formula, dead backend, 58 s");
    assert!(tally.sent / 58_000.0 < 0.001, "{}", tally.sent);
    let snapshot = throttle.snapshot();
    assert_eq!(snapshot.accepts, 0);
    assert!((1_900..=2_000).contains(&snapshot.requests), "{snapshot:?}");
}

/// The default cap of 99%: a dead backend gets 1% of the offered load, the probes that will see it
/// recover.
#[tokio::test(start_paused = true)]
async fn dead_backend_gets_one_percent_under_the_default_cap() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(2));
    let tally = dead_backend(&throttle, ThrottleConfig::DEFAULT_MAX_PROBABILITY, 60).await;
    tally.assert_matches("default cap, dead backend, 58 s");
    let fraction = tally.sent / 58_000.0;
    assert!((0.008..0.012).contains(&fraction), "{fraction}");
    assert_eq!(throttle.probability(), 0.99);
}

/// Envoy's default cap of 80% lets a fifth of the offered load through to a dead backend.
#[tokio::test(start_paused = true)]
async fn a_cap_of_eighty_percent_sends_a_fifth() {
    let throttle = AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_max_probability(0.8)
            .with_seed(3),
    );
    let tally = dead_backend(&throttle, 0.8, 20).await;
    tally.assert_matches("cap 0.8, dead backend, 18 s");
    let fraction = tally.sent / 18_000.0;
    assert!((0.18..0.22).contains(&fraction), "{fraction}");
}

/// K = 2 and half the requests accepted: `requests - 2 * accepts` never exceeds zero, so nothing
/// is dropped, however long it lasts.
#[tokio::test(start_paused = true)]
async fn half_accepted_drops_nothing() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(4));
    for ms in 0_u32..60_000 {
        let Ok(permit) = throttle.try_acquire() else {
            panic!("dropped at {ms} ms");
        };
        // Every other request is accepted, starting with the first.
        answer(permit, ms.is_multiple_of(2));
        tokio::time::advance(TICK).await;
    }
    let snapshot = throttle.snapshot();
    assert_eq!(snapshot.probability, 0.0);
    assert_eq!(snapshot.requests, 2 * snapshot.accepts);
    assert!((1_900..=2_000).contains(&snapshot.requests), "{snapshot:?}");
}

/// Overload, the case the formula is made for: a backend that can accept 200 requests per second,
/// offered 1,000. The client settles at sending K times what is accepted (400 per second), i.e. it
/// drops `(1000 - 2 * 200) / 1000` = 60% locally.
#[tokio::test(start_paused = true)]
async fn overload_settles_at_k_times_the_accepted_rate() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(5));
    // Token bucket: 0.2 tokens per millisecond, at most ten banked.
    let mut tokens = 0.0_f64;
    let (mut sent, mut accepted, mut p_sum) = (0_u32, 0_u32, 0.0);
    for ms in 0..30_000 {
        tokens = (tokens + 0.2).min(10.0);
        let p = throttle.probability();
        if let Ok(permit) = throttle.try_acquire() {
            let accept = tokens >= 1.0;
            if accept {
                tokens -= 1.0;
            }
            answer(permit, accept);
            if ms >= 10_000 {
                sent += 1;
                accepted += u32::from(accept);
            }
        }
        if ms >= 10_000 {
            p_sum += p;
        }
        tokio::time::advance(TICK).await;
    }
    let (sent_per_s, accepted_per_s, mean_p) = (
        f64::from(sent) / 20.0,
        f64::from(accepted) / 20.0,
        p_sum / 20_000.0,
    );
    println!("overload: sent {sent_per_s}/s, accepted {accepted_per_s}/s, mean P_drop {mean_p:.3}");
    assert!(
        (195.0..=200.0).contains(&accepted_per_s),
        "{accepted_per_s}"
    );
    assert!((360.0..440.0).contains(&sent_per_s), "{sent_per_s}");
    assert!((0.56..0.64).contains(&mean_p), "{mean_p}");
}

/// Below the minimum rate nothing is dropped, even with every request failing; above it the
/// formula applies.
#[tokio::test(start_paused = true)]
async fn nothing_is_dropped_below_the_minimum_rate() {
    // 4 requests per second (8 in the 2 s window) against the default minimum of 5 per second.
    let slow = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(6));
    for i in 0..400 {
        let Ok(permit) = slow.try_acquire() else {
            panic!("request {i} dropped at 4 req/s");
        };
        answer(permit, false);
        tokio::time::advance(Duration::from_millis(250)).await;
    }
    // The window spans 19 full slices plus the current one: 7 or 8 requests at 4 per second.
    assert!((7..=8).contains(&slow.snapshot().requests));

    // 20 requests per second: about 40 in the window, all failed, P_drop = n / (n + 1).
    let fast = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(6));
    let mut dropped = 0;
    for _ in 0..400 {
        if let Ok(permit) = fast.try_acquire() {
            answer(permit, false);
        } else {
            dropped += 1;
        }
        tokio::time::advance(Duration::from_millis(50)).await;
    }
    let snapshot = fast.snapshot();
    assert!((38..=40).contains(&snapshot.requests), "{snapshot:?}");
    assert_eq!(snapshot.accepts, 0);
    let n = snapshot.requests as f64;
    assert_eq!(snapshot.probability, n / (n + 1.0));
    assert!(dropped > 300, "{dropped}");

    // The same slow traffic with no minimum rate: n failed in the window, P_drop = n / (n + 1).
    let no_minimum =
        AdaptiveThrottle::new(ThrottleConfig::default().with_min_rate(0.0).with_seed(6));
    for _ in 0..20 {
        if let Ok(permit) = no_minimum.try_acquire() {
            answer(permit, false);
        }
        tokio::time::advance(Duration::from_millis(250)).await;
    }
    let snapshot = no_minimum.snapshot();
    let n = snapshot.requests as f64;
    assert!((7.0..=8.0).contains(&n), "{snapshot:?}");
    assert_eq!(snapshot.probability, n / (n + 1.0));
}

/// The same seed gives the same drops; another seed gives others.
#[tokio::test(start_paused = true)]
async fn seeded_throttles_drop_the_same_requests() {
    async fn drops(seed: u64) -> Vec<bool> {
        let throttle = AdaptiveThrottle::new(
            ThrottleConfig::default()
                .with_max_probability(0.5)
                .with_seed(seed),
        );
        let mut drops = Vec::new();
        for _ in 0..5_000 {
            let permit = throttle.try_acquire();
            let dropped = permit.is_err();
            if let Ok(permit) = permit {
                answer(permit, false);
            }
            drops.push(dropped);
            tokio::time::advance(TICK).await;
        }
        drops
    }
    let first = drops(42).await;
    assert_eq!(first, drops(42).await);
    assert_ne!(first, drops(43).await);
    let dropped = first.iter().filter(|&&d| d).count();
    // Half of the 4,990 requests after the first ten (the minimum rate), with the cap at 0.5.
    assert!((2_350..2_650).contains(&dropped), "{dropped}");
}
