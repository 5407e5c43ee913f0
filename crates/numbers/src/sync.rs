//! The atomics the sliding window is built on: std's, or loom's models of them when built with
//! `--cfg stormguard_loom` (tests/loom.rs explores every interleaving of a few threads on them).

#[cfg(stormguard_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
