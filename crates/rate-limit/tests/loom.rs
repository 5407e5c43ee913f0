//! Model checking of the limit's lock-free reservations with loom: every interleaving of two
//! threads (and every value each atomic read may see under the orderings used) is explored.
//! Under the flag the GCRA's theoretical arrival times, the bucket's flags and its locks are
//! loom's models.
//!
//! Run with `RUSTFLAGS="--cfg stormguard_loom" CARGO_TARGET_DIR=target/loom cargo test -p
//! stormguard-rate-limit --test loom --release`. Without the flag this file is empty.
//!
//! The clock is not a loom object: the limits here are of a few requests (or a hundred tokens)
//! a minute, so the microseconds a model takes move no decision, and each execution starts from
//! a new limit. What time does to a bucket is covered by the tests on a paused clock
//! (tests/pacing.rs, tests/concurrency.rs).
//!
//! loom can miss the interleavings in which a thread's plain load sees a write that another
//! thread made after loading the same atomic itself (tokio-rs/loom#166): a refused reservation
//! only loads the TAT, a give-back loads it and then writes it. So each model also checks that
//! its executions reached every outcome it expects ([`explore`]), and the thread that only reads
//! is the spawned one, which loom runs second by default, where it sees the race.
#![cfg(stormguard_loom)]
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loom::thread;
use stormguard_classify::{Outcome, Permit};
use stormguard_rate_limit::{RateLimit, RateLimitConfig, Reservation};
use support::{head, headers};
use tokio::time::Instant;

const MINUTE: Duration = Duration::from_secs(60);

/// Runs `model` under loom: the outcomes its executions returned, each once.
fn explore<T, F>(model: F) -> BTreeSet<T>
where
    T: Ord + Send + 'static,
    F: Fn() -> T + Sync + Send + 'static,
{
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let record = Arc::clone(&seen);
    loom::model(move || {
        let outcome = model();
        record.lock().unwrap().insert(outcome);
    });
    std::mem::take(&mut *seen.lock().unwrap())
}

/// A limit of `per_minute` requests a minute, a bucket of `burst` worth of them, no learning.
fn requests(per_minute: u32, burst: Duration, max_wait: Duration) -> RateLimit {
    RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(per_minute))
            .with_burst(burst)
            .with_max_wait(max_wait)
            .without_learning(),
    )
}

/// A reservation for a request weighing `tokens`, if it may go within the limit's wait.
fn reserve(limit: &RateLimit, tokens: u64) -> Option<Reservation> {
    limit.reserve(&head(), tokens, None).ok()
}

fn requests_available(limit: &RateLimit) -> u64 {
    limit.snapshot().requests_available.unwrap()
}

#[test]
fn two_threads_racing_for_the_last_request_get_it_once() {
    let winners = explore(|| {
        // One request a minute, a bucket of one, no wait.
        let limit = requests(1, MINUTE, Duration::ZERO);
        let other = limit.clone();
        let racer = thread::spawn(move || reserve(&other, 0));
        let here = reserve(&limit, 0);
        let there = racer.join().unwrap();
        assert!(
            here.is_some() ^ there.is_some(),
            "granted here {}, there {}",
            here.is_some(),
            there.is_some()
        );
        assert_eq!(requests_available(&limit), 0);
        here.is_some()
    });
    assert_eq!(winners, BTreeSet::from([false, true]));
}

#[test]
fn racing_reservations_that_wait_get_slots_a_rate_apart() {
    let firsts = explore(|| {
        // One request every 30 s, a bucket of one, waits of up to 45 s: the first goes at once,
        // the second 30 s later, a third could not go within its wait.
        let limit = requests(2, Duration::from_secs(30), Duration::from_secs(45));
        let other = limit.clone();
        let racer = thread::spawn(move || reserve(&other, 0));
        let here = reserve(&limit, 0);
        let there = racer.join().unwrap();
        // Both held: a reservation dropped would give its slot back.
        let (Some(here), Some(there)) = (&here, &there) else {
            panic!("both fit in the wait");
        };
        let (here, there) = (here.start(), there.start());
        let apart = here.max(there) - here.min(there);
        assert!(apart > Duration::from_secs(29), "{apart:?} apart");
        assert!(here.min(there) <= Instant::now(), "the first goes at once");
        assert!(reserve(&limit, 0).is_none(), "a third was admitted");
        here < there
    });
    assert_eq!(firsts, BTreeSet::from([false, true]));
}

