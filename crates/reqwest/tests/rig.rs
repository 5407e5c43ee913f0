//! rig's OpenAI client through `RigClient`, against an axum provider on loopback that fails a
//! call, cuts a stream, refuses a key and stays down: the caller reads whole answers, and a
//! failure the engine does not retry, or gave up on, reaches rig as its status, headers and body.

#![cfg(feature = "rig")]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use futures_util::StreamExt;
use http::Response;
use rig_core::client::CompletionClient;
use rig_core::completion::{AssistantContent, CompletionModel};
use rig_core::http_client::multipart::Part;
use rig_core::http_client::{HttpClientExt, MultipartForm};
use rig_core::providers::openai;
use rig_core::streaming::StreamedAssistantContent;
use stormguard_jitter::FullJitter;
use stormguard_reqwest::RigClient;
use stormguard_retry::{ClientLayer, DEFAULT_MAX_ATTEMPTS};
use stormguard_test_kit::{Log, ScriptedBackend, ScriptedBody};
use tower_service::Service;

/// One chunk of an OpenAI chat completion stream carrying `text`.
fn chunk(text: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\
         \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    )
}

/// The end of a chat completion stream: the finish reason, then `[DONE]`.
const END: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
                   \"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                   data: [DONE]\n\n";

/// A whole answer of the Responses API, the route rig's OpenAI client calls by default.
const RESPONSE: &str = r#"{"id":"resp_1","object":"response","created_at":1,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"m","usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":6},"output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"a whole answer"}]}],"tools":[]}"#;

const OVERLOADED: &str = r#"{"error":{"message":"overloaded","type":"server_error"}}"#;

const UNAUTHORIZED: &str = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;

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

