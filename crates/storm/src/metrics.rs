//! What the callers saw, and the figures of the report computed from it and from the provider's
//! counts.

use std::time::Duration;

use serde::Serialize;

use crate::backend::{BackendStats, Bucket, FINE_BUCKET};
use crate::scenario::{Fault, FaultKind, Scenario};

/// Goodput share of the offered load that counts as recovered.
pub(crate) const RECOVERED_GOODPUT: f64 = 0.95;

/// Share of a second's attempts that must find every slot busy for the second to count as
/// overloaded (a lone queued request in a Poisson burst does not).
pub(crate) const OVERLOADED_SHARE: f64 = 0.01;

/// The part of a fault window not counted in `fault_load`: time a client is given to notice the
/// fault (the field's breaker cut traffic in the 3rd second).
pub(crate) const FAULT_GRACE: Duration = Duration::from_secs(3);

/// Share of the offered load under which the attempts reaching a dead provider count as cut
/// (see [`cut_time`]): 5%.
pub(crate) const CUT_SHARE: f64 = 0.05;

/// Time after the fault's end that `success_outside` leaves out, besides the fault window: 2 s,
/// the field's target for traffic to be back after the provider's return.
pub(crate) const RECOVERY_ALLOWANCE: Duration = Duration::from_secs(2);

/// Time before the fault's start that `success_outside` leaves out: 4 s, the healthy provider's
/// p99.9 service time (3.75 s) rounded up, and today's attempt timeout
/// ([`ATTEMPT_TIMEOUT`](crate::scenario::ATTEMPT_TIMEOUT)). A request that arrives later may
/// still wait for its answer when the fault begins: its answer is among what the fault loses,
/// whatever the client does (a black hole answers nothing in flight).
pub(crate) const LEAD_IN: Duration = Duration::from_secs(4);

/// Share of the offered load that must reach the primary again, after its fault, for the traffic
/// to count as back on it (see [`back_time`]): 95%.
pub(crate) const BACK_SHARE: f64 = 0.95;

/// How a logical request ended, as its caller saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A success answered by the provider.
    Success,
    /// An answer of the client's own: the circuit breaker's fallback (a 200, but not the
    /// provider's).
    Fallback,
    /// Anything else: an error status, a local refusal, a timeout.
    Failure,
}

/// What the caller of one streamed request saw (the `streams` scenario), and the sum of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamTally {
    /// Streams that failed before any content and reached the caller, who gave up on them (no
    /// retry, no restart followed).
    pub given_up: u64,
    /// Of those, the ones stormguard handed back because its retry budget refused the retry.
    pub budget_refused: u64,
    /// Of those, the ones whose request had no attempt left: stormguard's `max_attempts` (3)
    /// were sent, or naive's restarts ran out.
    pub out_of_attempts: u64,
    /// Streams that failed after content had reached the caller (cut, or interrupted).
    pub interrupted: u64,
    /// Of those, the ones that ended with stormguard's typed `StreamInterrupted` error.
    pub stream_interrupted: u64,
    /// Content tokens the caller was shown a second time.
    pub duplicated_tokens: u64,
    /// Content tokens the caller was never shown though a later one was (see
    /// [`Transcript::lost_tokens`](crate::event_stream::Transcript::lost_tokens)).
    pub lost_tokens: u64,
}

impl StreamTally {
    /// Add `other`'s counts to these.
    pub fn add(&mut self, other: &StreamTally) {
        self.given_up += other.given_up;
        self.budget_refused += other.budget_refused;
        self.out_of_attempts += other.out_of_attempts;
        self.interrupted += other.interrupted;
        self.stream_interrupted += other.stream_interrupted;
        self.duplicated_tokens += other.duplicated_tokens;
        self.lost_tokens += other.lost_tokens;
    }
}

/// Per-second (and per-[`FINE_BUCKET`]) counts of logical requests, as the callers saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recorder {
    /// Requests that arrived, per second of arrival.
    pub offered: Vec<u64>,
    /// Requests that arrived, per [`FINE_BUCKET`] (100 ms) of arrival.
    pub offered_fine: Vec<u64>,
    /// Requests that eventually succeeded, per second of *arrival*.
    pub succeeded_by_arrival: Vec<u64>,
    /// Requests that eventually succeeded, per [`FINE_BUCKET`] of *arrival*.
    pub succeeded_by_arrival_fine: Vec<u64>,
    /// Requests that succeeded, per second of *completion* (goodput as a dashboard shows it).
    pub succeeded_by_completion: Vec<u64>,
    /// Requests the fallback answered, per second of completion.
    pub fallbacks_by_completion: Vec<u64>,
    /// Latency of every answered request (success, fallback or failure), in milliseconds.
    pub latencies_ms: Vec<u32>,
    /// Requests that arrive before this are the healthy ones (see [`Recorder::healthy_until`]).
    pub healthy_until: Duration,
    /// Latency of every answered request that arrived before `healthy_until`, in milliseconds.
    pub healthy_latencies_ms: Vec<u32>,
    /// Latency of the fallback's answers, in milliseconds.
    pub fallback_latencies_ms: Vec<u32>,
    /// What the callers of streamed requests saw, summed.
    pub streams: StreamTally,
    /// Content tokens shown twice to callers, per second of completion of their request.
    pub duplicated_by_completion: Vec<u64>,
    /// Time to first token of every streamed request that succeeded, in milliseconds: from its
    /// start to the first content event its caller was shown, across its attempts.
    pub first_token_ms: Vec<u32>,
}

fn bump(series: &mut Vec<u64>, index: usize) {
    if series.len() <= index {
        series.resize(index + 1, 0);
    }
    series[index] += 1;
}

/// The [`FINE_BUCKET`] that `at` falls in.
fn fine_index(at: Duration) -> usize {
    usize::try_from(at.as_micros() / FINE_BUCKET.as_micros()).unwrap_or(usize::MAX)
}

impl Recorder {
    /// A recorder that also keeps apart the latencies of the requests that arrive before `at`
    /// (from the start of the run): the healthy latencies, where `at` is a fault's start.
    pub(crate) fn healthy_until(at: Duration) -> Recorder {
        Recorder {
            healthy_until: at,
            ..Recorder::default()
        }
    }

    /// A request arrived at `at` (from the start of the run).
    pub fn arrive(&mut self, at: Duration) {
        bump(&mut self.offered, at.as_secs() as usize);
        bump(&mut self.offered_fine, fine_index(at));
    }

    /// A request that arrived at `arrival` got its final answer at `completion`.
    pub(crate) fn complete(&mut self, arrival: Duration, completion: Duration, answer: Answer) {
        let latency = completion.saturating_sub(arrival).as_millis();
        let latency = u32::try_from(latency).unwrap_or(u32::MAX);
        self.latencies_ms.push(latency);
        if arrival < self.healthy_until {
            self.healthy_latencies_ms.push(latency);
        }
        match answer {
            Answer::Success => {
                bump(&mut self.succeeded_by_arrival, arrival.as_secs() as usize);
                bump(&mut self.succeeded_by_arrival_fine, fine_index(arrival));
                bump(
                    &mut self.succeeded_by_completion,
                    completion.as_secs() as usize,
                );
            }
            Answer::Fallback => {
                self.fallback_latencies_ms.push(latency);
                bump(
                    &mut self.fallbacks_by_completion,
                    completion.as_secs() as usize,
                );
            }
            Answer::Failure => {}
        }
    }

