//! Two replicas of `stormguard-gateway` sharing one real Redis (`[fleet]` in their config):
//! when one replica's breaker leaves a deployment that died, the other sends it nothing more,
//! where without the fleet it finds out by failures of its own.
//!
//! Real time (the cooldowns' clock is the Redis server's). The Redis is the one at `REDIS_URL`,
//! else a `redis-server` of the test's own (see `support`).

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use stormguard_gateway::config::{Config, Env};
use stormguard_gateway::serve::{self, Running};
use support::{Redis, dying_provider, unique};

/// A replica: model `m` on `dead` first, `backup` second; in the fleet of `prefix` if given.
async fn replica(dead: &str, backup: &str, fleet: Option<(&str, &str)>) -> Running {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n\
         [providers.dead]\nformat = \"openai\"\nbase_url = \"{dead}\"\n\n\
         [providers.backup]\nformat = \"openai\"\nbase_url = \"{backup}\"\n\n\
         [[models.m.deployments]]\nprovider = \"dead\"\n\n\
         [[models.m.deployments]]\nprovider = \"backup\"\nrank = 2\n\n\
         [[models.n.deployments]]\nprovider = \"backup\"\n"
    );
    let mut env = Env::new();
    if let Some((url, prefix)) = fleet {
        text.push_str(&format!(
            "\n[fleet]\nredis_url_env = \"REDIS\"\nprefix = \"{prefix}\"\n\
             timeout = \"250ms\"\n"
        ));
        env.insert("REDIS".to_owned(), url.to_owned());
    }
    let config = Config::parse("gateway.toml", &text, &env).unwrap();
    serve::start(&config).await.unwrap()
}

/// POSTs a chat completion of `model` to `gateway`: the deployment that answered it.
async fn call_model(client: &reqwest::Client, gateway: &Running, model: &str) -> String {
    let response = client
        .post(format!("http://{}/v1/chat/completions", gateway.addr))
        .header("content-type", "application/json")
        .body(format!(r#"{{"model":"{model}","messages":[]}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.headers()["x-stormguard-backend"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// POSTs a chat completion of model `m` to `gateway`: the deployment that answered it.
async fn call(client: &reqwest::Client, gateway: &Running) -> String {
    call_model(client, gateway, "m").await
}

/// What the second replica sends the dead deployment over five requests, after the first
/// replica's breaker left it; meanwhile the second served another model (each decision reads the
/// fleet's cooldowns in the background, for every model of the replica).
async fn second_replicas_attempts(fleet: Option<(&str, &str)>) -> usize {
    let dies = Arc::new(AtomicBool::new(false));
    let (dead, dead_hits) = dying_provider(Arc::clone(&dies)).await;
    let (backup, _) = dying_provider(Arc::new(AtomicBool::new(false))).await;
    let first = replica(&dead, &backup, fleet).await;
    let second = replica(&dead, &backup, fleet).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // The second replica has been deciding (and so reading the fleet's cooldowns).
    assert_eq!(call(&client, &second).await, "dead/m");
    dies.store(true, Ordering::SeqCst);
    // The first replica's calls fail on `dead` until its breaker leaves it for the backup.
    while call(&client, &first).await != "backup/m" {}
    let before = dead_hits.load(Ordering::SeqCst);
    assert_eq!(call_model(&client, &second, "n").await, "backup/n");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    for _ in 0..5 {
        assert_eq!(call(&client, &second).await, "backup/m");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    first.stop().await;
    second.stop().await;
    dead_hits.load(Ordering::SeqCst) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_replica_leaves_a_deployment_another_replica_left() {
    let Some(redis) = Redis::find() else { return };
    let prefix = unique("gateway");
    // Shared: none.
    let shared = second_replicas_attempts(Some((&redis.url, &prefix))).await;
    // Alone: the second replica finds out by failures of its own.
    let alone = second_replicas_attempts(None).await;
    assert_eq!(
        shared, 0,
        "with the fleet: {shared} attempts on the dead deployment"
    );
    assert!(
        alone >= 3,
        "without: {alone} attempts on the dead deployment"
    );
}
