//! Hostile input to the deadline crate: LLM request bodies of any shape (arbitrary bytes,
//! arbitrary and truncated JSON, deep nesting, bodies past 64 KiB) and arbitrary propagation
//! headers on the server side. Estimates stay within `[min(base, max), max]`, incoming timeouts
//! are exactly the tightest valid value, and nothing panics or overflows.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use serde_json::{Map, Value};
use stormguard_classify::headers::{
    GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_TIMEOUT_MS,
};
use stormguard_deadline::propagate::{incoming_timeout, parse_grpc_timeout, parse_timeout_ms};
use stormguard_deadline::{ASSUMED_OUTPUT_TOKENS, Deadline, LlmDeadline, ServerDeadlineLayer};
use tower::{Layer, ServiceExt, service_fn};

/// The fields the estimate reads, and a few it does not, so that generated objects hit them.
const KEYS: [&str; 14] = [
    "messages",
    "input",
    "prompt",
    "contents",
    "system",
    "instructions",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "generationConfig",
    "maxOutputTokens",
    "generation_config",
    "model",
    "content",
];

fn json_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(serde_json::json!(1e300)),
        Just(serde_json::json!(-0.0)),
        Just(Value::from(u64::MAX)),
    ]
}

/// Arbitrary JSON values, up to a few levels deep, with keys the estimate looks for.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        json_number(),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((0..KEYS.len(), inner), 0..8).prop_map(|fields| {
                Value::Object(
                    fields
                        .into_iter()
                        .map(|(key, value)| (KEYS[key].to_owned(), value))
                        .collect::<Map<String, Value>>(),
                )
            }),
        ]
    })
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=600_000).prop_map(Duration::from_millis),
        (0u64..=100_000).prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
    ]
}

fn settings() -> impl Strategy<Value = LlmDeadline> {
    prop_oneof![
        Just(LlmDeadline::default()),
        (duration(), duration(), duration(), duration()).prop_map(
            |(base, per_prompt_token, per_output_token, max)| LlmDeadline {
                base,
                per_prompt_token,
                per_output_token,
                max,
            }
        ),
    ]
}

fn assert_bounded(llm: &LlmDeadline, body: &[u8]) -> Result<Duration, TestCaseError> {
    let estimate = llm.estimate(body);
    prop_assert!(
        estimate <= llm.max,
        "{:?} above max {:?}",
        estimate,
        llm.max
    );
    prop_assert!(
        estimate >= llm.base.min(llm.max),
        "{:?} below base {:?}",
        estimate,
        llm.base
    );
    Ok(estimate)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn estimates_of_arbitrary_bytes_stay_within_base_and_max(
        llm in settings(),
        body in proptest::collection::vec(any::<u8>(), 0..4_096),
    ) {
        assert_bounded(&llm, &body)?;
    }

    #[test]
    fn estimates_of_arbitrary_and_truncated_json_stay_within_base_and_max(
        llm in settings(),
        value in json(),
        cut in any::<prop::sample::Index>(),
    ) {
        let body = serde_json::to_vec(&value).unwrap();
        assert_bounded(&llm, &body)?;
        // Any prefix (a body cut off in transit) is just as safe.
        let cut = cut.index(body.len() + 1);
        assert_bounded(&llm, &body[..cut])?;
    }

    #[test]
    fn a_higher_output_limit_never_shortens_the_deadline(
        llm in settings(),
        (low, high) in (any::<u64>(), any::<u64>()).prop_map(|(a, b)| (a.min(b), a.max(b))),
        prompt in ".{0,200}",
    ) {
        let body = |tokens: u64| {
            serde_json::json!({"max_tokens": tokens, "messages": [{"content": prompt}]}).to_string()
        };
        let short = assert_bounded(&llm, body(low).as_bytes())?;
        let long = assert_bounded(&llm, body(high).as_bytes())?;
        prop_assert!(short <= long, "{low} tokens: {short:?}, {high} tokens: {long:?}");
    }

    /// Several values of each propagation header, valid or not: the tightest valid one wins.
    #[test]
    fn incoming_timeout_is_the_tightest_valid_value_of_every_header(
        values in proptest::collection::vec(
            (0usize..3, prop_oneof![
                "[0-9]{1,9}[HMSmun]",
                "[0-9]{1,22}",
                "[ -~]{0,24}",
            ]),
            0..8,
        ),
    ) {
        let names = [GRPC_TIMEOUT, X_REQUEST_TIMEOUT_MS, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS];
        let mut headers = HeaderMap::new();
        let mut expected: Option<Duration> = None;
        for (which, text) in &values {
            let value = HeaderValue::from_str(text).unwrap();
            let parsed = if *which == 0 {
                parse_grpc_timeout(value.as_bytes())
            } else {
                parse_timeout_ms(value.as_bytes())
            };
            if let Some(parsed) = parsed {
                expected = Some(expected.map_or(parsed, |tightest| tightest.min(parsed)));
            }
            headers.append(names[*which].clone(), value);
        }
        prop_assert_eq!(incoming_timeout(&headers), expected);
    }

    /// A server reading arbitrary propagation headers either sheds the request (504, handler
    /// never run) or runs the handler with a deadline of exactly the capped incoming timeout.
    #[test]
    fn a_server_under_arbitrary_headers_caps_or_sheds(
        values in proptest::collection::vec(
            (0usize..4, proptest::collection::vec(any::<u8>(), 0..30)),
            0..6,
        ),
        max_ms in 0u64..1_000_000,
    ) {
        let names = [
            GRPC_TIMEOUT,
            X_REQUEST_TIMEOUT_MS,
            X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            HeaderName::from_static("content-type"),
        ];
        let mut request = Request::new(());
        for (which, bytes) in values {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                request.headers_mut().append(names[which].clone(), value);
            }
        }
        let max = Duration::from_millis(max_ms);
        let default = Duration::from_secs(300);
        let expected = incoming_timeout(request.headers()).unwrap_or(default).min(max);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (status, left) = runtime.block_on(async {
            let handler = service_fn(|request: Request<()>| async move {
                let left = Deadline::of(&request).map(|deadline| deadline.remaining());
                Ok::<_, Infallible>(Response::new(left))
            });
            let service = ServerDeadlineLayer::new().with_default(default).with_max(max).layer(handler);
            let response = service.oneshot(request).await.unwrap();
            (response.status(), response.into_body())
        });
        if expected.is_zero() {
            prop_assert_eq!(left, None, "an expired request reached the handler");
            // Shed as 504, or for gRPC as a trailers-only 200 with grpc-status 4.
            prop_assert!(status == StatusCode::GATEWAY_TIMEOUT || status == StatusCode::OK);
        } else {
            prop_assert_eq!(status, StatusCode::OK);
            prop_assert_eq!(left, Some(expected));
        }
    }

    #[test]
    fn deadlines_after_any_duration_never_panic(timeout in duration()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let _clock = runtime.enter();
        let deadline = Deadline::after(timeout);
        prop_assert!(deadline.remaining() <= timeout);
        if timeout <= Duration::from_secs(24 * 3600) {
            prop_assert_eq!(deadline.remaining(), timeout);
        }
        prop_assert_eq!(deadline.is_expired(), timeout.is_zero());
    }
}

