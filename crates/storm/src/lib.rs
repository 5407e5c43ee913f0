//! `stormguard-storm
storm`: work in progress.
