//! Which slot of a [`RatioBudget`](super::RatioBudget)'s window the clock is
//! in, mostly for the price of a coarse clock read.

use std::cell::Cell;
// The budget's identity is no part of any model: std's atomic under loom too.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::runtime::RuntimeFlavor;
use tokio::time::Instant;

use super::coarse;

/// Slots of `slot_nanos` since `origin`, on tokio's clock, so a paused test
/// clock drives them.
///
/// Reading that clock would be most of what a budget operation costs (24
/// ns, and a budget operation needs one), and turning an instant into a
/// slot takes more instructions than reading it (a subtraction of timespecs
/// and a 64-bit division). So each thread remembers, for the last few
/// budgets it asked, the slot it found and where it starts and ends; and,
/// when tokio's clock was the real one and cannot be paused (outside any
/// runtime, or in a multi-thread one), until when the kernel's coarse clock
/// ([`coarse`], 7 ns a read) proves the real clock is still inside. Then the
/// answer is one coarse read and a comparison; within a tick or two of the
/// slot's end, or on a clock that is or may be paused, tokio's clock is read
/// and compared.
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
    /// While the coarse clock reads less than this, the real clock is in the
    /// slot. Zero when tokio's clock was paused or could be.
    coarse_until: u64,
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
        let place = self.id as usize % REMEMBERED;
        if let Some(found) = FOUND.with(|found| found[place].get()) {
            if found.clock == self.id {
                // Zero: this thread's clock may be paused, and tokio's is
                // read anyway; a coarse read would only add to it.
                if found.coarse_until != 0 && coarse::now() < found.coarse_until {
                    return found.epoch;
                }
                let now = Instant::now();
                if found.start <= now && now < found.end {
                    return found.epoch;
                }
            }
        }
        self.find(place)
    }

    #[inline(never)]
    fn find(&self, place: usize) -> u64 {
        // Coarse first: it is then behind the instant read after it.
        let coarse = coarse::now();
        let now = Instant::now();
        // Kept on the coarse clock only where tokio's clock is the real one
        // and stays so: only a current-thread runtime's clock can be paused,
        // now or later.
        let keep = !may_pause();

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
            // `coarse`, read before `now`, is behind it, and a later coarse
            // read is at most `lag` behind the real clock: while the coarse
            // clock reads less than `coarse + (end - now) - lag`, the real
            // clock is before `end`.
            let coarse_until = match coarse::lag() {
                Some(lag) if keep => {
                    let left = u64::try_from((end - now).as_nanos()).unwrap_or(u64::MAX);
                    coarse.saturating_add(left).saturating_sub(lag)
                }
                _ => 0,
            };
            let found = Found {
                clock: self.id,
                epoch,
                start,
                end,
                coarse_until,
            };
            FOUND.with(|remembered| remembered[place].set(Some(found)));
        }
        epoch
    }
}

