//! `RateLimit` (stormguard-rate-limit) learning from arbitrary answers of a provider: up to four
//! requests, each reserved, sent and told an arbitrary status, arbitrary values of every header
//! the limit reads (OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, Anthropic's
//! `anthropic-ratelimit-*` with RFC 3339 resets, `retry-after`, `retry-after-ms`) and an arbitrary
//! body, whose `usage` corrects the token weight; configured or learned limits, keyed or not.
//!
//! No panic, no overflow; configured limits are never replaced, a stated
//! `x-ratelimit-limit-{requests,tokens}` is the limit in force (capped at 2^32 - 1 a minute, 0
//! stating nothing); a quota stated spent (`remaining: 0` with a reset) and a 429's hint hold
//! the next request until then; only a request heavier than a minute's quota is refused; and no
//! request waits longer than a day (the longest wait the limit believes) plus a minute for each
//! request before it: no limit of 0, no reset in the year 9999 and no usage of 2^64 tokens
//! stalls the limit.

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use stormguard_classify::hint::{HINT_CEILING, go_duration};
use stormguard_classify::{LlmClassifier, Outcome, Permit, Reason, headers};
use stormguard_numbers::decimal::{DecimalError, parse_decimal};
use stormguard_rate_limit::{
    RateLimit, RateLimitCause, RateLimitConfig, RateLimitSnapshot, RateLimited, Reservation,
    usage_tokens,
};

/// The statuses an answer may have (picked by the low 3 bits of its first byte).
const STATUSES: [u16; 8] = [200, 200, 429, 429, 500, 503, 529, 400];

/// The limit's `max_wait`: longer than any wait it may impose, so that a refusal for want of a
/// slot is a stall.
const PATIENT: Duration = Duration::from_secs(3 * 24 * 3600);

/// The debt one request may leave in one dimension: a minute of the rate (a request weighs at
/// most a minute's quota), and the pacing interval's rounding up (under a nanosecond a unit, at
/// most 2^32 units).
const MINUTE: Duration = Duration::from_secs(65);

/// The request header a keyed limit takes its key from.
const KEY: HeaderName = HeaderName::from_static("x-key");

fn names() -> Vec<HeaderName> {
    vec![
        headers::X_RATELIMIT_LIMIT_REQUESTS,
        headers::X_RATELIMIT_LIMIT_TOKENS,
        headers::X_RATELIMIT_REMAINING_REQUESTS,
        headers::X_RATELIMIT_REMAINING_TOKENS,
        headers::X_RATELIMIT_RESET_REQUESTS,
        headers::X_RATELIMIT_RESET_TOKENS,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_LIMIT,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_REQUESTS_RESET,
        headers::ANTHROPIC_RATELIMIT_TOKENS_LIMIT,
        headers::ANTHROPIC_RATELIMIT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_TOKENS_RESET,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_LIMIT,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_REMAINING,
        headers::ANTHROPIC_RATELIMIT_INPUT_TOKENS_RESET,
        headers::RETRY_AFTER,
        headers::RETRY_AFTER_MS,
    ]
}

/// A count header as the provider's documentation defines it: decimal digits, capped at 2^32 - 1.
fn count(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    match parse_decimal(headers.get(name)?.as_bytes().trim_ascii()) {
        Ok(count) => Some(count.min(u64::from(u32::MAX))),
        Err(DecimalError::TooLarge) => Some(u64::from(u32::MAX)),
        Err(_) => None,
    }
}

/// How long the quota an OpenAI `remaining` / `reset` pair states spent stays spent, if it does
/// and the wait is believable.
fn spent_for(headers: &HeaderMap, remaining: &HeaderName, reset: &HeaderName) -> Option<Duration> {
    let reset = go_duration(headers.get(reset)?.as_bytes())?;
    (count(headers, remaining) == Some(0) && reset < HINT_CEILING).then_some(reset)
}

/// The longest the `n`-th request (from 0) may wait: a day, and a minute of debt in each
/// dimension (its reservation, and its correction to the usage) for each request before it.
fn longest_wait(n: usize) -> Duration {
    HINT_CEILING + MINUTE * 2 * (n as u32 + 1)
}

/// The unkeyed bucket's limits after an answer with `headers`: the configured ones (`0`: none),
/// else, when learning, what the provider stated; each within 1 ..= 2^32 - 1.
fn check_limits(
    snapshot: &RateLimitSnapshot,
    (requests_per_minute, tokens_per_minute): (Option<u32>, Option<u32>),
    learning: bool,
    headers: &HeaderMap,
) {
    let limit_of = |configured: Option<u32>, stated: &HeaderName| match configured {
        Some(configured) => Some(u64::from(configured)),
        None if learning => count(headers, stated).filter(|&n| n > 0),
        None => None,
    };
    let requests = limit_of(
        requests_per_minute.filter(|&n| n > 0),
        &headers::X_RATELIMIT_LIMIT_REQUESTS,
    );
    if requests_per_minute.is_some_and(|n| n > 0) || requests.is_some() {
        assert_eq!(snapshot.requests_per_minute, requests);
    }
    let tokens = limit_of(
        tokens_per_minute.filter(|&n| n > 0),
        &headers::X_RATELIMIT_LIMIT_TOKENS,
    );
    if tokens_per_minute.is_some_and(|n| n > 0) || tokens.is_some() {
        assert_eq!(snapshot.tokens_per_minute, tokens);
    }
    for per_minute in [snapshot.requests_per_minute, snapshot.tokens_per_minute] {
        assert!(per_minute.is_none_or(|n| (1..=u64::from(u32::MAX)).contains(&n)));
    }
    if !learning {
        assert_eq!(
            snapshot.requests_per_minute,
            requests_per_minute.filter(|&n| n > 0).map(u64::from)
        );
    }
}

