//! One connection of the load generator: HTTP/1.1 over 127.0.0.1, kept alive, reopened when the
//! subject closes it; each request timed to the first byte of its body and to its end.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The longest one request may take; past it, it fails (a subject that hangs cannot hang a run).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What every request of a run carries.
#[derive(Clone, Debug)]
pub struct Target {
    /// Where the subject listens.
    pub addr: SocketAddr,
    /// The path requests are sent to.
    pub path: String,
    /// `Authorization: Bearer` this, when set.
    pub key: Option<String>,
}

/// How long one request took, from its start (which its caller chose).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Until the first byte of the body.
    pub first_byte: Duration,
    /// Until the end of the body.
    pub total: Duration,
}

/// A connection, opened on first use.
pub struct Connection {
    target: Target,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    /// A connection to `target`, not opened yet.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            sender: None,
        }
    }

    /// Sends `body` and reads the whole answer; `None` on anything but a 200 read to its end.
    /// The times are counted from `start`.
    pub async fn send(&mut self, body: &Bytes, start: Instant) -> Option<Timing> {
        let timing = tokio::time::timeout(REQUEST_TIMEOUT, self.try_send(body, start))
            .await
            .ok()
            .flatten();
        if timing.is_none() {
            self.sender = None;
        }
        timing
    }

    async fn try_send(&mut self, body: &Bytes, start: Instant) -> Option<Timing> {
        let sender = match &mut self.sender {
            Some(sender) if !sender.is_closed() => sender,
            _ => self.sender.insert(open(self.target.addr).await?),
        };
        sender.ready().await.ok()?;
        let mut request = Request::post(self.target.path.as_str())
            .header(header::HOST, self.target.addr.to_string())
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = &self.target.key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request.body(Full::new(body.clone())).ok()?;
        let response = sender.send_request(request).await.ok()?;
        let ok = response.status().is_success();
        let mut body = response.into_body();
        let mut first_byte = None;
        while let Some(frame) = body.frame().await {
            if frame.ok()?.is_data() && first_byte.is_none() {
                first_byte = Some(start.elapsed());
            }
        }
        let total = start.elapsed();
        ok.then_some(Timing {
            first_byte: first_byte.unwrap_or(total),
            total,
        })
    }
}

async fn open(addr: SocketAddr) -> Option<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// Whether something at `addr` answers HTTP (any status) within a second.
pub async fn answers(addr: SocketAddr) -> bool {
    tokio::time::timeout(Duration::from_secs(1), probe(addr))
        .await
        .unwrap_or(false)
}

async fn probe(addr: SocketAddr) -> bool {
    let Some(mut sender) = open(addr).await else {
        return false;
    };
    let request = Request::get("/")
        .header(header::HOST, addr.to_string())
        .body(Full::new(Bytes::new()));
    match request {
        Ok(request) => sender.send_request(request).await.is_ok(),
        Err(_) => false,
    }
}
