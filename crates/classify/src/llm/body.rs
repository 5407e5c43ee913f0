//! Reading the JSON error bodies of LLM providers.
//!
//! Shapes understood (the documented error formats of each provider):
//!
//! - OpenAI (and Azure OpenAI, Groq, Mistral, vLLM and other compatible servers):
//!   `{"error": {"message", "type", "param", "code"}}`, where `code` may be a string, a number or
//!   null; Azure adds `"innererror": {"code": "ResponsibleAIPolicyViolation"}`. The flat form
//!   `{"object": "error", "message", "type", "code"}` is read too.
//! - Anthropic: `{"type": "error", "error": {"type": "overloaded_error", "message"}}`; a
//!   monthly spend limit is a `rate_limit_error` with `"details": {"error_code":
//!   "enforced_spend_limit_reached"}` (fatal, unlike the rate limit it resembles).
//! - Gemini / Vertex AI (Google's `google.rpc.Status` in JSON):
//!   `{"error": {"code": 429, "message", "status": "RESOURCE_EXHAUSTED", "details": [...]}}`, with
//!   `google.rpc.RetryInfo` (`retryDelay`), `google.rpc.QuotaFailure` (`violations`) and
//!   `google.rpc.ErrorInfo` (`reason`, `metadata.quota_limit`) details, and the legacy
//!   `errors: [{"reason": "rateLimitExceeded"}]`;
//!   also wrapped in an array, `[{"error": {...}}]`, as some Google endpoints send it.
//!
//! The body is parsed with `serde_json` into a `serde_json::Value` (whose recursion limit of 128
//! bounds nesting) and read at those fixed paths. Nothing here looks at more than a few array
//! items or reads past [`ERROR_BODY_LIMIT`](crate::ERROR_BODY_LIMIT) bytes. A repeated key's last
//! value counts, as in any JSON object read whole; a value of another type than a path expects is
//! ignored. A body that is empty, not JSON, truncated or of another shape yields nothing, and the
//! status decides alone.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::ERROR_BODY_LIMIT;
use crate::hint;
use crate::outcome::{Outcome, Reason, Verdict};

/// How many `details` entries and quota `violations` are looked at.
const MAX_ITEMS: usize = 16;

/// What a provider's error body says, reduced to what classification needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ErrorBody {
    /// The most specific kind among the body's `type`, `code`, `status` strings.
    kind: Option<Kind>,
    /// `google.rpc.RetryInfo.retryDelay`.
    pub(crate) retry_delay: Option<Duration>,
    /// A `google.rpc.QuotaFailure` names a daily quota.
    daily_quota: bool,
    /// Kind suggested by the human-readable message; used only to name a fatal answer.
    message_kind: Option<Kind>,
}

/// The error kinds providers name, most specific first (the order decides between several).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    QuotaExhausted,
    ContextTooLong,
    ContentFiltered,
    RateLimited,
    Overloaded,
    Unauthorized,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Timeout,
    Unavailable,
    ServerError,
    Unprocessable,
    BadRequest,
}

impl Kind {
    const fn reason(self) -> Reason {
        match self {
            Kind::QuotaExhausted => Reason::QuotaExhausted,
            Kind::ContextTooLong => Reason::ContextTooLong,
            Kind::ContentFiltered => Reason::ContentFiltered,
            Kind::RateLimited => Reason::RateLimited,
            Kind::Overloaded => Reason::Overloaded,
            Kind::Unauthorized => Reason::Unauthorized,
            Kind::Forbidden => Reason::Forbidden,
            Kind::NotFound => Reason::NotFound,
            Kind::PayloadTooLarge => Reason::PayloadTooLarge,
            Kind::Timeout => Reason::Timeout,
            Kind::Unavailable => Reason::Unavailable,
            Kind::ServerError => Reason::ServerError,
            Kind::Unprocessable => Reason::Unprocessable,
            Kind::BadRequest => Reason::BadRequest,
        }
    }

