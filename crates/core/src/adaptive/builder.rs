//! [`AdaptivePacingBuilder`]: the settings of a pacing, checked once.

use std::sync::Arc;
use std::time::Duration;

use super::control::Law;
use super::{AdaptivePacing, Settings, State};
use crate::error::{check_duration, ConfigError};

/// Builds an [`AdaptivePacing`]; every setting is checked by
/// [`build`](Self::build).
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::AdaptivePacing;
///
/// let pacing = AdaptivePacing::builder()
///     .round(Duration::from_millis(500))
///     .down_multiplier(0.8)
///     .build()?;
/// # drop(pacing);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct AdaptivePacingBuilder {
    round: Duration,
    initial_interval: Duration,
    up_multiplier: f64,
    down_multiplier: f64,
    success_threshold: u32,
    randomization: f64,
    max_interval: Duration,
    max_spread: Option<Duration>,
}

impl Default for AdaptivePacingBuilder {
    fn default() -> Self {
        Self {
            round: Duration::from_secs(1),
            initial_interval: Duration::from_millis(500),
            up_multiplier: 1.5,
            down_multiplier: 0.9,
            success_threshold: 1,
            randomization: 0.1,
            max_interval: Duration::from_secs(15 * 60),
            max_spread: None,
        }
    }
}

impl AdaptivePacingBuilder {
    /// How long outcomes are counted before the rate changes, at most once
    /// (default 1 s). Longer than the server's round trip, and about the
    /// window over which the server counts its rate.
    pub fn round(mut self, round: Duration) -> Self {
        self.round = round;
        self
    }

    /// The interval between sends a throttled round sets when nothing was
    /// sent in it to measure (default 500 ms).
    pub fn initial_interval(mut self, interval: Duration) -> Self {
        self.initial_interval = interval;
        self
    }

    /// The most the interval grows, or shrinks, in one round; how much it
    /// grows per round when too little gets through to measure a rate; and
    /// how much it shrinks per clean round while the rate the server accepts
    /// is known only as a lower bound (default 1.5, above 1).
    pub fn up_multiplier(mut self, factor: f64) -> Self {
        self.up_multiplier = factor;
        self
    }

    /// The share of the rate the server accepted in a throttled round that
    /// the next round sends at (default 0.9, above 0 and below 1): the
    /// headroom left under the server's rate.
    pub fn down_multiplier(mut self, factor: f64) -> Self {
        self.down_multiplier = factor;
        self
    }

    /// Successes a throttled round needs to measure the rate the server
    /// accepts (default 1); with fewer (an outage), the rate falls one
    /// up-multiplier step below the fastest rate that was going, and stays
    /// there until something gets through.
    pub fn success_threshold(mut self, successes: u32) -> Self {
        self.success_threshold = successes;
        self
    }

    /// Each gap between sends is the interval × a uniform factor in
    /// `[1 − r, 1 + r]` (default 0.1, within `[0, 1]`); the mean stays the
    /// interval.
    pub fn randomization(mut self, r: f64) -> Self {
        self.randomization = r;
        self
    }

    /// The longest interval between sends, however long the server throttles
    /// (default 15 min).
    pub fn max_interval(mut self, cap: Duration) -> Self {
        self.max_interval = cap;
        self
    }

    /// Caps how far randomization moves a gap from the interval (default: no
    /// cap beyond the factor), so long intervals stay predictable.
    pub fn max_spread(mut self, spread: Duration) -> Self {
        self.max_spread = Some(spread);
        self
    }

    /// Checks every setting and builds the pacing, off.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the setting: a round, interval or cap of zero
    /// or over a year, an initial interval above the cap, an up-multiplier
    /// not above 1, a down-multiplier outside `(0, 1)`, a zero threshold, or
    /// a randomization outside `[0, 1]`.
    pub fn build(self) -> Result<AdaptivePacing, ConfigError> {
        for (field, value) in [
            ("round", self.round),
            ("initial_interval", self.initial_interval),
            ("max_interval", self.max_interval),
        ] {
            check_duration(field, value)?;
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
        }
        let (up, down, r) = (self.up_multiplier, self.down_multiplier, self.randomization);
        let fail = |field, reason: String| Err(ConfigError::new(field, reason));
        if self.initial_interval > self.max_interval {
            let (initial, max) = (self.initial_interval, self.max_interval);
            return fail(
                "initial_interval",
                format!("{initial:?} is above the max_interval of {max:?}"),
            );
        }
        if !(up.is_finite() && up > 1.0) {
            return fail(
                "up_multiplier",
                format!("must be a finite number above 1, got {up}"),
            );
        }
        if !(down > 0.0 && down < 1.0) {
            return fail(
                "down_multiplier",
                format!("must be above 0 and below 1, got {down}"),
            );
        }
        if self.success_threshold == 0 {
            return fail("success_threshold", "must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&r) {
            return fail("randomization", format!("must be within [0, 1], got {r}"));
        }
        if let Some(spread) = self.max_spread {
            check_duration("max_spread", spread)?;
        }
        // Nanoseconds, kept whole: a year is 3.2e16 ns, well within u64.
        let nanos = |d: Duration| d.as_nanos() as u64;
        let round = nanos(self.round) as f64;
        let law = Law {
            down: self.down_multiplier,
            up: self.up_multiplier,
            threshold: u64::from(self.success_threshold),
            initial_rate: round / nanos(self.initial_interval) as f64,
            min_rate: round / nanos(self.max_interval) as f64,
            cubic: 0.4 * (round / 1e9).powi(4),
        };
        Ok(AdaptivePacing {
            state: Arc::new(State::starting(Settings {
                round: nanos(self.round),
                law,
                randomization: self.randomization,
                max_spread: self.max_spread.map_or(u64::MAX, nanos),
            })),
        })
    }
}
