//! `stormguard-storm`: the retry-storm simulator.
//!
//! # The problem it shows
//! A provider's error rate goes 0.01% -> 5% and its latency 800 ms -> 2500 ms at 12,000 requests/s.
//! Clients that time out each attempt and retry every failure 3 times, 1 s apart, turn that into
//! four times the load; the provider falls over and stays down while the load stays above its
//! capacity (a metastable failure). This crate replays that incident, a total outage, a
//! quota-limited provider, a black hole (a provider that accepts connections and answers nothing
//! for 10 s, while clients that retry on timeouts pile up connections), bursts above a quota of
//! requests and tokens a minute (LLM-sized requests, 429s beyond the quota), a failover between two
//! providers (the primary down for 15 s, first with 503s, then as a black hole; a smaller secondary
//! healthy throughout), streamed answers (`text/event-stream`) that fail with an error event before
//! their first token or are cut mid-stream, and a provider that keeps some attempts without a
//! response head for 20 s behind a failover (streams under a 30 s deadline, against stormguard's
//! per-attempt clocks), and a tail of slow first tokens at the field's load (1.5% of the attempts
//! ten times slower to their first token than the half second of the others, and an outage: what
//! hedging is for), three deployments of one model with quotas of their own shared by a balancer
//! (and by a fleet of three replicas, one deployment dying), against the *real* layers, side by side with what people use today, on
//! virtual time: a 60 s scenario at the field's 12,000 requests/s runs in seconds (in a few
//! minutes where each of those requests is a stream).
//!
//! # How
//! - [`backend`]: the provider, a tower `Service<http::Request<_>>` answering
//!   `http::Response` with 200 / 500 / 503 / 529 / 429 + `Retry-After`, modelled as
//!   a fixed number of GPU slots with a queue, log-normal service times and work that cannot be
//!   cancelled, and, in the burst scenario, a quota of requests and tokens a minute enforced per
//!   second and stated in OpenAI's `x-ratelimit-*` headers (the model and its calibration are
//!   documented there and in [`scenario`]); in the streams and silent scenarios it streams its
//!   successes (`event_stream`: OpenAI's chunks, paced on the virtual clock, a continuation
//!   answered from where its prefill ends), which callers read to the end; in the tail scenario
//!   its streams start after a log-normal wait, a share of the attempts ten times later, and it
//!   counts the hedges (attempts sent while another of the same request is still open).
//! - [`pipeline`]: the clients, each described once in its registry (name, `--help` text, what
//!   it needs of the providers) and built by [`sim`]: no retries; naive fixed-interval retries;
//!   a naive failover that switches provider on every failure; tower's `retry` with
//!   `ExponentialBackoff` and `TpsBudget`; `stormguard::ClientLayer::default()` with its stream
//!   continuation off and on, and with a circuit breaker and a local fallback, or with a rate
//!   limit (configured with the provider's quota, or learning it); stormguard's `Failover` over
//!   two providers, with and without its per-attempt clocks;
//!   hedging: a naive hedge that sends every request twice ([`naive_hedge`]), tower's `hedge`, and
//!   `ClientLayer::default()` with `with_hedging(Hedging::default())`. Where the provider streams,
//!   the `naive` row's callers also restart a stream that failed, as applications do.
//! - [`scenarios`]: the built-in scenarios, one file each (load, providers, fault, durations,
//!   default rows, headline figure and explanation), in one registry.
//! - `router`: the network to two providers: each request goes to the one its URI names.
//! - [`sim`]: Poisson arrivals (steady, or in bursts) through one pipeline on a paused-clock,
//!   current-thread tokio runtime; seeded, so a seed always gives the same numbers.
//! - [`metrics`], [`output`]: the figures (among them the attempts the clients hold open, how
//!   fast traffic to a dead provider is cut, the fallback's answers, which are no successes, the
//!   429s, and the time to first token the callers saw); the table, the SVG chart, the document
//!   of every scenario, and ([`output::dashboard`]) what a dashboard would show of a stormguard
//!   pipeline's run, from the metrics its engine emits (`stormguard::metrics`), collected per run
//!   ([`run_with_metrics`]).
//!
//! # What is compared, and how fairly
//! Every pipeline meets the same arrivals (same seed) and the same provider. Today's pipelines
//! (`none`, `naive`, `tower` and the others of [`pipeline`] that are not stormguard's) time out
//! each attempt after 4 s, about the healthy provider's p99.9, as clients commonly are tuned;
//! stormguard's `ClientLayer::default()` has no fixed per-attempt timeout: one deadline (600 s by
//! default) spans all attempts, and its per-attempt clocks, learned from the backend's answers,
//! never cut a whole answer before what its request's size needs (17 s for the small chat
//! completion). In the `seed` scenario that difference is the trigger: at a 2500 ms median, 17% of
//! attempts outlive a 4 s timeout, are retried, and their abandoned work still holds the provider's
//! slots. `--attempt-timeout` changes the 4 s; with a generous one (30 s) naive retries do not
//! storm on this scenario, because 5% errors alone stay inside the provider's headroom.
//!
//! # Adding a scenario
//! One file and its entry in the registry: write `src/scenarios/<name>.rs` holding a
//! `pub const SCENARIO: Builtin` (its name, `--help` text, default pipelines, the [`Scenario`]
//! built from [`Scenario::healthy`], its headline figure and its section of the document), and
//! in `src/scenarios/mod.rs` declare it (`mod name;`) and list it in `registry!` (`NAME: name`).
//! `--scenario NAME`, `--help`, `--scenario all` and `docs/STORM.md` (`storm --scenario all
//! --markdown docs/STORM.md --out docs/storm`, checked by `.ci/storm-docs`) pick it up from
//! there.
//!
//! [`Scenario`]: scenario::Scenario
//! [`Scenario::healthy`]: scenario::Scenario::healthy
//!
//! # Example
//! ```
//! use std::time::Duration;
//! use stormguard_storm::pipeline::Pipeline;
//! use stormguard_storm::scenario::Scenario;
//! use stormguard_storm::scenarios;
//!
//! // The field's incident, scaled down 100x in load and capacity, 6 s long.
//! let scenario = scenarios::SEED.scenario()
//!     .with_qps(120.0)
//!     .with_duration(Duration::from_secs(6));
//! let runs = stormguard_storm::run(&scenario, &[Pipeline::None], || {}).unwrap();
//! assert_eq!(runs[0].summary.name, "none");
//! assert_eq!(runs[0].summary.amplification, 1.0);
//! ```

