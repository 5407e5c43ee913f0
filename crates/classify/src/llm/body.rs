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
//! The body is parsed once with `serde_json` (whose recursion limit of 128 bounds nesting, in
//! skipped values too) into only the fields read at those fixed paths: their strings are borrowed
//! from the body (copied only when escaped), everything else is skipped, so a typical body is
//! read without allocating. Nothing here recurses past that limit, looks at more than a few array
//! items, or reads past [`ERROR_BODY_LIMIT`](crate::ERROR_BODY_LIMIT) bytes. A repeated key's last
//! value counts, as in a JSON object read whole. A body that is empty, not JSON, truncated or of
//! another shape yields nothing, and the status decides alone.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

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

/// ASCII case-insensitive substring search, no allocation. Only positions whose byte matches the
/// needle's first are compared further: a token is tried against some 40 needles.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let (haystack, needle) = (haystack.as_bytes(), needle.as_bytes());
    let Some((first, rest)) = needle.split_first() else {
        return true;
    };
    let first = first.to_ascii_lowercase();
    haystack.windows(needle.len()).any(|window| {
        window[0].to_ascii_lowercase() == first && window[1..].eq_ignore_ascii_case(rest)
    })
}

/// Does the text of a `google.rpc.QuotaFailure` violation (or of an `ErrorInfo`'s metadata) name a
/// daily quota (`GenerateRequestsPerDayPerProjectPerModel-FreeTier`, `Gemini25ProRequestsPerDay`)?
fn names_daily_quota(text: &str) -> bool {
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
        let At(Body(root)) = serde_json::from_slice(body).ok()?;
        let root = root?;
        let (fields, message) = match &root.error {
            Error::Object(error) => (error, error.message.as_deref()),
            Error::Message(message) => (&root.fields, Some(&**message)),
            Error::Other => (&root.fields, root.fields.message.as_deref()),
        };
        let root_kind = root.fields.kind.as_deref().filter(|kind| *kind != "error");
        let tokens = [
            fields.kind.as_deref(),
            fields.code.as_deref(),
            fields.status.as_deref(),
            fields.inner_code.0.as_deref(),
            root_kind,
        ];
        let kind = tokens
            .into_iter()
            .flatten()
            .filter_map(Kind::of_token)
            .chain(fields.details.kind)
            .chain(fields.errors.0)
            .min();
        Some(ErrorBody {
            kind,
            retry_delay: fields.details.retry_delay,
            daily_quota: fields.details.daily_quota,
            message_kind: message.and_then(Kind::of_message),
        })
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

// The body's shape, read in one pass: each position deserializes only what `parse` uses, borrows
// strings from the body (an escaped string, which cannot be borrowed, is copied), and skips
// everything else.

/// A JSON string, borrowed from the body unless it has escapes; `None` for any other value.
type Text<'de> = Option<Cow<'de, str>>;

/// What one position of the body reads out of the JSON value found there.
///
/// Each method reads nothing by default: a value of another type than a position expects is
/// consumed and ignored, never an error, as `serde_json::Value::as_str` and friends ignored it.
/// Skipping goes through `deserialize_any` like a `serde_json::Value` does, not through
/// `IgnoredAny` (whose iterative skipping neither applies the recursion limit nor checks numbers'
/// range, UTF-8 and surrogate escapes): the bodies accepted are exactly those `serde_json`
/// accepts, and the recursion limit of 128 holds in skipped values too.
trait Read<'de>: Default {
    /// A string without escapes, borrowed from the body.
    fn borrowed_str(text: &'de str) -> Self {
        Self::str(text)
    }

    /// A string that had escapes, unescaped into `serde_json`'s scratch buffer.
    fn str(_text: &str) -> Self {
        Self::default()
    }

    /// An object, whose entries must all be consumed.
    fn object<A: MapAccess<'de>>(mut object: A) -> Result<Self, A::Error> {
        while object.next_entry::<At<()>, At<()>>()?.is_some() {}
        Ok(Self::default())
    }

    /// An array, whose items must all be consumed.
    fn array<A: SeqAccess<'de>>(mut array: A) -> Result<Self, A::Error> {
        while array.next_element::<At<()>>()?.is_some() {}
        Ok(Self::default())
    }
}

/// Reads `T` out of whatever JSON value comes next.
struct At<T>(T);

impl<'de, T: Read<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AtVisitor(PhantomData))
    }
}

struct AtVisitor<T>(PhantomData<T>);

