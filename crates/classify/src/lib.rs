//! `stormguard-classify`: work in progress.