/// Nesting beyond serde_json's recursion limit (128) is refused by the parser, not by the stack:
/// the body counts as not JSON and gets the assumed output. Nesting within the limit is walked
/// without recursion, and its text counts.
#[test]
fn deeply_nested_bodies_neither_overflow_the_stack_nor_lose_their_text() {
    let llm = LlmDeadline {
        base: Duration::ZERO,
        per_prompt_token: Duration::from_millis(1),
        per_output_token: Duration::from_millis(1),
        max: Duration::from_secs(3600),
    };
    let assumed = Duration::from_millis(ASSUMED_OUTPUT_TOKENS);
    for depth in [129, 1_000, 100_000, 1_000_000] {
        let arrays = format!(
            r#"{{"messages":{}"x"{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        assert_eq!(llm.estimate(arrays.as_bytes()), assumed, "depth {depth}");
        let objects = format!(
            r#"{{"messages":{}"x"{}}}"#,
            r#"{"a":"#.repeat(depth),
            "}".repeat(depth)
        );
        assert_eq!(llm.estimate(objects.as_bytes()), assumed, "depth {depth}");
        let open = format!(r#"{{"messages":{}"#, "[".repeat(depth));
        assert_eq!(llm.estimate(open.as_bytes()), assumed, "depth {depth}");
    }
    // 126 arrays inside the object and its field: within the limit. 400 bytes = 100 tokens.
    let text = "y".repeat(400);
    let nested = format!(
        r#"{{"max_tokens":10,"messages":{}"{text}"{}}}"#,
        "[".repeat(126),
        "]".repeat(126)
    );
    assert_eq!(
        llm.estimate(nested.as_bytes()),
        Duration::from_millis(100 + 10)
    );
}

/// Bodies past 64 KiB (and within the engine's 1 MiB replay cap) are estimated whole: a 256 KiB
/// prompt is 65,536 tokens, and the estimate is exact.
#[test]
fn a_quarter_mebibyte_prompt_is_counted_exactly() {
    let llm = LlmDeadline::default();
    let body = serde_json::json!({
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "x".repeat(256 * 1024 - 4)}],
    })
    .to_string();
    assert!(body.len() > 256 * 1024);
    // 262,140 content bytes + 4 for "user" = 65,536 tokens at 1 ms; 1000 output tokens at 28 ms.
    assert_eq!(
        llm.estimate(body.as_bytes()),
        Duration::from_millis(10_000 + 65_536 + 28_000)
    );
    // Many small strings add up the same way, with no stack use per item.
    let many: Vec<Value> = (0..65_536).map(|_| Value::from("abcd")).collect();
    let body = serde_json::json!({"max_tokens": 0, "input": many}).to_string();
    assert_eq!(
        llm.estimate(body.as_bytes()),
        Duration::from_millis(10_000 + 65_536)
    );
}
