//! [`ServiceConfig`]: the retry parts of a gRPC service config JSON.

use std::collections::HashMap;
use std::str::FromStr;

use serde_json::{Map, Value};
use tonic::Code;

use super::code::CodeSet;
use super::duration::parse_duration;
use super::hedging_config::HedgingConfig;
use super::retry_config::RetryConfig;
use super::throttle::RetryThrottle;
use tower_backoff_core::error::ConfigError;

type Object = Map<String, Value>;

/// The retry settings of a gRPC service config: a [`RetryConfig`] or a
/// [`HedgingConfig`] per method, service or channel, and the channel's
/// `retryThrottling`.
///
/// Parsed from the JSON that gRPC clients take (gRFC A6), with A6's
/// validation rules; everything else in the document (load balancing,
/// timeouts) is ignored. Field names are read as proto3 JSON
/// allows, `maxAttempts` or `max_attempts`, and case-insensitively as
/// gRPC-Go reads them; a field whose value is `null` is absent, as proto3
/// JSON says (`"hedgingPolicy": null` beside a `retryPolicy` is fine). An
/// invalid document is a [`ConfigError`] naming the field, its reason saying
/// where it is (`methodConfig[1].retryPolicy`).
///
/// A method's settings come from the first `methodConfig` whose `name` is
/// the method exactly, else the one naming its whole service (no `method`),
/// else the one with an empty name (the default). A matching `methodConfig`
/// with neither a `retryPolicy` nor a `hedgingPolicy` means the method is not
/// retried; one with both is invalid.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use std::time::Duration;
/// use tower_backoff::grpc::ServiceConfig;
///
/// let config: ServiceConfig = r#"{
///   "methodConfig": [{
///     "name": [{ "service": "grpc.health.v1.Health" }],
///     "retryPolicy": {
///       "maxAttempts": 4,
///       "initialBackoff": "0.1s",
///       "maxBackoff": "1s",
///       "backoffMultiplier": 2,
///       "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted"]
///     }
///   }],
///   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
/// }"#.parse()?;
///
/// let policy = config.retry_config("/grpc.health.v1.Health/Check").unwrap();
/// assert_eq!(policy.max_attempts(), 4);
/// assert_eq!(policy.initial_backoff(), Duration::from_millis(100));
/// assert!(config.retry_config("/other.Service/Call").is_none());
/// assert_eq!(config.retry_throttling().unwrap().max_tokens(), 10.0);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ServiceConfig {
    /// One entry per `methodConfig`, in document order; `None` where it has
    /// neither policy.
    policies: Vec<Option<MethodPolicy>>,
    /// `"service/method"` and `"service"` to an index into `policies`.
    by_name: HashMap<String, usize>,
    default: Option<usize>,
    throttling: Option<RetryThrottling>,
}

/// What a `methodConfig` says to do when a call fails or is slow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MethodPolicy {
    Retry(RetryConfig),
    Hedging(HedgingConfig),
}

/// A service config's `retryThrottling`: the settings of a
/// [`RetryThrottle`], shared by every method of the channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryThrottling {
    max_tokens: f64,
    token_ratio: f64,
}

impl RetryThrottling {
    /// `maxTokens`.
    pub fn max_tokens(&self) -> f64 {
        self.max_tokens
    }

    /// `tokenRatio`.
    pub fn token_ratio(&self) -> f64 {
        self.token_ratio
    }

    /// A new, full throttle with these settings.
    pub fn throttle(&self) -> RetryThrottle {
        RetryThrottle::new(self.max_tokens, self.token_ratio)
            .expect("validated when the service config was parsed")
    }
}

