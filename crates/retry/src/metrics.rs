//! What the engine counts and measures, through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`): the library records, the application picks the exporter (Prometheus,
//! OpenTelemetry, StatsD...) and installs it as the global recorder. Without a recorder every
//! call is a no-op; without the feature none of it is compiled.
//!
//! Names follow OpenTelemetry's semantic conventions where one exists
//! (`http.client.request.duration`, the `gen_ai.*` and `error.type` attributes); the others are
//! under `stormguard.`. Exporters turn the dots into what their format allows (Prometheus:
//! `stormguard_request_attempts`). Durations are in seconds, as OpenTelemetry asks.
//!
//! | name | type | unit | labels | what it is |
//! |---|---|---|---|---|
//! | `stormguard.request.attempts` | histogram | `{attempt}` | `gen_ai.provider.name`, `outcome` | attempts one request took, recorded when it ends; `outcome`: `success`, `failure` (the backend's answer or error), `refused` (refused on this side before any attempt was sent), `fallback` (the breaker's fallback answered, before or after attempts) |
//! | `stormguard.request.duration` | histogram | `s` | `gen_ai.provider.name`, `outcome`, `error.type` (all but `success`; a fallback's is `breaker_open` or `bulkhead_full`) | one request from its start to its answer, across attempts, backoffs and waits |
//! | `http.client.request.duration` | histogram | `s` | `gen_ai.provider.name`, `http.response.status_code` (when answered), `error.type` (failed attempts only) | one attempt, from sending it to the answer's head (a stream: its first content) |
//! | `stormguard.retries` | counter | `{retry}` | `gen_ai.provider.name`, `reason` | retries sent, by the classifier's reason for the failure retried (`overloaded`, `rate_limited`, `timeout`...) |
//! | `stormguard.hedges` | counter | `{hedge}` | `gen_ai.provider.name`, `outcome` | hedges (second attempts sent while the first waits for content, see `Hedging`) by what became of them: `sent`, `won` (its answer was handed back, the first attempt cancelled), `cancelled` (the first attempt answered first), `failed` (it failed while the first was in flight), and the ones not sent: `budget` (the retry budget refused it), `refused` (the rate limit, the breaker or the throttle did). A hedge sent is not a retry: `stormguard.retries` does not count it |
//! | `stormguard.refusals` | counter | `{request}` | `gen_ai.provider.name`, `cause` | requests given up on or refused on this side, by cause: `budget`, `deadline`, `attempts`, `hint` (a retry not made), `handed_on` (an attempt whose clock fired, or a 429, handed to a failover's next backend) and `throttle`, `breaker`, `rate_limit` (an attempt not sent) |
//! | `stormguard.throttle.drop_probability` | gauge | `1` | `gen_ai.provider.name` | the adaptive throttle's probability of refusing a request, 0 to 1, as of the last attempt |
//! | `stormguard.breaker.state` | gauge | `1` | `gen_ai.provider.name` | the breaker's state as of the last attempt: 0 closed, 1 half-open, 2 open |
//! | `stormguard.concurrency.limit` | gauge | `{request}` | `gen_ai.provider.name` | the concurrency limit's attempts allowed in flight, as of the last attempt's end |
//! | `stormguard.concurrency.in_flight` | gauge | `{request}` | `gen_ai.provider.name` | attempts in flight by the concurrency limit's count (a stream until its last byte), as of the last attempt's end |
//! | `stormguard.concurrency.shrunk` | counter | `{event}` | `gen_ai.provider.name` | times the concurrency limit shrank on an overload answer or a timeout |
//! | `stormguard.concurrency.grown` | counter | `{event}` | `gen_ai.provider.name` | times the concurrency limit grew by one attempt |
//! | `stormguard.rate_limit.wait` | histogram | `s` | `gen_ai.provider.name` | how long a request waited for the rate limit (0 when admitted at once) |
//! | `stormguard.rate_limit.headroom` | gauge | `{request}`, `{token}` | `gen_ai.provider.name`, `dimension` (`requests`, `tokens`) | what the rate limit could admit at once, per dimension, as of the last admission |
//! | `stormguard.streams` | counter | `{stream}` | `gen_ai.provider.name`, `outcome`, `error.type` (interrupted only) | streamed answers: `complete`, `failed_before_content` (an attempt whose stream failed before its first content: retried or not), `interrupted` (ended with `StreamInterrupted` after content; `error.type`: `error_event`, `reset`, `idle`, `no_progress`, `malformed`), `resumed` (continued by the resume hook) |
//! | `gen_ai.client.token.usage` | histogram | `{token}` | `gen_ai.provider.name`, `gen_ai.token.type` (`input`, `output`), `stormguard.attempt` | the tokens each attempt's answer said it used, once its reader has read it: `answer` (a whole answer handed back, or a stream that ended well), `continuation` (the stream of a request that continues another; the caller's stream sums it with the original's, marked), `interrupted` (a stream that ended early: what its provider reported, and billed, before the end); a failed attempt whose answer was not handed back reports nothing (OpenTelemetry's GenAI metric) |
//! | `stormguard.failovers` | counter | `{request}` | `from`, `to`, `reason` | requests moved from one backend to the next by `stormguard-failover` (`to` is `degraded` for the degraded answer) |
//!
//! `gen_ai.provider.name` is the name given with
//! [`ClientLayer::with_name`](crate::ClientLayer::with_name) (a failover's backends are named
//! already), `unknown` otherwise. Label values come from fixed sets (reasons, causes, outcomes,
//! names given in code): nothing from a request or a response becomes a label, so the number of
//! series stays bounded however hostile the traffic.
//!
//! Histogram buckets are the exporter's to set; [`DURATION_BUCKETS`], [`ATTEMPT_BUCKETS`] and
//! [`WAIT_BUCKETS`] are sized for LLM calls (up to 10 minutes, not the 10 s that HTTP defaults
//! stop at). [`describe`] registers each name's unit and description with the recorder.

