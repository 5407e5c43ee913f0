//! The built-in scenarios, one file each, and their registry.
//!
//! A file holds one [`Builtin`]: the scenario's name, what `--help` says of it, the pipelines it
//! compares by default, the scenario itself (load, providers, fault, durations: a [`Scenario`]
//! built from [`Scenario::healthy`]), the figure `--scenario all` names for it, and its section of
//! the simulator's document (`storm --scenario all --markdown docs/STORM.md`).
//!
//! # Adding a scenario
//! Write `src/scenarios/<name>.rs` with a `pub const SCENARIO: Builtin` (copy the closest one),
//! declare it below (`mod name;`, a plain declaration so that `cargo fmt` formats the file) and
//! give it its place in `registry!`: `NAME: name`. `--scenario NAME`, `--help`,
//! `--scenario all`, the overview and the document pick it up from there. A fault or a provider
//! the simulator cannot model yet is new code in [`crate::backend`], not part of the scenario.
//!
//! [`Scenario`]: crate::scenario::Scenario
//! [`Scenario::healthy`]: crate::scenario::Scenario::healthy

use std::fmt;

use crate::metrics::Summary;
use crate::pipeline::Pipeline;
use crate::scenario::Scenario;

mod balance;
mod balance_fleet;
mod blackhole;
mod burst;
mod capacity;
mod failover;
mod outage;
mod quota;
mod seed;
mod silent;
mod streams;
mod tail;

/// Declares each scenario's constant, and [`ALL`] in the order given.
macro_rules! registry {
    ($($constant:ident: $module:ident),* $(,)?) => {
        $(
            #[doc = concat!("The `", stringify!($module), "` scenario.")]
            pub const $constant: &Builtin = &$module::SCENARIO;
        )*
        /// Every built-in scenario, in the order `--help` lists them and `--scenario all` runs
        /// them.
        pub const ALL: [&Builtin; [$(stringify!($module)),*].len()] = [$($constant),*];
    };
}

registry! {
    SEED: seed,
    OUTAGE: outage,
    QUOTA: quota,
    BLACKHOLE: blackhole,
    BURST: burst,
    FAILOVER: failover,
    STREAMS: streams,
    SILENT: silent,
    TAIL: tail,
    BALANCE: balance,
    BALANCE_FLEET: balance_fleet,
    CAPACITY: capacity,
}

/// The scenario `storm` runs without `--scenario`, whose table the README shows.
pub const DEFAULT: &Builtin = SEED;

/// The built-in scenario named `name` (as on the command line).
pub fn named(name: &str) -> Result<&'static Builtin, UnknownScenario> {
    ALL.into_iter()
        .find(|builtin| builtin.name == name)
        .ok_or_else(|| UnknownScenario(name.to_owned()))
}

/// The headline of the scenarios about recovery (seed, outage): how long after the fault the
/// provider is back to serving the offered load.
fn recovery(scenario: &crate::scenario::Scenario, summary: &crate::metrics::Summary) -> String {
    match summary.recovery_s {
        Some(r) => format!("recovery {r:.0} s"),
        None if scenario.fault.end >= scenario.duration => "recovery -".to_owned(),
        None => "recovery never".to_owned(),
    }
}

/// A built-in scenario: what `--scenario NAME` runs, with everything said of it. Each is one file
/// of this module, listed once in its registry.
pub struct Builtin {
    /// The name on the command line, in the chart's file name and in the JSON.
    pub name: &'static str,
    /// What it replays, for `--help` (lines of at most 90 characters).
    pub help: &'static str,
    /// The pipelines it compares unless `--pipelines` says otherwise, in order.
    pub pipelines: &'static [Pipeline],
    /// The scenario at its defaults.
    pub build: fn() -> Scenario,
    /// The figure it is about, named, for the overview of `--scenario all`.
    pub headline: fn(&Scenario, &Summary) -> String,
    /// Its section of the simulator's document (`--markdown`).
    pub doc: Doc,
}

/// A scenario's section of the simulator's document: prose around the table the run prints.
pub struct Doc {
    /// Before the table: the incident and the rows. Markdown.
    pub before: &'static str,
    /// After the table: what the figures say. Markdown, where `{chart}` stands for the chart's
    /// path and `{metrics}` for the engine's metrics of the [`Doc::metrics_of`] row.
    pub after: &'static str,
    /// The row whose engine's metrics (`--metrics`) the section shows, if any.
    pub metrics_of: Option<&'static str>,
}

impl Builtin {
    /// The scenario at its defaults.
    pub fn scenario(&self) -> Scenario {
        (self.build)()
    }
}

impl fmt::Display for Builtin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl fmt::Debug for Builtin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Two built-in scenarios are the same when they have the same name.
impl PartialEq for Builtin {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// Error for an unknown scenario name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownScenario(pub String);

impl fmt::Display for UnknownScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = ALL.iter().map(|b| b.name).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        write!(
            f,
            "unknown scenario `{}` (expected {} or {last})",
            self.0,
            rest.join(", ")
        )
    }
}

impl std::error::Error for UnknownScenario {}

/// The built-in scenario `scenario` derives from (every scenario is made from one, by
/// [`Builtin::scenario`]; a name no built-in has, which only a hand-made `Scenario` could carry,
/// is taken as the [`DEFAULT`]).
pub fn of(scenario: &Scenario) -> &'static Builtin {
    named(scenario.name).unwrap_or(DEFAULT)
}