    /// Properties of the request itself: no retry can change them, whatever the status says.
    const fn is_deterministic(self) -> bool {
        matches!(
            self,
            Kind::QuotaExhausted | Kind::ContextTooLong | Kind::ContentFiltered
        )
    }

    /// Does this kind name `base` better than its status did? (See [`ErrorBody::refine`].)
    fn renames(self, base: Outcome) -> bool {
        self != Kind::BadRequest
            && self.verdict() == base.verdict()
            && (matches!(self, Kind::RateLimited | Kind::Overloaded) || is_generic(base.reason()))
    }

    /// The outcome this kind has on its own, as if its status had said it: retryable kinds are
    /// not accepted, fatal ones are (like the statuses they stand for).
    const fn outcome(self) -> Outcome {
        match self.verdict() {
            Verdict::Retryable => Outcome::retryable(self.reason()),
            Verdict::Success | Verdict::Fatal => Outcome::fatal(self.reason()),
        }
    }

    /// The verdict this kind has on its own.
    const fn verdict(self) -> Verdict {
        match self {
            Kind::RateLimited
            | Kind::Overloaded
            | Kind::Timeout
            | Kind::Unavailable
            | Kind::ServerError => Verdict::Retryable,
            _ => Verdict::Fatal,
        }
    }

    /// The kind a provider's `type` / `code` / `status` string names, if any.
    fn of_token(token: &str) -> Option<Kind> {
        let token = token.trim();
        if token.is_empty() || token.len() > 128 {
            return None;
        }
        let has = |needle: &str| contains_ignore_case(token, needle);
        let is = |name: &str| token.eq_ignore_ascii_case(name);
        let kind = if is("insufficient_quota")
            || is("insufficientquota")
            || has("billing")
            || has("spend_limit")
            || has("credit_balance")
            || has("insufficient_balance")
            || has("payment_required")
        {
            Kind::QuotaExhausted
        } else if has("context_length") || has("context_window") {
            Kind::ContextTooLong
        } else if has("content_filter") || has("content_policy") || has("responsibleaipolicy") {
            Kind::ContentFiltered
        } else if has("rate_limit")
            || has("ratelimit")
            || has("too_many_requests")
            || has("throttl")
            || is("resource_exhausted")
        {
            Kind::RateLimited
        } else if has("overloaded") {
            Kind::Overloaded
        } else if has("api_key")
            || has("authentication")
            || has("unauthenticated")
            || has("unauthorized")
        {
            Kind::Unauthorized
        } else if has("permission")
            || has("forbidden")
            || has("access_denied")
            || has("accessdenied")
            || is("unsupported_country_region_territory")
        {
            Kind::Forbidden
        } else if has("not_found") || has("notfound") {
            Kind::NotFound
        } else if has("too_large") {
            Kind::PayloadTooLarge
        } else if has("timeout") || is("deadline_exceeded") {
            Kind::Timeout
        } else if has("unavailable") || has("modelnotready") {
            Kind::Unavailable
        } else if is("api_error")
            || is("server_error")
            || is("internal")
            || has("internal_error")
            || has("internal_server_error")
            || has("internalserver")
        {
            Kind::ServerError
        } else if has("unprocessable") {
            Kind::Unprocessable
        } else if has("invalid")
            || has("bad_request")
            || has("badrequest")
            || has("validation")
            || is("failed_precondition")
            || is("out_of_range")
        {
            Kind::BadRequest
        } else {
            return None;
        };
        Some(kind)
    }

    /// The kind a human-readable message suggests. Only used to *name* a fatal answer: a message
    /// never changes a verdict (OpenAI's rate-limit message mentions billing, for one).
    fn of_message(message: &str) -> Option<Kind> {
        let has = |needle: &str| contains_ignore_case(message, needle);
        if has("prompt is too long")
            || has("context length")
            || has("context window")
            || has("maximum context")
            || has("input token count")
            || has("exceeds the maximum number of tokens")
        {
            Some(Kind::ContextTooLong)
        } else if has("credit balance")
            || has("billing")
            || has("usage limit")
            || has("spend limit")
            || has("spending limit")
        {
            Some(Kind::QuotaExhausted)
        } else {
            None
        }
    }
}

