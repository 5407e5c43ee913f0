//! A limit with no numbers (`RateLimit::default()`) against a provider that states none either
//! and answers 429 beyond its quota, on tokio's paused clock: the rate learned from the 429s
//! (CUBIC) converges on the provider's, each 429 cutting it once, from the rate actually sent.

#![allow(clippy::unwrap_used)]

mod support;

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;
use stormguard_classify::{Outcome, Permit, Reason};
use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use support::head;
use tokio::task::JoinSet;
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// What the provider answers beyond its quota: a 429 with no hint and no headers.
fn too_many_requests() -> Outcome {
    Outcome::retryable(Reason::RateLimited).with_accepted(false)
}

/// A provider admitting `rate` requests a second (a token bucket of 1 s), answering 429
/// beyond, after `latency`; it states no limit.
struct Provider {
    rate: f64,
    level: f64,
    at: Instant,
}

impl Provider {
    fn new(rate: f64) -> Self {
        Self {
            rate,
            level: rate,
            at: Instant::now(),
        }
    }

    fn admits(&mut self, now: Instant) -> bool {
        self.level = (self.level + (now - self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        let admitted = self.level >= 1.0;
        if admitted {
            self.level -= 1.0;
        }
        admitted
    }
}

/// What went out, and how it was answered.
#[derive(Default)]
struct Run {
    /// Seconds since the start at which each request reached the provider, and whether it was
    /// admitted.
    sent: Vec<(f64, bool)>,
    /// Requests the limit refused (their wait would have been more than 2 s).
    refused: usize,
}

impl Run {
    /// Requests sent a second over `span` (seconds), and the share of them answered 429.
    fn over(&self, span: Range<f64>) -> (f64, f64, f64) {
        let sent: Vec<bool> = self
            .sent
            .iter()
            .filter(|(at, _)| span.contains(at))
            .map(|(_, admitted)| *admitted)
            .collect();
        let seconds = span.end - span.start;
        let admitted = sent.iter().filter(|admitted| **admitted).count();
        let throttled = (sent.len() - admitted) as f64 / sent.len().max(1) as f64;
        (
            sent.len() as f64 / seconds,
            admitted as f64 / seconds,
            throttled,
        )
    }
}

/// Offers `offered` requests a second for `seconds` through `limit` to a provider admitting 10
/// a second, answering after `latency`; every answer is shown to the limit.
async fn overload(limit: &RateLimit, offered: u64, seconds: u64, latency: Duration) -> Run {
    let origin = Instant::now();
    let provider = Arc::new(Mutex::new(Provider::new(10.0)));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut refused = 0;
    let mut waiting = JoinSet::new();
    for i in 0..offered * seconds {
        tokio::time::sleep_until(origin + Duration::from_nanos(i * 1_000_000_000 / offered)).await;
        let Ok(reservation) = limit.reserve(&head(), 0, None) else {
            refused += 1;
            continue;
        };
        let (provider, sent) = (Arc::clone(&provider), Arc::clone(&sent));
        waiting.spawn(async move {
            tokio::time::sleep_until(reservation.start()).await;
            let permit = reservation.send();
            let now = Instant::now();
            let admitted = provider.lock().unwrap().admits(now);
            sent.lock()
                .unwrap()
                .push(((now - origin).as_secs_f64(), admitted));
            tokio::time::sleep(latency).await;
            let outcome = if admitted {
                Outcome::success()
            } else {
                too_many_requests()
            };
            permit.record(&outcome, &HeaderMap::new());
        });
    }
    while waiting.join_next().await.is_some() {}
    let mut sent = sent.lock().unwrap().clone();
    sent.sort_by(|a, b| a.0.total_cmp(&b.0));
    Run { sent, refused }
}

/// 30 requests a second offered for 5 minutes to a provider admitting 10 (answers in 100 ms),
/// through a limit with no numbers. Without learning, two thirds of the requests meet a 429.
/// Learning from the 429s alone, the rate sent settles just above the provider's (CUBIC probes
/// past the rate of its last 429, and each cut reaches the provider only after the 2 s queue of
/// slots already given): from the second minute on, no minute sees more than 20% of 429s, and in
/// the last one the provider admits its whole quota (10 a second) while the client sends at most
/// 20% more, with fewer than 15% of 429s.
#[tokio::test(start_paused = true)]
async fn with_no_numbers_the_rate_converges_on_the_providers() {
    let blind = RateLimit::new(RateLimitConfig::default().without_learning());
    let (sent, _, throttled) = overload(&blind, 30, 60, 100 * MS).await.over(0.0..60.0);
    assert!((29.0..=30.5).contains(&sent), "{sent}");
    assert!(throttled > 0.6, "without learning: {throttled}");

    let limit = RateLimit::default();
    let run = overload(&limit, 30, 300, 100 * MS).await;
    for minute in 0..5 {
        let span = f64::from(minute) * 60.0..f64::from(minute + 1) * 60.0;
        let (sent, admitted, throttled) = run.over(span);
        println!(
            "minute {}: sent {sent:.2}/s, admitted {admitted:.2}/s, 429s {:.1}%",
            minute + 1,
            100.0 * throttled
        );
        if minute >= 1 {
            assert!(throttled < 0.2, "minute {}: {throttled}", minute + 1);
        }
    }
    let (sent, admitted, throttled) = run.over(240.0..300.0);
    assert!(throttled < 0.15, "{throttled}");
    assert!((9.9..=10.1).contains(&admitted), "{admitted}");
    assert!((10.0..=12.0).contains(&sent), "{sent}");
    assert!(run.refused > 300 * 15, "{} refused", run.refused);
}

/// A 429 cuts the rate to 70% of the rate actually sent over the last second: 20 requests sent
/// in one second, the last answered 429, give 14 a second. The 429s of requests reserved before
/// that cut (paced at the old rate) do not cut it again; a 429 to a request reserved after it
/// does, from what was sent since.
#[tokio::test(start_paused = true)]
async fn a_429_cuts_once_to_70_percent_of_the_rate_sent() {
    let limit = RateLimit::default();
    let mut before_the_cut = Vec::new();
    for i in 0..20 {
        let permit = limit.reserve(&head(), 0, None).unwrap().send();
        if i < 19 {
            permit.record(&Outcome::success(), &HeaderMap::new());
            tokio::time::advance(50 * MS).await;
        } else {
            before_the_cut.push(permit);
        }
    }
    // Four more sent in the same instant, to be answered after the cut.
    for _ in 0..4 {
        before_the_cut.push(limit.reserve(&head(), 0, None).unwrap().send());
    }
    // 24 sent in the last second: the first 429 cuts to 0.7 * 24 = 16.8 a second.
    let mut before_the_cut = before_the_cut.into_iter();
    let first = before_the_cut.next().unwrap();
    first.record(&too_many_requests(), &HeaderMap::new());
    let rate = |limit: &RateLimit| {
        drop(limit.reserve(&head(), 0, None));
        limit.snapshot().requests_per_minute
    };
    assert_eq!(rate(&limit), Some(1_008));
    for permit in before_the_cut {
        permit.record(&too_many_requests(), &HeaderMap::new());
    }
    assert_eq!(
        rate(&limit),
        Some(1_008),
        "one cut for the requests sent before it"
    );

    // A request reserved after the cut meets a 429: cut again, from the rate in force.
    tokio::time::advance(10 * MS).await;
    let after = limit.reserve(&head(), 0, None).unwrap().send();
    after.record(&too_many_requests(), &HeaderMap::new());
    // 0.7 times the 16.88 a second in force 10 ms after the first cut.
    assert_eq!(rate(&limit), Some(709));
}

/// The rate that met a 429 is the rate *sent*: reservations still waiting for their slot (or
/// given back) are not requests the provider saw. 10 sent and 30 reserved but unsent: the cut is
/// to 7 a second, not 28.
#[tokio::test(start_paused = true)]
async fn the_rate_cut_is_the_rate_sent_not_reserved() {
    let limit = RateLimit::default();
    let mut sent: Vec<_> = (0..10)
        .map(|_| limit.reserve(&head(), 0, None).unwrap().send())
        .collect();
    let waiting: Vec<_> = (0..30)
        .map(|_| limit.reserve(&head(), 0, None).unwrap())
        .collect();
    sent.remove(0)
        .record(&too_many_requests(), &HeaderMap::new());
    drop(waiting);
    drop(limit.reserve(&head(), 0, None));
    assert_eq!(limit.snapshot().requests_per_minute, Some(420));
}

/// After a cut the rate grows back along CUBIC's curve while the provider admits: back at the
/// rate of the 429 after K = ∛(w · 0.3 / 0.4) seconds (2.47 s for 20 a second), and beyond it
/// after (the limit may have been raised), though never above twice the rate sent.
#[tokio::test(start_paused = true)]
async fn after_a_cut_the_rate_grows_back_and_beyond() {
    let limit = RateLimit::default();
    for _ in 0..19 {
        limit
            .reserve(&head(), 0, None)
            .unwrap()
            .send()
            .record(&Outcome::success(), &HeaderMap::new());
        tokio::time::advance(50 * MS).await;
    }
    let last = limit.reserve(&head(), 0, None).unwrap().send();
    last.record(&too_many_requests(), &HeaderMap::new());
    let origin = Instant::now();
    // Keep sending as fast as the limit allows, all admitted, for 6 s; note the rate in force.
    let mut rates = Vec::new();
    while Instant::now() - origin < Duration::from_secs(6) {
        let reservation = limit.reserve(&head(), 0, None).unwrap();
        tokio::time::sleep_until(reservation.start()).await;
        reservation
            .send()
            .record(&Outcome::success(), &HeaderMap::new());
        rates.push((
            Instant::now() - origin,
            limit.snapshot().requests_per_minute.unwrap(),
        ));
    }
    let rate_at = |at: Duration| {
        rates
            .iter()
            .take_while(|(when, _)| *when <= at)
            .last()
            .unwrap()
            .1
    };
    assert!((840..=860).contains(&rate_at(Duration::ZERO)), "{rates:?}");
    assert!(rate_at(Duration::from_secs(2)) < 1_200, "{rates:?}");
    let k = Duration::from_millis(2_466);
    assert!(rate_at(k + 100 * MS) >= 1_200, "{rates:?}");
    assert!(rate_at(Duration::from_secs(6)) > 1_500, "{rates:?}");
}
