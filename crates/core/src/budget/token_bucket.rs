//! [`TokenBucket`]: the retry quota of the AWS SDKs' standard mode.

use std::fmt;
use std::time::Duration;

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

/// The span of traffic a growing capacity is sized to.
const GROWTH_WINDOW_MS: u64 = 10_000;

/// How long a fleet-safe bucket waits with no retry asked before it holds its
/// floor again: a process that has been quiet this long is not part of an
/// outage that is still going on.
const FLEET_SAFE_QUIET: Duration = Duration::from_secs(600);

/// A retry budget that charges each retry tokens and refunds some on success,
/// as the AWS SDKs' standard retry mode does; with
/// [`fleet_safe`](Self::fleet_safe) settings, the layer's default.
///
/// A retry takes its cost out and is refused when the bucket holds less:
/// with [`new`](Self::new)'s settings 5 tokens, 10 after a
/// [timeout](Cause::Timeout); with the fleet-safe ones 1, whatever the
/// cause. A success puts back 1 token when no retry was needed, or the cost
/// of the retry that led to it. So while requests mostly succeed the bucket
/// stays full, and while nothing succeeds it only drains.
///
/// # The bound
/// The bucket starts full (unless [`initial_tokens`](TokenBucketBuilder::initial_tokens)
/// says otherwise): its capacity is a **reserve**, not a rate. A cold
/// burst may spend it at once, `capacity / cost` retries (100 transient or 50
/// timeout retries with [`new`](Self::new)'s settings), and after that
/// every retry is paid by a success or the refill. Over any run, the tokens
/// retries took are at most `capacity + refunds + refill × seconds`: in a full outage, with no refill,
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
/// # extern crate tower_backoff_core as tower_backoff;
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
    /// The most `tokens` holds, in thousandths: a word of its own, as two
    /// amounts of up to 2^50 thousandths do not fit in one.
    capacity: AtomicU64,
    retry_cost: u64,
    timeout_cost: u64,
    throttled_cost: u64,
    success_refund: u64,
    retried_success_refund: u64,
    /// Thousandths of a token each first attempt puts in, whatever its
    /// outcome.
    request_deposit: u64,
    /// Thousandths of a token it started with: what a [fresh](Self::fresh)
    /// copy starts with.
    initial: u64,
    /// What the refill, the growth and the quiet restore count their
    /// milliseconds from: one clock read serves them all.
    origin: Instant,
    refill: Option<Refill>,
    growth: Option<Growth>,
    quiet: Option<Quiet>,
}

/// How a capacity that grows with traffic is measured: every first-try
/// success is counted, and every [`MEASURE_EVERY`]th reads the clock; once a
/// measurement spans a second or more, its rate sets the capacity and a new
/// one begins. So a busy layer's capacity follows its traffic whether or not
/// it has retried lately, and the happy path reads the clock once in
/// [`MEASURE_EVERY`] successes.
///
/// A retry weighed a second or more after the last measurement closes the
/// open one with the successes it counted: so the capacity follows traffic
/// down as soon as failures ask for retries, and a capacity grown in a busy
/// hour is not there for the outage that follows a quiet one.
struct Growth {
    /// The capacity however little traffic there is, in thousandths.
    floor: u64,
    /// Thousandths of a token of capacity per first-try success per second.
    per_rate: u64,
    /// The millisecond after the bucket's origin at which the open
    /// measurement began.
    since: AtomicU64,
    /// First-try successes the open measurement has counted.
    successes: AtomicU64,
}

/// A first-try success in this many reads the clock: often enough to close
/// a measurement within a few milliseconds of its second at 1,000 requests a
/// second, rarely enough to cost the happy path nothing it can feel.
const MEASURE_EVERY: u64 = 16;

/// Shortest span a measurement covers, in milliseconds: a burst is not a
/// rate.
const MEASURE_AT_LEAST_MS: u64 = 1_000;

/// When a bucket that went quiet holds its floor again: after `after_ms`
/// with no retry asked for, the first one asked finds at least the floor.
/// Only the retry path reads its clock.
struct Quiet {
    after_ms: u64,
    /// The millisecond after the bucket's origin at which a retry was last
    /// asked for.
    last_asked: AtomicU64,
}

