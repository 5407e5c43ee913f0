//! Shared pieces of the benchmarks.
