//! The properties stormguard's fuzz targets check, one function per target.
//!
//! Every parser of hostile network input has a `cargo fuzz` target in `fuzz/` (a workspace of its
//! own, built only where cargo-fuzz is installed). Each target's body is a plain function here,
//! `<target>::check(data)`, which panics when a property does not hold for `data`. The fuzz
//! target calls it on every input libFuzzer makes, and this crate's test `tests/corpus.rs` calls
//! it on every committed input of `fuzz/corpus/<target>/`, so that `cargo test` replays the
//! corpora on any machine, with no fuzzer installed.
//!
//! What each target feeds and asserts is in its module's documentation; [`input`] is the layout
//! they share, turning raw bytes into header maps, bodies and streams.
//!
//! ```
//! // The empty input and a short one are inputs like any other.
//! stormguard_fuzz_checks::retry_after::check(b"");
//! stormguard_fuzz_checks::sse::check(b"\x03data: x\n\n");
//! ```

pub mod attempt_count;
pub mod grpc_timeout;
pub mod input;
pub mod llm_body;
pub mod llm_deadline;
pub mod rate_limit;
pub mod retry_after;
pub mod service_config;
pub mod splice;
pub mod sse;

/// A target's check of one input: returns when every property holds, panics otherwise.
pub type Check = fn(&[u8]);

/// The name of every target, as `cargo fuzz list` prints them and as their corpus directories
/// under `fuzz/corpus/` are named, with the function that checks one input.
pub const TARGETS: [(&str, Check); 9] = [
    ("attempt_count", attempt_count::check),
    ("grpc_timeout", grpc_timeout::check),
    ("llm_body", llm_body::check),
    ("llm_deadline", llm_deadline::check),
    ("rate_limit", rate_limit::check),
    ("retry_after", retry_after::check),
    ("service_config", service_config::check),
    ("splice", splice::check),
    ("sse", sse::check),
];
