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
//! | `gen_ai.client.token.usage` | histogram | `{token}` | the GenAI attributes, `gen_ai.response.model`, `gen_ai.token.type` (`input`, `output`), `stormguard.attempt` | the tokens each attempt's answer said it used, once its reader has read it: `answer` (a whole answer handed back, or a stream that ended well), `continuation` (the stream of a request that continues another; the caller's stream sums it with the original's, marked), `interrupted` (a stream that ended early: what its provider reported, and billed, before the end); a failed attempt whose answer was not handed back reports nothing (OpenTelemetry's GenAI metric) |
//! | `stormguard.failovers` | counter | `{request}` | `from`, `to`, `reason` | requests moved from one backend to the next by `stormguard-failover` (`to` is `degraded` for the degraded answer) |
//! | `gen_ai.client.operation.duration` | histogram | `s` | the GenAI attributes, `gen_ai.response.model` (streams), `error.type` (failures: as `stormguard.request.duration`'s) | one request, as its caller sees it: from its start, across attempts and backoffs, to its answer's head, or for an event stream the engine guards, to the stream's end (an interrupted stream's `error.type` is its interruption's; a stream its reader drops before its end records none) |
//! | `gen_ai.client.operation.time_to_first_chunk` | histogram | `s` | the GenAI attributes | a stream's first content event, timed from the request's start (retries and hedges included) |
//! | `gen_ai.client.operation.time_per_output_chunk` | histogram | `s` | the GenAI attributes | one figure per content event after the first: the time since the one before (the stream's own events, not a continuation's) |
//!
//! ## The GenAI conventions' two generations
//!
//! OpenTelemetry's GenAI conventions left `open-telemetry/semantic-conventions` (the last release
//! with them is v1.41: `model/gen-ai/metrics.yaml`) for `open-telemetry/semantic-conventions-genai`
//! (pinned here at tag v0.1.0, `docs/gen-ai/client-inference.md`), which renamed the client
//! metrics. The engine records one generation per process, [`GenAiNames`]: the current names in
//! the table above by default, the latest when `OTEL_SEMCONV_STABILITY_OPT_IN` (a comma-separated
//! list, read once) lists `gen_ai_latest_experimental`, or when the application chose them with
//! [`GenAiNames::choose`]. Under the latest names an inference (`gen_ai.operation.name` `chat`,
//! `text_completion` or `generate_content`) records these instead of the current four:
//!
//! | name | type | unit | labels | in place of |
//! |---|---|---|---|---|
//! | `gen_ai.client.inference.duration` | histogram | `s` | as `gen_ai.client.operation.duration` | `gen_ai.client.operation.duration` |
//! | `gen_ai.client.inference.time_to_first_chunk` | histogram | `s` | the GenAI attributes | `gen_ai.client.operation.time_to_first_chunk` |
//! | `gen_ai.client.inference.time_per_output_chunk` | histogram | `s` | the GenAI attributes | `gen_ai.client.operation.time_per_output_chunk` |
//! | `gen_ai.client.inference.usage.input_tokens`, `gen_ai.client.inference.usage.output_tokens` | counter | `{token}` | as `gen_ai.client.token.usage` without `gen_ai.token.type`, with `gen_ai.token.modality` | `gen_ai.client.token.usage` |
//! | `gen_ai.client.inference.operation.input_tokens`, `gen_ai.client.inference.operation.output_tokens` | histogram | `{token}` | as `gen_ai.client.token.usage` without `gen_ai.token.type` | `gen_ai.client.token.usage` |
//!
//! `gen_ai.token.modality` is `unknown`: the providers' usage totals (cache reads and writes
//! counted as input, as [`TokenCounts`](stormguard_classify::usage::TokenCounts) reads them)
//! are not split by modality, and the cache and reasoning counters of the latest generation are
//! not recorded. Other operations (`embeddings`, `_OTHER`) keep the current names under both.
//!
//! **The GenAI attributes** every `gen_ai.*` figure carries: `gen_ai.provider.name`;
//! `gen_ai.operation.name` ([`operation_name`] of the request's path); `gen_ai.request.model`
//! (the `model` of the request's body, read once when the body is buffered for replay, or the
//! model in Gemini's path; absent when neither names one); `server.address` and `server.port`
//! (the request URI's host, and its port or the scheme's). The token figures and a stream's
//! duration also carry `gen_ai.response.model`: the model the answer names (a whole answer's
//! `model` or Gemini's `modelVersion`, read when its reader reads it; a stream's first usage
//! event's). A whole answer's duration is recorded at its head, before its body names it, so it
//! goes without. The models are read with
//! [`model_named`](stormguard_classify::usage::model_named), which looks for the key and parses
//! nothing else.
//!
//! `gen_ai.provider.name` is the name given with
//! [`ClientLayer::with_name`](crate::ClientLayer::with_name) (a failover's backends are named
//! already), `unknown` otherwise. Label values come from fixed sets (reasons, causes, outcomes,
//! names given in code), so the number of series stays bounded however hostile the traffic; the
//! only ones a request or an answer writes, `gen_ai.request.model`, `gen_ai.response.model` and
//! `server.address`, are bounded per process: the first [`MAX_LABEL_VALUES`] distinct values of
//! each keep their names, later ones become [`OTHER`] (`_OTHER`, OpenTelemetry's fallback value),
//! as does a value over [`MAX_LABEL_LEN`] bytes or with characters other than letters, digits and
//! `-._:/@+`.
//!
//! Histogram buckets are the exporter's to set; [`DURATION_BUCKETS`], [`ATTEMPT_BUCKETS`] and
//! [`WAIT_BUCKETS`] are sized for LLM calls (up to 10 minutes, not the 10 s that HTTP defaults
//! stop at), and [`GEN_AI_DURATION_BUCKETS`] and [`GEN_AI_TOKEN_BUCKETS`] are the GenAI
//! conventions' own for their `gen_ai.*` histograms. [`describe`] registers each name's unit and description with the recorder.

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

