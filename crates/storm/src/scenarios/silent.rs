//! The `silent` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::{
    FAILOVER_SECONDARY_SHARE, SILENCE, SILENT_DEADLINE, SILENT_QPS, SILENT_SHARE, SLOW_FIRST_TOKEN,
    STREAM_MEDIAN,
};
use crate::scenario::{Fault, FaultKind, Health, Scenario, StreamShape, StreamStart};

/// Share of the primary's streams slow to their first token during the silent scenario's
/// fault: 2% (prefills queued behind the stuck replicas' work).
const SLOW_FIRST_TOKEN_SHARE: f64 = 0.02;

/// Concurrent slots of the silent scenario's primary at [`SILENT_QPS`]: ample.
///
/// Little's law: healthy, 300 req/s x 5 s (0.5 s to the first token on average, see
/// [`StreamStart::LLM`], then 4.53 s of content, the log-normal mean of a 4 s median) keep about
/// 1,500 slots busy; in the fault the silent attempts hold theirs [`SILENCE`] longer (90 a
/// second for 20 s: 1,800 more). 5,000 slots leave the silence, not the slots, as what goes
/// wrong. The secondary has [`FAILOVER_SECONDARY_SHARE`] of them (3,000): the whole load alone
/// at half its slots.
const SILENT_CAPACITY: u32 = 5_000;

