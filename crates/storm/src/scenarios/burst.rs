//! The `burst` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::{Arrivals, Bursts, Fault, FaultKind, Scenario, TokenSizes};
use crate::scenario::{
    BURST_AVERAGE_SHARE, BURST_REQUESTS_PER_MINUTE, BURST_TOKENS_PER_MINUTE, DEFAULT_DURATION,
};

/// Concurrent slots of the burst scenario's provider: ample.
///
/// The quota admits at most 166.7 requests a second (and a second's worth at once), which keep
/// about 150 slots busy (Little's law: 166.7 x 0.91 s mean); 1,500 slots leave the quota, not the
/// slots, as the only limit.
const BURST_CAPACITY: u32 = 1_500;

/// Bursts above a provider's quota of requests and tokens a minute: traffic averages 70% of
/// the quota and comes in bursts of 2x to 3x it; beyond the quota the provider answers 429.
pub const SCENARIO: Builtin = Builtin {
    name: "burst",
    help: "A quota of requests and tokens a minute for LLM-sized requests: traffic averages 70%\n\
             of it and comes in bursts of 2x to 3x it; beyond the quota the provider answers 429.",
    pipelines: &[
        Pipeline::Naive,
        Pipeline::Tower,
        Pipeline::Stormguard,
        Pipeline::StormguardRateLimit,
        Pipeline::StormguardAdaptive,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario burst` replays the rate limit's incident: bursts of traffic above a provider's quota.
Sent as they came, the excess met 429s; pacing the bursts at the client with a bounded wait (2 s)
instead cut 429s by 91.4% and raised success from 88.2% to 99.85%. The provider has a quota of
10,000 requests and 30,000,000 tokens a minute, enforced per second as providers do: one token
bucket per dimension, refilled continuously at a sixtieth of the quota a second and holding one
second's worth. A request takes 1 request and its prompt + `max_tokens` tokens when admitted (as
OpenAI counts it); one that does not fit gets 429 at once with `Retry-After` (the wait until it
would fit, in whole seconds: 1). Every answer carries OpenAI's `x-ratelimit-limit-*`,
`x-ratelimit-remaining-*` and `x-ratelimit-reset-*` headers for requests and tokens, and, like
OpenAI's, they describe the minute: one request from a full bucket reads `9999` and `6ms`, and
`remaining` never falls below 9,833 of 10,000 while the per-second enforcement refuses. What a
client learns from them is the limits. Requests are chat completions whose JSON body the engine
weighs (prompt text at 4 bytes a token, plus `max_tokens`): prompts of 100 to 4,000 tokens and
`max_tokens` of 50 to 2,000, uniform, 3,075 tokens on average, so tokens are the tighter quota
(162.6 requests a second against 166.7). Traffic averages 70% of it (113.8 requests/s) and comes in bursts
every 10 s from 3 s: 2x the quota for 2 s, 2.5x for 1.33 s, 3x for 1 s, in turn; between them 37%
to 44%. Service times are the seed's healthy ones; 1,500 slots leave the quota as the only limit.

The calibration is the incident's: each burst sends 2 s of quota above the quota, which a 2 s
queue absorbs. The provider's one-second bucket (and a client limit of the same size) takes a
second of it, so a client that paces the burst makes its last request wait about 1 s (1.03 s at
most in this run), within the 2 s it may wait; a client that sends the burst as it comes meets
429s for about a second of quota (160 requests) per burst. Were the excess beyond the bucket more
than 2 s of quota, the tail of every burst would need a longer wait than 2 s and no bounded pacing
could answer it. 60 s take 0.2 s:"#,
        after: r#"- `naive` sends each burst as it comes: 1,186 429s. Its retries, 1 s apart, land in the calm after
  the burst, so every request is answered in the end, for 17% more attempts (3.16x the offered
  load in the worst second) and a p99 of 3.3 s.
- `tower` backs off exponentially from 50 ms and reads no `Retry-After`: its 3 retries fall in the
  same burst (1,465 early retries), it meets 2,246 429s and answers 88.53%, close to the incident's
  88.2% before pacing.
- `stormguard` without a rate limit waits out each `Retry-After` (0 early retries) but meets 905
  429s, and its retry budget (10% of successes, plus 1 a second) covers about half of a burst's:
  428 requests end with the provider's 429 (93.72% success).
- `stormguard+rate-limit` paces the bursts inside the quota: 0 429s (100% fewer than naive, the
  target was 95%), every request answered (100.00%, the target 99.85%), 1.00x the offered load.
  The wait shows in the median (962 ms against stormguard's 803 ms); the p99 (2.8 s) stays under
  naive's (3.3 s).
- `stormguard+adaptive` learns both limits from the first answer's headers, within the first
  second and before the first burst, and from then on paces exactly as the configured limit: the
  same numbers (0 429s, the target was 80% fewer than naive). Its lines in the chart lie on the
  configured row's.

With `--qps`, the quota scales with the load. A limit keeps its rate as whole nanoseconds per
unit, rounded up, so that it never runs ahead of the provider: at a scaled quota whose interval
is not whole (`--qps 57 --duration 30`: 15,023,571 tokens a minute, 3,993.7 ns a token) the
configured and adaptive rows still meet no 429 and answer all 1,689 requests (naive: 288 429s).

![burst scenario: offered load, attempts reaching the provider and those answered 429, attempts in flight and successes per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: Bursts::builtin().quota * BURST_AVERAGE_SHARE,
        capacity: BURST_CAPACITY,
        fault: Fault {
            start: Duration::ZERO,
            end: DEFAULT_DURATION,
            kind: FaultKind::RateLimit {
                requests_per_minute: BURST_REQUESTS_PER_MINUTE,
                tokens_per_minute: BURST_TOKENS_PER_MINUTE,
            },
        },
        arrivals: Arrivals::Bursts(Bursts::builtin()),
        sizes: Some(TokenSizes::LLM),
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: the 429s.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    format!("429s {}", summary.too_many_requests)
}
