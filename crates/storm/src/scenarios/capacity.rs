//! The `capacity` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::{DEGRADED_MEDIAN, Fault, FaultKind, Scenario, StreamShape};

/// Offered load of the capacity scenario: 250 requests a second, which the healthy provider
/// serves with room to spare (Little's law: 250 x 0.91 s, the log-normal mean of an 800 ms
/// median, keep 227 of its 400 slots busy) and the slower one does not (250 x 2.83 s: 708).
const CAPACITY_QPS: f64 = 250.0;

/// The provider's slots: 400, halved to [`HALVED_SLOTS`] at [`HALVED_AT`].
const CAPACITY_SLOTS: u32 = 400;

/// The slots left from [`HALVED_AT`].
const HALVED_SLOTS: u32 = 200;

/// When the slots are halved: 40 s, 20 s after the latency step.
const HALVED_AT: Duration = Duration::from_secs(40);

/// The provider's queue: 40 requests (a tenth of its slots) wait for a slot at most; one more is
/// answered 429 at once.
const CAPACITY_QUEUE: u32 = 40;

/// The capacity scenario's provider queues and answers 429 beyond its queue; it does not thrash
/// past its slots (no 503 for the work it admitted), so that every error is a 429 a client can
/// learn from.
const NO_THRASHING: f64 = f64::INFINITY;

