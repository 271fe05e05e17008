//! The sliding window a closed breaker counts attempts in: a ring of
//! buckets, each one atomic word.
//!
//! A success, the happy path, is one relaxed add to a counter of successes
//! not yet placed in time, and reads no clock: a clock read would cost more
//! than the rest of the breaker together. The clock is read, and the
//! successes counted since the last read are placed in the bucket it reads,
//! when a failure comes, when the window is read, and when a batch of them
//! is full. A batch is an eighth of the attempts the bucket last counted in
//! holds: one success while it holds fewer than 16, so that a quiet client's
//! every success is placed on its own, and about twenty clock reads a bucket
//! at a steady rate, however busy the host.
//!
//! So a success is placed at or after the time it came, never before: the
//! window may count it a little longer than its time, but never forgets it
//! early. At a steady rate a batch is placed within an eighth of a bucket;
//! when traffic stops mid-batch, what it holds waits for the next read, and
//! is counted from then.

use crate::sync::{AtomicU64, Ordering};

/// Buckets the window is cut into: it slides a tenth at a time.
pub(super) const BUCKETS: u64 = 10;

/// A batch of successes is this share of its bucket's attempts.
const BATCH_DIVISOR: u64 = 8;

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
    // The successes not in a bucket yet: [till full: 33 bits][counted: 31
    // bits], one word so that a success is one add and a placement takes
    // them and sizes the next batch at once. "Till full" is a signed count
    // of the successes still to come before the batch is full, less one:
    // negative once it is, so the add's sign flag tells. At 31 bits what a
    // success adds fits an instruction's 32-bit immediate.
    unplaced: AtomicU64,
    // The latest time successes were placed at, in ms.
    placed_at: AtomicU64,
}

const COUNTED_BITS: u32 = 31;

/// What one success adds to `Window::unplaced`: one counted, one fewer till
/// full.
const SUCCESS: u64 = 1u64.wrapping_sub(1 << COUNTED_BITS);

/// `Window::unplaced` for a new batch of `batch` (at least 1), nothing
/// counted yet.
fn armed(batch: u64) -> u64 {
    (batch - 1) << COUNTED_BITS
}

fn counted(unplaced: u64) -> u64 {
    unplaced & ((1 << COUNTED_BITS) - 1)
}

