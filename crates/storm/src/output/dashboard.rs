//! What a dashboard would show of a stormguard pipeline's run: the engine's own metrics
//! (`stormguard::metrics`: its counters, gauges and histograms, under their names and labels),
//! as a recorder of the run collected them (`storm --metrics`).
//!
//! Each run has its own [`Collector`], a `metrics::Recorder` that is the thread's recorder only
//! while a measured request's task is polled ([`Recorded`]): the engine's metrics are then those
//! of the requests the report counts (the arrivals within the scenario's duration), not those of
//! the arrivals that go on, unmeasured, until the last measured request has its answer. A request
//! still unanswered when the run ends records nothing of its end. Recording reads nothing the
//! simulation draws or decides from: a run's figures are the same with it or without it.
//!
//! The [`Dashboard`] holds one [`MetricSeries`] per name and label set: a counter's total, a
//! gauge's last and highest value (over every value it was set to), a histogram's count, p50, p99
//! and max, and the same per [`WINDOW`] of simulated time (a counter's increase, a gauge's highest
//! value, a histogram's count), the last window running to the end of the run.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use pin_project_lite::pin_project;
use serde::{Serialize, Serializer};
use stormguard::metrics as names;

use crate::metrics::percentile;

/// The length of a window of [`MetricSeries::value`]'s `per_window` figures: 10 s of simulated
/// time.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// The engine's metric names in the order of their table (`stormguard::metrics`), which is the
/// order the dashboard lists them in; a name not in it comes after them.
const ORDER: [&str; 11] = [
    names::REQUEST_ATTEMPTS,
    names::REQUEST_DURATION,
    names::ATTEMPT_DURATION,
    names::RETRIES,
    names::REFUSALS,
    names::THROTTLE_DROP_PROBABILITY,
    names::BREAKER_STATE,
    names::RATE_LIMIT_WAIT,
    names::RATE_LIMIT_HEADROOM,
    names::STREAMS,
    names::FAILOVERS,
];

/// The metrics of one run: a `metrics::Recorder` keeping every series it is given, and the
/// windows closed so far ([`Collector::close_window`]).
pub(crate) struct Collector {
    counters: RefCell<HashMap<Key, Arc<Instrument<CounterState>>>>,
    gauges: RefCell<HashMap<Key, Arc<Instrument<GaugeState>>>>,
    histograms: RefCell<HashMap<Key, Arc<Instrument<HistogramState>>>>,
    /// Each name's unit, as `stormguard::metrics::describe` gives it.
    units: RefCell<HashMap<String, Unit>>,
    /// Windows closed so far.
    windows: Cell<usize>,
}

impl Collector {
    /// An empty collector, told the unit of every name of the engine's.
    pub fn new() -> Collector {
        let collector = Collector {
            counters: RefCell::default(),
            gauges: RefCell::default(),
            histograms: RefCell::default(),
            units: RefCell::default(),
            windows: Cell::new(0),
        };
        metrics::with_local_recorder(&collector, names::describe);
        collector
    }

    /// End the current window (call it every [`WINDOW`] of simulated time): what follows counts
    /// in the next one.
    pub(crate) fn close_window(&self) {
        self.windows.set(self.windows.get() + 1);
        for instrument in self.counters.borrow().values() {
            instrument.lock().close();
        }
        for instrument in self.gauges.borrow().values() {
            instrument.lock().close();
        }
        for instrument in self.histograms.borrow().values() {
            instrument.lock().close();
        }
    }

    /// What the dashboard shows: every series so far, in the order of the engine's table, then
    /// by labels.
    pub fn dashboard(&self) -> Dashboard {
        let unit = |name: &str| self.units.borrow().get(name).copied();
        let mut series: Vec<MetricSeries> = Vec::new();
        for (key, instrument) in self.counters.borrow().iter() {
            series.push(MetricSeries::new(key, instrument.lock().value()));
        }
        for (key, instrument) in self.gauges.borrow().iter() {
            series.push(MetricSeries::new(key, instrument.lock().value()));
        }
        for (key, instrument) in self.histograms.borrow().iter() {
            let seconds = unit(key.name()) == Some(Unit::Seconds);
            series.push(MetricSeries::new(key, instrument.lock().value(seconds)));
        }
        series.sort_by(|a, b| a.order().cmp(&b.order()));
        Dashboard {
            window_s: WINDOW.as_secs(),
            series,
        }
    }

