//! [`RatioBudget`]: retries as a fraction of recent first attempts (Finagle's
//! `RetryBudget`) or of recent successes (tower's `TpsBudget`).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::error::ConfigError;
use crate::policy::Cause;
use crate::sync::{AtomicU64, Ordering};

/// The window is kept as this many slots; a record leaves the window when the
/// clock has gone once round the ring past it, so the window slides in steps
/// of a tenth of its length.
const SLOTS: usize = 10;

/// A slot packs the lap of the ring it counts for (high half) with its count
/// (low half), so one compare-and-swap both checks and restarts it. Four
/// billion events in one slot (a tenth of the window) would be needed to
/// overflow a count.
const LAP_SHIFT: u32 = 32;
const COUNT_MASK: u64 = (1 << LAP_SHIFT) - 1;

/// The ratio is taken to a millionth, then kept as an exact fraction.
const PARTS_PER_MILLION: u64 = 1_000_000;

/// Allows retries up to a fraction of what was earned in a recent window,
/// plus a fixed reserve: Finagle's `RetryBudget` when it earns on first
/// attempts (the default), tower's `TpsBudget` when it earns on successes
/// ([`Earn::Successes`]).
///
/// Earning on first attempts, a ratio of 10% lets retries add at most 10% to
/// the load the service would see anyway, however many clients retry and for
/// however long the server is down. Earning on successes, a server that
/// answers nothing earns nothing, so a full outage gets no retries beyond the
/// reserve. Defaults: a 10 s window, 20%, earned on first attempts, and a
/// reserve of 100 retries.
///
/// # The bound
/// Within any window, retries ≤ `reserve + ratio × earned in that window`
/// (floored), exactly, one slot (a tenth of the window) at a time. The
/// reserve is not a rate: a cold burst can spend all of it at once, and it
/// comes back only as those retries leave the window, 0.9 to 1 window later.
/// So a full outage earning on successes gets the reserve once per window;
/// earning on first attempts, `ratio` of them on top.
///
/// Counting is exact, in integers: the ratio becomes a fraction
/// `deposit / cost` (60% is 3/5), each first attempt deposits `deposit` units,
/// each retry costs `cost`. With 100 first attempts in the window and 60%
/// allowed, exactly 60 retries pass.
///
/// # How it stays lock-free
/// The window is a ring of ten slots, each with two counters (earnings,
/// retries); a counter is one atomic word holding a count and the lap of the
/// ring it counts for, so a counter left over from an earlier lap reads as
/// zero and is restarted by the next write, with no sweeping. An earning is
/// one atomic add. A retry sums the window and takes its place with a
/// compare-and-swap on the current retry slot, so two retries can never both
/// take the last place. Both read the clock, `tokio::time::Instant`, so a
/// paused test clock drives the window.
///
/// The bound is exact within each tenth of the window. At the instant the
/// clock moves to the next slot, a retry on a thread that read the clock just
/// before, racing one that read it just after, is checked against its own
/// slot: at most one extra retry per such thread.
///
/// ```
/// use tower_backoff::budget::{Budget, RatioBudget};
/// use tower_backoff::Cause;
///
/// let budget = RatioBudget::builder().ratio(0.6).reserve(0).build()?;
/// for _ in 0..100 {
///     budget.on_first_attempt();
/// }
/// let allowed = (0..100).filter(|_| budget.try_retry(Cause::Transient)).count();
/// assert_eq!(allowed, 60);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
pub struct RatioBudget {
    slots: Box<[Slot]>,
    /// The reserve's retries, in units.
    reserve: i64,
    deposit: i64,
    cost: i64,
    earn: Earn,
    slot_nanos: u64,
    origin: Instant,
    window: Duration,
    ratio: f64,
    reserve_retries: u32,
}