/// The operation's duration, current generation (histogram, seconds; semantic-conventions v1.41).
pub const OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
/// Time to a stream's first content, current generation (histogram, seconds).
pub const TIME_TO_FIRST_CHUNK: &str = "gen_ai.client.operation.time_to_first_chunk";
/// Time between a stream's content events, current generation (histogram, seconds).
pub const TIME_PER_OUTPUT_CHUNK: &str = "gen_ai.client.operation.time_per_output_chunk";
/// An inference's duration, latest generation (histogram, seconds; semantic-conventions-genai
/// v0.1.0).
pub const INFERENCE_DURATION: &str = "gen_ai.client.inference.duration";
/// Time to a stream's first content, latest generation (histogram, seconds).
pub const INFERENCE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.client.inference.time_to_first_chunk";
/// Time between a stream's content events, latest generation (histogram, seconds).
pub const INFERENCE_TIME_PER_OUTPUT_CHUNK: &str = "gen_ai.client.inference.time_per_output_chunk";
/// Input tokens used, latest generation (counter, by `gen_ai.token.modality`).
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.client.inference.usage.input_tokens";
/// Output tokens used, latest generation (counter, by `gen_ai.token.modality`).
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.client.inference.usage.output_tokens";
/// Input tokens per inference, latest generation (histogram).
pub const OPERATION_INPUT_TOKENS: &str = "gen_ai.client.inference.operation.input_tokens";
/// Output tokens per inference, latest generation (histogram).
pub const OPERATION_OUTPUT_TOKENS: &str = "gen_ai.client.inference.operation.output_tokens";

/// Label: the backend's name (OpenTelemetry's `gen_ai.provider.name`).
pub const PROVIDER: &str = "gen_ai.provider.name";
/// Label: why an operation failed (OpenTelemetry's `error.type`).
pub const ERROR_TYPE: &str = "error.type";
/// Label: the answer's HTTP status (OpenTelemetry's `http.response.status_code`).
pub const STATUS_CODE: &str = "http.response.status_code";
/// Label: what the request asks for (OpenTelemetry's `gen_ai.operation.name`), from its path.
pub const OPERATION_NAME: &str = "gen_ai.operation.name";
/// Label: the model the request names (OpenTelemetry's `gen_ai.request.model`), bounded.
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
/// Label: the model the answer names (OpenTelemetry's `gen_ai.response.model`), bounded.
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
/// Label: the host the attempts go to (OpenTelemetry's `server.address`), bounded.
pub const SERVER_ADDRESS: &str = "server.address";
/// Label: the port the attempts go to (OpenTelemetry's `server.port`).
pub const SERVER_PORT: &str = "server.port";
/// Label: input or output (OpenTelemetry's `gen_ai.token.type`, current generation).
pub const TOKEN_TYPE: &str = "gen_ai.token.type";
/// Label: the tokens' modality (OpenTelemetry's `gen_ai.token.modality`, latest generation).
pub const TOKEN_MODALITY: &str = "gen_ai.token.modality";