/// ASCII case-insensitive substring search, no allocation.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|window| window.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Does the text of a `google.rpc.QuotaFailure` violation (or of an `ErrorInfo`'s metadata) name a
/// daily quota (`GenerateRequestsPerDayPerProjectPerModel-FreeTier`, `Gemini25ProRequestsPerDay`)?
fn text_names_daily_quota(text: &str) -> bool {
    contains_ignore_case(text, "perday")
        || contains_ignore_case(text, "per_day")
        || contains_ignore_case(text, "per day")
        || contains_ignore_case(text, "daily")
}

/// The keys of a violation or of metadata whose text may name a daily quota.
const QUOTA_KEYS: [&str; 6] = [
    "quotaId",
    "quotaMetric",
    "description",
    "subject",
    "quota_limit",
    "quota_id",
];

impl ErrorBody {
    /// Reads a (possibly truncated) error body; `None` when it is not a JSON object of a known
    /// shape.
    pub(crate) fn parse(body: &[u8]) -> Option<ErrorBody> {
        let body = &body[..body.len().min(ERROR_BODY_LIMIT)];
        let first = body.iter().find(|byte| !byte.is_ascii_whitespace())?;
        if *first != b'{' && *first != b'[' {
            return None;
        }
        let value: Value = serde_json::from_slice(body).ok()?;
        ErrorBody::from_value(&value)
    }

    /// Reads an error body already parsed as JSON (an error event of a stream, see
    /// [`LlmClassifier::classify_without_status`](crate::LlmClassifier::classify_without_status));
    /// `None` when it is neither an object nor an array whose first item
    /// is an object.
    pub(crate) fn from_value(value: &Value) -> Option<ErrorBody> {
        let root = match value {
            Value::Array(items) => items.first()?,
            other => other,
        };
        let root = root.as_object()?;
        // The fields describing the error are the `error` object's, or the root's own.
        let (fields, message) = match root.get("error") {
            Some(Value::Object(error)) => (error, string(error, "message")),
            Some(Value::String(message)) => (root, Some(message.as_str())),
            _ => (root, string(root, "message")),
        };

        let mut parsed = ErrorBody::default();
        let mut tokens: Vec<&str> = Vec::new();
        tokens.extend(string(fields, "type"));
        tokens.extend(string(fields, "code"));
        tokens.extend(string(fields, "status"));
        // Azure's `innererror.code`.
        if let Some(inner) = fields.get("innererror").and_then(Value::as_object) {
            tokens.extend(string(inner, "code"));
        }
        tokens.extend(string(root, "type").filter(|kind| *kind != "error"));
        match fields.get("details") {
            // Anthropic: `"details": {"error_code": "enforced_spend_limit_reached"}`.
            Some(Value::Object(details)) => tokens.extend(string(details, "error_code")),
            // Google: typed `google.rpc` details.
            Some(Value::Array(details)) => {
                for detail in details.iter().take(MAX_ITEMS) {
                    parsed.read_google_detail(detail, &mut tokens);
                }
            }
            _ => {}
        }
        // Google's legacy `errors: [{"reason": "rateLimitExceeded", ...}]`.
        if let Some(errors) = fields.get("errors").and_then(Value::as_array) {
            let reasons = errors.iter().take(MAX_ITEMS);
            tokens.extend(reasons.filter_map(|error| error.get("reason")?.as_str()));
        }
        parsed.kind = tokens.into_iter().filter_map(Kind::of_token).min();
        parsed.message_kind = message.and_then(Kind::of_message);
        Some(parsed)
    }

