//! `gateway-mock PORT`: the provider every subject of the gateway benchmark forwards to, on
//! 127.0.0.1. It answers any POST with one small OpenAI chat completion, or, when the body asks
//! for `"stream":true`, an event stream of `MOCK_CHUNKS` chunks (16) `MOCK_CHUNK_GAP_MS` apart
//! (2 ms; the first at once) and `data: [DONE]`; any GET with `ok` (how `run.sh` knows it is up).
//! Each answer is the same bytes every time, so that what differs between subjects is theirs.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::{BodyExt, Channel, Either, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The answer to a non-streaming request: a chat completion as OpenAI's API documents it
/// (<https://platform.openai.com/docs/api-reference/chat/object>), one short sentence.
const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}"#;

/// One chunk of a stream, each carrying a token: the first one too, so that the first byte of
/// the body is the first token (OpenAI's own first chunk often carries only the role).
const CHUNK: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"token \"},\"finish_reason\":null}]}\n\n";

/// The last chunk and the terminal event of an OpenAI stream.
const END: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

type Body = Either<Full<Bytes>, Channel<Bytes>>;

/// How streams are shaped.
#[derive(Clone, Copy)]
struct Shape {
    chunks: u32,
    gap: Duration,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::args()
        .nth(1)
        .ok_or("usage: gateway-mock PORT")?
        .parse()?;
    let shape = Shape {
        chunks: env_number("MOCK_CHUNKS", 16)?,
        gap: Duration::from_millis(env_number("MOCK_CHUNK_GAP_MS", 2)?.into()),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(port, shape))
}

/// `name`'s value as a number, or `default` when it is not set.
fn env_number(name: &str, default: u32) -> Result<u32, String> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name} must be a whole number, not {value:?}")),
        Err(_) => Ok(default),
    }
}

async fn serve(port: u16, shape: Shape) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, shape));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(request: Request<Incoming>, shape: Shape) -> Result<Response<Body>, Infallible> {
    if request.method() != Method::POST {
        return Ok(Response::new(Either::Left(Full::new(Bytes::from_static(
            b"ok",
        )))));
    }
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let (content_type, body) = if asks_for_stream(&body) {
        ("text/event-stream", Either::Right(stream(shape)))
    } else {
        let completion = Full::new(Bytes::from_static(COMPLETION.as_bytes()));
        ("application/json", Either::Left(completion))
    };
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

/// Whether the body says `"stream":true` (with or without a space after the colon).
fn asks_for_stream(body: &[u8]) -> bool {
    [&b"\"stream\":true"[..], b"\"stream\": true"]
        .iter()
        .any(|needle| body.windows(needle.len()).any(|window| window == *needle))
}

/// The chunks of one stream, written as they come.
fn stream(shape: Shape) -> Channel<Bytes> {
    let (mut sender, body) = Channel::new(1);
    tokio::spawn(async move {
        for sent in 0..shape.chunks {
            if sent > 0 {
                tokio::time::sleep(shape.gap).await;
            }
            let chunk = Frame::data(Bytes::from_static(CHUNK.as_bytes()));
            if sender.send(chunk).await.is_err() {
                return;
            }
        }
        let _ = sender
            .send(Frame::data(Bytes::from_static(END.as_bytes())))
            .await;
    });
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_asked_for_in_the_body() {
        assert!(asks_for_stream(br#"{"model":"m","stream":true}"#));
        assert!(asks_for_stream(br#"{"model":"m", "stream": true}"#));
        assert!(!asks_for_stream(br#"{"model":"m","stream":false}"#));
        assert!(!asks_for_stream(b""));
    }
}
