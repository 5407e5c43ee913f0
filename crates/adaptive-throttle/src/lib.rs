//! `stormguard-adaptive-throttle`: work in progress.