/// The limit under test: the `configured` requests and tokens a minute, learning or not, keyed
/// by the `KEY` header (two keys held at most) or not, patient for three days.
fn limit_of(configured: (Option<u32>, Option<u32>), learning: bool, keyed: bool) -> RateLimit {
    let config = RateLimitConfig::default()
        .with_requests_per_minute(configured.0)
        .with_tokens_per_minute(configured.1)
        .with_usage_correction()
        .with_max_wait(PATIENT)
        .with_keys(2, Duration::from_secs(600));
    let config = if learning {
        config
    } else {
        config.without_learning()
    };
    if keyed {
        RateLimit::keyed(config, |head| head.headers.get(KEY).cloned())
    } else {
        RateLimit::new(config)
    }
}

/// The provider's answer with the status `first` picks and `headers`, classified.
fn classified(first: u8, headers: &HeaderMap, body: &[u8]) -> Outcome {
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(STATUSES[usize::from(first & 7)])
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    *response.headers_mut() = headers.clone();
    let (parts, ()) = response.into_parts();
    LlmClassifier::default().classify_http(&parts, body)
}

/// Within a patience of three days, a request is refused only when it weighs more than a whole
/// minute of tokens.
fn assert_too_heavy(limited: &RateLimited) {
    let heavy = matches!(
        limited.cause(),
        RateLimitCause::TooHeavy { tokens, per_minute } if tokens > per_minute
    );
    assert!(heavy, "refused within a patience of 3 days: {limited}");
}

/// Up to `answers` answers the input tells (each a byte that picks its status and key, then its
/// headers), and the body they all carry: the rest.
fn answers_of(mut data: &[u8], answers: u64) -> (Vec<(u8, HeaderMap)>, &[u8]) {
    let names = names();
    let mut told = Vec::new();
    for _ in 0..answers {
        let Some((&first, rest)) = data.split_first() else {
            break;
        };
        let (headers, rest) = crate::input::headers_and_rest(rest, &names);
        told.push((first, headers));
        data = rest;
    }
    (told, data)
}

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let (seed, data) = crate::input::u64_and_rest(data);
    let requests_per_minute = (seed & 1 != 0).then_some(((seed >> 8) & 0xFFFF) as u32);
    let tokens_per_minute = (seed & 2 != 0).then_some(((seed >> 24) & 0xFF_FFFF) as u32);
    let learning = seed & 4 == 0;
    let keyed = seed & 8 != 0;
    let answers = 1 + (seed >> 4) % 4;
    let weight = seed >> 48;
    let configured = (requests_per_minute, tokens_per_minute);
    let limit = limit_of(configured, learning, keyed);

    let (told, body) = answers_of(data, answers);

    let begin = Instant::now();
    for (n, (first, headers)) in told.iter().enumerate() {
        let key = usize::from(first >> 3) % 4;
        let mut head = Request::new(()).into_parts().0;
        if keyed && key < 3 {
            head.headers.insert(KEY, HeaderValue::from(key));
        }
        // Only the unkeyed bucket has a snapshot.
        let unkeyed = !head.headers.contains_key(KEY);
        let reservation = match limit.reserve(&head, weight, None) {
            Ok(reservation) => reservation,
            Err(limited) => {
                assert_too_heavy(&limited);
                continue;
            }
        };
        let start = reservation.start().into_std();
        assert!(
            start.saturating_duration_since(begin) <= longest_wait(n),
            "request {n} waits {:?}",
            start.saturating_duration_since(begin)
        );
        let permit = reservation.send();
        let usage = permit.usage();

        let outcome = classified(*first, headers, body);
        let at = Instant::now();
        permit.record(&outcome, headers);
        if let Some(usage) = usage {
            usage.settle(usage_tokens(body).unwrap_or(weight));
        }

        // What the limit learned holds the next request (of this key) as long as it should, and
        // never longer than it may; one too heavy for a learned minute goes weightless.
        let probe: Reservation = limit
            .reserve(&head, weight, None)
            .or_else(|_| limit.reserve(&head, 0, None))
            .unwrap_or_else(|limited| panic!("a weightless request refused: {limited}"));
        let probe_start = probe.start().into_std();
        assert!(probe_start.saturating_duration_since(begin) <= longest_wait(n + 1));
        if learning {
            let spent = spent_for(
                headers,
                &headers::X_RATELIMIT_REMAINING_REQUESTS,
                &headers::X_RATELIMIT_RESET_REQUESTS,
            );
            let hint = outcome
                .retry_after()
                .filter(|hint| outcome.reason() == Reason::RateLimited && *hint < HINT_CEILING);
            if let Some(hold) = spent.into_iter().chain(hint).max() {
                assert!(probe_start >= at + hold, "held {hold:?} by {headers:?}");
            }
        }
        drop(probe);

        if unkeyed {
            check_limits(&limit.snapshot(), configured, learning, headers);
        }
        assert!(limit.snapshot().keys <= 2);
    }
}
