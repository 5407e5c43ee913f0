//! [`ServiceConfig`]: a gRFC A6 service config, parsed, validated, and asked for the method
//! config of a call.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value};
use stormguard_budget::MAX_RETRY_TOKENS;
use stormguard_classify::{GrpcCode, GrpcCodes};

use super::duration::parse_duration;
use super::error::ServiceConfigError;

/// Most attempts a retry or hedging policy may ask for: larger `maxAttempts` are taken as 5
/// (gRFC A6, "Maximum Number of Retries" and "Validation of retryPolicy").
pub const MAX_ATTEMPTS_CAP: u32 = 5;

/// A gRPC service config (gRFC A6, "Integration with Service Config"; the message
/// `grpc.service_config.ServiceConfig` of grpc-proto) as far as retries go: its `methodConfig`
/// entries and its `retryThrottling`. Other fields (`loadBalancingConfig`,
/// `maxRequestMessageBytes` ...) are read past.
///
/// ```
/// use std::time::Duration;
/// use stormguard_retry::grpc::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{"service": "helloworld.Greeter"}],
///     "timeout": "2s",
///     "retryPolicy": {
///       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
///       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
///     }
///   }],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#)?;
/// let method = config.method_config("/helloworld.Greeter/SayHello").unwrap();
/// assert_eq!(method.timeout(), Some(Duration::from_secs(2)));
/// assert_eq!(method.retry_policy().unwrap().max_attempts(), 4);
/// assert!(config.method_config("/other.Service/Call").is_none());
/// # Ok::<(), stormguard_retry::grpc::ServiceConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceConfig {
    methods: Vec<MethodConfig>,
    /// Each name to the entry that has it, keyed as a call's path reads without its leading
    /// `/`: `service/method`, `service/` for a whole service, `""` for the default; so that a
    /// call is matched on slices of its path, with no allocation.
    by_name: HashMap<String, usize>,
    retry_throttling: Option<RetryThrottling>,
}

/// One `methodConfig` entry: the methods it names and what applies to their calls.
#[derive(Clone, Debug, PartialEq)]
pub struct MethodConfig {
    names: Vec<MethodName>,
    policy: Option<CallPolicy>,
    timeout: Option<Duration>,
    wait_for_ready: Option<bool>,
}

/// One `name` of a method config: a service and a method, a whole service (no method), or every
/// call (neither: the default).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MethodName {
    service: Option<String>,
    method: Option<String>,
}

/// What a method config does when a call fails: retry it, or hedge it (gRFC A6: one or the
/// other, never both).
#[derive(Clone, Debug, PartialEq)]
pub enum CallPolicy {
    /// `retryPolicy`.
    Retry(RetryPolicy),
    /// `hedgingPolicy`.
    Hedging(HedgingPolicy),
}

/// A `retryPolicy` (gRFC A6, "Retry Policy").
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    backoff_multiplier: f64,
    retryable_status_codes: GrpcCodes,
}

/// A `hedgingPolicy` (gRFC A6, "Hedging Policy").
#[derive(Clone, Debug, PartialEq)]
pub struct HedgingPolicy {
    max_attempts: u32,
    hedging_delay: Duration,
    non_fatal_status_codes: GrpcCodes,
}

/// `retryThrottling` (gRFC A6, "Throttling Retry Attempts and Hedged RPCs"): a token bucket per
/// server, see [`RetryTokens`](stormguard_budget::RetryTokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryThrottling {
    max_tokens: u32,
    token_ratio: f64,
}

impl ServiceConfig {
    /// Parses and validates a service config as gRFC A6 says: `maxAttempts` at least 2 (more
    /// than [`MAX_ATTEMPTS_CAP`] taken as 5), backoffs proto3 JSON durations above zero,
    /// `backoffMultiplier` above zero, `retryableStatusCodes` not empty, status codes as names
    /// (`"UNAVAILABLE"`, any case) or numbers (0 to 16, `OK` excepted), `hedgingDelay` and
    /// `timeout` durations of zero or more, `maxTokens` in (0, 1000], `tokenRatio` above zero;
    /// no entry with both a `retryPolicy` and a `hedgingPolicy`, no name twice, no name with a
    /// method but no service. The first violation is the error, with the path of its field.
    pub fn from_json(json: &str) -> Result<Self, ServiceConfigError> {
        let value: Value = serde_json::from_str(json)
            .map_err(|error| ServiceConfigError::new("", format!("not JSON: {error}")))?;
        Self::from_value(&value)
    }