    /// Takes in one `google.rpc` detail: `RetryInfo` (the hint), `QuotaFailure` and `ErrorInfo`
    /// (daily quotas, reason tokens).
    fn read_google_detail<'a>(&mut self, detail: &'a Value, tokens: &mut Vec<&'a str>) {
        let Some(type_url) = detail.get("@type").and_then(Value::as_str) else {
            return;
        };
        if type_url.ends_with("google.rpc.RetryInfo") {
            self.retry_delay = detail
                .get("retryDelay")
                .and_then(Value::as_str)
                .and_then(hint::protobuf_duration);
        } else if type_url.ends_with("google.rpc.QuotaFailure") {
            let violations = detail.get("violations").and_then(Value::as_array);
            self.daily_quota |=
                violations.is_some_and(|list| list.iter().take(MAX_ITEMS).any(names_daily_quota));
        } else if type_url.ends_with("google.rpc.ErrorInfo") {
            tokens.extend(detail.get("reason").and_then(Value::as_str));
            self.daily_quota |= detail.get("metadata").is_some_and(names_daily_quota);
        }
    }

    /// The outcome of an error that came without a status of its own: an error event in a
    /// stream whose response was a `200` (see
    /// [`LlmClassifier::classify_without_status`](crate::LlmClassifier::classify_without_status)). The kind the body names
    /// stands in for the status, with the verdict and reason it has on its own (`overloaded_error`
    /// is retryable `overloaded`, `invalid_request_error` fatal `bad_request` ...); a body that
    /// names no kind gets `fallback`. Then [`refine`](ErrorBody::refine) applies as for a
    /// response (daily quotas, messages naming a fatal answer), and a retryable outcome takes the
    /// body's `RetryInfo` delay as its hint.
    pub(crate) fn outcome_without_status(&self, fallback: Outcome) -> Outcome {
        let base = self.kind.map_or(fallback, Kind::outcome);
        let outcome = self.refine(base);
        let hint = self.retry_delay.filter(|_| outcome.is_retryable());
        outcome.with_retry_after(hint)
    }

    /// Refines the outcome of the status with what the body says:
    /// - a daily quota (a Gemini `QuotaFailure` or `ErrorInfo` naming a per-day limit) is fatal
    ///   `quota_exhausted`, even with a `RetryInfo`: that delay is the per-minute window's, and the
    ///   day's quota is still empty after it;
    /// - quota / billing / spend limit, context length and content policy kinds are fatal whatever
    ///   the status: they are properties of the account or the request, not of the moment;
    /// - any other kind only renames the reason, only when its own verdict agrees with the
    ///   status's (a `400` naming `rate_limit_error` stays fatal: the body never turns a fatal
    ///   status retryable), and only when it says more than the status: a rate limit or overload
    ///   is named as such whatever the status; other kinds rename only the generic reasons of
    ///   400, other 4xx, 500 and other 5xx;
    /// - the human-readable message names a fatal answer whose reason stayed generic (Anthropic's
    ///   "prompt is too long", "credit balance is too low"); it never changes a verdict.
    pub(crate) fn refine(&self, base: Outcome) -> Outcome {
        if self.daily_quota {
            return Outcome::fatal(Reason::QuotaExhausted);
        }
        let mut outcome = match self.kind {
            Some(kind) if kind.is_deterministic() => return Outcome::fatal(kind.reason()),
            Some(kind) if kind.renames(base) => base.with_reason(kind.reason()),
            _ => base,
        };
        let nameless = outcome.is_fatal() && is_generic(outcome.reason());
        if let Some(kind) = self.message_kind.filter(|_| nameless) {
            outcome = outcome.with_reason(kind.reason());
        }
        outcome
    }
}

/// Reasons that say no more than "some 4xx" or "some 5xx".
const fn is_generic(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::BadRequest | Reason::ClientError | Reason::ServerError
    )
}

/// The string at `key` of an object, if it is a string.
fn string<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(Value::as_str)
}

