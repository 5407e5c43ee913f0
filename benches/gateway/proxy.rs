//! `gateway-proxy PORT UPSTREAM`: the floor of the gateway benchmark, a bare pass-through on
//! 127.0.0.1:PORT to UPSTREAM (`127.0.0.1:PORT`). hyper's server, hyper-util's pooled client (the
//! one the gateway forwards with), and nothing else: no body read, no header touched, no retry.
//! What the gateway costs above it is what its protections cost.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Upstream = Client<HttpConnector, Incoming>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: gateway-proxy PORT UPSTREAM";
    let port: u16 = args.next().ok_or(usage)?.parse()?;
    let upstream: String = args.next().ok_or(usage)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(port, upstream))
}

async fn serve(port: u16, upstream: String) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let client: Upstream = Client::builder(TokioExecutor::new()).build_http();
    let upstream: &'static str = upstream.leak();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| forward(client.clone(), upstream, request));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: Upstream,
    upstream: &str,
    mut request: Request<Incoming>,
) -> Result<Response<Either<Incoming, Empty<Bytes>>>, Infallible> {
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{upstream}{path}").parse::<Uri>() else {
        return Ok(bad_gateway());
    };
    *request.uri_mut() = uri;
    match client.request(request).await {
        Ok(response) => Ok(response.map(Either::Left)),
        Err(_) => Ok(bad_gateway()),
    }
}

fn bad_gateway() -> Response<Either<Incoming, Empty<Bytes>>> {
    let mut response = Response::new(Either::Right(Empty::new()));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