/// The value that stands for any value beyond a label's bound, and for a value that is no fit
/// label (too long, or with characters outside letters, digits and `-._:/@+`): OpenTelemetry's
/// fallback value.
pub const OTHER: &str = "_OTHER";

/// How many distinct values each of `gen_ai.request.model`, `gen_ai.response.model` and
/// `server.address` takes in one process: the first ones seen keep their names, every later
/// one is [`OTHER`]. A model name comes from a request or an answer, so from whoever writes
/// them; without a bound, a caller naming a new model on each request would make a new series
/// each time.
pub const MAX_LABEL_VALUES: usize = 64;

/// The longest value such a label keeps (longer ones are [`OTHER`]), in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// Which generation of OpenTelemetry's GenAI metric names the engine records.
///
/// The GenAI conventions left `open-telemetry/semantic-conventions` (whose last release with
/// them, v1.41, names [`OPERATION_DURATION`], [`TOKEN_USAGE`], [`TIME_TO_FIRST_CHUNK`] and
/// [`TIME_PER_OUTPUT_CHUNK`]) for `open-telemetry/semantic-conventions-genai` (tag v0.1.0,
/// `docs/gen-ai/client-inference.md`: [`INFERENCE_DURATION`], the inference chunk timings, the
/// usage counters by modality and the per-inference token histograms). As OpenTelemetry's
/// instrumentations do, the engine keeps the current names unless
/// `OTEL_SEMCONV_STABILITY_OPT_IN` lists `gen_ai_latest_experimental`.
///
/// ```
/// use stormguard_retry::metrics::GenAiNames;
///
/// assert_eq!(GenAiNames::from_opt_in(None), GenAiNames::Current);
/// assert_eq!(GenAiNames::from_opt_in(Some("http, gen_ai_latest_experimental")), GenAiNames::Latest);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GenAiNames {
    /// semantic-conventions v1.41's names: the default.
    #[default]
    Current,
    /// semantic-conventions-genai v0.1.0's names, for inference operations (`chat`,
    /// `text_completion`, `generate_content`); other operations keep the current names.
    Latest,
}

impl GenAiNames {
    /// The environment variable that picks the generation.
    pub const OPT_IN_VARIABLE: &str = "OTEL_SEMCONV_STABILITY_OPT_IN";
    /// The entry of that variable's comma-separated list that picks [`Latest`](Self::Latest).
    pub const OPT_IN_LATEST: &str = "gen_ai_latest_experimental";

    /// The generation a value of `OTEL_SEMCONV_STABILITY_OPT_IN` picks (`None`: unset).
    pub fn from_opt_in(value: Option<&str>) -> Self {
        let latest = value.is_some_and(|list| {
            list.split(',')
                .any(|entry| entry.trim() == Self::OPT_IN_LATEST)
        });
        if latest { Self::Latest } else { Self::Current }
    }

    /// The generation the process records: the one [`choose`](Self::choose) set, else the
    /// one the environment variable picks, read once, the first time a request records.
    pub fn of_process() -> Self {
        *PROCESS_NAMES.get_or_init(|| {
            let value = std::env::var(Self::OPT_IN_VARIABLE).ok();
            Self::from_opt_in(value.as_deref())
        })
    }

    /// Makes this the generation the process records, in place of what the environment says:
    /// for an application that configures OpenTelemetry in code, and for tests. Call it before
    /// the first request; once the generation is set (by this, or by a request reading the
    /// environment), it holds, and a different choice is refused with the one that holds.
    pub fn choose(self) -> Result<(), Self> {
        let chosen = *PROCESS_NAMES.get_or_init(|| self);
        if chosen == self { Ok(()) } else { Err(chosen) }
    }
}

