//! The atomics and the lock a breaker is built on: std's, or loom's models of them when built
//! with `--cfg stormguard_loom` (tests/loom.rs explores every interleaving of a few threads on
//! them). The lock must be loom's too: the state machine behind it writes atomics, and loom may
//! switch threads at any of them. The sliding window's own atomics come from
//! `stormguard-classify`, which switches to loom under the same flag; the stall's wake-ups
//! (tokio's `Notify`) stay tokio's.

#[cfg(stormguard_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(stormguard_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(stormguard_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
