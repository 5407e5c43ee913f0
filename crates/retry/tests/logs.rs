//! The engine's log events. Alone in its test binary: a thread-local subscriber shares tracing's
//! callsite cache with every other test thread of the same binary.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_jitter::Constant;
use support::{Log, retries_only, scripted, status};
use tower::{Layer, ServiceExt};

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

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn retries_and_give_ups_are_logged_apart() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .without_time()
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(250)))
        .layer(backend);
    client.oneshot(support::post("{}")).await.unwrap();

    let lines = captured.lines();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for (line, attempt) in lines[..2].iter().zip(1..) {
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("retrying request"), "{line}");
        assert!(line.contains(&format!("retry_attempt={attempt}")), "{line}");
        assert!(line.contains("delay_ms=250"), "{line}");
        assert!(line.contains("reason=\"unavailable\""), "{line}");
    }
    assert!(lines[2].contains("giving up"), "{}", lines[2]);
    assert!(
        lines[2].contains("cause=\"attempts_exhausted\""),
        "{}",
        lines[2]
    );

    // Budget exhaustion has an event of its own before the give-up.
    let budget = stormguard_budget::RetryBudget::new(Duration::from_secs(10), 0, 0.1);
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only().with_budget(budget).layer(backend);
    client.oneshot(support::post("{}")).await.unwrap();
    let lines = captured.lines();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert!(lines[3].contains("retry budget exhausted"), "{}", lines[3]);
    assert!(
        lines[4].contains("cause=\"budget_exhausted\""),
        "{}",
        lines[4]
    );
}
