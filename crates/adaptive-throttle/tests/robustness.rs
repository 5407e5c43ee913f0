//! Contention while the throttle is actively dropping: four threads drawing, recording a mix of
//! accepted and rejected outcomes, and reading snapshots, while the clock turns slices under them.
//! Every local drop and every recorded outcome is one request, exactly; accepts are exact; and
//! the probability stays within `[0, max_probability]`.
#![allow(clippy::unwrap_used)]

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stormguard_adaptive_throttle::{AdaptiveThrottle, ThrottleConfig, ThrottleSnapshot};

mod support;
use support::answer;

const THREADS: usize = 4;
const PER_THREAD: u64 = 40_000;

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    drops: u64,
    records: u64,
    accepted: u64,
}

/// Worker threads draw and record (accepting one passed request in `accept_every`); one more
/// thread reads snapshots all along. The paused clock moves 1.5 s of the 2 s window in 1 ms steps.
/// Returns what the workers did, the final snapshot and the worst snapshot seen by the reader.
fn hammer(
    throttle: &AdaptiveThrottle,
    accept_every: u64,
) -> (Tally, ThrottleSnapshot, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let handle = runtime.handle();
    let start = Barrier::new(THREADS + 2);
    let done = AtomicBool::new(false);
    let (tally, anomalies) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (throttle, start, done) = (throttle.clone(), &start, &done);
                scope.spawn(move || {
                    let _clock = handle.enter();
                    let mut tally = Tally::default();
                    start.wait();
                    let mut attempts = 0;
                    while attempts < PER_THREAD || !done.load(Ordering::Relaxed) {
                        attempts += 1;
                        match throttle.try_acquire() {
                            Err(_) => tally.drops += 1,
                            Ok(permit) => {
                                let accepted = tally.records % accept_every == 0;
                                answer(permit, accepted);
                                tally.records += 1;
                                tally.accepted += u64::from(accepted);
                            }
                        }
                    }
                    tally
                })
            })
            .collect();
        let reader = {
            let (throttle, start, done) = (throttle.clone(), &start, &done);
            scope.spawn(move || {
                let _clock = handle.enter();
                let mut anomalies = Vec::new();
                start.wait();
                while !done.load(Ordering::Relaxed) {
                    let snapshot = throttle.snapshot();
                    let p = snapshot.probability;
                    if !(0.0..=ThrottleConfig::DEFAULT_MAX_PROBABILITY).contains(&p) {
                        anomalies.push(format!("probability {p}"));
                    }
                    if snapshot.accepts > snapshot.requests && anomalies.len() < 5 {
                        anomalies.push(format!(
                            "accepts {} > requests {}",
                            snapshot.accepts, snapshot.requests
                        ));
                    }
                }
                anomalies
            })
        };
        start.wait();
        runtime.block_on(async {
            for _ in 0..1_500 {
                tokio::time::advance(Duration::from_millis(1)).await;
            }
        });
        done.store(true, Ordering::Relaxed);
        let tally = workers
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .fold(Tally::default(), |sum, tally| Tally {
                drops: sum.drops + tally.drops,
                records: sum.records + tally.records,
                accepted: sum.accepted + tally.accepted,
            });
        (tally, reader.join().unwrap())
    });
    let _clock = runtime.enter();
    (tally, throttle.snapshot(), anomalies)
}

/// A backend accepting a quarter of what it gets, with recovery runs off (they clear the window
/// on purpose): the throttle drops a share of the requests, and `requests == drops + records`,
/// `accepts == accepted records`, exactly.
#[test]
fn requests_are_exactly_drops_plus_records_while_dropping() {
    let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_recovery_run(0));
    let (tally, snapshot, anomalies) = hammer(&throttle, 4);
    println!("{tally:?} -> {snapshot:?}");
    assert!(tally.drops > 0, "the throttle never dropped: {tally:?}");
    assert!(tally.records > 0);
    assert_eq!(snapshot.requests, tally.drops + tally.records);
    assert_eq!(snapshot.accepts, tally.accepted);
    // P = (requests - 2 accepts) / (requests + 1), from the exact counts.
    let expected = (snapshot.requests as f64 - 2.0 * snapshot.accepts as f64)
        / (snapshot.requests as f64 + 1.0);
    let expected = expected.clamp(0.0, ThrottleConfig::DEFAULT_MAX_PROBABILITY);
    assert!((snapshot.probability - expected).abs() < 1e-12);
    let probability_anomalies: Vec<_> = anomalies
        .iter()
        .filter(|anomaly| anomaly.starts_with("probability"))
        .collect();
    assert!(
        probability_anomalies.is_empty(),
        "{probability_anomalies:?}"
    );
}

/// A backend that accepts everything is never throttled, however many threads record while
/// others draw, and a snapshot taken meanwhile never shows more accepts than requests.
#[test]
fn concurrent_snapshots_never_show_more_accepts_than_requests() {
    for _ in 0..5 {
        // Everything accepted: requests and accepts grow in lockstep, the tightest case.
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default().with_recovery_run(0));
        let (tally, snapshot, anomalies) = hammer(&throttle, 1);
        assert_eq!(tally.drops, 0);
        assert_eq!(snapshot.requests, tally.records);
        assert_eq!(snapshot.accepts, tally.accepted);
        assert!(anomalies.is_empty(), "{anomalies:?}");
    }
}