impl<'de, T: Read<'de>> Visitor<'de> for AtVisitor<T> {
    type Value = At<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<At<T>, E> {
        Ok(At(T::default()))
    }

    fn visit_i64<E>(self, _: i64) -> Result<At<T>, E> {
        Ok(At(T::default()))
    }

    fn visit_u64<E>(self, _: u64) -> Result<At<T>, E> {
        Ok(At(T::default()))
    }

    fn visit_f64<E>(self, _: f64) -> Result<At<T>, E> {
        Ok(At(T::default()))
    }

    fn visit_unit<E>(self) -> Result<At<T>, E> {
        Ok(At(T::default()))
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<At<T>, E> {
        Ok(At(T::borrowed_str(text)))
    }

    fn visit_str<E>(self, text: &str) -> Result<At<T>, E> {
        Ok(At(T::str(text)))
    }

    fn visit_map<A: MapAccess<'de>>(self, object: A) -> Result<At<T>, A::Error> {
        T::object(object).map(At)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, array: A) -> Result<At<T>, A::Error> {
        T::array(array).map(At)
    }
}

/// Skips a value.
impl Read<'_> for () {}

impl<'de> Read<'de> for Text<'de> {
    fn borrowed_str(text: &'de str) -> Self {
        Some(Cow::Borrowed(text))
    }

    fn str(text: &str) -> Self {
        Some(Cow::Owned(text.to_owned()))
    }
}

/// Reads the value of the entry whose key was just read.
fn value<'de, T: Read<'de>, A: MapAccess<'de>>(object: &mut A) -> Result<T, A::Error> {
    object.next_value::<At<T>>().map(|At(value)| value)
}

/// Skips the value of the entry whose key was just read.
fn skip<'de, A: MapAccess<'de>>(object: &mut A) -> Result<(), A::Error> {
    value::<(), A>(object)
}

/// Calls `entry` with each key of an object; `entry` must consume the value (read or skip it).
/// A repeated key is read again, so the last value wins, as in a `serde_json::Map`.
fn read_object<'de, A: MapAccess<'de>>(
    mut object: A,
    mut entry: impl FnMut(&str, &mut A) -> Result<(), A::Error>,
) -> Result<(), A::Error> {
    while let Some(At(key)) = object.next_key::<At<Text<'de>>>()? {
        entry(key.as_deref().unwrap_or_default(), &mut object)?;
    }
    Ok(())
}

/// Reads the string at `name` in an object (the last one if repeated), skipping the rest.
fn read_member<'de, A: MapAccess<'de>>(object: A, name: &str) -> Result<Text<'de>, A::Error> {
    let mut member = None;
    read_object(object, |key, object| {
        if key == name {
            member = value(object)?;
            Ok(())
        } else {
            skip(object)
        }
    })?;
    Ok(member)
}

/// Hands the first [`MAX_ITEMS`] items of an array to `item` and skips the others.
fn read_items<'de, T: Read<'de>, A: SeqAccess<'de>>(
    mut array: A,
    mut item: impl FnMut(T),
) -> Result<(), A::Error> {
    for _ in 0..MAX_ITEMS {
        match array.next_element::<At<T>>()? {
            Some(At(value)) => item(value),
            None => return Ok(()),
        }
    }
    while array.next_element::<At<()>>()?.is_some() {}
    Ok(())
}

/// The whole body: an object, or an array whose first item is the object.
#[derive(Default)]
struct Body<'de>(Option<Root<'de>>);

impl<'de> Read<'de> for Body<'de> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        Root::object(object).map(|root| Body(Some(root)))
    }

    fn array<A: SeqAccess<'de>>(mut array: A) -> Result<Self, A::Error> {
        let first = array.next_element::<At<Option<Root<'de>>>>()?;
        while array.next_element::<At<()>>()?.is_some() {}
        Ok(Body(first.and_then(|At(root)| root)))
    }
}

/// The root object: its own fields, which describe the error unless `error` is an object, and
/// `error`.
#[derive(Default)]
struct Root<'de> {
    fields: Fields<'de>,
    error: Error<'de>,
}

impl<'de> Read<'de> for Root<'de> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        let mut root = Root::default();
        read_object(object, |key, object| {
            if key == "error" {
                root.error = value(object)?;
                Ok(())
            } else {
                root.fields.read(key, object)
            }
        })?;
        Ok(root)
    }
}

/// The first item of an array body: the root if it is an object.
impl<'de> Read<'de> for Option<Root<'de>> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        Root::object(object).map(Some)
    }
}

/// The root's `error`.
#[derive(Default)]
enum Error<'de> {
    /// Absent, or neither an object nor a string.
    #[default]
    Other,
    /// The object that holds the fields.
    Object(Fields<'de>),
    /// The message itself.
    Message(Cow<'de, str>),
}

impl<'de> Read<'de> for Error<'de> {
    fn borrowed_str(text: &'de str) -> Self {
        Error::Message(Cow::Borrowed(text))
    }

    fn str(text: &str) -> Self {
        Error::Message(Cow::Owned(text.to_owned()))
    }

    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        Fields::object(object).map(Error::Object)
    }
}