    /// [`from_json`](Self::from_json) for a document already parsed.
    pub fn from_value(value: &Value) -> Result<Self, ServiceConfigError> {
        let root = value
            .as_object()
            .ok_or_else(|| ServiceConfigError::new("", "must be a JSON object"))?;
        let mut methods = Vec::new();
        let mut by_name = HashMap::new();
        if let Some(entries) = field(root, "methodConfig") {
            let entries = entries
                .as_array()
                .ok_or_else(|| ServiceConfigError::new("methodConfig", "must be an array"))?;
            for (index, entry) in entries.iter().enumerate() {
                let path = format!("methodConfig[{index}]");
                let method = MethodConfig::parse(entry, &path)?;
                for (position, name) in method.names.iter().enumerate() {
                    let key = name.key();
                    if by_name.insert(key, index).is_some() {
                        return Err(ServiceConfigError::new(
                            format!("{path}.name[{position}]"),
                            format!("{name} is named by an earlier entry too"),
                        ));
                    }
                }
                methods.push(method);
            }
        }
        let retry_throttling = field(root, "retryThrottling")
            .map(|value| RetryThrottling::parse(value, "retryThrottling"))
            .transpose()?;
        Ok(Self {
            methods,
            by_name,
            retry_throttling,
        })
    }

    /// The method config for a call to `path` (`/package.Service/Method`), as gRFC A6 picks it:
    /// the entry that names that method, else the one that names its service alone, else the
    /// default (the one with an empty name); `None` when none applies (the call is sent once,
    /// as a gRPC client without a policy sends it).
    pub fn method_config(&self, path: &str) -> Option<&MethodConfig> {
        self.method_index(path)
            .and_then(|index| self.methods.get(index))
    }

    /// The position in [`method_configs`](Self::method_configs) of the entry for `path`.
    pub(crate) fn method_index(&self, path: &str) -> Option<usize> {
        let call = path
            .strip_prefix('/')
            .and_then(|call| Some((call, call.split_once('/')?)));
        if let Some((call, (service, method))) = call
            && !service.is_empty()
            && !method.contains('/')
        {
            if let Some(index) = self.by_name.get(call) {
                return Some(*index);
            }
            // `service/`, the service's own entry.
            if let Some(index) = self.by_name.get(&call[..=service.len()]) {
                return Some(*index);
            }
        }
        // Not a gRPC path, or no entry for it: only the default applies.
        self.by_name.get("").copied()
    }

    /// The `methodConfig` entries, in order.
    pub fn method_configs(&self) -> &[MethodConfig] {
        &self.methods
    }

    /// The `retryThrottling`, if any.
    pub fn retry_throttling(&self) -> Option<RetryThrottling> {
        self.retry_throttling
    }
}

impl std::str::FromStr for ServiceConfig {
    type Err = ServiceConfigError;

    fn from_str(json: &str) -> Result<Self, ServiceConfigError> {
        Self::from_json(json)
    }
}