    /// The caller of a streamed request that arrived at `arrival` and succeeded was shown its
    /// first content event at `at` (both from the start of the run).
    pub fn first_token(&mut self, arrival: Duration, at: Duration) {
        let ms = at.saturating_sub(arrival).as_millis();
        self.first_token_ms
            .push(u32::try_from(ms).unwrap_or(u32::MAX));
    }

    /// The caller of a streamed request that completed at `completion` saw `tally`.
    pub fn stream(&mut self, completion: Duration, tally: &StreamTally) {
        self.streams.add(tally);
        let second = completion.as_secs() as usize;
        if self.duplicated_by_completion.len() <= second {
            self.duplicated_by_completion.resize(second + 1, 0);
        }
        self.duplicated_by_completion[second] += tally.duplicated_tokens;
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted values; `None` when there are none.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
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
pub(crate) fn recovery_time(
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

/// Seconds from the start of a dead provider's fault (see [`crate::scenario::FaultKind::is_dead`])
/// until the attempts reaching it fall below `share` of the offered load and stay there until
/// the fault ends, measured per [`FINE_BUCKET`] (100 ms) of arrival.
///
/// `attempts[b]` and `offered[b]` are the attempts and requests that arrived in fine bucket `b`.
/// Only buckets that lie wholly in the fault window count; the answer is the start of the first
/// bucket of the last run of low ones, from the fault's start. `None` when the attempts are never
/// cut, or the fault leaves the provider serving (there is nothing to cut).
pub(crate) fn cut_time(
    offered: &[u64],
    attempts: &[u64],
    fault: &Fault,
    share: f64,
) -> Option<f64> {
    if !fault.kind.is_dead() {
        return None;
    }
    let bucket = FINE_BUCKET.as_secs_f64();
    let first = (fault.start.as_secs_f64() / bucket).ceil() as usize;
    let end = (fault.end.as_secs_f64() / bucket).floor() as usize;
    let low = |b: usize| {
        let sent = attempts.get(b).copied().unwrap_or(0) as f64;
        sent == 0.0 || sent < share * offered.get(b).copied().unwrap_or(0) as f64
    };
    let mut cut_at = None;
    for b in first..end {
        match (low(b), cut_at) {
            (true, None) => cut_at = Some(b),
            (false, Some(_)) => cut_at = None,
            _ => {}
        }
    }
    cut_at.map(|b| (b as f64 * bucket - fault.start.as_secs_f64()).max(0.0))
}

/// `attempts / offered` over the [`FINE_BUCKET`]s (100 ms) that lie wholly in the fault window:
/// the share of the offered load that reached the faulty provider during its fault. `None` when
/// no request arrived in the window.
pub(crate) fn share_in_fault(offered: &[u64], attempts: &[u64], fault: &Fault) -> Option<f64> {
    let bucket = FINE_BUCKET.as_secs_f64();
    let first = (fault.start.as_secs_f64() / bucket).ceil() as usize;
    let end = (fault.end.as_secs_f64() / bucket).floor() as usize;
    let sum = |series: &[u64]| -> u64 { (first..end).filter_map(|b| series.get(b)).sum() };
    let offered = sum(offered);
    (offered > 0).then(|| sum(attempts) as f64 / offered as f64)
}

/// Seconds from the end of `fault` until the attempts reaching its provider are back at or above
/// `share` of the offered load and stay there until `until` (the end of the arrivals), measured
/// per [`FINE_BUCKET`] (100 ms) of arrival: how long after its recovery a provider that clients
/// left gets its traffic back.
///
/// `attempts[b]` and `offered[b]` are the attempts and requests that arrived in fine bucket `b`;
/// a bucket without requests counts as back. The answer is the start of the first bucket of the
/// last run of such buckets, from the fault's end: `Some(0.0)` when the traffic never left (or
/// was back by the end of the fault), `None` when it is not back by `until`.
pub(crate) fn back_time(
    offered: &[u64],
    attempts: &[u64],
    fault_end: Duration,
    until: Duration,
    share: f64,
) -> Option<f64> {
    let bucket = FINE_BUCKET.as_secs_f64();
    let first = (fault_end.as_secs_f64() / bucket).ceil() as usize;
    let end = (until.as_secs_f64() / bucket).floor() as usize;
    if first >= end {
        return None;
    }
    let back = |b: usize| {
        let sent = attempts.get(b).copied().unwrap_or(0) as f64;
        sent >= share * offered.get(b).copied().unwrap_or(0) as f64
    };
    let mut back_at = None;
    for b in first..end {
        match (back(b), back_at) {
            (true, None) => back_at = Some(b),
            (false, Some(_)) => back_at = None,
            _ => {}
        }
    }
    back_at.map(|b| (b as f64 * bucket - fault_end.as_secs_f64()).max(0.0))
}

/// Seconds of the run (up to `duration`) in which more than [`OVERLOADED_SHARE`] of the attempts
/// found every slot of the provider busy.
fn overloaded_seconds(stats: &BackendStats, duration: Duration) -> u64 {
    stats
        .buckets
        .iter()
        .take(duration.as_secs_f64().ceil() as usize)
        .filter(|b| b.attempts > 0 && b.delayed as f64 > OVERLOADED_SHARE * b.attempts as f64)
        .count() as u64
}

/// Whether [`FINE_BUCKET`] number `bucket` lies wholly outside `fault`, the [`LEAD_IN`] before it
/// and the [`RECOVERY_ALLOWANCE`] after it: before the fault's start minus the lead-in, or from
/// its end plus the allowance on.
pub(crate) fn is_outside(bucket: usize, fault: &Fault) -> bool {
    let width = FINE_BUCKET.as_secs_f64();
    let start = fault.start.saturating_sub(LEAD_IN);
    let before = (start.as_secs_f64() / width).floor() as usize;
    let after = ((fault.end + RECOVERY_ALLOWANCE).as_secs_f64() / width).ceil() as usize;
    bucket < before || bucket >= after
}

/// Share of the requests that arrived outside the fault window, the [`LEAD_IN`] before it and the
/// [`RECOVERY_ALLOWANCE`] after it (see [`is_outside`]) that succeeded, per [`FINE_BUCKET`] of
/// arrival; `None` when there are none (a fault that lasts the whole run).
pub fn success_outside(offered: &[u64], succeeded: &[u64], fault: &Fault) -> Option<f64> {
    let sum = |series: &[u64]| -> u64 {
        (0..series.len())
            .filter(|b| is_outside(*b, fault))
            .map(|b| series[b])
            .sum()
    };
    let offered = sum(offered);
    (offered > 0).then(|| sum(succeeded) as f64 / offered as f64)
}

/// The series of one pipeline's run: per second for the chart, and per [`FINE_BUCKET`]
/// (100 ms) for a closer look at how fast traffic is cut.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// Logical requests offered per second.
    pub offered: Vec<u64>,
    /// Attempts that reached the provider per second.
    pub attempts: Vec<u64>,
    /// Attempts the provider answered with 429 per second (by arrival).
    pub rate_limited: Vec<u64>,
    /// Most attempts open at once (client side) in each second.
    pub in_flight: Vec<u64>,
    /// Successful answers per second (by completion).
    pub successes: Vec<u64>,
    /// Fallback answers per second (by completion).
    pub fallbacks: Vec<u64>,
    /// Attempts that reached the secondary provider per second (empty with one provider).
    pub secondary_attempts: Vec<u64>,
    /// Content tokens shown twice to callers per second (by completion of their request; empty
    /// where the provider does not stream).
    pub duplicated_tokens: Vec<u64>,
    /// Hedges reaching the provider per second (attempts sent while another of the same request
    /// was open; empty where the streams start without a slow tail).
    pub hedges: Vec<u64>,
    /// Each deployment's series, in the scenario's order (empty without deployments; the
    /// series above then count them together).
    pub deployments: Vec<DeploymentSeries>,
    /// Logical requests offered per 100 ms.
    pub offered_fine: Vec<u64>,
    /// Attempts that reached the provider per 100 ms.
    pub attempts_fine: Vec<u64>,
    /// Most attempts open at once (client side) in each 100 ms.
    pub in_flight_fine: Vec<u64>,
}

/// The per-second series of one deployment of a balance scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeploymentSeries {
    /// Attempts that reached it per second.
    pub attempts: Vec<u64>,
    /// Attempts it answered with 429 per second (by arrival).
    pub rate_limited: Vec<u64>,
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
    /// Most attempts open at once, client side: sent and not yet answered, dropped or cut (the
    /// connections the clients hold).
    pub peak_in_flight: u64,
    /// Share of logical requests that succeeded (answered by the provider: a fallback answer is
    /// no success).
    pub success_rate: f64,
    /// Share of the requests that arrived outside the fault, its [`LEAD_IN`] and its
    /// [`RECOVERY_ALLOWANCE`] that succeeded (see [`success_outside`]); `null` when the fault
    /// lasts the whole run.
    pub success_outside: Option<f64>,
    /// Requests answered by the circuit breaker's fallback.
    pub fallbacks: u64,
    /// 99th percentile latency of the fallback's answers, in milliseconds; `null` without any.
    pub fallback_p99_ms: Option<u32>,
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
    /// Seconds from the start of a dead provider's fault until the attempts reaching it stay below
    /// [`CUT_SHARE`] of the offered load (see [`cut_time`]); `null` if they never do, or if the
    /// fault is no dead provider.
    pub cut_s: Option<f64>,
    /// Attempts / offered during the fault window after its first [`FAULT_GRACE`].
    pub fault_load: f64,
    /// Attempts the provider answered with 429 (Too Many Requests).
    #[serde(rename = "429s")]
    pub too_many_requests: u64,
    /// Attempts that were retries.
    pub retries: u64,
    /// Retries that arrived before the `Retry-After` they were given.
    pub early_retries: u64,
    /// Successful logical requests.
    pub successes: u64,
    /// The figures of a scenario with two providers (every other figure is the primary's);
    /// absent with one provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverFigures>,
    /// The figures of a scenario whose provider streams; absent where it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams: Option<StreamFigures>,
    /// The figures of a scenario whose provider goes silent; absent where it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub silent: Option<SilentFigures>,
    /// The figures of a scenario whose streams start with a slow tail (time to first token and
    /// hedges); absent where they do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<TailFigures>,
    /// The figures of a scenario with deployments (how the load was shared among them, against
    /// the best split their quotas allow); absent without deployments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceFigures>,
    /// The figures of a scenario whose fault kills one of its deployments (what reached it after
    /// a replica saw it die); absent elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetFigures>,
    /// The figures of a scenario whose provider's capacity steps (attempts in flight and
    /// goodput against its slots, and how the row's concurrency limit moved); absent elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityFigures>,
}

impl Summary {
    /// The p99 latency over the same run's healthy p99 (where the provider goes silent, see
    /// [`SilentFigures::healthy_p99_ms`]); `None` without one.
    pub fn p99_over_healthy(&self) -> Option<f64> {
        let healthy = self.silent?.healthy_p99_ms.filter(|ms| *ms > 0)?;
        Some(f64::from(self.p99_ms) / f64::from(healthy))
    }
}

/// What a scenario whose provider goes silent
/// ([`FaultKind::Silent`](crate::scenario::FaultKind::Silent)) adds to a [`Summary`]:
/// the latency its target is set against, and what the provider did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SilentFigures {
    /// 99th percentile latency of the requests that arrived before the fault (the same run's
    /// healthy latency), in milliseconds; `null` without any.
    pub healthy_p99_ms: Option<u32>,
    /// Attempts the primary kept silent (the provider's count).
    pub silent_attempts: u64,
    /// Streams of the primary slow to their first token (the provider's count).
    pub slow_first_tokens: u64,
}