fn pack(stamp: u64, failures: u64, attempts: u64) -> u64 {
    (stamp & STAMP_MASK) << (2 * COUNT_BITS) | failures << COUNT_BITS | attempts
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
            unplaced: AtomicU64::new(armed(1)),
            placed_at: AtomicU64::new(0),
        }
    }

    /// The span of one bucket, in milliseconds.
    pub(super) fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// Counts one success, without the time: see the module docs. True when
    /// its batch is full: the caller is then to read the clock and
    /// [`place`](Self::place) it.
    #[must_use = "a full batch is to be placed"]
    pub(super) fn success(&self) -> bool {
        let before = self.unplaced.fetch_add(SUCCESS, Ordering::Relaxed);
        (before.wrapping_add(SUCCESS) as i64) < 0
    }

    /// Counts one failure at `now_ms`, with the successes before it (at a
    /// later time another thread placed at, as [`place`](Self::place)
    /// does).
    pub(super) fn failure(&self, now_ms: u64) {
        self.place_with(now_ms, 1);
    }

    /// Places the successes counted since they were last placed in the
    /// bucket of `now_ms`, or of a later time another thread placed at: at
    /// or after the time each came. Sizes the next batch.
    pub(super) fn place(&self, now_ms: u64) {
        self.place_with(now_ms, 0);
    }

    /// [`place`](Self::place), with `failures` more in the same bucket.
    fn place_with(&self, now_ms: u64, failures: u64) {
        // A later time placed at is a later clock read, and the successes
        // taken here were counted after it.
        let at = self
            .placed_at
            .fetch_max(now_ms, Ordering::Relaxed)
            .max(now_ms);
        let number = self.number(at);
        let mut current = self.unplaced.load(Ordering::Relaxed);
        loop {
            let attempts = counted(current) + failures;
            let holds = self.attempts_in(number) + attempts;
            let next = armed((holds / BATCH_DIVISOR).max(1));
            match self.unplaced.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if attempts > 0 {
                        self.add(number, failures, attempts);
                    }
                    return;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Whether the next successes count towards a batch, rather than wait,
    /// past a full one, for the placing that thread is to do.
    #[cfg(test)]
    pub(super) fn is_armed(&self) -> bool {
        (self.unplaced.load(Ordering::Relaxed) as i64) >= 0
    }

    /// The attempts the bucket numbered `number` holds so far.
    fn attempts_in(&self, number: u64) -> u64 {
        let bucket = self.buckets[(number % BUCKETS) as usize].load(Ordering::Relaxed);
        if stamp(bucket) == number {
            attempts_of(bucket)
        } else {
            0
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
    /// failures before it opened forgiven, its next success placed at once.
    pub(super) fn clear(&self, now_ms: u64) {
        self.unplaced.store(armed(1), Ordering::Relaxed);
        self.placed_at.fetch_max(now_ms, Ordering::Relaxed);
        for slot in &self.buckets {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(tower_backoff_loom)))]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn counts(attempts: u64, failures: u64) -> Counts {
        Counts { attempts, failures }
    }

    /// A success at `now_ms`, placed as the breaker places it.
    fn success(window: &Window, now_ms: u64) -> bool {
        let full = window.success();
        if full {
            window.place(now_ms);
        }
        full
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
    fn a_quiet_clients_every_success_is_placed_at_once() {
        let window = Window::new(1_000);
        for n in 0..15 {
            assert!(success(&window, n * 100), "success {n}");
        }
        assert_eq!(window.counts(1_499), counts(15, 0));
        // Placed in their own seconds: the first ten leave with the first.
        assert_eq!(window.counts(10_000), counts(5, 0));
    }

    #[test]
    fn a_batch_is_an_eighth_of_its_buckets_attempts() {
        let window = Window::new(1_000);
        for _ in 0..15 {
            assert!(success(&window, 0));
        }
        window.failure(0);
        // 16 attempts: batches of two.
        assert!(!success(&window, 0));
        assert!(success(&window, 0));
        for _ in 0..782 {
            let _ = success(&window, 0);
        }
        window.place(0);
        assert_eq!(window.counts(0), counts(800, 1));
        // 800 attempts: batches of 100.
        let full = (0..100).map(|_| success(&window, 0)).collect::<Vec<_>>();
        assert_eq!(full.iter().filter(|&&full| full).count(), 1);
        assert!(full[99]);
    }

    #[test]
    fn successes_after_a_quiet_spell_stay_in_the_window_until_their_time() {
        // Issue 40: they were spread over the spell and mostly dropped.
        let window = Window::new(1_000);
        window.failure(0);
        for n in 0..30 {
            assert!(success(&window, 90_000 + n * 200));
        }
        window.failure(99_999);
        assert_eq!(window.counts(99_999), counts(31, 1));
        assert_eq!(window.counts(100_000), counts(26, 1), "90 s left");
    }

    #[test]
    fn a_batch_left_when_traffic_stops_is_counted_from_the_next_read_never_before() {
        let window = Window::new(1_000);
        for _ in 0..800 {
            let _ = success(&window, 0);
        }
        window.place(0);
        // Batches of 100: these 50 wait, however long.
        for _ in 0..50 {
            assert!(!success(&window, 500));
        }
        assert_eq!(window.counts(5_000), counts(800, 0));
        window.failure(30_000);
        assert_eq!(window.counts(30_000), counts(51, 1));
        assert_eq!(window.counts(39_999), counts(51, 1));
        assert_eq!(window.counts(40_000), counts(0, 0));
    }

    #[test]
    fn a_bucket_reused_a_window_later_starts_over() {
        let window = Window::new(100);
        window.failure(0);
        window.failure(1_000);
        assert_eq!(window.counts(1_000), counts(1, 1));
    }

    #[test]
    fn a_count_for_a_bucket_the_ring_has_moved_past_is_dropped() {
        // A thread that read the clock before another's adds after it: its
        // bucket's place already counts a later one.
        let window = Window::new(100);
        window.failure(1_000);
        window.add(0, 1, 1);
        assert_eq!(window.counts(1_000), counts(1, 1));
        // Stamps wrap: one half the stamps or more behind reads as later.
        let number = STAMP_MASK / 2;
        let slot = &window.buckets[(number % BUCKETS) as usize];
        slot.store(pack(0, 1, 1), Ordering::Relaxed);
        window.add(number, 1, 1);
        assert_eq!(slot.load(Ordering::Relaxed), pack(0, 1, 1));
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
    fn clearing_forgets_everything_and_places_the_next_success_at_once() {
        let window = Window::new(1_000);
        for _ in 0..800 {
            let _ = success(&window, 0);
        }
        window.failure(0);
        let _ = success(&window, 0);
        window.clear(0);
        window.place(0);
        assert_eq!(window.counts(0), counts(0, 0));
        assert!(success(&window, 0));
        assert_eq!(window.counts(0), counts(1, 0));
    }

    /// What happens to the window, one step at a time.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Success,
        Failure,
        /// The breaker's `window()`: place, then count.
        Read,
    }

    /// An outcome as the naive recount sees it.
    struct Outcome {
        at_ms: u64,
        /// When the window placed it; `None` while unplaced.
        placed_ms: Option<u64>,
        failed: bool,
    }

    /// Runs `steps` (each after its advance) on a window of `bucket_ms`
    /// buckets, and checks after each that the window counts what a naive
    /// recount finds in the last `BUCKETS` buckets: exactly the outcomes
    /// placed there; every failure and placed success at or after its time;
    /// and, when every success so far was placed when it came, exactly the
    /// outcomes that came there. Returns whether it was so. No full batch
    /// is ever left unplaced.
    fn check(bucket_ms: u64, steps: &[(u64, Step)]) -> Result<bool, TestCaseError> {
        let window = Window::new(bucket_ms);
        let mut outcomes: Vec<Outcome> = Vec::new();
        let mut now_ms = 0;
        let mut placed_at_once = true;
        for &(advance, step) in steps {
            now_ms += advance;
            let placed;
            match step {
                Step::Success => {
                    outcomes.push(Outcome {
                        at_ms: now_ms,
                        placed_ms: None,
                        failed: false,
                    });
                    placed = success(&window, now_ms);
                    placed_at_once &= placed;
                }
                Step::Failure => {
                    window.failure(now_ms);
                    placed = true;
                    outcomes.push(Outcome {
                        at_ms: now_ms,
                        placed_ms: Some(now_ms),
                        failed: true,
                    });
                }
                Step::Read => {
                    window.place(now_ms);
                    placed = true;
                }
            }
            if placed {
                for outcome in outcomes.iter_mut().filter(|o| o.placed_ms.is_none()) {
                    outcome.placed_ms = Some(now_ms);
                }
            }
            let in_window = |at_ms: u64| now_ms / bucket_ms - at_ms / bucket_ms < BUCKETS;
            let recount = |when: &dyn Fn(&Outcome) -> Option<u64>| {
                let counted = outcomes.iter().filter(|o| when(o).is_some_and(in_window));
                let (mut attempts, mut failures) = (0, 0);
                for outcome in counted {
                    attempts += 1;
                    failures += u64::from(outcome.failed);
                }
                counts(attempts, failures)
            };
            prop_assert!(window.is_armed(), "a full batch left unplaced");
            let counted = window.counts(now_ms);
            let by_placing = recount(&|o| o.placed_ms);
            prop_assert_eq!(counted, by_placing, "by the time placed, at {}", now_ms);
            let came = recount(&|o| o.placed_ms.map(|_| o.at_ms));
            prop_assert_eq!(counted.failures, came.failures);
            prop_assert!(
                counted.attempts >= came.attempts,
                "forgot early at {}",
                now_ms
            );
            if placed_at_once {
                prop_assert_eq!(counted, came, "by the time they came, at {}", now_ms);
            }
        }
        Ok(placed_at_once)
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => Just(Step::Success),
            3 => Just(Step::Failure),
            1 => Just(Step::Read),
        ]
    }

    /// From no time at all to a thousand windows: within 2^24 buckets over
    /// a whole run, where a bucket's stamp would be read as current again.
    fn advance(bucket_ms: u64) -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => Just(0),
            4 => 0..=bucket_ms,
            2 => 0..=BUCKETS * bucket_ms * 2,
            1 => 0..=BUCKETS * bucket_ms * 1_000,
        ]
    }

    proptest! {
        /// Bursts at one instant and spells between: the counts are those
        /// of the outcomes by the time they were placed, never earlier than
        /// they came.
        #[test]
        fn the_window_counts_every_outcome_by_the_time_it_was_placed(
            (bucket_ms, steps) in (1u64..=1_000).prop_flat_map(|bucket_ms| {
                (Just(bucket_ms), proptest::collection::vec((advance(bucket_ms), step()), 0..400))
            })
        ) {
            check(bucket_ms, &steps)?;
        }

        /// At most ten outcomes a bucket, so every success is placed when it
        /// comes: the counts are exactly those of the outcomes that came in
        /// the last window.
        #[test]
        fn a_window_of_few_attempts_a_bucket_counts_exactly_what_came_in_it(
            (bucket_ms, steps) in (10u64..=1_000).prop_flat_map(|bucket_ms| {
                let least = bucket_ms.div_ceil(BUCKETS);
                let advance = prop_oneof![
                    4 => least..=bucket_ms,
                    2 => least..=BUCKETS * bucket_ms * 2,
                    1 => least..=BUCKETS * bucket_ms * 1_000,
                ];
                (Just(bucket_ms), proptest::collection::vec((advance, step()), 0..400))
            })
        ) {
            prop_assert!(check(bucket_ms, &steps)?, "every success placed when it came");
        }
    }
}
