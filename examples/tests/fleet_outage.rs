//! Redis hung, then killed, in the middle of a run: each time the fleet's limit goes on deciding on
//! its local share of the quota (a third, for three replicas), nothing hangs and nothing fails,
//! it says so once in the log, and it shares the state in Redis again once Redis answers.
//!
//! Alone in its test binary: it captures the log of the whole process. Real time, about 15 s.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::rate_limit::{Fleet, RateLimit};
use stormguard_examples::fleet::{self, Run};
use support::{Server, missing, off_by, unique};
use tokio::time::Instant;

/// 100 requests a second for the fleet, 33.3 for a replica's share of three.
const PER_MINUTE: u32 = 6_000;
const REPLICAS: u32 = 3;
const PHASE: Duration = Duration::from_secs(2);

/// Collects what a `fmt` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A capture of the process's log, installed as its global subscriber.
    fn installed() -> Self {
        let captured = Self::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .without_time()
            .init();
        captured
    }

    fn lines(&self, level: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains(level) && line.contains("state in Redis"))
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_leaves_each_replica_its_share_until_it_is_back() {
    // The test kills its Redis: always one of its own.
    let Some(server) = Server::start().or_else(missing) else {
        return;
    };
    let captured = Captured::installed();
    let prefix = unique("outage");
    let port = server.port;
    let fleet = shared_fleet(&server, &prefix);
    let limit = fleet::limit(fleet.clone(), PER_MINUTE);

    // Up: the whole quota (this replica is alone), decided in Redis.
    let up = phase(&limit).await;
    let allowance = fleet::allowance(PER_MINUTE, PHASE);
    assert!(off_by(up.admitted, allowance) <= 0.02, "{up:?}");
    assert_eq!(fleet.snapshot().local_decisions, 0);

    // Hung (stopped, as a Redis swapping or stuck on a slow command): each decision waits the
    // timeout at most, then the local share decides, and Redis is left alone between tries.
    server.signal("STOP");
    let hung = phase(&limit).await;
    server.signal("CONT");
    on_the_share("hung", &hung);
    assert_eq!(captured.lines("WARN").len(), 1, "{:?}", captured.lines(""));
    back(&fleet, &limit).await;
    assert_eq!(captured.lines("INFO").len(), 1, "{:?}", captured.lines(""));

    // Killed: the same.
    server.kill();
    let away = phase(&limit).await;
    on_the_share("away", &away);
    let snapshot = fleet.snapshot();
    assert!(!snapshot.connected, "{snapshot:?}");
    assert_eq!(captured.lines("WARN").len(), 2, "{:?}", captured.lines(""));

    // Back: a new server on the same port. Within the pauses between tries (2 s at most) and
    // the connection manager's reconnection, decisions are shared again.
    let server = Server::start_on(port).unwrap();
    back(&fleet, &limit).await;
    assert_eq!(captured.lines("INFO").len(), 2, "{:?}", captured.lines(""));
    let again = phase(&limit).await;
    // At the fleet's rate again (the bucket the new server holds may still be full).
    assert!(
        again.admitted as f64 >= 0.9 * f64::from(PER_MINUTE) / 60.0 * PHASE.as_secs_f64(),
        "{again:?}"
    );
    assert!(again.admitted as f64 <= allowance + 1.0, "{again:?}");
    assert!(
        bucket_held(&server, &prefix).await,
        "the bucket is in the new server"
    );
    print_admitted(&up, &hung, &away, &again);
}

/// A fleet of [`REPLICAS`] replicas that share their state under `prefix` in `server`'s Redis.
fn shared_fleet(server: &Server, prefix: &str) -> Fleet {
    // A decision waits for Redis up to 250 ms here, not the default 5 ms: on a loaded machine a
    // round trip can take longer than 5 ms, and each one that did would be decided on the local
    // share while Redis is up. What is tested is the fallback, not its default timeout.
    Fleet::new(&server.url())
        .unwrap()
        .with_prefix(prefix)
        .with_replicas(Some(REPLICAS))
        .with_timeout(Duration::from_millis(250))
}

/// Whether `server` holds the fleet's bucket under `prefix`.
async fn bucket_held(server: &Server, prefix: &str) -> bool {
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("EXISTS")
        .arg(format!("{prefix}:u:{{all}}"))
        .query_async(&mut connection)
        .await
        .unwrap()
}

/// Prints what each phase admitted, and how long decisions took while Redis was up and hung.
fn print_admitted(up: &Run, hung: &Run, away: &Run, again: &Run) {
    eprintln!(
        "up {}, hung {} and away {} (share {:.1}), back {}; decision p50 {:?} p99 {:?} while up, \
         longest {:?} while hung",
        up.admitted,
        hung.admitted,
        away.admitted,
        fleet::allowance(PER_MINUTE / REPLICAS, PHASE),
        again.admitted,
        up.quantile(0.5),
        up.quantile(0.99),
        hung.longest()
    );
}

/// What a replica admits while Redis is away: its share of the quota, a third, and no more; at
/// least the share's rate (its bucket may be spent: after a phase that took the whole quota
/// through Redis, it is); every decision a slot (no refusal: the wait allowed is 2 s), none
/// taking more than a moment.
fn on_the_share(what: &str, run: &Run) {
    let share = fleet::allowance(PER_MINUTE / REPLICAS, PHASE);
    let rate = f64::from(PER_MINUTE / REPLICAS) / 60.0 * PHASE.as_secs_f64();
    assert!(
        run.admitted as f64 <= share + 1.0,
        "{what}: {run:?}, share {share}"
    );
    assert!(
        run.admitted as f64 >= 0.9 * rate,
        "{what}: {run:?}, share's rate {rate}"
    );
    assert_eq!(run.refused, 0);
    assert!(
        run.longest() < Duration::from_secs(1),
        "{:?}",
        run.longest()
    );
}

/// Waits until decisions are shared in Redis again: within the pauses between tries (2 s at
/// most) and the connection manager's reconnection.
async fn back(fleet: &Fleet, limit: &RateLimit) {
    let decided_before = fleet.snapshot().fleet_decisions;
    let back_by = Instant::now() + Duration::from_secs(10);
    let head = http::Request::new(()).into_parts().0;
    while !(fleet.snapshot().connected && fleet.snapshot().fleet_decisions > decided_before) {
        assert!(Instant::now() < back_by, "{:?}", fleet.snapshot());
        // Asks, and gives the slot back: the share stays whole for the next phase.
        drop(limit.acquire(&head, 0, None).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Takes every slot for one phase, with four tasks.
async fn phase(limit: &RateLimit) -> Run {
    fleet::admit(limit, 4, Instant::now() + PHASE).await
}