/// Does an object's [`QUOTA_KEYS`] text name a daily quota?
fn names_daily_quota(object: &Value) -> bool {
    QUOTA_KEYS
        .iter()
        .filter_map(|key| object.get(key).and_then(Value::as_str))
        .any(text_names_daily_quota)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    fn parse(body: &str) -> Option<ErrorBody> {
        ErrorBody::parse(body.as_bytes())
    }

    fn kind(body: &str) -> Option<Kind> {
        parse(body).unwrap().kind
    }

    const RETRY_INFO: &str =
        r#"{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"34s"}"#;

    /// `count` Google details, a `RetryInfo` at `retry_at` (0-based) and padding elsewhere.
    fn details_with_retry_info_at(retry_at: usize, count: usize) -> String {
        let details: Vec<&str> = (0..count)
            .map(|index| if index == retry_at { RETRY_INFO } else { "{}" })
            .collect();
        format!(
            r#"{{"error":{{"status":"RESOURCE_EXHAUSTED","details":[{}]}}}}"#,
            details.join(",")
        )
    }

    #[test]
    fn a_typical_openai_body() {
        let body = r#"{"error":{"message":"The server is overloaded.","type":"server_error","code":null}}"#;
        assert_eq!(
            parse(body),
            Some(ErrorBody {
                kind: Some(Kind::ServerError),
                ..ErrorBody::default()
            })
        );
    }

    #[test]
    fn a_repeated_key_counts_with_its_last_value() {
        let ty = r#"{"error":{"type":"rate_limit_error","type":"overloaded_error"}}"#;
        assert_eq!(kind(ty), Some(Kind::Overloaded));
        // A last value of the wrong type clears the first.
        assert_eq!(kind(r#"{"type":"overloaded_error","type":5}"#), None);
        assert_eq!(
            kind(r#"{"error":{"code":"insufficient_quota","code":429}}"#),
            None
        );

        // `error` as an object, then as a message: the root holds the fields.
        let error = r#"{"type":"overloaded_error","error":{"type":"insufficient_quota"},"error":"prompt is too long"}"#;
        let parsed = parse(error).unwrap();
        assert_eq!(parsed.kind, Some(Kind::Overloaded));
        assert_eq!(parsed.message_kind, Some(Kind::ContextTooLong));
        // And the other way round: the object holds them.
        let error = r#"{"type":"overloaded_error","error":"prompt is too long","error":{"type":"insufficient_quota"}}"#;
        let parsed = parse(error).unwrap();
        assert_eq!(parsed.kind, Some(Kind::QuotaExhausted));
        assert_eq!(parsed.message_kind, None);

        // Within a detail, and within a violation.
        let detail = r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1s","retryDelay":"2s"}]}}"#;
        assert_eq!(
            parse(detail).unwrap().retry_delay,
            Some(Duration::from_secs(2))
        );
        let violation = r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"PerDay","quotaId":"PerMinute"}]}]}}"#;
        assert!(!parse(violation).unwrap().daily_quota);
        let violation = violation.replace(
            r#""PerDay","quotaId":"PerMinute""#,
            r#""PerMinute","quotaId":"PerDay""#,
        );
        assert!(parse(&violation).unwrap().daily_quota);
    }

    #[test]
    fn a_value_of_the_wrong_type_is_ignored_not_an_error() {
        let nothing = Some(ErrorBody::default());
        for body in [
            r#"{"type":5}"#,
            r#"{"type":["rate_limit_error"]}"#,
            r#"{"error":{"type":{"rate_limit_error":1}}}"#,
            r#"{"error":{"code":429,"status":null,"message":false}}"#,
            r#"{"error":{"innererror":"ResponsibleAIPolicyViolation"}}"#,
            r#"{"error":{"innererror":{"code":7}}}"#,
            r#"{"error":{"details":"x"}}"#,
            r#"{"error":{"details":{"error_code":["enforced_spend_limit_reached"]}}}"#,
            r#"{"error":{"details":[1,"x",null,[],{"@type":5}]}}"#,
            r#"{"error":{"errors":{}}}"#,
            r#"{"error":{"errors":[{"reason":1},"rateLimitExceeded",[]]}}"#,
            r#"{"error":{"details":[{"@type":"google.rpc.QuotaFailure","violations":3}]}}"#,
            r#"{"error":{"details":[{"@type":"google.rpc.QuotaFailure","violations":[3,"PerDay",{"quotaId":1}]}]}}"#,
            r#"{"error":{"details":[{"@type":"google.rpc.ErrorInfo","reason":{},"metadata":"PerDay"}]}}"#,
            r#"{"error":{"details":[{"@type":"google.rpc.RetryInfo","retryDelay":34}]}}"#,
            r#"{"error":7}"#,
            r#"{"error":[{"type":"rate_limit_error"}]}"#,
            r#"[{"error":null},{"type":"rate_limit_error"}]"#,
        ] {
            assert_eq!(parse(body), nothing, "{body}");
        }
        // Not an object at the root, or as the array's first item.
        for body in [
            "[]",
            "[1]",
            r#"[[{"type":"rate_limit_error"}]]"#,
            r#"["x",{}]"#,
        ] {
            assert_eq!(parse(body), None, "{body}");
        }
    }

    #[test]
    fn only_the_first_sixteen_details_are_looked_at_and_the_rest_is_still_read() {
        let first = details_with_retry_info_at(0, 40);
        assert_eq!(
            parse(&first).unwrap().retry_delay,
            Some(Duration::from_secs(34))
        );
        let sixteenth = details_with_retry_info_at(MAX_ITEMS - 1, 40);
        assert_eq!(
            parse(&sixteenth).unwrap().retry_delay,
            Some(Duration::from_secs(34))
        );
        let seventeenth = details_with_retry_info_at(MAX_ITEMS, 40);
        let parsed = parse(&seventeenth).unwrap();
        assert_eq!(parsed.retry_delay, None);
        assert_eq!(parsed.kind, Some(Kind::RateLimited));
        // Past the 16th, the items are skipped but must still be valid JSON.
        let broken = seventeenth.replacen("{}", "{", MAX_ITEMS + 2);
        assert_eq!(parse(&broken), None);
        // The same cap holds for violations and legacy errors.
        let violations = format!(
            r#"{{"error":{{"details":[{{"@type":"google.rpc.QuotaFailure","violations":[{}{{"quotaId":"PerDay"}}]}}]}}}}"#,
            "{},".repeat(MAX_ITEMS)
        );
        assert!(!parse(&violations).unwrap().daily_quota);
        let errors = format!(
            r#"{{"error":{{"errors":[{}{{"reason":"rateLimitExceeded"}}]}}}}"#,
            "{},".repeat(MAX_ITEMS)
        );
        assert_eq!(kind(&errors), None);
    }

    #[test]
    fn an_escaped_string_is_unescaped() {
        let body = r#"{"error":{"type":"rate\u005flimit_error"}}"#;
        assert_eq!(kind(body), Some(Kind::RateLimited));
        let key = r#"{"error":{"typ\u0065":"overloaded_error"}}"#;
        assert_eq!(kind(key), Some(Kind::Overloaded));
        let message = r#"{"error":"prompt is too \u006cong"}"#;
        assert_eq!(
            parse(message).unwrap().message_kind,
            Some(Kind::ContextTooLong)
        );
    }

    #[test]
    fn what_serde_json_refuses_in_a_skipped_value_still_fails_the_parse() {
        for skipped in [
            "1e400",       // out of the range of f64
            r#""\ud800""#, // lone surrogate
            r#""\x""#,     // invalid escape
            "[1,]",        // trailing comma
            "01",          // leading zero
        ] {
            let body = format!(r#"{{"param":{skipped},"type":"rate_limit_error"}}"#);
            assert_eq!(parse(&body), None, "{body}");
        }
        let mut invalid_utf8 = br#"{"param":"x","type":"overloaded_error"}"#.to_vec();
        invalid_utf8[10] = 0xff;
        assert_eq!(ErrorBody::parse(&invalid_utf8), None);
    }

    #[test]
    fn nesting_is_bounded_in_skipped_values_too() {
        let within = |depth: usize| {
            format!(
                r#"{{"param":{}1{},"type":"overloaded_error"}}"#,
                r#"{"a":"#.repeat(depth),
                "}".repeat(depth)
            )
        };
        // 127 levels in all, the root object's included.
        assert_eq!(kind(&within(126)), Some(Kind::Overloaded));
        assert_eq!(parse(&within(127)), None);
        for depth in [1_000, 100_000] {
            assert_eq!(parse(&within(depth)), None);
            assert_eq!(parse(&"[".repeat(depth)), None);
            assert_eq!(parse(&r#"{"a":"#.repeat(depth)), None);
            let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            assert_eq!(parse(&arrays), None);
        }
        // Inside the fields read: a detail, a violation.
        let violation = format!(
            r#"{{"error":{{"details":[{{"@type":"google.rpc.QuotaFailure","violations":[{}]}}]}}}}"#,
            "[".repeat(200) + &"]".repeat(200)
        );
        assert_eq!(parse(&violation), None);
    }

    // Generated bodies: the keys and values the parse reads, in the places it reads them and
    // elsewhere, of every JSON type, repeated, escaped, nested, then possibly cut or damaged.

    const STRINGS: &[&str] = &[
        "",
        "error",
        "x",
        "rate_limit_error",
        "rate\\u005flimit_error",
        "overloaded_error",
        "insufficient_quota",
        "server_error",
        "invalid_request_error",
        "context_length_exceeded",
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
        "rateLimitExceeded",
        "enforced_spend_limit_reached",
        "ResponsibleAIPolicyViolation",
        "type.googleapis.com/google.rpc.RetryInfo",
        "type.googleapis.com/google.rpc.QuotaFailure",
        "type.googleapis.com/google.rpc.ErrorInfo",
        "google.rpc.RetryInfo",
        "34s",
        "1.5s",
        "-3s",
        "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
        "Gemini25ProRequestsPerDay",
        "daily",
        "prompt is too long",
        "Your credit balance is too low",
        "\\uD83D\\uDE00",
        "tab\\there",
    ];

    const SCALARS: &[&str] = &[
        "null", "true", "false", "0", "429", "-1", "1.5", "1e3", "-0", "[]", "{}",
    ];

    /// Values `serde_json` refuses.
    const INVALID: &[&str] = &["1e400", "01", "\"\\ud800\"", "\"\\x\"", "[1,]", "{\"a\"}"];

    const KEYS: &[&str] = &[
        "error",
        "message",
        "type",
        "typ\\u0065",
        "code",
        "status",
        "innererror",
        "details",
        "errors",
        "error_code",
        "@type",
        "retryDelay",
        "violations",
        "reason",
        "metadata",
        "quotaId",
        "quotaMetric",
        "description",
        "subject",
        "quota_limit",
        "quota_id",
        "param",
        "",
    ];

    const TYPE_URLS: &[&str] = &[
        "type.googleapis.com/google.rpc.RetryInfo",
        "type.googleapis.com/google.rpc.QuotaFailure",
        "type.googleapis.com/google.rpc.ErrorInfo",
    ];

    /// Mostly one of `strings`, sometimes any text.
    fn one_of(strings: &'static [&'static str]) -> BoxedStrategy<String> {
        let quoted = prop::sample::select(strings).prop_map(|text| format!("\"{text}\""));
        prop_oneof![3 => quoted, 1 => text()].boxed()
    }

    fn string() -> BoxedStrategy<String> {
        prop::sample::select(STRINGS)
            .prop_map(|text| format!("\"{text}\""))
            .boxed()
    }

    fn object(entries: Vec<(&str, String)>) -> String {
        let entries: Vec<String> = entries
            .into_iter()
            .map(|(key, value)| format!("\"{key}\":{value}"))
            .collect();
        format!("{{{}}}", entries.join(","))
    }

    fn array(items: Vec<String>) -> String {
        format!("[{}]", items.join(","))
    }

    /// Any JSON value built of the keys and strings above.
    fn any_json() -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            100 => string(),
            100 => prop::sample::select(SCALARS).prop_map(str::to_owned),
            1 => prop::sample::select(INVALID).prop_map(str::to_owned),
        ];
        leaf.prop_recursive(4, 16, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..5).prop_map(object),
            ]
        })
        .boxed()
    }

    /// Mostly a string, sometimes any other value.
    fn text() -> BoxedStrategy<String> {
        prop_oneof![6 => string(), 1 => any_json()].boxed()
    }

    /// An object of entries drawn from `entries` and from any key, or sometimes any value.
    fn object_of(entries: BoxedStrategy<(&'static str, String)>) -> BoxedStrategy<String> {
        let entry = prop_oneof![
            6 => entries,
            1 => (prop::sample::select(KEYS), any_json()),
        ];
        prop_oneof![
            10 => prop::collection::vec(entry, 0..6).prop_map(object),
            1 => any_json(),
        ]
        .boxed()
    }

    /// An array of up to 20 `items`, or sometimes any value.
    fn array_of(items: BoxedStrategy<String>) -> BoxedStrategy<String> {
        prop_oneof![
            10 => prop::collection::vec(items, 0..20).prop_map(array),
            1 => any_json(),
        ]
        .boxed()
    }

    fn quota_names() -> BoxedStrategy<String> {
        object_of((prop::sample::select(&QUOTA_KEYS[..]), text()).boxed())
    }

    fn google_detail() -> BoxedStrategy<String> {
        object_of(
            prop_oneof![
                (Just("@type"), one_of(TYPE_URLS)),
                (
                    Just("retryDelay"),
                    one_of(&["34s", "1.5s", "-3s", "0.000000001s"])
                ),
                (Just("reason"), text()),
                (Just("violations"), array_of(quota_names())),
                (Just("metadata"), quota_names()),
            ]
            .boxed(),
        )
    }

    fn fields() -> BoxedStrategy<(&'static str, String)> {
        prop_oneof![
            (
                prop::sample::select(&["message", "type", "typ\\u0065", "code", "status"][..]),
                text()
            ),
            (
                Just("innererror"),
                object_of((Just("code"), text()).boxed())
            ),
            (
                Just("details"),
                prop_oneof![
                    array_of(google_detail()),
                    object_of((Just("error_code"), text()).boxed()),
                ]
            ),
            (
                Just("errors"),
                array_of(object_of((Just("reason"), text()).boxed()))
            ),
        ]
        .boxed()
    }

    fn body() -> impl Strategy<Value = String> {
        let error = prop_oneof![object_of(fields()), text()];
        let root = object_of(prop_oneof![3 => fields(), 1 => (Just("error"), error)].boxed());
        prop_oneof![
            8 => root.clone(),
            1 => (root, prop::collection::vec(any_json(), 0..3))
                .prop_map(|(root, rest)| array([vec![root], rest].concat())),
            1 => any_json(),
        ]
    }

    /// A body, left whole, cut, or with one byte changed.
    fn damaged_body() -> impl Strategy<Value = Vec<u8>> {
        (body(), 0_u8..10, any::<prop::sample::Index>(), any::<u8>()).prop_map(
            |(body, damage, at, byte)| {
                let mut body = body.into_bytes();
                let at = at.index(body.len() + 1);
                match damage {
                    0 => body.truncate(at),
                    1 if at < body.len() => body[at] = byte,
                    2 => body.insert(at, byte),
                    _ => {}
                }
                body
            },
        )
    }

    /// Whether `body` is what the parse reads at all: JSON whose root, or whose array's first
    /// item, is an object.
    fn is_readable(body: &[u8]) -> bool {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(_)) => true,
            Ok(Value::Array(items)) => items.first().is_some_and(Value::is_object),
            _ => false,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn a_damaged_body_is_read_exactly_when_it_is_still_an_error_object(body in damaged_body()) {
            prop_assert_eq!(ErrorBody::parse(&body).is_some(), is_readable(&body));
        }

        #[test]
        fn an_object_reads_the_same_alone_and_as_the_first_item_of_an_array(body in body()) {
            let wrapped = format!("[{body}, 1]");
            if body.trim_start().starts_with('{') {
                prop_assert_eq!(ErrorBody::parse(body.as_bytes()), ErrorBody::parse(wrapped.as_bytes()));
            }
        }

        #[test]
        fn arbitrary_bytes_are_read_exactly_when_they_are_an_error_object(
            body in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            prop_assert_eq!(ErrorBody::parse(&body).is_some(), is_readable(&body));
        }
    }
}
