//! A replica of a fleet that shares one rate limit through Redis, as the `fleet_admit` binary and
//! the fleet tests run it: tasks that take every slot the limit gives, for a while, counting
//! what it admitted and how long each decision took.

use std::time::Duration;

use stormguard::rate_limit::{Fleet, FleetSnapshot, RateLimit, RateLimitConfig};
use tokio::time::Instant;

/// The limit of one replica: `per_minute` requests a minute shared through `fleet` under `key`
/// (each run its own key, so that runs do not meet), deciding on a share of `1 / replicas` of
/// the quota while Redis is away.
pub fn limit(fleet: Fleet, per_minute: u32) -> RateLimit {
    RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(per_minute))
            // Learning is for a provider's answers; these slots are never sent anywhere.
            .without_learning()
            .with_fleet(fleet),
    )
}

/// What a replica admitted over a run.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Requests whose slot started within the run.
    pub admitted: u64,
    /// Requests the limit refused (their slot would come later than the wait allowed).
    pub refused: u64,
    /// How long each decision took, from asking to the answer.
    pub decisions: Vec<Duration>,
}

impl Run {
    /// Adds another run's counts to this one.
    pub fn merge(&mut self, other: Run) {
        self.admitted += other.admitted;
        self.refused += other.refused;
        self.decisions.extend(other.decisions);
    }

    /// The decision time at quantile `q` (0.5: the median), if any decision was made.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let mut sorted = self.decisions.clone();
        sorted.sort_unstable();
        let last = sorted.len().checked_sub(1)?;
        let index = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
        sorted.get(index).copied()
    }

    /// The longest decision.
    pub fn longest(&self) -> Duration {
        self.decisions.iter().copied().max().unwrap_or_default()
    }
}

/// Runs `tasks` tasks against `limit` until `until`, each asking for a slot, waiting for it and
/// asking again at once, so that the replica always wants more than the quota.
pub async fn admit(limit: &RateLimit, tasks: usize, until: Instant) -> Run {
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..tasks.max(1) {
        let limit = limit.clone();
        running.spawn(async move { take_slots(&limit, until).await });
    }
    let mut run = Run::default();
    while let Some(task) = running.join_next().await {
        if let Ok(task) = task {
            run.merge(task);
        }
    }
    run
}

async fn take_slots(limit: &RateLimit, until: Instant) -> Run {
    let head = http::Request::new(()).into_parts().0;
    let mut run = Run::default();
    while Instant::now() < until {
        let asked = Instant::now();
        let decision = limit.acquire(&head, 0, None).await;
        run.decisions.push(asked.elapsed());
        match decision {
            Ok(reservation) => {
                if reservation.start() > until {
                    // Dropped unsent: the slot goes back.
                    break;
                }
                tokio::time::sleep_until(reservation.start()).await;
                let _permit = reservation.send();
                run.admitted += 1;
            }
            Err(limited) => {
                run.refused += 1;
                tokio::time::sleep(limited.retry_after().min(Duration::from_millis(50))).await;
            }
        }
    }
    run
}

/// What a limit of `per_minute` requests a minute, with a bucket of one second, admits over
/// `window`: the bucket at once, then the rate.
pub fn allowance(per_minute: u32, window: Duration) -> f64 {
    let rate = f64::from(per_minute) / 60.0;
    rate * (1.0 + window.as_secs_f64())
}

/// A fleet's snapshot, as `fleet_admit` prints it.
pub fn describe(snapshot: FleetSnapshot) -> String {
    format!(
        "\"connected\":{},\"replicas\":{},\"fleet_decisions\":{},\"local_decisions\":{}",
        snapshot.connected, snapshot.replicas, snapshot.fleet_decisions, snapshot.local_decisions
    )
}
