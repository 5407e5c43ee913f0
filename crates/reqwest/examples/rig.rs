//! rig's OpenAI client with stormguard's engine as its HTTP client, against a provider on loopback
//! that is overloaded at the first call and cuts its stream at the second: rig reads the whole
//! answer, every word once.
//!
//! ```text
//! cargo run -p stormguard-reqwest --features rig --example rig
//! ```

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Response, StatusCode};
use axum::routing::post;
use futures_util::{StreamExt, stream};
use rig_core::client::CompletionClient;
use rig_core::completion::CompletionModel;
use rig_core::providers::openai;
use rig_core::streaming::StreamedAssistantContent;
use stormguard_reqwest::RigClient;
use stormguard_retry::ClientLayer;

const ANSWER: &str = "A retry budget keeps a fleet of clients from turning one overloaded \
                      provider into an outage.";

/// Words the provider sends before it cuts the stream.
const BEFORE_THE_CUT: usize = 6;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(provider))
        .with_state(Arc::clone(&calls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The user's part: the engine as the HTTP client of rig's OpenAI client.
    let engine = RigClient::new(ClientLayer::default(), reqwest::Client::new());
    let client = openai::Client::builder()
        .api_key("sk-example")
        .base_url(&base)
        .http_client(engine)
        .build()?
        .completions_api();
    let model = client.completion_model("gpt-4o-mini");

    let mut stream = model
        .completion_request("Why budget retries?")
        .max_tokens(256)
        .stream()
        .await?;
    let mut answer = String::new();
    while let Some(item) = stream.next().await {
        if let StreamedAssistantContent::Text(text) = item? {
            answer.push_str(&text.text);
        }
    }

    println!("rig read: {answer}");
    println!(
        "the provider answered {} calls: a 503, a stream cut after {BEFORE_THE_CUT} words, and \
         the continuation that sent the rest",
        calls.load(Ordering::Relaxed)
    );
    assert_eq!(answer, ANSWER);
    Ok(())
}

/// The provider: overloaded at the first call; the second call's stream is cut after a few words;
/// the third (the engine's continuation, which carries the words received as a prefill) sends
/// the rest.
async fn provider(State(calls): State<Arc<AtomicUsize>>) -> Response<Body> {
    let words: Vec<String> = ANSWER.split_inclusive(' ').map(str::to_owned).collect();
    let (status, body) = match calls.fetch_add(1, Ordering::Relaxed) {
        0 => (
            StatusCode::SERVICE_UNAVAILABLE,
            Body::from(r#"{"error":{"message":"overloaded","type":"server_error"}}"#),
        ),
        1 => {
            let sent = words[..BEFORE_THE_CUT].iter().map(|word| Ok(chunk(word)));
            let cut = Err(io::Error::from(io::ErrorKind::ConnectionReset));
            (StatusCode::OK, paced(sent.chain([cut]).collect()))
        }
        _ => {
            let rest = words[BEFORE_THE_CUT..].iter().map(|word| chunk(word));
            let end = rest.chain([END.to_owned()]).map(Ok).collect();
            (StatusCode::OK, paced(end))
        }
    };
    let content_type = if status.is_success() {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// `events` as a body, a few milliseconds apart, as a model writes them.
fn paced(events: Vec<io::Result<String>>) -> Body {
    Body::from_stream(stream::iter(events).then(|event| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        event
    }))
}

/// One chunk of an OpenAI chat completion stream carrying `text`.
fn chunk(text: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\
         \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    )
}

/// The end of the stream: the finish reason, then `[DONE]`.
const END: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
                   \"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                   data: [DONE]\n\n";
