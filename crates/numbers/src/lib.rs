//! The numbers stormguard's layers share, each written once: where randomised parts draw theirs,
//! how numbers are read from the network, and how events are counted over time.
//!
//! - [`random`]: [`RandomSource`](random::RandomSource), where every randomised part (backoff
//!   jitter, start spreading, the adaptive throttle's drops, fault injection, balancing) draws its
//!   numbers, and the one way to seed it so that a run can be replayed;
//! - [`decimal`]: [`parse_decimal`](decimal::parse_decimal), the one parser of decimal numbers
//!   from the network (attempt counts, timeouts, hints), which never panics or overflows;
//! - [`window`]: [`SlidingWindow`](window::SlidingWindow), the lock-free sliding window of
//!   counters in time slices that the retry budget, the adaptive throttle, the breaker and the
//!   rate limit count in (its races are model-checked with loom, `tests/loom.rs`).
//!
//! ```
//! use std::time::Duration;
//! use stormguard_numbers::decimal::parse_decimal;
//! use stormguard_numbers::random::RandomSource;
//! use stormguard_numbers::window::SlidingWindow;
//!
//! assert_eq!(parse_decimal(b"1500"), Ok(1500));
//!
//! // A seeded source hands out the same generators on every run.
//! let source = RandomSource::seeded(7);
//! let _rng = source.rng();
//!
//! let window: SlidingWindow<1> = SlidingWindow::new(Duration::from_secs(10), 10);
//! let now = window.epoch_now();
//! window.add(now, 0);
//! assert_eq!(window.sum(now, 0), 1);
//! ```

pub mod decimal;
pub mod random;
mod sync;
pub mod window;
