//! Jitter: randomness added to each delay so that clients which failed together
//! do not retry together.

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use crate::error::ConfigError;
use crate::schedule::nanos_capped;

/// How a schedule's delay is randomized before the request sleeps.
///
/// For a schedule delay `d`, each variant below gives a delay at or below
/// the schedule's [`cap`](crate::Schedule::cap), jitter included. `Full` is
/// the default: in AWS's measurements it spreads competing clients best and
/// finishes contended work with the fewest calls.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{Exponential, Jitter, Rng, Schedule};
///
/// let schedule = Exponential::new(Duration::from_millis(100)).max_delay(Duration::from_secs(1));
/// let mut rng = Rng::seeded(7);
/// let base = schedule.delay(3); // 400 ms
/// let jittered = Jitter::Full.apply(base, base, &schedule, &mut rng);
/// assert!(jittered <= base);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// Sleep exactly the schedule's delay. Clients that failed together retry
    /// together; use it only when there is a single client.
    None,
    /// Uniform in `[0, d]`.
    #[default]
    Full,
    /// `d/2` plus uniform in `[0, d/2]`: never shorter than half the delay.
    Equal,
    /// `min(cap, uniform in [base, 3 × previous])`, where `base` is the schedule's
    /// first delay and `previous` the delay actually slept before the last retry.
    /// It ignores the schedule's growth and grows by itself.
    Decorrelated,
    /// `d × uniform in [1 − r, 1 + r]` for `r` in `[0, 1]`, capped.
    Proportional(f64),
}

impl Jitter {
    /// Checks the proportional fraction is within `[0, 1]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            Jitter::Proportional(r) if !(0.0..=1.0).contains(&r) => Err(ConfigError::new(
                "jitter",
                format!("proportional fraction must be within [0, 1], got {r}"),
            )),
            _ => Ok(()),
        }
    }

    /// The jittered delay before retry number `retry` (1 for the first) of
    /// `schedule`: what the layer sleeps, for callers writing their own loop.
    ///
    /// `previous` is the delay slept before the previous retry; it is ignored
    /// for the first retry and read only by [`Jitter::Decorrelated`].
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// use std::time::Duration;
    /// use tower_backoff::{Exponential, Jitter, Rng};
    ///
    /// let schedule = Exponential::new(Duration::from_millis(100));
    /// let mut rng = Rng::seeded(1);
    /// let mut previous = Duration::ZERO;
    /// for retry in 1..=3 {
    ///     previous = Jitter::Equal.delay(&schedule, retry, previous, &mut rng);
    ///     assert!(previous >= Duration::from_millis(50) * (1 << (retry - 1)));
    /// }
    /// ```
    pub fn delay<S: crate::Schedule + ?Sized>(
        self,
        schedule: &S,
        retry: u32,
        previous: Duration,
        rng: &mut Rng,
    ) -> Duration {
        let base = schedule.delay(retry);
        let previous = if retry <= 1 { base } else { previous };
        self.apply(base, previous, schedule, rng)
    }

    /// Randomizes `delay`, the schedule's delay for this retry.
    ///
    /// `previous` is the delay slept before the previous retry (for the first
    /// retry, pass `delay` itself); only [`Jitter::Decorrelated`] reads it. The
    /// result never exceeds `schedule.cap()`.
    pub fn apply<S: crate::Schedule + ?Sized>(
        self,
        delay: Duration,
        previous: Duration,
        schedule: &S,
        rng: &mut Rng,
    ) -> Duration {
        let cap = schedule.cap();
        let d = delay.min(cap);
        let jittered = match self {
            Jitter::None => d,
            Jitter::Full => rng.duration_up_to(d),
            Jitter::Equal => {
                let half = d / 2;
                half + rng.duration_up_to(d - half)
            }
            Jitter::Decorrelated => {
                let base = schedule.delay(1).min(cap);
                let high = previous.saturating_mul(3).max(base);
                base + rng.duration_up_to(high - base)
            }
            Jitter::Proportional(r) => {
                let r = if r.is_finite() {
                    r.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                // Not `mul_f64`: it panics when rounding carries `d` past
                // `Duration::MAX`.
                let low = scaled(d, 1.0 - r).min(d);
                let high = d.saturating_add(scaled(d, r));
                low + rng.duration_up_to(high - low)
            }
        };
        jittered.min(cap)
    }
}

/// A small, fast pseudo-random generator (SplitMix64) for jitter.
///
/// Not for cryptography: it only has to spread retries. Each request draws from
/// its own stream, so concurrent requests get independent delays; a
/// [seeded](crate::BackoffBuilder::seed) layer makes every stream reproducible.
///
/// # Why not `rand`
///
/// rand's `SmallRng` costs more where a retry pays for it: 187 instructions
/// for a stream from entropy against 27 here, and 32 bytes against 8 in every
/// retrying request's session (`bash benches/callgrind_jitter.sh`; the table
/// is in `docs/RESULTS.md`).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    /// A generator whose whole sequence is fixed by `seed`.
    pub const fn seeded(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from a per-thread source of entropy. Cheap: no system
    /// call and no shared state after the first use on a thread.
    pub fn from_entropy() -> Self {
        thread_local! {
            static NEXT: Cell<u64> = Cell::new(RandomState::new().hash_one(0x5EED_u64));
        }
        let seed = NEXT.with(|next| {
            let seed = next.get().wrapping_add(GOLDEN_GAMMA);
            next.set(seed);
            seed
        });
        Self::seeded(mix(seed))
    }

    /// The `index`-th independent stream of a seeded family: stream `i` of seed
    /// `s` is always the same sequence, and different `i` do not correlate.
    pub const fn stream(seed: u64, index: u64) -> Self {
        Self::seeded(mix(seed ^ mix(index.wrapping_add(GOLDEN_GAMMA))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// A number uniformly distributed in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A duration uniformly distributed in `[0, max]`: to the nanosecond up to
    /// 584 years (`u64::MAX` nanoseconds), to 53 bits of precision beyond.
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        let Ok(nanos) = u64::try_from(max.as_nanos()) else {
            return nanos_capped(max.as_nanos() as f64 * self.next_f64(), max);
        };
        let span = nanos as u128 + 1;
        // Multiply-shift maps 64 random bits onto [0, span) without a division.
        Duration::from_nanos(((self.next_u64() as u128 * span) >> 64) as u64)
    }
}

/// `d × factor` for a factor in `[0, 1]`, rounded to the nanosecond.
fn scaled(d: Duration, factor: f64) -> Duration {
    nanos_capped(d.as_nanos() as f64 * factor, Duration::MAX)
}

const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