/// The generation of names the process records, set once.
static PROCESS_NAMES: std::sync::OnceLock<GenAiNames> = std::sync::OnceLock::new();

/// `gen_ai.operation.name` of a request to `path`, from the APIs' paths: OpenAI's
/// `/chat/completions` and `/responses` and Anthropic's `/messages` are `chat`, `/completions`
/// is `text_completion`, `/embeddings` (and Gemini's `:embedContent`) `embeddings`, Gemini's
/// `:generateContent` and `:streamGenerateContent` `generate_content`; Ollama's `/api/chat`,
/// `/api/generate` and `/api/embed` likewise. Any other path is [`OTHER`].
///
/// ```
/// use stormguard_retry::metrics::operation_name;
///
/// assert_eq!(operation_name("/v1/chat/completions"), "chat");
/// assert_eq!(operation_name("/v1beta/models/gemini-2.0-flash:streamGenerateContent"), "generate_content");
/// assert_eq!(operation_name("/v1/models"), "_OTHER");
/// ```
pub fn operation_name(path: &str) -> &'static str {
    let path = path.trim_end_matches('/');
    // Google's custom methods: `{resource}:{method}`, after the last slash.
    if let Some((_, method)) = path.rsplit_once(':')
        && !method.contains('/')
    {
        return match method {
            "generateContent" | "streamGenerateContent" => "generate_content",
            "embedContent" | "batchEmbedContents" => "embeddings",
            _ => OTHER,
        };
    }
    const BY_SUFFIX: &[(&str, &str)] = &[
        ("/chat/completions", "chat"),
        ("/completions", "text_completion"),
        ("/responses", "chat"),
        ("/messages", "chat"),
        ("/embeddings", "embeddings"),
        ("/api/chat", "chat"),
        ("/api/generate", "text_completion"),
        ("/api/embed", "embeddings"),
    ];
    BY_SUFFIX
        .iter()
        .find(|(suffix, _)| path.ends_with(suffix))
        .map_or(OTHER, |(_, name)| name)
}

/// Whether the operation `name` (see [`operation_name`]) is an inference, which the latest
/// generation's `gen_ai.client.inference.*` names cover.
pub fn is_inference(name: &str) -> bool {
    matches!(name, "chat" | "text_completion" | "generate_content")
}

/// Buckets for durations, in seconds: 50 ms to 10 minutes. A long generation takes minutes;
/// OpenTelemetry's HTTP default stops at 10 s, where the interesting part begins.
pub const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Buckets for attempts per request: one per count up to 6, then 8 and 10.
pub const ATTEMPT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0];

/// Buckets for rate-limit waits, in seconds: none at all, then 10 ms to a minute.
pub const WAIT_BUCKETS: &[f64] = &[0.0, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0];

/// Buckets for the GenAI durations and chunk timings, in seconds, as both generations of the
/// conventions recommend them (semantic-conventions v1.41, semantic-conventions-genai v0.1.0):
/// 10 ms doubling to 81.92 s.
pub const GEN_AI_DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// Buckets for the GenAI token histograms, as both generations recommend them: 1 token,
/// quadrupling to 67,108,864.
pub const GEN_AI_TOKEN_BUCKETS: &[f64] = &[
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

/// Every histogram the engine records, with the buckets sized for it: what an exporter that takes
/// buckets per metric is given (Prometheus': `PrometheusBuilder::set_buckets_for_metric`), so that
/// each is a histogram of a fixed size. Without buckets, Prometheus' exporter keeps a summary per
/// series instead, whose sketches grow with what it sees.
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    (REQUEST_DURATION, DURATION_BUCKETS),
    (ATTEMPT_DURATION, DURATION_BUCKETS),
    (REQUEST_ATTEMPTS, ATTEMPT_BUCKETS),
    (RATE_LIMIT_WAIT, WAIT_BUCKETS),
    (TOKEN_USAGE, GEN_AI_TOKEN_BUCKETS),
    (OPERATION_DURATION, GEN_AI_DURATION_BUCKETS),
    (TIME_TO_FIRST_CHUNK, GEN_AI_DURATION_BUCKETS),
    (TIME_PER_OUTPUT_CHUNK, GEN_AI_DURATION_BUCKETS),
    (INFERENCE_DURATION, GEN_AI_DURATION_BUCKETS),
    (INFERENCE_TIME_TO_FIRST_CHUNK, GEN_AI_DURATION_BUCKETS),
    (INFERENCE_TIME_PER_OUTPUT_CHUNK, GEN_AI_DURATION_BUCKETS),
    (OPERATION_INPUT_TOKENS, GEN_AI_TOKEN_BUCKETS),
    (OPERATION_OUTPUT_TOKENS, GEN_AI_TOKEN_BUCKETS),
];