    /// The instrument of `key` in `instruments`, made (with the windows already closed) if it is
    /// new.
    fn instrument<T: Default + Closing>(
        &self,
        instruments: &RefCell<HashMap<Key, Arc<Instrument<T>>>>,
        key: &Key,
    ) -> Arc<Instrument<T>> {
        if let Some(instrument) = instruments.borrow().get(key) {
            return Arc::clone(instrument);
        }
        let mut state = T::default();
        for _ in 0..self.windows.get() {
            state.close();
        }
        let instrument = Arc::new(Instrument(Mutex::new(state)));
        instruments
            .borrow_mut()
            .insert(key.clone(), Arc::clone(&instrument));
        instrument
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>) {
        if let Some(unit) = unit {
            self.units
                .borrow_mut()
                .insert(key.as_str().to_owned(), unit);
        }
    }
}

impl Default for Collector {
    fn default() -> Collector {
        Collector::new()
    }
}

impl Recorder for Collector {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.instrument(&self.counters, key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.instrument(&self.gauges, key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.instrument(&self.histograms, key))
    }
}

pin_project! {
    /// A future polled with a [`Collector`] as the thread's recorder: what it emits (the engine
    /// running in it) is collected, and nothing else is.
    pub(crate) struct Recorded<F> {
        #[pin]
        future: F,
        collector: Rc<Collector>,
    }
}

impl<F> Recorded<F> {
    /// `future`, recorded by `collector`.
    pub fn new(future: F, collector: Rc<Collector>) -> Recorded<F> {
        Recorded { future, collector }
    }
}

impl<F: Future> Future for Recorded<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let collector: &Collector = this.collector;
        metrics::with_local_recorder(collector, || this.future.poll(cx))
    }
}

/// One series' state, behind the lock a `metrics` handle needs (`Send + Sync`); the run is on
/// one thread, so it is never contended.
struct Instrument<T>(Mutex<T>);

impl<T> Instrument<T> {
    fn lock(&self) -> MutexGuard<'_, T> {
        // A poisoned lock still holds what was recorded.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a series' state does when a window closes.
trait Closing {
    fn close(&mut self);
}

#[derive(Default)]
struct CounterState {
    total: u64,
    /// The total when each window closed.
    closed: Vec<u64>,
}

impl Closing for CounterState {
    fn close(&mut self) {
        self.closed.push(self.total);
    }
}

impl CounterState {
    fn value(&self) -> Value {
        Value::Counter {
            total: self.total,
            per_window: increases(&self.closed, self.total),
        }
    }
}

impl CounterFn for Instrument<CounterState> {
    fn increment(&self, value: u64) {
        let mut state = self.lock();
        state.total = state.total.saturating_add(value);
    }

    fn absolute(&self, value: u64) {
        let mut state = self.lock();
        state.total = state.total.max(value);
    }
}

#[derive(Default)]
struct GaugeState {
    /// The value it was last set to; `None` before the first.
    last: Option<f64>,
    /// The highest value it was set to.
    max: Option<f64>,
    /// The highest value it held in the current window.
    window_max: Option<f64>,
    /// The highest value it held in each closed window.
    closed: Vec<Option<f64>>,
}

impl Closing for GaugeState {
    fn close(&mut self) {
        self.closed.push(self.window_max);
        // It holds its value into the next window.
        self.window_max = self.last;
    }
}

impl GaugeState {
    fn set(&mut self, value: f64) {
        let higher = |max: Option<f64>| Some(max.map_or(value, |max| max.max(value)));
        self.last = Some(value);
        self.max = higher(self.max);
        self.window_max = higher(self.window_max);
    }

    fn value(&self) -> Value {
        let mut per_window = self.closed.clone();
        per_window.push(self.window_max);
        Value::Gauge {
            last: self.last.unwrap_or(0.0),
            max: self.max.unwrap_or(0.0),
            per_window,
        }
    }
}

impl GaugeFn for Instrument<GaugeState> {
    fn increment(&self, value: f64) {
        let mut state = self.lock();
        let now = state.last.unwrap_or(0.0) + value;
        state.set(now);
    }

    fn decrement(&self, value: f64) {
        let mut state = self.lock();
        let now = state.last.unwrap_or(0.0) - value;
        state.set(now);
    }

