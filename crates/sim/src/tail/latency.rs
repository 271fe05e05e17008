//! [`LatencyModel`]: how long a backend takes over one attempt, drawn at
//! random, with a tail far above the median.

use std::f64::consts::TAU;
use std::time::Duration;

use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::Rng;

/// The longest latency a draw gives: a draw above it counts as this long,
/// so that no setting can overflow a [`Duration`].
pub(super) const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// The distribution of one attempt's latency. Each attempt draws its own,
/// independently of every other: a hedge of a slow attempt is usually fast.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::Rng;
/// use tower_backoff_sim::LatencyModel;
///
/// let model = LatencyModel::bimodal();
/// let mut rng = Rng::seeded(7);
/// let slow = (0..10_000)
///     .filter(|_| model.sample(&mut rng) == Duration::from_secs(1))
///     .count();
/// assert!((150..250).contains(&slow), "{slow}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyModel {
    /// Two populations: with probability `slow_share` the attempt takes
    /// `slow` (a stalled disk, a garbage collection, a lost packet), otherwise
    /// `|Normal(mean, std_dev)|`.
    Bimodal {
        /// The probability of the slow population, from 0 to 1.
        slow_share: f64,
        /// The latency of the slow population.
        slow: Duration,
        /// The mean of the fast population.
        mean: Duration,
        /// The standard deviation of the fast population.
        std_dev: Duration,
    },
    /// A long continuous tail: `median × e^(sigma × Z)` with `Z` standard
    /// normal, so the logarithm of the latency has standard deviation `sigma`.
    LogNormal {
        /// The median latency.
        median: Duration,
        /// The standard deviation of the latency's natural logarithm.
        sigma: f64,
    },
}

impl Default for LatencyModel {
    fn default() -> Self {
        Self::bimodal()
    }
}

impl LatencyModel {
    /// 2 % of attempts take 1 s, the others `|Normal(10 ms, 2 ms)|`.
    pub const fn bimodal() -> Self {
        LatencyModel::Bimodal {
            slow_share: 0.02,
            slow: Duration::from_secs(1),
            mean: Duration::from_millis(10),
            std_dev: Duration::from_millis(2),
        }
    }

    /// Median 10 ms, `sigma` 1: a 99th percentile of about 102 ms.
    pub const fn log_normal() -> Self {
        LatencyModel::LogNormal {
            median: Duration::from_millis(10),
            sigma: 1.0,
        }
    }

    /// Checks every parameter; each error names it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            LatencyModel::Bimodal {
                slow_share,
                slow,
                mean,
                std_dev,
            } => {
                if !(0.0..=1.0).contains(&slow_share) {
                    return Err(ConfigError::new(
                        "slow_share",
                        format!("must be within [0, 1], got {slow_share}"),
                    ));
                }
                check_duration("slow", slow)?;
                check_duration("mean", mean)?;
                check_duration("std_dev", std_dev)
            }
            LatencyModel::LogNormal { median, sigma } => {
                if !sigma.is_finite() || sigma < 0.0 {
                    return Err(ConfigError::new(
                        "sigma",
                        format!("must be a finite number, zero or more, got {sigma}"),
                    ));
                }
                check_duration("median", median)
            }
        }
    }

    /// One attempt's latency, drawn from `rng`.
    pub fn sample(&self, rng: &mut Rng) -> Duration {
        match *self {
            LatencyModel::Bimodal {
                slow_share,
                slow,
                mean,
                std_dev,
            } => {
                if rng.next_f64() < slow_share {
                    slow
                } else {
                    // Folded, not truncated: a wide spread must not bunch
                    // latencies at zero.
                    let x = mean.as_secs_f64() + std_dev.as_secs_f64() * standard_normal(rng);
                    seconds(x.abs())
                }
            }
            LatencyModel::LogNormal { median, sigma } => {
                seconds(median.as_secs_f64() * (sigma * standard_normal(rng)).exp())
            }
        }
    }
}

