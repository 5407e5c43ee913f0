//! The `tail` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::TAIL_ANSWER_MEDIAN;
use crate::scenario::{Fault, FaultKind, Health, Scenario, StreamShape, StreamStart};

/// Concurrent slots of the tail scenario's provider at [`FIELD_QPS`](crate::scenario::FIELD_QPS): the field's 40,000, ample.
///
/// Little's law: an attempt holds its slot to the end of its stream: 0.52 s to its first token
/// on average (the log-normal means of 200 ms and 300 ms at sigma 0.25), 0.59 s with the slow
/// 1.5% at ten times that, then its content events after the first, 0.35 s (the log-normal
/// mean of a 400 ms median at the scenario's sigma 0.5, 0.45 s, less the first event): about
/// 0.94 s, so 12,000 req/s keep about 11,300 slots busy. A client that sends every request twice
/// (the naive hedge: the attempt that loses the race is dropped, but its work goes on, as work
/// the provider has started does) keeps about 22,500 busy, 56% of the slots: the load alone
/// never overloads the provider, whatever the row, and the outage, not the slots, is what goes
/// wrong.
const TAIL_CAPACITY: u32 = 40_000;

/// Streamed short answers at 12,000 requests/s whose first token comes about half a second
/// after the provider starts on them (log-normal, narrow), 1.5% of the attempts ten times
/// later: what hedging is for. From 30 s to 40 s a total outage (503 at once, work in
/// flight lost).
pub const SCENARIO: Builtin = Builtin {
    name: "tail",
    help: "Short streamed answers at 12,000 requests/s whose first token comes about half a\n\
             second after the provider starts on them (log-normal, narrow), 1.5% of the\n\
             attempts ten times later: what hedging is for. From 30 s to 40 s a total outage\n\
             (503 at once).",
    pipelines: &[
        Pipeline::NaiveHedge,
        Pipeline::TowerHedge,
        Pipeline::Stormguard,
        Pipeline::StormguardHedge,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario tail` replays a tail of slow first tokens, what hedging is for, at the field's load.
12,000 requests/s for 60 s, each a short chat completion that asks for a stream
(`"stream": true`). The provider (40,000 slots, ample: the load keeps about 11,300 busy, a client
that sends everything twice about 22,500) sends a stream's head 200 ms after it starts on the
request and its first token 300 ms after the head (medians, log-normal at sigma 0.25, a narrow
spread: the prefill of one prompt size varies little), about half a second to the first token
(0.7 s at the p95), then 5 tokens every 100 ms for 400 ms at the median (about 20 tokens). 1.5%
of the attempts, drawn per attempt (a hedge has its own 1.5% chance), get their first token ten
times later than drawn, about 5 s (their head comes as drawn: the provider admitted them, their
prefill is what is slow). From 30 s to 40 s the provider is down: 503 at once, and a stream in
flight then is reset (before its head: a 503 then). Why 1.5% and not a round 1% is below. A request's time to first token runs from its start to the first content
event its caller is shown, across its attempts, for the requests that succeed. The rows are
`naive-hedge`, `tower-hedge`, `stormguard` and `stormguard+hedge`. The table adds
`first token p50`, `first token p99`, `first token p99.9`, `attempts / stormguard` (the attempts
reaching the provider over the run against the `stormguard` row's), `hedges` (attempts sent while
another attempt of the same request was still open, the provider's count, whoever sends them) and
`hedges / request`, `fault ampl`, `fault attempts` and `fault hedges` (during the whole outage,
per 100 ms of arrival: attempts over offered, the attempts, the hedges among them) and
`slow first tokens` (the attempts the provider drew in the slow tail); the chart gets a panel for
the hedges. 60 s of 12,000 streams a second take 2 min 18 s in release (four rows, two cores):"#,
        after: r#"- `stormguard+hedge` against `stormguard`: the p99 time to first token goes from 4,520 ms to
  1,172 ms (3.86x lower) and the p99.9 from 6,228 ms to 1,413 ms (4.41x), the median stays at
  510 ms, for 4.4% more attempts over the run (33,816 hedges: 4.7% of the requests, 5.8% of
  those that succeeded, a little more than the one in twenty of the 95th percentile: the
  percentile is read from the last 128 figures, and a low reading hedges more than a high one
  hedges less). In the outage it sends
  0.17x the offered load (its throttle's doing, as in `stormguard`'s 0.20x) and 1 hedge, whose
  clock fired in the millisecond the provider went down: a 503 comes at once, so no attempt waits
  for content and none is hedged. In the second after the outage it sends none either: the
  outage's retries have spent the retry budget, which grants a hedge as it does a retry; they
  are back from 41 s. Goodput is back 1 s after the outage, as without hedging.
- `naive-hedge` has the shortest tail (651 ms at the p99, 746 ms at the p99.9) and costs two
  attempts for every request, the outage included: 2.00x the offered load throughout (239,212
  attempts in the outage against `stormguard`'s 24,430), 2.32x the `stormguard` row's attempts,
  and its losers' work goes on at the provider (0.58x of its slots at the peak, against
  `stormguard`'s 0.29x).
- `tower-hedge` leaves the tail where it was (4,508 ms at the p99, 6,545 ms at the p99.9) for
  hedges on 7.7% of the requests: it times the response future, which for a stream ends with its head,
  and a slow attempt's head comes on time; what it hedges is the heads slower than its 95th
  percentile, which says nothing of their first token. It also records the outage's 503s, which
  come at once, as latencies: for one period (2 s) after the outage its 95th percentile is 0 ms
  and it hedges every request (2.00x the offered load in the worst second).

The scenario sets the targets for `stormguard+hedge`: a p99 time to first token at least 3x lower
than without hedging, at most 5% more attempts over the run, during the outage an amplification of
at most 1.1x (hedges stop) and a recovery within 1 s. All four are met (3.86x, 1.044x, 0.17x with 1
hedge, 1 s). The p99 target is why the slow share is 1.5% and not 1% (`TAIL_SLOW_SHARE` says so):
with exactly 1% of the attempts slow, the 99th percentile lies on the boundary between the fast
first tokens and the slow ones, and measures where that boundary falls, not the tail. At 1% (seed
42) `stormguard`'s p99 was 896 ms, the top of the fast ones, and `stormguard+hedge`'s 971 ms (its
hedged requests wait their delay, then a first token: 0.92x), while the p99.9 went from 6,132 ms to
1,352 ms (4.54x lower), for 1.045x the attempts, 4.7% hedges, 0.17x in the outage with no hedge and a
recovery of 1 s. The outage adds to it: an attempt in flight when the provider goes down is lost,
and a slow one is in flight ten times as long, so fewer of the requests that succeed are slow than
were drawn. At 1.1% the p99 was still on the boundary (0.93x); from 1.2% it lies in the slow tail at
the full scale (3.51x to 3.53x over three seeds), but not at the test's scale (1,500 requests/s for
30 s: 0.94x), nor at 1.3% there with every seed; 1.5% puts it inside the slow tail at every scale
and seed tried (3.86x here, 3.50x to 3.69x at the test's scale over five seeds).
`crates/storm/tests/targets.rs` asserts the targets at 1,500 requests/s for 30 s (the p99 3.5x
lower, 1.031x the attempts, no hedge in the outage, goodput back within 2 s, as without hedging
at that load).

![tail scenario: offered load, attempts reaching the provider, attempts in flight, successes and hedges per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        capacity: TAIL_CAPACITY,
        baseline: Health {
            median: TAIL_ANSWER_MEDIAN,
            ..Health::HEALTHY
        },
        fault: Fault {
            start: Duration::from_secs(30),
            end: Duration::from_secs(40),
            kind: FaultKind::Outage,
        },
        stream: Some(StreamShape {
            start: Some(StreamStart::TAIL),
            ..StreamShape::LLM
        }),
        asks_for_stream: true,
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: the p99 time to first token and the hedges per request.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    summary.tail.as_ref().map_or_else(
        || "first token p99 -".to_owned(),
        |f| {
            let p99 = f
                .first_token_p99_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
            format!(
                "first token p99 {p99}, {:.3} hedges/request",
                f.hedges_per_request
            )
        },
    )
}
