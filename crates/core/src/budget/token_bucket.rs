//! [`TokenBucket`]: the retry quota of the AWS SDKs' standard mode.

use std::fmt;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::decision::Cause;
use crate::error::ConfigError;
use crate::limits::{DEFAULT_MAX_ATTEMPTS, UNLIMITED_ATTEMPTS};
use crate::sync::{AtomicU64, Ordering};

/// Tokens are kept in thousandths, so a refill of a few tokens per second
/// accrues exactly, millisecond by millisecond, with integers only.
const MILLI: u64 = 1000;

/// Largest capacity or amount accepted: far beyond any sensible quota, and
/// small enough (in thousandths) that no sum of two amounts can overflow.
const MAX_TOKENS: u64 = 1 << 40;

/// The share of recent first-try successes the fleet-safe bucket may bank as
/// retries.
const FLEET_SAFE_SHARE: f64 = 0.1;

/// The span of traffic a growing capacity is sized to, and over which a
/// measured capacity falls back to its floor.
const GROWTH_WINDOW_MS: u64 = 10_000;

/// A retry budget that charges each retry tokens and refunds some on success,
/// as the AWS SDKs' standard retry mode does; with
/// [`fleet_safe`](Self::fleet_safe) settings, the layer's default.
///
/// A retry takes its cost out (5 tokens, 10 after a [timeout](Cause::Timeout))
/// and is refused when the bucket holds less. A success puts back 1 token
/// when no retry was needed, or the cost of the retry that led to it. So while
/// requests mostly succeed the bucket stays full, and while nothing succeeds
/// it only drains.
///
/// # The bound
/// The bucket starts full (unless [`initial_tokens`](TokenBucketBuilder::initial_tokens)
/// says otherwise): its capacity is a **reserve**, not a rate. A cold
/// burst may spend it at once, `capacity / cost` retries (100 transient or 50
/// timeout retries with the defaults), and after that every retry is paid by
/// a success or the refill. Over any run, the tokens retries took are at most
/// `capacity + refunds + refill × seconds`: in a full outage, with no refill,
/// at most `capacity / cost` retries go out in all, however long it lasts.
///
/// # Under contention
/// No lock: the tokens are one atomic word, and every move of them (a retry
/// paid, a refund, a refill) is one compare-and-swap on it, so no race
/// creates or loses a token, and threads racing for the last tokens never
/// both get them. Threads that retry at once take turns on its cache line;
/// a retry is a request over the network, which costs far more. A refund
/// into a full bucket writes nothing; only a configured refill reads the
/// clock.
///
/// The capacity is a second word, written only when it
/// [grows with traffic](TokenBucketBuilder::grow_with_traffic) or falls
/// back: a refund that raced a fall reads it again after it landed and
/// gives up what it put above it, so the bucket ends within its capacity.
///
/// ```
/// use tower_backoff_core::budget::{Budget, TokenBucket};
/// use tower_backoff_core::Cause;
///
/// let bucket = TokenBucket::builder().capacity(10).build()?;
/// assert!(bucket.try_retry(Cause::Transient)); // 10 -> 5
/// assert!(!bucket.try_retry(Cause::Timeout)); // 10 needed, 5 left
/// assert!(bucket.try_retry(Cause::Transient)); // 5 -> 0
/// bucket.on_success(Some(Cause::Transient)); // the retry's cost comes back
/// assert_eq!(bucket.available(), 5);
/// # Ok::<_, tower_backoff_core::ConfigError>(())
/// ```
pub struct TokenBucket {
    /// Thousandths of a token.
    tokens: AtomicU64,
    /// The most `tokens` holds, in thousandths: a word of its own, as two
    /// amounts of up to 2^50 thousandths do not fit in one.
    capacity: AtomicU64,
    retry_cost: u64,
    timeout_cost: u64,
    throttled_cost: u64,
    success_refund: u64,
    retried_success_refund: u64,
    /// Thousandths of a token it started with: what a [fresh](Self::fresh)
    /// copy starts with.
    initial: u64,
    refill: Option<Refill>,
    growth: Option<Growth>,
}