struct Refill {
    /// Thousandths of a token per millisecond, which is tokens per second.
    per_ms: u64,
    /// Milliseconds after the bucket's origin up to which the refill has
    /// been added. Only
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
    /// one, a retried one its cost too; the capacity grows to a tenth of
    /// 10 s of first-try successes at the rate measured over the last
    /// second or more, falling with it; and after 10 minutes with no retry
    /// asked for, it holds one request's retries again. See [the module docs](super#the-default) for
    /// why and what it bounds.
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
            .restore_after_quiet(FLEET_SAFE_QUIET)
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
            request_deposit: self.request_deposit,
            initial: self.initial,
            origin: Instant::now(),
            refill: self.refill.as_ref().map(|r| Refill::starting(r.per_ms)),
            growth: self
                .growth
                .as_ref()
                .map(|g| Growth::starting(g.floor, g.per_rate)),
            quiet: self.quiet.as_ref().map(|q| Quiet::starting(q.after_ms)),
        }
    }

    /// Whether first attempts put tokens in: only then must the layer tell
    /// the bucket of each call.
    pub(crate) fn earns_on_requests(&self) -> bool {
        self.request_deposit != 0
    }

    /// Whole tokens in the bucket now.
    pub fn available(&self) -> u64 {
        if let Some(now) = self.now_ms() {
            self.refill_to(now);
        }
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
        // One location, read-modify-write: the compare-and-swap alone makes
        // it exact.
        self.tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                tokens.checked_sub(amount)
            })
            .is_ok()
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

    /// A first attempt succeeded: counted by the measurement of a capacity
    /// that grows with traffic.
    #[inline]
    fn count_success(&self) {
        if let Some(growth) = &self.growth {
            let count = growth
                .successes
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            // The clock is read for one success in `MEASURE_EVERY`.
            if count.is_multiple_of(MEASURE_EVERY) {
                if let Some(capacity) = growth.close(millis_since(self.origin), count) {
                    self.resize(capacity);
                }
            }
        }
    }

    /// Closes a measurement of a growing capacity that the successes left
    /// open for a second or more, so that an outage (failures, no
    /// successes) brings the capacity down within a second or two. Asked
    /// only when a retry is weighed, so the happy path never reads the
    /// clock for it.
    fn decay(&self, now_ms: u64) {
        if let Some(growth) = &self.growth {
            let count = growth.successes.load(Ordering::Relaxed);
            if let Some(capacity) = growth.close(now_ms, count) {
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

    /// A retry is asked for at `now_ms`: a bucket that has been quiet long
    /// enough holds what it started with again.
    fn wake(&self, now_ms: u64) {
        if let Some(quiet) = &self.quiet {
            if quiet.ended_at(now_ms) {
                let floor = self.initial.min(self.capacity.load(Ordering::Relaxed));
                self.tokens.fetch_max(floor, Ordering::Relaxed);
            }
        }
    }

    /// Milliseconds since the bucket was built, read only by a bucket that
    /// keeps time (a refill, a growing capacity, a quiet restore): an AWS
    /// standard bucket never reads the clock.
    fn now_ms(&self) -> Option<u64> {
        let keeps_time = self.refill.is_some() || self.growth.is_some() || self.quiet.is_some();
        keeps_time.then(|| millis_since(self.origin))
    }

    /// A retry is weighed or sent: what time does to the bucket, from one
    /// clock read.
    fn catch_up(&self) {
        if let Some(now) = self.now_ms() {
            self.wake(now);
            self.refill_to(now);
            self.decay(now);
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
            since: AtomicU64::new(0),
            successes: AtomicU64::new(0),
        }
    }

    /// Closes the open measurement at `now` with `count` successes if it
    /// has spanned a second or more: the capacity their rate gives.
    fn close(&self, now: u64, count: u64) -> Option<u64> {
        let since = self.since.load(Ordering::Relaxed);
        let elapsed = now.saturating_sub(since);
        if elapsed < MEASURE_AT_LEAST_MS {
            return None;
        }
        // Whoever moves the start measures, once; successes counted since
        // this one's are the next measurement's.
        self.since
            .compare_exchange(since, now, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        self.successes.fetch_sub(count, Ordering::Relaxed);
        Some(self.capacity_for(count as f64 * 1000.0 / elapsed as f64))
    }

    /// The capacity, in thousandths, for `rate` first-try successes a second.
    fn capacity_for(&self, rate: f64) -> u64 {
        let capacity = rate * self.per_rate as f64;
        // `as` saturates, and NaN (impossible: the rate is finite) gives 0.
        (capacity as u64).clamp(self.floor, MAX_TOKENS * MILLI)
    }
}

impl Quiet {
    fn starting(after_ms: u64) -> Self {
        Self {
            after_ms,
            last_asked: AtomicU64::new(0),
        }
    }

    /// A retry is asked for at `now`: whether none was for `after_ms` before
    /// it.
    fn ended_at(&self, now: u64) -> bool {
        let last = self.last_asked.swap(now, Ordering::Relaxed);
        now.saturating_sub(last) >= self.after_ms
    }
}

/// Milliseconds since `origin`, saturating.
fn millis_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
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

    fn on_first_attempt(&self) {
        if self.request_deposit != 0 {
            self.deposit(self.request_deposit);
        }
    }

    fn would_allow(&self, cause: Cause) -> bool {
        self.catch_up();
        self.held() >= self.cost(cause)
    }

    #[inline]
    fn try_retry(&self, cause: Cause) -> bool {
        self.catch_up();
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
            .field("request_deposit", &(self.request_deposit / MILLI))
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
    request_deposit: u64,
    refill_per_second: u64,
    restore_after_quiet: Option<Duration>,
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
            request_deposit: 0,
            refill_per_second: 0,
            restore_after_quiet: None,
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
    /// [`capacity`](Self::capacity). Every first-try success is counted
    /// (one atomic increment) and one in 16 reads the clock; a measurement
    /// covers at least 1 s, and a retry weighed after that closes it too,
    /// so the capacity falls with traffic as soon as failures come. A
    /// capacity that shrinks gives up the tokens above it.
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

    /// Tokens every first attempt puts in as it goes out, whatever its
    /// outcome (default 0): Finagle's `RetryBudget`, which earns on
    /// requests rather than on successes. Combine with
    /// [`success_refund(0)`](Self::success_refund) for a budget of a share
    /// of requests: `retry_cost(5)` and `request_deposit(1)` allow retries
    /// of up to a fifth of requests, beside the retries whose success
    /// gives their cost back.
    pub fn request_deposit(mut self, tokens: u64) -> Self {
        self.request_deposit = tokens;
        self
    }

    /// After `quiet` with no retry asked for, the next retry asked finds the
    /// bucket holding at least its [`initial_tokens`](Self::initial_tokens)
    /// again: a process whose last request failed for good gets its
    /// retries back once it has been quiet, without a refill that would
    /// also pay retries during an outage that goes on (a failing request
    /// asks for a retry, so an outage is never quiet). Default: never; the
    /// [`fleet_safe`](TokenBucket::fleet_safe) settings, 10 minutes. Only
    /// the retry path reads the clock for it.
    pub fn restore_after_quiet(mut self, quiet: Duration) -> Self {
        self.restore_after_quiet = Some(quiet);
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
            ("request_deposit", self.request_deposit),
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
        let quiet = self
            .restore_after_quiet
            .map(|quiet| Quiet::starting(u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX)));
        Ok(TokenBucket {
            tokens: AtomicU64::new(initial * MILLI),
            capacity: AtomicU64::new(self.capacity * MILLI),
            retry_cost: self.retry_cost * MILLI,
            timeout_cost: self.timeout_cost * MILLI,
            throttled_cost: throttled_cost * MILLI,
            success_refund: self.success_refund * MILLI,
            retried_success_refund: self.retried_success_refund * MILLI,
            request_deposit: self.request_deposit * MILLI,
            initial: initial * MILLI,
            origin: Instant::now(),
            refill,
            growth,
            quiet,
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
    /// traffic it measures, no retry needed; a fresh copy starts on its
    /// floor; and once a second has passed with no success, a retry weighed
    /// brings the capacity back to the floor, the bucket holding exactly
    /// the floor.
    #[tokio::test(start_paused = true)]
    async fn a_capacity_that_grows_then_falls_back_holds_exactly_its_floor() {
        let bucket = TokenBucket::fleet_safe(2);
        // 1,000 first-try successes a second, for two measurements of 1,008
        // ms (each closes at a multiple of 16): a capacity of 1,000 retries,
        // filled by the successes after it grew.
        for _ in 0..2016 {
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
            bucket.on_success(None);
        }
        assert_eq!(bucket.capacity(), 1000);
        assert_eq!(bucket.available(), 1000, "each success earned one");
        assert_eq!(
            bucket.fresh().capacity(),
            1,
            "a fresh copy starts on its floor"
        );
        // Within the second after a measurement, no retry closes another.
        tokio::time::advance(std::time::Duration::from_millis(999)).await;
        assert!(bucket.would_allow(Cause::Transient));
        assert_eq!(bucket.capacity(), 1000);
        // A second of no success, then a retry weighed: back on the floor.
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert!(bucket.would_allow(Cause::Transient));
        assert_eq!(bucket.capacity(), 1);
        assert_eq!(bucket.available(), 1);
        // The whole floor pays one retry.
        assert!(bucket.try_retry(Cause::Timeout));
        assert_eq!(bucket.available(), 0);
        assert!(!bucket.try_retry(Cause::Transient));
    }

    /// Successes at one a second measure a rate that gives less than the
    /// floor: the capacity stays on it.
    #[tokio::test(start_paused = true)]
    async fn slow_traffic_keeps_the_capacity_on_its_floor() {
        let bucket = TokenBucket::fleet_safe(3);
        for _ in 0..64 {
            tokio::time::advance(std::time::Duration::from_secs(1)).await;
            bucket.on_success(None);
        }
        assert_eq!(bucket.capacity(), 2);
    }

    /// A bucket spent by a request that failed for good holds its
    /// initial tokens again once no retry was asked for the quiet span, and
    /// not a millisecond before.
    #[tokio::test(start_paused = true)]
    async fn a_bucket_quiet_for_its_span_holds_its_initial_tokens_again() {
        let bucket = TokenBucket::builder()
            .capacity(4)
            .initial_tokens(2)
            .retry_cost(1)
            .timeout_cost(1)
            .restore_after_quiet(std::time::Duration::from_secs(600))
            .build()
            .unwrap();
        assert!(bucket.would_allow(Cause::Transient));
        assert!(bucket.try_retry(Cause::Transient));
        assert!(bucket.try_retry(Cause::Transient));
        assert!(!bucket.would_allow(Cause::Transient));
        tokio::time::advance(std::time::Duration::from_millis(599_999)).await;
        assert!(!bucket.would_allow(Cause::Transient), "not quiet yet");
        tokio::time::advance(std::time::Duration::from_secs(600)).await;
        assert!(bucket.would_allow(Cause::Transient));
        assert_eq!(
            bucket.available(),
            2,
            "its initial tokens, not its capacity"
        );
        // A fresh copy (a host of a per-host stack) restores after its own
        // quiet span.
        let fresh = bucket.fresh();
        assert!(fresh.try_retry(Cause::Transient));
        assert!(fresh.try_retry(Cause::Transient));
        assert!(!fresh.would_allow(Cause::Transient));
        tokio::time::advance(std::time::Duration::from_secs(600)).await;
        assert!(fresh.would_allow(Cause::Transient));
        // Asked every second (an outage goes on), it is never quiet.
        assert!(bucket.try_retry(Cause::Transient));
        assert!(bucket.try_retry(Cause::Transient));
        for _ in 0..1200 {
            tokio::time::advance(std::time::Duration::from_secs(1)).await;
            assert!(!bucket.would_allow(Cause::Transient));
        }
    }

    /// A deposit per request earns a share of requests as retries, whatever
    /// their outcome; a bucket without one earns nothing from a first
    /// attempt.
    #[test]
    fn a_request_deposit_earns_retries_on_first_attempts() {
        let bucket = drained(TokenBucket::builder().request_deposit(2));
        assert!(bucket.earns_on_requests());
        for _ in 0..5 {
            bucket.on_first_attempt();
        }
        assert_eq!(bucket.available(), 10);
        let plain = drained(TokenBucket::builder());
        assert!(!plain.earns_on_requests());
        plain.on_first_attempt();
        assert_eq!(plain.available(), 0);
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
