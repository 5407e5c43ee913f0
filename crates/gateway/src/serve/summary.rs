//! The gateway's own log of failed calls, bounded under load: each failure at DEBUG, and at most
//! one WARN line per [`SUMMARY_EVERY`] with the failures since the last, counted by reason. In a
//! storm thousands of failures a second become one line every ten seconds, as the library's
//! refused retries do.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often the summary of failures is written, at most.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// Failures counted since the last summary.
#[derive(Default)]
pub(crate) struct Failures {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the current period began (`None`: no failure since the last summary).
    since: Option<Instant>,
    counts: BTreeMap<&'static str, u64>,
}

impl Failures {
    /// Counts a failure for `reason` after `attempts` attempts, and writes the summary if one is
    /// due. The first failure after a quiet period is written at once.
    pub(crate) fn record(&self, reason: &'static str, attempts: u32) {
        tracing::debug!(reason, attempts, "upstream call failed");
        let now = Instant::now();
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let Some(since) = state.since else {
            state.since = Some(now);
            drop(state);
            tracing::warn!(reason, attempts, "upstream call failed");
            return;
        };
        *state.counts.entry(reason).or_default() += 1;
        if now.duration_since(since) < SUMMARY_EVERY {
            return;
        }
        let counts = std::mem::take(&mut state.counts);
        state.since = Some(now);
        drop(state);
        let total: u64 = counts.values().sum();
        let by_reason = counts
            .iter()
            .map(|(reason, n)| format!("{reason}={n}"))
            .collect::<Vec<_>>()
            .join(" ");
        tracing::warn!(
            total,
            by_reason,
            period_s = now.duration_since(since).as_secs(),
            "upstream calls failed"
        );
    }

    /// The failures counted and not yet summarised, by reason.
    #[cfg(test)]
    fn pending(&self) -> BTreeMap<&'static str, u64> {
        self.state
            .lock()
            .map(|state| state.counts.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_storm_of_failures_is_one_line_per_period() {
        let failures = Failures::default();
        // The first is written at once; the next 999 within the period are only counted.
        for _ in 0..1000 {
            failures.record("rate_limited", 2);
        }
        assert_eq!(failures.pending().get("rate_limited"), Some(&999));
        tokio::time::advance(SUMMARY_EVERY).await;
        failures.record("timeout", 1);
        // The summary was written and the counts start again.
        assert!(failures.pending().is_empty());
        failures.record("timeout", 1);
        assert_eq!(failures.pending().get("timeout"), Some(&1));
    }
}
