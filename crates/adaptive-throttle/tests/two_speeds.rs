//! The two speeds that matter besides the formula, for a client offering 1,000 requests per
//! second (one every millisecond) on a paused clock: how fast a total outage after healthy
//! traffic is cut, and how fast traffic comes back once the backend recovers.
//!
//! The backend answers instantly: each request that passes is recorded in the same millisecond.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_numbers::random::RandomSource;

mod support;
use support::answer;

const TICK: Duration = Duration::from_millis(1);
const PER_SECOND: u32 = 1_000;

/// What one simulated second looked like.
#[derive(Clone, Debug, Default)]
struct Second {
    offered: u32,
    sent: u32,
    /// Drop probability seen by each request of the second, in order.
    probabilities: Vec<f64>,
}

impl Second {
    fn sent_fraction(&self) -> f64 {
        f64::from(self.sent) / f64::from(self.offered)
    }

    fn mean_probability(&self) -> f64 {
        self.probabilities.iter().sum::<f64>() / self.probabilities.len() as f64
    }

    fn max_probability(&self) -> f64 {
        self.probabilities.iter().copied().fold(0.0, f64::max)
    }
}

/// One second at 1,000 requests per second. `accepts(n)` says whether the n-th request that
/// reached the backend during this second was accepted.
async fn second(throttle: &AdaptiveThrottle, mut accepts: impl FnMut(u32) -> bool) -> Second {
    let mut s = Second::default();
    for _ in 0..PER_SECOND {
        s.probabilities.push(throttle.probability());
        s.offered += 1;
        if let Ok(permit) = throttle.try_acquire() {
            answer(permit, accepts(s.sent));
            s.sent += 1;
        }
        tokio::time::advance(TICK).await;
    }
    s
}

/// How long after the start of `seconds` the drop probability fell below `below` for good.
fn settled_below(seconds: &[Second], below: f64) -> Option<Duration> {
    let all: Vec<f64> = seconds
        .iter()
        .flat_map(|s| s.probabilities.iter().copied())
        .collect();
    let last_above = all.iter().rposition(|&p| p >= below);
    match last_above {
        None => Some(Duration::ZERO),
        Some(i) if i + 1 < all.len() => Some(TICK * (i as u32 + 1)),
        Some(_) => None,
    }
}

fn print_table(title: &str, seconds: &[(i64, Second)]) {
    println!("{title}");
    println!("second  sent/offered  mean P_drop  max P_drop");
    for (at, s) in seconds {
        println!(
            "{at:>+6}  {:>12.4}  {:>11.4}  {:>10.4}",
            s.sent_fraction(),
            s.mean_probability(),
            s.max_probability()
        );
    }
}

/// 20 s healthy, 10 s total outage, then healthy again, with the default throttle.
///
/// Asserted, for every one-second interval `[start + n s, start + (n + 1) s)` of the outage with
/// `n >= 3`: fewer than 10% of the offered requests reach the dead backend (the outage is cut
/// within 3 s of its start). From 5 s after the backend recovers on, every request sees a drop
/// probability below 5%; the time at which it settled below 5% is printed. Healthy traffic before
/// the outage is never dropped.
#[tokio::test(start_paused = true)]
async fn default_cuts_an_outage_within_3_s_and_recovers_within_5_s() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(7));
    let mut table = Vec::new();

    for at in -20..0 {
        let s = second(&throttle, |_| true).await;
        assert_eq!(s.sent, s.offered, "healthy second {at} dropped requests");
        table.push((at, s));
    }
    let mut outage_sent = 0;
    for at in 0..10 {
        let s = second(&throttle, |_| false).await;
        if at >= 3 {
            assert!(
                s.sent_fraction() < 0.10,
                "outage second {at}: {} of {} reached the dead backend",
                s.sent,
                s.offered
            );
        }
        outage_sent += s.sent;
        table.push((at, s));
    }
    let mut recovery = Vec::new();
    for at in 0..10 {
        let s = second(&throttle, |_| true).await;
        if at >= 5 {
            assert!(
                s.max_probability() < 0.05,
                "{at} s after the recovery P_drop is still {}",
                s.max_probability()
            );
        }
        recovery.push(s.clone());
        table.push((10 + at, s));
    }
    print_table(
        "default throttle, 1,000 req/s: healthy, total outage at 0 s, recovery at 10 s",
        &table[15..],
    );
    println!("requests that reached the dead backend during the 10 s outage: {outage_sent}");
    println!(
        "P_drop below 5% for good {:?} after the recovery",
        settled_below(&recovery, 0.05)
    );
}

