//! Per-core workers (`serve::start_on`, what the binary serves on): each caller's connection is
//! served on one worker, and each worker reaches the providers through connections of its own.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{ConnectInfo, State};
use kit::{config, env, json};
use stormguard_gateway::serve::{self, Running, Workers};

/// A provider that notes the port of the connection each request came on.
async fn provider() -> (String, Arc<Mutex<Vec<u16>>>) {
    let ports = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .fallback(
            |State(ports): State<Arc<Mutex<Vec<u16>>>>,
             ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                ports.lock().unwrap().push(peer.port());
                json(200, r#"{"id":"x","model":"gpt-up","choices":[]}"#)
            },
        )
        .with_state(ports.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    (url, ports)
}

/// Two callers, one after the other, each sending 5 requests on one kept-alive connection: the
/// statuses, and the provider connections they came on.
async fn two_callers(workers: Option<Arc<Workers>>) -> (Vec<u16>, BTreeSet<u16>) {
    let (url, ports) = provider().await;
    let text = format!(
        "[providers.p]\nformat = \"openai\"\nbase_url = \"{url}\"\n\n\
         [[models.gpt.deployments]]\nprovider = \"p\"\nmodel = \"gpt-up\"\n"
    );
    let running: Running = serve::start_on(&config(&text, &env(&[])), workers)
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let caller = kit::client();
        for _ in 0..5 {
            let response = caller
                .post(format!("http://{}/v1/chat/completions", running.addr))
                .header("content-type", "application/json")
                .body(r#"{"model":"gpt"}"#)
                .send()
                .await
                .unwrap();
            statuses.push(response.status().as_u16());
        }
    }
    running.stop().await;
    let seen = ports.lock().unwrap().iter().copied().collect();
    (statuses, seen)
}

/// This process's threads named for a worker (a thread's name is cut at 15 bytes).
fn worker_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(Result::ok)
                .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
                .filter(|name| name.starts_with("stormguard-work"))
                .count()
        })
        .unwrap_or(0)
}

/// The worker threads once there are `expected` (a thread names itself as it starts, and leaves
/// as soon as it is told): asked again while they get there, a bounded number of times.
fn worker_threads_settled_at(expected: usize) -> usize {
    let mut seen = worker_threads();
    for _ in 0..100_000 {
        if seen == expected {
            break;
        }
        std::thread::yield_now();
        seen = worker_threads();
    }
    seen
}

#[tokio::test]
async fn each_worker_serves_its_callers_through_provider_connections_of_its_own() {
    let workers = Arc::new(Workers::start(2).unwrap());
    assert_eq!(workers.len(), 2);
    if cfg!(target_os = "linux") {
        assert_eq!(worker_threads_settled_at(2), 2);
    }
    let (statuses, ports) = two_callers(Some(workers)).await;
    assert_eq!(statuses, [200; 10]);
    // The callers' connections went to the two workers in turn, and each opened its own.
    assert_eq!(ports.len(), 2, "{ports:?}");
    // The gateway drained and dropped its workers: their threads end.
    if cfg!(target_os = "linux") {
        assert_eq!(worker_threads_settled_at(0), 0);
    }
    // Served on the caller's runtime, the two callers share the one pool: one connection.
    let (statuses, ports) = two_callers(None).await;
    assert_eq!(statuses, [200; 10]);
    assert_eq!(ports.len(), 1, "{ports:?}");
}
