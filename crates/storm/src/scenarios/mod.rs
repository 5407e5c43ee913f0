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

use crate::scenario::{Builtin, UnknownScenario};

mod balance;
mod balance_fleet;
mod blackhole;
mod burst;
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
