//! `stormguard-jitter`: work in progress.
