//! The engine's spans: one per request, one per attempt inside it, with their fields, and the
//! engine's and the backend's events inside the attempt they belong to. Alone in its test
//! binary: a thread-local subscriber shares tracing's callsite cache with every other test thread
//! of the same binary.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard_jitter::Constant;
use stormguard_retry::Hedging;
use stormguard_test_kit::post;
use support::{CHAT_URI, Log, planned, retries_only, scripted, status};
use tower::{Layer, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as recorded: its name, its fields, and its parent's index.
#[derive(Clone, Debug, Default)]
struct SpanRecord {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<usize>,
}

/// An event as recorded: its level, message and fields, and the span it happened in.
#[derive(Clone, Debug)]
struct EventRecord {
    level: tracing::Level,
    fields: BTreeMap<String, String>,
    span: Option<usize>,
}

#[derive(Clone, Default)]
struct Recorder {
    spans: Arc<Mutex<Vec<SpanRecord>>>,
    events: Arc<Mutex<Vec<EventRecord>>>,
}

/// Where a span's record is in [`Recorder::spans`].
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let parent = span
            .parent()
            .and_then(|parent| parent.extensions().get::<Index>().map(|index| index.0));
        let mut record = SpanRecord {
            name: attributes.metadata().name(),
            parent,
            ..SpanRecord::default()
        };
        attributes.record(&mut Fields(&mut record.fields));
        let mut spans = self.spans.lock().unwrap();
        span.extensions_mut().insert(Index(spans.len()));
        spans.push(record);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let index = span.extensions().get::<Index>().unwrap().0;
        values.record(&mut Fields(&mut self.spans.lock().unwrap()[index].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .and_then(|span| span.extensions().get::<Index>().map(|index| index.0));
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(EventRecord {
            level: *event.metadata().level(),
            fields,
            span,
        });
    }
}

impl Recorder {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::registry().with(self.clone());
        tracing::subscriber::set_default(subscriber)
    }

    fn spans(&self) -> Vec<SpanRecord> {
        self.spans.lock().unwrap().clone()
    }

    fn events(&self) -> Vec<EventRecord> {
        self.events.lock().unwrap().clone()
    }
}

fn field<'a>(fields: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    fields.get(name).map(String::as_str)
}

#[tokio::test(start_paused = true)]
async fn one_span_per_request_and_one_per_attempt() {
    let recorder = Recorder::default();
    let _guard = recorder.install();

    let log = Log::default();
    let inner = scripted(&log, Duration::from_millis(100), |index, _| {
        Ok(status(if index < 2 { 503 } else { 200 }))
    });
    // The backend logs each call: it must be inside the attempt's span.
    let backend = tower::service_fn(move |request| {
        tracing::info!(message = "backend called");
        inner.clone().oneshot(request)
    });
    let client = retries_only()
        .with_name("openai")
        .with_backoff(Constant::new(Duration::from_millis(250)))
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(response.status(), 200);

    let spans = recorder.spans();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let request = &spans[0];
    assert_eq!(request.name, "stormguard.request");
    assert_eq!(request.parent, None);
    assert_eq!(field(&request.fields, "backend"), Some("openai"));
    assert_eq!(field(&request.fields, "attempts"), Some("3"));
    assert_eq!(field(&request.fields, "outcome"), Some("success"));
    assert_eq!(field(&request.fields, "error.type"), None);
    for (attempt, span) in (1..).zip(&spans[1..]) {
        assert_eq!(span.name, "stormguard.attempt");
        assert_eq!(span.parent, Some(0));
        let fields = &span.fields;
        assert_eq!(field(fields, "attempt"), Some(&*attempt.to_string()));
        assert_eq!(field(fields, "backend"), Some("openai"));
        if attempt < 3 {
            assert_eq!(field(fields, "status"), Some("503"), "{span:?}");
            assert_eq!(field(fields, "outcome"), Some("retryable"), "{span:?}");
            assert_eq!(field(fields, "reason"), Some("unavailable"), "{span:?}");
            assert_eq!(field(fields, "delay_ms"), Some("250"), "{span:?}");
        } else {
            assert_eq!(field(fields, "status"), Some("200"), "{span:?}");
            assert_eq!(field(fields, "outcome"), Some("success"), "{span:?}");
            assert_eq!(field(fields, "reason"), None, "{span:?}");
            assert_eq!(field(fields, "delay_ms"), None, "{span:?}");
        }
    }

    let events = recorder.events();
    let called: Vec<Option<usize>> = (events.iter())
        .filter(|event| field(&event.fields, "message") == Some("backend called"))
        .map(|event| event.span)
        .collect();
    assert_eq!(called, [Some(1), Some(2), Some(3)]);
    let retries: Vec<(Option<usize>, Option<&str>)> = (events.iter())
        .filter(|event| event.level == tracing::Level::WARN)
        .map(|event| (event.span, field(&event.fields, "retry_attempt")))
        .collect();
    assert_eq!(retries, [(Some(1), Some("1")), (Some(2), Some("2"))]);
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_on_the_request_span_and_its_error_in_the_last_attempt() {
    let recorder = Recorder::default();
    let _guard = recorder.install();

    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(429)));
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(10)))
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(response.status(), 429);

    let spans = recorder.spans();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let request = &spans[0].fields;
    assert_eq!(field(request, "backend"), None);
    assert_eq!(field(request, "attempts"), Some("3"));
    assert_eq!(field(request, "outcome"), Some("failure"));
    assert_eq!(field(request, "error.type"), Some("rate_limited"));
    let errors: Vec<Option<usize>> = (recorder.events().iter())
        .filter(|event| event.level == tracing::Level::ERROR)
        .map(|event| event.span)
        .collect();
    assert_eq!(errors, [Some(3)]);
}