/// What a scenario whose streams start with a slow tail
/// ([`StreamStart::slow`](crate::scenario::StreamStart::slow)) adds to a [`Summary`]: the time to
/// first token the callers saw, the hedges that reached the provider, and the load during the
/// fault.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TailFigures {
    /// Median time to first token of the requests that succeeded (from the request's start to the
    /// first content event its caller was shown, across its attempts), in milliseconds; `null`
    /// without any.
    pub first_token_p50_ms: Option<u32>,
    /// Its 99th percentile.
    pub first_token_p99_ms: Option<u32>,
    /// Its 99.9th percentile.
    pub first_token_p999_ms: Option<u32>,
    /// Attempts sent while another attempt of the same request was still open (the provider's
    /// count, see [`BackendStats::hedges`]).
    pub hedges: u64,
    /// `hedges / offered`.
    pub hedges_per_request: f64,
    /// Attempts / offered during the whole fault window (per 100 ms wholly in it, see
    /// [`share_in_fault`]); `null` when no request arrived in it.
    pub fault_amplification: Option<f64>,
    /// Attempts that reached the provider during the fault window (the same 100 ms buckets).
    pub fault_attempts: u64,
    /// Hedges that reached the provider during the fault window (per second wholly in it).
    pub fault_hedges: u64,
    /// Attempts drawn in the slow tail of the streams' start (the provider's count).
    pub slow_first_tokens: u64,
}

