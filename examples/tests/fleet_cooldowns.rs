//! Cooldowns shared by a fleet through a real Redis: when one replica's breaker leaves a dead
//! deployment, another replica stops sending to it within one decision, where on its own it
//! finds out by three failures; with Redis away, each replica's own breaker decides, as without.
//!
//! Real time (the cooldowns' clock is the Redis server's). The Redis is the one at `REDIS_URL`,
//! else a `redis-server` of the test's own (see `support`).

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::ClientLayer;
use stormguard::failover::{Adapter, Backend, Cooldowns, Failover, FailoverService};
use stormguard::rate_limit::Fleet;
use support::{Redis, dying_provider, unique};
use tower::{Layer, ServiceExt};

/// One replica's failover: the dead deployment first, the backup second, each with a breaker of
/// its own (open after 3 failures in a row), sharing `cooldowns` if given.
fn replica(
    dead: &str,
    backup: &str,
    cooldowns: Option<&Cooldowns>,
) -> FailoverService<Client<HttpConnector, Body>> {
    let backend = |name: &str, url: &str| {
        Backend::new(name).with_adapter(Adapter::new().with_origin(url.parse().unwrap()))
    };
    let mut failover = Failover::new(ClientLayer::default().with_max_attempts(1))
        .with_backend(backend("dead", dead))
        .with_backend(backend("backup", backup));
    if let Some(cooldowns) = cooldowns {
        failover = failover.with_cooldowns(cooldowns.clone());
    }
    failover.layer(Client::builder(TokioExecutor::new()).build_http())
}

fn request(url: &str) -> http::Request<Body> {
    http::Request::post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"model":"m"}"#))
        .unwrap()
}

/// What the second replica sends a deployment that died over five requests, after the first
/// replica's breaker left it (three failures of its own); each replica's cooldowns made by
/// `cooldowns` (as two processes would make theirs), if any.
async fn second_replicas_attempts(cooldowns: impl Fn() -> Option<Cooldowns>) -> usize {
    let dies = Arc::new(AtomicBool::new(false));
    let (dead, dead_hits) = dying_provider(Arc::clone(&dies)).await;
    let (backup, _) = dying_provider(Arc::new(AtomicBool::new(false))).await;
    let first = replica(&dead, &backup, cooldowns().as_ref());
    let second = replica(&dead, &backup, cooldowns().as_ref());
    // The second replica has been deciding (and so reading the fleet's cooldowns).
    second.clone().oneshot(request(&dead)).await.unwrap();
    dies.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        first.clone().oneshot(request(&dead)).await.unwrap();
    }
    assert_eq!(dead_hits.load(Ordering::SeqCst), 4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..5 {
        second.clone().oneshot(request(&dead)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dead_hits.load(Ordering::SeqCst) - 4
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_leaves_a_deployment_another_replicas_breaker_left() {
    let Some(redis) = Redis::find() else { return };
    let prefix = unique("cooldowns");
    // Each replica its own fleet, as two processes have.
    let fleet = || {
        let fleet = Fleet::new(&redis.url).unwrap().with_prefix(&prefix);
        Some(Cooldowns::fleet(
            fleet.with_timeout(Duration::from_millis(250)),
        ))
    };
    // Shared: the second replica's one decision made before it read the first's cooldown (its
    // last read was before it), then none.
    let shared = second_replicas_attempts(fleet).await;
    assert!(
        shared <= 1,
        "the second replica sent {shared} with shared cooldowns"
    );
    // Alone: three failures of its own before its breaker leaves it.
    let alone = second_replicas_attempts(|| None).await;
    assert_eq!(alone, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_away_each_replica_decides_by_its_own_breaker() {
    // Nothing listens there: every call to Redis fails at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}/");
    let fleet = || Some(Cooldowns::fleet(Fleet::new(&url).unwrap()));
    let started = tokio::time::Instant::now();
    let away = second_replicas_attempts(fleet).await;
    assert_eq!(away, 3);
    // No stall: nine requests and the pauses of the test, not a wait on Redis each.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
