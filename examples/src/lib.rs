//! Runnable examples of stormguard, and the mock LLM server they run against.
//!
//! Binaries (each runs on loopback with ephemeral ports, prints a summary and exits):
//! - `mock_llm`: the fault-injecting mock LLM server of [`mock`] (OpenAI's chat completions and
//!   Anthropic's messages, plain and streamed answers), hit by a plain client;
//! - `reqwest_client`: a reqwest-middleware client with `StormguardMiddleware` against the mock;
//! - `axum_gateway`: the axum gateway of [`gateway`], with `ServerLayer` on its routes and
//!   `ClientLayer` on its upstream client, serving `/metrics` and `/healthz` (`--stream`: relaying
//!   streamed answers, continued after a cut; `--stream --listen ADDR`: serving callers in other
//!   processes, such as a Python SDK);
//! - `tonic_client`: a tonic health client with `ClientLayer` against a flaky tonic server;
//! - `fleet_admit`: one replica of a fleet sharing a rate limit through Redis ([`fleet`]).
//!
//! ```text
//! cargo run -p stormguard-examples --bin mock_llm
//! ```

pub mod fleet;
pub mod gateway;
pub mod load;
pub mod mock;

/// Whether a reqwest client's own stormguard engine dropped its request locally: stormguard's
/// outcomes come back as `reqwest_middleware::Error::Middleware` holding a `stormguard::Error`.
pub fn throttled(error: &reqwest_middleware::Error) -> bool {
    match error {
        reqwest_middleware::Error::Middleware(error) => error
            .downcast_ref::<stormguard::Error>()
            .is_some_and(|error| error.reason() == stormguard::classify::Reason::Throttled),
        reqwest_middleware::Error::Reqwest(_) => false,
    }
}