/// What a scenario with deployments ([`Scenario::deployments`]) adds to a [`Summary`]: what
/// each deployment did, and the median latency against the best split's
/// ([`Scenario::best_split`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceFigures {
    /// Each deployment's figures, in the scenario's order.
    pub deployments: Vec<DeploymentFigures>,
    /// The median latency of the best split the quotas allow (from the model:
    /// [`Scenario::split_latency`]), in milliseconds.
    pub best_split_p50_ms: u32,
    /// The row's median latency over the best split's.
    pub p50_over_best: f64,
}

/// What one deployment did in a run: the attempts it got, its successes and their share, and its
/// 429s.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeploymentFigures {
    /// Its name.
    pub name: &'static str,
    /// Attempts that reached it.
    pub attempts: u64,
    /// Attempts it answered 200.
    pub successes: u64,
    /// Its share of the successes of all the deployments: of the load it carried.
    pub share: f64,
    /// Its share in the best split ([`Scenario::best_split`]).
    pub best_share: f64,
    /// Attempts it answered 429.
    #[serde(rename = "429s")]
    pub too_many_requests: u64,
}

/// What a scenario whose provider's capacity steps
/// ([`FaultKind::CapacitySteps`](crate::scenario::FaultKind::CapacitySteps)) adds to a
/// [`Summary`], per phase (healthy; slower, the slots unchanged; the slots cut), each measured
/// over its stretch from [`SETTLE`] after its start to its end.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CapacityFigures {
    /// The attempts open at once (client side: sent and not answered, a stream until its end,
    /// the provider's queue included), averaged over time, over the provider's slots.
    pub in_flight_per_slot: [f64; 3],
    /// Successes a second over what the slots allow (slots over the mean service time).
    pub goodput_per_slot: [f64; 3],
    /// After each step (the latency's, the slots'), the seconds until the attempts open stayed
    /// within 0.8x to 1.25x of the slots to the end of the phase; `None`: they never did.
    pub settled_s: [Option<f64>; 2],
    /// The lowest the row's concurrency limit went after the first step; `None` without one.
    pub lowest_limit: Option<u32>,
}

/// How long after a phase starts its figures begin to count ([`CapacityFigures`]): 10 s, the
/// time the `capacity` scenario gives a limit to re-converge.
pub(crate) const SETTLE: Duration = Duration::from_secs(10);

/// The band of attempts open, as a share of the provider's slots, that counts as converged.
const SETTLED_BAND: (f64, f64) = (0.8, 1.25);

/// The figures of a run of a scenario whose provider's capacity steps, from its series and its
/// concurrency limit's values every 100 ms (`limits`, empty without one); `None` in any other
/// scenario.
pub(crate) fn capacity_figures(
    scenario: &Scenario,
    series: &Series,
    limits: &[u32],
) -> Option<CapacityFigures> {
    let FaultKind::CapacitySteps { slots_from, .. } = scenario.fault.kind else {
        return None;
    };
    let phases = [
        (Duration::ZERO, scenario.fault.start),
        (scenario.fault.start, slots_from),
        (slots_from, scenario.duration),
    ];
    let fine = FINE_BUCKET.as_secs_f64();
    let bucket = |at: Duration| (at.as_secs_f64() / fine).round() as usize;
    let second = |at: Duration| at.as_secs() as usize;
    let mut in_flight_per_slot = [0.0; 3];
    let mut goodput_per_slot = [0.0; 3];
    for (phase, (start, end)) in phases.into_iter().enumerate() {
        let from = (start + SETTLE).min(end);
        let slots = f64::from(scenario.slots_at(from).max(1));
        let open: Vec<u64> = (bucket(from)..bucket(end))
            .filter_map(|at| series.in_flight_fine.get(at).copied())
            .collect();
        let mean = open.iter().sum::<u64>() as f64 / open.len().max(1) as f64;
        in_flight_per_slot[phase] = mean / slots;
        let done: u64 = (second(from)..second(end))
            .filter_map(|at| series.successes.get(at).copied())
            .sum();
        let allowed = scenario.throughput_at(from) * (end - from).as_secs_f64();
        goodput_per_slot[phase] = if allowed > 0.0 {
            done as f64 / allowed
        } else {
            0.0
        };
    }
    let settled = |start: Duration, end: Duration| -> Option<f64> {
        let slots = f64::from(scenario.slots_at(start).max(1));
        let (low, high) = SETTLED_BAND;
        let mut since = None;
        for at in bucket(start)..bucket(end) {
            let open = *series.in_flight_fine.get(at)? as f64 / slots;
            if (low..=high).contains(&open) {
                since.get_or_insert(at);
            } else {
                since = None;
            }
        }
        since.map(|at| at as f64 * fine - start.as_secs_f64())
    };
    Some(CapacityFigures {
        in_flight_per_slot,
        goodput_per_slot,
        settled_s: [
            settled(phases[1].0, phases[1].1),
            settled(phases[2].0, phases[2].1),
        ],
        lowest_limit: limits
            .iter()
            .skip(bucket(scenario.fault.start))
            .min()
            .copied(),
    })
}

/// What a scenario whose fault kills one of its deployments ([`Scenario::dying`]) adds to a
/// [`Summary`]: when each replica saw it die, and the attempts that reached it after the first
/// one had.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetFigures {
    /// The deployment that dies.
    pub dying: &'static str,
    /// When each replica saw it die, in seconds from the start of the run: when its breaker of
    /// that deployment opened for the first time in the fault (seen to the millisecond); `null`
    /// for a replica whose breaker never opened. Empty for a row without breakers.
    pub saw_it_die_s: Vec<Option<f64>>,
    /// Attempts that reached it from its death to the end of the run.
    pub fault_attempts: u64,
    /// Attempts that reached it from the millisecond the first replica saw it die to the end of
    /// the run; `null` when none did.
    pub after_first_saw: Option<u64>,
    /// Of those, the ones that arrived before the last replica saw it die (the others finding
    /// out for themselves); `null` unless every replica did.
    pub before_all_saw: Option<u64>,
}

/// What a scenario whose provider streams adds to a [`Summary`]: how its streams failed, what
/// was done about it, and what the callers saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StreamFigures {
    /// Streams that failed with an error event before any content (the provider's count).
    pub failed_before_content: u64,
    /// Of those, the ones another attempt of the same request followed: retried (or restarted).
    pub retried: u64,
    /// Of those, the ones whose failure reached the caller, who gave up (see
    /// [`StreamTally::given_up`]).
    pub given_up: u64,
    /// Of those given up, the ones stormguard's retry budget refused to retry.
    pub budget_refused: u64,
    /// Of those given up, the ones whose request had no attempt left (see
    /// [`StreamTally::out_of_attempts`]).
    pub out_of_attempts: u64,
    /// Streams the provider cut after some content (its count).
    pub cut: u64,
    /// Streams that failed after content had reached the caller (the callers' count).
    pub interrupted: u64,
    /// Of those, the ones that ended with stormguard's typed `StreamInterrupted` error.
    pub stream_interrupted: u64,
    /// Content tokens callers were shown twice, summed.
    pub duplicated_tokens: u64,
    /// Content tokens callers never got though they got a later one, summed: what a
    /// continuation that went on from the wrong place would skip.
    pub lost_tokens: u64,
}

