//! A fleet's local share against a real Redis that stops answering (SIGSTOP): a replica gets no
//! more than its share while Redis is away, whatever Redis gave it just before, and a decision
//! Redis answers too late is made once, on the share.
//!
//! Each test stops its Redis: always one of its own (see `support`). Real time, about 8 s.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::rate_limit::{Fleet, RateLimit, RateLimitConfig, Reservation};
use stormguard_examples::fleet;
use support::{Server, missing, unique};
use tokio::time::Instant;

/// 100 requests a second for the fleet; a replica's share of three is 33.3 a second, with a
/// bucket of 33.
const PER_MINUTE: u32 = 6_000;
const REPLICAS: u32 = 3;
/// Tasks that each take every slot they are given: the replica wants far more than its share.
const TASKS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_for_4_s_leaves_a_replica_over_its_share_no_more_than_its_share() {
    let Some(server) = Server::start().or_else(missing) else {
        return;
    };
    // The default timeout (5 ms): a decision Redis answers later is made on the share, before
    // the stop as during it.
    let fleet = Fleet::new(&server.url())
        .unwrap()
        .with_prefix(&unique("stopped"))
        .with_replicas(Some(REPLICAS));
    let limit = fleet::limit(fleet.clone(), PER_MINUTE);
    let run = tokio::spawn(take_every_slot(
        limit,
        Instant::now() + Duration::from_secs(7),
    ));
    // Alone, the replica takes the fleet's whole quota through Redis: three times its share.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        fleet.snapshot().fleet_decisions > 100,
        "{:?}",
        fleet.snapshot()
    );
    server.signal("STOP");
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    server.signal("CONT");
    let resumed = Instant::now();
    let starts = run.await.unwrap();

    let admitted = starts
        .iter()
        .filter(|start| (stopped..resumed).contains(start))
        .count();
    let share = f64::from(PER_MINUTE / REPLICAS) / 60.0;
    let away = (resumed - stopped).as_secs_f64();
    // The slots Redis gave before it stopped (one a task, at most) still go. On top of them,
    // the share's rate over the stop and nothing of its bucket: the replica spent far more than
    // its share's bucket through Redis in the second before.
    let budget = share * away + TASKS as f64 + 1.0;
    assert!(
        admitted as f64 <= budget,
        "admitted {admitted} in {away:.2} s on a share of {share:.1} a second: budget {budget:.1}"
    );
    assert!(admitted as f64 >= 0.9 * share * away, "{admitted}");
    eprintln!("Redis stopped {away:.2} s: admitted {admitted}, budget {budget:.1}");
}

#[tokio::test]
async fn a_late_answer_is_decided_once_on_the_share_and_its_slot_stays_in_redis() {
    let Some(server) = Server::start().or_else(missing) else {
        return;
    };
    let prefix = unique("late");
    // 60 a minute for the fleet, a bucket of one; a replica's share of three is one every 3 s.
    // 250 ms is time enough for the first decision (connection and script load) on a loaded
    // machine; the second is late because Redis is stopped.
    let replica = || {
        let fleet = Fleet::new(&server.url())
            .unwrap()
            .with_prefix(&prefix)
            .with_replicas(Some(REPLICAS))
            .with_timeout(Duration::from_millis(250));
        let config = RateLimitConfig::default()
            .with_requests_per_minute(Some(60))
            .with_max_wait(Duration::from_secs(5))
            .without_learning()
            .with_fleet(fleet.clone());
        (fleet, RateLimit::new(config))
    };
    let (fleet, limit) = replica();
    let head = http::Request::new(()).into_parts().0;
    let first = limit.acquire(&head, 0, None).await.unwrap();
    assert!(wait(&first) < Duration::from_millis(100), "{first:?}");
    let first_start = first.start();
    let _first = first.send();
    assert_eq!(fleet.snapshot().fleet_decisions, 1);

    server.signal("STOP");
    let second = limit.acquire(&head, 0, None).await.unwrap();
    server.signal("CONT");
    // Decided once, on the share, and the share had counted the slot Redis gave the first: the
    // second goes a share's interval after it, not at once on top of the fleet's bucket.
    let snapshot = fleet.snapshot();
    assert_eq!(
        (snapshot.fleet_decisions, snapshot.local_decisions),
        (1, 1),
        "{snapshot:?}"
    );
    let apart = second.start().saturating_duration_since(first_start);
    assert!(apart >= Duration::from_millis(2_990), "{apart:?}");
    let _second = second.send();

    // The late reply's slot stays taken in Redis, as the fleet's count of the request the share
    // let go: another replica asking now waits for both, the first's second and that one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    let (_, other) = replica();
    let third = other.acquire(&head, 0, None).await.unwrap();
    let after_first = third.start().saturating_duration_since(first_start);
    assert!(
        after_first >= Duration::from_millis(1_900) && after_first <= Duration::from_millis(2_100),
        "{after_first:?} after the first, asked {:?} after it",
        asked - first_start
    );
}

/// How long after now a slot starts.
fn wait(reservation: &Reservation) -> Duration {
    reservation
        .start()
        .saturating_duration_since(Instant::now())
}

/// `TASKS` tasks take every slot `limit` gives until `until`: when each slot started.
async fn take_every_slot(limit: RateLimit, until: Instant) -> Vec<Instant> {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (limit, starts) = (limit.clone(), Arc::clone(&starts));
        tasks.spawn(async move {
            let head = http::Request::new(()).into_parts().0;
            while Instant::now() < until {
                match limit.acquire(&head, 0, None).await {
                    Ok(reservation) => {
                        let start = reservation.start();
                        if start >= until {
                            break;
                        }
                        tokio::time::sleep_until(start).await;
                        drop(reservation.send());
                        starts.lock().unwrap().push(start);
                    }
                    Err(limited) => {
                        tokio::time::sleep(limited.retry_after().min(Duration::from_millis(50)))
                            .await;
                    }
                }
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    starts.lock().unwrap().clone()
}