/// The SRE book's plain configuration: K = 2 over two minutes, no cap, no minimum rate, no
/// recovery run.
fn plain_two_minutes() -> AdaptiveThrottle {
    AdaptiveThrottle::new(
        ThrottleConfig::default()
            .with_k(2.0)
            .with_window(Duration::from_secs(120))
            .with_max_probability(1.0)
            .with_min_rate(0.0)
            .with_recovery_run(0)
            .with_seed(11),
    )
}

/// With the backend accepting everything, how long until the drop probability is below `below`.
async fn time_until_probability_below(
    throttle: &AdaptiveThrottle,
    below: f64,
    limit: Duration,
) -> Option<Duration> {
    let mut waited = Duration::ZERO;
    while waited < limit {
        if throttle.probability() < below {
            return Some(waited);
        }
        if let Ok(permit) = throttle.try_acquire() {
            answer(permit, true);
        }
        tokio::time::advance(TICK).await;
        waited += TICK;
    }
    None
}

/// The plain two-minute window: a client that lived through a 10 s total outage at 1,000
/// requests per second keeps dropping nearly everything long after the backend is back. The
/// outage-era requests need two minutes to age out, and meanwhile the drops themselves keep
/// `requests` high while accepts only compound back from the few requests that pass.
/// The same client with the default throttle is back within 5 s.
#[tokio::test(start_paused = true)]
async fn plain_two_minute_window_stays_blocked_long_after_recovery() {
    let limit = Duration::from_secs(30 * 60);
    let mut blocked = Vec::new();
    for throttle in [
        plain_two_minutes(),
        AdaptiveThrottle::new(ThrottleConfig::default().with_seed(11)),
    ] {
        for _ in 0..10 {
            second(&throttle, |_| false).await;
        }
        assert!(throttle.probability() > 0.98, "{throttle:?}");
        blocked.push(time_until_probability_below(&throttle, 0.05, limit).await);
    }
    let [plain_blocked, default_blocked] = [blocked[0], blocked[1]];
    println!("after a 10 s outage at 1,000 req/s, P_drop < 5% again after:");
    println!("  plain 2-minute window: {plain_blocked:?} (limit {limit:?})");
    println!("  default throttle:      {default_blocked:?}");

    let plain_blocked = plain_blocked.expect("the plain window recovers eventually");
    assert!(
        plain_blocked > Duration::from_secs(120),
        "{plain_blocked:?}"
    );
    assert!(default_blocked.expect("the default recovers") < Duration::from_secs(5));
}

/// The other speed: with the plain two-minute window, 20 s of healthy history mask a 10 s total
/// outage completely. Nothing is dropped until `requests > 2 * accepts`, i.e. until failures
/// outnumber the accepts in the window: 20 s into an outage after 20 s of health. The default
/// throttle sends the dead backend a fraction of the same outage (its first 1 to 2 s, then 1%).
#[tokio::test(start_paused = true)]
async fn plain_two_minute_window_masks_an_outage_behind_healthy_history() {
    let plain = plain_two_minutes();
    let default = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(11));
    let mut sent_into_outage = Vec::new();
    for throttle in [&plain, &default] {
        for _ in 0..20 {
            second(throttle, |_| true).await;
        }
        let mut sent = 0;
        for _ in 0..10 {
            sent += second(throttle, |_| false).await.sent;
        }
        sent_into_outage.push(sent);
    }
    println!(
        "requests sent into the 10 s outage: plain {}, default {}",
        sent_into_outage[0], sent_into_outage[1]
    );

    let snapshot = plain.snapshot();
    assert_eq!((snapshot.requests, snapshot.accepts), (30_000, 20_000));
    assert_eq!(snapshot.probability, 0.0);
    assert_eq!(sent_into_outage[0], 10_000);
    // The default: at most the first 2 s at full rate, then about 1%.
    assert!(sent_into_outage[1] < 2_000, "{}", sent_into_outage[1]);
}