impl ServiceConfig {
    /// Parses a service config JSON document.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first field that breaks A6's rules, or
    /// `serviceConfig` when the text is not a JSON object.
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let document: Value = serde_json::from_str(json)
            .map_err(|e| ConfigError::new("serviceConfig", format!("not valid JSON: {e}")))?;
        let Value::Object(document) = document else {
            return Err(ConfigError::new("serviceConfig", "must be a JSON object"));
        };
        let mut config = ServiceConfig::default();
        if let Some(methods) = field(&document, "methodConfig", "method_config") {
            let Value::Array(methods) = methods else {
                return Err(ConfigError::new("methodConfig", "must be an array"));
            };
            for (index, method) in methods.iter().enumerate() {
                config.add_method(index, method)?;
            }
        }
        if let Some(throttling) = field(&document, "retryThrottling", "retry_throttling") {
            config.throttling = Some(parse_throttling(throttling)?);
        }
        Ok(config)
    }

    /// The retry policy of the method at `path` (`"/package.Service/Method"`,
    /// as in a request's URI), or `None` when it is not retried.
    pub fn retry_config(&self, path: &str) -> Option<&RetryConfig> {
        match self.policies[self.entry(path)?].as_ref()? {
            MethodPolicy::Retry(retry) => Some(retry),
            MethodPolicy::Hedging(_) => None,
        }
    }

    /// The hedging policy of the method at `path` (`"/package.Service/Method"`),
    /// or `None` when it is not hedged.
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
    /// use std::time::Duration;
    /// use tower_backoff::grpc::ServiceConfig;
    ///
    /// let config: ServiceConfig = r#"{"methodConfig": [{
    ///   "name": [{ "service": "pkg.Search" }],
    ///   "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.05s",
    ///                      "nonFatalStatusCodes": ["UNAVAILABLE"] }
    /// }]}"#.parse()?;
    /// let hedging = config.hedging_config("/pkg.Search/Find").unwrap();
    /// assert_eq!(hedging.max_attempts(), 3);
    /// assert_eq!(hedging.hedging_delay(), Duration::from_millis(50));
    /// assert!(config.retry_config("/pkg.Search/Find").is_none());
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn hedging_config(&self, path: &str) -> Option<&HedgingConfig> {
        match self.policies[self.entry(path)?].as_ref()? {
            MethodPolicy::Hedging(hedging) => Some(hedging),
            MethodPolicy::Retry(_) => None,
        }
    }

    /// Which `methodConfig` applies to `path`.
    pub(crate) fn entry(&self, path: &str) -> Option<usize> {
        let name = path.strip_prefix('/').unwrap_or(path);
        let service = name.split_once('/').map_or(name, |(service, _)| service);
        self.by_name
            .get(name)
            .or_else(|| self.by_name.get(service))
            .copied()
            .or(self.default)
    }

    /// Every `methodConfig`'s retry or hedging policy, in document order.
    pub(crate) fn policies(&self) -> &[Option<MethodPolicy>] {
        &self.policies
    }

    /// The `retryThrottling` settings, if the document has them.
    pub fn retry_throttling(&self) -> Option<RetryThrottling> {
        self.throttling
    }

    fn add_method(&mut self, index: usize, method: &Value) -> Result<(), ConfigError> {
        let at = format!("methodConfig[{index}]");
        let Value::Object(method) = method else {
            return Err(ConfigError::new(
                "methodConfig",
                format!("{at}: must be an object"),
            ));
        };
        let retry = field(method, "retryPolicy", "retry_policy");
        let hedging = field(method, "hedgingPolicy", "hedging_policy");
        let policy = match (retry, hedging) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "hedgingPolicy",
                    format!("{at}: only one of retryPolicy and hedgingPolicy may be set"),
                ));
            }
            (Some(retry), None) => Some(MethodPolicy::Retry(parse_retry_config(
                retry,
                &format!("{at}.retryPolicy"),
            )?)),
            (None, Some(hedging)) => Some(MethodPolicy::Hedging(parse_hedging_config(
                hedging,
                &format!("{at}.hedgingPolicy"),
            )?)),
            (None, None) => None,
        };
        let entry = self.policies.len();
        self.policies.push(policy);
        let names = match field(method, "name", "name") {
            None => return Ok(()),
            Some(Value::Array(names)) => names,
            Some(_) => {
                return Err(ConfigError::new("name", format!("{at}: must be an array")));
            }
        };
        for (i, name) in names.iter().enumerate() {
            let at = format!("{at}.name[{i}]");
            let Value::Object(name) = name else {
                return Err(ConfigError::new("name", format!("{at}: must be an object")));
            };
            let service = optional_string(name, "service", &at)?;
            let method = optional_string(name, "method", &at)?;
            let key = match (service, method) {
                ("", "") => None,
                ("", _) => {
                    return Err(ConfigError::new(
                        "method",
                        format!("{at}: a method needs its service"),
                    ));
                }
                (service, "") => Some(service.to_owned()),
                (service, method) => Some(format!("{service}/{method}")),
            };
            let duplicate = match key {
                None => self.default.replace(entry).is_some(),
                Some(key) => self.by_name.insert(key, entry).is_some(),
            };
            if duplicate {
                return Err(ConfigError::new(
                    "name",
                    format!("{at}: names a method that an earlier methodConfig names"),
                ));
            }
        }
        Ok(())
    }
}

impl FromStr for ServiceConfig {
    type Err = ConfigError;

    fn from_str(json: &str) -> Result<Self, ConfigError> {
        Self::from_json(json)
    }
}

/// `object`'s field named `camel` or `snake`, in any case; a `null` one is
/// absent, as proto3's JSON reads it (and gRPC-Go with it).
fn field<'a>(object: &'a Object, camel: &str, snake: &str) -> Option<&'a Value> {
    object
        .iter()
        .find(|(key, value)| {
            !value.is_null() && (key.eq_ignore_ascii_case(camel) || key.eq_ignore_ascii_case(snake))
        })
        .map(|(_, value)| value)
}