/// What a scenario with two providers adds to a [`Summary`]: the secondary's load, and how much
/// of the traffic the primary got during its fault and after it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FailoverFigures {
    /// Attempts that reached the secondary.
    pub secondary_attempts: u64,
    /// Most requests in the secondary at once (running or queued) / its slots.
    pub secondary_peak_load: f64,
    /// Seconds of the run in which more than [`OVERLOADED_SHARE`] of the secondary's attempts
    /// found every one of its slots busy.
    pub secondary_overloaded_s: u64,
    /// Attempts that reached the primary during its fault / requests offered during it (per
    /// 100 ms; see [`share_in_fault`]); `null` when none arrived in it.
    pub primary_in_fault: Option<f64>,
    /// Seconds from the end of the primary's fault until the attempts reaching it stay at or
    /// above [`BACK_SHARE`] of the offered load (see [`back_time`]); `null` if they never do.
    pub back_s: Option<f64>,
}

/// Compute the summary and the chart series of one run, from what the callers saw and what the
/// `providers` counted: the provider (and the secondary, in a scenario with two); or, in a
/// scenario with deployments, each deployment, in its order, the provider columns then counting
/// them together ([`BackendStats::merged`]), but for the fault's (its load, its cut), which
/// count the deployment it strikes.
pub(crate) fn summarize(
    name: &'static str,
    scenario: &Scenario,
    mut recorder: Recorder,
    providers: &[BackendStats],
) -> (Summary, Series) {
    recorder.latencies_ms.sort_unstable();
    recorder.fallback_latencies_ms.sort_unstable();
    recorder.healthy_latencies_ms.sort_unstable();
    recorder.first_token_ms.sort_unstable();
    let deployments = if scenario.deployments.is_empty() {
        &[]
    } else {
        providers
    };
    let merged = (!deployments.is_empty()).then(|| BackendStats::merged(deployments));
    let empty = BackendStats::default();
    let backend = merged.as_ref().or(providers.first()).unwrap_or(&empty);
    let faulty = scenario
        .dying
        .and_then(|index| deployments.get(index))
        .unwrap_or(backend);
    let counts = Counts {
        scenario,
        recorder,
        backend,
        secondary: providers.get(1).filter(|_| deployments.is_empty()),
        deployments,
        attempts: backend.buckets.iter().map(|b| b.attempts).collect(),
        fine_attempts: faulty.fine.iter().map(|b| b.attempts).collect(),
        fault_attempts: faulty.buckets.iter().map(|b| b.attempts).collect(),
    };
    (counts.summary(name), counts.series())
}

/// The figures of a run of a scenario whose fault kills one of its deployments, from each
/// deployment's counts (`providers`, in the scenario's order) and when each replica's breaker of
/// the dying one first opened (`opened`, see [`FleetFigures`]); `None` in any other scenario.
pub(crate) fn fleet_figures(
    scenario: &Scenario,
    providers: &[BackendStats],
    opened: &[Option<Duration>],
) -> Option<FleetFigures> {
    let index = scenario.dying?;
    let dying = scenario.deployments.get(index)?;
    let per_ms = &providers.get(index)?.fault_attempts_ms;
    let from = |at: Duration| -> usize {
        let ms = at.saturating_sub(scenario.fault.start).as_millis();
        usize::try_from(ms).unwrap_or(usize::MAX)
    };
    let between = |start: usize, end: usize| -> u64 { per_ms.iter().take(end).skip(start).sum() };
    let first = opened.iter().flatten().min().copied();
    let last = opened
        .iter()
        .try_fold(Duration::ZERO, |last, at| at.map(|at| last.max(at)))
        .filter(|_| !opened.is_empty());
    Some(FleetFigures {
        dying: dying.name,
        saw_it_die_s: opened
            .iter()
            .map(|at| at.map(|at| at.as_secs_f64()))
            .collect(),
        fault_attempts: per_ms.iter().sum(),
        after_first_saw: first.map(|first| between(from(first), usize::MAX)),
        before_all_saw: first
            .zip(last)
            .map(|(first, last)| between(from(first), from(last))),
    })
}

/// Most attempts open at once (client side) in each second, from the provider's
/// [`FINE_BUCKET`]s.
fn peak_open_per_second(backend: &BackendStats) -> Vec<u64> {
    let per_second = (Duration::from_secs(1).as_micros() / FINE_BUCKET.as_micros()) as usize;
    backend
        .fine
        .chunks(per_second)
        .map(|second| second.iter().map(|b| b.peak_open).max().unwrap_or(0))
        .collect()
}

/// `num / den`, or 0 when `den` is 0.
fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// What [`summarize`] computes from: what the callers saw (latencies sorted), what the providers
/// counted (the primary, or the deployments together, as `backend`), the attempts that reached
/// it per second, and those that reached the provider the fault strikes (the primary, or the
/// dying deployment) per [`FINE_BUCKET`] and per second.
struct Counts<'a> {
    scenario: &'a Scenario,
    recorder: Recorder,
    backend: &'a BackendStats,
    secondary: Option<&'a BackendStats>,
    deployments: &'a [BackendStats],
    attempts: Vec<u64>,
    fine_attempts: Vec<u64>,
    fault_attempts: Vec<u64>,
}