/// The fields that describe the error: the `error` object's, or the root's own.
#[derive(Default)]
struct Fields<'de> {
    message: Text<'de>,
    /// `type`.
    kind: Text<'de>,
    code: Text<'de>,
    status: Text<'de>,
    /// Azure's `innererror.code`.
    inner_code: InnerError<'de>,
    details: Details,
    errors: LegacyErrors,
}

impl<'de> Fields<'de> {
    /// Reads the value of the entry `key` if it is one of the fields, or skips it.
    fn read<A: MapAccess<'de>>(&mut self, key: &str, object: &mut A) -> Result<(), A::Error> {
        match key {
            "message" => self.message = value(object)?,
            "type" => self.kind = value(object)?,
            "code" => self.code = value(object)?,
            "status" => self.status = value(object)?,
            "innererror" => self.inner_code = value(object)?,
            "details" => self.details = value(object)?,
            "errors" => self.errors = value(object)?,
            _ => skip(object)?,
        }
        Ok(())
    }
}

impl<'de> Read<'de> for Fields<'de> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        let mut fields = Fields::default();
        read_object(object, |key, object| fields.read(key, object))?;
        Ok(fields)
    }
}

/// Azure's `innererror: {"code": ...}`.
#[derive(Default)]
struct InnerError<'de>(Text<'de>);

impl<'de> Read<'de> for InnerError<'de> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        read_member(object, "code").map(InnerError)
    }
}

/// What `details` says, read as it streams by: Anthropic's object or Google's typed array.
#[derive(Default)]
struct Details {
    /// The most specific kind among Anthropic's `error_code` or Google's `ErrorInfo` reasons.
    kind: Option<Kind>,
    /// The last `RetryInfo`'s `retryDelay`.
    retry_delay: Option<Duration>,
    /// A `QuotaFailure` or an `ErrorInfo` names a daily quota.
    daily_quota: bool,
}

impl<'de> Read<'de> for Details {
    /// Anthropic: `"details": {"error_code": "enforced_spend_limit_reached"}`.
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        let error_code = read_member(object, "error_code")?;
        Ok(Details {
            kind: error_code.as_deref().and_then(Kind::of_token),
            ..Details::default()
        })
    }

    /// Google: typed `google.rpc` details.
    fn array<A: SeqAccess<'de>>(array: A) -> Result<Self, A::Error> {
        let mut details = Details::default();
        read_items(array, |detail| details.add(detail))?;
        Ok(details)
    }
}

impl Details {
    /// Takes in one `google.rpc` detail: `RetryInfo` (the hint), `QuotaFailure` and `ErrorInfo`
    /// (daily quotas, reason tokens).
    fn add(&mut self, detail: GoogleDetail<'_>) {
        let Some(kind) = detail.type_url else {
            return;
        };
        if kind.ends_with("google.rpc.RetryInfo") {
            self.retry_delay = detail
                .retry_delay
                .as_deref()
                .and_then(hint::protobuf_duration);
        } else if kind.ends_with("google.rpc.QuotaFailure") {
            self.daily_quota |= detail.violations.0;
        } else if kind.ends_with("google.rpc.ErrorInfo") {
            let reason = detail.reason.as_deref().and_then(Kind::of_token);
            self.kind = self.kind.into_iter().chain(reason).min();
            self.daily_quota |= detail.metadata.0;
        }
    }
}

/// One `google.rpc` detail, the fields of all three types read.
#[derive(Default)]
struct GoogleDetail<'de> {
    /// `@type`.
    type_url: Text<'de>,
    /// `RetryInfo.retryDelay`.
    retry_delay: Text<'de>,
    /// `QuotaFailure.violations`.
    violations: Violations,
    /// `ErrorInfo.reason`.
    reason: Text<'de>,
    /// `ErrorInfo.metadata`.
    metadata: DailyQuota,
}

impl<'de> Read<'de> for GoogleDetail<'de> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        let mut detail = GoogleDetail::default();
        read_object(object, |key, object| {
            match key {
                "@type" => detail.type_url = value(object)?,
                "retryDelay" => detail.retry_delay = value(object)?,
                "violations" => detail.violations = value(object)?,
                "reason" => detail.reason = value(object)?,
                "metadata" => detail.metadata = value(object)?,
                _ => skip(object)?,
            }
            Ok(())
        })?;
        Ok(detail)
    }
}

/// `QuotaFailure.violations`: does one of the first [`MAX_ITEMS`] name a daily quota?
#[derive(Default)]
struct Violations(bool);

