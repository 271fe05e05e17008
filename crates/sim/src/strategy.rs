//! The retry strategies the storm compares, as ready-made layers.

use std::fmt;
use std::time::Duration;

use tower_backoff_core::adaptive::AdaptivePacing;
use tower_backoff_core::budget::TokenBucket;
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::policy::{Cause, Decision, Policy};
use tower_backoff_core::schedule::{Constant, Exponential};
use tower_backoff_core::BackoffLayer;
use tower_backoff_core::Jitter;

use super::budgets::BudgetKind;

/// Attempts per logical request, the first included, for every strategy that
/// retries: the crate's default (and Spring Retry's), the same for all so that
/// only the schedule, the jitter and the budget differ.
pub const MAX_ATTEMPTS: u32 = tower_backoff_core::DEFAULT_MAX_ATTEMPTS;

/// The wait of the fixed-interval strategy (Spring Retry's default).
pub const FIXED_INTERVAL: Duration = Duration::from_secs(1);

/// The first wait of the exponential strategies; it doubles after each retry.
pub const FIRST_DELAY: Duration = Duration::from_millis(100);

/// The longest wait of the exponential strategies.
pub const MAX_DELAY: Duration = Duration::from_secs(20);

/// Growth of the seed-003 variant's exponential schedule, from the article it
/// reproduces: each wait 2.7 times the last, from [`FIXED_INTERVAL`], ±10 %.
pub const UNTIL_SUCCESS_FACTOR: f64 = 2.7;

/// The longest wait of the seed-003 variant's exponential schedule.
pub const UNTIL_SUCCESS_MAX_DELAY: Duration = Duration::from_secs(600);

/// Retries the budgeted strategies allow per first attempt in the budget's
/// window (10 s), on top of its floor of 10 retries per second.
pub const BUDGET_RATIO: f64 = 0.1;

/// A [`TokenBucket`] with the storm's settings: each first attempt earns a
/// tenth of a retry (Finagle's budget of a share of requests), plus 10
/// retries a second, banking at most 200.
///
/// # Errors
/// Never for these settings.
pub fn storm_budget() -> Result<TokenBucket, ConfigError> {
    // A retry costs 10 tokens, so a deposit of one per request is a tenth of
    // a retry.
    let cost = (1.0 / BUDGET_RATIO) as u64;
    TokenBucket::builder()
        .capacity(200 * cost)
        .initial_tokens(0)
        .retry_cost(cost)
        .timeout_cost(cost)
        .success_refund(0)
        .request_deposit(1)
        .refill_per_second(10 * cost)
        .build()
}

/// A way to retry, from the naive to the one this crate recommends.
///
/// ```
/// use tower_backoff_sim::{Storm, Strategy};
/// use std::time::Duration;
///
/// let storm = Storm::new().clients(50).horizon(Duration::from_secs(40));
/// let report = Strategy::ExponentialJitter.run(&storm, 7)?;
/// assert!(report.summary().requests > 0);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// No retries at all: the baseline.
    NoRetries,
    /// Retry every [`FIXED_INTERVAL`], no jitter: the common naive choice.
    FixedInterval,
    /// Wait [`FIRST_DELAY`], doubling up to [`MAX_DELAY`], no jitter.
    Exponential,
    /// Exponential, with full jitter.
    ExponentialJitter,
    /// Exponential with full jitter, within a [`storm_budget`] (a
    /// [`BUDGET_RATIO`] of requests) shared by every client.
    Budgeted,
    /// The layer's defaults (so the default budget), plus [`AdaptivePacing`]
    /// (its defaults) shared by every client: what issue 12 compares against
    /// the defaults alone. This server gives no throttling answer, only
    /// timeouts, so its policy reports timeouts as [`Cause::Throttled`] to
    /// let the pacing react; the budget pays for their retries as for any.
    Adaptive,
    /// The layer as a user gets it: `BackoffLayer::builder()` with this
    /// simulation's policy and seed, nothing else (3 attempts, 100 ms
    /// doubling to 20 s, full jitter, the default budget).
    Defaults,
    /// [`Defaults`](Strategy::Defaults) with another budget: the budget
    /// comparison.
    WithBudget(BudgetKind),
    /// The seed-003 variant: retry until success, every [`FIXED_INTERVAL`]
    /// with no jitter, with the default budget or none.
    FixedUntilSuccess {
        /// Whether the default budget is on.
        budget: bool,
    },
    /// The seed-003 variant: retry until success, from [`FIXED_INTERVAL`]
    /// growing by [`UNTIL_SUCCESS_FACTOR`] up to [`UNTIL_SUCCESS_MAX_DELAY`],
    /// ±10 % jitter, with the default budget or none.
    ExponentialUntilSuccess {
        /// Whether the default budget is on.
        budget: bool,
    },
}

impl Strategy {
    /// The storm table's strategies, in its order.
    pub const ALL: [Strategy; 7] = [
        Strategy::NoRetries,
        Strategy::FixedInterval,
        Strategy::Exponential,
        Strategy::ExponentialJitter,
        Strategy::Budgeted,
        Strategy::Adaptive,
        Strategy::Defaults,
    ];

    /// The seed-003 variant's strategies: fixed interval against exponential
    /// backoff, retrying until success, without and with the default budget.
    pub const UNTIL_SUCCESS: [Strategy; 4] = [
        Strategy::FixedUntilSuccess { budget: false },
        Strategy::ExponentialUntilSuccess { budget: false },
        Strategy::FixedUntilSuccess { budget: true },
        Strategy::ExponentialUntilSuccess { budget: true },
    ];