/// A standard normal draw by the Box-Muller transform. It makes two
/// independent draws from two uniform ones; keeping the second would make the
/// model stateful for no measurable gain.
pub(super) fn standard_normal(rng: &mut Rng) -> f64 {
    // In (0, 1]: the logarithm of zero is infinite.
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
}

/// `secs` seconds as a [`Duration`], within `[0, LONGEST]`; NaN counts as zero.
pub(super) fn seconds(secs: f64) -> Duration {
    if secs >= LONGEST.as_secs_f64() {
        LONGEST
    } else if secs > 0.0 {
        Duration::from_secs_f64(secs)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAWS: usize = 200_000;

    fn draws(model: LatencyModel, seed: u64) -> Vec<Duration> {
        let mut rng = Rng::seeded(seed);
        let mut all: Vec<Duration> = (0..DRAWS).map(|_| model.sample(&mut rng)).collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn bimodal_sends_two_percent_of_attempts_to_the_slow_population() {
        for seed in 1..=3 {
            let all = draws(LatencyModel::bimodal(), seed);
            let slow = all.iter().filter(|d| **d == Duration::from_secs(1)).count();
            // Binomial standard deviation: sqrt(200000 × 0.02 × 0.98) ≈ 63.
            assert!((3_750..4_250).contains(&slow), "seed {seed}: {slow}");
            // The fast population: median 10 ms, 97.7 % under 14 ms.
            let median = all[DRAWS / 2];
            assert!(
                (9_900..10_100).contains(&median.as_micros()),
                "seed {seed}: {median:?}"
            );
            let under_14 = all.partition_point(|d| *d < Duration::from_millis(14));
            let share = under_14 as f64 / (DRAWS - slow) as f64;
            assert!((share - 0.977).abs() < 0.003, "seed {seed}: {share}");
        }
    }

    #[test]
    fn log_normal_has_its_median_and_one_sigma_quantile() {
        for seed in 1..=3 {
            let all = draws(LatencyModel::log_normal(), seed);
            let median = all[DRAWS / 2].as_secs_f64();
            assert!((median - 0.010).abs() < 0.000_2, "seed {seed}: {median}");
            // e^1 × median is the 84.13th percentile.
            let above = all.len() - all.partition_point(|d| d.as_secs_f64() < 0.010 * 1f64.exp());
            let share = above as f64 / DRAWS as f64;
            assert!((share - 0.1587).abs() < 0.003, "seed {seed}: {share}");
        }
    }

    #[test]
    fn standard_normal_has_mean_zero_and_variance_one() {
        let mut rng = Rng::seeded(3);
        let xs: Vec<f64> = (0..DRAWS).map(|_| standard_normal(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / DRAWS as f64;
        let variance = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / DRAWS as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((variance - 1.0).abs() < 0.01, "{variance}");
    }

    #[test]
    fn extreme_settings_give_latencies_within_a_year() {
        let wide = LatencyModel::LogNormal {
            median: LONGEST,
            sigma: 1e6,
        };
        assert!(wide.validate().is_ok());
        let mut rng = Rng::seeded(1);
        for _ in 0..1_000 {
            assert!(wide.sample(&mut rng) <= LONGEST);
        }
        assert_eq!(seconds(f64::NAN), Duration::ZERO);
        assert_eq!(seconds(f64::INFINITY), LONGEST);
    }

    #[test]
    fn invalid_parameters_are_named() {
        let share = LatencyModel::Bimodal {
            slow_share: 1.5,
            slow: Duration::from_secs(1),
            mean: Duration::from_millis(10),
            std_dev: Duration::ZERO,
        };
        assert_eq!(share.validate().unwrap_err().field(), "slow_share");
        let sigma = LatencyModel::LogNormal {
            median: Duration::from_millis(10),
            sigma: f64::NAN,
        };
        assert_eq!(sigma.validate().unwrap_err().field(), "sigma");
    }
}
