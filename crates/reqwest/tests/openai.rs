//! async-openai's client through `OpenAiService`, against an axum provider on loopback that fails
//! a call and cuts a stream: the caller reads whole answers.

#![cfg(feature = "async-openai")]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use futures_util::StreamExt;
use http::Response;
use stormguard_jitter::Constant;
use stormguard_reqwest::OpenAiService;
use stormguard_retry::ClientLayer;
use stormguard_test_kit::{Log, ScriptedBackend, ScriptedBody};
use tower_service::Service;

/// One chunk of an OpenAI chat completion stream carrying `text`.
fn chunk(text: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\
         \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    )
}

/// The end of a stream: the finish reason, then `[DONE]`.
const END: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
                   \"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                   data: [DONE]\n\n";

const WHOLE: &str = r#"{"id":"c0","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a whole answer"},"finish_reason":"stop"}]}"#;

fn json(status: u16, body: &str) -> Response<ScriptedBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(ScriptedBody::new().data(body.to_owned()))
        .unwrap()
}

fn events(body: ScriptedBody) -> Response<ScriptedBody> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap()
}

/// The provider: the first call fails (503, OpenAI's error body), the second answers; the first
/// stream is cut after four words, and the continuation sends the other eight and the end.
async fn provider() -> (String, Log) {
    let backend = ScriptedBackend::answering(|index, _seen| {
        Ok(match index {
            0 => json(
                503,
                r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
            ),
            1 => json(200, WHOLE),
            2 => {
                let mut body = ScriptedBody::new();
                for word in 1..=4 {
                    body = body.data(chunk(&format!("{word} ")));
                }
                // Written out (hyper flushes when the body has nothing ready), then cut.
                let body = body.yield_once();
                events(body.error(std::io::Error::from(std::io::ErrorKind::ConnectionReset)))
            }
            _ => {
                let mut body = ScriptedBody::new();
                for word in 5..=12 {
                    body = body.data(chunk(&format!("{word} ")));
                }
                events(body.data(END))
            }
        })
    });
    let log = backend.log().clone();
    let app = Router::new().fallback(move |request: Request| {
        let mut backend = backend.clone();
        async move { backend.call(request).await.unwrap().map(Body::new) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), log)
}

fn ask(stream: bool) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("m")
        .max_tokens(64u32)
        .stream(stream)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("count to twelve")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap()
}

#[tokio::test]
async fn async_openai_reads_whole_answers_through_a_failure_and_a_cut() {
    let (base, log) = provider().await;
    let layer = ClientLayer::default().with_backoff(Constant::new(Duration::from_millis(10)));
    let service = OpenAiService::new(layer, reqwest::Client::new());
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(base)
            .with_api_key("sk-test"),
    )
    .with_http_service(service);

    // A 503, retried by the engine: the caller gets the answer.
    let answer = client.chat().create(ask(false)).await.unwrap();
    assert_eq!(
        answer.choices[0].message.content.as_deref(),
        Some("a whole answer")
    );
    assert_eq!(log.len(), 2);

    // A stream cut after four words, continued: every word once, in order, then the end.
    let mut stream = client.chat().create_stream(ask(true)).await.unwrap();
    let mut text = String::new();
    let mut finished = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        for choice in chunk.choices {
            text.push_str(choice.delta.content.as_deref().unwrap_or_default());
            finished = finished.or(choice.finish_reason);
        }
    }
    let words: Vec<String> = (1..=12).map(|word| format!("{word} ")).collect();
    assert_eq!(text, words.concat());
    assert!(finished.is_some(), "the stream's end reached the caller");
    assert_eq!(log.len(), 4);
    // The continuation asked the provider to go on from the words already read.
    let continuation = String::from_utf8(log.all()[3].body.to_vec()).unwrap();
    assert!(continuation.contains("1 2 3 4 "), "{continuation}");
    // The key went with every attempt, the continuation's included.
    for seen in log.all() {
        assert_eq!(seen.header("authorization"), Some("Bearer sk-test"));
    }
}
