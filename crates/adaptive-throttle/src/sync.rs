//! The atomics behind the throttle's recovery run: std's, or loom's models of them when built
//! with `--cfg stormguard_loom` (tests/loom.rs explores every interleaving of a few threads on
//! them). The sliding window's own atomics come from `stormguard-classify`, which switches to
//! loom under the same flag.

#[cfg(stormguard_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