impl<'de> Read<'de> for Violations {
    fn array<A: SeqAccess<'de>>(array: A) -> Result<Self, A::Error> {
        let mut daily = false;
        read_items(array, |DailyQuota(names)| daily |= names)?;
        Ok(Violations(daily))
    }
}

/// Does an object's [`QUOTA_KEYS`] text name a daily quota?
#[derive(Default)]
struct DailyQuota(bool);

impl<'de> Read<'de> for DailyQuota {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        // One answer per key, so that a repeated key's last value decides.
        let mut named = [false; QUOTA_KEYS.len()];
        read_object(object, |key, object| {
            match QUOTA_KEYS.iter().position(|name| *name == key) {
                Some(index) => {
                    let text: Text<'_> = value(object)?;
                    named[index] = text.as_deref().is_some_and(names_daily_quota);
                    Ok(())
                }
                None => skip(object),
            }
        })?;
        Ok(DailyQuota(named.contains(&true)))
    }
}

/// Google's legacy `errors: [{"reason": "rateLimitExceeded", ...}]`: the most specific kind among
/// the first [`MAX_ITEMS`] reasons.
#[derive(Default)]
struct LegacyErrors(Option<Kind>);

impl<'de> Read<'de> for LegacyErrors {
    fn array<A: SeqAccess<'de>>(array: A) -> Result<Self, A::Error> {
        let mut kind = None;
        read_items(array, |LegacyError(reason)| {
            let reason = reason.as_deref().and_then(Kind::of_token);
            kind = kind.into_iter().chain(reason).min();
        })?;
        Ok(LegacyErrors(kind))
    }
}

/// One legacy error's `reason`.
#[derive(Default)]
struct LegacyError<'de>(Text<'de>);

impl<'de> Read<'de> for LegacyError<'de> {
    fn object<A: MapAccess<'de>>(object: A) -> Result<Self, A::Error> {
        read_member(object, "reason").map(LegacyError)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::*;

    /// The parse this module replaced: the whole body into a `serde_json::Value`, then read at
    /// fixed paths. The reference the streaming parse must agree with on every input.
    fn reference(body: &[u8]) -> Option<ErrorBody> {
        fn string<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
            object.get(key).and_then(Value::as_str)
        }
        fn names_daily_quota(object: &Value) -> bool {
            QUOTA_KEYS
                .iter()
                .filter_map(|key| object.get(key).and_then(Value::as_str))
                .any(super::names_daily_quota)
        }
        fn read_google_detail<'a>(
            parsed: &mut ErrorBody,
            detail: &'a Value,
            tokens: &mut Vec<&'a str>,
        ) {
            let Some(kind) = detail.get("@type").and_then(Value::as_str) else {
                return;
            };
            if kind.ends_with("google.rpc.RetryInfo") {
                parsed.retry_delay = detail
                    .get("retryDelay")
                    .and_then(Value::as_str)
                    .and_then(hint::protobuf_duration);
            } else if kind.ends_with("google.rpc.QuotaFailure") {
                let violations = detail.get("violations").and_then(Value::as_array);
                parsed.daily_quota |= violations
                    .is_some_and(|list| list.iter().take(MAX_ITEMS).any(names_daily_quota));
            } else if kind.ends_with("google.rpc.ErrorInfo") {
                tokens.extend(detail.get("reason").and_then(Value::as_str));
                parsed.daily_quota |= detail.get("metadata").is_some_and(names_daily_quota);
            }
        }

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
            Some(Value::Object(details)) => tokens.extend(string(details, "error_code")),
            Some(Value::Array(details)) => {
                for detail in details.iter().take(MAX_ITEMS) {
                    read_google_detail(&mut parsed, detail, &mut tokens);
                }
            }
            _ => {}
        }
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

    /// Parses with both parsers, asserts they agree, and returns the answer.
    fn parse(body: &str) -> Option<ErrorBody> {
        let parsed = ErrorBody::parse(body.as_bytes());
        assert_eq!(parsed, reference(body.as_bytes()), "{body}");
        parsed
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
        assert_eq!(reference(&invalid_utf8), None);
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

    // Generated bodies for comparing with the reference: the keys and values the parse reads,
    // in the places it reads them and elsewhere, of every JSON type, repeated, escaped, nested,
    // then possibly cut or damaged.

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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn agrees_with_the_value_parse_on_generated_bodies(body in damaged_body()) {
            prop_assert_eq!(ErrorBody::parse(&body), reference(&body));
        }

        #[test]
        fn agrees_with_the_value_parse_on_arbitrary_bytes(
            body in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            prop_assert_eq!(ErrorBody::parse(&body), reference(&body));
        }
    }
}
