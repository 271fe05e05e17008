//! [`RatioBudget`]: retries as a fraction of recent first attempts (Finagle's
//! `RetryBudget`) or of recent successes (tower's `TpsBudget`).

use std::fmt;
use std::time::Duration;

use crate::budget::Budget;
use crate::decision::Cause;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

mod clock;

use clock::SlotClock;

/// The window is kept as this many slots; a record leaves the window when the
/// clock has gone once round the ring past it, so the window slides in steps
/// of a tenth of its length. Two under loom, which keeps model checking
/// tractable.
#[cfg(not(tower_backoff_loom))]
const SLOTS: usize = 10;
#[cfg(tower_backoff_loom)]
const SLOTS: usize = 2;

/// A snapshot packs the lap of the ring it was taken in (high bits) with the
/// running total it saw (low bits, modulo 2^36), so one compare-and-swap both
/// checks and retakes it. Laps repeat after 2^28 (8.5 years of 100 ms slots),
/// totals after 2^36 events: a window counts up to 2^35 events (34 billion).
const TOTAL_BITS: u32 = 36;
const TOTAL_MASK: u64 = (1 << TOTAL_BITS) - 1;
const LAP_MASK: u32 = (1 << (64 - TOTAL_BITS)) - 1;

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
/// Two running totals count every earning and every retry since the budget
/// was built. The window is a ring of ten slots, each holding the totals
/// as they stood when its tenth of the window began, so what the window
/// holds is the total now minus the total at the start of its oldest slot:
/// no sum over the ring. A snapshot carries the lap of the ring it was taken
/// in, so one left over from an earlier lap is known as such, and is retaken
/// by the first operation of its slot, before that operation counts. An
/// earning is one atomic add, a retry a compare-and-swap on the retry total,
/// so two retries can never both take the last place.
///
/// # Accuracy
/// Every operation reads `tokio::time::Instant` (so a paused test clock
/// drives the window) and counts in the slot the clock was in when its
/// thread read it: the bound is exact within each tenth of the window. When the clock
/// moves on between that read and the count (a thread preempted there), an
/// earning counts in the slot before, and leaves the window a tenth early,
/// which only refuses more; a retry is checked against the window its thread
/// read, and leaves a tenth early too: at most one extra retry per such
/// thread.
///
/// ```
/// use tower_backoff_core::budget::{Budget, RatioBudget};
/// use tower_backoff_core::Cause;
///
/// let budget = RatioBudget::builder().ratio(0.6).reserve(0).build()?;
/// for _ in 0..100 {
///     budget.on_first_attempt();
/// }
/// let allowed = (0..100).filter(|_| budget.try_retry(Cause::Transient)).count();
/// assert_eq!(allowed, 60);
/// # Ok::<_, tower_backoff_core::ConfigError>(())
/// ```
pub struct RatioBudget {
    totals: Totals,
    slots: [Slot; SLOTS],
    /// The reserve's retries, in units.
    reserve: i64,
    deposit: i64,
    cost: i64,
    earn: Earn,
    clock: SlotClock,
    window: Duration,
    ratio: f64,
    reserve_retries: u32,
}

/// What a [`RatioBudget`] earns its retries on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
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

/// Everything counted since the budget was built. The only words every
/// operation writes: on a cache line of their own, so the settings beside
/// them stay shared between cores.
#[repr(align(128))]
struct Totals {
    /// First attempts or successes, as the budget earns.
    earned: AtomicU64,
    retries: AtomicU64,
}

