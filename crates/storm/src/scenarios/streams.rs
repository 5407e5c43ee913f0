//! The `streams` scenario.

use std::time::Duration;

use super::{Builtin, Doc};
use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::{Fault, FaultKind, Health, Scenario, StreamShape};
use crate::scenario::{STREAM_MEDIAN, STREAMS_QPS};

/// Share of the streams cut mid-stream (the connection fails after some content) during the
/// streams scenario's fault: 1%.
const STREAM_CUTS: f64 = 0.01;

/// Share of the streams that fail with an error event before any content during the streams
/// scenario's fault: 5%.
const STREAM_ERRORS_BEFORE_CONTENT: f64 = 0.05;

/// Concurrent slots of the streams scenario's provider at [`STREAMS_QPS`]: ample.
///
/// Little's law: 500 req/s x 4.53 s (the log-normal mean of a 4 s median) keep about 2,270 slots
/// busy; 5,000 slots leave the stream faults, not the slots, as what goes wrong.
const STREAMS_CAPACITY: u32 = 5_000;

/// Streamed answers (`text/event-stream`) at 500 requests/s: from 20 s to 40 s, 5% of the
/// streams fail with an error event before any content and 1% are cut mid-stream.
pub const SCENARIO: Builtin = Builtin {
    name: "streams",
    help: "Streamed answers (text/event-stream) at 500 requests/s: from 20 s to 40 s, 5% of the\n\
             streams fail with an error event before any content and 1% are cut mid-stream.",
    pipelines: &[
        Pipeline::Naive,
        Pipeline::Stormguard,
        Pipeline::StormguardContinuation,
    ],
    build,
    headline,
    doc: Doc {
        before: r#"`--scenario streams` replays streamed answers (`text/event-stream`) that fail after their `200`.
500 requests/s for 60 s, each answered with OpenAI's chat completion chunks on the virtual clock:
the role chunk when the provider starts on the request, then a content event of 5 tokens every
100 ms for the answer's service time (4 s at the median, about 200 tokens), then
`data: [DONE]`; 5,000 slots are ample (the load keeps about 2,270 busy). The tokens are numbered
in the answer (` t0 t1 t2 ...`), so a caller can tell a token it was shown before, or one it never
got, from the next. From 20 s to 40 s, 5% of the streams fail with an error event when their
first content was due (half Anthropic's `event: error` with `overloaded_error`, half OpenAI's
`data: {"error": ...}`), and 1% are cut mid-stream (a connection reset after 1 to all of their
content events). The provider honours an assistant prefill as a real one does: a request whose
last message is the assistant's (`" t0 ... tN"`) is answered from `tN+1` on, and is otherwise an
attempt like any other (its own service time, the same faults). Every caller reads its stream to
the end; a request succeeds when its stream is whole (`[DONE]`, no error). The rows are `naive`,
whose caller also restarts any stream that fails, before or after content, from the start (1 s
later, 3 times at most; its `tower::retry` policy only sees the `200`); `stormguard`
(`ClientLayer::default().without_continuation()`: it retries a stream that fails before its
first content event and never restarts one after it); and `stormguard+continuation`
(`ClientLayer::default()`: the same, and a stream cut after content is continued: the same
request again, with the text received appended as `{"role":"assistant","content": ...}` and
`max_tokens` reduced, its stream spliced into the caller's). The table adds eight columns:
`pre-content errors` (streams the provider failed before any content), `retried` (those another
attempt of the same request followed), `given up` (those whose error reached the caller),
`budget refused` and `out of attempts` (why), `interrupted` (streams whose caller saw them fail
after content), `duplicated tokens` (content tokens callers were shown twice) and `lost tokens`
(tokens callers never got though they got a later one: what a continuation that went on from
the wrong place would skip); the chart gets a panel for the duplicated tokens."#,
        after: r#"- `naive` restarts all 557 streams that failed before content and all 98 that were cut, and every
  request ends with a whole stream (100.00%), but each cut stream shows its caller the start of
  the answer again: 8,395 tokens shown twice, 86 per cut stream.
- `stormguard` retries 552 of its 554 streams that failed before content (none of them reaches a
  caller, 556 retries in all, under its budget: 0 refused). The other 2 are the third failure
  before content in a row of one request each: the request had sent its 3 attempts (the
  engine's `max_attempts`), and its caller gets the stream with the error event.
- `stormguard` never restarts a stream that has delivered content: the 98 cuts end with the
  in-band error event and a `StreamInterrupted` error (the content events and bytes delivered,
  and why), and 0 tokens are shown twice. Success is 99.67%: 29,958 requests less the 98 cut
  streams and the 2 given up.
- `stormguard+continuation` continues every one of its 98 cut streams: 0 reach a caller
  interrupted, 0 tokens are shown twice and 0 are lost (each continuation goes on from the token
  after the last one received, and the splice passes its content, one finish chunk and one
  `[DONE]`). Success is 99.99%: 29,958 requests less the 2 given up before content, out of
  attempts as in `stormguard`. A continuation is an attempt of the same request (same
  `x-storm-request-id`), so the provider counts it as a retry: 655 in all, 98 continuations (one
  per cut, none of them cut again), 555 retries of pre-content errors and 2 of the healthy
  provider's rare 500s, under the retry budget, which refused none. A continuation meets the
  fault like any other attempt: 5 of the 98 failed before content themselves and were retried
  (they are among this row's 557 pre-content errors).
- Streams hold their connection for their whole length: at most 2,363 to 2,378 attempts are open
  at once (Little's law: 500 x 4.53 s = 2,266 on average), and the median latency is the median
  answer's 4 s.

The scenario sets the targets for `stormguard+continuation` (the contract): at least 99.9% of the
requests answered whole, 0 tokens shown twice, 0 lost. All three are met (99.99%, 0, 0). For
`stormguard`, the stream guard alone: 0 duplicated tokens, every cut a `StreamInterrupted`, every
error before content retried under the budget, success >= 99.5%; met (0; 98 of 98; 0 refusals,
with 2 of 554 out of attempts, 5%^3 of the 10,000 requests of the fault being about 1.25
expected; 99.67%). `crates/storm/tests/targets.rs` asserts both rows' targets at 100 requests/s
for 30 s (`streams_stormguard_shows_no_token_twice_and_retries_every_pre_content_error`,
`streams_stormguard_continues_every_cut_stream_with_every_token_once`: the provider cut some
streams and none reached its caller interrupted; naive's duplicated tokens above 0).

![streams scenario: offered load, attempts reaching the provider, attempts in flight, successes and content tokens shown twice per second]({chart})"#,
        metrics_of: None,
    },
};

/// The scenario at its defaults.
fn build() -> Scenario {
    Scenario {
        qps: STREAMS_QPS,
        capacity: STREAMS_CAPACITY,
        baseline: Health {
            median: STREAM_MEDIAN,
            ..Health::HEALTHY
        },
        fault: Fault {
            start: Duration::from_secs(20),
            end: Duration::from_secs(40),
            kind: FaultKind::StreamErrors {
                before_content: STREAM_ERRORS_BEFORE_CONTENT,
                cut: STREAM_CUTS,
            },
        },
        stream: Some(StreamShape::LLM),
        ..Scenario::healthy(SCENARIO.name)
    }
}

/// The headline: content tokens shown twice and lost.
fn headline(_scenario: &Scenario, summary: &Summary) -> String {
    summary.streams.as_ref().map_or_else(
        || "duplicated tokens -, lost -".to_owned(),
        |f| {
            format!(
                "duplicated tokens {}, lost {}",
                f.duplicated_tokens, f.lost_tokens
            )
        },
    )
}
