//! [`HedgingConfig`]: one method's `hedgingPolicy` from a gRPC service config.

use std::time::Duration;

use super::code::CodeSet;
use super::policy::GrpcPolicy;
use super::retry_config::MAX_ATTEMPTS_LIMIT;
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::{BackoffBuilder, BackoffLayer, Constant, Hedging, Jitter};

/// A gRPC `hedgingPolicy` (gRFC A6): the first copy of a call goes out at
/// once, then another every `hedgingDelay` while none has answered, up to
/// `maxAttempts` copies in all; the first answer that is OK or a *fatal*
/// status wins and the other copies are cancelled.
///
/// A status in `nonFatalStatusCodes` is a failure of that copy only. When
/// no other copy is pending the next goes out at once (a retry of the call,
/// paid from the budget or throttle like any). While another copy is
/// pending the next one is a hedge, and hedges are capped where A6 has no
/// cap: [`GrpcRetryBuilder::hedge_load_cap`](super::GrpcRetryBuilder::hedge_load_cap)
/// lets a method hedge a share of its calls of the last second, each call
/// counting itself, so the cap may refuse it (it asks again while the call
/// is pending). At a cap of 1.0 an isolated call (no other call of the
/// method in the last second) gets one hedge and never its third copy; at
/// the default 0.1 it gets none. A valid `grpc-retry-pushback-ms` on it stops
/// the hedges of the copies still pending (A6 would send the next one after
/// the pushback: one copy fewer here, never more); when no copy is pending
/// any more, the next one goes out after the pushback, as A6 says. An invalid
/// or negative pushback ends the call with that status. Every copy counts
/// against `maxAttempts`, so a hedged call is never retried past it.
///
/// A `hedgingDelay` of zero sends every copy at once; they share the
/// request body's recording, each reading it in full.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_backoff::grpc::{CodeSet, HedgingConfig};
///
/// let hedging = HedgingConfig::new(3, Duration::from_millis(50), CodeSet::DEFAULT)?;
/// assert_eq!(hedging.max_attempts(), 3);
/// assert_eq!(hedging.hedging_delay(), Duration::from_millis(50));
/// assert!(hedging.non_fatal_codes().contains(Code::Unavailable));
/// let layer = hedging.layer().build()?; // a BackoffLayer for this method
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgingConfig {
    max_attempts: u32,
    hedging_delay: Duration,
    codes: CodeSet,
}

impl HedgingConfig {
    /// A hedging policy with A6's rules: `max_attempts` at least 2 (more
    /// than [`MAX_ATTEMPTS_LIMIT`] counts as that); `hedging_delay` may be
    /// zero (every copy at once); `non_fatal_codes` may be empty (every
    /// status but the copy's own failure to leave ends the call).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `maxAttempts` or `hedgingDelay` (longer than
    /// the crate's limit of a year).
    pub fn new(
        max_attempts: u32,
        hedging_delay: Duration,
        non_fatal_codes: CodeSet,
    ) -> Result<Self, ConfigError> {
        if max_attempts < 2 {
            return Err(ConfigError::new(
                "maxAttempts",
                format!("must be at least 2, got {max_attempts}"),
            ));
        }
        check_duration("hedgingDelay", hedging_delay)?;
        Ok(Self {
            max_attempts: max_attempts.min(MAX_ATTEMPTS_LIMIT),
            hedging_delay,
            codes: non_fatal_codes,
        })
    }

    /// Copies of a call in all, the first included, after A6's limit of 5.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Delay between one copy and the next.
    pub const fn hedging_delay(&self) -> Duration {
        self.hedging_delay
    }

    /// The codes that fail one copy, not the call.
    pub const fn non_fatal_codes(&self) -> CodeSet {
        self.codes
    }

    /// The [`GrpcPolicy`] for these codes.
    pub fn policy(&self) -> GrpcPolicy {
        GrpcPolicy::new().codes(self.codes).for_hedging()
    }

    /// The core's [`Hedging`] for this policy: a copy every `hedgingDelay`,
    /// all `maxAttempts` of them in flight at once if none answers, with the
    /// core's default load cap (see
    /// [`GrpcRetryBuilder::hedge_load_cap`](super::GrpcRetryBuilder::hedge_load_cap)).
    pub fn hedging(&self) -> Hedging {
        Hedging::after(self.hedging_delay).max_copies(self.max_attempts)
    }

    /// A layer builder set up as this hedging policy says: its
    /// [`GrpcPolicy`], its [`hedging`](Self::hedging), `maxAttempts` attempts
    /// in all, and no backoff: when every copy in flight failed, the next
    /// goes out at once (after a pushback if the last one had one). Add a
    /// budget and build; [`GrpcRetryLayer`](super::GrpcRetryLayer) does it
    /// with the config's `retryThrottling`.
    pub fn layer(&self) -> BackoffBuilder<GrpcPolicy> {
        BackoffLayer::builder()
            .policy(self.policy())
            .schedule(Constant::new(Duration::ZERO))
            .jitter(Jitter::None)
            .max_attempts(self.max_attempts)
            .exact_server_delays()
            .hedge(self.hedging())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_above_five_count_as_five_and_one_is_refused() {
        let config = |n| HedgingConfig::new(n, Duration::ZERO, CodeSet::EMPTY);
        assert_eq!(config(9).unwrap().max_attempts(), 5);
        assert_eq!(config(2).unwrap().max_attempts(), 2);
        assert_eq!(config(1).unwrap_err().field(), "maxAttempts");
        let long = HedgingConfig::new(2, Duration::from_secs(400 * 86_400), CodeSet::EMPTY);
        assert_eq!(long.unwrap_err().field(), "hedgingDelay");
    }

    #[test]
    fn the_layer_hedges_up_to_max_attempts() {
        let config = HedgingConfig::new(4, Duration::from_millis(5), CodeSet::DEFAULT).unwrap();
        let layer = config.layer().build().unwrap();
        assert_eq!(layer.max_attempts(), 4);
        assert_eq!(layer.policy().retryable_codes(), CodeSet::DEFAULT);
    }
}
