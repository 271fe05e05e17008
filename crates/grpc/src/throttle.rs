//! [`RetryThrottle`]: gRPC's retry throttling (gRFC A6) as a [`Budget`].

use std::fmt;
use std::sync::Arc;

use tower_backoff_core::budget::Budget;
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::policy::Cause;
use tower_backoff_core::sync::{AtomicU64, Ordering};

/// Tokens are kept in thousandths: A6 supports three decimal places, and
/// integers make every step exact.
const MILLI: u64 = 1000;

/// A6's bounds on `maxTokens`: `(0, 1000]`.
const MAX_TOKENS: f64 = 1000.0;

/// gRPC's retry throttling, exactly as gRFC A6 defines it, usable as any
/// layer's [`Budget`].
///
/// A token count starts at `maxTokens` and stays within `[0, maxTokens]`.
/// Every failure that could be retried takes 1 token away; every success
/// adds `tokenRatio`. Retries are allowed only while the count is above
/// `maxTokens / 2`; below, failures return at once. Both settings keep three
/// decimal places (`0.5466` counts as `0.546`), and the count is kept in
/// thousandths of a token, so no rounding ever drifts.
///
/// How the layer's calls map to A6:
/// - a failure the policy would retry is counted when it is seen
///   ([`would_allow`](Budget::would_allow)), whether or not the retry then
///   goes out, as A6 counts failed calls rather than retries sent;
/// - [`try_retry`](Budget::try_retry) only checks the count again when the
///   retry is sent (other calls may have failed meanwhile);
/// - a transparent retry of a call that never left ([`Cause::NotSent`]) is
///   neither counted nor checked, as A6 says;
/// - every success adds `tokenRatio`: a committed call (headers without a
///   status) included, as its headers arrive, whatever its trailers say.
///
/// The layer does not ask a budget about a failure it cannot retry anyway
/// (the call's last allowed attempt, a pushback saying not to retry), so
/// those are not counted this way. For A6's accounting exactly, let the
/// policy count instead: [`GrpcPolicy::throttle`](super::GrpcPolicy::throttle),
/// as [`GrpcRetryLayer`](super::GrpcRetryLayer) does, which also counts a
/// committed call by its trailers ([`GrpcBody`](super::GrpcBody)).
///
/// Lock-free: each call is one atomic read or one compare-and-swap loop on
/// one word.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use tower_backoff::budget::Budget;
/// use tower_backoff::grpc::RetryThrottle;
/// use tower_backoff::Cause;
///
/// let throttle = RetryThrottle::new(10.0, 0.1)?;
/// for _ in 0..4 {
///     assert!(throttle.would_allow(Cause::Throttled)); // 10 → 6
/// }
/// assert!(!throttle.would_allow(Cause::Throttled)); // 5: not above 10 / 2
/// assert_eq!(throttle.tokens(), 5.0);
/// for _ in 0..10 {
///     throttle.on_success(None); // + 0.1 each
/// }
/// assert_eq!(throttle.tokens(), 6.0);
/// assert!(throttle.allows_retry());
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
pub struct RetryThrottle {
    /// Thousandths of a token.
    tokens: AtomicU64,
    max: u64,
    ratio: u64,
}

impl RetryThrottle {
    /// A full throttle of `max_tokens` (in `(0, 1000]`) refilled by
    /// `token_ratio` (> 0) per success; a service config's
    /// `retryThrottling { maxTokens, tokenRatio }`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `maxTokens` or `tokenRatio` when it is out of
    /// range, not finite, or (for the ratio) zero once cut to three decimal
    /// places.
    pub fn new(max_tokens: f64, token_ratio: f64) -> Result<Self, ConfigError> {
        if !(max_tokens > 0.0 && max_tokens <= MAX_TOKENS) {
            return Err(ConfigError::new(
                "maxTokens",
                format!("must be in (0, 1000], got {max_tokens}"),
            ));
        }
        let max = thousandths(max_tokens);
        if max == 0 {
            return Err(ConfigError::new(
                "maxTokens",
                format!("{max_tokens} is zero at three decimal places"),
            ));
        }
        if !(token_ratio > 0.0 && token_ratio.is_finite()) {
            return Err(ConfigError::new(
                "tokenRatio",
                format!("must be a finite number greater than 0, got {token_ratio}"),
            ));
        }
        let ratio = thousandths(token_ratio);
        if ratio == 0 {
            return Err(ConfigError::new(
                "tokenRatio",
                format!("{token_ratio} is zero at three decimal places (the most A6 keeps)"),
            ));
        }
        Ok(Self {
            tokens: AtomicU64::new(max),
            max,
            ratio,
        })
    }

    /// The token count now, to three decimal places.
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Ordering::Relaxed) as f64 / MILLI as f64
    }

    /// `maxTokens`.
    pub fn max_tokens(&self) -> f64 {
        self.max as f64 / MILLI as f64
    }

    /// `tokenRatio`, as kept (three decimal places).
    pub fn token_ratio(&self) -> f64 {
        self.ratio as f64 / MILLI as f64
    }

    /// Whether retries are allowed now: the count is above `maxTokens / 2`.
    pub fn allows_retry(&self) -> bool {
        self.above_threshold(self.tokens.load(Ordering::Relaxed))
    }

    /// Counts a failed call (1 token less, never below 0); returns whether
    /// a retry is allowed after it.
    pub fn record_failure(&self) -> bool {
        // One location, read-modify-write: the CAS alone makes it exact.
        let before = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                (tokens > 0).then(|| tokens.saturating_sub(MILLI))
            })
            .unwrap_or(0);
        self.above_threshold(before.saturating_sub(MILLI))
    }

    /// Counts a successful call: `tokenRatio` more, never above `maxTokens`.
    pub fn record_success(&self) {
        // A healthy channel keeps the count full: then a success is one read,
        // not a write that bounces the cache line between cores.
        if self.tokens.load(Ordering::Relaxed) >= self.max {
            return;
        }
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                (tokens < self.max).then(|| (tokens + self.ratio).min(self.max))
            });
    }

    fn above_threshold(&self, tokens: u64) -> bool {
        // `tokens > max / 2`, without halving an odd number of thousandths.
        tokens * 2 > self.max
    }
}