impl MethodConfig {
    fn parse(value: &Value, path: &str) -> Result<Self, ServiceConfigError> {
        let entry = object(value, path)?;
        let names = match field(entry, "name") {
            Some(names) => {
                let names_path = format!("{path}.name");
                let names = names
                    .as_array()
                    .ok_or_else(|| ServiceConfigError::new(&names_path, "must be an array"))?;
                names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| MethodName::parse(name, &format!("{names_path}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => Vec::new(),
        };
        let retry = field(entry, "retryPolicy");
        let hedging = field(entry, "hedgingPolicy");
        let policy = match (retry, hedging) {
            (Some(_), Some(_)) => {
                return Err(ServiceConfigError::new(
                    path,
                    "has both a retryPolicy and a hedgingPolicy (gRFC A6 allows one)",
                ));
            }
            (Some(retry), None) => Some(CallPolicy::Retry(RetryPolicy::parse(
                retry,
                &format!("{path}.retryPolicy"),
            )?)),
            (None, Some(hedging)) => Some(CallPolicy::Hedging(HedgingPolicy::parse(
                hedging,
                &format!("{path}.hedgingPolicy"),
            )?)),
            (None, None) => None,
        };
        let timeout = field(entry, "timeout")
            .map(|value| duration(value, &format!("{path}.timeout")))
            .transpose()?;
        let wait_for_ready = field(entry, "waitForReady")
            .map(|value| {
                value.as_bool().ok_or_else(|| {
                    ServiceConfigError::new(format!("{path}.waitForReady"), "must be true or false")
                })
            })
            .transpose()?;
        Ok(Self {
            names,
            policy,
            timeout,
            wait_for_ready,
        })
    }

    /// The methods this entry applies to.
    pub fn names(&self) -> &[MethodName] {
        &self.names
    }

    /// Its retry or hedging policy, if any.
    pub fn policy(&self) -> Option<&CallPolicy> {
        self.policy.as_ref()
    }

    /// Its `retryPolicy`, if it has one.
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        match &self.policy {
            Some(CallPolicy::Retry(retry)) => Some(retry),
            _ => None,
        }
    }

    /// Its `hedgingPolicy`, if it has one.
    pub fn hedging_policy(&self) -> Option<&HedgingPolicy> {
        match &self.policy {
            Some(CallPolicy::Hedging(hedging)) => Some(hedging),
            _ => None,
        }
    }

    /// `timeout`: the deadline of each call, across all its attempts.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `waitForReady`, as written (`None` when absent). A gRPC client that waits for ready
    /// queues a call while its channel has no ready connection instead of failing it at once
    /// with `UNAVAILABLE`; a tonic `Channel` always queues its calls until a connection is up
    /// (or its connect timeout fails them), so there is nothing for the engine to apply: the
    /// value is kept for whoever builds the channel.
    pub fn wait_for_ready(&self) -> Option<bool> {
        self.wait_for_ready
    }
}

impl MethodName {
    fn parse(value: &Value, path: &str) -> Result<Self, ServiceConfigError> {
        let name = object(value, path)?;
        let part = |key: &str| -> Result<Option<String>, ServiceConfigError> {
            match field(name, key) {
                None => Ok(None),
                Some(Value::String(text)) if text.is_empty() => Ok(None),
                // A path's separator: such a name could match no call, or the wrong one.
                Some(Value::String(text)) if text.contains('/') => Err(ServiceConfigError::new(
                    format!("{path}.{key}"),
                    "must not contain `/`",
                )),
                Some(Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(ServiceConfigError::new(
                    format!("{path}.{key}"),
                    "must be a string",
                )),
            }
        };
        let service = part("service")?;
        let method = part("method")?;
        if service.is_none() && method.is_some() {
            return Err(ServiceConfigError::new(
                format!("{path}.method"),
                "needs a service: a method name alone matches nothing (gRFC A6)",
            ));
        }
        Ok(Self { service, method })
    }

    /// The service (`package.Service`), or `None` for the default.
    pub fn service(&self) -> Option<&str> {
        self.service.as_deref()
    }

    /// The method, or `None` for every method of the service.
    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// The key of [`ServiceConfig`]'s index: the name as a call's path reads it.
    fn key(&self) -> String {
        match (&self.service, &self.method) {
            (Some(service), Some(method)) => format!("{service}/{method}"),
            (Some(service), None) => format!("{service}/"),
            _ => String::new(),
        }
    }
}

impl std::fmt::Display for MethodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.service, &self.method) {
            (Some(service), Some(method)) => write!(f, "/{service}/{method}"),
            (Some(service), None) => write!(f, "service {service}"),
            _ => f.write_str("the default (empty name)"),
        }
    }
}

impl RetryPolicy {
    fn parse(value: &Value, path: &str) -> Result<Self, ServiceConfigError> {
        let policy = object(value, path)?;
        let max_attempts = max_attempts(required(policy, path, "maxAttempts")?, path)?;
        let positive = |key: &str| -> Result<Duration, ServiceConfigError> {
            let field_path = format!("{path}.{key}");
            let delay = duration(required(policy, path, key)?, &field_path)?;
            match delay.is_zero() {
                true => Err(ServiceConfigError::new(field_path, "must be above zero")),
                false => Ok(delay),
            }
        };
        let initial_backoff = positive("initialBackoff")?;
        let max_backoff = positive("maxBackoff")?;
        let multiplier_path = format!("{path}.backoffMultiplier");
        let backoff_multiplier = required(policy, path, "backoffMultiplier")?
            .as_f64()
            .ok_or_else(|| ServiceConfigError::new(&multiplier_path, "must be a number"))?;
        if !(backoff_multiplier.is_finite() && backoff_multiplier > 0.0) {
            return Err(ServiceConfigError::new(
                multiplier_path,
                "must be above zero",
            ));
        }
        let codes_path = format!("{path}.retryableStatusCodes");
        let retryable_status_codes =
            status_codes(required(policy, path, "retryableStatusCodes")?, &codes_path)?;
        if retryable_status_codes.is_empty() {
            return Err(ServiceConfigError::new(codes_path, "must not be empty"));
        }
        Ok(Self {
            max_attempts,
            initial_backoff,
            max_backoff,
            backoff_multiplier,
            retryable_status_codes,
        })
    }

