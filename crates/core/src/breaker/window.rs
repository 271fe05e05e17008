//! The sliding window a closed breaker counts attempts in: a ring of
//! buckets, each one atomic word.
//!
//! A success, the happy path, is one relaxed add to a counter of successes
//! not yet placed in time, and reads no clock: a clock read would cost more
//! than the rest of the breaker together. The clock is read when a failure
//! comes (or the window is read): the successes counted since the last such
//! read are then spread evenly over the time since, into the buckets that
//! time covers, and those that fall out of the window are dropped. Uneven
//! traffic is placed a little off in time; a steady one is placed right.

use crate::sync::{AtomicU64, Ordering};

/// Buckets the window is cut into: it slides a tenth at a time.
pub(super) const BUCKETS: u64 = 10;

// One bucket: [stamp: 24 bits][failures: 20 bits][attempts: 20 bits]. The
// stamp is the bucket's number since the breaker was made (modulo 2^24,
// which with 1 s buckets wraps after 194 days: a bucket untouched for exactly
// that long would be read as current, once). Counts saturate at 2^20 - 1
// (a million attempts a bucket), which only caps the ratio's precision.
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const STAMP_BITS: u32 = 24;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;

/// Attempts and failures counted over the last window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) attempts: u64,
    pub(super) failures: u64,
}

pub(super) struct Window {
    buckets: [AtomicU64; BUCKETS as usize],
    bucket_ms: u64,
    // Successes counted since `placed_at`, not in a bucket yet.
    unplaced: AtomicU64,
    // When the successes counted before were last placed, in ms.
    placed_at: AtomicU64,
}

fn pack(stamp: u64, failures: u64, attempts: u64) -> u64 {
    (stamp & STAMP_MASK) << (2 * COUNT_BITS) | failures << COUNT_BITS | attempts
}

/// `successes × part / whole`, without overflow; 0 for an empty whole.
fn share_of(successes: u64, part: u64, whole: u64) -> u64 {
    let share = u128::from(successes) * u128::from(part);
    share
        .checked_div(u128::from(whole))
        .map_or(0, |share| u64::try_from(share).unwrap_or(successes))
}

fn stamp(bucket: u64) -> u64 {
    bucket >> (2 * COUNT_BITS)
}

fn failures_of(bucket: u64) -> u64 {
    (bucket >> COUNT_BITS) & COUNT_MAX
}

fn attempts_of(bucket: u64) -> u64 {
    bucket & COUNT_MAX
}

