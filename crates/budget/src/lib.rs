//! `stormguard-budget`: work in progress.
