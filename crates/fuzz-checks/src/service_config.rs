//! `stormguard_retry::grpc::ServiceConfig::from_json` on arbitrary text: no panic; a config it
//! accepts holds what gRFC A6 asks (attempts 2 to 5, backoffs above zero, a positive
//! multiplier, retryable codes listed, tokens 1 to 1000 and a positive ratio), every name it
//! lists finds its own entry, any path finds an entry or none, and a layer can be built on it;
//! a config it refuses says what is wrong.

use stormguard_retry::grpc::{CallPolicy, ServiceConfig, ServiceConfigLayer};

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let config = match ServiceConfig::from_json(&text) {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.problem().is_empty());
            assert!(error.to_string().ends_with(error.problem()));
            return;
        }
    };
    for method in config.method_configs() {
        match method.policy() {
            Some(CallPolicy::Retry(retry)) => {
                assert!((2..=5).contains(&retry.max_attempts()));
                assert!(!retry.initial_backoff().is_zero() && !retry.max_backoff().is_zero());
                assert!(retry.backoff_multiplier().is_finite() && retry.backoff_multiplier() > 0.0);
                assert!(!retry.retryable_status_codes().is_empty());
            }
            Some(CallPolicy::Hedging(hedging)) => {
                assert!((2..=5).contains(&hedging.max_attempts()));
            }
            None => {}
        }
        for name in method.names() {
            let path = match (name.service(), name.method()) {
                (Some(service), Some(method)) => format!("/{service}/{method}"),
                (Some(service), None) => format!("/{service}/AnyMethod"),
                _ => continue,
            };
            // A more specific entry may take a service's other method; its own path is its own.
            if name.method().is_some() {
                let found = config.method_config(&path);
                assert!(
                    found.is_some_and(|found| std::ptr::eq(found, method)),
                    "{path}"
                );
            } else {
                assert!(config.method_config(&path).is_some(), "{path}");
            }
        }
    }
    if let Some(throttling) = config.retry_throttling() {
        assert!((1..=1000).contains(&throttling.max_tokens()));
        assert!(throttling.token_ratio() > 0.0);
    }
    let _ = config.method_config(&text);
    let _ = ServiceConfigLayer::new(config);
}
