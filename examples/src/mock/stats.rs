//! What the mock has seen, readable while it runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(doc)]
use super::Fault;

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
    streams: AtomicU64,
    stream_errors: AtomicU64,
    streams_cut: AtomicU64,
    prefilled: AtomicU64,
    content_chunks: AtomicU64,
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
    /// `Idempotency-Key` values, in arrival order (one per attempt that carried one), unless
    /// [`MockConfig::keep_idempotency_keys`](super::MockConfig::keep_idempotency_keys) is off.
    pub idempotency_keys: Vec<String>,
    /// Requests being served now (a streamed answer is served until its stream ends or its
    /// client goes away).
    pub in_flight: usize,
    /// Most requests served at once (a streamed answer is served until its stream ends).
    pub peak_in_flight: usize,
    /// Streamed answers begun (`200`, `text/event-stream`; also counted in `by_status`), the
    /// faulty ones included.
    pub streams: u64,
    /// Streams that sent an error frame before any content ([`Fault::ErrorBeforeContent`]).
    pub stream_errors: u64,
    /// Streams whose connection the mock failed mid-stream ([`Fault::CutMidStream`]).
    pub streams_cut: u64,
    /// Streams that went on from an assistant prefill (the request's last message was the
    /// assistant's, with words in it): the continuations of cut streams.
    pub prefilled: u64,
    /// Content chunks handed to the connection, over all streams.
    pub content_chunks: u64,
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
            in_flight: self.inner.in_flight.load(Ordering::Relaxed),
            peak_in_flight: self.inner.peak_in_flight.load(Ordering::Relaxed),
            streams: self.inner.streams.load(Ordering::Relaxed),
            stream_errors: self.inner.stream_errors.load(Ordering::Relaxed),
            streams_cut: self.inner.streams_cut.load(Ordering::Relaxed),
            prefilled: self.inner.prefilled.load(Ordering::Relaxed),
            content_chunks: self.inner.content_chunks.load(Ordering::Relaxed),
        }
    }

    /// Counts an arriving request. The returned guard holds its place among the requests in
    /// flight until it is dropped, even when the client goes away mid-answer.
    pub(crate) fn arrive(&self, attempt: Option<u32>, idempotency_key: Option<String>) -> InFlight {
        let arrival = self.inner.attempts.fetch_add(1, Ordering::Relaxed);
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
            arrival,
            in_flight,
        }
    }
}

/// One request being served.
pub(crate) struct InFlight {
    stats: MockStats,
    arrival: u64,
    in_flight: usize,
}

/// What a streamed answer sent, counted as it goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Streamed {
    /// The stream began.
    Begun,
    /// It goes on from an assistant prefill.
    Prefilled,
    /// A content chunk.
    Content,
    /// An error frame before any content.
    Error,
    /// The cut of its connection.
    Cut,
}

impl InFlight {
    /// How many requests arrived before this one.
    pub(crate) fn arrival(&self) -> u64 {
        self.arrival
    }

    /// Counts what this request's stream sent.
    pub(crate) fn streamed(&self, what: Streamed) {
        let inner = &self.stats.inner;
        let counter = match what {
            Streamed::Begun => &inner.streams,
            Streamed::Prefilled => &inner.prefilled,
            Streamed::Content => &inner.content_chunks,
            Streamed::Error => &inner.stream_errors,
            Streamed::Cut => &inner.streams_cut,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

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