use metrics::Unit;

/// What kind of metric a name is, for [`describe`].
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric above: its kind, its unit if it has one, and what it measures.
const DESCRIPTIONS: &[(&str, Kind, Option<Unit>, &str)] = &[
    (
        REQUEST_ATTEMPTS,
        Kind::Histogram,
        Some(Unit::Count),
        "Attempts one request took, recorded when it ends.",
    ),
    (
        REQUEST_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        "One request from its start to its answer, across attempts, backoffs and waits.",
    ),
    (
        ATTEMPT_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        "One attempt, from sending it to the answer's head.",
    ),
    (
        RETRIES,
        Kind::Counter,
        Some(Unit::Count),
        "Retries sent, by the reason of the failure retried.",
    ),
    (
        HEDGES,
        Kind::Counter,
        Some(Unit::Count),
        "Hedges (second attempts sent while the first waits), by what became of them.",
    ),
    (
        REFUSALS,
        Kind::Counter,
        Some(Unit::Count),
        "Requests given up on or refused on this side, by cause.",
    ),
    (
        THROTTLE_DROP_PROBABILITY,
        Kind::Gauge,
        None,
        "The adaptive throttle's probability of refusing a request (0 to 1).",
    ),
    (
        BREAKER_STATE,
        Kind::Gauge,
        None,
        "The breaker's state: 0 closed, 1 half-open, 2 open.",
    ),
    (
        CONCURRENCY_LIMIT,
        Kind::Gauge,
        Some(Unit::Count),
        "The concurrency limit's attempts allowed in flight.",
    ),
    (
        CONCURRENCY_IN_FLIGHT,
        Kind::Gauge,
        Some(Unit::Count),
        "Attempts in flight by the concurrency limit's count (a stream until its last byte).",
    ),
    (
        CONCURRENCY_SHRUNK,
        Kind::Counter,
        Some(Unit::Count),
        "Times the concurrency limit shrank on an overload answer or a timeout.",
    ),
    (
        CONCURRENCY_GROWN,
        Kind::Counter,
        Some(Unit::Count),
        "Times the concurrency limit grew by one attempt.",
    ),
    (
        RATE_LIMIT_WAIT,
        Kind::Histogram,
        Some(Unit::Seconds),
        "How long a request waited for the rate limit.",
    ),
    (
        RATE_LIMIT_HEADROOM,
        Kind::Gauge,
        None,
        "What the rate limit could admit at once, per dimension.",
    ),
    (
        STREAMS,
        Kind::Counter,
        Some(Unit::Count),
        "Streamed answers by outcome.",
    ),
    (
        FAILOVERS,
        Kind::Counter,
        Some(Unit::Count),
        "Requests moved from one backend to the next.",
    ),
    (
        TOKEN_USAGE,
        Kind::Histogram,
        None,
        "Tokens each attempt's answer said it used, by token type and attempt.",
    ),
    (
        OPERATION_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        "GenAI operation duration.",
    ),
    (
        INFERENCE_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        "GenAI inference duration.",
    ),
    (
        TIME_TO_FIRST_CHUNK,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time to a stream's first chunk, from the request's start.",
    ),
    (
        INFERENCE_TIME_TO_FIRST_CHUNK,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time to a stream's first chunk, from the request's start.",
    ),
    (
        TIME_PER_OUTPUT_CHUNK,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time between a stream's output chunks.",
    ),
    (
        INFERENCE_TIME_PER_OUTPUT_CHUNK,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time between a stream's output chunks.",
    ),
    (
        USAGE_INPUT_TOKENS,
        Kind::Counter,
        None,
        "Input tokens used by inferences.",
    ),
    (
        USAGE_OUTPUT_TOKENS,
        Kind::Counter,
        None,
        "Output tokens used by inferences.",
    ),
    (
        OPERATION_INPUT_TOKENS,
        Kind::Histogram,
        None,
        "Input tokens used per inference.",
    ),
    (
        OPERATION_OUTPUT_TOKENS,
        Kind::Histogram,
        None,
        "Output tokens used per inference.",
    ),
];