#[tokio::test(start_paused = true)]
async fn a_request_refused_here_has_no_attempt() {
    let recorder = Recorder::default();
    let _guard = recorder.install();

    let breaker = stormguard_breaker::CircuitBreaker::new(
        stormguard_breaker::BreakerConfig::default().with_consecutive_failures(Some(1)),
    );
    let log = Log::default();
    let backend = scripted(&log, Duration::ZERO, |_, _| Ok(status(503)));
    let client = retries_only()
        .with_max_attempts(1)
        .with_breaker(breaker)
        .layer(backend);
    let _ = client.clone().oneshot(post(CHAT_URI, "{}")).await;
    let refused = client.oneshot(post(CHAT_URI, "{}")).await.unwrap_err();
    assert_eq!(refused.attempts(), 0);

    let spans = recorder.spans();
    let names: Vec<&str> = spans.iter().map(|span| span.name).collect();
    assert_eq!(
        names,
        [
            "stormguard.request",
            "stormguard.attempt",
            "stormguard.request"
        ]
    );
    let second = &spans[2].fields;
    assert_eq!(field(second, "attempts"), Some("0"));
    assert_eq!(field(second, "outcome"), Some("refused"));
    assert_eq!(field(second, "error.type"), Some("breaker_open"));
}

/// A hedge has a span of its own beside the first attempt's, marked `hedge`; the attempt that
/// lost the race says `cancelled`, and the backend's events of each attempt are in its span.
#[tokio::test(start_paused = true)]
async fn a_hedge_has_its_own_attempt_span_and_the_loser_says_cancelled() {
    let recorder = Recorder::default();
    let _guard = recorder.install();

    let log = Log::default();
    let inner = planned(
        &log,
        &[
            (Duration::from_secs(10), 200),
            (Duration::from_millis(100), 200),
        ],
    );
    let backend = tower::service_fn(move |request| {
        tracing::info!(message = "backend called");
        inner.clone().oneshot(request)
    });
    let client = retries_only()
        .with_hedging(Hedging::after(Duration::from_secs(1)))
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(response.status(), 200);

    let spans = recorder.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert_eq!(field(&spans[0].fields, "attempts"), Some("2"));
    assert_eq!(field(&spans[0].fields, "outcome"), Some("success"));
    let first = &spans[1].fields;
    assert_eq!(field(first, "hedge"), Some("false"));
    assert_eq!(field(first, "outcome"), Some("cancelled"));
    let hedge = &spans[2].fields;
    assert_eq!(spans[2].parent, Some(0));
    assert_eq!(field(hedge, "attempt"), Some("2"));
    assert_eq!(field(hedge, "hedge"), Some("true"));
    assert_eq!(field(hedge, "outcome"), Some("success"));
    let called: Vec<Option<usize>> = (recorder.events().iter())
        .filter(|event| field(&event.fields, "message") == Some("backend called"))
        .map(|event| event.span)
        .collect();
    assert_eq!(called, [Some(1), Some(2)]);
    // A hedge is no retry: no WARN.
    let warnings = (recorder.events().iter())
        .filter(|event| event.level == tracing::Level::WARN)
        .count();
    assert_eq!(warnings, 0);
}

/// OpenTelemetry's `http.request.resend_count`: absent on the first attempt, then how many times
/// the request was sent before.
#[tokio::test(start_paused = true)]
async fn each_attempt_after_the_first_counts_the_sendings_before_it() {
    let recorder = Recorder::default();
    let _guard = recorder.install();

    let log = Log::default();
    let backend = scripted(&log, Duration::from_millis(10), |index, _| {
        Ok(status(if index < 2 { 503 } else { 200 }))
    });
    let client = retries_only()
        .with_backoff(Constant::new(Duration::from_millis(10)))
        .layer(backend);
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(response.status(), 200);

    let spans = recorder.spans();
    let resends: Vec<Option<&str>> = (spans.iter())
        .filter(|span| span.name == "stormguard.attempt")
        .map(|span| field(&span.fields, "http.request.resend_count"))
        .collect();
    assert_eq!(resends, [None, Some("1"), Some("2")]);
    assert_eq!(field(&spans[0].fields, "http.request.resend_count"), None);
}

/// A hedge is a sending too: sent while the first attempt waits, it is the request's second.
#[tokio::test(start_paused = true)]
async fn a_hedge_counts_the_attempt_it_races() {
    let recorder = Recorder::default();
    let _guard = recorder.install();

    let plan = [
        (Duration::from_secs(10), 200),
        (Duration::from_millis(100), 200),
    ];
    let client = retries_only()
        .with_hedging(Hedging::after(Duration::from_secs(1)))
        .layer(planned(&Log::default(), &plan));
    let response = client.oneshot(post(CHAT_URI, "{}")).await.unwrap();
    assert_eq!(response.status(), 200);

    let spans = recorder.spans();
    let resends: Vec<(Option<&str>, Option<&str>)> = (spans.iter())
        .filter(|span| span.name == "stormguard.attempt")
        .map(|span| {
            let hedge = field(&span.fields, "hedge");
            (hedge, field(&span.fields, "http.request.resend_count"))
        })
        .collect();
    assert_eq!(resends, [(Some("false"), None), (Some("true"), Some("1"))]);
}
