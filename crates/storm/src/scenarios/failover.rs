//! The `failover` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::{FAILOVER_QPS, FAILOVER_SECONDARY_SHARE};
use crate::scenario::{Fault, FaultKind, Scenario};

/// Concurrent slots of the failover scenario's primary at [`FAILOVER_QPS`]: twice what the load
/// keeps busy.
///
/// Little's law: 1,000 req/s x 0.9065 s (the healthy mean) keep 906.5 slots busy; 1,813 slots
/// make the offered load half the primary's capacity (it completes 2,000 req/s).
const FAILOVER_CAPACITY: u32 = 1_813;

/// Two providers, at 1,000 requests/s (half the primary's capacity; the secondary has 60% of
/// it and is healthy throughout): from 20 s to 35 s the primary is down, answering 503 at
/// once for the first half and a black hole for the second.
pub const SCENARIO: Builtin = Builtin {
    name: "failover",
    help: "Two providers at 1,000 requests/s: the primary is down from 20 s to 35 s (503 at once,\n\
             then a black hole); the secondary, with 60% of its slots, stays healthy.",
    pipelines: &[
        Pipeline::NaiveFailover,
        Pipeline::Stormguard,
        Pipeline::StormguardFailover,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario failover` replays a provider outage behind a failover. Two providers: 1,000
requests/s with the seed's healthy latency and error rate are half of what the primary completes
(1,813 slots, of which the load keeps 906 busy by Little's law); the secondary has 60% of the
primary's slots (1,088, so it carries the whole load alone at 83% of them) and is healthy
throughout. From 20 s to 27.5 s the primary answers 503 at once, and the requests in flight at
20 s fail then; from 27.5 s to 35 s it is a black hole; after 35 s it answers as usual. The rows
are `naive+failover`, `stormguard` on the primary alone, and `stormguard+failover`. With two
providers the table adds five columns after the others, which are the primary's: `secondary`
(attempts reaching the secondary), its `peak load` and `overloaded` seconds, `primary in fault`
(attempts reaching the primary during its fault / offered during it) and `back` (seconds after the
primary's return until the attempts reaching it stay at 95% of the offered load or more, per
100 ms); the chart gets a panel for the secondary."#,
        after: r#"- `naive+failover` sends every request to the dead primary first (189.69% of the offered load
  during the fault: the requests and the retries that bounce back). At the crash, the primary's
  requests in flight all fail at once and go to the secondary together, on top of the load: it
  passes its slots, its 503s bounce between the providers, and its queue outgrows the 4 s
  timeouts: it is overloaded in 36 of the 40 s after the crash (6.59x its slots), and once the
  primary is back the bounced retries overload it too (6.60x): 45.47% success, and no recovery
  within the run.
- `stormguard` alone: its throttle cuts the dead primary 1.9 s into the outage (13.74% of the
  offered load reached it during the fault), and nothing answers for 15 s: 70.54% success, goodput
  back 2 s after the primary's return.
- `stormguard+failover`: the primary's breaker opens on the crash's first 3 failures, so 0.07% of
  the offered load reaches the dead primary during its fault (the breaker's probes), against the
  5% allowed; the secondary answers meanwhile (17,312 attempts), and a probe sent after 35 s
  closes the breaker: traffic is back on the primary 1.4 s after its return, against the 5 s
  allowed. Success is 100.00% over the run, against the 99.9% asked.
- The crash is the hard part. About 900 requests are in flight on the primary when it fails
  (0.9 s of traffic), and they go to the secondary on top of the 1,000 requests/s that now go
  there, while the secondary has room for about 180 more. Each one's retry is refused at once by
  the primary's open breaker (no backoff, nothing drawn from the budget), the failover moves it on
  (one withdrawal each), and the secondary's quota paces them: they wait their turn, up to a few
  seconds, instead of overloading it. Its peak is 0.94x its slots, never overloaded. Without the
  quota (`--pipelines stormguard+failover` with the quota taken out) the same crash puts the
  secondary at 1.17x (overloaded 2 s), its throttle and breaker mark it unhealthy while the
  primary's breaker is open too, and success falls to 96.03%.
- What fails (about 10 requests): probes into the black hole, which no answer ends before the
  request's 600 s deadline (the breaker lets one through every 0.67 s or so and does not cut it).

The scenario sets the targets for `stormguard+failover`: success >= 99.9% over the run, the
secondary never overloaded, attempts to the dead primary <= 5% of the offered load during the
outage, traffic back on the primary within 5 s of its return. All four are met (99.98%, 0.94x,
0.07%, 1.4 s), and `crates/storm/tests/targets.rs` asserts them at 400 requests/s.

![failover scenario: offered load, attempts reaching the primary and the secondary, attempts in flight to the primary and successes per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: FAILOVER_QPS,
        capacity: FAILOVER_CAPACITY,
        fault: Fault {
            start: Duration::from_secs(20),
            end: Duration::from_secs(35),
            kind: FaultKind::OutageThenBlackhole,
        },
        secondary_share: Some(FAILOVER_SECONDARY_SHARE),
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: the secondary's peak load.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    summary.failover.as_ref().map_or_else(
        || "secondary peak load -".to_owned(),
        |f| format!("secondary peak load {:.2}x", f.secondary_peak_load),
    )
}
