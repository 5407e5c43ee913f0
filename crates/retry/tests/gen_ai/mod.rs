//! The GenAI metrics' scenarios, shared by the tests of each generation of names
//! (`genai_current.rs`, `genai_latest.rs`: a process records one generation, so each has a test
//! binary of its own). Each scenario runs on a paused clock with a recorder of its own and
//! returns what was recorded.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use stormguard_jitter::Constant;
use stormguard_test_kit::{ScriptedBackend, ScriptedBody, post};
use tower::{Layer, ServiceExt};

use crate::support::{CHAT_URI, Log, body_bytes, reply, retries_only, scripted, status};

pub mod checks;

/// The labels of one series, by name.
pub type Labels = BTreeMap<String, String>;

/// What a scenario recorded.
pub struct Recorded(Vec<(CompositeKey, DebugValue)>);

/// Runs `test` on a paused current-thread runtime with a recorder of its own.
fn recorded<F: Future<Output = ()>>(test: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(test()));
    let series = snapshotter.snapshot().into_vec();
    Recorded(
        series
            .into_iter()
            .map(|(key, _, _, value)| (key, value))
            .collect(),
    )
}

impl Recorded {
    /// Every series named `name`: its labels and its values (a counter's: its count).
    pub fn series(&self, name: &str) -> Vec<(Labels, Vec<f64>)> {
        let mut series: Vec<(Labels, Vec<f64>)> = (self.0.iter())
            .filter(|(key, _)| key.key().name() == name)
            .map(|(key, value)| {
                let labels = (key.key().labels())
                    .map(|label| (label.key().to_owned(), label.value().to_owned()))
                    .collect();
                let mut values: Vec<f64> = match value {
                    DebugValue::Histogram(values) => {
                        values.iter().map(|v| v.into_inner()).collect()
                    }
                    DebugValue::Counter(count) => vec![*count as f64],
                    DebugValue::Gauge(value) => vec![value.into_inner()],
                };
                values.sort_by(f64::total_cmp);
                (labels, values)
            })
            .collect();
        series.sort_by(|a, b| a.0.cmp(&b.0));
        series
    }

    /// The kind of the series named `name` (all of them are of one kind).
    pub fn kind(&self, name: &str) -> Option<MetricKind> {
        let kinds: Vec<MetricKind> = (self.0.iter())
            .filter(|(key, _)| key.key().name() == name)
            .map(|(key, _)| key.kind())
            .collect();
        assert!(kinds.windows(2).all(|w| w[0] == w[1]), "{kinds:?}");
        kinds.first().copied()
    }

    /// Whether anything named `name` was recorded.
    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(key, _)| key.key().name() == name)
    }
}

/// `labels` as a map.
pub fn labels(labels: &[(&str, &str)]) -> Labels {
    (labels.iter())
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// Whether `actual` are `expected`, to the millisecond.
pub fn close(actual: &[f64], expected: &[f64]) -> bool {
    actual.len() == expected.len()
        && actual
            .iter()
            .zip(expected)
            .all(|(a, e)| (a - e).abs() < 0.002)
}

/// What every figure of the chat requests below carries.
pub const CHAT: &[(&str, &str)] = &[
    ("gen_ai.provider.name", "openai"),
    ("gen_ai.operation.name", "chat"),
    ("gen_ai.request.model", "gpt-4o"),
    ("server.address", "llm.test"),
    ("server.port", "80"),
];

/// The model the answers below name.
pub const ANSWERED_BY: &str = "gpt-4o-2024-08-06";

fn chat_request() -> Request<Full<bytes::Bytes>> {
    post(
        CHAT_URI,
        r#"{"messages":[{"role":"user","content":"say \"model\": \"no\""}],"model":"gpt-4o"}"#,
    )
}

/// A chat request answered whole on its second attempt: 503 after 1 s, a backoff of 250 ms,
/// then the answer after 1 s, naming its model and 12 input and 30 output tokens.
pub fn a_whole_answer_after_a_retry() -> Recorded {
    recorded(|| async {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_secs(1), |index, _| {
            Ok(match index {
                0 => status(503),
                _ => reply(
                    200,
                    &[("content-type", "application/json")],
                    r#"{"id":"c1","model":"gpt-4o-2024-08-06","usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#,
                ),
            })
        });
        let client = retries_only()
            .with_name("openai")
            .with_backoff(Constant::new(Duration::from_millis(250)))
            .layer(backend);
        let response = client.oneshot(chat_request()).await.unwrap();
        assert_eq!(response.status(), 200);
        body_bytes(response).await;
        assert_eq!(log.len(), 2);
    })
}

