//! Waiting is first come, first served, on tokio's paused clock: slots follow the order of
//! reservation whatever the weights, a light request never overtakes a heavy one that waits,
//! and a reservation dropped unsent gives its slot back without giving one slot to two.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_rate_limit::{RateLimit, RateLimitConfig};
use support::{head, take, wait_of};
use tokio::task::JoinSet;
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// 600 requests and 6,000 tokens a minute, waits of up to a minute.
fn requests_and_tokens() -> RateLimit {
    RateLimit::new(
        RateLimitConfig::default()
            .with_requests_per_minute(Some(600))
            .with_tokens_per_minute(Some(6_000))
            .with_max_wait(Duration::from_secs(60)),
    )
}

/// 40 requests of mixed weights (1 to 250 tokens) reserved in one instant, each waiting for
/// its slot in a task of its own: their slots never go backwards in the order of reservation,
/// and they are sent in that order.
#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_the_order_they_came() {
    let limit = requests_and_tokens();
    let weights = [1_u64, 80, 250, 5, 40, 100, 1, 1, 120, 30];
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut starts = Vec::new();
    let mut waiting = JoinSet::new();
    for (order, tokens) in weights.iter().cycle().take(40).enumerate() {
        let reservation = limit.reserve(&head(), *tokens, None).unwrap();
        starts.push(reservation.start());
        let sent = Arc::clone(&sent);
        waiting.spawn(async move {
            tokio::time::sleep_until(reservation.start()).await;
            drop(reservation.send());
            sent.lock().unwrap().push(order);
        });
    }
    assert!(starts.is_sorted(), "{starts:?}");
    assert!(*starts.last().unwrap() - Instant::now() > Duration::from_secs(10));
    while waiting.join_next().await.is_some() {}
    assert_eq!(*sent.lock().unwrap(), (0..40).collect::<Vec<_>>());
}

/// A request of one token, reserved after one of 300 that waits for a full bucket, waits for it
/// too rather than slipping into the bucket before it: the heavy request is never starved.
#[tokio::test(start_paused = true)]
async fn a_light_request_never_overtakes_a_heavy_one() {
    let limit = requests_and_tokens();
    assert_eq!(take(&limit, 60), Duration::ZERO);
    let heavy = limit.reserve(&head(), 300, None).unwrap();
    assert_eq!(
        wait_of(&heavy),
        600 * MS,
        "the bucket is full again at 600 ms"
    );
    let light = limit.reserve(&head(), 1, None).unwrap();
    assert!(light.start() > heavy.start());
    assert_eq!(
        wait_of(&light),
        2_610 * MS,
        "when the bucket holds a token again"
    );
}

/// The last reservation, dropped unsent, gives its slot back: the next request gets it.
#[tokio::test(start_paused = true)]
async fn the_last_reservation_dropped_gives_its_slot_back() {
    // 60 a minute, a bucket of one.
    let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(60)));
    assert_eq!(take(&limit, 0), Duration::ZERO);
    let first = limit.reserve(&head(), 0, None).unwrap();
    assert_eq!(wait_of(&first), Duration::from_secs(1));
    let second = limit.reserve(&head(), 0, None).unwrap();
    assert_eq!(wait_of(&second), Duration::from_secs(2));
    drop(second);
    assert_eq!(take(&limit, 0), Duration::from_secs(2));
    drop(first.send());
}

/// A reservation dropped while others wait behind it gives back what it can without giving one
/// slot to two requests: with a bucket of one (60 a minute), dropping the slot at 1 s while
/// another waits for 2 s leaves the next at 3 s (giving it back would put the next at 2 s, with
/// the one already there); with a bucket of ten (600 a minute), the slot dropped from the middle
/// of the queue goes to the next request, which shares an instant with the last only as the
/// bucket allows.
#[tokio::test(start_paused = true)]
async fn a_reservation_dropped_from_the_middle_never_double_books_a_slot() {
    let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(60)));
    assert_eq!(take(&limit, 0), Duration::ZERO);
    let middle = limit.reserve(&head(), 0, None).unwrap();
    let last = limit.reserve(&head(), 0, None).unwrap();
    assert_eq!(wait_of(&last), Duration::from_secs(2));
    drop(middle);
    let next = limit.reserve(&head(), 0, Some(Instant::now() + Duration::from_secs(10)));
    assert_eq!(next.unwrap_err().retry_after(), Duration::from_secs(3));
    drop(last.send());

    let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(600)));
    for _ in 0..10 {
        assert_eq!(take(&limit, 0), Duration::ZERO);
    }
    let middle = limit.reserve(&head(), 0, None).unwrap();
    assert_eq!(wait_of(&middle), 100 * MS);
    assert_eq!(take(&limit, 0), 200 * MS);
    drop(middle);
    // The bucket refilled two requests by 200 ms; one went then, the other is free.
    assert_eq!(take(&limit, 0), 200 * MS);
    assert_eq!(take(&limit, 0), 300 * MS);
}

/// Reservations dropped in any order while the clock moves give back exactly what they took:
/// 30 reserved at 600 a minute, the 20 not yet due dropped, the clock moved 3 s on: the bucket
/// is full again (10), as if they never came.
#[tokio::test(start_paused = true)]
async fn dropped_reservations_leave_no_debt() {
    let limit = requests_and_tokens();
    let mut reservations: Vec<_> = (0..30)
        .map(|_| limit.reserve(&head(), 10, None).unwrap())
        .collect();
    let sent: Vec<_> = reservations.drain(..10).map(|r| r.send()).collect();
    // Dropped from the back and from the middle.
    reservations.reverse();
    reservations.swap(3, 15);
    drop(reservations);
    drop(sent);
    let snapshot = limit.snapshot();
    assert_eq!(snapshot.requests_available, Some(0));
    assert_eq!(snapshot.tokens_available, Some(0));
    tokio::time::advance(Duration::from_secs(1)).await;
    let snapshot = limit.snapshot();
    assert_eq!(snapshot.requests_available, Some(10));
    assert_eq!(snapshot.tokens_available, Some(100));
}
