//! The `service_config` target: what it feeds and asserts is documented on
//! `stormguard_fuzz_checks::service_config`, whose `check` is also run on this target's committed
//! corpus by `cargo test` (crates/fuzz-checks/tests/corpus.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stormguard_fuzz_checks::service_config::check(data));
