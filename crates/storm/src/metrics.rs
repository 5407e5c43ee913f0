//! What the callers saw, and the figures of the report computed from it and from the provider's
//! counts.

use std::time::Duration;

use serde::Serialize;

use crate::backend::BackendStats;
use crate::scenario::Scenario;

/// Goodput share of the offered load that counts as recovered.
pub const RECOVERED_GOODPUT: f64 = 0.95;

/// Share of a second's attempts that must find every slot busy for the second to count as
/// overloaded (a lone queued request in a Poisson burst does not).
pub const OVERLOADED_SHARE: f64 = 0.01;

/// The part of a fault window not counted in `fault_load`: time a client is given to notice the
/// fault (the field's breaker cut traffic in the 3rd second).
pub const FAULT_GRACE: Duration = Duration::from_secs(3);

/// Per-second counts of logical requests, as the callers saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorder {
    /// Requests that arrived, per second of arrival.
    pub offered: Vec<u64>,
    /// Requests that eventually succeeded, per second of *arrival*.
    pub succeeded_by_arrival: Vec<u64>,
    /// Requests that succeeded, per second of *completion* (goodput as a dashboard shows it).
    pub succeeded_by_completion: Vec<u64>,
    /// Latency of every answered request (success or failure), in milliseconds.
    pub latencies_ms: Vec<u32>,
}

fn bump(series: &mut Vec<u64>, second: usize) {
    if series.len() <= second {
        series.resize(second + 1, 0);
    }
    series[second] += 1;
}

impl Recorder {
    /// A request arrived at `at` (from the start of the run).
    pub fn arrive(&mut self, at: Duration) {
        bump(&mut self.offered, at.as_secs() as usize);
    }

    /// A request that arrived at `arrival` got its final answer at `completion`.
    pub fn complete(&mut self, arrival: Duration, completion: Duration, success: bool) {
        let latency = completion.saturating_sub(arrival).as_millis();
        self.latencies_ms
            .push(u32::try_from(latency).unwrap_or(u32::MAX));
        if success {
            bump(&mut self.succeeded_by_arrival, arrival.as_secs() as usize);
            bump(
                &mut self.succeeded_by_completion,
                completion.as_secs() as usize,
            );
        }
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted values; `None` when there are none.
pub fn percentile(sorted: &[u32], p: f64) -> Option<u32> {
    if sorted.is_empty() || !p.is_finite() {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1).min(sorted.len() - 1))
        .copied()
}

/// Seconds from `fault_end` until goodput is back at or above `threshold` of the offered load
/// and stays there until the end of the run, measured per one-second bucket of arrivals.
///
/// `succeeded[b] / offered[b]` is the share of the requests that arrived in second `b` that
/// succeeded. Returns `Some(0.0)` when goodput never dropped after the fault ended, `None` when it
/// never comes back (or no full second follows the fault).
pub fn recovery_time(
    offered: &[u64],
    succeeded: &[u64],
    fault_end: Duration,
    threshold: f64,
) -> Option<f64> {
    let first = fault_end.as_secs_f64().ceil() as usize;
    if first >= offered.len() {
        return None;
    }
    let healthy = |b: usize| {
        let total = offered[b];
        total == 0 || succeeded.get(b).copied().unwrap_or(0) as f64 >= threshold * total as f64
    };
    let mut recovered_at = None;
    for bucket in first..offered.len() {
        match (healthy(bucket), recovered_at) {
            (true, None) => recovered_at = Some(bucket),
            (false, Some(_)) => recovered_at = None,
            _ => {}
        }
    }
    recovered_at.map(|b| (b as f64 - fault_end.as_secs_f64()).max(0.0))
}

/// Per-second series of one pipeline's run, for the chart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// Logical requests offered per second.
    pub offered: Vec<u64>,
    /// Attempts that reached the provider per second.
    pub attempts: Vec<u64>,
    /// Successful answers per second (by completion).
    pub successes: Vec<u64>,
}

/// The report of one pipeline on one scenario (one JSON object).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Pipeline name.
    pub name: &'static str,
    /// Logical requests offered.
    pub offered: u64,
    /// Attempts that reached the provider.
    pub backend_attempts: u64,
    /// `backend_attempts / offered`.
    pub amplification: f64,
    /// Highest `attempts / offered` of any one second.
    pub peak_amplification: f64,
    /// Most requests in the provider at once (running or queued) / its slots.
    pub peak_load: f64,
    /// Share of logical requests that succeeded.
    pub success_rate: f64,
    /// Median latency of all answered requests, in milliseconds.
    pub p50_ms: u32,
    /// 99th percentile latency of all answered requests, in milliseconds.
    pub p99_ms: u32,
    /// Seconds of the run in which more than [`OVERLOADED_SHARE`] of the attempts found every
    /// slot busy.
    pub overloaded_s: u64,
    /// Seconds from the end of the fault until goodput is back above 95% (see [`recovery_time`]);
    /// `null` if it never comes back during the run.
    pub recovery_s: Option<f64>,
    /// Attempts / offered during the fault window after its first [`FAULT_GRACE`].
    pub fault_load: f64,
    /// Attempts that were retries.
    pub retries: u64,
    /// Retries that arrived before the `Retry-After` they were given.
    pub early_retries: u64,
    /// Successful logical requests.
    pub successes: u64,
}

