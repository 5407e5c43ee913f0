//! Backends of one rank sharing its traffic, on a paused clock, against providers scripted in
//! memory: by latency, by weight and by rate-limit headroom, sticky keys, ranks still in order,
//! and cooldowns shared by the replicas of a fleet.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use stormguard_budget::RetryBudget;
use stormguard_failover::{Adapter, Answered, Backend, Cooldowns, Failover};
use stormguard_jitter::Constant;
use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use stormguard_retry::ClientLayer;
use support::{MS, Providers};
use tower::{Layer, Service, ServiceExt};

const SECOND: Duration = Duration::from_secs(1);

fn layer() -> ClientLayer<stormguard_classify::LlmClassifier, Constant> {
    ClientLayer::default()
        .with_budget(RetryBudget::default())
        .with_backoff(Constant::new(10 * MS))
        .with_max_attempts(1)
}

fn backend(host: &str) -> Backend {
    let origin = format!("http://{host}").parse().unwrap();
    Backend::new(host).with_adapter(Adapter::new().with_origin(origin))
}

fn request(key: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::post("http://east.test/v1/chat/completions");
    if let Some(key) = key {
        builder = builder.header("x-conversation-id", key);
    }
    builder
        .body(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")))
        .unwrap()
}

fn answered_by<B>(response: &Response<B>) -> String {
    let answered = response.extensions().get::<Answered>();
    answered.map(|a| a.backend().to_owned()).unwrap_or_default()
}

/// Sends `rate` requests a second for `seconds`, each in a task of its own (so that they
/// overlap as real traffic does), and waits for all: the backend that answered each.
async fn drive<S>(
    client: &S,
    rate: u32,
    seconds: u32,
    key: fn(u32) -> Option<String>,
) -> Vec<String>
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<stormguard_classify::body::ResponseBody<Full<Bytes>>>,
        > + Clone
        + Send
        + 'static,
    S::Error: std::fmt::Debug + Send,
    S::Future: Send,
{
    let gap = SECOND / rate;
    let mut tasks = Vec::new();
    for n in 0..rate * seconds {
        let client = client.clone();
        let key = key(n);
        tasks.push(tokio::spawn(async move {
            let response = client.oneshot(request(key.as_deref())).await.unwrap();
            answered_by(&response)
        }));
        tokio::time::sleep(gap).await;
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

fn shares(answers: &[String], names: &[&str]) -> Vec<f64> {
    let total = answers.len() as f64;
    let count = |name: &&str| answers.iter().filter(|a| a == name).count() as f64 / total;
    names.iter().map(count).collect()
}

/// Three deployments of one model answering in 600, 800 and 1,200 ms share a rank: each gets
/// traffic, the quickest the most and the slowest the least (the cheaper of two by latency
/// times hops in flight settles near shares inverse to the latency squared: 55%, 31%, 14%).
#[tokio::test(start_paused = true)]
async fn the_quicker_deployments_of_a_rank_take_more_of_its_traffic() {
    let providers = Providers::default();
    providers.set("east.test", 200, 600 * MS);
    providers.set("west.test", 200, 800 * MS);
    providers.set("eu.test", 200, 1200 * MS);
    let client = Failover::new(layer())
        .with_rank([
            backend("east.test"),
            backend("west.test"),
            backend("eu.test"),
        ])
        .with_seed(1)
        .layer(providers.service());

    let answers = drive(&client, 50, 20, |_| None).await;
    let shares = shares(&answers, &["east.test", "west.test", "eu.test"]);
    assert!(shares[0] > shares[1] && shares[1] > shares[2], "{shares:?}");
    assert!((0.45..0.65).contains(&shares[0]), "{shares:?}");
    assert!((0.05..0.25).contains(&shares[2]), "{shares:?}");
}

/// Two deployments alike but for their weights (3 and 1): three quarters and one quarter.
#[tokio::test(start_paused = true)]
async fn weights_split_a_ranks_traffic() {
    let providers = Providers::default();
    providers.set("east.test", 200, 500 * MS);
    providers.set("west.test", 200, 500 * MS);
    let client = Failover::new(layer())
        .with_rank([
            backend("east.test").with_weight(3.0),
            backend("west.test").with_weight(1.0),
        ])
        .with_seed(2)
        .layer(providers.service());
    let answers = drive(&client, 40, 20, |_| None).await;
    let shares = shares(&answers, &["east.test", "west.test"]);
    assert!((0.65..0.85).contains(&shares[0]), "{shares:?}");
}

/// Two deployments alike but for their quotas: east may take 10 requests a second (its rate
/// limit, as it would learn it from the provider's headers), west has room to spare. At 30 a
/// second, east's headroom falls as its bucket empties and it is sent less: no more than its
/// quota, and no request is refused for want of a slot anywhere.
#[tokio::test(start_paused = true)]
async fn a_deployment_near_its_quota_is_sent_less() {
    let providers = Providers::default();
    providers.set("east.test", 200, 300 * MS);
    providers.set("west.test", 200, 300 * MS);
    let quota = RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(600))
            .without_learning(),
    );
    let client = Failover::new(layer())
        .with_rank([
            backend("east.test").with_rate_limit(quota),
            backend("west.test"),
        ])
        .with_seed(3)
        .layer(providers.service());
    let answers = drive(&client, 30, 20, |_| None).await;
    let east = answers.iter().filter(|a| *a == "east.test").count();
    let west = answers.iter().filter(|a| *a == "west.test").count();
    assert_eq!(east + west, 600, "every request answered");
    // Its quota over 20 s, and the bucket it starts with (one second's worth).
    assert!(east <= 10 * 20 + 10, "east took {east}");
    assert!(west > east, "west took {west}, east {east}");
}

/// The requests of one conversation keep reaching one deployment; another conversation may
/// reach another, and the keys spread over the rank.
#[tokio::test(start_paused = true)]
async fn a_sticky_key_keeps_its_deployment() {
    let providers = Providers::default();
    for host in ["east.test", "west.test", "eu.test"] {
        providers.set(host, 200, 300 * MS);
    }
    let client = Failover::new(layer())
        .with_rank([
            backend("east.test"),
            backend("west.test"),
            backend("eu.test"),
        ])
        .with_sticky_key(|head| head.headers.get("x-conversation-id").map(|v| v.as_bytes()))
        .layer(providers.service());
    let key = |n: u32| Some(format!("conversation-{}", n % 30));
    let answers = drive(&client, 30, 10, key).await;
    let mut homes: HashMap<String, HashSet<String>> = HashMap::new();
    for (n, answer) in (0..).zip(&answers) {
        let key = key(n).unwrap();
        homes.entry(key).or_default().insert(answer.clone());
    }
    assert!(homes.values().all(|homes| homes.len() == 1), "{homes:?}");
    let used: HashSet<&String> = homes.values().flatten().collect();
    assert_eq!(used.len(), 3, "the 30 keys spread over the rank");
}

/// Ranks still fail over in order: both deployments of the first rank fail (503); a single
/// failure is answered as it is (never a move on a blip), and once their breakers open after
/// three in a row, the second rank takes every request.
#[tokio::test(start_paused = true)]
async fn ranks_fail_over_in_order() {
    let providers = Providers::default();
    providers.set("east.test", 503, 10 * MS);
    providers.set("west.test", 503, 10 * MS);
    providers.set("backup.test", 200, 10 * MS);
    let client = Failover::new(layer())
        .with_rank([backend("east.test"), backend("west.test")])
        .with_backend(backend("backup.test"))
        .layer(providers.service());
    let answers = drive(&client, 10, 3, |_| None).await;
    // Each of the first rank saw its failures in a row (and a request the other's breaker
    // moved to it), then nothing.
    let hits = |host| providers.get(host).hits;
    let (east, west) = (hits("east.test"), hits("west.test"));
    assert!(
        (3..=4).contains(&east) && (3..=4).contains(&west),
        "{east} {west}"
    );
    let moved = answers.iter().position(|a| a == "backup.test");
    let moved = moved.unwrap_or(answers.len());
    assert!(moved <= 6, "{answers:?}");
    assert!(
        answers[moved..].iter().all(|a| a == "backup.test"),
        "{answers:?}"
    );
}

/// Two replicas share their cooldowns: once the first one's breaker left a dead primary, the
/// second sends it nothing and goes to the backup at once. Without sharing, the second finds
/// out by three failures of its own.
#[tokio::test(start_paused = true)]
async fn a_cooldown_one_replica_shares_spares_the_others_their_failures() {
    for shared in [true, false] {
        let providers = Providers::default();
        providers.set("east.test", 503, 10 * MS);
        providers.set("backup.test", 200, 10 * MS);
        let cooldowns = Cooldowns::local();
        let replica = || {
            let failover = Failover::new(layer())
                .with_backend(backend("east.test"))
                .with_backend(backend("backup.test"));
            let failover = match shared {
                true => failover.with_cooldowns(cooldowns.clone()),
                false => failover,
            };
            failover.layer(providers.service())
        };
        let (first, second) = (replica(), replica());
        for _ in 0..5 {
            first.clone().oneshot(request(None)).await.unwrap();
        }
        let seen = providers.get("east.test").hits;
        assert_eq!(seen, 3, "the first replica's three failures in a row");
        let mut answers = Vec::new();
        for _ in 0..5 {
            let response = second.clone().oneshot(request(None)).await.unwrap();
            answers.push(answered_by(&response));
        }
        // Shared: the backup from the first request on; else after three failures.
        let from = if shared { 0 } else { 3 };
        assert!(
            answers[from..].iter().all(|a| a == "backup.test"),
            "{answers:?}"
        );
        let by_second = providers.get("east.test").hits - seen;
        assert_eq!(by_second, if shared { 0 } else { 3 }, "shared: {shared}");
    }
}

/// When the cooldown ends on a backend still dead, a replica that was spared its failures
/// comes back to it as the one whose breaker opened does: by one probe, not with failures in
/// a row of its own (its breaker opened with the fleet's cooldown). The probe fails, its
/// cooldown is shared, and the first replica sends nothing either.
#[tokio::test(start_paused = true)]
async fn after_a_shared_cooldown_a_spared_replica_comes_back_by_a_probe() {
    let providers = Providers::default();
    providers.set("east.test", 503, 10 * MS);
    providers.set("backup.test", 200, 10 * MS);
    let cooldowns = Cooldowns::local();
    let replica = || {
        Failover::new(layer())
            .with_backend(backend("east.test"))
            .with_backend(backend("backup.test"))
            .with_cooldowns(cooldowns.clone())
            .layer(providers.service())
    };
    let (first, second) = (replica(), replica());
    for _ in 0..5 {
        first.clone().oneshot(request(None)).await.unwrap();
    }
    for _ in 0..5 {
        second.clone().oneshot(request(None)).await.unwrap();
    }
    assert_eq!(
        providers.get("east.test").hits,
        3,
        "the first replica's failures"
    );
    // Past every open wait (at most 3 s, stretched by a quarter at most).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut answers = Vec::new();
    for _ in 0..5 {
        let response = second.clone().oneshot(request(None)).await.unwrap();
        answers.push(answered_by(&response));
    }
    for _ in 0..5 {
        let response = first.clone().oneshot(request(None)).await.unwrap();
        answers.push(answered_by(&response));
    }
    assert_eq!(providers.get("east.test").hits, 4, "one probe: {answers:?}");
    assert!(answers.iter().all(|a| a == "backup.test"), "{answers:?}");
}
