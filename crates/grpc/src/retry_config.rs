//! [`RetryConfig`]: one method's `retryPolicy` from a gRPC service config.

use std::time::Duration;

use super::code::CodeSet;
use super::policy::GrpcPolicy;
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::schedule::Schedule;
use tower_backoff_core::Jitter;
use tower_backoff_core::{BackoffBuilder, BackoffLayer};

/// The most attempts a service config may ask for; more count as this many
/// (gRFC A6's client-side limit, so a config delivered by DNS cannot
/// multiply load).
#[doc(hidden)]
pub const MAX_ATTEMPTS_LIMIT: u32 = 5;

/// A6's jitter: each delay is multiplied by a random factor in `[0.8, 1.2]`.
#[doc(hidden)]
pub const RETRY_CONFIG_JITTER: Jitter = Jitter::Proportional(0.2);

/// A gRPC `retryPolicy`: how many attempts, which codes, and the backoff
/// between attempts; also the [`Schedule`] of that backoff.
///
/// The delay before retry `n` is `min(initialBackoff × backoffMultiplier^(n−1),
/// maxBackoff)`, and the layer multiplies it by a random factor in
/// `[0.8, 1.2]` ([`RETRY_CONFIG_JITTER`]), so a delay may end slightly past
/// `maxBackoff`, as A6 says; [`cap`](Schedule::cap) is `1.2 × maxBackoff`.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_backoff::grpc::{CodeSet, RetryConfig};
/// use tower_backoff::Schedule;
///
/// let policy = RetryConfig::new(
///     4,
///     Duration::from_millis(100),
///     Duration::from_secs(1),
///     2.0,
///     CodeSet::DEFAULT.with(Code::Aborted),
/// )?;
/// assert_eq!(policy.delay(1), Duration::from_millis(100));
/// assert_eq!(policy.delay(3), Duration::from_millis(400));
/// assert_eq!(policy.delay(9), Duration::from_secs(1));
/// let layer = policy.layer().build()?; // a BackoffLayer for this method
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryConfig {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    backoff_multiplier: f64,
    codes: CodeSet,
}

impl RetryConfig {
    /// A retry policy with A6's rules: `max_attempts` at least 2 (more than
    /// [`MAX_ATTEMPTS_LIMIT`] counts as that), both backoffs longer than
    /// zero, the multiplier a finite number above zero, at least one code.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the service-config field that breaks a rule
    /// (`maxAttempts`, `initialBackoff`, `maxBackoff`, `backoffMultiplier`,
    /// `retryableStatusCodes`).
    pub fn new(
        max_attempts: u32,
        initial_backoff: Duration,
        max_backoff: Duration,
        backoff_multiplier: f64,
        codes: CodeSet,
    ) -> Result<Self, ConfigError> {
        if max_attempts < 2 {
            return Err(ConfigError::new(
                "maxAttempts",
                format!("must be at least 2, got {max_attempts}"),
            ));
        }
        for (field, value) in [
            ("initialBackoff", initial_backoff),
            ("maxBackoff", max_backoff),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
            check_duration(field, value)?;
        }
        if !(backoff_multiplier > 0.0 && backoff_multiplier.is_finite()) {
            return Err(ConfigError::new(
                "backoffMultiplier",
                format!("must be a finite number greater than 0, got {backoff_multiplier}"),
            ));
        }
        if codes.is_empty() {
            return Err(ConfigError::new(
                "retryableStatusCodes",
                "must name at least one status code",
            ));
        }
        Ok(Self {
            max_attempts: max_attempts.min(MAX_ATTEMPTS_LIMIT),
            initial_backoff,
            max_backoff,
            backoff_multiplier,
            codes,
        })
    }

    /// What a method without a `retryPolicy` gets: no status is retried, but
    /// a call that never left the client still is, once at once (A6's
    /// transparent retry, which applies whatever the config says).
    pub(crate) const fn transparent_only() -> Self {
        Self {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            backoff_multiplier: 2.0,
            codes: CodeSet::EMPTY,
        }
    }

    /// Attempts, the first included, after A6's limit of 5.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Delay before the first retry, before jitter.
    pub const fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// Longest delay before jitter.
    pub const fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// Growth of the delay per retry.
    pub const fn backoff_multiplier(&self) -> f64 {
        self.backoff_multiplier
    }

