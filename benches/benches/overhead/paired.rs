//! Measurements made after criterion's, for ratios that must see one machine: the scaling ratio
//! from back-to-back pairs of one- and two-thread runs, and the one-thread overheads from
//! interleaved rounds.

use std::fmt;
use std::time::Duration;

use http::Response;
use stormguard_benches::drive::in_parallel;
use stormguard_benches::requests::Req;
use stormguard_benches::variants::Visit;
use tower::Service;

/// Pairs of back-to-back runs (one thread, then two) per variant for the scaling ratio.
pub(crate) const SCALING_PAIRS: usize = 15;

/// About how long the one-thread run of a pair lasts.
const SCALING_RUN: Duration = Duration::from_millis(30);

/// The scaling ratio measured in pairs: a one-thread run and a two-thread run of the same
/// per-thread count, back to back, so that both see the same machine (on a shared machine the
/// load drifts between criterion's separate one- and two-thread benchmarks). Each pair gives
/// `2 x t(1 thread) / t(2 threads)`; the report shows their median and range.
#[derive(Default)]
pub(crate) struct Scaling {
    pub(crate) ratios: Vec<(&'static str, Vec<f64>)>,
}

impl Visit for Scaling {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        const PROBE: u64 = 2_000;
        let probe = in_parallel(&service, 1, PROBE).as_secs_f64().max(1e-9);
        let iters = (PROBE as f64 * SCALING_RUN.as_secs_f64() / probe).max(1_000.0) as u64;
        let mut ratios: Vec<f64> = (0..SCALING_PAIRS)
            .map(|_| {
                let one = in_parallel(&service, 1, iters).as_secs_f64();
                let two = in_parallel(&service, 2, iters).as_secs_f64();
                2.0 * one / two
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        self.ratios.push((name, ratios));
    }
}

/// Whether the command line's filter (if any) selects `group`.
pub(crate) fn selected(group: &str) -> bool {
    let mut free = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .peekable();
    free.peek().is_none() || free.any(|filter| group.contains(&filter))
}

/// Rounds of interleaved one-thread runs, for the overhead ratios of targets 1 and 2.
pub(crate) const ROUNDS: usize = 15;

/// About how long each variant runs in a round.
const ROUND_RUN: Duration = Duration::from_millis(20);

/// The one-thread overheads measured in rounds: every variant runs for about [`ROUND_RUN`] in each
/// round (in an order that rotates from round to round), and each round gives every ratio from its
/// own runs. Criterion measures the variants seconds apart, and this machine's speed drifts by
/// more than the differences between some of them; a ratio taken within a round sees one machine.
#[derive(Default)]
pub(crate) struct Rounds {
    runners: Vec<(&'static str, Runner)>,
}

/// Sends `n` requests through one variant on a thread of its own; returns the time taken.
type Runner = Box<dyn FnMut(u64) -> Duration>;

impl Visit for Rounds {
    fn variant<S, B>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
        S::Error: fmt::Debug,
    {
        self.runners
            .push((name, Box::new(move |n| in_parallel(&service, 1, n))));
    }
}

impl Rounds {
    /// Nanoseconds per request, per variant, per round.
    pub(crate) fn run(mut self) -> Vec<(&'static str, Vec<f64>)> {
        const PROBE: u64 = 2_000;
        let counts: Vec<u64> = self
            .runners
            .iter_mut()
            .map(|(_, run)| {
                let probe = run(PROBE).as_secs_f64().max(1e-9);
                (PROBE as f64 * ROUND_RUN.as_secs_f64() / probe).max(1_000.0) as u64
            })
            .collect();
        let variants = self.runners.len();
        let mut times = vec![Vec::with_capacity(ROUNDS); variants];
        for round in 0..ROUNDS {
            for k in 0..variants {
                let i = (k + round) % variants;
                let elapsed = (self.runners[i].1)(counts[i]);
                times[i].push(elapsed.as_nanos() as f64 / counts[i] as f64);
            }
        }
        self.runners
            .iter()
            .map(|(name, _)| *name)
            .zip(times)
            .collect()
    }
}
