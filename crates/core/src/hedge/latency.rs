//! [`Latencies`]: a percentile of the layer's recent attempt latencies, the
//! hedge delay that follows latency as it moves.
//!
//! Every attempt's latency goes into a histogram of atomic counters; once a
//! window (at least a period long and holding enough attempts) is complete,
//! its percentile becomes the delay: a request reads one atomic, and the
//! percentile is computed once a window, not once a call.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Sub-buckets per power of two: latencies are told apart to within 1/32
/// (3 %), enough to put a hedge at the 95th percentile rather than the 93rd.
const SUB_BITS: u32 = 5;
const SUBS: usize = 1 << SUB_BITS;
/// Latencies are counted in microseconds up to 2^36 µs (19 hours); longer
/// ones land in the last bucket.
const MAX_EXPONENT: u32 = 36;
const BUCKETS: usize = (MAX_EXPONENT - SUB_BITS + 2) as usize * SUBS;

/// A percentile of recent attempt latencies, shared by every clone of a
/// layer.
pub(crate) struct Latencies {
    percentile: f64,
    period: Duration,
    min_samples: u32,
    counts: Box<[AtomicU32]>,
    samples: AtomicU32,
    /// The delay in microseconds; `u64::MAX` until the first window is
    /// complete: no hedge goes out before there is a percentile to go by.
    delay_micros: AtomicU64,
    /// When the window began; taken by whoever closes it.
    window: Mutex<Instant>,
}

impl Latencies {
    /// `percentile` in (0, 100), over windows of at least `period` and
    /// `min_samples` attempts.
    pub(crate) fn new(percentile: f64, period: Duration, min_samples: u32) -> Self {
        Self {
            percentile,
            period,
            min_samples,
            counts: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            samples: AtomicU32::new(0),
            delay_micros: AtomicU64::new(u64::MAX),
            window: Mutex::new(Instant::now()),
        }
    }

    /// The same settings, with no latencies seen yet.
    pub(crate) fn fresh(&self) -> Self {
        Self::new(self.percentile, self.period, self.min_samples)
    }

    /// The percentile of the last complete window, or `None` before the
    /// first one.
    pub(crate) fn delay(&self) -> Option<Duration> {
        match self.delay_micros.load(Ordering::Relaxed) {
            u64::MAX => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// An attempt took `latency` (or was cancelled after it: a lower bound,
    /// counted as is, so that the copies a hedge made unnecessary still
    /// show the tail they were in).
    pub(crate) fn record(&self, latency: Duration, now: Instant) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(micros)].fetch_add(1, Ordering::Relaxed);
        let samples = self
            .samples
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        // The clock is read by the caller anyway; the lock is taken once
        // every 16 attempts, not once an attempt.
        if samples >= self.min_samples && samples.is_multiple_of(16) {
            self.close_window(now);
        }
    }

    /// Closes the window if it is a period old: its percentile becomes the
    /// delay.
    fn close_window(&self, now: Instant) {
        // Whoever holds the lock is closing it already.
        let Ok(mut start) = self.window.try_lock() else {
            return;
        };
        if now.saturating_duration_since(*start) < self.period {
            return;
        }
        // The window's counts, with half of those before it: the delay
        // follows a change of latency within a window or two, and moves less
        // by chance alone (a window of 500 attempts puts its 90th percentile
        // anywhere from the 88th to the 92nd). Halved by what was read: an
        // attempt recorded meanwhile stays whole.
        let counts: Vec<u32> = self
            .counts
            .iter()
            .map(|c| {
                let seen = c.load(Ordering::Relaxed);
                c.fetch_sub(seen - seen / 2, Ordering::Relaxed);
                seen
            })
            .collect();
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        self.samples.store(0, Ordering::Relaxed);
        *start = now;
        if let Some(micros) = percentile(&counts, total, self.percentile) {
            self.delay_micros.store(micros, Ordering::Relaxed);
        }
    }
}

/// The bucket of a latency of `micros`: exact below 32 µs, then 32 buckets
/// per power of two.
fn bucket(micros: u64) -> usize {
    if micros < SUBS as u64 {
        return micros as usize;
    }
    let exponent = (63 - micros.leading_zeros()).min(MAX_EXPONENT);
    let micros = micros.min((1 << (MAX_EXPONENT + 1)) - 1);
    let sub = (micros >> (exponent - SUB_BITS)) as usize & (SUBS - 1);
    (exponent - SUB_BITS + 1) as usize * SUBS + sub
}

