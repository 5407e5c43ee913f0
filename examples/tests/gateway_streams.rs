//! What the axum gateway hands its callers is the spliced stream: a provider stream cut after
//! content reaches a plain client (no stormguard of its own) as one whole answer, every word once,
//! on both of the gateway's LLM routes.

#![allow(clippy::unwrap_used)]

use stormguard_examples::gateway::{Route, Running};
use stormguard_examples::mock::{self, Fault, MESSAGES, MockConfig, Transcript};

/// A streaming request for 8 tokens, in OpenAI's and in Anthropic's API.
const CHAT: &str = r#"{"model":"mock-1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":8,"stream":true}"#;
const MESSAGES_BODY: &str = r#"{"model":"claude-mock","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#;

#[tokio::test]
async fn a_cut_stream_reaches_the_gateways_caller_whole_on_both_routes() {
    for (path, body) in [("/v1/chat/completions", CHAT), (MESSAGES, MESSAGES_BODY)] {
        let provider = MockConfig {
            first_faults: vec![Fault::CutMidStream],
            ..MockConfig::healthy()
        };
        let gateway = Running::start("gateway-test-streams", provider, Route::Direct)
            .await
            .unwrap();
        let url = format!("http://{}{path}", gateway.addr);
        let mut response = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        // The head is the cut stream's: the caller can tell the mock cut it.
        assert_eq!(
            response.headers()[mock::MOCK_FAULT],
            "cut_mid_stream",
            "{path}"
        );
        let mut text = Vec::new();
        while let Some(chunk) = response.chunk().await.unwrap() {
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).unwrap();
        let (stats, _) = gateway.stop().await;

        // Four words before the cut, four from the continuation: the whole answer, each word
        // once, ended by its terminal event, with no error event.
        let read = Transcript::parse(&text);
        assert_eq!(read.text(), mock::streamed_text(8), "{path}: {text}");
        assert_eq!(read.content.len(), 8, "{path}");
        assert!(read.done && read.errors == 0, "{path}: {text}");
        assert_eq!(stats.attempts, 2, "{path}");
        assert_eq!((stats.streams_cut, stats.prefilled), (1, 1), "{path}");
        assert_eq!(stats.content_chunks, 8, "{path}");
    }
}
