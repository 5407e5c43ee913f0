//! The atomic behind the retry budget's `latest` epoch: std's, or loom's model of it when built
//! with `--cfg stormguard_loom` (tests/loom.rs explores every interleaving of a few threads on it).
//! The sliding window's own atomics come from `stormguard-classify`, which switches to loom under
//! the same flag.

#[cfg(stormguard_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
