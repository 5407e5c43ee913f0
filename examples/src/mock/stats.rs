//! What the mock has seen, readable while it runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Counters of a running mock. Cheap to clone: clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct MockStats {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    attempts: AtomicU64,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    by_status: BTreeMap<u16, u64>,
    by_attempt_header: BTreeMap<u32, u64>,
    idempotency_keys: Vec<String>,
}

/// A copy of the counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests that reached the mock (every attempt counts).
    pub attempts: u64,
    /// Answers by status code.
    pub by_status: BTreeMap<u16, u64>,
    /// Requests by the value of their `x-retry-attempt` header (absent or unreadable: not counted).
    pub by_attempt_header: BTreeMap<u32, u64>,
    /// `Idempotency-Key` values, in arrival order (one per attempt that carried one).
    pub idempotency_keys: Vec<String>,
    /// Most requests served at once.
    pub peak_in_flight: usize,
}

impl StatsSnapshot {
    /// Answers with status `status`.
    pub fn status(&self, status: u16) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    /// Answers with a 2xx status.
    pub fn successes(&self) -> u64 {
        self.by_status
            .iter()
            .filter(|(status, _)| (200..300).contains(*status))
            .map(|(_, count)| count)
            .sum()
    }

    /// Distinct idempotency keys seen.
    pub fn distinct_idempotency_keys(&self) -> usize {
        let mut keys: Vec<&String> = self.idempotency_keys.iter().collect();
        keys.sort();
        keys.dedup();
        keys.len()
    }
}

impl MockStats {
    /// The counters as they are now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let seen = self
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        StatsSnapshot {
            attempts: self.inner.attempts.load(Ordering::Relaxed),
            by_status: seen.by_status.clone(),
            by_attempt_header: seen.by_attempt_header.clone(),
            idempotency_keys: seen.idempotency_keys.clone(),
            peak_in_flight: self.inner.peak_in_flight.load(Ordering::Relaxed),
        }
    }

    /// Counts an arriving request. The returned guard holds its place among the requests in
    /// flight until it is dropped, even when the client goes away mid-answer.
    pub(crate) fn arrive(&self, attempt: Option<u32>, idempotency_key: Option<String>) -> InFlight {
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let in_flight = self.inner.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner
            .peak_in_flight
            .fetch_max(in_flight, Ordering::Relaxed);
        let mut seen = self
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(attempt) = attempt {
            *seen.by_attempt_header.entry(attempt).or_default() += 1;
        }
        if let Some(key) = idempotency_key {
            seen.idempotency_keys.push(key);
        }
        InFlight {
            stats: self.clone(),
            in_flight,
        }
    }
}

/// One request being served.
pub(crate) struct InFlight {
    stats: MockStats,
    in_flight: usize,
}

impl InFlight {
    /// Requests in flight when this one arrived, this one included.
    pub(crate) fn load(&self) -> usize {
        self.in_flight
    }

    /// Counts the answer this request got.
    pub(crate) fn answered(&self, status: u16) {
        let mut seen = self
            .stats
            .inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *seen.by_status.entry(status).or_default() += 1;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.stats.inner.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
