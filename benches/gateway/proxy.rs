//! `gateway-proxy PORT UPSTREAM [per-core]`: the floor of the gateway benchmark, a bare
//! pass-through on 127.0.0.1:PORT to UPSTREAM (`127.0.0.1:PORT`). hyper's server, hyper-util's
//! pooled client (the one the gateway forwards with), and nothing else: no body read, no header
//! touched, no retry. What the gateway costs above it is what its protections cost.
//!
//! The floor runs on tokio's work-stealing runtime, as a hyper server is usually written. With
//! `per-core` it runs as the gateway does (one thread a core, each with a single-threaded runtime,
//! its own accept loop on the one listener and its own client), for the benchmark's row that
//! shows what that way of serving is worth by itself.

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
    let upstream: &'static str = args.next().ok_or(usage)?.leak();
    if args.next().as_deref() == Some("per-core") {
        return per_core(port, upstream);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        serve(listener, upstream).await
    })
}

/// One thread a core, each accepting on the one listener with a runtime and a client of its own.
fn per_core(port: u16, upstream: &'static str) -> Result<(), Box<dyn std::error::Error>> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
    listener.set_nonblocking(true)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut threads = Vec::new();
    for _ in 0..cores {
        let listener = listener.try_clone()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        threads.push(std::thread::spawn(move || {
            runtime.block_on(async move {
                if let Ok(listener) = TcpListener::from_std(listener) {
                    let _ = serve(listener, upstream).await;
                }
            });
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
    Ok(())
}

async fn serve(
    listener: TcpListener,
    upstream: &'static str,
) -> Result<(), Box<dyn std::error::Error>> {
    let client: Upstream = Client::builder(TokioExecutor::new()).build_http();
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
