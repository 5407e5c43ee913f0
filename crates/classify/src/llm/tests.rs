//! The classification vectors: one table, each row a response and the verdict a user relies on.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::LlmClassifier;
use crate::{Classify, GrpcCode, Outcome, Reason, Verdict};

use Verdict::{Fatal as F, Retryable as R, Success as S};

/// Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example date).
const NOW_SECS: u64 = 784_111_777;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

const fn ms(millis: u64) -> Option<Duration> {
    Some(Duration::from_millis(millis))
}

const fn secs(secs: u64) -> Option<Duration> {
    Some(Duration::from_secs(secs))
}

const NONE: Option<Duration> = None;
const GRPC: (&str, &str) = ("content-type", "application/grpc");
const JSON: (&str, &str) = ("content-type", "application/json");

struct Case {
    name: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    verdict: Verdict,
    accepted: bool,
    hint: Option<Duration>,
    reason: Reason,
}

#[allow(clippy::too_many_arguments)] // one argument per table column
const fn case(
    name: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    verdict: Verdict,
    accepted: bool,
    hint: Option<Duration>,
    reason: Reason,
) -> Case {
    Case {
        name,
        status,
        headers,
        body,
        verdict,
        accepted,
        hint,
        reason,
    }
}

// Bodies, in the shapes the providers document.
const OPENAI_RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s. You can increase your rate limit by adding a payment method to your account at https://platform.openai.com/account/billing.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
const OPENAI_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const OPENAI_QUOTA_CODE_ONLY: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"requests","param":null,"code":"insufficient_quota"}}"#;
const OPENAI_QUOTA_TYPE_ONLY: &str = r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":null}}"#;
const OPENAI_BILLING_HARD_LIMIT: &str = r#"{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}"#;
const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const OPENAI_CONTENT_POLICY: &str = r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}"#;
const AZURE_CONTENT_FILTER: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":true,"severity":"high"}}}}}"#;
const AZURE_INNER_ONLY: &str = r#"{"error":{"message":"filtered","code":"BadRequest","innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
const OPENAI_INVALID_KEY: &str = r#"{"error":{"message":"Incorrect API key provided: sk-abc. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
const OPENAI_COUNTRY: &str = r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","param":null,"type":"request_forbidden"}}"#;
const OPENAI_MODEL_NOT_FOUND: &str = r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
const OPENAI_SERVER_ERROR: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
const OPENAI_ENGINE_OVERLOADED: &str = r#"{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}"#;
const OPENAI_UNPROCESSABLE: &str = r#"{"error":{"message":"Unprocessable Entity","type":"invalid_request_error","param":null,"code":null}}"#;
const AZURE_RATE_LIMIT: &str = r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-06-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds."}}"#;
const COMPAT_FLAT_CONTEXT: &str = r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}"#;
const ANTHROPIC_OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
const ANTHROPIC_RATE_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 50,000 input tokens per minute."}}"#;
const ANTHROPIC_SPEND_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Your organization has reached its monthly spend limit.","details":{"error_code":"enforced_spend_limit_reached"}}}"#;
const ANTHROPIC_API_ERROR: &str =
    r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
const ANTHROPIC_BILLING: &str = r#"{"type":"error","error":{"type":"billing_error","message":"There is an issue with your billing."}}"#;
const ANTHROPIC_CREDIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
const ANTHROPIC_WORKSPACE_LIMIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified workspace API usage limits. You will regain access on 2025-01-01 at 00:00 UTC."}}"#;
const ANTHROPIC_PERMISSION: &str = r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#;
const ANTHROPIC_TOO_LARGE: &str = r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#;
const ANTHROPIC_PROMPT_TOO_LONG: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
const ANTHROPIC_AUTH: &str =
    r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
const ANTHROPIC_NOT_FOUND: &str =
    r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#;
const ANTHROPIC_TIMEOUT: &str =
    r#"{"type":"error","error":{"type":"timeout_error","message":"Request timed out"}}"#;
