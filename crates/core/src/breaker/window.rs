//! The sliding window a closed breaker counts attempts in: a ring of
//! buckets, each one atomic word, so recording an outcome is one
//! compare-and-swap and reading the window ten loads.

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
}

fn pack(stamp: u64, failures: u64, attempts: u64) -> u64 {
    (stamp & STAMP_MASK) << (2 * COUNT_BITS) | failures << COUNT_BITS | attempts
}

fn stamp(bucket: u64) -> u64 {
    bucket >> (2 * COUNT_BITS)
}

fn failures(bucket: u64) -> u64 {
    (bucket >> COUNT_BITS) & COUNT_MAX
}

fn attempts(bucket: u64) -> u64 {
    bucket & COUNT_MAX
}

impl Window {
    /// A window of `BUCKETS` buckets of `bucket_ms` (at least 1) each.
    pub(super) fn new(bucket_ms: u64) -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            bucket_ms: bucket_ms.max(1),
        }
    }

    fn number(&self, now_ms: u64) -> u64 {
        (now_ms / self.bucket_ms) & STAMP_MASK
    }

    /// Counts one attempt, a failure or not, at `now_ms`.
    #[inline]
    pub(super) fn record(&self, now_ms: u64, failed: bool) {
        let number = self.number(now_ms);
        let slot = &self.buckets[(number % BUCKETS) as usize];
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let next = if stamp(current) == number {
                pack(
                    number,
                    (failures(current) + u64::from(failed)).min(COUNT_MAX),
                    (attempts(current) + 1).min(COUNT_MAX),
                )
            } else {
                // The bucket last counted a window ago or more: start it over.
                pack(number, u64::from(failed), 1)
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
                counts.attempts += attempts(bucket);
                counts.failures += failures(bucket);
            }
        }
        counts
    }

    /// Forgets everything counted: a breaker that closes starts afresh, its
    /// failures before it opened forgiven.
    pub(super) fn clear(&self) {
        for slot in &self.buckets {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(tower_backoff_loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_only_the_buckets_of_the_last_window() {
        let window = Window::new(1_000);
        window.record(0, true);
        window.record(500, false);
        window.record(9_999, true);
        assert_eq!(
            window.counts(9_999),
            Counts {
                attempts: 3,
                failures: 2
            }
        );
        // The first second's bucket slid out; the last one is still in.
        assert_eq!(
            window.counts(10_000),
            Counts {
                attempts: 1,
                failures: 1
            }
        );
        assert_eq!(window.counts(19_000).attempts, 0);
    }

    #[test]
    fn a_bucket_reused_a_window_later_starts_over() {
        let window = Window::new(100);
        window.record(0, true);
        window.record(1_000, false);
        assert_eq!(
            window.counts(1_000),
            Counts {
                attempts: 1,
                failures: 0
            }
        );
    }

    #[test]
    fn counts_saturate_instead_of_spilling_into_the_stamp() {
        let window = Window::new(1_000);
        let slot = &window.buckets[0];
        slot.store(pack(0, COUNT_MAX, COUNT_MAX), Ordering::Relaxed);
        window.record(0, true);
        assert_eq!(
            window.counts(0),
            Counts {
                attempts: COUNT_MAX,
                failures: COUNT_MAX
            }
        );
    }

    #[test]
    fn clearing_forgets_everything() {
        let window = Window::new(1_000);
        window.record(0, true);
        window.clear();
        assert_eq!(window.counts(0).attempts, 0);
    }
}