/// What a [`RatioBudget`] earns its retries on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Earn {
    /// Every first attempt earns `ratio` retries, whether it succeeds or not
    /// (Finagle's `RetryBudget`): retries add at most `ratio` to the load,
    /// even while nothing succeeds.
    #[default]
    FirstAttempts,
    /// Every success earns `ratio` retries (tower's `TpsBudget`, reqwest's
    /// retry budget): while nothing succeeds, only the reserve is spent.
    Successes,
}

/// One tenth of the window. Both counts of a slot share a cache line: a
/// retry reads them together.
struct Slot {
    /// First attempts or successes, as the budget earns.
    earned: AtomicU64,
    retries: AtomicU64,
}

/// Where an epoch falls in the ring.
#[derive(Debug, Clone, Copy)]
struct Position {
    index: usize,
    lap: u32,
}

impl RatioBudget {
    /// A budget with the defaults: 20% of the first attempts in the last 10 s,
    /// plus a reserve of 100 retries.
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
        let at = self.position(epoch);
        let units = self.room(self.window(at, None));
        u64::try_from(units.max(0) / self.cost).unwrap_or(0)
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

    fn position(&self, epoch: u64) -> Position {
        let slots = self.slots.len() as u64;
        Position {
            index: (epoch % slots) as usize,
            // Laps wrap after 2^32 (13 years of 100 ms slots); compared for
            // equality only, so wrapping is harmless.
            lap: (epoch / slots) as u32,
        }
    }

    /// Earnings and retries in the window ending at `at`, leaving out
    /// the retries of slot `skip`. Slots up to `at.index` must be on `at.lap`,
    /// the ones after it on the lap before; anything else has left the window.
    fn window(&self, at: Position, skip: Option<usize>) -> (u64, u64) {
        let skip = skip.unwrap_or(usize::MAX);
        let (mut earned, mut retries) = (0u64, 0u64);
        // Branch-free, so the loads go out together.
        for (index, slot) in self.slots.iter().enumerate() {
            let lap = at.lap.wrapping_sub(u32::from(index > at.index));
            let earn = slot.earned.load(Ordering::Acquire);
            let retry = slot.retries.load(Ordering::Acquire);
            earned = earned.saturating_add(count_of(earn) * u64::from(lap_of(earn) == lap));
            retries = retries
                .saturating_add(count_of(retry) * u64::from(lap_of(retry) == lap && index != skip));
        }
        (earned, retries)
    }

    /// Units left once the retries are paid for. Saturating: no count,
    /// however absurd, can make it wrap or panic.
    fn room(&self, (earned, retries): (u64, u64)) -> i64 {
        let units = |count: u64, each: i64| {
            i64::try_from(count)
                .unwrap_or(i64::MAX)
                .saturating_mul(each)
        };
        self.reserve
            .saturating_add(units(earned, self.deposit))
            .saturating_sub(units(retries, self.cost))
    }

