//! Which slot of a [`RatioBudget`](super::RatioBudget)'s window the clock is
//! in.

use std::time::Duration;

use tokio::time::Instant;

/// Slots of `slot_nanos` since `origin`, on tokio's clock, so a paused test
/// clock drives them. Every call reads the clock: a slot is a tenth of a
/// window of at least a second, and reading it costs tens of nanoseconds.
pub(super) struct SlotClock {
    origin: Instant,
    slot_nanos: u64,
}

impl SlotClock {
    /// Slots of `slot` (at least a nanosecond) from now on.
    pub(super) fn new(slot: Duration) -> Self {
        Self {
            origin: Instant::now(),
            slot_nanos: u64::try_from(slot.as_nanos()).unwrap_or(u64::MAX).max(1),
        }
    }

    /// The slot the clock is in: slots since `origin`.
    pub(super) fn epoch(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        // u64 nanoseconds last 584 years, and dividing them is much cheaper
        // than `as_nanos()`'s u128.
        let nanos = elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()));
        nanos / self.slot_nanos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_slot_is_the_one_the_clock_is_in() {
        let clock = SlotClock::new(Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.epoch(), 2);
        // Still inside: the same slot; past its end: the next one.
        tokio::time::advance(Duration::from_millis(49)).await;
        assert_eq!(clock.epoch(), 2);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(clock.epoch(), 3);
    }

    /// A current-thread runtime's clock runs free until it is paused: then
    /// the next read follows the paused clock at once, however little real
    /// time has passed.
    #[tokio::test]
    async fn a_clock_paused_after_a_slot_was_found_moves_the_slot_at_once() {
        let clock = SlotClock::new(Duration::from_secs(1));
        assert_eq!(clock.epoch(), 0);
        tokio::time::pause();
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert_eq!(clock.epoch(), 2);
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
}
