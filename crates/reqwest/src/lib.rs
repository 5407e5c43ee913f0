//! `stormguard-reqwest`: work in progress.