    /// Records an earning (a first attempt or a success) at `epoch`.
    pub(crate) fn deposit_at(&self, epoch: u64) {
        let at = self.position(epoch);
        let slot = &self.slots[at.index].earned;
        // Add first, look after: one trip of the cache line instead of a load
        // and then an add. A slot only ever moves on to later laps, so an add
        // into this lap's count (or a later one's, if this thread read the
        // clock long ago) is final.
        let previous = slot.fetch_add(1, Ordering::AcqRel);
        if !is_before(lap_of(previous), at.lap) {
            return;
        }
        // The slot still counted a lap that has left the window, and the add
        // went there: restart the slot at this lap, or, if another thread just
        // did, add again to its count.
        let mut current = previous + 1;
        loop {
            if !is_before(lap_of(current), at.lap) {
                slot.fetch_add(1, Ordering::AcqRel);
                return;
            }
            match slot.compare_exchange_weak(
                current,
                pack(at.lap, 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Takes one retry at `epoch`, if the window allows it.
    pub(crate) fn withdraw_at(&self, epoch: u64) -> bool {
        let at = self.position(epoch);
        let slot = &self.slots[at.index].retries;
        let mut current = slot.load(Ordering::Acquire);
        loop {
            // The room left by the other slots, read *after* this slot's
            // retries: a retry counted in `current` was paid for by earnings
            // made before it, and the acquire makes them visible here. Read
            // before, a pair (earn, retry) finishing on another thread in
            // between shows its retry without its earning, and a retry with
            // room would be refused. Earnings arriving later only add room.
            let room = self.room(self.window(at, Some(at.index)));
            let (taken, next) = if is_before(lap_of(current), at.lap) {
                (0, pack(at.lap, 1)) // Left from an earlier lap: start afresh.
            } else {
                (count_of(current), current + 1)
            };
            let taken = i64::try_from(taken).unwrap_or(i64::MAX);
            if room.saturating_sub(self.cost.saturating_mul(taken)) < self.cost {
                return false;
            }
            // Retries racing in this slot meet here: one CAS wins the place,
            // the others see its count and check again, against a fresh room.
            match slot.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

fn pack(lap: u32, count: u64) -> u64 {
    (u64::from(lap) << LAP_SHIFT) | count.min(COUNT_MASK)
}

fn lap_of(word: u64) -> u32 {
    (word >> LAP_SHIFT) as u32
}

fn count_of(word: u64) -> u64 {
    word & COUNT_MASK
}

/// Whether lap `a` comes before lap `b`, on the circle of wrapping laps.
fn is_before(a: u32, b: u32) -> bool {
    let behind = b.wrapping_sub(a);
    behind != 0 && behind <= u32::MAX / 2
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
        if self.earn == Earn::FirstAttempts && self.deposit != 0 {
            self.deposit_at(self.epoch());
        }
    }

    fn on_success(&self, _last_retry: Option<Cause>) {
        if self.earn == Earn::Successes && self.deposit != 0 {
            self.deposit_at(self.epoch());
        }
    }

    fn would_allow(&self, _cause: Cause) -> bool {
        self.available() > 0
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
            .field("earn", &self.earn)
            .field("reserve", &self.reserve_retries)
            .field("available", &self.available())
            .finish()
    }
}

/// Builds a [`RatioBudget`]; every setting is checked by [`build`](Self::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct RatioBudgetBuilder {
    window: Duration,
    ratio: f64,
    earn: Earn,
    reserve: u32,
    slots: usize,
}

impl Default for RatioBudgetBuilder {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            ratio: 0.2,
            earn: Earn::FirstAttempts,
            reserve: 100,
            slots: SLOTS,
        }
    }
}

impl RatioBudgetBuilder {
    /// How long an earning counts towards the retries it allows, and a retry
    /// against the budget (default 10 s, between 1 s and 1 hour).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Retries allowed per earning in the window (default 0.2, that is 20%),
    /// from 0 to 1000, to a millionth.
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// What earns retries: first attempts (the default) or successes.
    pub fn earn(mut self, earn: Earn) -> Self {
        self.earn = earn;
        self
    }

    /// Retries allowed within any window on top of the ratio (default 100),
    /// so a client sending few requests may still retry. A reserve, not a
    /// rate: a burst may spend it at once; it comes back as those retries
    /// leave the window.
    pub fn reserve(mut self, retries: u32) -> Self {
        self.reserve = retries;
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
    /// ratio that is not a number from 0 to 1000.
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

        // At most 2^32 retries of at most 10^6 units: no overflow.
        let reserve = i64::from(self.reserve) * cost as i64;

        let slots = self.slots.max(1);
        Ok(RatioBudget {
            slots: (0..slots)
                .map(|_| Slot {
                    earned: AtomicU64::new(0),
                    retries: AtomicU64::new(0),
                })
                .collect(),
            reserve,
            deposit: deposit as i64,
            cost: cost as i64,
            earn: self.earn,
            slot_nanos: (self.window.as_nanos() / slots as u128) as u64,
            origin: Instant::now(),
            window: self.window,
            ratio: self.ratio,
            reserve_retries: self.reserve,
        })
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
