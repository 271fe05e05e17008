//! [`TokenBucket`]: the retry quota of the AWS SDKs' standard mode.

use std::fmt;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::decision::Cause;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// Tokens are kept in thousandths, so a refill of a few tokens per second
/// accrues exactly, millisecond by millisecond, with integers only.
const MILLI: u64 = 1000;

/// Largest capacity or amount accepted: far beyond any sensible quota, and
/// small enough (in thousandths) that no sum of two amounts can overflow.
const MAX_TOKENS: u64 = 1 << 40;

/// A retry budget that charges each retry tokens and refunds some on success,
/// as the AWS SDKs' standard retry mode does.
///
/// A retry takes its cost out (5 tokens, 10 after a [timeout](Cause::Timeout))
/// and is refused when the bucket holds less. A success puts back 1 token
/// when no retry was needed, or the cost of the retry that led to it. So while
/// requests mostly succeed the bucket stays full, and while nothing succeeds
/// it only drains.
///
/// # The bound
/// The bucket starts full: its capacity is a **reserve**, not a rate. A cold
/// burst may spend it at once, `capacity / cost` retries (100 transient or 50
/// timeout retries with the defaults), and after that every retry is paid by
/// a success or the refill. Over any run, the tokens retries took are at most
/// `capacity + refunds + refill × seconds`: in a full outage, with no refill,
/// at most `capacity / cost` retries go out in all, however long it lasts.
///
/// Defaults: capacity 500, retry cost 5, timeout cost 10, throttling cost 5,
/// success refund 1, no refill. Every operation is a few atomic instructions,
/// with no lock; a refill reads the clock only when one is configured.
///
/// ```
/// use tower_backoff::budget::{Budget, TokenBucket};
/// use tower_backoff::Cause;
///
/// let bucket = TokenBucket::builder().capacity(10).build()?;
/// assert!(bucket.try_retry(Cause::Transient)); // 10 -> 5
/// assert!(!bucket.try_retry(Cause::Timeout)); // 10 needed, 5 left
/// assert!(bucket.try_retry(Cause::Transient)); // 5 -> 0
/// bucket.on_success(Some(Cause::Transient)); // the retry's cost comes back
/// assert_eq!(bucket.available(), 5);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
pub struct TokenBucket {
    /// Thousandths of a token.
    tokens: AtomicU64,
    capacity: u64,
    retry_cost: u64,
    timeout_cost: u64,
    throttled_cost: u64,
    success_refund: u64,
    refill: Option<Refill>,
}

struct Refill {
    /// Thousandths of a token per millisecond, which is tokens per second.
    per_ms: u64,
    origin: Instant,
    /// Milliseconds after `origin` up to which the refill has been added. Only
    /// the thread that moves it forward adds the tokens for that span, so each
    /// millisecond is paid exactly once however many threads race.
    until_ms: AtomicU64,
}

impl TokenBucket {
    /// A bucket with the AWS standard-mode defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder starting from the defaults.
    pub fn builder() -> TokenBucketBuilder {
        TokenBucketBuilder::default()
    }

    /// Whole tokens in the bucket now.
    pub fn available(&self) -> u64 {
        self.refill_now();
        self.tokens.load(Ordering::Relaxed) / MILLI
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity / MILLI
    }

    fn cost(&self, cause: Cause) -> u64 {
        match cause {
            Cause::Transient => self.retry_cost,
            Cause::Timeout => self.timeout_cost,
            Cause::Throttled => self.throttled_cost,
            // The layer charges nothing for a transparent retry; a second one
            // is an ordinary failure to connect.
            Cause::NotSent => self.retry_cost,
            // The layer charges nothing for a conflict either; a budget
            // asked directly charges it as any retry.
            Cause::Conflict => self.retry_cost,
        }
    }

    /// Empties the bucket without reading the clock, so a model check
    /// starts from the same state every run.
    #[cfg(all(test, tower_backoff_loom))]
    pub(crate) fn empty(&self) {
        self.tokens.store(0, Ordering::Relaxed);
    }

