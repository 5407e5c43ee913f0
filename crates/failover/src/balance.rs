//! Balancing: which backend of a rank takes a request, when several share one rank (several
//! keys, regions or deployments of one model: [`Failover::with_rank`](crate::Failover::with_rank)).
//!
//! Each backend's cost is its latency, its load and its headroom, over its weight:
//!
//! ```text
//! cost = peak EWMA of its answers' latency × (its hops in flight + 1) / weight / headroom
//! ```
//!
//! - **Latency**: a peak-sensitive moving average of how long its hops took to an answer (the
//!   engine's: the head, or a stream's first content event), as Finagle's and linkerd's
//!   `PeakEWMA` and tower's `balance::p2c` measure it: a slower answer is taken at once, a
//!   quicker one decays the average with a time constant of [`DECAY`] (10 s, linkerd's). A
//!   backend with nothing measured yet costs [`UNMEASURED`].
//! - **Load**: the hops it has in flight from this failover, plus one.
//! - **Headroom**: the share of its quota its rate limit could let go at once
//!   ([`RateLimit::headroom`](stormguard_rate_limit::RateLimit::headroom): its own pacing and what
//!   the provider last said was left), at least [`MIN_HEADROOM`]; 1 without a rate limit. A
//!   deployment near its quota costs more, and so gets less, before it answers 429.
//!
//! Among the backends of the rank that may take the request, two are drawn at random (in
//! proportion to their weights) and the cheaper one takes it: the "power of two choices"
//! (Mitzenmacher, 2001), which tower's `balance` and linkerd use, and which keeps one backend's
//! stale figure from drawing the whole rank's traffic as choosing the cheapest of all would.
//! With a sticky key ([`Failover::with_sticky_key`](crate::Failover::with_sticky_key)), a
//! request goes instead to the backend its key ranks first by weighted rendezvous hashing, so
//! that requests of one key (one conversation, one cached prompt) keep reaching the same
//! deployment and its prompt cache, and move only when that backend cannot take them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::RngExt;
use stormguard_numbers::random::RandomSource;
use tokio::time::Instant;

/// The time constant of the latency's decay: 10 s, linkerd's `PeakEWMA` default.
pub const DECAY: Duration = Duration::from_secs(10);

/// The latency a backend with nothing measured yet is taken to have: 1 s, a short LLM answer;
/// a new backend gets its share of requests until its own figure replaces this one.
pub const UNMEASURED: Duration = Duration::from_secs(1);

/// The least headroom a cost divides by: a spent quota makes a backend a hundred times as
/// costly, not infinitely so (its rate limit refuses what it cannot take, for free).
pub const MIN_HEADROOM: f64 = 0.01;

/// What the balancer knows of one backend: its latency, and its hops in flight.
#[derive(Debug, Default)]
pub(crate) struct Load {
    latency: Mutex<Option<PeakEwma>>,
    in_flight: AtomicU32,
}

/// A peak-sensitive moving average of latencies, in seconds.
#[derive(Clone, Copy, Debug)]
struct PeakEwma {
    seconds: f64,
    at: Instant,
}

/// A hop in flight on a backend: counted until dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Load>);

impl Load {
    /// A hop to this backend is in flight until the guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// A hop to this backend was answered after `took`.
    pub(crate) fn observe(&self, took: Duration) {
        let now = Instant::now();
        let seconds = took.as_secs_f64();
        let mut latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        let next = match *latency {
            Some(last) if seconds < last.seconds => {
                let elapsed = now.saturating_duration_since(last.at).as_secs_f64();
                let decay = (-elapsed / DECAY.as_secs_f64()).exp();
                last.seconds * decay + seconds * (1.0 - decay)
            }
            // A peak, or the first figure: taken as it is.
            _ => seconds,
        };
        *latency = Some(PeakEwma {
            seconds: next,
            at: now,
        });
    }

    /// The latency, in seconds.
    fn latency(&self) -> f64 {
        let latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        latency.map_or(UNMEASURED.as_secs_f64(), |latency| latency.seconds)
    }

