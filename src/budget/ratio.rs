//! [`RatioBudget`]: retries as a fraction of recent requests, as Finagle's
//! `RetryBudget`.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::error::ConfigError;
use crate::policy::Cause;
use crate::sync::{AtomicI64, AtomicU64, Ordering};

/// The window is kept as this many slots; a record leaves the window when its
/// slot is reused, so the window slides in steps of a tenth of its length.
const SLOTS: usize = 10;

/// A slot packs the window lap it counts for (high half) with its count (low
/// half), so one compare-and-swap both checks and resets it.
const LAP_SHIFT: u32 = 32;
const COUNT_MASK: u64 = (1 << LAP_SHIFT) - 1;

/// The ratio is taken to a millionth, then kept as an exact fraction.
const PARTS_PER_MILLION: u64 = 1_000_000;

/// Allows retries up to a fraction of the first attempts seen in a recent
/// window, plus a small floor of retries per second, as Finagle's
/// `RetryBudget` does.
///
/// With a ratio of 10%, retries can add at most 10% to the load the service
/// would see anyway, however many clients retry and for however long the
/// server is down; the floor lets a client that sends few requests still
/// retry a little. Defaults: a 10 s window, 20%, and 10 retries per second.
///
/// Counting is exact, in integers: the ratio becomes a fraction
/// `deposit / cost` (60% is 3/5), each first attempt deposits `deposit` units,
/// each retry costs `cost`. With 100 first attempts in the window and 60%
/// allowed, exactly 60 retries pass.
///
/// # How it stays lock-free
/// The window is a ring of ten slots per kind of event (first attempts,
/// retries), each one atomic word holding a count and the lap of the window
/// it counts for. The decision reads one atomic balance, which records add to
/// and a compare-and-swap takes retries from, so two threads can never spend
/// the same unit. When the clock moves into a new slot, whichever threads see
/// it first reset the slots that left the window, each reset being one
/// compare-and-swap that hands back the count it cleared, so every record
/// leaves the balance exactly once. The clock is `tokio::time::Instant`, so a
/// paused test clock drives the window.
///
/// ```
/// use tower_backoff::budget::{Budget, RatioBudget};
/// use tower_backoff::Cause;
///
/// let budget = RatioBudget::builder().ratio(0.6).min_per_second(0).build()?;
/// for _ in 0..100 {
///     budget.on_first_attempt();
/// }
/// let allowed = (0..100).filter(|_| budget.try_retry(Cause::Transient)).count();
/// assert_eq!(allowed, 60);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
pub struct RatioBudget {
    /// Units still allowed: the reserve, plus `deposit` per first attempt in
    /// the window, minus `cost` per retry in the window. Retries are taken
    /// from it with a compare-and-swap, so it is what makes the bound exact.
    balance: AtomicI64,
    first_attempts: Box<[AtomicU64]>,
    retries: Box<[AtomicU64]>,
    /// Every slot older than this epoch has been reset.
    swept: AtomicU64,
    deposit: i64,
    cost: i64,
    slot_nanos: u64,
    origin: Instant,
    window: Duration,
    ratio: f64,
    min_per_second: u32,
}

impl RatioBudget {
    /// A budget with the defaults: 20% of the first attempts in the last 10 s,
    /// plus 10 retries per second.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder starting from the defaults.
    pub fn builder() -> RatioBudgetBuilder {
        RatioBudgetBuilder::default()
    }

    /// How many retries would be allowed now.
    pub fn available(&self) -> u64 {
        self.available_at(self.epoch())
    }

    pub(crate) fn available_at(&self, epoch: u64) -> u64 {
        self.advance(epoch);
        u64::try_from(self.balance.load(Ordering::Acquire).max(0) / self.cost).unwrap_or(0)
    }