// Not published: its docs describe the simulator's parts to those who change them, read with
// `cargo doc --document-private-items`, where links to crate-private items resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod backend;
mod event_stream;
mod json_body;
pub mod metrics;
pub mod naive_hedge;
pub mod output;
pub mod pipeline;
mod round_robin;
mod router;
pub mod scenario;
pub mod scenarios;
pub mod sim;

use tower::BoxError;

use crate::pipeline::Pipeline;
use crate::scenario::Scenario;
use crate::sim::Run;

/// Run each pipeline through `scenario`, each on its own thread and runtime (so each one's
/// numbers depend only on the scenario and its seed), returning the runs in the given order.
///
/// `on_second` is called after each second of virtual time of each pipeline.
pub fn run(
    scenario: &Scenario,
    pipelines: &[Pipeline],
    on_second: impl Fn() + Clone + Send + 'static,
) -> Result<Vec<Run>, BoxError> {
    run_each(scenario, pipelines, sim::simulate, on_second)
}

/// [`run`], and collect the metrics stormguard's engine emits in each pipeline made of its
/// layers ([`Run::metrics`], see [`output::dashboard`]). Each run records into a recorder of its
/// own, on its own thread; the figures are those [`run`] gives.
pub fn run_with_metrics(
    scenario: &Scenario,
    pipelines: &[Pipeline],
    on_second: impl Fn() + Clone + Send + 'static,
) -> Result<Vec<Run>, BoxError> {
    run_each(scenario, pipelines, sim::simulate_with_metrics, on_second)
}

/// Run each pipeline through `scenario` with `simulate`, each on its own thread.
fn run_each<F>(
    scenario: &Scenario,
    pipelines: &[Pipeline],
    simulate: fn(&Scenario, Pipeline, F) -> Result<Run, BoxError>,
    on_second: F,
) -> Result<Vec<Run>, BoxError>
where
    F: Fn() + Clone + Send + 'static,
{
    std::thread::scope(|scope| {
        let handles: Vec<_> = pipelines
            .iter()
            .map(|pipeline| {
                let on_second = on_second.clone();
                scope.spawn(move || simulate(scenario, *pipeline, on_second))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle.join() {
                Ok(result) => result,
                Err(_) => Err(BoxError::from("a simulation thread panicked")),
            })
            .collect()
    })
}