/// Two providers and streamed answers under a 30 s deadline, at 300 requests/s: from 20 s
/// to 40 s, 30% of the primary's attempts get no response head for 20 s, and 2% of its
/// streams wait 10 s to 20 s for their first token.
pub const SCENARIO: Builtin = Builtin {
    name: "silent",
    help: "Two providers, streamed answers and a 30 s deadline at 300 requests/s: from 20 s to\n\
             40 s, 30% of the primary's attempts get no response head for 20 s and 2% of its\n\
             streams wait 10 s to 20 s for their first token.",
    pipelines: &[
        Pipeline::NaiveFailover,
        Pipeline::Tower,
        Pipeline::Stormguard,
        Pipeline::StormguardFailoverNoClocks,
        Pipeline::StormguardFailover,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario silent` replays a provider that takes attempts and says nothing, behind a failover.
Two providers, as in `failover` (5,000 slots on the primary, ample: the load keeps about 1,500
busy; the secondary has 60% of them and is healthy throughout), 300 requests/s for 60 s, each a
streamed chat completion that asks for a stream (`"stream": true`) under a 30 s deadline: every
caller gives up then, and stormguard's layer is given it (`.with_timeout(30 s)`). A stream's head
comes 200 ms after the provider starts on it and its first token 300 ms after the head (medians,
log-normal; about half a second to the first token, 1.27 s at the p99), then 5 tokens every
100 ms for 4 s at the median, as in `streams`. From 20 s to 40 s, 30% of the primary's attempts
get no response head for 20 s (they hold their slot, as on a stuck replica), then their answer as
usual; 2% of its streams wait 10 s to 20 s after their head for their first token. A request
succeeds when its caller has read its whole stream within the deadline, and its latency runs to
the stream's end (a request given up counts its 30 s). The rows are `naive+failover`, `tower` and
`stormguard` on the primary alone, and stormguard's failover without and with its per-attempt
clocks (`stormguard+failover-no-clocks`, `stormguard+failover`). The table adds, after the
failover's columns, `healthy p99` (the p99 latency of the requests that arrived before the fault,
in the same run), `p99 / healthy`, and the primary's counts of `silent attempts` and
`slow first tokens` (the streams' columns are left out: no stream fails here). 60 s take 13 s:"#,
        after: r#"- `stormguard+failover-no-clocks`: nothing tells the failover to leave a silent attempt (no
  attempt reaches the secondary). Each of the 1,778 waits out its 20 s, so the p99 is 28.7 s,
  2.13x the healthy 13.5 s, and the 107 requests whose answer does not fit in the 10 s left end at
  their deadline (99.40%); at the peak the callers hold 3,126 attempts open.
- `stormguard+failover`: the primary's clocks learn in the first 20 s (heads at a p99 of about
  0.6 s, first tokens about 1 s; times 3, raised to the floors): a silent attempt is abandoned 3 s
  after it was sent, a slow first token 5 s after its head, and the failover hands the request to
  the secondary at once (4,369 attempts reach the secondary). Fired clocks in a row open the
  primary's breaker now and then, so 37% of the offered load reaches the primary during the
  fault and 651 attempts meet the silence. 99.96% succeed, and the p99 is 16.1 s, 1.19x the
  healthy p99.
- A hand-off after an attempt was sent is a retry, drawn from the request's retry budget
  (`RetryBudget::default()`: 10% of the successes, plus 1 a second, over 10 s), which allows about
  31 a second at this load, less than the clocks fire in the fault. When the budget cannot pay for
  a hand-off (or, without a failover, for a retry, or the request has no attempt left), the
  engine keeps the attempt whose clock fired instead of abandoning it: it may still answer within
  the deadline, and here most do, after their 20 s of silence. Those are the requests that make
  the p99 (before the engine kept them, the same run answered 98.74% at 1.01x: the refused
  hand-offs ended their requests 27 s before their deadline).
- `stormguard` on the primary alone has the same clocks, but its retry goes back to the primary
  (silent again 30% of the time), and its budget refuses most of them; a clock it cannot retry
  keeps its attempt, whose answer comes after the silence: 99.36%, at a p99 of 28.9 s (2.14x). `tower` on the
  primary alone cuts a silent head at its 4 s attempt timeout and retries within its `TpsBudget`
  (20%): 96.79%.
- `naive+failover` meets both targets here (99.98%, 1.14x): its 4 s attempt timeout ends at the
  response head, so it cuts a silent attempt after 4 s and sends it to the secondary at once,
  with no budget (it waits out a slow first token: the head came). What sending every failure on
  without a budget or a breaker costs shows in `failover` (45.47%, the secondary overloaded).
- Latency here runs to the stream's end, as in `streams`, so a healthy 4 s answer makes the
  healthy p99 13.5 s. Counted to the first token instead, the head clock's 3 s floor alone is
  2.4x the healthy first-token p99 (1.27 s, the p99 of the engine's `stormguard.request.duration`
  of the primary's successes, which ends at the first content event).

The scenario sets the targets for `stormguard+failover` (the clocks' contract): p99 latency at
most twice the healthy p99, and success >= 99.9%; both are met (1.19x, 99.96%).
`crates/storm/tests/targets.rs` asserts both at 300 requests/s for 45 s, with the row without
clocks worse (its p99 above 20 s and its success under 99.9%).

![silent scenario: offered load, attempts reaching the primary and the secondary, attempts in flight to the primary and successes per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: SILENT_QPS,
        capacity: SILENT_CAPACITY,
        baseline: Health {
            median: STREAM_MEDIAN,
            ..Health::HEALTHY
        },
        fault: Fault {
            start: Duration::from_secs(20),
            end: Duration::from_secs(40),
            kind: FaultKind::Silent {
                silent: SILENT_SHARE,
                silence: SILENCE,
                slow: SLOW_FIRST_TOKEN_SHARE,
                slow_first_token: SLOW_FIRST_TOKEN,
            },
        },
        stream: Some(StreamShape {
            start: Some(StreamStart::LLM),
            ..StreamShape::LLM
        }),
        secondary_share: Some(FAILOVER_SECONDARY_SHARE),
        deadline: Some(SILENT_DEADLINE),
        asks_for_stream: true,
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: the p99 latency against the healthy p99.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    summary.p99_over_healthy().map_or_else(
        || "p99 / healthy -".to_owned(),
        |ratio| format!("p99 / healthy {ratio:.2}x"),
    )
}