impl Counts<'_> {
    /// The figures of pipeline `name`'s run.
    fn summary(&self, name: &'static str) -> Summary {
        let (scenario, recorder, backend) = (self.scenario, &self.recorder, self.backend);
        let offered: u64 = recorder.offered.iter().sum();
        let successes: u64 = recorder.succeeded_by_arrival.iter().sum();
        Summary {
            name,
            offered,
            backend_attempts: backend.attempts,
            amplification: ratio(backend.attempts, offered),
            peak_amplification: self.peak_amplification(),
            peak_load: ratio(backend.peak_in_flight, u64::from(scenario.capacity)),
            peak_in_flight: backend.peak_open,
            success_rate: ratio(successes, offered),
            success_outside: success_outside(
                &recorder.offered_fine,
                &recorder.succeeded_by_arrival_fine,
                &scenario.fault,
            ),
            fallbacks: recorder.fallback_latencies_ms.len() as u64,
            fallback_p99_ms: percentile(&recorder.fallback_latencies_ms, 99.0),
            p50_ms: percentile(&recorder.latencies_ms, 50.0).unwrap_or(0),
            p99_ms: percentile(&recorder.latencies_ms, 99.0).unwrap_or(0),
            overloaded_s: overloaded_seconds(backend, scenario.duration),
            recovery_s: recovery_time(
                &recorder.offered,
                &recorder.succeeded_by_arrival,
                scenario.fault.end,
                RECOVERED_GOODPUT,
            ),
            cut_s: cut_time(
                &recorder.offered_fine,
                &self.fine_attempts,
                &scenario.fault,
                CUT_SHARE,
            ),
            fault_load: self.fault_load(),
            too_many_requests: backend.rate_limited,
            retries: backend.retries,
            early_retries: backend.early_retries,
            successes,
            failover: self.failover(),
            streams: self.streams(),
            silent: self.silent(),
            tail: self.tail(),
            balance: self.balance(),
            fleet: None,
            capacity: None,
        }
    }

    /// The figures of the deployments, where the scenario has some.
    fn balance(&self) -> Option<BalanceFigures> {
        let scenario = self.scenario;
        if self.deployments.is_empty() {
            return None;
        }
        let best = scenario.best_split();
        let served: Vec<u64> = self
            .deployments
            .iter()
            .map(|stats| stats.buckets.iter().map(|b| b.ok).sum())
            .collect();
        let all: u64 = served.iter().sum();
        let deployments = (scenario.deployments.iter().zip(self.deployments))
            .zip(served.iter().zip(&best))
            .map(
                |((deployment, stats), (successes, best_share))| DeploymentFigures {
                    name: deployment.name,
                    attempts: stats.attempts,
                    successes: *successes,
                    share: ratio(*successes, all),
                    best_share: *best_share,
                    too_many_requests: stats.rate_limited,
                },
            )
            .collect();
        let best_ms = scenario.split_latency(&best, 50.0).as_millis();
        let best_ms = u32::try_from(best_ms).unwrap_or(u32::MAX);
        let p50 = percentile(&self.recorder.latencies_ms, 50.0).unwrap_or(0);
        Some(BalanceFigures {
            deployments,
            best_split_p50_ms: best_ms,
            p50_over_best: ratio(u64::from(p50), u64::from(best_ms)),
        })
    }

    /// The highest `attempts / offered` of any one second.
    fn peak_amplification(&self) -> f64 {
        self.recorder
            .offered
            .iter()
            .zip(&self.attempts)
            .map(|(offered, attempts)| ratio(*attempts, *offered))
            .fold(0.0, f64::max)
    }

    /// `attempts / offered` in the fault window, after its first [`FAULT_GRACE`] (the attempts
    /// reaching the provider the fault strikes).
    fn fault_load(&self) -> f64 {
        let from = (self.scenario.fault.start + FAULT_GRACE).as_secs() as usize;
        let to = self.scenario.fault.end.as_secs() as usize;
        let window = |series: &[u64]| series.iter().take(to).skip(from).sum::<u64>();
        ratio(window(&self.fault_attempts), window(&self.recorder.offered))
    }

    /// The figures of the second provider, where the scenario has one and it counted.
    fn failover(&self) -> Option<FailoverFigures> {
        let (stats, second) = self.secondary.zip(self.scenario.secondary())?;
        let (fault, offered) = (&self.scenario.fault, &self.recorder.offered_fine);
        Some(FailoverFigures {
            secondary_attempts: stats.attempts,
            secondary_peak_load: ratio(stats.peak_in_flight, u64::from(second.capacity)),
            secondary_overloaded_s: overloaded_seconds(stats, self.scenario.duration),
            primary_in_fault: share_in_fault(offered, &self.fine_attempts, fault),
            back_s: back_time(
                offered,
                &self.fine_attempts,
                fault.end,
                self.scenario.duration,
                BACK_SHARE,
            ),
        })
    }

    /// The figures of the streams, where the provider streams.
    fn streams(&self) -> Option<StreamFigures> {
        let (backend, callers) = (self.backend, &self.recorder.streams);
        self.scenario.stream.map(|_| StreamFigures {
            failed_before_content: backend.streams_failed_before_content,
            retried: backend.streams_failed_retried,
            given_up: callers.given_up,
            budget_refused: callers.budget_refused,
            out_of_attempts: callers.out_of_attempts,
            cut: backend.streams_cut,
            interrupted: callers.interrupted,
            stream_interrupted: callers.stream_interrupted,
            duplicated_tokens: callers.duplicated_tokens,
            lost_tokens: callers.lost_tokens,
        })
    }

    /// The figures of a silent provider, where the scenario's fault is one.
    fn silent(&self) -> Option<SilentFigures> {
        self.scenario.goes_silent().then(|| SilentFigures {
            healthy_p99_ms: percentile(&self.recorder.healthy_latencies_ms, 99.0),
            silent_attempts: self.backend.silent,
            slow_first_tokens: self.backend.slow_first_tokens,
        })
    }

    /// The figures of a scenario whose streams start with a slow tail.
    fn tail(&self) -> Option<TailFigures> {
        if !self.scenario.has_slow_starts() {
            return None;
        }
        let (fault, recorder, backend) = (&self.scenario.fault, &self.recorder, self.backend);
        let offered: u64 = recorder.offered.iter().sum();
        let bucket = FINE_BUCKET.as_secs_f64();
        let first = (fault.start.as_secs_f64() / bucket).ceil() as usize;
        let end = (fault.end.as_secs_f64() / bucket).floor() as usize;
        let fault_attempts = (first..end).filter_map(|b| self.fine_attempts.get(b)).sum();
        let seconds = fault.start.as_secs_f64().ceil() as usize..fault.end.as_secs() as usize;
        let fault_hedges = seconds
            .filter_map(|second| backend.buckets.get(second))
            .map(|b| b.hedges)
            .sum();
        let first_tokens = &recorder.first_token_ms;
        Some(TailFigures {
            first_token_p50_ms: percentile(first_tokens, 50.0),
            first_token_p99_ms: percentile(first_tokens, 99.0),
            first_token_p999_ms: percentile(first_tokens, 99.9),
            hedges: backend.hedges,
            hedges_per_request: ratio(backend.hedges, offered),
            fault_amplification: share_in_fault(&recorder.offered_fine, &self.fine_attempts, fault),
            fault_attempts,
            fault_hedges,
            slow_first_tokens: backend.slow_first_tokens,
        })
    }

    /// The chart's series.
    fn series(self) -> Series {
        let Counts {
            scenario,
            recorder,
            backend,
            secondary,
            deployments,
            mut attempts,
            ..
        } = self;
        // Attempts and answers run on after the last arrival; they all end at the same second,
        // and so does the in-flight series (attempts that hang stay open to the end of the run).
        let (mut successes, mut fallbacks) = (
            recorder.succeeded_by_completion,
            recorder.fallbacks_by_completion,
        );
        let mut rate_limited: Vec<u64> = backend.buckets.iter().map(|b| b.rate_limited).collect();
        let mut secondary_attempts: Vec<u64> = secondary
            .map(|stats| stats.buckets.iter().map(|b| b.attempts).collect())
            .unwrap_or_default();
        let mut duplicated_tokens = recorder.duplicated_by_completion;
        let mut hedges: Vec<u64> = if scenario.has_slow_starts() {
            backend.buckets.iter().map(|b| b.hedges).collect()
        } else {
            Vec::new()
        };
        let seconds = attempts
            .len()
            .max(successes.len())
            .max(fallbacks.len())
            .max(secondary_attempts.len())
            .max(duplicated_tokens.len());
        let deployments = deployments
            .iter()
            .map(|stats| DeploymentSeries::of(stats, seconds))
            .collect();
        let mut in_flight = peak_open_per_second(backend);
        for series in [
            &mut attempts,
            &mut rate_limited,
            &mut successes,
            &mut fallbacks,
            &mut in_flight,
        ] {
            series.resize(seconds, 0);
        }
        if secondary.is_some() {
            secondary_attempts.resize(seconds, 0);
        }
        if scenario.stream.is_some() {
            duplicated_tokens.resize(seconds, 0);
        }
        if scenario.has_slow_starts() {
            hedges.resize(seconds, 0);
        }
        Series {
            offered: recorder.offered,
            attempts,
            rate_limited,
            in_flight,
            successes,
            fallbacks,
            secondary_attempts,
            duplicated_tokens,
            hedges,
            deployments,
            offered_fine: recorder.offered_fine,
            attempts_fine: backend.fine.iter().map(|b| b.attempts).collect(),
            in_flight_fine: backend.fine.iter().map(|b| b.peak_open).collect(),
        }
    }
}