    fn set(&self, value: f64) {
        self.lock().set(value);
    }
}

#[derive(Default)]
struct HistogramState {
    values: Vec<f64>,
    /// How many values it held when each window closed.
    closed: Vec<u64>,
}

impl Closing for HistogramState {
    fn close(&mut self) {
        self.closed.push(self.values.len() as u64);
    }
}

impl HistogramState {
    fn value(&self, seconds: bool) -> Value {
        let mut sorted = self.values.clone();
        sorted.sort_unstable_by(f64::total_cmp);
        let count = sorted.len() as u64;
        Value::Histogram {
            unit: if seconds { "s" } else { "1" },
            count,
            p50: percentile(&sorted, 50.0).unwrap_or(0.0),
            p99: percentile(&sorted, 99.0).unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
            per_window: increases(&self.closed, count),
        }
    }
}

impl HistogramFn for Instrument<HistogramState> {
    fn record(&self, value: f64) {
        self.lock().values.push(value);
    }
}

/// Each window's increase, from the running figure at each window's close and at the end.
fn increases(closed: &[u64], end: u64) -> Vec<u64> {
    let mut before = 0;
    closed
        .iter()
        .chain([&end])
        .map(|&at| {
            let increase = at.saturating_sub(before);
            before = at;
            increase
        })
        .collect()
}

/// The engine's metrics of one run, as a dashboard would show them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dashboard {
    /// Seconds of simulated time per window of the `per_window` figures ([`WINDOW`]).
    pub window_s: u64,
    /// One per name and label set, in the order of the engine's table, then by labels.
    pub series: Vec<MetricSeries>,
}

impl Dashboard {
    /// The series named `name` whose labels include every one of `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&MetricSeries> {
        self.series
            .iter()
            .filter(|series| {
                series.name == name
                    && labels.iter().all(|(key, value)| {
                        series.labels.iter().any(|(k, v)| k == key && v == value)
                    })
            })
            .collect()
    }
}

/// One series: a name and its labels, and its figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricSeries {
    /// The metric's name (`stormguard.retries`).
    pub name: String,
    /// Its labels, in the order the engine gives them.
    #[serde(serialize_with = "as_map")]
    pub labels: Vec<(String, String)>,
    /// Its figures, by type.
    #[serde(flatten)]
    pub value: Value,
}

impl MetricSeries {
    fn new(key: &Key, value: Value) -> MetricSeries {
        MetricSeries {
            name: key.name().to_owned(),
            labels: key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect(),
            value,
        }
    }

    /// Where the series is listed: by its name's place in [`ORDER`], then its name and labels.
    fn order(&self) -> (usize, &str, &[(String, String)]) {
        let rank = ORDER.iter().position(|name| *name == self.name);
        (rank.unwrap_or(ORDER.len()), &self.name, &self.labels)
    }

    /// The series as an exporter would name it, dots kept:
    /// `stormguard.retries{gen_ai.provider.name="primary",reason="overloaded"}`.
    pub fn id(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(key, value)| format!("{key}=\"{value}\""))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }
}

fn as_map<S: Serializer>(labels: &[(String, String)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(labels.iter().map(|(k, v)| (k, v)))
}

/// A series' figures, by type.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Value {
    /// A counter: its total, and its increase per window.
    Counter {
        /// The total at the end of the run.
        total: u64,
        /// The increase in each window.
        per_window: Vec<u64>,
    },
    /// A gauge: the value it was last set to and the highest, and its highest per window
    /// (`None` before it was first set).
    Gauge {
        /// The value it was last set to.
        last: f64,
        /// The highest value it was set to.
        max: f64,
        /// The highest value it held in each window.
        per_window: Vec<Option<f64>>,
    },
    /// A histogram: how many values, their median, 99th percentile (nearest rank) and maximum
    /// in the metric's unit, and how many per window.
    Histogram {
        /// `s` for seconds, `1` for a count.
        unit: &'static str,
        /// Values recorded.
        count: u64,
        /// Their median.
        p50: f64,
        /// Their 99th percentile.
        p99: f64,
        /// Their maximum.
        max: f64,
        /// Values recorded in each window.
        per_window: Vec<u64>,
    },
}

impl Value {
    /// The type's name: `counter`, `gauge`, `histogram`.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Counter { .. } => "counter",
            Value::Gauge { .. } => "gauge",
            Value::Histogram { .. } => "histogram",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn collect(collector: &Collector, emit: impl FnOnce()) {
        metrics::with_local_recorder(collector, emit);
    }