    /// The balance, and what the slots say it should be: the reserve plus
    /// every record still held. Equal whenever no operation is midway.
    #[cfg(all(test, tower_backoff_loom))]
    pub(crate) fn ledger(&self, reserve: i64) -> (i64, i64) {
        let held = |slots: &[AtomicU64], per_event: i64| -> i64 {
            slots
                .iter()
                .map(|slot| units(slot.load(Ordering::Acquire) & COUNT_MASK, per_event))
                .sum()
        };
        let expected =
            reserve + held(&self.first_attempts, self.deposit) - held(&self.retries, self.cost);
        (self.balance.load(Ordering::Acquire), expected)
    }

    /// The slot the clock is in: slots since the budget was built.
    fn epoch(&self) -> u64 {
        let elapsed = self.origin.elapsed();
        // u64 nanoseconds last 584 years, and dividing them is much cheaper
        // than `as_nanos()`'s u128.
        let nanos = elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()));
        nanos / self.slot_nanos
    }

    fn slot(&self, epoch: u64) -> usize {
        (epoch % self.first_attempts.len() as u64) as usize
    }

    /// Records a first attempt at `epoch`.
    pub(crate) fn deposit_at(&self, epoch: u64) {
        self.advance(epoch);
        // `advance` left this slot on `epoch`'s lap or a later one, so the
        // count goes to a slot that leaves the window no earlier than it should.
        self.first_attempts[self.slot(epoch)].fetch_add(1, Ordering::AcqRel);
        self.balance.fetch_add(self.deposit, Ordering::AcqRel);
    }

    /// Takes one retry at `epoch`, if the window allows it.
    pub(crate) fn withdraw_at(&self, epoch: u64) -> bool {
        self.advance(epoch);
        let cost = self.cost;
        let allowed = self
            .balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |units| {
                (units >= cost).then(|| units - cost)
            })
            .is_ok();
        if allowed {
            self.retries[self.slot(epoch)].fetch_add(1, Ordering::AcqRel);
        }
        allowed
    }

    /// Resets every slot that left the window by `epoch`, giving back to the
    /// balance what it held. Cheap when the clock is still in a swept slot: one
    /// load.
    fn advance(&self, epoch: u64) {
        if self.swept.load(Ordering::Acquire) >= epoch {
            return;
        }
        // Every thread that sees the clock move sweeps, instead of waiting for
        // one that might be descheduled; each reset is a compare-and-swap, so
        // a slot is reset once however many threads sweep it.
        let slots = self.first_attempts.len() as u64;
        for index in 0..slots {
            if epoch < index {
                break; // The first lap is still filling: nothing left yet.
            }
            // The newest epoch at or before `epoch` that lands in this slot
            // is in the window; its lap is the one the slot must count for.
            let lap = (epoch - index) / slots;
            let index = index as usize;
            if let Some(count) = reset_if_older(&self.first_attempts[index], lap) {
                self.balance
                    .fetch_sub(units(count, self.deposit), Ordering::AcqRel);
            }
            if let Some(count) = reset_if_older(&self.retries[index], lap) {
                self.balance
                    .fetch_add(units(count, self.cost), Ordering::AcqRel);
            }
        }
        // Published only after the resets, so a thread that sees it needs no
        // sweep and its records land after them.
        self.swept.fetch_max(epoch, Ordering::AcqRel);
    }
}

/// Moves `slot` to `lap` with a count of zero if it counts for an older lap,
/// and returns the count it held. A slot already on a later lap (this thread
/// was descheduled while the clock moved on) is left alone.
fn reset_if_older(slot: &AtomicU64, lap: u64) -> Option<u64> {
    let lap = lap as u32;
    let mut current = slot.load(Ordering::Acquire);
    loop {
        let slot_lap = (current >> LAP_SHIFT) as u32;
        // Laps wrap after 2^32 (13 years of 100 ms slots): compare on the circle.
        let behind = lap.wrapping_sub(slot_lap);
        if behind == 0 || behind > u32::MAX / 2 {
            return None;
        }
        match slot.compare_exchange_weak(
            current,
            u64::from(lap) << LAP_SHIFT,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(current & COUNT_MASK),
            Err(actual) => current = actual,
        }
    }
}