/// A chat request that fails: 503 after 500 ms on each of its three attempts, sent without
/// backoff.
pub fn a_failure() -> Recorded {
    recorded(|| async {
        let log = Log::default();
        let backend = scripted(&log, Duration::from_millis(500), |_, _| Ok(status(503)));
        let client = retries_only()
            .with_name("openai")
            .with_backoff(Constant::new(Duration::ZERO))
            .layer(backend);
        let response = client.oneshot(chat_request()).await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(log.len(), 3);
    })
}

const OPENAI_CHUNK: &str =
    "data: {\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const OPENAI_USAGE: &str = "data: {\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\ndata: [DONE]\n\n";

/// A streamed chat answer: its head after 500 ms, its content events 250 ms, 350 ms and 650 ms
/// later, then its usage (9 input, 3 output tokens) and its end.
pub fn a_stream() -> Recorded {
    recorded(|| async {
        let backend = ScriptedBackend::answering(|_, _| {
            let body = ScriptedBody::new()
                .delay(Duration::from_millis(250))
                .data(OPENAI_CHUNK)
                .delay(Duration::from_millis(100))
                .data(OPENAI_CHUNK)
                .delay(Duration::from_millis(300))
                .data(OPENAI_CHUNK)
                .data(OPENAI_USAGE);
            let mut response = Response::new(body);
            (response.headers_mut()).insert("content-type", "text/event-stream".parse().unwrap());
            Ok(response)
        })
        .latency(Duration::from_millis(500));
        let client = retries_only().with_name("openai").layer(backend);
        let response = client.oneshot(chat_request()).await.unwrap();
        let body = body_bytes(response).await;
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    })
}

/// Gemini's `generateContent` (the model in the path), on port 8080, answered at once.
pub fn a_gemini_request() -> Recorded {
    recorded(|| async {
        let (_log, backend) = crate::support::instant(|_, _| {
            Ok(reply(
                200,
                &[("content-type", "application/json")],
                r#"{"modelVersion":"gemini-2.0-flash-001","usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":4}}"#,
            ))
        });
        let client = retries_only().with_name("gcp.gemini").layer(backend);
        let request = post(
            "http://gemini.test:8080/v1beta/models/gemini-2.0-flash:generateContent",
            r#"{"contents":[{"role":"model","parts":[{"text":"Hi"}]}]}"#,
        );
        body_bytes(client.oneshot(request).await.unwrap()).await;
    })
}

/// An embeddings request, answered at once with 8 input tokens.
pub fn an_embeddings_request() -> Recorded {
    recorded(|| async {
        let (_log, backend) = crate::support::instant(|_, _| {
            Ok(reply(
                200,
                &[("content-type", "application/json")],
                r#"{"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}"#,
            ))
        });
        let client = retries_only().with_name("openai").layer(backend);
        let request = post(
            "https://api.test/v1/embeddings",
            r#"{"model":"text-embedding-3-small","input":"Hi"}"#,
        );
        body_bytes(client.oneshot(request).await.unwrap()).await;
    })
}

/// Chat requests naming hostile models (a long name, one with a space and a newline, one with
/// an escape), and one naming none.
pub fn hostile_models() -> Recorded {
    recorded(|| async {
        let (_log, backend) = crate::support::instant(|_, _| Ok(status(200)));
        let client = retries_only().with_name("openai").layer(backend);
        let long = "m".repeat(10_000);
        for body in [
            format!(r#"{{"model":"{long}"}}"#),
            r#"{"model":"gpt 4\nx"}"#.to_owned(),
            r#"{"model":"gpt-\"4\""}"#.to_owned(),
            r#"{"messages":[]}"#.to_owned(),
        ] {
            let response = client.clone().oneshot(post(CHAT_URI, body)).await.unwrap();
            body_bytes(response).await;
        }
    })
}

/// A streamed chat answer that breaks after its content: its head after 500 ms, its content
/// 200 ms later, an error event 100 ms after that; not continued.
pub fn an_interrupted_stream() -> Recorded {
    recorded(|| async {
        let backend = ScriptedBackend::answering(|_, _| {
            let body = ScriptedBody::new()
                .delay(Duration::from_millis(200))
                .data(OPENAI_CHUNK)
                .delay(Duration::from_millis(100))
                .data(
                    "data: {\"error\":{\"type\":\"server_error\",\"message\":\"overloaded\"}}\n\n",
                );
            let mut response = Response::new(body);
            (response.headers_mut()).insert("content-type", "text/event-stream".parse().unwrap());
            Ok(response)
        })
        .latency(Duration::from_millis(500));
        let client = retries_only()
            .with_name("openai")
            .without_continuation()
            .layer(backend);
        let response = client.oneshot(chat_request()).await.unwrap();
        let read = http_body_util::BodyExt::collect(response.into_body()).await;
        assert!(read.is_err());
    })
}