    /// `maxAttempts`, the first attempt included: 2 to [`MAX_ATTEMPTS_CAP`].
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `initialBackoff`.
    pub fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// `maxBackoff`.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// `backoffMultiplier`.
    pub fn backoff_multiplier(&self) -> f64 {
        self.backoff_multiplier
    }

    /// `retryableStatusCodes`.
    pub fn retryable_status_codes(&self) -> GrpcCodes {
        self.retryable_status_codes
    }
}

impl HedgingPolicy {
    fn parse(value: &Value, path: &str) -> Result<Self, ServiceConfigError> {
        let policy = object(value, path)?;
        let max_attempts = max_attempts(required(policy, path, "maxAttempts")?, path)?;
        // Absent or zero: every hedge at once (gRFC A6).
        let hedging_delay = field(policy, "hedgingDelay")
            .map(|value| duration(value, &format!("{path}.hedgingDelay")))
            .transpose()?
            .unwrap_or(Duration::ZERO);
        let non_fatal_status_codes = field(policy, "nonFatalStatusCodes")
            .map(|value| status_codes(value, &format!("{path}.nonFatalStatusCodes")))
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            max_attempts,
            hedging_delay,
            non_fatal_status_codes,
        })
    }

    /// `maxAttempts`, the first attempt included: 2 to [`MAX_ATTEMPTS_CAP`].
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `hedgingDelay` (zero when absent).
    pub fn hedging_delay(&self) -> Duration {
        self.hedging_delay
    }

    /// `nonFatalStatusCodes` (empty when absent).
    pub fn non_fatal_status_codes(&self) -> GrpcCodes {
        self.non_fatal_status_codes
    }
}

impl RetryThrottling {
    fn parse(value: &Value, path: &str) -> Result<Self, ServiceConfigError> {
        let throttling = object(value, path)?;
        let tokens_path = format!("{path}.maxTokens");
        let max_tokens = required(throttling, path, "maxTokens")?;
        let max_tokens = integer(max_tokens)
            .filter(|tokens| (1..=u64::from(MAX_RETRY_TOKENS)).contains(tokens))
            .ok_or_else(|| {
                ServiceConfigError::new(tokens_path, "must be a whole number from 1 to 1000")
            })?;
        let ratio_path = format!("{path}.tokenRatio");
        let token_ratio = required(throttling, path, "tokenRatio")?
            .as_f64()
            .ok_or_else(|| ServiceConfigError::new(&ratio_path, "must be a number"))?;
        // Counted to the thousandth (gRFC A6): a ratio that rounds to nothing refills nothing.
        if !(token_ratio.is_finite() && token_ratio >= 0.0005) {
            return Err(ServiceConfigError::new(
                ratio_path,
                "must be above zero (at least 0.001: it counts to three decimal places)",
            ));
        }
        Ok(Self {
            // At most 1000: fits.
            max_tokens: max_tokens as u32,
            token_ratio,
        })
    }

    /// `maxTokens`: 1 to 1000.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// `tokenRatio`.
    pub fn token_ratio(&self) -> f64 {
        self.token_ratio
    }
}

/// `key` of `object`, unless absent or `null` (proto3 JSON reads `null` as the default).
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

fn required<'a>(
    object: &'a Map<String, Value>,
    path: &str,
    key: &str,
) -> Result<&'a Value, ServiceConfigError> {
    field(object, key)
        .ok_or_else(|| ServiceConfigError::new(format!("{path}.{key}"), "is required"))
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ServiceConfigError> {
    value
        .as_object()
        .ok_or_else(|| ServiceConfigError::new(path, "must be a JSON object"))
}

/// A whole number, as proto3 JSON writes integers: a number or a string of digits.
fn integer(value: &Value) -> Option<u64> {
    match value {
        Value::Number(number) => number.as_u64().or_else(|| {
            // `4.0` is a whole number too.
            number
                .as_f64()
                .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= u32::MAX as f64)
                .map(|n| n as u64)
        }),
        Value::String(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse().ok()
        }
        _ => None,
    }
}

