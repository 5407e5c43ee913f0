//! The `outage` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::pipeline::Pipeline;
use crate::scenario::{Fault, FaultKind, Scenario};

/// A total outage from 20 s to 30 s: every request fails fast with 503, in-flight work is lost.
pub const SCENARIO: Builtin = Builtin {
    name: "outage",
    help: "A total outage from 20 s to 30 s: every request fails at once with 503, and the work\n\
             in flight is lost.",
    pipelines: &[
        Pipeline::None,
        Pipeline::Naive,
        Pipeline::Tower,
        Pipeline::Stormguard,
        Pipeline::StormguardBreaker,
    ],
    build,
    headline: super::recovery,
    doc: Doc {
        before: r#"`--scenario outage` (the provider answers 503 to everything from 20 s to 30 s):"#,
        after: r#"Once its throttle has seen the outage, stormguard sends the dead provider 1% of the offered load
(naive: 412%) and is back above 95% goodput 1 s after recovery; the throttle's last second of
drops costs it 1.1 points of success against no retries at all. With a breaker, the throttle still
does the cutting (1.9 s): the breaker's 10 s window remembers the healthy calls from before the
outage and the throttle's drops are no failures, so it opens only about 7 s in, then answers with
the fallback (48,820 answers instead of the throttle's errors). Its way back is a probe's success
after a wait that a failed probe doubled: 2 s after recovery instead of 1 s, 0.6 points of success.

`--metrics` prints, after each scenario's table, what a dashboard would show of each row made of
stormguard's layers: the metrics its engine emits (`stormguard::metrics`), collected by a recorder
of the run's own from the requests of the table only (not from the arrivals that keep the load up
after the run's duration until the last of them is answered), one line per series, named as an
exporter names it (dots kept): a counter's total, a gauge's last and highest value, a histogram's
count, p50, p99 and max (durations in seconds), then the same per 10 s of the run (a counter's
increase, a gauge's highest value, a histogram's count). The table does not change: the recorder
draws and decides nothing. With `--json`, each such row's object has them under `"metrics"`. The
outage's `stormguard` row (the `stormguard+breaker` row follows it with its own):

{metrics}

Each of the 720,009 requests of the table ends once in `stormguard.request.attempts`: 580,043
successes; 24,228 failures, 23,234 with the outage's 503 when the budget refused a retry (22,927)
or the 3 attempts were spent (307), the other 994 when the throttle refused their retry; and
115,738 refused by the throttle before any attempt, 8,300 of them in the 30 s column (the
throttle's last second of drops after the outage). `stormguard.retries` counts the retries sent:
these 10,582 and 65 after the background's 500s are the table's 10,647 `retries`; the 994 retries
the throttle refused are among its 116,732 refusals (the other 115,738 are first attempts). In the
`stormguard+breaker` row, the 48,820 requests the fallback answered end with outcome `fallback`
(`error.type` `breaker_open`), the table's `fallback` column."#,
        metrics_of: Some("stormguard"),
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        fault: Fault {
            start: Duration::from_secs(20),
            end: Duration::from_secs(30),
            kind: FaultKind::Outage,
        },
        ..Scenario::healthy(SCENARIO.name)
    }
}