impl DeploymentSeries {
    /// The series of a deployment that counted `stats`, over `seconds`.
    fn of(stats: &BackendStats, seconds: usize) -> DeploymentSeries {
        let per_second = |count: fn(&Bucket) -> u64| -> Vec<u64> {
            let mut series: Vec<u64> = stats.buckets.iter().map(count).collect();
            series.resize(seconds, 0);
            series
        };
        DeploymentSeries {
            attempts: per_second(|b| b.attempts),
            rate_limited: per_second(|b| b.rate_limited),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenarios;

    #[test]
    fn percentiles_use_nearest_rank() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), Some(50));
        assert_eq!(percentile(&values, 99.0), Some(99));
        assert_eq!(percentile(&values, 100.0), Some(100));
        assert_eq!(percentile(&values, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile::<u32>(&[], 50.0), None);
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
            Answer::Success,
        );
        r.arrive(Duration::from_millis(950));
        r.complete(
            Duration::from_millis(950),
            Duration::from_millis(1_000),
            Answer::Failure,
        );
        assert_eq!(r.offered, vec![2]);
        assert_eq!(r.offered_fine, vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        assert_eq!(r.succeeded_by_arrival, vec![1]);
        assert_eq!(r.succeeded_by_completion, vec![0, 0, 1]);
        assert_eq!(r.latencies_ms, vec![1_200, 50]);
    }

    #[test]
    fn a_fallback_answer_is_counted_apart_and_is_no_success() {
        let mut r = Recorder::default();
        r.arrive(Duration::from_millis(20_500));
        r.complete(
            Duration::from_millis(20_500),
            Duration::from_millis(20_503),
            Answer::Fallback,
        );
        assert!(r.succeeded_by_arrival.is_empty() && r.succeeded_by_completion.is_empty());
        assert_eq!(r.fallback_latencies_ms, vec![3]);
        assert_eq!(r.fallbacks_by_completion[20], 1);
        assert_eq!(r.latencies_ms, vec![3], "an answer the caller got");

        let scenario = scenarios::BLACKHOLE.scenario();
        let stats = BackendStats::default();
        let (summary, series) = summarize("stormguard+breaker", &scenario, r, &[stats]);
        assert_eq!(
            (summary.successes, summary.success_rate, summary.fallbacks),
            (0, 0.0, 1)
        );
        assert_eq!(summary.fallback_p99_ms, Some(3));
        assert_eq!(series.fallbacks[20], 1);
    }

    fn blackhole() -> Fault {
        scenarios::BLACKHOLE.scenario().fault
    }

    #[test]
    fn cut_is_when_attempts_stay_below_5_percent_of_offered_in_100_ms_buckets() {
        // 30 s at 100 per 100 ms; the fault is buckets 200..300.
        let offered = vec![100; 300];
        let mut attempts = vec![100; 300];
        // Cut 2.3 s into the fault, one probe per bucket after (1% of offered)...
        attempts[223..300].fill(1);
        // ...with a relapse to 5% (not below it) at 2.2 s, before the cut that holds.
        attempts[210..220].fill(0);
        attempts[220..223].fill(5);
        let cut = cut_time(&offered, &attempts, &blackhole(), CUT_SHARE).unwrap();
        assert!((cut - 2.3).abs() < 1e-9, "{cut}");
        // Never cut: a single bucket at the threshold in the last 100 ms of the fault.
        attempts[299] = 5;
        assert_eq!(cut_time(&offered, &attempts, &blackhole(), CUT_SHARE), None);
        // Cut before the fault: 0 s.
        assert_eq!(
            cut_time(&offered, &[0; 300], &blackhole(), CUT_SHARE),
            Some(0.0)
        );
    }

    #[test]
    fn cut_is_defined_for_dead_providers_only() {
        let offered = vec![100; 450];
        let none = vec![0; 450];
        let outage = scenarios::OUTAGE.scenario().fault;
        assert_eq!(cut_time(&offered, &none, &outage, CUT_SHARE), Some(0.0));
        for kind in [scenarios::SEED, scenarios::QUOTA] {
            let fault = kind.scenario().fault;
            assert_eq!(cut_time(&offered, &none, &fault, CUT_SHARE), None, "{kind}");
        }
    }

    #[test]
    fn share_in_fault_counts_the_100_ms_buckets_wholly_in_the_window() {
        let failover = scenarios::FAILOVER.scenario().fault;
        // 60 s at 100 per 100 ms; the fault is buckets 200..350.
        let offered = vec![100; 600];
        let mut attempts = vec![100; 600];
        attempts[200..350].fill(0);
        attempts[200] = 150;
        attempts[300..303].fill(10);
        let share = share_in_fault(&offered, &attempts, &failover).unwrap();
        assert!((share - 180.0 / 15_000.0).abs() < 1e-12, "{share}");
        // A window that does not start on a bucket leaves its first, partial bucket out.
        let scaled = scenarios::FAILOVER
            .scenario()
            .with_duration(Duration::from_secs(40))
            .fault;
        assert_eq!(scaled.start, Duration::from_millis(13_333));
        let mut late = vec![0; 400];
        late[133] = 100;
        assert_eq!(share_in_fault(&offered, &late, &scaled), Some(0.0));
        assert_eq!(share_in_fault(&[], &[], &failover), None);
    }