/// Whether this thread's tokio clock could be paused: only a current-thread
/// runtime's can (`start_paused`, `tokio::time::pause`), so one is taken to.
fn may_pause() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() != RuntimeFlavor::MultiThread)
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
        assert_eq!(found.coarse_until, 0, "a paused clock is read every time");
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
            coarse_until: 0,
        };
        FOUND.with(|found| found[clock.id as usize % REMEMBERED].set(Some(ahead)));
        assert_eq!(clock.epoch(), 0);
    }

    /// Outside a runtime tokio's clock is the real one: the slot found is
    /// remembered until the coarse clock, a tick behind, may reach its end,
    /// and after the end the next slot is found.
    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn on_the_real_clock_the_coarse_clock_keeps_a_slot_until_its_end() {
        const SLOT: Duration = Duration::from_millis(20);
        let clock = SlotClock::new(SLOT);
        let epoch = clock.epoch();
        let found = remembered(&clock).expect("a slot is remembered");
        let lag = coarse::lag().expect("Linux has a coarse clock");
        let slot_nanos = SLOT.as_nanos() as u64;
        assert!(
            found.coarse_until > 0,
            "the real clock is kept on the coarse one"
        );
        assert!(
            found.coarse_until <= coarse::now() + slot_nanos - lag,
            "kept at most a slot, less the coarse clock's lag"
        );
        std::thread::sleep(found.end - Instant::now());
        assert!(clock.epoch() > epoch, "the slot ended");
    }

    /// A current-thread runtime's clock runs free until it is paused: then
    /// the next read follows the paused clock at once, however little real
    /// time has passed.
    #[tokio::test]
    async fn a_clock_paused_after_a_slot_was_found_moves_the_slot_at_once() {
        let clock = SlotClock::new(Duration::from_secs(1));
        assert_eq!(clock.epoch(), 0);
        let found = remembered(&clock).expect("a slot is remembered");
        assert_eq!(
            found.coarse_until, 0,
            "a current-thread clock may be paused"
        );
        tokio::time::pause();
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert_eq!(clock.epoch(), 2);
    }

    /// A multi-thread runtime's clock is never paused: the slot is kept on
    /// the coarse clock there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    async fn in_a_multi_thread_runtime_the_slot_is_kept_on_the_coarse_clock() {
        let clock = SlotClock::new(Duration::from_secs(1));
        assert_eq!(clock.epoch(), 0);
        let found = remembered(&clock).expect("a slot is remembered");
        assert!(found.coarse_until > 0);
    }

    /// Read after read across several slot ends, on the real clock: the
    /// slot answered is the one the clock was in at some instant of the call.
    #[test]
    fn on_the_real_clock_every_answer_is_the_slot_the_clock_is_in() {
        const SLOT: Duration = Duration::from_millis(20);
        let clock = SlotClock::new(SLOT);
        let slot_of = |at: Instant| ((at - clock.origin).as_nanos() / SLOT.as_nanos()) as u64;
        let mut answers = 0;
        while slot_of(Instant::now()) < 3 {
            let before = slot_of(Instant::now());
            let epoch = clock.epoch();
            let after = slot_of(Instant::now());
            assert!(
                (before..=after).contains(&epoch),
                "slot {epoch}, the clock was in {before} then {after}"
            );
            answers += 1;
        }
        assert!(answers > 1000, "{answers} answers");
    }

    /// Linux only: elsewhere no slot is ever remembered with a coarse
    /// limit (it is 0 without a coarse clock), so the planted one could not
    /// exist.
    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn a_remembered_slot_is_used_while_the_coarse_clock_is_before_its_limit() {
        // Planted, so that only the coarse comparison can answer 99.
        let clock = SlotClock::new(Duration::from_millis(100));
        let kept = Found {
            clock: clock.id,
            epoch: 99,
            start: clock.origin + Duration::from_secs(9),
            end: clock.origin + Duration::from_secs(10),
            coarse_until: u64::MAX,
        };
        FOUND.with(|found| found[clock.id as usize % REMEMBERED].set(Some(kept)));
        assert_eq!(clock.epoch(), 99);
    }

    /// The coarse limit is exclusive: a coarse read equal to it may be a
    /// real clock already at the slot's end, in the next slot.
    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn a_remembered_slot_is_not_used_once_the_coarse_clock_reaches_its_limit() {
        // Slots of an hour, the planted one hours ahead: only the coarse
        // comparison could answer 99, and the slot found is 0.
        let clock = SlotClock::new(Duration::from_secs(3600));
        loop {
            let limit = coarse::now();
            let reached = Found {
                clock: clock.id,
                epoch: 99,
                start: clock.origin + Duration::from_secs(9 * 3600),
                end: clock.origin + Duration::from_secs(10 * 3600),
                coarse_until: limit,
            };
            FOUND.with(|found| found[clock.id as usize % REMEMBERED].set(Some(reached)));
            assert_eq!(clock.epoch(), 0, "the coarse clock is at or past the limit");
            // A tick during the call read past the limit, not at it: again.
            if coarse::now() == limit {
                break;
            }
        }
    }
}
