//! Redis away for 4 s under a fleet that wants more than its quota: a replica of three sends the
//! provider no more than its share allows over the away phase, the slots it reserved in Redis
//! before the loss included, and no less than its share's rate.
//!
//! Three replicas of one quota (100 a second, a share of 33.3 each), many tasks each taking
//! every slot, so that each replica holds slots reserved in Redis up to the 2 s a request may
//! wait; the measured replica has twice the others' tasks, and takes twice its share through
//! Redis. Redis then goes away for 4 s, killed (connection refused) or hung (`SIGSTOP`), and
//! comes back. Counted: the requests of that replica whose slot started in the away phase.
//!
//! Real time, about 8 s a variant; the variants take turns (each starts its own `redis-server`,
//! which it stops or kills).

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::rate_limit::{Fleet, RateLimit};
use stormguard_examples::fleet;
use support::{Server, missing, unique};
use tokio::time::Instant;

/// 100 requests a second for the fleet, 33.3 for a replica's share of three.
const PER_MINUTE: u32 = 6_000;
const REPLICAS: u32 = 3;
/// Tasks per replica, the measured one first: more than the quota's slots within the 2 s a
/// request may wait, so that each replica's slots in Redis run 2 s ahead when Redis goes, and
/// the measured one takes two thirds of the quota (twice its share) through Redis.
const TASKS: [usize; REPLICAS as usize] = [140, 35, 35];
const UP: Duration = Duration::from_secs(3);
const AWAY: Duration = Duration::from_secs(4);
const BACK: Duration = Duration::from_secs(1);
/// Long enough for a loaded machine: a round trip slower than this is decided on the share.
const TIMEOUT: Duration = Duration::from_millis(100);

/// One variant at a time: each drives 210 tasks in real time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_leaves_a_replica_no_more_than_its_share_reserved_slots_included() {
    let _turn = TURN.lock().await;
    let Some(server) = Server::start().or_else(missing) else {
        return;
    };
    let (url, port) = (server.url(), server.port);
    let sent = run(&url, || server.kill(), || Server::start_on(port).unwrap()).await;
    check("killed", &sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_leaves_a_replica_no_more_than_its_share_reserved_slots_included() {
    let _turn = TURN.lock().await;
    let Some(server) = Server::start().or_else(missing) else {
        return;
    };
    let sent = run(
        &server.url(),
        || server.signal("STOP"),
        || server.signal("CONT"),
    )
    .await;
    check("hung", &sent);
}

/// The requests of the measured replica, by when their slot started since the loss.
struct Sent {
    starts: Vec<Duration>,
    /// Requests the limit refused over the away phase (a wait beyond the 2 s allowed).
    refused: u64,
}

/// Runs three replicas on the Redis at `url` for [`UP`], takes Redis away (`away`), brings it
/// back after [`AWAY`] (`back`, whose value lives until the end), and runs [`BACK`] more.
async fn run<B>(url: &str, away: impl FnOnce(), back: impl FnOnce() -> B) -> Sent {
    let prefix = unique("away");
    let begin = Instant::now();
    let lost = begin + UP;
    let end = lost + AWAY + BACK;
    let limits: Vec<RateLimit> = (0..REPLICAS)
        .map(|_| {
            let fleet = Fleet::new(url)
                .unwrap()
                .with_prefix(&prefix)
                .with_replicas(Some(REPLICAS))
                .with_timeout(TIMEOUT);
            fleet::limit(fleet, PER_MINUTE)
        })
        .collect();
    let measured = Arc::new(Mutex::new(Sent {
        starts: Vec::new(),
        refused: 0,
    }));
    let mut tasks = tokio::task::JoinSet::new();
    for (n, (limit, tasks_of)) in limits.iter().zip(TASKS).enumerate() {
        for _ in 0..tasks_of {
            let (limit, measured) = (limit.clone(), (n == 0).then(|| Arc::clone(&measured)));
            tasks.spawn(take_slots(limit, lost, end, measured));
        }
    }
    tokio::time::sleep_until(lost).await;
    away();
    tokio::time::sleep_until(lost + AWAY).await;
    let _back = back();
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    let mut sent = measured.lock().unwrap();
    Sent {
        starts: std::mem::take(&mut sent.starts),
        refused: sent.refused,
    }
}

/// Takes every slot `limit` gives until `end`; with `measured`, records when each started
/// (since `lost`) and the refusals in the away phase.
async fn take_slots(
    limit: RateLimit,
    lost: Instant,
    end: Instant,
    measured: Option<Arc<Mutex<Sent>>>,
) {
    let head = http::Request::new(()).into_parts().0;
    while Instant::now() < end {
        match limit.acquire(&head, 0, None).await {
            Ok(reservation) => {
                let start = reservation.start();
                if start >= end {
                    break;
                }
                tokio::time::sleep_until(start).await;
                let _permit = reservation.send();
                if let Some(measured) = &measured
                    && start >= lost
                {
                    measured.lock().unwrap().starts.push(start - lost);
                }
            }
            Err(limited) => {
                if let Some(measured) = &measured
                    && (lost..lost + AWAY).contains(&Instant::now())
                {
                    measured.lock().unwrap().refused += 1;
                }
                tokio::time::sleep(limited.retry_after().min(Duration::from_millis(50))).await;
            }
        }
    }
}

/// Over the away phase, the measured replica sent at most 1.1 times its share's allowance (its
/// rate over the phase and a bucket of 1 s), and at least 0.9 times its rate over the phase (the
/// slots it reserved in Redis, about 4 s of its share, leave the share little of the phase).
fn check(what: &str, sent: &Sent) {
    let allowance = fleet::allowance(PER_MINUTE / REPLICAS, AWAY);
    let rate = f64::from(PER_MINUTE / REPLICAS) / 60.0;
    let in_phase = |from: Duration, to: Duration| {
        sent.starts
            .iter()
            .filter(|start| (from..to).contains(start))
            .count()
    };
    let away = in_phase(Duration::ZERO, AWAY);
    let halves = [in_phase(Duration::ZERO, AWAY / 2), in_phase(AWAY / 2, AWAY)];
    eprintln!(
        "{what}: {away} sent in the {AWAY:?} away (halves {halves:?}, {} refused), allowance \
         {allowance:.1}: {:.2}x",
        sent.refused,
        away as f64 / allowance
    );
    assert!(
        away as f64 <= 1.1 * allowance,
        "{what}: {away} sent while Redis was away (halves {halves:?}), allowance {allowance:.1}"
    );
    assert!(
        away as f64 >= 0.9 * rate * AWAY.as_secs_f64(),
        "{what}: {away} sent while Redis was away (halves {halves:?}), the share's rate {rate:.1}"
    );
}