    #[test]
    fn back_is_when_the_primary_gets_95_percent_of_offered_again_for_good() {
        let end = Duration::from_secs(35);
        let until = Duration::from_secs(60);
        // 60 s at 100 per 100 ms; nothing reaches the primary from 20 s to 36.3 s, but a probe.
        let offered = vec![100; 600];
        let mut attempts = vec![100; 600];
        attempts[200..363].fill(1);
        // 95 of 100 is back; a relapse to 94 at 36.0 s restarts the count.
        attempts[355..360].fill(95);
        attempts[360] = 94;
        let back = back_time(&offered, &attempts, end, until, BACK_SHARE).unwrap();
        assert!((back - 1.3).abs() < 1e-9, "{back}");
        // Retries on top of the offered load are back too; a second without arrivals counts.
        let mut busy = vec![100; 600];
        busy[350..360].fill(300);
        let mut quiet = offered.clone();
        quiet[400..410].fill(0);
        let mut none = busy.clone();
        none[400..410].fill(0);
        assert_eq!(back_time(&quiet, &none, end, until, BACK_SHARE), Some(0.0));
        // Never back by the end of the arrivals, or nothing after the fault to judge by.
        attempts[599] = 90;
        assert_eq!(back_time(&offered, &attempts, end, until, BACK_SHARE), None);
        assert_eq!(
            back_time(&offered, &attempts, until, until, BACK_SHARE),
            None
        );
    }

    #[test]
    fn a_second_provider_adds_its_figures_and_series() {
        let scenario = scenarios::FAILOVER.scenario().with_qps(100.0);
        let primary = BackendStats {
            attempts: 10,
            buckets: vec![Bucket {
                attempts: 10,
                ..Bucket::default()
            }],
            ..BackendStats::default()
        };
        let secondary = BackendStats {
            attempts: 7,
            peak_in_flight: 218,
            buckets: vec![
                Bucket::default(),
                Bucket {
                    attempts: 5,
                    delayed: 1,
                    ..Bucket::default()
                },
                Bucket {
                    attempts: 2,
                    ..Bucket::default()
                },
            ],
            ..BackendStats::default()
        };
        let mut recorder = Recorder::default();
        recorder.arrive(Duration::ZERO);
        let (summary, series) = summarize(
            "stormguard+failover",
            &scenario,
            recorder.clone(),
            &[primary.clone(), secondary],
        );
        let figures = summary.failover.unwrap();
        assert_eq!(figures.secondary_attempts, 7);
        // 218 of the secondary's 109 slots.
        assert_eq!(scenario.secondary().unwrap().capacity, 109);
        assert!((figures.secondary_peak_load - 2.0).abs() < 1e-12);
        assert_eq!(figures.secondary_overloaded_s, 1);
        assert_eq!(series.secondary_attempts, vec![0, 5, 2]);
        assert_eq!(series.attempts, vec![10, 0, 0], "the primary's, as long");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["failover"]["secondary_attempts"], 7);
        assert_eq!(
            json["failover"]["back_s"], 0.0,
            "no arrivals after the fault"
        );
        // One provider: no figures, and no key in the JSON.
        let (alone, series) = summarize("stormguard", &scenario, recorder, &[primary]);
        assert!(alone.failover.is_none() && series.secondary_attempts.is_empty());
        assert!(
            serde_json::to_value(&alone)
                .unwrap()
                .get("failover")
                .is_none()
        );
    }

    #[test]
    fn streamed_requests_add_the_stream_figures_and_the_tokens_shown_twice() {
        let scenario = scenarios::STREAMS.scenario().with_qps(100.0);
        let mut recorder = Recorder::default();
        recorder.arrive(Duration::ZERO);
        recorder.arrive(Duration::ZERO);
        let cut_and_restarted = StreamTally {
            interrupted: 1,
            duplicated_tokens: 40,
            lost_tokens: 5,
            ..StreamTally::default()
        };
        recorder.complete(Duration::ZERO, Duration::from_secs(3), Answer::Success);
        recorder.stream(Duration::from_secs(3), &cut_and_restarted);
        let refused = StreamTally {
            given_up: 1,
            budget_refused: 1,
            ..StreamTally::default()
        };
        recorder.complete(Duration::ZERO, Duration::from_secs(1), Answer::Failure);
        recorder.stream(Duration::from_secs(1), &refused);
        let stats = BackendStats {
            streams_failed_before_content: 3,
            streams_failed_retried: 2,
            streams_cut: 1,
            ..BackendStats::default()
        };
        let (summary, series) =
            summarize("naive", &scenario, recorder, std::slice::from_ref(&stats));
        assert_eq!(
            summary.streams,
            Some(StreamFigures {
                failed_before_content: 3,
                retried: 2,
                given_up: 1,
                budget_refused: 1,
                out_of_attempts: 0,
                cut: 1,
                interrupted: 1,
                stream_interrupted: 0,
                duplicated_tokens: 40,
                lost_tokens: 5,
            })
        );
        assert_eq!(summary.success_rate, 0.5);
        assert_eq!(series.duplicated_tokens, vec![0, 0, 0, 40]);
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["streams"]["duplicated_tokens"], 40);
        assert_eq!(json["streams"]["lost_tokens"], 5);
        // A provider that does not stream: no figures, no key, no series.
        let seed = scenarios::SEED.scenario();
        let (plain, series) = summarize(
            "naive",
            &seed,
            Recorder::default(),
            std::slice::from_ref(&stats),
        );
        assert!(plain.streams.is_none() && series.duplicated_tokens.is_empty());
        assert!(
            serde_json::to_value(&plain)
                .unwrap()
                .get("streams")
                .is_none()
        );
    }

    #[test]
    fn success_outside_leaves_out_the_fault_4_s_before_it_and_2_s_after_it() {
        // 60 s at 10 per 100 ms; every request inside 16 s..32 s fails, and one before it.
        let offered = vec![10; 600];
        let mut succeeded = vec![10; 600];
        succeeded[160..320].fill(0);
        succeeded[159] = 9;
        let share = success_outside(&offered, &succeeded, &blackhole()).unwrap();
        let outside = (600 - 160) * 10;
        assert!((share - (outside - 1) as f64 / outside as f64).abs() < 1e-12);
        // A failure at 32.0 s counts.
        succeeded[320] = 0;
        let share = success_outside(&offered, &succeeded, &blackhole()).unwrap();
        assert!((share - (outside - 11) as f64 / outside as f64).abs() < 1e-12);
        assert_eq!(success_outside(&[], &[], &blackhole()), None);
        // A fault that lasts the whole run leaves nothing outside.
        let quota = scenarios::BURST.scenario().fault;
        assert_eq!(success_outside(&offered, &succeeded, &quota), None);
    }

    #[test]
    fn attempts_answered_429_are_counted_in_total_and_per_second() {
        let scenario = scenarios::BURST.scenario();
        let mut stats = BackendStats {
            rate_limited: 5,
            attempts: 12,
            ..BackendStats::default()
        };
        stats.buckets = vec![
            Bucket {
                attempts: 10,
                rate_limited: 4,
                ..Bucket::default()
            },
            Bucket::default(),
            Bucket {
                attempts: 2,
                rate_limited: 1,
                ..Bucket::default()
            },
        ];
        let mut recorder = Recorder::default();
        recorder.arrive(Duration::ZERO);
        let (summary, series) = summarize("naive", &scenario, recorder, &[stats]);
        assert_eq!(summary.too_many_requests, 5);
        assert_eq!(series.rate_limited, vec![4, 0, 1]);
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["429s"], 5);
        assert!(json["success_outside"].is_null(), "{json}");
    }
}