/// The largest latency bucket `index` holds: a delay read from it is never
/// shorter than the latencies it stands for.
fn upper_bound(index: usize) -> u64 {
    if index < SUBS {
        return index as u64;
    }
    let exponent = (index / SUBS) as u32 + SUB_BITS - 1;
    let sub = (index % SUBS) as u64;
    let width = 1u64 << (exponent - SUB_BITS);
    (1u64 << exponent) + (sub + 1) * width - 1
}

/// The `percentile` of the `total` latencies counted in `counts`.
fn percentile(counts: &[u32], total: u64, percentile: f64) -> Option<u64> {
    if total == 0 {
        return None;
    }
    // The rank of the percentile, from 1: at 95 % of 500 latencies, the 475th.
    let rank = ((percentile / 100.0 * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (index, &count) in counts.iter().enumerate() {
        seen += u64::from(count);
        if seen >= rank {
            return Some(upper_bound(index));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_bound_what_they_hold() {
        let mut last = 0;
        // The powers of two from 2^36 µs up are the last bucket's: test the
        // ones below it too.
        let long = [1 << 30, 1 << 36, 3 << 35, (1 << 37) - 1, u64::MAX];
        for micros in (0..100_000u64).chain(long) {
            let index = bucket(micros);
            assert!(index < BUCKETS, "{micros} µs in bucket {index}");
            assert!(index >= last, "buckets ordered at {micros} µs");
            last = index;
            if micros < 1 << 37 {
                assert!(upper_bound(index) >= micros, "{micros} µs above its bucket");
                // 1/32 of resolution.
                assert!(upper_bound(index) - micros <= micros / 32, "{micros} µs");
                // The largest latency the bucket holds: one more is the next's.
                assert_eq!(bucket(upper_bound(index)), index, "{micros} µs");
                if index < BUCKETS - 1 {
                    assert_eq!(bucket(upper_bound(index) + 1), index + 1, "{micros} µs");
                }
            }
        }
        // 2^36 µs and longer share the last bucket; none is left unused.
        assert_eq!(bucket(1 << 37), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentile_reads_the_rank() {
        let mut counts = vec![0u32; BUCKETS];
        // 95 attempts of 10 ms and 5 of 1 s.
        counts[bucket(10_000)] = 95;
        counts[bucket(1_000_000)] = 5;
        let p95 = percentile(&counts, 100, 95.0).unwrap();
        assert!((10_000..10_400).contains(&p95), "{p95}");
        let p96 = percentile(&counts, 100, 96.0).unwrap();
        assert!((1_000_000..1_040_000).contains(&p96), "{p96}");
        assert_eq!(percentile(&counts, 0, 95.0), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_follows_latency_within_two_windows() {
        let latencies = Latencies::new(50.0, Duration::from_secs(1), 10);
        let record = |ms: u64| latencies.record(Duration::from_millis(ms), Instant::now());
        for _ in 0..32 {
            record(10);
        }
        // Enough attempts, but the window is not a period old yet.
        assert_eq!(latencies.delay(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..16 {
            record(10);
        }
        let delay = latencies.delay().expect("a window closed");
        assert!(delay >= Duration::from_millis(10) && delay < Duration::from_micros(10_400));
        // Latency doubles. The next window still holds half of the one
        // before: 24 attempts of 10 ms against its 16 of 20 ms.
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..32 {
            record(20);
        }
        assert!(latencies.delay().unwrap() < Duration::from_micros(10_400));
        // The one after it moves the delay: 12 of 10 ms against 40 of 20.
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..16 {
            record(20);
        }
        let delay = latencies.delay().unwrap();
        assert!(delay >= Duration::from_millis(20), "{delay:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_is_looked_at_only_every_sixteenth_attempt() {
        // The lock is taken once every 16 attempts, not once an attempt.
        let latencies = Latencies::new(50.0, Duration::from_secs(1), 16);
        let record = |ms: u64| latencies.record(Duration::from_millis(ms), Instant::now());
        for _ in 0..16 {
            record(10);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..15 {
            record(10);
        }
        assert_eq!(latencies.delay(), None, "a period old, but at the 31st");
        record(10);
        assert!(latencies.delay().is_some(), "the 32nd closes it");
    }
}