    /// Takes `amount` out if the bucket holds that much.
    fn withdraw(&self, amount: u64) -> bool {
        // One location, read-modify-write: the CAS alone makes it exact, no
        // ordering with other memory is needed.
        self.tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                tokens.checked_sub(amount)
            })
            .is_ok()
    }

    /// Puts `amount` back, up to the capacity.
    #[inline]
    fn deposit(&self, amount: u64) {
        // A healthy service keeps the bucket full: then a refund is one read,
        // not a write that would bounce the cache line between cores.
        if amount == 0 || self.tokens.load(Ordering::Relaxed) >= self.capacity {
            return;
        }
        // Saturating: a refill owed for a long idle spell can be any size.
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                (tokens < self.capacity).then(|| tokens.saturating_add(amount).min(self.capacity))
            });
    }

    fn refill_now(&self) {
        if let Some(refill) = &self.refill {
            let now_ms = u64::try_from(refill.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.refill_to(now_ms);
        }
    }

    /// Adds the refill owed up to `now_ms` milliseconds after the bucket was
    /// built.
    pub(crate) fn refill_to(&self, now_ms: u64) {
        let Some(refill) = &self.refill else { return };
        let mut until = refill.until_ms.load(Ordering::Relaxed);
        while now_ms > until {
            match refill.until_ms.compare_exchange_weak(
                until,
                now_ms,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.deposit((now_ms - until).saturating_mul(refill.per_ms));
                    return;
                }
                // Another thread paid up to `actual`; pay what is left, if any.
                Err(actual) => until = actual,
            }
        }
    }
}

impl Default for TokenBucket {
    fn default() -> Self {
        TokenBucketBuilder::default()
            .build()
            .expect("the defaults are valid")
    }
}

impl Budget for TokenBucket {
    fn balance(&self) -> Option<u64> {
        Some(self.available())
    }

    fn would_allow(&self, cause: Cause) -> bool {
        self.refill_now();
        self.tokens.load(Ordering::Relaxed) >= self.cost(cause)
    }

    fn try_retry(&self, cause: Cause) -> bool {
        self.refill_now();
        self.withdraw(self.cost(cause))
    }

    #[inline]
    fn on_success(&self, last_retry: Option<Cause>) {
        self.deposit(match last_retry {
            None => self.success_refund,
            Some(cause) => self.cost(cause),
        });
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("available", &(self.tokens.load(Ordering::Relaxed) / MILLI))
            .field("capacity", &(self.capacity / MILLI))
            .field("retry_cost", &(self.retry_cost / MILLI))
            .field("timeout_cost", &(self.timeout_cost / MILLI))
            .field("throttled_cost", &(self.throttled_cost / MILLI))
            .field("success_refund", &(self.success_refund / MILLI))
            .field(
                "refill_per_second",
                &self.refill.as_ref().map_or(0, |r| r.per_ms),
            )
            .finish()
    }
}

/// Builds a [`TokenBucket`]; every setting is checked by [`build`](Self::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct TokenBucketBuilder {
    capacity: u64,
    retry_cost: u64,
    timeout_cost: u64,
    throttled_cost: Option<u64>,
    success_refund: u64,
    refill_per_second: u64,
}

impl Default for TokenBucketBuilder {
    fn default() -> Self {
        Self {
            capacity: 500,
            retry_cost: 5,
            timeout_cost: 10,
            throttled_cost: None,
            success_refund: 1,
            refill_per_second: 0,
        }
    }
}

impl TokenBucketBuilder {
    /// Tokens in a full bucket, which is also where it starts (default 500):
    /// the reserve a cold burst of retries may spend at once.
    pub fn capacity(mut self, tokens: u64) -> Self {
        self.capacity = tokens;
        self
    }

    /// Cost of a retry after a [transient](Cause::Transient) failure (default 5).
    pub fn retry_cost(mut self, tokens: u64) -> Self {
        self.retry_cost = tokens;
        self
    }