#[test]
fn a_slot_given_back_racing_reservations_is_restored_once() {
    let admitted = explore(|| {
        // Three requests a minute, a bucket of three, no wait: two reservations leave one.
        let limit = requests(3, MINUTE, Duration::ZERO);
        let _held = reserve(&limit, 0).unwrap();
        let given = reserve(&limit, 0).unwrap();
        let other = limit.clone();
        // The first always fits; the second only in the slot given back, if it came first.
        let racer = thread::spawn(move || [reserve(&other, 0), reserve(&other, 0)]);
        drop(given);
        let reserved = racer.join().unwrap();
        let admitted = reserved.iter().flatten().count() as u64;
        assert!(reserved[0].is_some(), "a free slot was refused");
        // The bucket holds what is not reserved, no more, no less.
        assert_eq!(requests_available(&limit), 2 - admitted);
        admitted
    });
    assert_eq!(admitted, BTreeSet::from([1, 2]));
}

#[test]
fn a_request_refused_for_its_tokens_gives_its_request_slot_back() {
    let winners = explore(|| {
        // Two requests and 100 tokens a minute, a minute's bucket of each, no wait: two requests
        // of 60 tokens fit the request bucket, not the token bucket.
        let limit = RateLimit::new(
            RateLimitConfig::default()
                .with_requests_per_minute(Some(2))
                .with_tokens_per_minute(Some(100))
                .with_burst(MINUTE)
                .with_max_wait(Duration::ZERO)
                .without_learning(),
        );
        let other = limit.clone();
        let racer = thread::spawn(move || reserve(&other, 60));
        let here = reserve(&limit, 60);
        let there = racer.join().unwrap();
        assert!(here.is_some() ^ there.is_some());
        let snapshot = limit.snapshot();
        assert_eq!(snapshot.requests_available, Some(1));
        assert_eq!(snapshot.tokens_available, Some(40));
        here.is_some()
    });
    assert_eq!(winners, BTreeSet::from([false, true]));
}

#[test]
fn a_usage_settled_racing_a_reservation_moves_the_bucket_by_the_difference_once() {
    let late = explore(|| {
        // 100 tokens a minute, a bucket of 100, weights corrected to the usage, no wait.
        let limit = RateLimit::new(
            RateLimitConfig::default()
                .with_tokens_per_minute(Some(100))
                .with_burst(MINUTE)
                .with_max_wait(Duration::ZERO)
                .without_learning()
                .with_usage_correction(),
        );
        // Weighed at 80, used 20: 60 come back.
        let permit = reserve(&limit, 80).unwrap().send();
        let other = limit.clone();
        // 10 always fit; 50 more only once the 60 are back.
        let racer = thread::spawn(move || [reserve(&other, 10), reserve(&other, 50)]);
        permit.usage().unwrap().settle(20);
        let [small, late] = racer.join().unwrap();
        assert!(small.is_some(), "10 tokens of the 20 left were refused");
        let expected = if late.is_some() { 20 } else { 70 };
        assert_eq!(limit.snapshot().tokens_available, Some(expected));
        late.is_some()
    });
    assert_eq!(late, BTreeSet::from([false, true]));
}

#[test]
fn a_limit_learned_racing_reservations_is_applied_whole() {
    let outcomes = explore(|| {
        // No configured numbers: the limit learns 120 requests a minute (a bucket of 2) from
        // the first answer while two more requests reserve, with no wait.
        let limit = RateLimit::new(RateLimitConfig::default().with_max_wait(Duration::ZERO));
        let permit = reserve(&limit, 0).unwrap().send();
        let other = limit.clone();
        let racer = thread::spawn(move || [reserve(&other, 0), reserve(&other, 0)]);
        let stated = headers(&[("x-ratelimit-limit-requests", "120")]);
        permit.record(&Outcome::success(), &stated);
        let reserved = racer.join().unwrap();
        // Before the limit, a request takes nothing; after it, the bucket of 2 holds both. A
        // reservation that read the new rate with the bucket it replaced (one request) would
        // refuse the second.
        let admitted = reserved.iter().flatten().count();
        assert_eq!(
            admitted, 2,
            "a request the learned bucket holds was refused"
        );
        requests_available(&limit)
    });
    // Both reserved before the limit was learned, one before and one after, both after.
    assert_eq!(outcomes, BTreeSet::from([0, 1, 2]));
}
