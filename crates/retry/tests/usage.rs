//! A rate limit that corrects token weights to the answers' usage, through the engine: the
//! tokens a success did not use come back to the minute's quota once its body is read.

#![allow(clippy::unwrap_used)]

mod support;

use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use stormguard_test_kit::post;
use support::{CHAT_URI, body_bytes, instant, reply, retries_only};
use tower::{Layer, ServiceExt};

/// 2 prompt tokens ("user" + "Hi" = 6 bytes) and up to 1,000 output tokens: weighed 1,002.
const REQUEST: &str =
    r#"{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"Hi"}]}"#;

/// Tokens a minute: 60,000, so a bucket of 1,000 a second holds the first request's debt.
const PER_MINUTE: u32 = 60_000;

async fn tokens_free_after_one_request(correct: bool, read_body: bool) -> u64 {
    let config = RateLimitConfig::default().with_tokens_per_minute(Some(PER_MINUTE));
    let limit = RateLimit::new(if correct {
        config.with_usage_correction()
    } else {
        config
    });
    let (_log, backend) = instant(|_, _| {
        Ok(reply(
            200,
            &[("content-type", "application/json")],
            r#"{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":98,"total_tokens":100}}"#,
        ))
    });
    let client = retries_only().with_rate_limit(limit.clone()).layer(backend);
    let response = client.oneshot(post(CHAT_URI, REQUEST)).await.unwrap();
    if read_body {
        let body = body_bytes(response).await;
        assert!(body.starts_with(b"{\"choices\""));
    }
    limit.snapshot().tokens_available.unwrap()
}

#[tokio::test(start_paused = true)]
async fn unused_tokens_come_back_once_the_answer_is_read() {
    // Weighed 1,002 against a bucket of 1,000: in debt, nothing free.
    assert_eq!(tokens_free_after_one_request(false, true).await, 0);
    // Not read to the end: no usage seen, no correction.
    assert_eq!(tokens_free_after_one_request(true, false).await, 0);
    // Read: 100 used, 902 given back; 1,000 - 100 = 900 free.
    assert_eq!(tokens_free_after_one_request(true, true).await, 900);
}
