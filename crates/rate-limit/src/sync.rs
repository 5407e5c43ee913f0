//! The atomics and locks a limit is built on: std's, or loom's models of them when built with
//! `--cfg stormguard_loom` (tests/loom.rs explores every interleaving of a few threads on them).
//! The sliding window that counts the rate sent comes from `stormguard-classify`, which switches
//! to loom under the same flag. A fleet's state (feature `redis`) stays on std's: it is no part
//! of the model.

#[cfg(stormguard_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(stormguard_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