/// Attempts per request (histogram, `{attempt}`).
pub const REQUEST_ATTEMPTS: &str = "stormguard.request.attempts";
/// One request across its attempts (histogram, seconds).
pub const REQUEST_DURATION: &str = "stormguard.request.duration";
/// One attempt (histogram, seconds); OpenTelemetry's HTTP client duration.
pub const ATTEMPT_DURATION: &str = "http.client.request.duration";
/// Retries sent, by reason (counter).
pub const RETRIES: &str = "stormguard.retries";
/// Hedges by what became of them (counter).
pub const HEDGES: &str = "stormguard.hedges";
/// Requests given up on or refused on this side, by cause (counter).
pub const REFUSALS: &str = "stormguard.refusals";
/// The adaptive throttle's drop probability (gauge, 0 to 1).
pub const THROTTLE_DROP_PROBABILITY: &str = "stormguard.throttle.drop_probability";
/// The breaker's state (gauge: 0 closed, 1 half-open, 2 open).
pub const BREAKER_STATE: &str = "stormguard.breaker.state";
/// The concurrency limit's attempts allowed in flight (gauge).
pub const CONCURRENCY_LIMIT: &str = "stormguard.concurrency.limit";
/// Attempts in flight by the concurrency limit's count (gauge).
pub const CONCURRENCY_IN_FLIGHT: &str = "stormguard.concurrency.in_flight";
/// Times the concurrency limit shrank (counter).
pub const CONCURRENCY_SHRUNK: &str = "stormguard.concurrency.shrunk";
/// Times the concurrency limit grew by one (counter).
pub const CONCURRENCY_GROWN: &str = "stormguard.concurrency.grown";
/// Time waited for the rate limit (histogram, seconds).
pub const RATE_LIMIT_WAIT: &str = "stormguard.rate_limit.wait";
/// What the rate limit could admit at once, per dimension (gauge).
pub const RATE_LIMIT_HEADROOM: &str = "stormguard.rate_limit.headroom";
/// Streamed answers by outcome (counter).
pub const STREAMS: &str = "stormguard.streams";
/// Requests moved from one backend to the next (counter).
pub const FAILOVERS: &str = "stormguard.failovers";
/// Tokens each attempt's answer said it used (histogram; OpenTelemetry's GenAI client metric).
pub const TOKEN_USAGE: &str = "gen_ai.client.token.usage";