/// How a capacity that grows with traffic is measured: a retry opens a
/// measurement, which counts first-try successes until it has seen enough
/// of them over long enough to give their rate. Only retries open one, so a
/// service that needs none costs one read per success, as a fixed bucket;
/// and the capacity only matters to a bucket that retries spend.
///
/// A measured capacity stands for the traffic of the window it was measured
/// over, so it falls back to the floor over the next window unless a newer
/// measurement renews it: a capacity grown in a busy hour is not there for
/// the outage that follows a quiet one.
struct Growth {
    /// The capacity however little traffic there is, in thousandths.
    floor: u64,
    /// Thousandths of a token of capacity per first-try success per second.
    per_rate: u64,
    origin: Instant,
    /// One more than the millisecond after `origin` at which the open
    /// measurement began; 0 while none is open.
    since: AtomicU64,
    /// First-try successes the open measurement has counted.
    successes: AtomicU64,
    /// The capacity the last measurement gave, in thousandths, and the
    /// millisecond after `origin` it was measured at: what the capacity
    /// falls from. Two words, written by the one thread that closes a
    /// measurement; the floor again once it has fallen all the way.
    measured: AtomicU64,
    measured_at: AtomicU64,
}

/// Fewest first-try successes a measurement counts before its rate is
/// trusted: two successes a millisecond apart say nothing of the traffic.
const MEASURE_AT_LEAST: u64 = 8;

/// Shortest span a measurement covers, in milliseconds: a burst is not a
/// rate.
const MEASURE_AT_LEAST_MS: u64 = 1_000;

