//! Which slot of a [`RatioBudget`](super::RatioBudget)'s window the clock is
//! in, at the price of a clock read.

use std::cell::Cell;
// The budget's identity is no part of any model: std's atomic under loom too.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Slots of `slot_nanos` since `origin`, on tokio's clock, so a paused test
/// clock drives them.
///
/// Turning an instant into a slot takes more instructions than reading the
/// clock: a subtraction of timespecs and a 64-bit division (about 70 against
/// 40). So each thread remembers,
/// for the last few budgets it asked, the slot it found and the instants it
/// starts and ends at: while the clock is still inside, the answer is two
/// comparisons.
pub(super) struct SlotClock {
    /// Tells budgets apart in the threads' memory: never reused, unlike an
    /// address.
    id: u64,
    origin: Instant,
    slot_nanos: u64,
}

/// A slot a thread found, and where it lies.
#[derive(Clone, Copy)]
struct Found {
    clock: u64,
    epoch: u64,
    start: Instant,
    end: Instant,
}

/// Budgets a thread keeps a slot for at once, each in the place its id picks:
/// enough for the few budgets a thread serves without evicting each other.
const REMEMBERED: usize = 4;

thread_local! {
    static FOUND: [Cell<Option<Found>>; REMEMBERED] =
        const { [const { Cell::new(None) }; REMEMBERED] };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl SlotClock {
    /// Slots of `slot` (at least a nanosecond) from now on.
    pub(super) fn new(slot: Duration) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            origin: Instant::now(),
            slot_nanos: u64::try_from(slot.as_nanos()).unwrap_or(u64::MAX).max(1),
        }
    }

    /// The slot the clock is in: slots since `origin`.
    #[inline]
    pub(super) fn epoch(&self) -> u64 {
        let now = Instant::now();
        let place = self.id as usize % REMEMBERED;
        if let Some(found) = FOUND.with(|found| found[place].get()) {
            if found.clock == self.id && found.start <= now && now < found.end {
                return found.epoch;
            }
        }
        self.find(now, place)
    }

    #[inline(never)]
    fn find(&self, now: Instant, place: usize) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        // u64 nanoseconds last 584 years, and dividing them is much cheaper
        // than `as_nanos()`'s u128.
        let nanos = elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()));
        let epoch = nanos / self.slot_nanos;
        // `epoch * slot_nanos <= nanos`: no overflow. Past the end of time
        // there is nothing to remember.
        let start = self
            .origin
            .checked_add(Duration::from_nanos(epoch * self.slot_nanos));
        let end = start.and_then(|start| start.checked_add(Duration::from_nanos(self.slot_nanos)));
        if let (Some(start), Some(end)) = (start, end) {
            let found = Found {
                clock: self.id,
                epoch,
                start,
                end,
            };
            FOUND.with(|remembered| remembered[place].set(Some(found)));
        }
        epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remembered(clock: &SlotClock) -> Option<Found> {
        FOUND.with(|found| found[clock.id as usize % REMEMBERED].get())
    }

    #[tokio::test(start_paused = true)]
    async fn the_slot_remembered_is_the_one_the_clock_is_in() {
        let clock = SlotClock::new(Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.epoch(), 2);
        let found = remembered(&clock).expect("a slot is remembered");
        assert_eq!(found.epoch, 2);
        assert_eq!(found.start, clock.origin + Duration::from_millis(200));
        assert_eq!(found.end, clock.origin + Duration::from_millis(300));
        // Still inside: the same slot; past its end: the next one.
        tokio::time::advance(Duration::from_millis(49)).await;
        assert_eq!(clock.epoch(), 2);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(clock.epoch(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_remembered_slot_the_clock_is_not_in_yet_is_not_used() {
        // A clock behind the remembered slot (another runtime's paused
        // clock, say) finds its own slot.
        let clock = SlotClock::new(Duration::from_millis(100));
        let ahead = Found {
            clock: clock.id,
            epoch: 99,
            start: clock.origin + Duration::from_secs(9),
            end: clock.origin + Duration::from_secs(10),
        };
        FOUND.with(|found| found[clock.id as usize % REMEMBERED].set(Some(ahead)));
        assert_eq!(clock.epoch(), 0);
    }
}
