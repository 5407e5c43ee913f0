//! Every header name stormguard reads or writes: the one place they are spelled.
//!
//! | header | read by | written by |
//! |---|---|---|
//! | [`RETRY_AFTER`], [`RETRY_AFTER_MS`], [`X_MS_RETRY_AFTER_MS`] | classifiers (hints) | |
//! | [`X_SHOULD_RETRY`], [`GRPC_RETRY_PUSHBACK_MS`] | classifiers | [`mark_do_not_retry`] |
//! | [`GRPC_STATUS`], [`GRPC_MESSAGE`] | classifiers | refusal responses |
//! | `x-ratelimit-*`, `anthropic-ratelimit-*` | classifiers (reset hints), rate limits (learning) | |
//! | [`X_RETRY_ATTEMPT`], [`GRPC_PREVIOUS_RPC_ATTEMPTS`] | server retry shedding | the retry engine |
//! | [`X_STAINLESS_RETRY_COUNT`], [`X_ENVOY_ATTEMPT_COUNT`] | server retry shedding | |
//! | [`X_REQUEST_TIMEOUT_MS`], [`GRPC_TIMEOUT`] | server deadlines | client deadlines |
//! | [`X_ENVOY_EXPECTED_RQ_TIMEOUT_MS`] | server deadlines | |
//! | [`IDEMPOTENCY_KEY`] | | the retry engine |

use http::{HeaderMap, HeaderName, HeaderValue};

/// `retry-after` (RFC 9110 section 10.2.3): delay-seconds or an HTTP-date.
pub const RETRY_AFTER: HeaderName = http::header::RETRY_AFTER;

/// `retry-after-ms`: the delay in milliseconds (a decimal number). Sent by OpenAI and Azure OpenAI
/// and read first by their official SDKs; more precise than `retry-after`, so it wins.
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// `x-ms-retry-after-ms`: Azure's spelling of `retry-after-ms` (read by the Azure SDKs); ranks
/// right after `retry-after-ms`.
pub const X_MS_RETRY_AFTER_MS: HeaderName = HeaderName::from_static("x-ms-retry-after-ms");