/// No measurement is open.
const NOT_MEASURING: u64 = 0;

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

    /// The budget a layer built with no budget option gets, for requests of
    /// `max_attempts` attempts: safe when every process of a fleet builds its
    /// own layer, and never in the way of a quiet process's first failure.
    /// Each retry costs one token; the bucket starts full with one request's
    /// retries (`max_attempts - 1`, two when unlimited); every success earns
    /// one, a retried one its cost too; and the capacity grows to a tenth of
    /// the first-try successes of the last 10 s, falling back over the next
    /// 10 s. See [the module docs](super#the-default) for why and what it bounds.
    pub fn fleet_safe(max_attempts: u32) -> Self {
        Self::fleet_safe_builder(max_attempts)
            .build()
            .expect("the fleet-safe settings are valid")
    }

    /// A builder starting from the [`fleet_safe`](Self::fleet_safe)
    /// settings for requests of `max_attempts` attempts.
    pub fn fleet_safe_builder(max_attempts: u32) -> TokenBucketBuilder {
        let retries = match max_attempts {
            UNLIMITED_ATTEMPTS => DEFAULT_MAX_ATTEMPTS - 1,
            attempts => attempts.saturating_sub(1).max(1),
        };
        let retries = u64::from(retries);
        TokenBucketBuilder::default()
            .capacity(retries)
            .initial_tokens(retries)
            .retry_cost(1)
            .timeout_cost(1)
            .throttled_cost(1)
            .success_refund(1)
            .retried_success_refund(1)
            .grow_with_traffic(FLEET_SAFE_SHARE)
    }

    /// A builder starting from the defaults.
    pub fn builder() -> TokenBucketBuilder {
        TokenBucketBuilder::default()
    }

    /// Another bucket with the same settings, as this one was when it was
    /// built: what each host of a per-host stack gets.
    pub fn fresh(&self) -> Self {
        let capacity = self.growth.as_ref().map_or_else(
            || self.capacity.load(Ordering::Relaxed),
            |growth| growth.floor,
        );
        TokenBucket {
            tokens: AtomicU64::new(self.initial),
            capacity: AtomicU64::new(capacity),
            retry_cost: self.retry_cost,
            timeout_cost: self.timeout_cost,
            throttled_cost: self.throttled_cost,
            success_refund: self.success_refund,
            retried_success_refund: self.retried_success_refund,
            initial: self.initial,
            refill: self.refill.as_ref().map(|r| Refill::starting(r.per_ms)),
            growth: self
                .growth
                .as_ref()
                .map(|g| Growth::starting(g.floor, g.per_rate)),
        }
    }

    /// Whole tokens in the bucket now.
    pub fn available(&self) -> u64 {
        self.refill_now();
        self.decay();
        self.held() / MILLI
    }

    /// Thousandths of a token held now, never above the capacity: a refund
    /// that raced a fall of the capacity may hold more for a moment, until
    /// it reads the capacity again (see `recheck`).
    fn held(&self) -> u64 {
        let tokens = self.tokens.load(Ordering::Relaxed);
        tokens.min(self.capacity.load(Ordering::Relaxed))
    }

    /// The most tokens the bucket holds now.
    pub fn capacity(&self) -> u64 {
        self.decay();
        self.capacity.load(Ordering::Relaxed) / MILLI
    }

    fn cost(&self, cause: Cause) -> u64 {
        match cause {
            Cause::Timeout => self.timeout_cost,
            Cause::Throttled => self.throttled_cost,
            // The layer charges nothing for a transparent retry (a second one
            // is an ordinary failure to connect) nor for a conflict; a budget
            // asked directly charges them as any retry.
            Cause::Transient | Cause::NotSent | Cause::Conflict | Cause::Hedge => self.retry_cost,
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
        self.decay();
        // One location, read-modify-write: the compare-and-swap alone makes
        // it exact.
        let taken = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                tokens.checked_sub(amount)
            })
            .is_ok();
        if let (true, Some(growth)) = (taken, &self.growth) {
            growth.start_measuring();
        }
        taken
    }

    /// Puts `amount` back, up to the capacity.
    #[inline]
    pub(in crate::budget) fn deposit(&self, amount: u64) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if self.put(amount, capacity) {
            self.recheck(capacity);
        }
    }

    /// Puts `amount` back, up to `capacity`; whether anything was written
    /// (nothing into a full bucket, a healthy service's).
    #[inline]
    fn put(&self, amount: u64, capacity: u64) -> bool {
        // Acquire: see `recheck`.
        self.tokens
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |tokens| {
                // Saturating: a refill owed for a long idle spell can be any
                // size.
                (tokens < capacity).then(|| tokens.saturating_add(amount).min(capacity))
            })
            .is_ok()
    }

    /// A deposit filled the bucket up to `read`, the capacity it read
    /// first: if the capacity fell since, its write may have landed after
    /// the fall cut the tokens, so it cuts them again. Its write read from
    /// that cut (acquire), or from a later write, which continues the cut's
    /// release sequence as every write of the tokens is a read-modify-write;
    /// so it reads the new capacity here. Or it came before the cut, which
    /// then cut what it put. Without this, the tokens above a fallen
    /// capacity would come back when it grows again.
    fn recheck(&self, read: u64) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if capacity < read {
            self.tokens.fetch_min(capacity, Ordering::Relaxed);
        }
    }

    /// A first attempt succeeded: counted by an open measurement of a
    /// capacity that grows with traffic.
    #[inline]
    fn count_success(&self) {
        if let Some(growth) = &self.growth {
            if let Some(capacity) = growth.count() {
                self.resize(capacity);
            }
        }
    }

    /// Lowers a grown capacity to what it has fallen to since it was
    /// measured. Asked only when a retry is weighed, so the happy path never
    /// reads the clock for it.
    fn decay(&self) {
        if let Some(growth) = &self.growth {
            let capacity = growth.capacity_now();
            if capacity < self.capacity.load(Ordering::Relaxed) {
                self.resize(capacity);
            }
        }
    }

    /// Sets the capacity to `capacity` thousandths, giving up what the bucket
    /// holds beyond it: tokens banked while traffic was higher are not a
    /// share of the traffic now.
    pub(in crate::budget) fn resize(&self, capacity: u64) {
        self.capacity.store(capacity, Ordering::Relaxed);
        // Release: a deposit that read the capacity before this store and
        // lands after this cut reads the new one when it checks (see
        // `recheck`).
        self.tokens.fetch_min(capacity, Ordering::Release);
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

impl Refill {
    /// A refill of `per_ms` that starts counting now.
    fn starting(per_ms: u64) -> Self {
        Self {
            per_ms,
            origin: Instant::now(),
            until_ms: AtomicU64::new(0),
        }
    }
}

impl Growth {
    /// A growing capacity that has measured nothing yet.
    fn starting(floor: u64, per_rate: u64) -> Self {
        Self {
            floor,
            per_rate,
            origin: Instant::now(),
            since: AtomicU64::new(NOT_MEASURING),
            successes: AtomicU64::new(0),
            measured: AtomicU64::new(floor),
            measured_at: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A retry was paid: open a measurement unless one is open.
    fn start_measuring(&self) {
        if self.since.load(Ordering::Relaxed) != NOT_MEASURING {
            return;
        }
        let at = self.now_ms().saturating_add(1);
        if self
            .since
            .compare_exchange(NOT_MEASURING, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.successes.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a first-try success into the open measurement, if any; when
    /// it has seen enough, closes it and returns the capacity it measured.
    #[inline]
    fn count(&self) -> Option<u64> {
        let since = self.since.load(Ordering::Relaxed);
        if since == NOT_MEASURING {
            return None;
        }
        let count = self
            .successes
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        // The clock is read at counts 8, 16, 32, ...: a few times a
        // measurement, however busy the service.
        if count < MEASURE_AT_LEAST || !count.is_power_of_two() {
            return None;
        }
        self.close(since, count)
    }

    fn close(&self, since: u64, count: u64) -> Option<u64> {
        let now = self.now_ms();
        let elapsed = now.saturating_sub(since - 1);
        if elapsed < MEASURE_AT_LEAST_MS {
            return None;
        }
        // Whoever closes it measures it, once.
        self.since
            .compare_exchange(since, NOT_MEASURING, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        let capacity = self.capacity_for(count as f64 * 1000.0 / elapsed as f64);
        // The time first, the capacity with Release after it: a retry that
        // reads this capacity reads its time too, and never takes a fresh
        // capacity for one that has fallen all the way.
        self.measured_at.store(now, Ordering::Relaxed);
        self.measured.store(capacity, Ordering::Release);
        Some(capacity)
    }

    /// The capacity now: the last measured one, falling in a straight line
    /// to the floor over the window after it was measured, since the
    /// successes it counted leave the window by then.
    fn capacity_now(&self) -> u64 {
        let measured = self.measured.load(Ordering::Acquire);
        if measured <= self.floor {
            return self.floor;
        }
        let age = self
            .now_ms()
            .saturating_sub(self.measured_at.load(Ordering::Relaxed));
        let left = GROWTH_WINDOW_MS.saturating_sub(age);
        if left == 0 {
            // Fallen all the way: later retries need not read the clock.
            let _ = self.measured.compare_exchange(
                measured,
                self.floor,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return self.floor;
        }
        // Below 2^51 thousandths times 10^4 ms: no overflow in 128 bits.
        let above =
            u128::from(measured - self.floor) * u128::from(left) / u128::from(GROWTH_WINDOW_MS);
        self.floor + u64::try_from(above).unwrap_or(u64::MAX)
    }

    /// The capacity, in thousandths, for `rate` first-try successes a second.
    fn capacity_for(&self, rate: f64) -> u64 {
        let capacity = rate * self.per_rate as f64;
        // `as` saturates, and NaN (impossible: the rate is finite) gives 0.
        (capacity as u64).clamp(self.floor, MAX_TOKENS * MILLI)
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
        self.decay();
        self.held() >= self.cost(cause)
    }

    #[inline]
    fn try_retry(&self, cause: Cause) -> bool {
        self.refill_now();
        self.withdraw(self.cost(cause))
    }

    #[inline]
    fn on_success(&self, last_retry: Option<Cause>) {
        match last_retry {
            None => {
                self.count_success();
                self.deposit(self.success_refund);
            }
            Some(cause) => self.deposit(self.cost(cause) + self.retried_success_refund),
        }
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("available", &(self.held() / MILLI))
            .field("capacity", &self.capacity())
            .field("retry_cost", &(self.retry_cost / MILLI))
            .field("timeout_cost", &(self.timeout_cost / MILLI))
            .field("throttled_cost", &(self.throttled_cost / MILLI))
            .field("success_refund", &(self.success_refund / MILLI))
            .field(
                "retried_success_refund",
                &(self.retried_success_refund / MILLI),
            )
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
    initial_tokens: Option<u64>,
    growth_share: Option<f64>,
    retry_cost: u64,
    timeout_cost: u64,
    throttled_cost: Option<u64>,
    success_refund: u64,
    retried_success_refund: u64,
    refill_per_second: u64,
}

impl Default for TokenBucketBuilder {
    fn default() -> Self {
        Self {
            capacity: 500,
            initial_tokens: None,
            growth_share: None,
            retry_cost: 5,
            timeout_cost: 10,
            throttled_cost: None,
            success_refund: 1,
            retried_success_refund: 0,
            refill_per_second: 0,
        }
    }
}

impl TokenBucketBuilder {
    /// Tokens in a full bucket (default 500), where it starts unless
    /// [`initial_tokens`](Self::initial_tokens) says otherwise: the reserve a
    /// cold burst of retries may spend at once. With a capacity that
    /// [grows with traffic](Self::grow_with_traffic), the least it holds.
    pub fn capacity(mut self, tokens: u64) -> Self {
        self.capacity = tokens;
        self
    }

    /// Tokens the bucket starts with (default: full), at most its capacity.
    /// A small start is what keeps a fleet safe: a reserve is spent by each
    /// process at the start of an outage, however many there are.
    pub fn initial_tokens(mut self, tokens: u64) -> Self {
        self.initial_tokens = Some(tokens);
        self
    }

    /// Lets the capacity grow with this bucket's own traffic, to hold
    /// `share` of the first-try successes of the last 10 s as retries
    /// (`0.1`: one retry for every ten), never below
    /// [`capacity`](Self::capacity). The rate is measured after retries
    /// (a measurement counts at least 8 successes over at least 1 s), so a
    /// service that needs none pays one more read per success. A capacity
    /// that shrinks gives up the tokens above it.
    pub fn grow_with_traffic(mut self, share: f64) -> Self {
        self.growth_share = Some(share);
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

    /// Tokens a success after retries puts back on top of the cost of the
    /// retry that led to it (default 0, as the AWS SDKs). With the
    /// [`fleet_safe`](TokenBucket::fleet_safe) settings, 1: every success
    /// earns a retry, first try or not, so a request that got through on
    /// its last attempt leaves the bucket as it found it.
    pub fn retried_success_refund(mut self, tokens: u64) -> Self {
        self.retried_success_refund = tokens;
        self
    }

    /// Tokens added every second whatever happens (default 0, none), so the
    /// bucket recovers even when no request succeeds.
    pub fn refill_per_second(mut self, tokens: u64) -> Self {
        self.refill_per_second = tokens;
        self
    }

    /// Checks every setting and builds the bucket.
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
            ("initial_tokens", self.initial_tokens.unwrap_or(0)),
            ("retry_cost", self.retry_cost),
            ("timeout_cost", self.timeout_cost),
            ("throttled_cost", throttled_cost),
            ("success_refund", self.success_refund),
            ("retried_success_refund", self.retried_success_refund),
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
        let initial = self.initial_tokens.unwrap_or(self.capacity);
        if initial > self.capacity {
            return Err(ConfigError::new(
                "initial_tokens",
                format!(
                    "{initial} tokens is more than the capacity of {}",
                    self.capacity
                ),
            ));
        }
        let growth = match self.growth_share {
            None => None,
            Some(share) if !(share > 0.0 && share <= 1.0) => {
                return Err(ConfigError::new(
                    "grow_with_traffic",
                    format!("the share must be within (0, 1], got {share}"),
                ))
            }
            Some(share) => Some(Growth::starting(
                self.capacity * MILLI,
                // Tokens of capacity per success a second: the share of a
                // window's successes, each worth a transient retry's cost.
                (share * (GROWTH_WINDOW_MS / 1000) as f64 * (self.retry_cost * MILLI) as f64)
                    as u64,
            )),
        };
        let refill = (self.refill_per_second > 0).then(|| Refill::starting(self.refill_per_second));
        Ok(TokenBucket {
            tokens: AtomicU64::new(initial * MILLI),
            capacity: AtomicU64::new(self.capacity * MILLI),
            retry_cost: self.retry_cost * MILLI,
            timeout_cost: self.timeout_cost * MILLI,
            throttled_cost: throttled_cost * MILLI,
            success_refund: self.success_refund * MILLI,
            retried_success_refund: self.retried_success_refund * MILLI,
            initial: initial * MILLI,
            refill,
            growth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_each_setting_in_whole_tokens() {
        let bucket = TokenBucket::builder()
            .capacity(20)
            .retry_cost(3)
            .timeout_cost(7)
            .throttled_cost(9)
            .success_refund(2)
            .retried_success_refund(5)
            .build()
            .unwrap();
        let shown = format!("{bucket:?}");
        for field in [
            "available: 20",
            "capacity: 20",
            "retry_cost: 3",
            "timeout_cost: 7",
            "throttled_cost: 9",
            "success_refund: 2",
            "retried_success_refund: 5",
        ] {
            assert!(shown.contains(field), "{field} in {shown}");
        }
    }

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
    fn threads_retrying_at_once_neither_make_nor_lose_a_token() {
        let bucket = TokenBucket::builder().capacity(1_000).build().unwrap();
        let granted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for round in 0..20_000 {
                        if bucket.try_retry(Cause::Transient) {
                            // Three of four retries end in success and give
                            // their cost back; the rest drain the bucket.
                            if round % 4 != 0 {
                                bucket.on_success(Some(Cause::Transient));
                            } else {
                                granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        let kept = granted.into_inner() * 5;
        assert_eq!(
            kept + bucket.available(),
            1_000,
            "every token spent or still there"
        );
    }

    /// A default bucket for two attempts grows its capacity with the
    /// traffic it measured, a fresh copy starts on its floor, and once the
    /// capacity falls back to the floor the bucket holds exactly the floor.
    #[tokio::test(start_paused = true)]
    async fn a_capacity_that_grows_then_falls_back_holds_exactly_its_floor() {
        let bucket = TokenBucket::fleet_safe(2);
        // 1,000 first-try successes a second: 1,000 retries.
        assert!(bucket.try_retry(Cause::Transient));
        for _ in 0..1024 {
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
            bucket.on_success(None);
        }
        assert_eq!(bucket.capacity(), 1000);
        assert_eq!(
            bucket.fresh().capacity(),
            1,
            "a fresh copy starts on its floor"
        );
        // The traffic falls to 1 a second: back to the floor, holding exactly
        // the floor.
        for _ in 0..1000 {
            bucket.on_success(None);
        }
        assert!(bucket.try_retry(Cause::Transient));
        for _ in 0..8 {
            tokio::time::advance(std::time::Duration::from_secs(1)).await;
            bucket.on_success(None);
        }
        assert_eq!(bucket.capacity(), 1);
        assert_eq!(bucket.available(), 1);
        // The whole floor pays one retry.
        assert!(bucket.try_retry(Cause::Timeout));
        assert_eq!(bucket.available(), 0);
        assert!(!bucket.try_retry(Cause::Transient));
    }

    #[test]
    fn a_success_without_retries_puts_back_the_refund_set() {
        let bucket = drained(TokenBucket::builder().success_refund(7));
        bucket.on_success(None);
        assert_eq!(bucket.available(), 7);
        bucket.on_success(Some(Cause::Transient));
        assert_eq!(bucket.available(), 7 + 10, "after a retry: its cost");
    }

    /// Weighing a retry at a capacity that has not fallen leaves a full
    /// bucket as it was.
    #[tokio::test(start_paused = true)]
    async fn weighing_a_retry_at_an_unchanged_capacity_leaves_a_full_bucket_full() {
        let bucket = TokenBucket::fleet_safe(3);
        bucket.on_success(None);
        assert!(bucket.would_allow(Cause::Transient));
        assert_eq!((bucket.capacity(), bucket.available()), (2, 2));
    }

    /// A refund that read the capacity before it fell, landing after the
    /// fall cut the tokens, gives up what it put above the new capacity: it
    /// does not come back when the capacity grows again.
    #[test]
    fn a_refund_that_read_a_capacity_since_fallen_gives_up_what_is_above_it() {
        let bucket = TokenBucket::builder().capacity(20).build().unwrap();
        bucket.resize(6 * MILLI);
        // `deposit`, when the fall comes between its read of the capacity
        // and its write.
        let read = 20 * MILLI;
        assert!(bucket.put(4 * MILLI, read));
        assert_eq!(bucket.available(), 6, "never above the capacity");
        bucket.recheck(read);
        bucket.resize(20 * MILLI);
        assert_eq!(bucket.available(), 6);
    }

    /// A bucket built without a refill has none to pay, so weighing a retry
    /// never reads the clock for one.
    #[test]
    fn a_bucket_without_a_refill_keeps_none_to_pay() {
        assert!(TokenBucket::new().refill.is_none());
        assert!(TokenBucket::fleet_safe(3).refill.is_none());
        let refilled = TokenBucket::builder().refill_per_second(1).build().unwrap();
        assert!(refilled.refill.is_some());
    }
}
