//! The two ways of loading a subject. A closed loop keeps `connections` requests in flight and
//! counts what completes (the subject's saturation); an open loop offers a fixed rate whatever the
//! subject does and records each request's latency (what a caller waits at that load).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Connection, Target, Timing};

/// How long an open loop waits, after its last request was due, for the ones still in flight;
/// those still missing then count as failures.
const DRAIN: Duration = Duration::from_secs(10);

/// Requests per second completed by `connections` connections each sending one request after the
/// other for `duration`, and the requests that failed.
pub async fn closed(
    target: &Target,
    body: Bytes,
    connections: usize,
    duration: Duration,
) -> (f64, u64) {
    let end = Instant::now() + duration;
    let body = Arc::new(body);
    let mut tasks = JoinSet::new();
    for _ in 0..connections {
        let (target, body) = (target.clone(), Arc::clone(&body));
        tasks.spawn(async move {
            let mut connection = Connection::new(target);
            let (mut done, mut failed) = (0_u64, 0_u64);
            while Instant::now() < end {
                match connection.send(&body, Instant::now()).await {
                    Some(_) if Instant::now() <= end => done += 1,
                    Some(_) => {}
                    None => failed += 1,
                }
            }
            (done, failed)
        });
    }
    let (mut done, mut failed) = (0, 0);
    while let Some(Ok((d, f))) = tasks.join_next().await {
        done += d;
        failed += f;
    }
    (done as f64 / duration.as_secs_f64(), failed)
}

/// What an open loop saw.
#[derive(Debug, Default)]
pub struct Latencies {
    /// The timings of the requests answered, in no order.
    pub timings: Vec<Timing>,
    /// Requests that failed or were still unanswered after the drain.
    pub failed: u64,
}

/// Offers `rate` requests per second for `duration` over `connections` connections, each with
/// its share of the schedule (request `i` is due at `i / rate`, on connection `i % connections`).
///
/// A request's time counts from when it was due when its connection was still busy with an
/// earlier one (the subject made it late: that wait is the caller's), and from when it was sent
/// otherwise (tokio's timer wakes up to a millisecond late, and that lateness is the load
/// generator's, not the subject's).
pub async fn open(
    target: &Target,
    body: Bytes,
    rate: f64,
    connections: usize,
    duration: Duration,
) -> Latencies {
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let connections = (connections as u64).clamp(1, total.max(1));
    let begin = Instant::now();
    let body = Arc::new(body);
    let mut tasks = JoinSet::new();
    for lane in 0..connections {
        let (target, body) = (target.clone(), Arc::clone(&body));
        tasks.spawn(async move {
            let mut connection = Connection::new(target);
            let mut timings = Vec::new();
            for i in (lane..total).step_by(connections as usize) {
                let due = begin + Duration::from_secs_f64(i as f64 / rate);
                let start = if Instant::now() < due {
                    tokio::time::sleep_until(due).await;
                    Instant::now()
                } else {
                    due
                };
                timings.extend(connection.send(&body, start).await);
            }
            timings
        });
    }
    let deadline = begin + duration + DRAIN;
    let mut seen = Latencies::default();
    while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        if let Ok(lane) = joined {
            seen.timings.extend(lane);
        }
    }
    // Whatever was not answered failed: refused, broken, or still in flight after the drain.
    seen.failed = total.saturating_sub(seen.timings.len() as u64);
    seen
}

/// The `p`-quantile (0 to 1) of `values` by nearest rank, `None` when there are none.
pub fn quantile(values: &mut [Duration], p: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (p * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_ranks() {
        let mut values: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&mut values, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&mut values, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&mut values, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&mut values, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(quantile(&mut [], 0.5), None);
    }
}