    /// What sending one more request here costs, for a backend of `weight` with `headroom`.
    pub(crate) fn cost(&self, weight: f64, headroom: f64) -> f64 {
        let in_flight = f64::from(self.in_flight.load(Ordering::Relaxed)) + 1.0;
        self.latency() * in_flight / weight.max(f64::MIN_POSITIVE) / headroom.max(MIN_HEADROOM)
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One backend the balancer may choose: its index and weight.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Candidate {
    pub(crate) index: usize,
    pub(crate) weight: f64,
}

/// The power of two choices: two of `candidates` drawn in proportion to their weights (two
/// distinct ones when there are two), the one of lower `cost` (by index; asked of those two
/// only). `None` without a candidate.
pub(crate) fn two_choices(
    candidates: &[Candidate],
    cost: impl Fn(usize) -> f64,
    random: &RandomSource,
) -> Option<usize> {
    match candidates {
        [] => None,
        [only] => Some(only.index),
        _ => {
            let mut rng = random.rng();
            let weight = |at: usize| candidates[at].weight.max(0.0);
            let mut draw = |skip: Option<usize>| {
                let eligible = || (0..candidates.len()).filter(move |at| Some(*at) != skip);
                let total: f64 = eligible().map(weight).sum();
                if total <= 0.0 {
                    // No weight left: the first one, and no second to weigh it against.
                    return skip.is_none().then(|| eligible().next()).flatten();
                }
                let mut left = rng.random::<f64>() * total;
                let mut weighed = eligible().filter(|at| weight(*at) > 0.0);
                for at in weighed.clone() {
                    left -= weight(at);
                    if left < 0.0 {
                        return Some(at);
                    }
                }
                // Rounding left a sliver: the last one.
                weighed.next_back()
            };
            let first = draw(None)?;
            let second = draw(Some(first)).unwrap_or(first);
            let (a, b) = (candidates[first].index, candidates[second].index);
            Some(if a != b && cost(b) < cost(a) { b } else { a })
        }
    }
}

/// Weighted rendezvous hashing: the candidate `key` ranks first (`name` names each, by index),
/// the same one for the same key as long as it is a candidate.
pub(crate) fn rendezvous<'a>(
    key: &[u8],
    candidates: &[Candidate],
    name: impl Fn(usize) -> &'a str,
) -> Option<usize> {
    let score = |candidate: &Candidate| {
        let hash = stable_hash(key, name(candidate.index).as_bytes());
        // A uniform draw in (0, 1] from the hash; the weight scales its rank (weighted
        // rendezvous hashing, Schindelhauer and Schomaker: `-w / ln(u)`).
        let unit = ((hash >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        -candidate.weight.max(0.0) / unit.ln()
    };
    candidates
        .iter()
        .map(|candidate| (candidate.index, score(candidate)))
        .fold(
            None,
            |best: Option<(usize, f64)>, (index, score)| match best {
                Some((_, top)) if top >= score => best,
                _ => Some((index, score)),
            },
        )
        .map(|(index, _)| index)
}

/// A hash of `key` and `name` that every build and every replica computes alike (a fleet's
/// replicas send a key where the others do): 64-bit FNV-1a over both, then SplitMix64's
/// finalizer to spread it over all 64 bits.
fn stable_hash(key: &[u8], name: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let fnv = key
        .iter()
        .chain(&[0xff])
        .chain(name)
        .fold(OFFSET, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
        });
    let mut z = fnv.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn candidate(index: usize, weight: f64) -> Candidate {
        Candidate { index, weight }
    }

    #[tokio::test(start_paused = true)]
    async fn a_peak_is_taken_at_once_and_a_quicker_answer_decays_it() {
        let load = Load::default();
        assert_eq!(load.latency(), 1.0, "nothing measured");
        load.observe(200 * MS);
        assert_eq!(load.latency(), 0.2);
        load.observe(800 * MS);
        assert_eq!(load.latency(), 0.8, "a peak at once");
        // 10 s later (one time constant) a 200 ms answer: 0.8 e^-1 + 0.2 (1 - e^-1).
        tokio::time::advance(DECAY).await;
        load.observe(200 * MS);
        let expected = 0.8 * (-1.0_f64).exp() + 0.2 * (1.0 - (-1.0_f64).exp());
        assert!((load.latency() - expected).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn cost_grows_with_hops_in_flight_and_shrinks_with_weight_and_headroom() {
        let load = Arc::new(Load::default());
        load.observe(500 * MS);
        assert_eq!(load.cost(1.0, 1.0), 0.5);
        let (a, b) = (load.start(), load.start());
        assert_eq!(load.cost(1.0, 1.0), 1.5);
        assert_eq!(load.cost(3.0, 1.0), 0.5);
        assert_eq!(load.cost(1.0, 0.5), 3.0);
        // A spent quota: a hundred times, not infinity.
        assert_eq!(load.cost(1.0, 0.0), 150.0);
        drop((a, b));
        assert_eq!(load.in_flight(), 0);
    }

    /// Two backends, one twice the other's cost: the cheaper takes every draw in which both
    /// are drawn, which with two candidates is every draw.
    #[test]
    fn of_two_the_cheaper_takes_it() {
        let random = RandomSource::seeded(7);
        let candidates = [candidate(4, 1.0), candidate(9, 1.0)];
        let cost = |index: usize| if index == 4 { 2.0 } else { 1.0 };
        for _ in 0..100 {
            assert_eq!(two_choices(&candidates, cost, &random), Some(9));
        }
        assert_eq!(two_choices(&candidates[..1], cost, &random), Some(4));
        assert_eq!(two_choices(&[], cost, &random), None);
    }

    /// Three backends of equal cost and weights 1, 1 and 2: the heavy one is drawn more often,
    /// and with equal costs the first drawn takes it, so it takes about half.
    #[test]
    fn weights_decide_the_draws() {
        let random = RandomSource::seeded(11);
        let candidates = [candidate(0, 1.0), candidate(1, 1.0), candidate(2, 2.0)];
        let mut taken = [0_u32; 3];
        for _ in 0..10_000 {
            let chosen = two_choices(&candidates, |_| 1.0, &random).unwrap_or(0);
            taken[chosen] += 1;
        }
        assert!((4_500..5_500).contains(&taken[2]), "{taken:?}");
        assert!((2_000..3_000).contains(&taken[0]), "{taken:?}");
        // A weight of 0 is never drawn while another can be.
        let none = [candidate(0, 0.0), candidate(1, 1.0)];
        let cost = |index: usize| if index == 0 { 0.1 } else { 5.0 };
        for _ in 0..100 {
            assert_eq!(two_choices(&none, cost, &random), Some(1));
        }
    }

    /// A key goes to one backend, whichever order the candidates come in; without that backend
    /// it goes to another, and the keys of the others stay where they were.
    #[test]
    fn a_sticky_key_keeps_its_backend() {
        let names = ["east", "west", "eu"];
        let all: Vec<Candidate> = (0..3).map(|i| candidate(i, 1.0)).collect();
        let name = |index: usize| names[index];
        let keys: Vec<String> = (0..300).map(|n| format!("conversation-{n}")).collect();
        let homes: Vec<usize> = keys
            .iter()
            .map(|key| rendezvous(key.as_bytes(), &all, name).unwrap_or(9))
            .collect();
        let mut counts = [0; 3];
        for home in &homes {
            counts[*home] += 1;
        }
        assert!(counts.iter().all(|n| (70..130).contains(n)), "{counts:?}");
        let reversed: Vec<Candidate> = all.iter().rev().copied().collect();
        let without_west: Vec<Candidate> = all.iter().filter(|c| c.index != 1).copied().collect();
        for (key, home) in keys.iter().zip(&homes) {
            assert_eq!(rendezvous(key.as_bytes(), &reversed, name), Some(*home));
            let moved = rendezvous(key.as_bytes(), &without_west, name);
            if *home != 1 {
                assert_eq!(moved, Some(*home), "{key} moved");
            } else {
                assert!(matches!(moved, Some(0 | 2)));
            }
        }
    }
}