    /// Cost of a retry after a [timeout](Cause::Timeout) (default 10): a timed
    /// out request may still be running on the server, so retrying it adds
    /// more load than retrying a refused one.
    pub fn timeout_cost(mut self, tokens: u64) -> Self {
        self.timeout_cost = tokens;
        self
    }

    /// Cost of a retry after the server [throttled](Cause::Throttled) the
    /// request (default: the retry cost).
    pub fn throttled_cost(mut self, tokens: u64) -> Self {
        self.throttled_cost = Some(tokens);
        self
    }

    /// Tokens a success without retries puts back (default 1). A success after
    /// retries puts back the cost of the retry that led to it instead.
    pub fn success_refund(mut self, tokens: u64) -> Self {
        self.success_refund = tokens;
        self
    }

    /// Tokens added every second whatever happens (default 0, none), so the
    /// bucket recovers even when no request succeeds.
    pub fn refill_per_second(mut self, tokens: u64) -> Self {
        self.refill_per_second = tokens;
        self
    }

    /// Checks every setting and builds the bucket, full.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the setting: a zero capacity, an amount above
    /// 2^40 tokens, or a cost above the capacity (no retry could ever go out).
    pub fn build(self) -> Result<TokenBucket, ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::new("capacity", "must be at least 1 token"));
        }
        let throttled_cost = self.throttled_cost.unwrap_or(self.retry_cost);
        for (field, value) in [
            ("capacity", self.capacity),
            ("retry_cost", self.retry_cost),
            ("timeout_cost", self.timeout_cost),
            ("throttled_cost", throttled_cost),
            ("success_refund", self.success_refund),
            ("refill_per_second", self.refill_per_second),
        ] {
            if value > MAX_TOKENS {
                return Err(ConfigError::new(
                    field,
                    format!("{value} tokens is more than the 2^40 a bucket can count"),
                ));
            }
        }
        for (field, cost) in [
            ("retry_cost", self.retry_cost),
            ("timeout_cost", self.timeout_cost),
            ("throttled_cost", throttled_cost),
        ] {
            if cost > self.capacity {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "{cost} tokens is more than the capacity of {}: no such retry could ever go out",
                        self.capacity
                    ),
                ));
            }
        }
        let refill = (self.refill_per_second > 0).then(|| Refill {
            per_ms: self.refill_per_second,
            origin: Instant::now(),
            until_ms: AtomicU64::new(0),
        });
        Ok(TokenBucket {
            tokens: AtomicU64::new(self.capacity * MILLI),
            capacity: self.capacity * MILLI,
            retry_cost: self.retry_cost * MILLI,
            timeout_cost: self.timeout_cost * MILLI,
            throttled_cost: throttled_cost * MILLI,
            success_refund: self.success_refund * MILLI,
            refill,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket of 100 whose retries cost 10, drained to empty.
    fn drained(builder: TokenBucketBuilder) -> TokenBucket {
        let bucket = builder.capacity(100).retry_cost(10).build().unwrap();
        while bucket.try_retry(Cause::Transient) {}
        bucket
    }

    #[test]
    fn a_refill_pays_only_the_time_since_the_last_one() {
        // One token a second. The real clock has moved a few milliseconds
        // since the bucket was built: only these calls refill it.
        let bucket = drained(TokenBucket::builder().refill_per_second(1));
        assert_eq!(bucket.available(), 0);
        bucket.refill_to(5_000);
        assert_eq!(bucket.available(), 5);
        bucket.refill_to(12_000);
        assert_eq!(bucket.available(), 12, "7 s more: 7 tokens, not 17");
        bucket.refill_to(12_000);
        assert_eq!(bucket.available(), 12, "no time, no tokens");
    }

    #[test]
    fn a_success_without_retries_puts_back_the_refund_set() {
        let bucket = drained(TokenBucket::builder().success_refund(7));
        bucket.on_success(None);
        assert_eq!(bucket.available(), 7);
        bucket.on_success(Some(Cause::Transient));
        assert_eq!(bucket.available(), 7 + 10, "after a retry: its cost");
    }
}