/// A 5% error rate (no outage) is noise, not overload: over 60 s at 1,000 requests per second
/// with 5% of requests not accepted at random, the default throttle drops nothing.
#[tokio::test(start_paused = true)]
async fn five_percent_errors_drop_nothing() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_seed(3));
    let backend = RandomSource::seeded(5);
    let mut failed = 0;
    for at in 0..60 {
        let s = second(&throttle, |_| {
            let accepted = backend.f64() >= 0.05;
            failed += u32::from(!accepted);
            accepted
        })
        .await;
        assert_eq!(s.sent, s.offered, "second {at}");
        assert_eq!(s.max_probability(), 0.0, "second {at}");
    }
    // The backend really did fail about 5% of the 60,000 requests.
    assert!((2_700..3_300).contains(&failed), "{failed}");
}

/// A client offering a steady number of requests per second, spread evenly over 1 ms steps.
struct Client {
    per_tick: f64,
    due: f64,
}

impl Client {
    fn new(per_second: u32) -> Self {
        Self {
            per_tick: f64::from(per_second) / 1_000.0,
            due: 0.0,
        }
    }

    /// One millisecond of requests against a backend answering `accepted`.
    async fn tick(&mut self, throttle: &AdaptiveThrottle, accepted: bool) {
        self.due += self.per_tick;
        while self.due >= 1.0 {
            self.due -= 1.0;
            if let Ok(permit) = throttle.try_acquire() {
                answer(permit, accepted);
            }
        }
        tokio::time::advance(TICK).await;
    }
}

/// After a 10 s total outage, the time until the drop probability is below 5% for good, at
/// several request rates, with and without the recovery run. The run is what brings a client at
/// 1,000 requests per second back within 5 s; its speed follows the probe rate (1% of the offered
/// load), so slower clients take longer and faster ones less.
#[tokio::test(start_paused = true)]
async fn recovery_time_follows_the_probe_rate() {
    let mut measured = Vec::new();
    for (rate, run) in [(100, 10), (1_000, 10), (10_000, 10), (1_000, 0)] {
        let throttle = AdaptiveThrottle::new(
            ThrottleConfig::default()
                .with_recovery_run(run)
                .with_seed(13),
        );
        let mut client = Client::new(rate);
        for ms in 0..30_000 {
            client
                .tick(&throttle, !(20_000..30_000).contains(&ms))
                .await;
        }
        // Watch the probability each millisecond for 30 s of recovery.
        let mut last_above = None;
        for ms in 0..30_000_u32 {
            if throttle.probability() >= 0.05 {
                last_above = Some(ms);
            }
            client.tick(&throttle, true).await;
        }
        let settled = Duration::from_millis(last_above.map_or(0, |ms| u64::from(ms) + 1));
        println!("{rate:>6} req/s, recovery run {run:>2}: P_drop < 5% for good after {settled:?}");
        measured.push(settled);
    }
    assert!(
        measured[0] < Duration::from_secs(20),
        "100 req/s: {:?}",
        measured[0]
    );
    assert!(
        measured[1] < Duration::from_secs(5),
        "1,000 req/s: {:?}",
        measured[1]
    );
    assert!(
        measured[2] < Duration::from_secs(1),
        "10,000 req/s: {:?}",
        measured[2]
    );
    assert!(
        measured[3] > Duration::from_secs(5),
        "no recovery run: {:?}",
        measured[3]
    );
}