/// Registers the unit and a description of every metric above with the installed recorder.
/// Call it once after installing the recorder; exporters that show help text (Prometheus'
/// `# HELP`) then have it.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};

    for &(name, kind, unit, what) in DESCRIPTIONS {
        match (kind, unit) {
            (Kind::Counter, Some(unit)) => describe_counter!(name, unit, what),
            (Kind::Counter, None) => describe_counter!(name, what),
            (Kind::Gauge, Some(unit)) => describe_gauge!(name, unit, what),
            (Kind::Gauge, None) => describe_gauge!(name, what),
            (Kind::Histogram, Some(unit)) => describe_histogram!(name, unit, what),
            (Kind::Histogram, None) => describe_histogram!(name, what),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_described_once_and_every_histogram_has_its_buckets() {
        let names: Vec<&str> = DESCRIPTIONS.iter().map(|(name, ..)| *name).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        let histograms: Vec<&str> = DESCRIPTIONS
            .iter()
            .filter(|(_, kind, ..)| matches!(kind, Kind::Histogram))
            .map(|(name, ..)| *name)
            .collect();
        let mut bucketed: Vec<&str> = HISTOGRAM_BUCKETS.iter().map(|(name, _)| *name).collect();
        let mut histograms_sorted = histograms.clone();
        histograms_sorted.sort_unstable();
        bucketed.sort_unstable();
        assert_eq!(histograms_sorted, bucketed);
        assert_eq!(names.len(), 27);
    }

    #[test]
    fn the_opt_in_list_picks_the_latest_names_only_when_it_names_them() {
        for value in [
            "gen_ai_latest_experimental",
            "http,gen_ai_latest_experimental",
            " database , gen_ai_latest_experimental ",
            "gen_ai_latest_experimental,http/dup",
        ] {
            assert_eq!(
                GenAiNames::from_opt_in(Some(value)),
                GenAiNames::Latest,
                "{value:?}"
            );
        }
        for value in [
            None,
            Some(""),
            Some("http"),
            Some("gen_ai_latest_experimental_x"),
            Some("gen_ai_latest"),
            Some("GEN_AI_LATEST_EXPERIMENTAL"),
            Some("http;gen_ai_latest_experimental"),
        ] {
            assert_eq!(
                GenAiNames::from_opt_in(value),
                GenAiNames::Current,
                "{value:?}"
            );
        }
        assert_eq!(GenAiNames::default(), GenAiNames::Current);
    }

    #[test]
    fn each_api_s_path_names_its_operation() {
        let cases = [
            ("/v1/chat/completions", "chat"),
            ("/openai/deployments/gpt-4o/chat/completions", "chat"),
            ("/v1/messages", "chat"),
            ("/v1/responses", "chat"),
            ("/v1/completions", "text_completion"),
            ("/v1/embeddings", "embeddings"),
            ("/v1/embeddings/", "embeddings"),
            (
                "/v1beta/models/gemini-2.0-flash:generateContent",
                "generate_content",
            ),
            (
                "/v1/projects/p/locations/l/publishers/google/models/g:streamGenerateContent",
                "generate_content",
            ),
            (
                "/v1beta/models/text-embedding-004:embedContent",
                "embeddings",
            ),
            (
                "/v1beta/models/text-embedding-004:batchEmbedContents",
                "embeddings",
            ),
            ("/api/chat", "chat"),
            ("/api/generate", "text_completion"),
            ("/api/embed", "embeddings"),
            ("/v1/models", OTHER),
            ("/v1beta/models/g:countTokens", OTHER),
            ("/v1/a:b/chat/completions", "chat"),
            ("/", OTHER),
            ("", OTHER),
        ];
        for (path, name) in cases {
            assert_eq!(operation_name(path), name, "{path}");
        }
        assert!(is_inference("chat") && is_inference("text_completion"));
        assert!(is_inference("generate_content"));
        assert!(!is_inference("embeddings") && !is_inference(OTHER));
    }
}