    /// A short name for tables and charts.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::NoRetries => "no retries",
            Strategy::FixedInterval => "fixed interval",
            Strategy::Exponential => "exponential",
            Strategy::ExponentialJitter => "exponential + jitter",
            Strategy::Budgeted => "+ budget of 10 % of requests",
            Strategy::Adaptive => "defaults + pacing",
            Strategy::Defaults => "defaults",
            Strategy::WithBudget(kind) => kind.name(),
            Strategy::FixedUntilSuccess { budget: false } => "fixed 1 s until success",
            Strategy::FixedUntilSuccess { budget: true } => {
                "fixed 1 s until success + default budget"
            }
            Strategy::ExponentialUntilSuccess { budget: false } => "×2.7 ±10 % until success",
            Strategy::ExponentialUntilSuccess { budget: true } => {
                "×2.7 ±10 % until success + default budget"
            }
        }
    }

    /// The layer for this strategy. `seed` makes its jitter reproducible.
    ///
    /// Every client built from one layer shares whatever the layer shares
    /// (its budget): the storm's clients are the clones of one service.
    ///
    /// # Errors
    /// Never for the built-in settings; a [`ConfigError`] would name the
    /// setting.
    pub fn layer(self, seed: u64) -> Result<BackoffLayer<RetryErrors>, ConfigError> {
        let fixed = Constant::new(FIXED_INTERVAL);
        let exponential = Exponential::new(FIRST_DELAY).max_delay(MAX_DELAY);
        let builder = BackoffLayer::builder()
            .policy(RetryErrors::new(Cause::Timeout))
            .max_attempts(MAX_ATTEMPTS)
            .seed(seed);
        match self {
            Strategy::NoRetries => builder.schedule(exponential).max_attempts(1).build(),
            Strategy::FixedInterval => builder
                .schedule(fixed)
                .jitter(Jitter::None)
                .no_budget()
                .build(),
            Strategy::Exponential => builder
                .schedule(exponential)
                .jitter(Jitter::None)
                .no_budget()
                .build(),
            Strategy::ExponentialJitter => builder
                .schedule(exponential)
                .jitter(Jitter::Full)
                .no_budget()
                .build(),
            Strategy::Budgeted => builder
                .schedule(exponential)
                .jitter(Jitter::Full)
                .budget(storm_budget()?)
                .build(),
            Strategy::Adaptive => builder
                .policy(RetryErrors::new(Cause::Throttled))
                .schedule(exponential)
                .jitter(Jitter::Full)
                .pacing(AdaptivePacing::new())
                .build(),
            Strategy::Defaults => BackoffLayer::builder()
                .policy(RetryErrors::new(Cause::Timeout))
                .schedule(exponential)
                .seed(seed)
                .build(),
            Strategy::WithBudget(kind) => kind
                .apply(
                    BackoffLayer::builder()
                        .policy(RetryErrors::new(Cause::Timeout))
                        .schedule(exponential)
                        .seed(seed),
                )?
                .build(),
            Strategy::FixedUntilSuccess { budget } => {
                let builder = builder.schedule(fixed).jitter(Jitter::None);
                until_success(builder, budget).build()
            }
            Strategy::ExponentialUntilSuccess { budget } => {
                let schedule = Exponential::new(FIXED_INTERVAL)
                    .factor(UNTIL_SUCCESS_FACTOR)
                    .max_delay(UNTIL_SUCCESS_MAX_DELAY);
                let builder = builder.schedule(schedule).jitter(Jitter::Proportional(0.1));
                until_success(builder, budget).build()
            }
        }
    }

    /// Runs `storm` with every client using this strategy.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting of `storm` that cannot work.
    pub fn run(self, storm: &super::Storm, seed: u64) -> Result<super::StormReport, ConfigError> {
        self.run_with_progress(storm, seed, |_| {})
    }

    /// [`run`](Self::run), calling `progress` with the simulated time after
    /// each interval.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting of `storm` that cannot work.
    pub fn run_with_progress(
        self,
        storm: &super::Storm,
        seed: u64,
        progress: impl FnMut(Duration),
    ) -> Result<super::StormReport, ConfigError> {
        let layer = self.layer(seed)?;
        storm.run_with_progress(|c| tower_layer::Layer::layer(&layer, c), progress)
    }
}

/// The seed-003 strategies keep the default budget unless told to drop it.
/// "Until success": no attempt limit, and a time limit of a day, longer than
/// any simulated run, since the layer refuses unlimited attempts without one.
fn until_success<P>(
    builder: tower_backoff_core::BackoffBuilder<P>,
    budget: bool,
) -> tower_backoff_core::BackoffBuilder<P> {
    let builder = builder
        .unlimited_attempts()
        .max_elapsed(Duration::from_secs(24 * 60 * 60));
    if budget {
        builder
    } else {
        builder.no_budget()
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Retries every error, as failures of one [`Cause`]: in the simulations
/// every failure is a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryErrors {
    cause: Cause,
}

impl RetryErrors {
    /// Retries every error, reporting it as `cause` to budgets and pacing.
    pub const fn new(cause: Cause) -> Self {
        Self { cause }
    }
}

impl<Req: Clone, Res, E> Policy<Req, Res, E> for RetryErrors {
    fn classify(&self, _: &Req, result: &Result<Res, E>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry().because(self.cause),
        }
    }

    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}