fn units(count: u64, per_event: i64) -> i64 {
    i64::try_from(count)
        .unwrap_or(i64::MAX)
        .saturating_mul(per_event)
}

impl Default for RatioBudget {
    fn default() -> Self {
        RatioBudgetBuilder::default()
            .build()
            .expect("the defaults are valid")
    }
}

impl Budget for RatioBudget {
    fn on_first_attempt(&self) {
        // A ratio of zero deposits nothing: skip the clock.
        if self.deposit != 0 {
            self.deposit_at(self.epoch());
        }
    }

    fn try_retry(&self, _cause: Cause) -> bool {
        self.withdraw_at(self.epoch())
    }
}

impl fmt::Debug for RatioBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RatioBudget")
            .field("window", &self.window)
            .field("ratio", &self.ratio)
            .field("min_per_second", &self.min_per_second)
            .field(
                "balance",
                &(self.balance.load(Ordering::Relaxed) / self.cost),
            )
            .finish()
    }
}

/// Builds a [`RatioBudget`]; every setting is checked by [`build`](Self::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct RatioBudgetBuilder {
    window: Duration,
    ratio: f64,
    min_per_second: u32,
    slots: usize,
}

impl Default for RatioBudgetBuilder {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            ratio: 0.2,
            min_per_second: 10,
            slots: SLOTS,
        }
    }
}

impl RatioBudgetBuilder {
    /// How long a first attempt counts towards the retries it allows, and a
    /// retry against the budget (default 10 s, between 1 s and 1 hour).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Retries allowed per first attempt in the window (default 0.2, that is
    /// 20%), from 0 to 1000, to a millionth.
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// Retries allowed per second of the window regardless of traffic
    /// (default 10), so a client sending few requests may still retry.
    pub fn min_per_second(mut self, retries: u32) -> Self {
        self.min_per_second = retries;
        self
    }

    /// Fewer slots make model checking tractable.
    #[cfg(all(test, tower_backoff_loom))]
    pub(crate) fn slots(mut self, slots: usize) -> Self {
        self.slots = slots;
        self
    }

    /// Checks every setting and builds the budget.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the setting: a window outside 1 s to 1 hour, a
    /// ratio that is not a number from 0 to 1000, or a floor so large it
    /// cannot be counted.
    pub fn build(self) -> Result<RatioBudget, ConfigError> {
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.window) {
            return Err(ConfigError::new(
                "window",
                format!("must be between 1 s and 1 hour, got {:?}", self.window),
            ));
        }
        if !(0.0..=1000.0).contains(&self.ratio) {
            return Err(ConfigError::new(
                "ratio",
                format!("must be a number from 0 to 1000, got {}", self.ratio),
            ));
        }
        // 0.6 becomes 600000/1000000, then 3/5: a first attempt deposits 3
        // units and a retry costs 5.
        let parts = (self.ratio * PARTS_PER_MILLION as f64).round() as u64;
        let divisor = gcd(parts, PARTS_PER_MILLION);
        let (deposit, cost) = (parts / divisor, PARTS_PER_MILLION / divisor);

        let window_ms = self.window.as_millis() as u64;
        let reserve = u64::from(self.min_per_second)
            .checked_mul(window_ms)
            .map(|floor| floor / 1000)
            .and_then(|retries| retries.checked_mul(cost))
            .and_then(|units| i64::try_from(units).ok())
            .ok_or_else(|| {
                ConfigError::new(
                    "min_per_second",
                    format!(
                        "{} retries per second over {:?} is too many to count",
                        self.min_per_second, self.window
                    ),
                )
            })?;

        let slots = self.slots.max(1);
        Ok(RatioBudget {
            balance: AtomicI64::new(reserve),
            first_attempts: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            retries: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            swept: AtomicU64::new(0),
            deposit: deposit as i64,
            cost: cost as i64,
            slot_nanos: (self.window.as_nanos() / slots as u128) as u64,
            origin: Instant::now(),
            window: self.window,
            ratio: self.ratio,
            min_per_second: self.min_per_second,
        })
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
