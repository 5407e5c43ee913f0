//! `stormguard-retry`: work in progress.
