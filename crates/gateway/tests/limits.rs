//! The listener's bounds: a caller trickling its head is cut off, a head over the cap is
//! answered 431, and connections beyond the cap wait for a slot.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use kit::{KEYS, echo, env, mock, two_providers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn gateway_with(server: &str) -> (kit::Mock, stormguard_gateway::serve::Running) {
    let openai = mock(echo()).await;
    let text = format!(
        "[server]\n{server}\n{}",
        two_providers(&openai.url(), &openai.url())
    );
    let gateway = kit::gateway(&kit::config(&text, &env(&KEYS))).await;
    (openai, gateway)
}

/// What the gateway writes until it closes the connection.
async fn read_all(connection: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let _ = connection.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

const REQUEST: &str = "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"model\":\"gpt\"}";

/// On tokio's paused clock: the timeout passes in no real time.
#[tokio::test(start_paused = true)]
async fn a_caller_trickling_its_head_is_cut_off() {
    let (openai, gateway) = gateway_with("header_read_timeout = \"2s\"").await;
    let mut connection = TcpStream::connect(gateway.addr).await.unwrap();
    let started = tokio::time::Instant::now();
    connection
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: ga")
        .await
        .unwrap();
    let answer = read_all(&mut connection).await;
    let took = started.elapsed();
    assert!(!answer.contains("200 OK"), "{answer}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(openai.seen().len(), 0);
    // A caller that sends its head at once is served.
    let mut connection = TcpStream::connect(gateway.addr).await.unwrap();
    connection
        .write_all(
            REQUEST
                .replace("HTTP/1.1\r\n", "HTTP/1.1\r\nconnection: close\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    assert!(
        read_all(&mut connection)
            .await
            .starts_with("HTTP/1.1 200 OK")
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_head_over_the_cap_is_a_431() {
    let (openai, gateway) = gateway_with("max_header_bytes = 16384").await;
    let mut connection = TcpStream::connect(gateway.addr).await.unwrap();
    let big = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nx-padding: {}\r\ncontent-length: 15\r\n\r\n{{\"model\":\"gpt\"}}",
        "p".repeat(32 * 1024)
    );
    let _ = connection.write_all(big.as_bytes()).await;
    let answer = read_all(&mut connection).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert_eq!(openai.seen().len(), 0);
    gateway.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_slot() {
    let (openai, gateway) = gateway_with("max_connections = 1").await;
    // The first connection holds the one slot (kept alive after its answer).
    let mut first = TcpStream::connect(gateway.addr).await.unwrap();
    first.write_all(REQUEST.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    first.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // The second is accepted by the kernel, but not served while the first is open.
    let mut second = TcpStream::connect(gateway.addr).await.unwrap();
    let close = REQUEST.replace("HTTP/1.1\r\n", "HTTP/1.1\r\nconnection: close\r\n");
    second.write_all(close.as_bytes()).await.unwrap();
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(300), second.read(&mut byte)).await;
    assert!(
        waited.is_err(),
        "the second connection was served while the first held the slot"
    );
    assert_eq!(openai.seen().len(), 1);
    // Once the first closes, the second is served.
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(5), read_all(&mut second))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert_eq!(openai.seen().len(), 2);
    gateway.stop().await;
}

/// On tokio's paused clock: an idle connection kept alive is closed once it has sent no next
/// head within the timeout, so idle callers cannot hold every slot.
#[tokio::test(start_paused = true)]
async fn an_idle_kept_alive_connection_is_closed_after_the_timeout() {
    let (openai, gateway) = gateway_with("header_read_timeout = \"2s\"").await;
    let mut connection = TcpStream::connect(gateway.addr).await.unwrap();
    connection.write_all(REQUEST.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    connection.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let answered = tokio::time::Instant::now();
    let _rest = read_all(&mut connection).await;
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_secs(2) && idle < Duration::from_secs(3),
        "{idle:?}"
    );
    assert_eq!(openai.seen().len(), 1);
    gateway.stop().await;
}