impl Window {
    /// A window of `BUCKETS` buckets of `bucket_ms` (at least 1) each.
    pub(super) fn new(bucket_ms: u64) -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            bucket_ms: bucket_ms.max(1),
            unplaced: AtomicU64::new(0),
            placed_at: AtomicU64::new(0),
        }
    }

    /// The span of one bucket, in milliseconds.
    pub(super) fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// Counts one success, without the time: see the module docs.
    #[inline]
    pub(super) fn success(&self) {
        self.unplaced.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failure at `now_ms`, after placing the successes before it.
    pub(super) fn failure(&self, now_ms: u64) {
        self.place(now_ms);
        self.add(self.number(now_ms), 1, 1);
    }

    /// Spreads the successes counted since they were last placed evenly over
    /// the time since, up to `now_ms`.
    pub(super) fn place(&self, now_ms: u64) {
        let since = self.placed_at.fetch_max(now_ms, Ordering::Relaxed);
        let successes = self.unplaced.swap(0, Ordering::Relaxed);
        if successes == 0 {
            return;
        }
        // Another thread placed up to a later time: ours go to now.
        let since = since.min(now_ms);
        let span = now_ms - since;
        // The start of the oldest bucket `counts` reads.
        let window_start = (now_ms / self.bucket_ms).saturating_sub(BUCKETS - 1) * self.bucket_ms;
        let mut placed = 0;
        let mut start = since.max(window_start);
        while span > 0 && start < now_ms {
            let number = start / self.bucket_ms;
            let end = ((number + 1) * self.bucket_ms).min(now_ms);
            let share = share_of(successes, end - start, span);
            if share > 0 {
                self.add(number & STAMP_MASK, 0, share);
            }
            placed += share;
            start = end;
        }
        // What rounding left, and all of it when no time passed, is now's;
        // what fell before the window is dropped.
        let before_window = share_of(successes, window_start.max(since) - since, span);
        let rest = successes - placed - before_window.min(successes - placed);
        if rest > 0 {
            self.add(self.number(now_ms), 0, rest);
        }
    }

    fn number(&self, now_ms: u64) -> u64 {
        (now_ms / self.bucket_ms) & STAMP_MASK
    }

    /// Adds `failures` and `attempts` to the bucket numbered `number`, unless
    /// the ring has moved past it.
    fn add(&self, number: u64, failures: u64, attempts: u64) {
        let slot = &self.buckets[(number % BUCKETS) as usize];
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let next = if stamp(current) == number {
                pack(
                    number,
                    (failures_of(current) + failures).min(COUNT_MAX),
                    (attempts_of(current) + attempts).min(COUNT_MAX),
                )
            } else if (number.wrapping_sub(stamp(current)) & STAMP_MASK) < STAMP_MASK / 2 {
                // The bucket last counted a window ago or more: start it over.
                pack(number, failures.min(COUNT_MAX), attempts.min(COUNT_MAX))
            } else {
                // It already counts a later time: the ring has moved on.
                return;
            };
            match slot.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// What the buckets of the window ending at `now_ms` counted.
    pub(super) fn counts(&self, now_ms: u64) -> Counts {
        let number = self.number(now_ms);
        let mut counts = Counts {
            attempts: 0,
            failures: 0,
        };
        for slot in &self.buckets {
            let bucket = slot.load(Ordering::Relaxed);
            let age = number.wrapping_sub(stamp(bucket)) & STAMP_MASK;
            if age < BUCKETS {
                counts.attempts += attempts_of(bucket);
                counts.failures += failures_of(bucket);
            }
        }
        counts
    }

    /// Forgets everything counted: a breaker that closes starts afresh, its
    /// failures before it opened forgiven.
    pub(super) fn clear(&self, now_ms: u64) {
        self.unplaced.store(0, Ordering::Relaxed);
        self.placed_at.fetch_max(now_ms, Ordering::Relaxed);
        for slot in &self.buckets {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(tower_backoff_loom)))]
mod tests {
    use super::*;

    fn counts(attempts: u64, failures: u64) -> Counts {
        Counts { attempts, failures }
    }

    #[test]
    fn counts_only_the_buckets_of_the_last_window() {
        let window = Window::new(1_000);
        window.failure(0);
        window.failure(9_999);
        assert_eq!(window.counts(9_999), counts(2, 2));
        // The first second's bucket slid out; the last one is still in.
        assert_eq!(window.counts(10_000), counts(1, 1));
        assert_eq!(window.counts(19_000), counts(0, 0));
    }

    #[test]
    fn successes_are_spread_evenly_over_the_time_since_they_were_last_placed() {
        let window = Window::new(1_000);
        for _ in 0..300 {
            window.success();
        }
        // 30 s of successes, placed at 30 s: the 9 whole seconds of the
        // window keep 9 thirtieths (the tenth bucket, 30 s on, just began).
        window.failure(30_000);
        assert_eq!(window.counts(30_000), counts(91, 1));
        for _ in 0..10 {
            window.success();
        }
        window.place(30_000);
        assert_eq!(
            window.counts(30_000),
            counts(101, 1),
            "no time passed: now's"
        );
    }

    #[test]
    fn successes_placed_after_a_long_quiet_spell_fall_mostly_out_of_the_window() {
        let window = Window::new(1_000);
        window.failure(0);
        for _ in 0..1_000 {
            window.success();
        }
        window.place(100_000);
        assert_eq!(window.counts(100_000), counts(90, 0), "9 s of 100");
    }

    #[test]
    fn a_bucket_reused_a_window_later_starts_over() {
        let window = Window::new(100);
        window.failure(0);
        window.failure(1_000);
        assert_eq!(window.counts(1_000), counts(1, 1));
    }

    #[test]
    fn counts_saturate_instead_of_spilling_into_the_stamp() {
        let window = Window::new(1_000);
        let slot = &window.buckets[0];
        slot.store(pack(0, COUNT_MAX, COUNT_MAX), Ordering::Relaxed);
        window.failure(0);
        assert_eq!(window.counts(0), counts(COUNT_MAX, COUNT_MAX));
    }

    #[test]
    fn clearing_forgets_everything() {
        let window = Window::new(1_000);
        window.failure(0);
        window.success();
        window.clear(0);
        window.place(0);
        assert_eq!(window.counts(0), counts(0, 0));
    }
}