/// A provider on loopback answering its `index`-th request (from 0) with `answer(index)`; its
/// base URL and the log of what it saw.
async fn provider<F>(answer: F) -> (String, Log)
where
    F: Fn(usize) -> Response<ScriptedBody> + Clone + Send + Sync + 'static,
{
    let backend = ScriptedBackend::answering(move |index, _seen| Ok(answer(index)));
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

/// The engine without waits between attempts (a zero delay skips the timer), over a plain
/// `reqwest::Client`.
fn engine() -> RigClient {
    let layer =
        ClientLayer::default().with_backoff(FullJitter::new(Duration::ZERO, Duration::ZERO));
    RigClient::new(layer, reqwest::Client::new())
}

/// rig's OpenAI client (the Responses API) over the engine.
fn openai(base: &str) -> openai::Client<RigClient> {
    openai::Client::builder()
        .api_key("sk-test")
        .base_url(base)
        .http_client(engine())
        .build()
        .unwrap()
}

fn text_of(choice: &[AssistantContent]) -> String {
    choice
        .iter()
        .filter_map(|content| match content {
            AssistantContent::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_503_is_retried_and_rig_reads_the_whole_answer() {
    let (base, log) = provider(|index| match index {
        0 => json(503, OVERLOADED),
        _ => json(200, RESPONSE),
    })
    .await;
    let model = openai(&base).completion_model("m");

    let answer = model
        .completion_request("say a whole answer")
        .max_tokens(64)
        .send()
        .await
        .unwrap();

    assert_eq!(text_of(&answer.choice), "a whole answer");
    let seen = log.all();
    assert_eq!(seen.len(), 2);
    for (attempt, seen) in seen.iter().enumerate() {
        assert_eq!(seen.path(), "/v1/responses");
        assert_eq!(seen.header("authorization"), Some("Bearer sk-test"));
        assert_eq!(
            seen.header("x-retry-attempt"),
            Some(attempt.to_string().as_str())
        );
    }
    assert_eq!(
        seen[0].body, seen[1].body,
        "the retry replays the same body"
    );
}

#[tokio::test]
async fn a_stream_cut_mid_answer_is_continued_and_rig_reads_every_token_once() {
    // The first stream is cut after four words; the continuation sends the other eight and the
    // end.
    let (base, log) = provider(|index| match index {
        0 => {
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
    .await;
    // Chat completions: the stream format the engine continues.
    let model = openai(&base).completions_api().completion_model("m");

    let mut stream = model
        .completion_request("count to twelve")
        .max_tokens(64)
        .stream()
        .await
        .unwrap();
    let mut text = String::new();
    while let Some(item) = stream.next().await {
        if let StreamedAssistantContent::Text(delta) = item.unwrap() {
            text.push_str(&delta.text);
        }
    }

    let words: Vec<String> = (1..=12).map(|word| format!("{word} ")).collect();
    assert_eq!(text, words.concat());
    let seen = log.all();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|seen| seen.path() == "/v1/chat/completions")
    );
    // The continuation asked the provider to go on from the words already read.
    let continuation = String::from_utf8(seen[1].body.to_vec()).unwrap();
    assert!(continuation.contains("1 2 3 4 "), "{continuation}");
    assert_eq!(seen[1].header("authorization"), Some("Bearer sk-test"));
}

#[tokio::test]
async fn a_401_is_not_retried_and_rig_gets_its_status_headers_and_body() {
    let (base, log) = provider(|index| match index {
        0 => json(401, UNAUTHORIZED),
        _ => json(200, RESPONSE),
    })
    .await;
    let model = openai(&base).completion_model("m");

    let error = model
        .completion_request("say a whole answer")
        .send()
        .await
        .unwrap_err();

    assert_eq!(log.len(), 1);
    assert_eq!(
        error.provider_response_status(),
        Some(http::StatusCode::UNAUTHORIZED)
    );
    assert_eq!(error.provider_response_body(), Some(UNAUTHORIZED));
    // The engine's mark on a failure it does not retry, for whatever sits above.
    let headers = error.provider_response_headers().unwrap();
    assert_eq!(headers["x-should-retry"], "false");
}

#[tokio::test]
async fn an_error_body_is_given_to_rig_up_to_its_first_64_kib() {
    let huge = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(1 << 20));
    let (base, log) = provider(move |_| json(400, &huge)).await;
    let model = openai(&base).completion_model("m");

    let error = model
        .completion_request("say a whole answer")
        .send()
        .await
        .unwrap_err();

    assert_eq!(log.len(), 1);
    assert_eq!(
        error.provider_response_status(),
        Some(http::StatusCode::BAD_REQUEST)
    );
    let body = error.provider_response_body().unwrap();
    assert_eq!(body.len(), stormguard_classify::ERROR_BODY_LIMIT);
    assert!(
        body.starts_with(r#"{"error":{"message":"xxx"#),
        "{}",
        &body[..40]
    );
}

#[tokio::test]
async fn a_multipart_upload_is_replayed_whole_after_a_503() {
    let (base, log) = provider(|index| match index {
        0 => json(503, OVERLOADED),
        _ => json(200, r#"{"text":"heard"}"#),
    })
    .await;
    let form = MultipartForm::new()
        .text("model", "whisper-1")
        .part(Part::bytes("file", &b"RIFF0000WAVE"[..]).filename("a.wav"));
    let request = http::Request::post(format!("{base}/audio/transcriptions"))
        .body(form)
        .unwrap();

    let answer = engine()
        .send_multipart::<bytes::Bytes>(request)
        .await
        .unwrap();

    assert_eq!(answer.into_body().await.unwrap(), r#"{"text":"heard"}"#);
    let seen = log.all();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, seen[1].body);
    let content_type = seen[1].header("content-type").unwrap();
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .unwrap();
    let body = String::from_utf8(seen[1].body.to_vec()).unwrap();
    assert!(body.starts_with(&format!("--{boundary}\r\n")), "{body}");
    assert!(body.contains("RIFF0000WAVE"), "{body}");
}

#[tokio::test]
async fn a_provider_that_stays_down_is_given_up_on_after_the_engines_attempts() {
    let (base, log) = provider(|_| json(503, OVERLOADED)).await;
    let model = openai(&base).completion_model("m");

    let error = model
        .completion_request("say a whole answer")
        .send()
        .await
        .unwrap_err();

    assert_eq!(log.len(), DEFAULT_MAX_ATTEMPTS as usize);
    assert_eq!(
        error.provider_response_status(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(error.provider_response_body(), Some(OVERLOADED));
    // Given up on: marked so that nothing above retries it again.
    let headers = error.provider_response_headers().unwrap();
    assert_eq!(headers["x-should-retry"], "false");
}