/// `x-should-retry: true | false`: the server's explicit answer to "retry this?". Sent by OpenAI
/// and Anthropic and honoured first by their official SDKs; stormguard sets `false` on failures
/// it gave up on, so that layers above do not multiply its retries.
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// `grpc-status`: the gRPC status code (in the headers of a trailers-only response).
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-message`: the gRPC status message (gRPC "PROTOCOL-HTTP2": percent-encoded; stormguard's
/// own messages are plain lowercase ASCII words, which need no encoding).
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `grpc-retry-pushback-ms` (gRFC A6): non-negative integer = retry after that many
/// milliseconds; negative or unparseable = do not retry.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// `x-ratelimit-limit-requests` (OpenAI, Groq): the requests-per-minute limit.
pub const X_RATELIMIT_LIMIT_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-limit-requests");

/// `x-ratelimit-limit-tokens` (OpenAI, Groq): the tokens-per-minute limit.
pub const X_RATELIMIT_LIMIT_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-limit-tokens");

/// `anthropic-ratelimit-requests-limit` (Anthropic): the requests-per-minute limit.
pub const ANTHROPIC_RATELIMIT_REQUESTS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-limit");

/// `anthropic-ratelimit-tokens-limit` (Anthropic): the most restrictive tokens-per-minute limit.
pub const ANTHROPIC_RATELIMIT_TOKENS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-tokens-limit");

/// `anthropic-ratelimit-input-tokens-limit` (Anthropic): the input-tokens-per-minute limit.
pub const ANTHROPIC_RATELIMIT_INPUT_TOKENS_LIMIT: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-input-tokens-limit");

/// `x-ratelimit-reset-requests` (OpenAI, Groq): time until the request limit resets, as a Go
/// duration (`1s`, `6m0s`, `12ms`).
pub const X_RATELIMIT_RESET_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-reset-requests");

/// `x-ratelimit-reset-tokens` (OpenAI, Groq): time until the token limit resets, as a Go duration.
pub const X_RATELIMIT_RESET_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-reset-tokens");

/// `x-ratelimit-remaining-requests` (OpenAI, Groq): requests left in the current window.
pub const X_RATELIMIT_REMAINING_REQUESTS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-requests");

/// `x-ratelimit-remaining-tokens` (OpenAI, Groq): tokens left in the current window.
pub const X_RATELIMIT_REMAINING_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-tokens");

/// `anthropic-ratelimit-requests-reset` (Anthropic): RFC 3339 time at which the request limit is
/// fully replenished.
pub const ANTHROPIC_RATELIMIT_REQUESTS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-reset");

/// `anthropic-ratelimit-tokens-reset` (Anthropic): RFC 3339 time at which the most restrictive
/// token limit is fully replenished.
pub const ANTHROPIC_RATELIMIT_TOKENS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-tokens-reset");

/// `anthropic-ratelimit-input-tokens-reset` (Anthropic): RFC 3339 reset time of the input-token
/// limit.
pub const ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-input-tokens-reset");

/// `anthropic-ratelimit-output-tokens-reset` (Anthropic): RFC 3339 reset time of the output-token
/// limit.
pub const ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_RESET: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-output-tokens-reset");

/// `anthropic-ratelimit-requests-remaining` (Anthropic): requests left before the limit.
pub const ANTHROPIC_RATELIMIT_REQUESTS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-requests-remaining");

/// `anthropic-ratelimit-tokens-remaining` (Anthropic): tokens left before the most restrictive
/// token limit.
pub const ANTHROPIC_RATELIMIT_TOKENS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-tokens-remaining");

/// `anthropic-ratelimit-input-tokens-remaining` (Anthropic): input tokens left.
pub const ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-input-tokens-remaining");

/// `anthropic-ratelimit-output-tokens-remaining` (Anthropic): output tokens left.
pub const ANTHROPIC_RATELIMIT_OUTPUT_TOKENS_REMAINING: HeaderName =
    HeaderName::from_static("anthropic-ratelimit-output-tokens-remaining");

/// `x-retry-attempt: N`: the number of attempts made before this one (`0` = first try). Written by
/// stormguard's retry engine on every HTTP attempt.
pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static("x-retry-attempt");

/// `grpc-previous-rpc-attempts: N`: the number of attempts made before this one, as defined by
/// gRFC A6 (gRPC retry design) and sent by gRPC clients with retries enabled (on retries only).
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// `x-stainless-retry-count: N`: the retries made so far (`0` = first try), sent by the official
/// OpenAI and Anthropic SDKs on every request.
pub const X_STAINLESS_RETRY_COUNT: HeaderName = HeaderName::from_static("x-stainless-retry-count");

/// `x-envoy-attempt-count: N`: the attempt number, counting from `1` (first try), set by Envoy when
/// a route enables `include_attempt_count_in_request`.
pub const X_ENVOY_ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");

/// `grpc-timeout`: the time the client allows for a gRPC call (gRPC "PROTOCOL-HTTP2": at most 8
/// digits and a unit).
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// `x-request-timeout-ms`: the time the client allows for an HTTP request, in whole milliseconds.
pub const X_REQUEST_TIMEOUT_MS: HeaderName = HeaderName::from_static("x-request-timeout-ms");

/// `x-envoy-expected-rq-timeout-ms`: the timeout Envoy applies to the request it forwards, in
/// milliseconds (Envoy's router documentation). Read on the server side only.
pub const X_ENVOY_EXPECTED_RQ_TIMEOUT_MS: HeaderName =
    HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// `Idempotency-Key`: one UUID per request, the same on every attempt, so that a backend that
/// honours it (Stripe, the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field") performs a
/// retried POST once even when an earlier attempt did the work and only its answer was lost.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The `content-type` of gRPC responses stormguard writes itself (refusals).
pub const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// Marks a failed response so that no client or layer above retries it: `x-should-retry: false`
/// on HTTP (honoured by the official OpenAI and Anthropic SDKs and by stormguard),
/// `grpc-retry-pushback-ms: -1` on gRPC (gRFC A6: a negative pushback means "do not retry").
///
/// Every stormguard layer that gives up on a request, or answers for one itself (a shed retry, an
/// expired deadline), marks its answer this way: retrying at one layer only is what keeps a
/// gateway's 3 attempts and an SDK's 3 from becoming 9.
pub fn mark_do_not_retry(headers: &mut HeaderMap, grpc: bool) {
    if grpc {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    } else {
        headers.insert(X_SHOULD_RETRY, HeaderValue::from_static("false"));
    }
}

/// The failover's mark on a response: the name of the backend that answered it.
pub const X_STORMGUARD_BACKEND: HeaderName = HeaderName::from_static("x-stormguard-backend");

/// The failover's mark on a degraded answer (`true`): no backend answered, the caller's
/// degraded answer did.
pub const X_STORMGUARD_DEGRADED: HeaderName = HeaderName::from_static("x-stormguard-degraded");