fn optional_string<'a>(
    object: &'a Object,
    name: &'static str,
    at: &str,
) -> Result<&'a str, ConfigError> {
    match field(object, name, name) {
        None => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ConfigError::new(name, format!("{at}: must be a string"))),
    }
}

fn required<'a>(
    object: &'a Object,
    camel: &'static str,
    snake: &str,
    at: &str,
) -> Result<&'a Value, ConfigError> {
    field(object, camel, snake).ok_or_else(|| ConfigError::new(camel, format!("{at}: is required")))
}

fn parse_retry_config(value: &Value, at: &str) -> Result<RetryConfig, ConfigError> {
    let Value::Object(policy) = value else {
        return Err(ConfigError::new(
            "retryPolicy",
            format!("{at}: must be an object"),
        ));
    };
    let max_attempts =
        parse_max_attempts(required(policy, "maxAttempts", "max_attempts", at)?, at)?;
    let initial = parse_backoff(policy, "initialBackoff", "initial_backoff", at)?;
    let max = parse_backoff(policy, "maxBackoff", "max_backoff", at)?;
    let multiplier = match required(policy, "backoffMultiplier", "backoff_multiplier", at)? {
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        _ => {
            return Err(ConfigError::new(
                "backoffMultiplier",
                format!("{at}: must be a number"),
            ));
        }
    };
    let codes = parse_codes(
        required(policy, "retryableStatusCodes", "retryable_status_codes", at)?,
        "retryableStatusCodes",
        at,
    )?;
    if codes.is_empty() {
        return Err(ConfigError::new(
            "retryableStatusCodes",
            format!("{at}: must name at least one status code"),
        ));
    }
    RetryConfig::new(max_attempts, initial, max, multiplier, codes)
        .map_err(|e| ConfigError::new(e.field(), format!("{at}: {}", e.reason())))
}

fn parse_hedging_config(value: &Value, at: &str) -> Result<HedgingConfig, ConfigError> {
    let Value::Object(policy) = value else {
        return Err(ConfigError::new(
            "hedgingPolicy",
            format!("{at}: must be an object"),
        ));
    };
    let max_attempts =
        parse_max_attempts(required(policy, "maxAttempts", "max_attempts", at)?, at)?;
    let delay = match field(policy, "hedgingDelay", "hedging_delay") {
        None => std::time::Duration::ZERO,
        Some(value) => {
            let text = value.as_str().ok_or_else(|| {
                ConfigError::new(
                    "hedgingDelay",
                    format!("{at}: must be a duration string such as \"0.1s\", got {value}"),
                )
            })?;
            match parse_duration(text) {
                Some(Ok(delay)) => delay,
                Some(Err(_)) => {
                    return Err(ConfigError::new(
                        "hedgingDelay",
                        format!("{at}: must not be negative, got {text:?}"),
                    ));
                }
                None => {
                    return Err(ConfigError::new(
                        "hedgingDelay",
                        format!("{at}: {text:?} is not a duration such as \"0.1s\""),
                    ));
                }
            }
        }
    };
    let codes = match field(policy, "nonFatalStatusCodes", "non_fatal_status_codes") {
        None => CodeSet::EMPTY,
        Some(codes) => parse_codes(codes, "nonFatalStatusCodes", at)?,
    };
    HedgingConfig::new(max_attempts, delay, codes)
        .map_err(|e| ConfigError::new(e.field(), format!("{at}: {}", e.reason())))
}

fn parse_max_attempts(value: &Value, at: &str) -> Result<u32, ConfigError> {
    let error = |got: &Value| {
        ConfigError::new(
            "maxAttempts",
            format!("{at}: must be an integer greater than 1, got {got}"),
        )
    };
    let Value::Number(n) = value else {
        return Err(error(value));
    };
    match (n.as_u64(), n.as_f64()) {
        (Some(attempts), _) if attempts >= 2 => Ok(u32::try_from(attempts).unwrap_or(u32::MAX)),
        // An integer too large for u64 still counts as the limit.
        (None, Some(f)) if f.fract() == 0.0 && f > u64::MAX as f64 => Ok(u32::MAX),
        _ => Err(error(value)),
    }
}

fn parse_backoff(
    policy: &Object,
    camel: &'static str,
    snake: &str,
    at: &str,
) -> Result<std::time::Duration, ConfigError> {
    let value = required(policy, camel, snake, at)?;
    let text = value.as_str().ok_or_else(|| {
        ConfigError::new(
            camel,
            format!("{at}: must be a duration string such as \"0.1s\", got {value}"),
        )
    })?;
    match parse_duration(text) {
        Some(Ok(duration)) if !duration.is_zero() => Ok(duration),
        Some(_) => Err(ConfigError::new(
            camel,
            format!("{at}: must be longer than zero, got {text:?}"),
        )),
        None => Err(ConfigError::new(
            camel,
            format!("{at}: {text:?} is not a duration such as \"0.1s\""),
        )),
    }
}