/// Streamed answers at 250 requests/s to a provider of 400 slots and a queue of 40 (429 beyond
/// it): from 20 s its median latency goes from 800 ms to 2,500 ms with the slots unchanged, and
/// from 40 s it has 200 slots.
pub const SCENARIO: Builtin = Builtin {
    name: "capacity",
    help: "Streamed answers at 250 requests/s to a provider of 400 slots and a queue of 40 (429\n\
             beyond it): from 20 s its median latency goes from 800 ms to 2,500 ms, the slots\n\
             unchanged; from 40 s it has 200 slots.",
    pipelines: &[
        Pipeline::Naive,
        Pipeline::Stormguard,
        Pipeline::StormguardBulkhead,
        Pipeline::ResilienceAdaptive,
        Pipeline::StormguardConcurrency,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario capacity` replays the incident's capacity side: a provider whose GPU memory holds so
many generations at once. Its 400 slots stream their answers (OpenAI's chunks, 5 tokens every
100 ms for the answer's service time: a stream holds its slot to its end), 40 requests may wait
for a slot, and one more is answered 429 at once; past its slots it queues, it does not thrash. At
250 requests/s its healthy 800 ms median keeps about 227 slots busy. From 20 s the median is
2,500 ms with the same slots: at the same rate three times as many requests want to be in flight
(708, Little's law), and the slots serve 141 a second. From 40 s half the slots are gone (the first to
free are taken away, the work on them runs to its end): 71 a second. The rows are `naive` (3
retries, 1 s apart, 4 s per attempt), `stormguard` (`ClientLayer::default()`, no limit on what
it has in flight), `stormguard+bulkhead` (a fixed
limit on the attempts in flight, sized by hand for the healthy provider: its 227 in flight plus a
quarter, 284; the same permit as the adaptive limit's, held until a stream ends, a wait of 2 s at
most) and `stormguard+concurrency` (`ClientLayer::default().with_concurrency(ConcurrencyLimit::default())`:
starting at 20, learned from the 429s), with `resilience-adaptive` between the last two: the
same engine over tower-resilience 0.13's adaptive limiter (its `adaptive` feature,
`AdaptiveService` with its AIMD) in place of stormguard's, given the same start (20), bounds (3
to 1,000) and decrease (x0.9), and the attempt timeout (4 s) as its latency threshold so that it
reads no healthy answer as slow. The table adds five columns, each figure per phase (healthy,
slower, halved) from 10 s after the phase's start."#,
        after: r#"- `naive` retries every 429 three times, 1 s apart: 36,405 attempts for 14,903 requests (2.44x,
  3.98x in the worst second) and 26,801 429s, 1.8 for each request offered. The provider's queue
  caps what is in flight all the same (1.10x the slots after the latency step, 1.21x after the
  cut), so the retries buy little: 64.44% success for 21,502 retries.
- `stormguard`, with no limit, sends what arrives and retries within its budget: past the 400
  slots and the 40 places of the queue the provider answers 429, 4,132 times (27.73% of the
  offered requests). Its attempts in flight are again whatever the queue lets in (1.10x, 1.20x),
  its goodput what the slots allow (0.98x, 0.97x), its success 62.43%.
- `stormguard+bulkhead` (284 attempts in flight, sized for the healthy 227 plus a quarter) is
  wrong both ways. After the latency step it holds 0.71x the slots: 29% of what the provider could
  serve stays idle (goodput 0.70x) while the requests it refuses wait 2 s. After the cut it is
  more than the 200 slots and the queue hold: 1.20x the slots in flight and 2,152 429s (14.44%).
  Its success is the lowest of the five (57.08%).
- `resilience-adaptive` gives the figures of `stormguard`, the row without a limit, to the
  request: its limit climbed to its maximum, 1,000, in the first seconds and never came down
  (its lowest after the step is 1,000). It frees a place when the response head arrives, while
  the stream holds the provider's slot for seconds more, so its count of attempts in flight stays
  far under what the provider holds, and it counts every answer that is not an `Err` as a
  success, each of the 4,132 429s included. (It also times answers with `std::time::Instant`,
  which the simulator's virtual clock does not move: every latency reads as about 0 ms. With the
  threshold above every healthy answer, that changes nothing here.)
- `stormguard+concurrency` starts at 20 and doubles with each window of healthy answers (its slow
  start; the requests of the first seconds that found it full waited 2 s and were refused: 98.36%
  success outside the fault, against 100.00%), and meets the provider's limit at the latency
  step: 1.3 s after it its attempts in flight settle at 1.02x the slots, 1.2 s after the cut at
  1.16x, and it sees 8 429s in the whole run (0.05% of the offered requests), each shrinking it by
  a tenth. Goodput is what the slots allow (0.98x, 0.99x) and its success 63.07%, within 1.4
  points of naive's with a quarter of its attempts (9,409, 0.63x the offered load): the rest of
  the load (1.8x what the slots serve after the step, 3.5x after the cut) is refused on this side
  after a bounded wait, never sent into a 429. Its lowest limit, 216 (the floor is 3), is after
  the cut.

The scenario sets the targets for `stormguard+concurrency`: once converged, attempts in flight
within 0.8x to 1.25x of the slots (1.02x, 1.16x: met), the provider's 429s under 1% of the offered
load (0.05%: met), goodput at least 95% of what the slots allow through both steps (98%, 99%:
met), never collapsed to its minimum (216: met), re-converged within 10 s of each step (1.3 s,
1.2 s: met). The slots-allowed figure divides by the mean service time; a stream holds its slot a
few tens of milliseconds longer (its last event and `[DONE]`), and the slots taken away at 40 s
finish the work they hold, which is how a goodput can pass 1.00x.

![capacity scenario: offered load, attempts reaching the provider, attempts in flight and successes per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: CAPACITY_QPS,
        capacity: CAPACITY_SLOTS,
        max_queue: Some(CAPACITY_QUEUE),
        overload_error_span: NO_THRASHING,
        fault: Fault {
            start: Duration::from_secs(20),
            end: Duration::from_secs(60),
            kind: FaultKind::CapacitySteps {
                median: DEGRADED_MEDIAN,
                slots_from: HALVED_AT,
                slots: HALVED_SLOTS,
            },
        },
        stream: Some(StreamShape::LLM),
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: the attempts in flight over the slots once the slots are halved, and the 429s.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    let rejected = summary.too_many_requests as f64 / summary.offered.max(1) as f64;
    summary.capacity.as_ref().map_or_else(
        || "in flight / slots -".to_owned(),
        |f| {
            format!(
                "in flight / slots {:.2}, 429s {:.2}%",
                f.in_flight_per_slot[2],
                rejected * 100.0
            )
        },
    )
}