fn max_attempts(value: &Value, path: &str) -> Result<u32, ServiceConfigError> {
    let path = format!("{path}.maxAttempts");
    let attempts =
        integer(value).ok_or_else(|| ServiceConfigError::new(&path, "must be a whole number"))?;
    if attempts < 2 {
        return Err(ServiceConfigError::new(path, "must be at least 2"));
    }
    // gRFC A6: "values greater than 5 are treated as 5".
    Ok(attempts.min(u64::from(MAX_ATTEMPTS_CAP)) as u32)
}

fn duration(value: &Value, path: &str) -> Result<Duration, ServiceConfigError> {
    let text = value.as_str().ok_or_else(|| {
        ServiceConfigError::new(
            path,
            "must be a string of seconds ending in `s`, like \"1.5s\"",
        )
    })?;
    parse_duration(text).map_err(|problem| ServiceConfigError::new(path, problem))
}

fn status_codes(value: &Value, path: &str) -> Result<GrpcCodes, ServiceConfigError> {
    let codes = value
        .as_array()
        .ok_or_else(|| ServiceConfigError::new(path, "must be an array of status codes"))?;
    let mut set = GrpcCodes::empty();
    for (index, code) in codes.iter().enumerate() {
        let code_path = format!("{path}[{index}]");
        let parsed = match code {
            Value::String(name) => GrpcCode::from_name(&name.to_ascii_uppercase()),
            number => integer(number)
                .and_then(|n| i32::try_from(n).ok())
                .and_then(GrpcCode::from_i32),
        };
        let code = parsed.ok_or_else(|| {
            ServiceConfigError::new(
                &code_path,
                format!(
                    "{code} is not a gRPC status code (a name like \"UNAVAILABLE\", or 1 to 16)"
                ),
            )
        })?;
        if code == GrpcCode::Ok {
            return Err(ServiceConfigError::new(code_path, "OK is not a failure"));
        }
        set = set.with(code);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::strategy::Strategy;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// gRFC A6's own examples: its retry policy, hedging policy and throttling, in one config.
    const A6: &str = r#"{
      "loadBalancingPolicy": "round_robin",
      "methodConfig": [
        {
          "name": [{"service": "EchoService", "method": "EchoMethod"}],
          "waitForReady": true,
          "retryPolicy": {
            "maxAttempts": 4,
            "initialBackoff": "0.1s",
            "maxBackoff": "1s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"]
          }
        },
        {
          "name": [{"service": "EchoService"}],
          "timeout": "0.000340s",
          "hedgingPolicy": {
            "maxAttempts": 4,
            "hedgingDelay": "0.5s",
            "nonFatalStatusCodes": ["UNAVAILABLE", "INTERNAL", "ABORTED"]
          }
        }
      ],
      "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
    }"#;

    fn error(json: &str) -> String {
        ServiceConfig::from_json(json).unwrap_err().to_string()
    }

    /// A config whose only method config has `retryPolicy` with `field` set to `value`.
    fn retry_with(field: &str, value: &str) -> String {
        let mut policy = serde_json::json!({
            "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
        });
        policy[field] = serde_json::from_str(value).unwrap();
        serde_json::json!({"methodConfig": [{"name": [{}], "retryPolicy": policy}]}).to_string()
    }

    #[test]
    fn the_gfrc_examples_parse_to_what_they_say() {
        let config = ServiceConfig::from_json(A6).unwrap();
        let echo = config.method_config("/EchoService/EchoMethod").unwrap();
        assert_eq!(echo.wait_for_ready(), Some(true));
        assert_eq!(echo.timeout(), None);
        let retry = echo.retry_policy().unwrap();
        assert_eq!(retry.max_attempts(), 4);
        assert_eq!(retry.initial_backoff(), 100 * MS);
        assert_eq!(retry.max_backoff(), 1000 * MS);
        assert_eq!(retry.backoff_multiplier(), 2.0);
        assert_eq!(
            retry.retryable_status_codes(),
            GrpcCodes::empty().with(GrpcCode::Unavailable)
        );
        assert!(echo.hedging_policy().is_none());

        let service = config.method_config("/EchoService/Other").unwrap();
        assert_eq!(service.timeout(), Some(Duration::from_micros(340)));
        assert_eq!(service.wait_for_ready(), None);
        let hedging = service.hedging_policy().unwrap();
        assert_eq!(hedging.max_attempts(), 4);
        assert_eq!(hedging.hedging_delay(), 500 * MS);
        let codes: Vec<_> = hedging.non_fatal_status_codes().iter().collect();
        assert_eq!(
            codes,
            [GrpcCode::Aborted, GrpcCode::Internal, GrpcCode::Unavailable]
        );

        let throttling = config.retry_throttling().unwrap();
        assert_eq!(
            (throttling.max_tokens(), throttling.token_ratio()),
            (10, 0.1)
        );
        assert_eq!(config.method_configs().len(), 2);
    }

    #[test]
    fn a_call_gets_its_method_then_its_service_then_the_default() {
        let config = ServiceConfig::from_json(
            r#"{"methodConfig": [
                {"name": [{"service": "a.S"}], "timeout": "2s"},
                {"name": [{"service": "a.S", "method": "M"}, {"service": "b.T", "method": "N"}],
                 "timeout": "1s"},
                {"name": [{"service": "", "method": ""}], "timeout": "3s"}
            ]}"#,
        )
        .unwrap();
        let timeout = |path: &str| config.method_config(path).and_then(MethodConfig::timeout);
        assert_eq!(timeout("/a.S/M"), Some(Duration::from_secs(1)));
        assert_eq!(timeout("/b.T/N"), Some(Duration::from_secs(1)));
        assert_eq!(timeout("/a.S/Other"), Some(Duration::from_secs(2)));
        assert_eq!(timeout("/b.T/Other"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("/c.U/M"), Some(Duration::from_secs(3)));
        // Not a gRPC path: the default only.
        for path in ["", "/", "/a.S", "/a.S/M/extra", "//M", "a.S/M", "/a.S/M/"] {
            assert_eq!(timeout(path), Some(Duration::from_secs(3)), "{path:?}");
        }
        // An empty method is the service's own entry, as its key reads.
        assert_eq!(timeout("/a.S/"), Some(Duration::from_secs(2)));
        let no_default = ServiceConfig::from_json(
            r#"{"methodConfig": [{"name": [{"service": "a.S", "method": "M"}]}]}"#,
        )
        .unwrap();
        assert!(no_default.method_config("/a.S/M").is_some());
        assert!(no_default.method_config("/a.S/N").is_none());
        assert!(
            ServiceConfig::from_json("{}")
                .unwrap()
                .method_config("/a.S/M")
                .is_none()
        );
    }

    #[test]
    fn a_name_given_twice_is_an_error() {
        assert_eq!(
            error(
                r#"{"methodConfig": [{"name": [{"service": "a.S", "method": "M"}]},
                                     {"name": [{}, {"service": "a.S", "method": "M"}]}]}"#
            ),
            "methodConfig[1].name[1]: /a.S/M is named by an earlier entry too"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"name": [{}]}, {"name": [{"service": ""}]}]}"#),
            "methodConfig[1].name[0]: the default (empty name) is named by an earlier entry too"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"name": [{"service": "a/b", "method": "c"}]}]}"#),
            "methodConfig[0].name[0].service: must not contain `/`"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"name": [{"method": "M"}]}]}"#),
            "methodConfig[0].name[0].method: needs a service: a method name alone matches nothing (gRFC A6)"
        );
    }

    #[test]
    fn max_attempts_above_five_is_five_and_below_two_an_error() {
        let attempts = |value: &str| {
            let config = ServiceConfig::from_json(&retry_with("maxAttempts", value)).unwrap();
            config.method_configs()[0]
                .retry_policy()
                .unwrap()
                .max_attempts()
        };
        assert_eq!(attempts("2"), 2);
        assert_eq!(attempts("5"), 5);
        assert_eq!(attempts("6"), 5);
        assert_eq!(attempts("4294967296000"), 5);
        assert_eq!(attempts("\"3\""), 3);
        assert_eq!(attempts("3.0"), 3);
        for (value, problem) in [
            ("1", "must be at least 2"),
            ("0", "must be at least 2"),
            ("-3", "must be a whole number"),
            ("2.5", "must be a whole number"),
            ("\"many\"", "must be a whole number"),
            ("true", "must be a whole number"),
        ] {
            let config = retry_with("maxAttempts", value);
            assert_eq!(
                error(&config),
                format!("methodConfig[0].retryPolicy.maxAttempts: {problem}"),
                "{value}"
            );
        }
        let hedging = r#"{"methodConfig": [{"hedgingPolicy": {"maxAttempts": 1}}]}"#;
        assert_eq!(
            error(hedging),
            "methodConfig[0].hedgingPolicy.maxAttempts: must be at least 2"
        );
        let missing = r#"{"methodConfig": [{"hedgingPolicy": {}}]}"#;
        assert_eq!(
            error(missing),
            "methodConfig[0].hedgingPolicy.maxAttempts: is required"
        );
    }

    #[test]
    fn each_retry_policy_fault_names_its_field() {
        for (field, value, problem) in [
            ("initialBackoff", "\"0s\"", "must be above zero"),
            ("initialBackoff", "\"-1s\"", "must not be negative"),
            (
                "initialBackoff",
                "\"100ms\"",
                "must be a duration in seconds ending in `s`, like \"1.5s\"",
            ),
            (
                "initialBackoff",
                "0.1",
                "must be a string of seconds ending in `s`, like \"1.5s\"",
            ),
            (
                "maxBackoff",
                "\"1.0000000001s\"",
                "must have at most 9 fractional digits (nanoseconds)",
            ),
            (
                "maxBackoff",
                "\"400000000000s\"",
                "must be at most 315576000000s (10,000 years)",
            ),
            ("backoffMultiplier", "0", "must be above zero"),
            ("backoffMultiplier", "-2", "must be above zero"),
            ("backoffMultiplier", "\"2\"", "must be a number"),
            ("retryableStatusCodes", "[]", "must not be empty"),
            (
                "retryableStatusCodes",
                "\"UNAVAILABLE\"",
                "must be an array of status codes",
            ),
        ] {
            assert_eq!(
                error(&retry_with(field, value)),
                format!("methodConfig[0].retryPolicy.{field}: {problem}"),
                "{field} = {value}"
            );
        }
        for (value, problem) in [
            (
                "[\"UNAVAILABLE\", \"NOPE\"]",
                "\"NOPE\" is not a gRPC status code",
            ),
            ("[\"UNAVAILABLE\", 17]", "17 is not a gRPC status code"),
            ("[\"UNAVAILABLE\", -1]", "-1 is not a gRPC status code"),
            ("[\"UNAVAILABLE\", 0]", "OK is not a failure"),
            ("[\"UNAVAILABLE\", \"OK\"]", "OK is not a failure"),
        ] {
            let message = error(&retry_with("retryableStatusCodes", value));
            assert!(
                message.starts_with("methodConfig[0].retryPolicy.retryableStatusCodes[1]: ")
                    && message.contains(problem),
                "{message}"
            );
        }
        let required = r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 2}}]}"#;
        assert_eq!(
            error(required),
            "methodConfig[0].retryPolicy.initialBackoff: is required"
        );
    }

    #[test]
    fn status_codes_are_names_in_any_case_or_numbers() {
        let config = ServiceConfig::from_json(&retry_with(
            "retryableStatusCodes",
            r#"["unavailable", 8, "Aborted", 14]"#,
        ))
        .unwrap();
        let codes: Vec<_> = (config.method_configs()[0].retry_policy().unwrap())
            .retryable_status_codes()
            .iter()
            .collect();
        assert_eq!(
            codes,
            [
                GrpcCode::ResourceExhausted,
                GrpcCode::Aborted,
                GrpcCode::Unavailable
            ]
        );
    }

    #[test]
    fn an_entry_may_not_retry_and_hedge() {
        let both = r#"{"methodConfig": [{"name": [{}],
            "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s",
                            "backoffMultiplier": 1, "retryableStatusCodes": [14]},
            "hedgingPolicy": {"maxAttempts": 2}}]}"#;
        assert_eq!(
            error(both),
            "methodConfig[0]: has both a retryPolicy and a hedgingPolicy (gRFC A6 allows one)"
        );
        // A hedging policy needs only maxAttempts: no delay hedges at once, no code is non-fatal.
        let bare = ServiceConfig::from_json(
            r#"{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 9}}]}"#,
        )
        .unwrap();
        let hedging = bare.method_configs()[0].hedging_policy().unwrap();
        assert_eq!(hedging.max_attempts(), 5);
        assert_eq!(hedging.hedging_delay(), Duration::ZERO);
        assert!(hedging.non_fatal_status_codes().is_empty());
        assert_eq!(
            error(
                r#"{"methodConfig": [{"hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "-0.5s"}}]}"#
            ),
            "methodConfig[0].hedgingPolicy.hedgingDelay: must not be negative"
        );
    }

    #[test]
    fn throttling_is_validated() {
        let throttling = |body: &str| format!(r#"{{"retryThrottling": {body}}}"#);
        for (body, message) in [
            (
                r#"{"maxTokens": 0, "tokenRatio": 0.1}"#,
                "retryThrottling.maxTokens: must be a whole number from 1 to 1000",
            ),
            (
                r#"{"maxTokens": 1001, "tokenRatio": 0.1}"#,
                "retryThrottling.maxTokens: must be a whole number from 1 to 1000",
            ),
            (
                r#"{"maxTokens": 10.5, "tokenRatio": 0.1}"#,
                "retryThrottling.maxTokens: must be a whole number from 1 to 1000",
            ),
            (
                r#"{"tokenRatio": 0.1}"#,
                "retryThrottling.maxTokens: is required",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 0}"#,
                "retryThrottling.tokenRatio: must be above zero (at least 0.001: it counts to three decimal places)",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 0.0001}"#,
                "retryThrottling.tokenRatio: must be above zero (at least 0.001: it counts to three decimal places)",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": -1}"#,
                "retryThrottling.tokenRatio: must be above zero (at least 0.001: it counts to three decimal places)",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": "0.1"}"#,
                "retryThrottling.tokenRatio: must be a number",
            ),
            ("[]", "retryThrottling: must be a JSON object"),
        ] {
            assert_eq!(error(&throttling(body)), message, "{body}");
        }
        let most =
            ServiceConfig::from_json(&throttling(r#"{"maxTokens": 1000, "tokenRatio": 0.001}"#))
                .unwrap();
        assert_eq!(most.retry_throttling().map(|t| t.max_tokens()), Some(1000));
    }

    #[test]
    fn garbage_documents_are_errors_not_panics() {
        assert!(error("").starts_with("service config: not JSON"));
        assert!(error("{\"methodConfig\": [").starts_with("service config: not JSON"));
        assert_eq!(error("[]"), "service config: must be a JSON object");
        assert_eq!(
            error(r#"{"methodConfig": {}}"#),
            "methodConfig: must be an array"
        );
        assert_eq!(
            error(r#"{"methodConfig": [3]}"#),
            "methodConfig[0]: must be a JSON object"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"name": {}}]}"#),
            "methodConfig[0].name: must be an array"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"name": [{"service": 3}]}]}"#),
            "methodConfig[0].name[0].service: must be a string"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"waitForReady": "yes"}]}"#),
            "methodConfig[0].waitForReady: must be true or false"
        );
        assert_eq!(
            error(r#"{"methodConfig": [{"timeout": "soon"}]}"#),
            "methodConfig[0].timeout: must be a duration in seconds ending in `s`, like \"1.5s\""
        );
        // Nesting deeper than serde_json's limit is an error too, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(error(&deep).starts_with("service config: not JSON"));
        // null reads as absent (proto3 JSON).
        let nulls = ServiceConfig::from_json(
            r#"{"methodConfig": [{"name": [{}], "timeout": null, "retryPolicy": null}], "retryThrottling": null}"#,
        )
        .unwrap();
        assert!(nulls.method_configs()[0].policy().is_none());
        assert!(nulls.retry_throttling().is_none());
    }

    proptest::proptest! {
        /// Whatever the document, parsing ends in a config or an error, never a panic.
        #[test]
        fn any_text_is_a_config_or_an_error(text in ".{0,200}") {
            let _ = ServiceConfig::from_json(&text);
        }

        /// Any value in any field of a retry policy: a config or an error naming that field.
        #[test]
        fn any_field_value_is_accepted_or_named(
            field in proptest::sample::select(vec![
                "maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier",
                "retryableStatusCodes",
            ]),
            value in proptest::prop_oneof![
                proptest::num::f64::ANY.prop_map(|n| serde_json::json!(n).to_string()),
                proptest::num::i64::ANY.prop_map(|n| n.to_string()),
                ".{0,20}".prop_map(|text| serde_json::json!(text).to_string()),
                "[0-9]{1,15}(\\.[0-9]{0,12})?s".prop_map(|text| serde_json::json!(text).to_string()),
            ],
        ) {
            if let Err(error) = ServiceConfig::from_json(&retry_with(field, &value)) {
                let path = error.path();
                let element = format!("{}.{field}[", "methodConfig[0].retryPolicy");
                proptest::prop_assert!(
                    path == format!("methodConfig[0].retryPolicy.{field}") || path.starts_with(&element),
                    "{} for {}", error, value
                );
            }
        }
    }
}