/// A list of status codes, by name or number; empty if it is.
fn parse_codes(value: &Value, field: &'static str, at: &str) -> Result<CodeSet, ConfigError> {
    let Value::Array(codes) = value else {
        return Err(ConfigError::new(field, format!("{at}: must be an array")));
    };
    let mut set = CodeSet::EMPTY;
    for code in codes {
        let parsed = match code {
            Value::String(name) => CodeSet::parse(name),
            Value::Number(n) => n
                .as_u64()
                .filter(|&n| n <= 16)
                .map(|n| Code::from_i32(n as i32)),
            _ => None,
        };
        let Some(parsed) = parsed else {
            return Err(ConfigError::new(
                field,
                format!("{at}: {code} is not a gRPC status code"),
            ));
        };
        set = set.with(parsed);
    }
    Ok(set)
}

fn parse_throttling(value: &Value) -> Result<RetryThrottling, ConfigError> {
    let at = "retryThrottling";
    let Value::Object(throttling) = value else {
        return Err(ConfigError::new(at, "must be an object"));
    };
    let number = |camel: &'static str, snake: &str| -> Result<f64, ConfigError> {
        match required(throttling, camel, snake, at)? {
            Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::NAN)),
            other => Err(ConfigError::new(
                camel,
                format!("{at}: must be a number, got {other}"),
            )),
        }
    };
    let max_tokens = number("maxTokens", "max_tokens")?;
    let token_ratio = number("tokenRatio", "token_ratio")?;
    let throttle = RetryThrottle::new(max_tokens, token_ratio)
        .map_err(|e| ConfigError::new(e.field(), format!("{at}: {}", e.reason())))?;
    Ok(RetryThrottling {
        max_tokens: throttle.max_tokens(),
        token_ratio: throttle.token_ratio(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRY_POLICY: &str = r#"{"maxAttempts": 3, "initialBackoff": "0.1s",
        "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#;

    /// Issue 44: proto3 JSON reads `null` as absent, and gRPC-Go accepts it.
    #[test]
    fn a_null_hedging_policy_beside_a_retry_policy_is_absent() {
        let config = ServiceConfig::from_json(&format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s.S"}}],
                "retryPolicy": {RETRY_POLICY}, "hedgingPolicy": null}}]}}"#
        ))
        .expect("a null hedgingPolicy is absent");
        assert_eq!(config.retry_config("/s.S/M").unwrap().max_attempts(), 3);
        assert!(config.hedging_config("/s.S/M").is_none());
    }

    #[test]
    fn a_null_retry_policy_beside_a_hedging_policy_is_absent() {
        let config = ServiceConfig::from_json(
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "retryPolicy": null,
                "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.1s"}}]}"#,
        )
        .expect("a null retryPolicy is absent");
        assert!(config.retry_config("/s.S/M").is_none());
        assert_eq!(config.hedging_config("/s.S/M").unwrap().max_attempts(), 2);
    }

    #[test]
    fn null_retry_throttling_is_absent() {
        let config = ServiceConfig::from_json(&format!(
            r#"{{"methodConfig": [{{"name": [{{}}], "retryPolicy": {RETRY_POLICY}}}],
                "retryThrottling": null}}"#
        ))
        .expect("a null retryThrottling is absent");
        assert!(config.retry_throttling().is_none());
        assert!(config.retry_config("/any.S/M").is_some());
        let snake = ServiceConfig::from_json(r#"{"retry_throttling": null}"#).unwrap();
        assert!(snake.retry_throttling().is_none());
    }

    #[test]
    fn null_lists_and_names_are_absent() {
        let config =
            ServiceConfig::from_json(r#"{"methodConfig": [{"name": null, "retryPolicy": null}]}"#)
                .unwrap();
        assert_eq!(config.policies(), [None]);
        assert!(ServiceConfig::from_json(r#"{"methodConfig": null}"#)
            .unwrap()
            .policies()
            .is_empty());
    }

    /// A required field that is `null` is missing, and says so.
    #[test]
    fn a_null_required_field_is_missing() {
        let error = ServiceConfig::from_json(
            r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": null,
                "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
        )
        .unwrap_err();
        assert_eq!(error.field(), "maxAttempts");
        assert!(error.to_string().contains("is required"), "{error}");
        let error = ServiceConfig::from_json(
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": null}}"#,
        )
        .unwrap_err();
        assert_eq!(error.field(), "tokenRatio");
    }
}