const ANTHROPIC_INVALID: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}"#;
const GEMINI_RATE_RETRY_INFO: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.0-flash"},"quotaValue":"15"}]},{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"34s"}]}}"#;
const GEMINI_RETRY_FRACTION: &str = r#"{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
const GEMINI_DAILY: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"50"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"36s"}]}}"#;
const GEMINI_ERROR_INFO_DAILY: &str = r#"[{"error":{"code":429,"message":"Quota exceeded for quota metric 'Gemini 2.5 Pro Requests'.","errors":[{"message":"Quota exceeded","domain":"global","reason":"rateLimitExceeded"}],"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED","domain":"googleapis.com","metadata":{"quota_metric":"cloudcode-pa.googleapis.com/gemini_2_5_pro_requests","quota_limit":"Gemini25ProRequestsPerDay"}}]}}]"#;
const GEMINI_ARRAY: &str = r#"[{"error":{"code":429,"message":"Resource exhausted. Please try again later.","status":"RESOURCE_EXHAUSTED"}}]"#;
const GEMINI_ARRAY_RETRY_INFO: &str = r#"[{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}]"#;
const GEMINI_LEGACY_REASON: &str = r#"{"error":{"code":429,"message":"Resource exhausted.","errors":[{"message":"Resource exhausted.","domain":"global","reason":"rateLimitExceeded"}]}}"#;
const GEMINI_UNAVAILABLE: &str = r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#;
const GEMINI_INVALID_ARGUMENT: &str = r#"{"error":{"code":400,"message":"Invalid JSON payload received. Unknown name \"foo\".","status":"INVALID_ARGUMENT"}}"#;
const GEMINI_CONTEXT: &str = r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
const GEMINI_BILLING: &str = r#"{"error":{"code":400,"message":"Gemini API free tier is not available in your country. Please enable billing on your project in Google AI Studio.","status":"FAILED_PRECONDITION"}}"#;
const GEMINI_LOCATION: &str = r#"{"error":{"code":400,"message":"User location is not supported for the API use.","status":"FAILED_PRECONDITION"}}"#;
const GEMINI_API_KEY: &str = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
const GEMINI_PERMISSION: &str = r#"{"error":{"code":403,"message":"Your API key doesn't have the required permissions.","status":"PERMISSION_DENIED"}}"#;
const GEMINI_INTERNAL: &str = r#"{"error":{"code":500,"message":"An internal error has occurred. Please retry.","status":"INTERNAL"}}"#;
const GEMINI_DEADLINE: &str = r#"{"error":{"code":504,"message":"The service is currently unable to handle the request in time.","status":"DEADLINE_EXCEEDED"}}"#;
const GEMINI_NOT_FOUND: &str = r#"{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta.","status":"NOT_FOUND"}}"#;
const HTML_502: &str = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>";
const TRUNCATED_QUOTA: &str =
    r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_qu"#;

