//! `stormguard`: work in progress.