/// `value` in thousandths, further decimals dropped; saturates far above any
/// count (`maxTokens` is at most 1000).
fn thousandths(value: f64) -> u64 {
    let scaled = (value * MILLI as f64).floor();
    if scaled >= (1u64 << 40) as f64 {
        1 << 40
    } else {
        scaled as u64
    }
}

impl Budget for RetryThrottle {
    fn would_allow(&self, cause: Cause) -> bool {
        let _ = cause;
        self.record_failure()
    }

    fn try_retry(&self, cause: Cause) -> bool {
        let _ = cause;
        self.allows_retry()
    }

    fn on_success(&self, last_retry: Option<Cause>) {
        let _ = last_retry;
        self.record_success();
    }
}

/// A hedged method's budget under a policy that counts the throttle
/// ([`GrpcPolicy::for_hedging`](super::GrpcPolicy)): it only reads the
/// count, so nothing is counted twice, and refuses hedges and the next copy
/// after failed ones while retries are not allowed.
pub(crate) struct ThrottleGate(pub(crate) Arc<RetryThrottle>);

impl Budget for ThrottleGate {
    fn would_allow(&self, cause: Cause) -> bool {
        let _ = cause;
        self.0.allows_retry()
    }

    fn try_retry(&self, cause: Cause) -> bool {
        let _ = cause;
        self.0.allows_retry()
    }

    fn on_success(&self, last_retry: Option<Cause>) {
        let _ = last_retry;
    }
}

impl fmt::Debug for RetryThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryThrottle")
            .field("tokens", &self.tokens())
            .field("max_tokens", &self.max_tokens())
            .field("token_ratio", &self.token_ratio())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_keep_three_decimal_places() {
        let throttle = RetryThrottle::new(10.0, 0.5466).unwrap();
        assert_eq!(throttle.token_ratio(), 0.546);
        throttle.record_failure();
        throttle.record_success();
        assert_eq!(throttle.tokens(), 9.546);
    }

    #[test]
    fn the_count_stays_within_zero_and_max() {
        let throttle = RetryThrottle::new(3.0, 2.5).unwrap();
        for _ in 0..10 {
            assert!(!throttle.record_failure() || throttle.tokens() > 1.5);
        }
        assert_eq!(throttle.tokens(), 0.0);
        throttle.record_success();
        throttle.record_success();
        assert_eq!(throttle.tokens(), 3.0);
    }

    #[test]
    fn retries_stop_at_exactly_half() {
        // 10 tokens, threshold 5: four failures leave 6 (allowed), the fifth 5 (not).
        let throttle = RetryThrottle::new(10.0, 0.1).unwrap();
        let allowed: Vec<bool> = (0..6).map(|_| throttle.record_failure()).collect();
        assert_eq!(allowed, [true, true, true, true, false, false]);
        // Back above 5 takes 11 successes from 4: 4 + 1.1 = 5.1.
        for _ in 0..10 {
            throttle.record_success();
        }
        assert!(!throttle.allows_retry(), "{}", throttle.tokens());
        throttle.record_success();
        assert!(throttle.allows_retry(), "{}", throttle.tokens());
    }

    #[test]
    fn an_odd_maximum_has_an_exact_threshold() {
        let throttle = RetryThrottle::new(0.005, 0.001).unwrap();
        assert!(throttle.allows_retry());
        throttle.tokens.store(3, Ordering::Relaxed);
        assert!(throttle.allows_retry()); // 0.003 > 0.0025
        throttle.tokens.store(2, Ordering::Relaxed);
        assert!(!throttle.allows_retry());
    }

    #[test]
    fn out_of_range_settings_name_their_field() {
        for (max, ratio, field) in [
            (0.0, 0.1, "maxTokens"),
            (1000.5, 0.1, "maxTokens"),
            (-1.0, 0.1, "maxTokens"),
            (f64::NAN, 0.1, "maxTokens"),
            (0.0001, 0.1, "maxTokens"),
            (10.0, 0.0, "tokenRatio"),
            (10.0, -0.1, "tokenRatio"),
            (10.0, 0.0004, "tokenRatio"),
            (10.0, f64::INFINITY, "tokenRatio"),
        ] {
            let err = RetryThrottle::new(max, ratio).unwrap_err();
            assert_eq!(err.field(), field, "{max} {ratio}");
        }
        assert!(RetryThrottle::new(1000.0, 1e12).is_ok());
    }

    #[test]
    fn a_huge_ratio_refills_to_the_maximum_and_no_further() {
        let throttle = RetryThrottle::new(1000.0, 1e12).unwrap();
        throttle.record_failure();
        throttle.record_success();
        assert_eq!(throttle.tokens(), 1000.0);
    }
}