/// Compute the summary and the chart series of one run.
pub fn summarize(
    name: &'static str,
    scenario: &Scenario,
    mut recorder: Recorder,
    backend: &BackendStats,
) -> (Summary, Series) {
    let offered: u64 = recorder.offered.iter().sum();
    let successes: u64 = recorder.succeeded_by_arrival.iter().sum();
    recorder.latencies_ms.sort_unstable();
    let ratio = |num: u64, den: u64| {
        if den == 0 {
            0.0
        } else {
            num as f64 / den as f64
        }
    };
    let overloaded_s = backend
        .buckets
        .iter()
        .take(scenario.duration.as_secs_f64().ceil() as usize)
        .filter(|b| b.attempts > 0 && b.delayed as f64 > OVERLOADED_SHARE * b.attempts as f64)
        .count() as u64;
    let from = (scenario.fault.start + FAULT_GRACE).as_secs() as usize;
    let to = scenario.fault.end.as_secs() as usize;
    let window = |series: &[u64]| series.iter().take(to).skip(from).sum::<u64>();
    let attempts_series: Vec<u64> = backend.buckets.iter().map(|b| b.attempts).collect();
    let summary = Summary {
        name,
        offered,
        backend_attempts: backend.attempts,
        amplification: ratio(backend.attempts, offered),
        peak_amplification: recorder
            .offered
            .iter()
            .zip(&attempts_series)
            .map(|(offered, attempts)| ratio(*attempts, *offered))
            .fold(0.0, f64::max),
        peak_load: ratio(backend.peak_in_flight, u64::from(scenario.capacity)),
        success_rate: ratio(successes, offered),
        p50_ms: percentile(&recorder.latencies_ms, 50.0).unwrap_or(0),
        p99_ms: percentile(&recorder.latencies_ms, 99.0).unwrap_or(0),
        overloaded_s,
        recovery_s: recovery_time(
            &recorder.offered,
            &recorder.succeeded_by_arrival,
            scenario.fault.end,
            RECOVERED_GOODPUT,
        ),
        fault_load: ratio(window(&attempts_series), window(&recorder.offered)),
        retries: backend.retries,
        early_retries: backend.early_retries,
        successes,
    };
    // Attempts and successes run on after the last arrival; both end at the same second.
    let (mut attempts, mut successes) = (attempts_series, recorder.succeeded_by_completion);
    let seconds = attempts.len().max(successes.len());
    attempts.resize(seconds, 0);
    successes.resize(seconds, 0);
    let series = Series {
        offered: recorder.offered,
        attempts,
        successes,
    };
    (summary, series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), Some(50));
        assert_eq!(percentile(&values, 99.0), Some(99));
        assert_eq!(percentile(&values, 100.0), Some(100));
        assert_eq!(percentile(&values, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&values, f64::NAN), None);
    }

    #[test]
    fn recovery_is_the_first_second_from_which_goodput_stays_above_95_percent() {
        let offered = [100; 10];
        // Fault ends at 4 s; goodput 10, 50, 96 (blip), 90, then >= 95 from second 8.
        let succeeded = [100, 100, 10, 10, 10, 50, 96, 90, 95, 100];
        let end = Duration::from_secs(4);
        assert_eq!(recovery_time(&offered, &succeeded, end, 0.95), Some(4.0));
        let never = [100, 100, 10, 10, 10, 50, 96, 90, 95, 94];
        assert_eq!(recovery_time(&offered, &never, end, 0.95), None);
        let untouched = [100; 10];
        assert_eq!(recovery_time(&offered, &untouched, end, 0.95), Some(0.0));
        // A fault ending mid-second is measured from its end.
        assert_eq!(
            recovery_time(&offered, &succeeded, Duration::from_millis(3_500), 0.95),
            Some(4.5)
        );
        assert_eq!(
            recovery_time(&offered, &succeeded, Duration::from_secs(10), 0.95),
            None
        );
    }

    #[test]
    fn recorder_attributes_success_to_arrival_and_completion_seconds() {
        let mut r = Recorder::default();
        r.arrive(Duration::from_millis(900));
        r.complete(
            Duration::from_millis(900),
            Duration::from_millis(2_100),
            true,
        );
        r.arrive(Duration::from_millis(950));
        r.complete(
            Duration::from_millis(950),
            Duration::from_millis(1_000),
            false,
        );
        assert_eq!(r.offered, vec![2]);
        assert_eq!(r.succeeded_by_arrival, vec![1]);
        assert_eq!(r.succeeded_by_completion, vec![0, 0, 1]);
        assert_eq!(r.latencies_ms, vec![1_200, 50]);
    }
}