#[rustfmt::skip]
const CASES: &[Case] = &[
    // Plain HTTP statuses.
    case("200 ok", 200, &[JSON], "{}", S, true, NONE, Reason::Success),
    case("204 no content", 204, &[], "", S, true, NONE, Reason::Success),
    case("301 redirect is not a failure", 301, &[], "", S, true, NONE, Reason::Success),
    case("200 ignores x-should-retry: true", 200, &[("x-should-retry", "true")], "", S, true, NONE, Reason::Success),
    case("200 ignores retry-after", 200, &[("retry-after", "5")], "", S, true, NONE, Reason::Success),
    case("400 empty body", 400, &[], "", F, true, NONE, Reason::BadRequest),
    case("401", 401, &[], "", F, true, NONE, Reason::Unauthorized),
    case("402", 402, &[], "", F, true, NONE, Reason::QuotaExhausted),
    case("403", 403, &[], "", F, true, NONE, Reason::Forbidden),
    case("404", 404, &[], "", F, true, NONE, Reason::NotFound),
    case("408 request timeout", 408, &[], "", R, false, NONE, Reason::Timeout),
    case("409 conflict is retried, and was an answer", 409, &[], "", R, true, NONE, Reason::Conflict),
    case("410 gone", 410, &[], "", F, true, NONE, Reason::NotFound),
    case("413", 413, &[], "", F, true, NONE, Reason::PayloadTooLarge),
    case("418 other 4xx", 418, &[], "", F, true, NONE, Reason::ClientError),
    case("422", 422, &[], "", F, true, NONE, Reason::Unprocessable),
    case("425 too early", 425, &[], "", R, true, NONE, Reason::ClientError),
    case("429 without body", 429, &[], "", R, false, NONE, Reason::RateLimited),
    case("500", 500, &[], "", R, false, NONE, Reason::ServerError),
    case("501 not implemented", 501, &[], "", F, true, NONE, Reason::ServerError),
    case("502", 502, &[], "", R, false, NONE, Reason::Unavailable),
    case("503", 503, &[], "", R, false, NONE, Reason::Unavailable),
    case("504", 504, &[], "", R, false, NONE, Reason::Timeout),
    case("505", 505, &[], "", F, true, NONE, Reason::ServerError),
    case("529", 529, &[], "", R, false, NONE, Reason::Overloaded),
    case("599 unknown 5xx", 599, &[], "", R, false, NONE, Reason::ServerError),
    // Bodies that are not provider errors never break status classification.
    case("502 html body", 502, &[], HTML_502, R, false, NONE, Reason::Unavailable),
    case("400 html body", 400, &[], HTML_502, F, true, NONE, Reason::BadRequest),
    case("429 truncated quota body: status decides", 429, &[JSON], TRUNCATED_QUOTA, R, false, NONE, Reason::RateLimited),
    case("503 body null", 503, &[JSON], "null", R, false, NONE, Reason::Unavailable),
    case("503 body empty array", 503, &[JSON], "[]", R, false, NONE, Reason::Unavailable),
    case("500 body is a JSON string", 500, &[JSON], r#""oops""#, R, false, NONE, Reason::ServerError),
    case("404 fastapi detail", 404, &[JSON], r#"{"detail":"Not Found"}"#, F, true, NONE, Reason::NotFound),
    case("429 error as string", 429, &[JSON], r#"{"error":"Too many requests"}"#, R, false, NONE, Reason::RateLimited),
    case("500 whitespace then garbage", 500, &[], "   \n\t{{{", R, false, NONE, Reason::ServerError),
    // OpenAI.
    case("openai 429 rate_limit_exceeded", 429, &[JSON], OPENAI_RATE_LIMIT, R, false, NONE, Reason::RateLimited),
    case("openai 429 insufficient_quota", 429, &[JSON], OPENAI_QUOTA, F, true, NONE, Reason::QuotaExhausted),
    case("openai 429 insufficient_quota code only", 429, &[JSON], OPENAI_QUOTA_CODE_ONLY, F, true, NONE, Reason::QuotaExhausted),
    case("openai 429 insufficient_quota type only", 429, &[JSON], OPENAI_QUOTA_TYPE_ONLY, F, true, NONE, Reason::QuotaExhausted),
    case("openai 429 insufficient_quota ignores retry-after", 429, &[JSON, ("retry-after", "20")], OPENAI_QUOTA, F, true, NONE, Reason::QuotaExhausted),
    case("openai 400 billing_hard_limit_reached", 400, &[JSON], OPENAI_BILLING_HARD_LIMIT, F, true, NONE, Reason::QuotaExhausted),
    case("openai 400 context_length_exceeded", 400, &[JSON], OPENAI_CONTEXT, F, true, NONE, Reason::ContextTooLong),
    case("openai 400 content_policy_violation", 400, &[JSON], OPENAI_CONTENT_POLICY, F, true, NONE, Reason::ContentFiltered),
    case("azure 400 content_filter", 400, &[JSON], AZURE_CONTENT_FILTER, F, true, NONE, Reason::ContentFiltered),
    case("azure 400 ResponsibleAIPolicyViolation inner code", 400, &[JSON], AZURE_INNER_ONLY, F, true, NONE, Reason::ContentFiltered),
    case("openai 401 invalid_api_key", 401, &[JSON], OPENAI_INVALID_KEY, F, true, NONE, Reason::Unauthorized),
    case("openai 403 unsupported country", 403, &[JSON], OPENAI_COUNTRY, F, true, NONE, Reason::Forbidden),
    case("openai 404 model_not_found", 404, &[JSON], OPENAI_MODEL_NOT_FOUND, F, true, NONE, Reason::NotFound),
    case("openai 422", 422, &[JSON], OPENAI_UNPROCESSABLE, F, true, NONE, Reason::Unprocessable),
    case("openai 500 server_error", 500, &[JSON], OPENAI_SERVER_ERROR, R, false, NONE, Reason::ServerError),
    case("openai 503 engine overloaded keeps the status reason", 503, &[JSON], OPENAI_ENGINE_OVERLOADED, R, false, NONE, Reason::Unavailable),
    case("openai 429 retry-after-ms wins over retry-after", 429, &[("retry-after-ms", "1500"), ("retry-after", "5")], OPENAI_RATE_LIMIT, R, false, ms(1500), Reason::RateLimited),
    case("openai 429 reset headers: the exhausted limit counts", 429, &[ ("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "6m0s"), ("x-ratelimit-remaining-tokens", "100"), ("x-ratelimit-reset-tokens", "12ms"), ], OPENAI_RATE_LIMIT, R, false, secs(360), Reason::RateLimited),
    case("openai 429 reset headers: nothing exhausted, earliest", 429, &[ ("x-ratelimit-remaining-requests", "3"), ("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-remaining-tokens", "100"), ("x-ratelimit-reset-tokens", "12ms"), ], OPENAI_RATE_LIMIT, R, false, ms(12), Reason::RateLimited),
    case("groq 429 fractional reset", 429, &[ ("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "7.66s"), ], "", R, false, ms(7660), Reason::RateLimited),
    case("reset headers are no hint for a 503", 503, &[("x-ratelimit-reset-requests", "6m0s")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after beats reset headers", 429, &[("retry-after", "2"), ("x-ratelimit-reset-requests", "6m0s")], "", R, false, secs(2), Reason::RateLimited),
    case("azure 429 retry-after", 429, &[JSON, ("retry-after", "6")], AZURE_RATE_LIMIT, R, false, secs(6), Reason::RateLimited),
    case("azure x-ms-retry-after-ms", 429, &[("x-ms-retry-after-ms", "2500"), ("retry-after", "3")], AZURE_RATE_LIMIT, R, false, ms(2500), Reason::RateLimited),
    case("openai-compatible flat body, context in message", 400, &[JSON], COMPAT_FLAT_CONTEXT, F, true, NONE, Reason::ContextTooLong),
    // Anthropic.
    case("anthropic 529 overloaded_error", 529, &[JSON], ANTHROPIC_OVERLOADED, R, false, NONE, Reason::Overloaded),
    case("anthropic overloaded_error under 500 is named", 500, &[JSON], ANTHROPIC_OVERLOADED, R, false, NONE, Reason::Overloaded),
    case("anthropic overloaded_error under 503 is named", 503, &[JSON], ANTHROPIC_OVERLOADED, R, false, NONE, Reason::Overloaded),
    case("anthropic 429 rate_limit_error with retry-after", 429, &[JSON, ("retry-after", "12")], ANTHROPIC_RATE_LIMIT, R, false, secs(12), Reason::RateLimited),
    case("anthropic 429 enforced_spend_limit_reached", 429, &[JSON, ("retry-after", "12")], ANTHROPIC_SPEND_LIMIT, F, true, NONE, Reason::QuotaExhausted),
    case("anthropic 500 api_error", 500, &[JSON], ANTHROPIC_API_ERROR, R, false, NONE, Reason::ServerError),
    case("anthropic 402 billing_error", 402, &[JSON], ANTHROPIC_BILLING, F, true, NONE, Reason::QuotaExhausted),
    case("anthropic 400 credit balance too low", 400, &[JSON], ANTHROPIC_CREDIT, F, true, NONE, Reason::QuotaExhausted),
    case("anthropic 400 workspace usage limit", 400, &[JSON], ANTHROPIC_WORKSPACE_LIMIT, F, true, NONE, Reason::QuotaExhausted),
    case("anthropic 403 permission_error", 403, &[JSON], ANTHROPIC_PERMISSION, F, true, NONE, Reason::Forbidden),
    case("anthropic 413 request_too_large", 413, &[JSON], ANTHROPIC_TOO_LARGE, F, true, NONE, Reason::PayloadTooLarge),
    case("anthropic 400 prompt is too long", 400, &[JSON], ANTHROPIC_PROMPT_TOO_LONG, F, true, NONE, Reason::ContextTooLong),
    case("anthropic 400 invalid_request_error", 400, &[JSON], ANTHROPIC_INVALID, F, true, NONE, Reason::BadRequest),
    case("anthropic 401 authentication_error", 401, &[JSON], ANTHROPIC_AUTH, F, true, NONE, Reason::Unauthorized),
    case("anthropic 404 not_found_error", 404, &[JSON], ANTHROPIC_NOT_FOUND, F, true, NONE, Reason::NotFound),
    case("anthropic 504 timeout_error", 504, &[JSON], ANTHROPIC_TIMEOUT, R, false, NONE, Reason::Timeout),
    case("anthropic 429 reset time, tokens exhausted", 429, &[ ("anthropic-ratelimit-tokens-remaining", "0"), ("anthropic-ratelimit-tokens-reset", "1994-11-06T08:50:07Z"), ("anthropic-ratelimit-requests-remaining", "10"), ("anthropic-ratelimit-requests-reset", "1994-11-06T08:49:38Z"), ], ANTHROPIC_RATE_LIMIT, R, false, secs(30), Reason::RateLimited),
    case("anthropic reset time with offset", 429, &[("anthropic-ratelimit-requests-reset", "1994-11-06T09:49:47+01:00", )], ANTHROPIC_RATE_LIMIT, R, false, secs(10), Reason::RateLimited),
    case("anthropic reset time in the past: no hint", 429, &[("anthropic-ratelimit-requests-reset", "1994-11-06T08:00:00Z")], ANTHROPIC_RATE_LIMIT, R, false, NONE, Reason::RateLimited),
    // Gemini / Vertex AI.
    case("gemini 429 RetryInfo per-minute quota", 429, &[JSON], GEMINI_RATE_RETRY_INFO, R, false, secs(34), Reason::RateLimited),
    case("gemini 429 RetryInfo 1.5s", 429, &[JSON], GEMINI_RETRY_FRACTION, R, false, ms(1500), Reason::RateLimited),
    case("gemini retry-after header beats RetryInfo", 429, &[JSON, ("retry-after", "3")], GEMINI_RATE_RETRY_INFO, R, false, secs(3), Reason::RateLimited),
    case("gemini 429 daily QuotaFailure is fatal despite RetryInfo", 429, &[JSON], GEMINI_DAILY, F, true, NONE, Reason::QuotaExhausted),
    case("gemini 429 ErrorInfo daily limit, array-wrapped", 429, &[JSON], GEMINI_ERROR_INFO_DAILY, F, true, NONE, Reason::QuotaExhausted),
    case("gemini 429 array-wrapped RESOURCE_EXHAUSTED", 429, &[JSON], GEMINI_ARRAY, R, false, NONE, Reason::RateLimited),
    case("gemini 429 array-wrapped RetryInfo", 429, &[JSON], GEMINI_ARRAY_RETRY_INFO, R, false, secs(20), Reason::RateLimited),
    case("google legacy errors[].reason rateLimitExceeded", 429, &[JSON], GEMINI_LEGACY_REASON, R, false, NONE, Reason::RateLimited),
    case("gemini 503 UNAVAILABLE", 503, &[JSON], GEMINI_UNAVAILABLE, R, false, NONE, Reason::Unavailable),
    case("gemini 400 INVALID_ARGUMENT", 400, &[JSON], GEMINI_INVALID_ARGUMENT, F, true, NONE, Reason::BadRequest),
    case("gemini 400 input token count", 400, &[JSON], GEMINI_CONTEXT, F, true, NONE, Reason::ContextTooLong),
    case("gemini 400 FAILED_PRECONDITION billing", 400, &[JSON], GEMINI_BILLING, F, true, NONE, Reason::QuotaExhausted),
    case("gemini 400 FAILED_PRECONDITION location", 400, &[JSON], GEMINI_LOCATION, F, true, NONE, Reason::BadRequest),
    case("gemini 400 API_KEY_INVALID", 400, &[JSON], GEMINI_API_KEY, F, true, NONE, Reason::Unauthorized),
    case("gemini 403 PERMISSION_DENIED", 403, &[JSON], GEMINI_PERMISSION, F, true, NONE, Reason::Forbidden),
    case("gemini 500 INTERNAL", 500, &[JSON], GEMINI_INTERNAL, R, false, NONE, Reason::ServerError),
    case("gemini 504 DEADLINE_EXCEEDED", 504, &[JSON], GEMINI_DEADLINE, R, false, NONE, Reason::Timeout),
    case("gemini 404 NOT_FOUND", 404, &[JSON], GEMINI_NOT_FOUND, F, true, NONE, Reason::NotFound),
    case("a body never turns a fatal status retryable", 400, &[JSON], ANTHROPIC_RATE_LIMIT, F, true, NONE, Reason::BadRequest),
    // x-should-retry overrides the status either way.
    case("x-should-retry: false on 503", 503, &[("x-should-retry", "false")], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("x-should-retry: false on 429 drops the hint", 429, &[("x-should-retry", "false"), ("retry-after", "5")], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("x-should-retry: true on 400", 400, &[("x-should-retry", "true")], "", R, true, NONE, Reason::ServerSaidRetry),
    case("x-should-retry: TRUE on 401, with hint", 401, &[("x-should-retry", "TRUE"), ("retry-after", "1")], "", R, true, secs(1), Reason::ServerSaidRetry),
    case("x-should-retry: true beats a quota body", 429, &[("x-should-retry", "true")], OPENAI_QUOTA, R, true, NONE, Reason::ServerSaidRetry),
    case("x-should-retry: true on 503 keeps the reason", 503, &[("x-should-retry", "true")], "", R, false, NONE, Reason::Unavailable),
    case("x-should-retry: false on 400 keeps the reason", 400, &[("x-should-retry", "false")], "", F, true, NONE, Reason::BadRequest),
    case("x-should-retry: maybe is ignored", 503, &[("x-should-retry", "maybe")], "", R, false, NONE, Reason::Unavailable),
    // retry-after and retry-after-ms.
    case("retry-after: 5", 503, &[("retry-after", "5")], "", R, false, secs(5), Reason::Unavailable),
    case("retry-after: 0", 503, &[("retry-after", "0")], "", R, false, secs(0), Reason::Unavailable),
    case("retry-after with spaces", 503, &[("retry-after", "  7 ")], "", R, false, secs(7), Reason::Unavailable),
    case("retry-after IMF-fixdate", 503, &[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")], "", R, false, secs(10), Reason::Unavailable),
    case("retry-after RFC 850 date", 503, &[("retry-after", "Sunday, 06-Nov-94 08:49:47 GMT")], "", R, false, secs(10), Reason::Unavailable),
    case("retry-after asctime date", 503, &[("retry-after", "Sun Nov  6 08:49:47 1994")], "", R, false, secs(10), Reason::Unavailable),
    case("retry-after date in the past", 503, &[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after date equal to now", 503, &[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after date with wrong weekday", 503, &[("retry-after", "Mon, 06 Nov 1994 08:49:47 GMT")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: abc", 503, &[("retry-after", "abc")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: -5", 503, &[("retry-after", "-5")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: inf", 503, &[("retry-after", "inf")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: NaN", 503, &[("retry-after", "NaN")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: 1.5", 503, &[("retry-after", "1.5")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: 30 digits", 503, &[("retry-after", "123456789012345678901234567890")], "", R, false, NONE, Reason::Unavailable),
    case("retry-after: huge but 64-bit, clamped to a day", 503, &[("retry-after", "18446744073709551615")], "", R, false, secs(86_400), Reason::Unavailable),
    case("retry-after on a fatal answer: no hint", 400, &[("retry-after", "5")], "", F, true, NONE, Reason::BadRequest),
    case("retry-after-ms: 1500.5", 429, &[("retry-after-ms", "1500.5")], "", R, false, Some(Duration::from_micros(1_500_500)), Reason::RateLimited),
    case("retry-after-ms: garbage falls back to retry-after", 429, &[("retry-after-ms", "soon"), ("retry-after", "5")], "", R, false, secs(5), Reason::RateLimited),
    case("retry-after-ms: -1", 429, &[("retry-after-ms", "-1")], "", R, false, NONE, Reason::RateLimited),
    case("retry-after-ms: 1e3", 429, &[("retry-after-ms", "1e3")], "", R, false, NONE, Reason::RateLimited),
    // gRPC (trailers-only responses: the status is in the headers).
    case("grpc 200 without grpc-status: stream started", 200, &[GRPC], "", S, true, NONE, Reason::Success),
    case("grpc status 0", 200, &[GRPC, ("grpc-status", "0")], "", S, true, NONE, Reason::Success),
    case("grpc UNAVAILABLE", 200, &[GRPC, ("grpc-status", "14")], "", R, false, NONE, Reason::Grpc(GrpcCode::Unavailable)),
    case("grpc UNAVAILABLE pushback 250", 200, &[ GRPC, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "250"), ], "", R, false, ms(250), Reason::Grpc(GrpcCode::Unavailable)),
    case("grpc UNAVAILABLE pushback -1", 200, &[ GRPC, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1"), ], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("grpc UNAVAILABLE pushback unparseable", 200, &[ GRPC, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "soon"), ], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("grpc pushback -1 beats x-should-retry: true", 200, &[ GRPC, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1"), ("x-should-retry", "true"), ], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("grpc retry-after-ms beats pushback", 200, &[ GRPC, ("grpc-status", "14"), ("grpc-retry-pushback-ms", "250"), ("retry-after-ms", "50"), ], "", R, false, ms(50), Reason::Grpc(GrpcCode::Unavailable)),
    case("grpc RESOURCE_EXHAUSTED without hint", 200, &[GRPC, ("grpc-status", "8")], "", F, false, NONE, Reason::Grpc(GrpcCode::ResourceExhausted)),
    case("grpc RESOURCE_EXHAUSTED pushback 1000", 200, &[ GRPC, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "1000"), ], "", R, false, secs(1), Reason::Grpc(GrpcCode::ResourceExhausted)),
    case("grpc RESOURCE_EXHAUSTED pushback 0", 200, &[GRPC, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "0")], "", R, false, secs(0), Reason::Grpc(GrpcCode::ResourceExhausted)),
    case("grpc RESOURCE_EXHAUSTED retry-after", 200, &[GRPC, ("grpc-status", "8"), ("retry-after", "2")], "", R, false, secs(2), Reason::Grpc(GrpcCode::ResourceExhausted)),
    case("grpc RESOURCE_EXHAUSTED pushback -1", 200, &[GRPC, ("grpc-status", "8"), ("grpc-retry-pushback-ms", "-1")], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("grpc INTERNAL", 200, &[GRPC, ("grpc-status", "13")], "", R, false, NONE, Reason::Grpc(GrpcCode::Internal)),
    case("grpc CANCELLED", 200, &[GRPC, ("grpc-status", "1")], "", F, true, NONE, Reason::Grpc(GrpcCode::Cancelled)),
    case("grpc UNKNOWN", 200, &[GRPC, ("grpc-status", "2")], "", F, true, NONE, Reason::Grpc(GrpcCode::Unknown)),
    case("grpc INVALID_ARGUMENT", 200, &[GRPC, ("grpc-status", "3")], "", F, true, NONE, Reason::Grpc(GrpcCode::InvalidArgument)),
    case("grpc DEADLINE_EXCEEDED from the server", 200, &[GRPC, ("grpc-status", "4")], "", F, false, NONE, Reason::Grpc(GrpcCode::DeadlineExceeded)),
    case("grpc NOT_FOUND", 200, &[GRPC, ("grpc-status", "5")], "", F, true, NONE, Reason::Grpc(GrpcCode::NotFound)),
    case("grpc PERMISSION_DENIED", 200, &[GRPC, ("grpc-status", "7")], "", F, true, NONE, Reason::Grpc(GrpcCode::PermissionDenied)),
    case("grpc FAILED_PRECONDITION", 200, &[GRPC, ("grpc-status", "9")], "", F, true, NONE, Reason::Grpc(GrpcCode::FailedPrecondition)),
    case("grpc ABORTED", 200, &[GRPC, ("grpc-status", "10")], "", F, true, NONE, Reason::Grpc(GrpcCode::Aborted)),
    case("grpc UNIMPLEMENTED", 200, &[GRPC, ("grpc-status", "12")], "", F, true, NONE, Reason::Grpc(GrpcCode::Unimplemented)),
    case("grpc DATA_LOSS", 200, &[GRPC, ("grpc-status", "15")], "", F, true, NONE, Reason::Grpc(GrpcCode::DataLoss)),
    case("grpc UNAUTHENTICATED", 200, &[GRPC, ("grpc-status", "16")], "", F, true, NONE, Reason::Grpc(GrpcCode::Unauthenticated)),
    case("grpc pushback does not make a fatal code retryable", 200, &[ GRPC, ("grpc-status", "3"), ("grpc-retry-pushback-ms", "100"), ], "", F, true, NONE, Reason::Grpc(GrpcCode::InvalidArgument)),
    case("grpc-status 99 is UNKNOWN", 200, &[GRPC, ("grpc-status", "99")], "", F, true, NONE, Reason::Grpc(GrpcCode::Unknown)),
    case("grpc-status garbage is UNKNOWN", 200, &[GRPC, ("grpc-status", "abc")], "", F, true, NONE, Reason::Grpc(GrpcCode::Unknown)),
    case("grpc x-should-retry: false", 200, &[GRPC, ("grpc-status", "14"), ("x-should-retry", "false")], "", F, false, NONE, Reason::ServerSaidNoRetry),
    case("grpc proxy 503 without grpc-status", 503, &[GRPC], "", R, false, NONE, Reason::Grpc(GrpcCode::Unavailable)),
    case("grpc proxy 429 without grpc-status", 429, &[GRPC], "", R, false, NONE, Reason::Grpc(GrpcCode::Unavailable)),
    case("grpc proxy 404 without grpc-status", 404, &[GRPC], "", F, true, NONE, Reason::Grpc(GrpcCode::Unimplemented)),
    case("grpc proxy 400 without grpc-status", 400, &[GRPC], "", R, false, NONE, Reason::Grpc(GrpcCode::Internal)),
    case("grpc body is never read", 200, &[GRPC, ("grpc-status", "14")], OPENAI_QUOTA, R, false, NONE, Reason::Grpc(GrpcCode::Unavailable)),
    case("application/grpc+proto", 200, &[ ("content-type", "application/grpc+proto"), ("grpc-status", "14"), ], "", R, false, NONE, Reason::Grpc(GrpcCode::Unavailable)),
    case("application/grpc-web+proto", 200, &[ ("content-type", "application/grpc-web+proto"), ("grpc-status", "7"), ], "", F, true, NONE, Reason::Grpc(GrpcCode::PermissionDenied)),
    case("application/grpcx is not gRPC", 200, &[("content-type", "application/grpcx"), ("grpc-status", "14")], "", S, true, NONE, Reason::Success),
];

fn parts(case: &Case) -> http::response::Parts {
    let mut builder = http::Response::builder().status(case.status);
    for (name, value) in case.headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

#[test]
fn classification_vectors() {
    let classifier = LlmClassifier::default();
    let mut failures = Vec::new();
    for case in CASES {
        let parts = parts(case);
        let outcome = classifier.classify_http_at(&parts, case.body.as_bytes(), now());
        let expected = (case.verdict, case.accepted, case.hint, case.reason);
        let got = (
            outcome.verdict(),
            outcome.is_accepted(),
            outcome.retry_after(),
            outcome.reason(),
        );
        if got != expected {
            failures.push(format!("{}: expected {expected:?}, got {got:?}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(CASES.len() >= 60, "only {} vectors", CASES.len());
}

#[test]
fn vector_names_are_distinct() {
    let mut names: Vec<&str> = CASES.iter().map(|case| case.name).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before);
}

#[test]
fn classify_http_without_clock_agrees_on_status_and_body() {
    // The clock-free entry point gives the same verdicts for every vector whose hint is not a date.
    let classifier = LlmClassifier::default();
    for case in CASES {
        let parts = parts(case);
        let at = classifier.classify_http_at(&parts, case.body.as_bytes(), now());
        let live = classifier.classify_http(&parts, case.body.as_bytes());
        assert_eq!(at.verdict(), live.verdict(), "{}", case.name);
        assert_eq!(at.is_accepted(), live.is_accepted(), "{}", case.name);
        assert_eq!(at.reason(), live.reason(), "{}", case.name);
    }
}

#[test]
fn the_trait_method_is_the_inherent_one() {
    let classifier = LlmClassifier::default();
    let (parts, ()) = http::Response::builder()
        .status(429)
        .body(())
        .unwrap()
        .into_parts();
    assert_eq!(
        Classify::classify_http(&classifier, &parts, OPENAI_QUOTA.as_bytes()),
        Outcome::fatal(Reason::QuotaExhausted)
    );
}

#[test]
fn needs_body_only_for_http_errors() {
    let classifier = LlmClassifier::default();
    let head = |status: u16, content_type: &str| {
        http::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(())
            .unwrap()
            .into_parts()
            .0
    };
    assert!(!classifier.needs_body(&head(200, "application/json")));
    assert!(!classifier.needs_body(&head(304, "text/plain")));
    assert!(classifier.needs_body(&head(400, "application/json")));
    assert!(classifier.needs_body(&head(429, "application/json")));
    assert!(classifier.needs_body(&head(503, "text/html")));
    assert!(!classifier.needs_body(&head(503, "application/grpc")));
    assert!(!classifier.needs_body(&head(200, "application/grpc")));
}

#[test]
fn hints_are_reported_as_parsed_not_cut() {
    let classifier = LlmClassifier::default();
    let (parts, ()) = http::Response::builder()
        .status(503)
        .header("retry-after", "120")
        .body(())
        .unwrap()
        .into_parts();
    // Reported as parsed: the retry engine's hint policy compares it with its maximum.
    assert_eq!(
        classifier
            .classify_http_at(&parts, b"", now())
            .retry_after(),
        Some(Duration::from_secs(120))
    );
}

#[test]
fn body_is_read_only_up_to_the_limit() {
    // A quota error whose padding field runs past ERROR_BODY_LIMIT: the classifier sees only the
    // first 64 KiB, which is not valid JSON, so the status decides (retryable 429).
    let padded = |pad: usize| {
        let mut body =
            br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"},"pad":""#
                .to_vec();
        body.resize(body.len() + pad, b'x');
        body.extend_from_slice(br#""}"#);
        body
    };
    let (parts, ()) = http::Response::builder()
        .status(429)
        .body(())
        .unwrap()
        .into_parts();
    let classifier = LlmClassifier::default();
    let long = padded(crate::ERROR_BODY_LIMIT);
    assert!(long.len() > crate::ERROR_BODY_LIMIT);
    let outcome = classifier.classify_http_at(&parts, &long, now());
    assert_eq!(outcome.verdict(), Verdict::Retryable);
    assert_eq!(outcome.reason(), Reason::RateLimited);
    let short = padded(crate::ERROR_BODY_LIMIT - 200);
    assert!(short.len() <= crate::ERROR_BODY_LIMIT);
    let outcome = classifier.classify_http_at(&parts, &short, now());
    assert_eq!(outcome.reason(), Reason::QuotaExhausted);
}

/// A classifier with only the trait's defaults beside `LlmClassifier`'s verdicts: what
/// `classify_head` answers when not read in one pass.
#[derive(Clone)]
struct Defaults(LlmClassifier);

impl Classify for Defaults {
    fn classify_http(&self, parts: &http::response::Parts, body: &[u8]) -> Outcome {
        self.0.classify_http(parts, body)
    }

    fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        self.0.classify_error(error)
    }
}

/// A response head: its status, its headers, and whether it is an event stream to guard.
type Head = (u16, &'static [(&'static str, &'static str)], bool);

#[test]
fn a_head_read_once_classifies_as_the_default_reading_does() {
    let heads: [Head; 10] = [
        (200, &[JSON], false),
        (200, &[("content-type", "text/event-stream")], true),
        (
            200,
            &[("content-type", " Text/Event-Stream; charset=utf-8")],
            true,
        ),
        (200, &[("content-type", "text/event-streams")], false),
        (204, &[], false),
        (200, &[GRPC], false),
        (200, &[GRPC, ("grpc-status", "14")], false),
        (429, &[("content-type", "text/event-stream")], false),
        (503, &[JSON, ("retry-after", "3")], false),
        (302, &[("content-type", "text/event-stream")], true),
    ];
    for (status, headers, stream) in heads {
        let mut builder = http::Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (parts, ()) = builder.body(()).unwrap().into_parts();
        let once = LlmClassifier::new().classify_head(&parts);
        let (outcome, event_stream) = Defaults(LlmClassifier::new()).classify_head(&parts);
        assert_eq!(once.0.verdict(), outcome.verdict(), "{status} {headers:?}");
        assert_eq!(once.0.reason(), outcome.reason(), "{status} {headers:?}");
        // An event stream is told apart where it can be one: an answer that is a success.
        assert_eq!(once.1, stream, "{status} {headers:?}");
        if outcome.is_success() {
            assert_eq!(once.1, event_stream, "{status} {headers:?}");
        }
    }
}