/// One tenth of the window: the totals when it began. Written once a lap.
struct Slot {
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
        self.available_at(self.clock.epoch())
    }

    pub(crate) fn available_at(&self, epoch: u64) -> u64 {
        let at = self.position(epoch);
        let retries = self.totals.retries.load(Ordering::Acquire);
        let units = self.room(self.window(at, retries));
        u64::try_from(units.max(0) / self.cost).unwrap_or(0)
    }

    fn position(&self, epoch: u64) -> Position {
        let slots = SLOTS as u64;
        Position {
            index: (epoch % slots) as usize,
            // Compared for equality only, so wrapping is harmless.
            lap: (epoch / slots) as u32 & LAP_MASK,
        }
    }

    /// Earnings and retries in the window ending at `at`, given the retry
    /// total. Read in this order: the retry total (by the caller), the earned
    /// total, the snapshots. A retry counted in `retries` was paid for by
    /// earnings made before it, so the earned total read after it holds them,
    /// and the snapshot of their slot is there to be read. A snapshot taken
    /// after a total was read is ahead of it: nothing of that window was in
    /// the total, and [`since`] counts nothing.
    fn window(&self, at: Position, retries: u64) -> (u64, u64) {
        let earned = self.totals.earned.load(Ordering::Acquire);
        let earned = since(earned, self.oldest_snapshot(at, |slot| &slot.earned));
        let retries = since(retries, self.oldest_snapshot(at, |slot| &slot.retries));
        (earned, retries)
    }

    /// The totals at the start of the window ending at `at`: the snapshot of
    /// its oldest slot that had an operation of this kind, or `None` if none
    /// had, so that nothing of this kind happened in the window. With steady
    /// traffic, the oldest slot has it: one load.
    fn oldest_snapshot(&self, at: Position, pick: impl Fn(&Slot) -> &AtomicU64) -> Option<u64> {
        let oldest = at.index + 1;
        let (index, lap) = if oldest == SLOTS {
            (0, at.lap)
        } else {
            (oldest, at.lap.wrapping_sub(1) & LAP_MASK)
        };
        let snapshot = pick(&self.slots[index]).load(Ordering::Acquire);
        if lap_of(snapshot) == lap {
            return Some(snapshot & TOTAL_MASK);
        }
        self.later_snapshot(at, pick)
    }

    /// [`oldest_snapshot`](Self::oldest_snapshot) past the oldest slot:
    /// the next slots in order, up to `at`'s own.
    fn later_snapshot(&self, at: Position, pick: impl Fn(&Slot) -> &AtomicU64) -> Option<u64> {
        (2..=SLOTS).find_map(|ahead| {
            let index = (at.index + ahead) % SLOTS;
            // Slots after `at.index` hold the lap before, up to it this lap.
            let lap = if index > at.index {
                at.lap.wrapping_sub(1) & LAP_MASK
            } else {
                at.lap
            };
            let snapshot = pick(&self.slots[index]).load(Ordering::Acquire);
            (lap_of(snapshot) == lap).then_some(snapshot & TOTAL_MASK)
        })
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
        start_slot(&self.slots[at.index].earned, &self.totals.earned, at.lap);
        // Relaxed: a retry paid by this earning publishes it with its own
        // compare-and-swap, and the snapshot was published by its own.
        self.totals.earned.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry at `epoch`, if the window allows it.
    pub(crate) fn withdraw_at(&self, epoch: u64) -> bool {
        let at = self.position(epoch);
        let total = &self.totals.retries;
        start_slot(&self.slots[at.index].retries, total, at.lap);
        let mut retries = total.load(Ordering::Acquire);
        loop {
            if self.room(self.window(at, retries)) < self.cost {
                return false;
            }
            // Retries racing meet here: one CAS wins the place, the others
            // see its count and check again, against a fresh window.
            match total.compare_exchange_weak(
                retries,
                retries + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => retries = actual,
            }
        }
    }
}

