//! gRPC service config (gRFC A6, "gRPC Retry Design"): the retry, hedging, timeout and
//! throttling settings every other gRPC language reads from a JSON service config, parsed
//! ([`ServiceConfig`]) and applied through the one engine ([`ServiceConfigLayer`]).
//!
//! A service config names methods (`/package.Service/Method`), whole services, or every call,
//! and gives each a `retryPolicy` or a `hedgingPolicy`, a `timeout` and `waitForReady`; its
//! `retryThrottling` is a token bucket for the whole channel. [`ServiceConfig::from_json`]
//! validates it as gRFC A6 says and names the field of the first fault
//! (`methodConfig[0].retryPolicy.maxAttempts: must be at least 2`); [`ServiceConfigLayer`] sends
//! each call through the engine with its method's settings. See the guide's "gRPC service
//! config" section (`docs/GUIDE.md`) for a whole client.
//!
//! ```
//! use stormguard_retry::grpc::{ServiceConfig, ServiceConfigLayer};
//!
//! let config = ServiceConfig::from_json(r#"{
//!   "methodConfig": [
//!     {"name": [{"service": "echo.Echo", "method": "Say"}],
//!      "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.2s",
//!                        "nonFatalStatusCodes": ["UNAVAILABLE"]}},
//!     {"name": [{}], "timeout": "5s",
//!      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", 8]}}
//!   ],
//!   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
//! }"#)?;
//! // The method first, then its service, then the default.
//! assert!(config.method_config("/echo.Echo/Say").unwrap().hedging_policy().is_some());
//! assert!(config.method_config("/echo.Echo/Shout").unwrap().retry_policy().is_some());
//! let layer = ServiceConfigLayer::new(config);
//! assert_eq!(layer.retry_tokens().map(|tokens| tokens.tokens()), Some(10.0));
//!
//! let error = ServiceConfig::from_json(r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 1}}]}"#)
//!     .unwrap_err();
//! assert_eq!(error.to_string(), "methodConfig[0].retryPolicy.maxAttempts: must be at least 2");
//! # Ok::<(), stormguard_retry::grpc::ServiceConfigError>(())
//! ```

mod config;
mod duration;
mod error;
mod layer;

pub use config::{
    CallPolicy, HedgingPolicy, MAX_ATTEMPTS_CAP, MethodConfig, MethodName, RetryPolicy,
    RetryThrottling, ServiceConfig,
};
pub use error::ServiceConfigError;
pub use layer::{ServiceConfigLayer, ServiceConfigService};
