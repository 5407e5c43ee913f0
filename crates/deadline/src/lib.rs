//! `stormguard-deadline`: work in progress.