/// Label: the backend's name (OpenTelemetry's `gen_ai.provider.name`).
pub const PROVIDER: &str = "gen_ai.provider.name";
/// Label: why an operation failed (OpenTelemetry's `error.type`).
pub const ERROR_TYPE: &str = "error.type";
/// Label: the answer's HTTP status (OpenTelemetry's `http.response.status_code`).
pub const STATUS_CODE: &str = "http.response.status_code";

/// Buckets for durations, in seconds: 50 ms to 10 minutes. A long generation takes minutes;
/// OpenTelemetry's HTTP default stops at 10 s, where the interesting part begins.
pub const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Buckets for attempts per request: one per count up to 6, then 8 and 10.
pub const ATTEMPT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0];

/// Buckets for rate-limit waits, in seconds: none at all, then 10 ms to a minute.
pub const WAIT_BUCKETS: &[f64] = &[0.0, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0];

/// Registers the unit and a description of every metric above with the installed recorder.
/// Call it once after installing the recorder; exporters that show help text (Prometheus'
/// `# HELP`) then have it.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

    describe_histogram!(
        REQUEST_ATTEMPTS,
        Unit::Count,
        "Attempts one request took, recorded when it ends."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "One request from its start to its answer, across attempts, backoffs and waits."
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "One attempt, from sending it to the answer's head."
    );
    describe_counter!(
        RETRIES,
        Unit::Count,
        "Retries sent, by the reason of the failure retried."
    );
    describe_counter!(
        HEDGES,
        Unit::Count,
        "Hedges (second attempts sent while the first waits), by what became of them."
    );
    describe_counter!(
        REFUSALS,
        Unit::Count,
        "Requests given up on or refused on this side, by cause."
    );
    describe_gauge!(
        THROTTLE_DROP_PROBABILITY,
        "The adaptive throttle's probability of refusing a request (0 to 1)."
    );
    describe_gauge!(
        BREAKER_STATE,
        "The breaker's state: 0 closed, 1 half-open, 2 open."
    );
    describe_gauge!(
        CONCURRENCY_LIMIT,
        Unit::Count,
        "The concurrency limit's attempts allowed in flight."
    );
    describe_gauge!(
        CONCURRENCY_IN_FLIGHT,
        Unit::Count,
        "Attempts in flight by the concurrency limit's count (a stream until its last byte)."
    );
    describe_counter!(
        CONCURRENCY_SHRUNK,
        Unit::Count,
        "Times the concurrency limit shrank on an overload answer or a timeout."
    );
    describe_counter!(
        CONCURRENCY_GROWN,
        Unit::Count,
        "Times the concurrency limit grew by one attempt."
    );
    describe_histogram!(
        RATE_LIMIT_WAIT,
        Unit::Seconds,
        "How long a request waited for the rate limit."
    );
    describe_gauge!(
        RATE_LIMIT_HEADROOM,
        "What the rate limit could admit at once, per dimension."
    );
    describe_counter!(STREAMS, Unit::Count, "Streamed answers by outcome.");
    describe_counter!(
        FAILOVERS,
        Unit::Count,
        "Requests moved from one backend to the next."
    );
    describe_histogram!(
        TOKEN_USAGE,
        "Tokens each attempt's answer said it used, by token type and attempt."
    );
}
