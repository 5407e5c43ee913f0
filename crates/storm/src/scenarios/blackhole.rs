//! The `blackhole` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::BLACKHOLE_QPS;
use crate::scenario::{Fault, FaultKind, Scenario};

/// Concurrent slots of the black-hole scenario's provider at [`BLACKHOLE_QPS`]: ample.
///
/// Healthy, 1,000 req/s keep about 900 slots busy (Little's law: 1,000 x 0.91 s mean); 10,000
/// slots take even four attempts per request (naive retries' worst) with room to spare. The
/// incident is about the connections the clients hold open, not about the provider's capacity.
const BLACKHOLE_CAPACITY: u32 = 10_000;

/// The field's black hole, at 1,000 requests/s: from 20 s to 30 s the provider accepts
/// connections and never answers.
pub const SCENARIO: Builtin = Builtin {
    name: "blackhole",
    help: "At 1,000 requests/s, from 20 s to 30 s the provider accepts connections and never\n\
             answers: clients that retry on timeouts pile up open attempts.",
    pipelines: &[
        Pipeline::Naive,
        Pipeline::Tower,
        Pipeline::Stormguard,
        Pipeline::StormguardBreaker,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario blackhole` replays the breaker's incident: a provider drops every packet for 10 s, and
clients that retry on timeouts pile up connections. 1,000 requests/s with the seed's healthy
latency (log-normal, 800 ms median) and error rate (0.01%) meet a provider with ample capacity
(10,000 slots); from 20 s to 30 s it accepts connections and never answers: neither the attempts
that arrive in the window nor those in flight when it starts get an answer, until their client
drops them. Attempts sent after 30 s are answered as usual."#,
        after: r#"- `naive` waits out each attempt's 4 s timeout and sends it again 1 s later: the attempts it holds
  open climb from 900 to 9,507. Its fourth attempt, 15 s after the first, lands after the hole, so
  every request succeeds in the end, at a p99 of 15.6 s, with 3.8x the offered load in the worst
  second.
- `tower`'s budget stops most retries: 5,141 attempts open, 84.25% success.
- `stormguard` without a breaker: its throttle learns from answers, of which there are none, and
  its only clock on a whole answer is the request's size (an answer arrives when the generation
  ends: 10 s and 28 ms per `max_tokens` token, 17 s here). An attempt of the hole is abandoned
  after 17 s and retried within the budget, after the hole: 84.78% success (81.79% before the
  clocks), at 1.03x the offered load (1.54x in the worst second) and a p99 of 18.5 s; attempts the
  budget cannot retry are kept until their deadline, and 11,925 are held open at the peak.
- `stormguard+breaker`: nothing has come back for 2 s while attempts are in flight, so the stall
  detector opens the breaker 2.1 s into the hole and cuts the 2,933 attempts in flight; from then
  only half-open probes reach the provider (0.00x fault load). The fallback answers 12,291
  requests, those of the hole and those that arrive until a probe closes the breaker: 9,358 (76%)
  on arrival, the others at the cut (p99 3.1 s: requests caught in flight at 20 s that had waited
  since about 19 s). The first probe sent after 30 s is answered at 31.3 s and closes the breaker:
  goodput is back above 95% 2 s after the hole.

Against the incident's targets, the breaker cuts within 3 s (2.1 s), holds at most 4,000 attempts
open and under half of naive's (2,933 against 9,507), is back within 2 s (2 s) and answers locally
inside the hole. Success outside the hole is 100%. The 900 requests that arrived just before it
and are lost all the same are those whose attempt was in flight when it opened: no answer ever
reaches them; the cut ends them with the fallback, `tower` and `stormguard` lose them to timeouts
and deadlines, and only naive's fourth attempt, 15 s later, gets them through. Charts for every
scenario are in `docs/storm/`; `--json` prints the figures as JSON.

![blackhole scenario: offered load, attempts reaching the provider, attempts in flight, successes and fallback answers per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: BLACKHOLE_QPS,
        capacity: BLACKHOLE_CAPACITY,
        fault: Fault {
            start: Duration::from_secs(20),
            end: Duration::from_secs(30),
            kind: FaultKind::Blackhole,
        },
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: how fast traffic to the dead provider is cut.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    summary
        .cut_s
        .map_or_else(|| "cut never".to_owned(), |c| format!("cut {c:.1} s"))
}
