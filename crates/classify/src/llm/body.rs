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
//! The body is parsed once with `serde_json` (whose recursion limit of 128 bounds nesting) and
//! then read at fixed paths: nothing here recurses, loops over more than a few array items, or
//! reads past [`ERROR_BODY_LIMIT`](crate::ERROR_BODY_LIMIT) bytes. A body that is empty, not
//! JSON, truncated or of another shape yields nothing, and the status decides alone.

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
    let (haystack, needle) = (haystack.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle))
}

fn string<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(Value::as_str)
}

/// Does a `google.rpc.QuotaFailure` violation (or an `ErrorInfo`'s metadata) name a daily quota
/// (`GenerateRequestsPerDayPerProjectPerModel-FreeTier`, `Gemini25ProRequestsPerDay`)?
fn names_daily_quota(object: &Value) -> bool {
    [
        "quotaId",
        "quotaMetric",
        "description",
        "subject",
        "quota_limit",
        "quota_id",
    ]
    .iter()
    .filter_map(|key| object.get(key).and_then(Value::as_str))
    .any(|text| {
        contains_ignore_case(text, "perday")
            || contains_ignore_case(text, "per_day")
            || contains_ignore_case(text, "per day")
            || contains_ignore_case(text, "daily")
    })
}

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
        let root = match &value {
            Value::Array(items) => items.first()?,
            other => other,
        };
        let root = root.as_object()?;
        let (fields, message) = match root.get("error") {
            Some(Value::Object(error)) => (error, string(error, "message")),
            Some(Value::String(message)) => (root, Some(message.as_str())),
            _ => (root, string(root, "message")),
        };

        let mut parsed = ErrorBody::default();
        let mut tokens: Vec<&str> = Vec::with_capacity(8);
        tokens.extend(string(fields, "type"));
        tokens.extend(string(fields, "code"));
        tokens.extend(string(fields, "status"));
        if let Some(inner) = fields.get("innererror").and_then(Value::as_object) {
            tokens.extend(string(inner, "code"));
        }
        if let Some(kind) = string(root, "type").filter(|kind| *kind != "error") {
            tokens.push(kind);
        }
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
            tokens.extend(
                errors
                    .iter()
                    .take(MAX_ITEMS)
                    .filter_map(|error| error.get("reason").and_then(Value::as_str)),
            );
        }
        parsed.kind = tokens.into_iter().filter_map(Kind::of_token).min();
        parsed.message_kind = message.and_then(Kind::of_message);
        Some(parsed)
    }

    /// Reads one `google.rpc` detail: `RetryInfo` (the hint), `QuotaFailure` and `ErrorInfo`
    /// (daily quotas, reason tokens).
    fn read_google_detail<'a>(&mut self, detail: &'a Value, tokens: &mut Vec<&'a str>) {
        let Some(kind) = detail.get("@type").and_then(Value::as_str) else {
            return;
        };
        if kind.ends_with("google.rpc.RetryInfo") {
            self.retry_delay = detail
                .get("retryDelay")
                .and_then(Value::as_str)
                .and_then(hint::protobuf_duration);
        } else if kind.ends_with("google.rpc.QuotaFailure") {
            let violations = detail.get("violations").and_then(Value::as_array);
            self.daily_quota |=
                violations.is_some_and(|list| list.iter().take(MAX_ITEMS).any(names_daily_quota));
        } else if kind.ends_with("google.rpc.ErrorInfo") {
            tokens.extend(detail.get("reason").and_then(Value::as_str));
            self.daily_quota |= detail.get("metadata").is_some_and(names_daily_quota);
        }
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