/// Makes sure the slot's snapshot is of this lap before anything is counted
/// in it: the first operation of a slot records the total it finds, and every
/// later one of the slot counts after it.
fn start_slot(snapshot: &AtomicU64, total: &AtomicU64, lap: u32) {
    let mut current = snapshot.load(Ordering::Acquire);
    while lap_of(current) != lap {
        // Read before the swap that publishes it: an operation that sees
        // this snapshot counts after it.
        let taken = pack(lap, total.load(Ordering::Acquire));
        match snapshot.compare_exchange_weak(current, taken, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// Events counted since a snapshot, modulo 2^36. A snapshot taken after the
/// total was read would come out negative: nothing then.
fn since(total: u64, snapshot: Option<u64>) -> u64 {
    let Some(snapshot) = snapshot else { return 0 };
    let count = total.wrapping_sub(snapshot) & TOTAL_MASK;
    if count > TOTAL_MASK / 2 {
        0
    } else {
        count
    }
}

fn pack(lap: u32, total: u64) -> u64 {
    (u64::from(lap) << TOTAL_BITS) | (total & TOTAL_MASK)
}

fn lap_of(snapshot: u64) -> u32 {
    (snapshot >> TOTAL_BITS) as u32
}

impl Default for RatioBudget {
    fn default() -> Self {
        RatioBudgetBuilder::default()
            .build()
            .expect("the defaults are valid")
    }
}

impl Budget for RatioBudget {
    fn balance(&self) -> Option<u64> {
        Some(self.available())
    }

    fn on_first_attempt(&self) {
        // A ratio of zero deposits nothing: skip the clock.
        if self.earn == Earn::FirstAttempts && self.deposit != 0 {
            self.deposit_at(self.clock.epoch());
        }
    }

    fn on_success(&self, _last_retry: Option<Cause>) {
        if self.earn == Earn::Successes && self.deposit != 0 {
            self.deposit_at(self.clock.epoch());
        }
    }

    fn would_allow(&self, _cause: Cause) -> bool {
        self.available() > 0
    }

    fn try_retry(&self, _cause: Cause) -> bool {
        self.withdraw_at(self.clock.epoch())
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
}

impl Default for RatioBudgetBuilder {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            ratio: 0.2,
            earn: Earn::FirstAttempts,
            reserve: 100,
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

        // Each slot starts as the snapshot of the lap before the first, when
        // the totals were zero: true, and read as the window's start until
        // the slot is first used.
        let before_first = pack(LAP_MASK, 0);
        Ok(RatioBudget {
            totals: Totals {
                earned: AtomicU64::new(0),
                retries: AtomicU64::new(0),
            },
            slots: std::array::from_fn(|_| Slot {
                earned: AtomicU64::new(before_first),
                retries: AtomicU64::new(before_first),
            }),
            reserve,
            deposit: deposit as i64,
            cost: cost as i64,
            earn: self.earn,
            clock: SlotClock::new(self.window / SLOTS as u32),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events_since_a_snapshot_and_none_for_a_snapshot_ahead() {
        assert_eq!(since(7, None), 0, "a slot never used");
        assert_eq!(since(7, Some(5)), 2);
        assert_eq!(since(3, Some(TOTAL_MASK)), 4, "across the wrap");
        assert_eq!(
            since(5, Some(7)),
            0,
            "a snapshot taken after the total was read"
        );
        assert_eq!(since(TOTAL_MASK / 2, Some(0)), TOTAL_MASK / 2);
        assert_eq!(since(TOTAL_MASK / 2 + 1, Some(0)), 0);
    }

    #[test]
    fn the_ratio_is_kept_as_its_smallest_fraction() {
        // 0.6 = 3/5: a first attempt deposits 3 units, a retry costs 5.
        let budget = RatioBudget::builder().ratio(0.6).build().unwrap();
        assert_eq!((budget.deposit, budget.cost), (3, 5));
        let budget = RatioBudget::builder().ratio(0.25).build().unwrap();
        assert_eq!((budget.deposit, budget.cost), (1, 4));
    }

    #[test]
    fn debug_shows_the_settings_and_what_is_available() {
        let budget = RatioBudget::builder()
            .ratio(0.5)
            .window(Duration::from_secs(10))
            .reserve(3)
            .build()
            .unwrap();
        assert_eq!(
            format!("{budget:?}"),
            "RatioBudget { window: 10s, ratio: 0.5, earn: FirstAttempts, reserve: 3, available: 3 }"
        );
    }
}