    #[test]
    fn counters_gauges_and_histograms_give_their_figures_in_total_and_per_window() {
        let collector = Collector::new();
        collect(&collector, || {
            metrics::counter!(names::RETRIES, names::PROVIDER => "primary", "reason" => "overloaded")
                .increment(3);
            metrics::gauge!(names::THROTTLE_DROP_PROBABILITY, names::PROVIDER => "primary")
                .set(0.5);
            metrics::gauge!(names::THROTTLE_DROP_PROBABILITY, names::PROVIDER => "primary")
                .set(0.25);
            for seconds in [0.1, 0.2, 0.3, 4.0] {
                metrics::histogram!(names::REQUEST_DURATION, names::PROVIDER => "primary")
                    .record(seconds);
            }
        });
        collector.close_window();
        collector.close_window();
        collect(&collector, || {
            metrics::counter!(names::RETRIES, names::PROVIDER => "primary", "reason" => "overloaded")
                .increment(2);
            // A series first seen in the third window.
            metrics::counter!(names::REFUSALS, names::PROVIDER => "primary", "cause" => "budget")
                .increment(1);
            metrics::histogram!(names::REQUEST_ATTEMPTS, names::PROVIDER => "primary").record(2.0);
        });
        let dashboard = collector.dashboard();
        let listed: Vec<&str> = dashboard.series.iter().map(|s| s.name.as_str()).collect();
        // The engine's table order.
        assert_eq!(
            listed,
            [
                names::REQUEST_ATTEMPTS,
                names::REQUEST_DURATION,
                names::RETRIES,
                names::REFUSALS,
                names::THROTTLE_DROP_PROBABILITY
            ]
        );
        let value = |name: &str| &dashboard.find(name, &[])[0].value;
        assert_eq!(
            value(names::RETRIES),
            &Value::Counter {
                total: 5,
                per_window: vec![3, 0, 2]
            }
        );
        assert_eq!(
            value(names::REFUSALS),
            &Value::Counter {
                total: 1,
                per_window: vec![0, 0, 1]
            }
        );
        assert_eq!(
            value(names::THROTTLE_DROP_PROBABILITY),
            &Value::Gauge {
                last: 0.25,
                max: 0.5,
                // It holds its last value through the windows that do not set it.
                per_window: vec![Some(0.5), Some(0.25), Some(0.25)]
            }
        );
        assert_eq!(
            value(names::REQUEST_DURATION),
            &Value::Histogram {
                unit: "s",
                count: 4,
                p50: 0.2,
                p99: 4.0,
                max: 4.0,
                per_window: vec![4, 0, 0]
            }
        );
        let attempts = dashboard.find(names::REQUEST_ATTEMPTS, &[(names::PROVIDER, "primary")])[0];
        assert!(matches!(attempts.value, Value::Histogram { unit: "1", .. }));
        assert_eq!(
            dashboard.series[2].id(),
            r#"stormguard.retries{gen_ai.provider.name="primary",reason="overloaded"}"#
        );
    }

    #[test]
    fn only_what_a_recorded_future_emits_is_collected() {
        let collector = Rc::new(Collector::new());
        let emit = || async {
            metrics::counter!(names::RETRIES).increment(1);
            tokio::task::yield_now().await;
            metrics::counter!(names::RETRIES).increment(1);
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let recorded = tokio::task::LocalSet::new();
            recorded.spawn_local(Recorded::new(emit(), collector.clone()));
            recorded.spawn_local(emit());
            recorded.await;
        });
        let dashboard = collector.dashboard();
        assert_eq!(dashboard.series.len(), 1);
        assert_eq!(
            dashboard.series[0].value,
            Value::Counter {
                total: 2,
                per_window: vec![2]
            }
        );
    }

    #[test]
    fn the_json_names_the_type_and_the_labels() {
        let series = MetricSeries {
            name: names::REFUSALS.to_owned(),
            labels: vec![
                (names::PROVIDER.to_owned(), "primary".to_owned()),
                ("cause".to_owned(), "throttle".to_owned()),
            ],
            value: Value::Counter {
                total: 7,
                per_window: vec![7],
            },
        };
        assert_eq!(
            serde_json::to_value(&series).unwrap(),
            serde_json::json!({
                "name": "stormguard.refusals",
                "labels": {"gen_ai.provider.name": "primary", "cause": "throttle"},
                "type": "counter",
                "total": 7,
                "per_window": [7]
            })
        );
    }
}