    /// The codes retried.
    pub const fn retryable_codes(&self) -> CodeSet {
        self.codes
    }

    /// The [`GrpcPolicy`] for these codes.
    pub fn policy(&self) -> GrpcPolicy {
        GrpcPolicy::new().codes(self.codes)
    }

    /// A layer builder set up as this retry policy says: its [`GrpcPolicy`],
    /// its backoff as the schedule, A6's jitter, its attempts, a pushback
    /// waited as named (A6), even below the backoff. Add a budget
    /// (a shared [`RetryThrottle`](super::RetryThrottle) for A6's
    /// throttling) and build.
    pub fn layer(&self) -> BackoffBuilder<GrpcPolicy> {
        BackoffLayer::builder()
            .policy(self.policy())
            .schedule(*self)
            .jitter(RETRY_CONFIG_JITTER)
            .max_attempts(self.max_attempts)
            .exact_server_delays()
    }
}

impl Schedule for RetryConfig {
    fn delay(&self, retry: u32) -> Duration {
        let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
        let grown = self.initial_backoff.as_secs_f64() * self.backoff_multiplier.powi(exponent);
        match Duration::try_from_secs_f64(grown) {
            Ok(delay) => delay.min(self.max_backoff),
            // Only overflow gets here: the inputs are finite and positive.
            Err(_) => self.max_backoff,
        }
    }

    fn cap(&self) -> Duration {
        self.max_backoff.saturating_add(self.max_backoff / 5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn policy(attempts: u32, multiplier: f64) -> Result<RetryConfig, ConfigError> {
        RetryConfig::new(
            attempts,
            Duration::from_millis(100),
            Duration::from_secs(1),
            multiplier,
            CodeSet::DEFAULT,
        )
    }

    #[test]
    fn attempts_above_five_count_as_five() {
        assert_eq!(policy(9, 2.0).unwrap().max_attempts(), 5);
        assert_eq!(policy(2, 2.0).unwrap().max_attempts(), 2);
        assert_eq!(policy(1, 2.0).unwrap_err().field(), "maxAttempts");
    }

    #[test]
    fn a_multiplier_below_one_shrinks_the_delay() {
        let p = policy(5, 0.5).unwrap();
        assert_eq!(p.delay(1), Duration::from_millis(100));
        assert_eq!(p.delay(2), Duration::from_millis(50));
        assert_eq!(p.delay(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn growth_saturates_at_max_backoff() {
        let p = policy(5, 1e300).unwrap();
        assert_eq!(p.delay(3), Duration::from_secs(1));
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(1));
        assert_eq!(p.cap(), Duration::from_millis(1200));
    }

    #[test]
    fn invalid_values_name_their_field() {
        let ms = Duration::from_millis;
        let codes = CodeSet::DEFAULT;
        let cases = [
            (
                RetryConfig::new(3, Duration::ZERO, ms(1), 2.0, codes),
                "initialBackoff",
            ),
            (
                RetryConfig::new(3, ms(1), Duration::ZERO, 2.0, codes),
                "maxBackoff",
            ),
            (
                RetryConfig::new(3, ms(1), ms(1), 0.0, codes),
                "backoffMultiplier",
            ),
            (
                RetryConfig::new(3, ms(1), ms(1), f64::NAN, codes),
                "backoffMultiplier",
            ),
            (
                RetryConfig::new(3, ms(1), ms(1), 2.0, CodeSet::EMPTY),
                "retryableStatusCodes",
            ),
            (
                RetryConfig::new(3, ms(1), Duration::from_secs(400 * 86_400), 2.0, codes),
                "maxBackoff",
            ),
        ];
        for (result, field) in cases {
            assert_eq!(result.unwrap_err().field(), field);
        }
    }

    #[test]
    fn the_layer_uses_the_policy_codes() {
        let p = RetryConfig::new(
            3,
            Duration::from_millis(10),
            Duration::from_millis(10),
            1.0,
            CodeSet::EMPTY.with(Code::Aborted),
        )
        .unwrap();
        let layer = p.layer().build().unwrap();
        assert_eq!(
            layer.policy().retryable_codes(),
            CodeSet::EMPTY.with(Code::Aborted)
        );
    }
}
