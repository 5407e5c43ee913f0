//! The `balance` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::{BALANCE_CAPACITY, BALANCE_QPS};
use crate::scenario::{Deployment, Fault, FaultKind, Scenario, TokenSizes};

/// Three deployments of one model (east, west and eu: 600, 800 and 1,200 ms at the median)
/// with quotas of 60%, 36% and 24% of the offered load (1,000 LLM-sized requests a second),
/// stated in OpenAI's `x-ratelimit-*` headers, 429 beyond them: how a gateway shares a rank
/// of deployments.
pub const SCENARIO: Builtin = Builtin {
    name: "balance",
    help: "Three deployments of one model at 1,000 LLM-sized requests/s: east, west and eu, 600,\n\
             800 and 1,200 ms at the median, with quotas of 60%, 36% and 24% of the load (each\n\
             stated in x-ratelimit-* headers, 429 beyond it). How the rows share the load, against\n\
             the best split the quotas allow (east 60%, west 36%, eu 4%).",
    pipelines: &[
        Pipeline::RoundRobin,
        Pipeline::OrderedFailover,
        Pipeline::StormguardBalance,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario balance` shares the load among three deployments of one model, as a gateway does with
regions, keys, or provisioned and pay-as-you-go capacity. 1,000 LLM-sized requests a second
(prompts of 100 to 4,000 tokens, `max_tokens` 50 to 2,000) for 60 s; `east`, `west` and `eu`
answer in 600, 800 and 1,200 ms at the median (log-normal, sigma 0.5) and have quotas of 50%,
30% and 20% of 1.2 times the load (60%, 36% and 24% of it, in requests and tokens a minute,
enforced per second and stated in OpenAI's `x-ratelimit-*` headers; 429 with `Retry-After`
beyond them). Every row is made of `ClientLayer::default()`; they differ in how a request finds
its deployment:

- `round-robin`: each request to the next deployment in turn, each deployment behind an engine
  of its own (its retries stay with it, after its `Retry-After`), no rate limit: a load balancer
  that knows nothing of its backends;
- `ordered-failover`: `Failover` with one backend per deployment, in order (`with_backend` each:
  today's failover), each with the default backend breaker and `RateLimit::default()`, which
  learns the deployment's quota from its headers; the next deployment takes a request only when
  the one before cannot fit it within its rate limit's 2 s wait;
- `stormguard+balance`: the same backends in one rank (`with_rank`): the balancer sends each
  request to the cheaper of two drawn by latency (peak EWMA), hops in flight and rate-limit
  headroom.

The best split the quotas allow fills the quickest deployment up to its quota, then the next:
east 60%, west 36%, eu 4%. With log-normal latencies of one shape, a quicker deployment is
quicker at every percentile, so no other split without 429s has a lower median; the model's
median for it (the deployments' latencies mixed in those shares, with no wait, no retry and no
429) is 681 ms. The table adds each deployment's share of the successes (the best split's in
brackets), the 429s against `round-robin`'s and the median against the best split's; the chart
gets a panel per deployment (its attempts, those answered 429 dashed, its quota). 11 s in
release:"#,
        after: r#"- `stormguard+balance` meets no 429 (each rate limit learned its deployment's quota from the
  first answers' headers and the balancer sends less where headroom is low), answers every
  request, and its median is 722 ms, 1.06x the best split's. It gives eu more than the best
  split does (16% against 4%): the balancer weighs load and headroom as well as latency, so it
  never fills one deployment to its quota, and pays for it 6% at the median.
- `round-robin` sends each deployment a third of the load: eu, whose quota is 24% of it,
  answers 10,403 429s; a retry goes back to eu after its `Retry-After`, the retry budget cannot
  cover them all, and 8.3% of the requests fail.
- `ordered-failover` meets 2 429s, but sends east everything until east's rate limit cannot fit
  a request within its 2 s wait: most requests wait there, and the median is 2,517 ms (3.70x).

The scenario sets the targets for `stormguard+balance`: 429s at most 1% of `round-robin`'s,
success >= 99.9%, and a median within 10% of the best split's. All three are met (0, 100%,
1.06x; 1.07x to 1.08x over seeds 1 to 3).

![balance scenario: offered load, attempts reaching each deployment and those answered 429, successes per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: BALANCE_QPS,
        capacity: BALANCE_CAPACITY,
        fault: Fault {
            start: Duration::ZERO,
            end: Duration::from_secs(60),
            kind: FaultKind::Quotas,
        },
        sizes: Some(TokenSizes::LLM),
        deployments: Deployment::balance(),
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: the median against the best split's, and the 429s.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    summary.balance.as_ref().map_or_else(
        || "p50 / best split -".to_owned(),
        |f| {
            format!(
                "p50 / best split {:.2}x, 429s {}",
                f.p50_over_best, summary.too_many_requests
            )
        },
    )
}
