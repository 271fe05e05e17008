//! The partial-failure scenario: a server that is up, but fails each attempt
//! independently with some probability.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::task::LocalSet;
use tokio::time::Sleep;
use tower_service::Service;

use super::budgets::{one_layer_each, BudgetKind};
use super::connection::{AttemptError, Request};
use super::workload::{check_open_load, issue, ClientLog};
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::BackoffLayer;
use tower_backoff_core::Rng;

/// A server that answers every attempt after a fixed latency and fails it,
/// independently of everything else, with probability `failure_rate`: a
/// flaky dependency rather than an overloaded one, where retries are what
/// turn failed attempts into successful requests.
///
/// Defaults: 100 clones sending 1,000 requests per second in all for 60 s, a
/// 10 ms answer, `failure_rate` 0.1. The report counts the share of requests
/// that succeeded and the attempts each cost.
///
/// ```
/// use tower_backoff_sim::PartialFailure;
/// use tower_backoff::BackoffLayer;
///
/// let layer = BackoffLayer::builder().seed(1).no_budget().build()?;
/// let report = PartialFailure::new()
///     .failure_rate(0.5)
///     .duration(std::time::Duration::from_secs(5))
///     .run(|server| tower_layer::Layer::layer(&layer, server))?;
/// // Three attempts: 1 + 0.5 + 0.25 per request, 87.5 % succeed.
/// assert!((report.attempts_per_request() - 1.75).abs() < 0.1);
/// assert!((report.success_share() - 0.875).abs() < 0.02);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PartialFailure {
    failure_rate: f64,
    clones: usize,
    rate: f64,
    duration: Duration,
    latency: Duration,
    seed: u64,
}

/// What one partial-failure run counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialFailureReport {
    /// Logical requests issued.
    pub requests: u64,
    /// Logical requests that ended in success.
    pub succeeded: u64,
    /// Attempts that reached the server.
    pub attempts: u64,
}

impl PartialFailureReport {
    /// Attempts per logical request: the load, as a multiple of the load
    /// without retries.
    pub fn attempts_per_request(&self) -> f64 {
        ratio(self.attempts, self.requests)
    }

    /// The share of logical requests that succeeded.
    pub fn success_share(&self) -> f64 {
        ratio(self.succeeded, self.requests)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Default for PartialFailure {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialFailure {
    /// The default scenario (see the type's docs).
    pub const fn new() -> Self {
        Self {
            failure_rate: 0.1,
            clones: 100,
            rate: 1000.0,
            duration: Duration::from_secs(60),
            latency: Duration::from_millis(10),
            seed: 1,
        }
    }

    /// The probability that an attempt fails, from 0 to 1.
    pub const fn failure_rate(mut self, p: f64) -> Self {
        self.failure_rate = p;
        self
    }

    /// How many clones of the client send requests.
    pub const fn clones(mut self, clones: usize) -> Self {
        self.clones = clones;
        self
    }

    /// Logical requests per second, all clones together.
    pub const fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// How long requests are issued.
    pub const fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Seeds the workload and the failures.
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.failure_rate) {
            return Err(ConfigError::new(
                "failure_rate",
                format!("must be within [0, 1], got {}", self.failure_rate),
            ));
        }
        check_open_load(self.clones, self.rate, self.duration)
    }

    /// Runs the scenario with the layer's defaults and `kind` of budget, one
    /// layer for all clones.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_with(
        &self,
        kind: BudgetKind,
        seed: u64,
    ) -> Result<PartialFailureReport, ConfigError> {
        let layer = kind.apply(BackoffLayer::builder().seed(seed))?.build()?;
        self.run(|c| tower_layer::Layer::layer(&layer, c))
    }

    /// Runs the scenario with the layer's defaults and `kind` of budget, a
    /// layer **per clone**: independent processes, each with its own budget.
    /// Clone `i` seeds its jitter with `seed + i`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_independent(
        &self,
        kind: BudgetKind,
        seed: u64,
    ) -> Result<PartialFailureReport, ConfigError> {
        let layers = kind.per_process(self.clones, seed)?;
        self.run(one_layer_each(&layers))
    }

    /// Runs the scenario with a client made by `make_client` for each clone,
    /// from the [`FlakyServer`]. Blocks until done, on a fresh runtime with a
    /// paused clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run<S, F>(&self, mut make_client: F) -> Result<PartialFailureReport, ConfigError>
    where
        F: FnMut(FlakyServer) -> S,
        S: Service<Request> + Clone + 'static,
    {
        self.validate()?;
        // Long enough for every request to make all its attempts.
        let drain = Duration::from_secs(60);
        let horizon = self.duration + drain;
        let runtime = super::paused_runtime();
        let report = LocalSet::new().block_on(&runtime, async {
            let server = FlakyServer {
                failure_rate: self.failure_rate,
                latency: self.latency,
                state: Rc::new(RefCell::new(Flaky {
                    seed: self.seed ^ 0xF1A4,
                    made: HashMap::new(),
                    attempts: 0,
                })),
            };
            let clients: Rc<[S]> = (0..self.clones)
                .map(|_| make_client(server.clone()))
                .collect();
            let start = tokio::time::Instant::now();
            let log = Rc::new(RefCell::new(ClientLog::new(start, horizon, horizon)));
            let rate_per_clone = self.rate / self.clones as f64;
            issue(
                clients,
                rate_per_clone,
                start + self.duration,
                self.seed,
                log.clone(),
            )
            .await;
            tokio::time::sleep_until(start + horizon).await;
            let samples = log.borrow().samples();
            let attempts = server.state.borrow().attempts;
            PartialFailureReport {
                requests: samples.iter().map(|c| c.started).sum(),
                succeeded: samples.iter().map(|c| c.succeeded).sum(),
                attempts,
            }
        });
        Ok(report)
    }
}

/// The server of [`PartialFailure`]: a tower `Service` that answers each
/// attempt after a fixed latency, failing it at random.
#[derive(Debug, Clone)]
pub struct FlakyServer {
    failure_rate: f64,
    latency: Duration,
    state: Rc<RefCell<Flaky>>,
}

#[derive(Debug)]
struct Flaky {
    seed: u64,
    /// Attempts each request has made so far, by its id.
    made: HashMap<u64, u32>,
    attempts: u64,
}

impl Service<Request> for FlakyServer {
    type Response = ();
    type Error = AttemptError;
    type Future = FlakyAttempt;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), AttemptError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let fails = {
            let mut state = self.state.borrow_mut();
            state.attempts += 1;
            let made = state.made.entry(request.id).or_insert(0);
            let attempt = u64::from(*made);
            *made += 1;
            // Each attempt's fate is drawn from its request and its number,
            // not from one stream in the order attempts arrive: a budget that
            // refuses a retry changes that request's outcome and no other's,
            // so two configurations differ only by what they decided.
            let mut rng = Rng::stream(state.seed, request.id << 16 | attempt.min(0xFFFF));
            rng.next_f64() < self.failure_rate
        };
        FlakyAttempt::new(self.latency, fails)
    }
}

pin_project! {
    /// The future of one [`FlakyServer`] attempt.
    #[derive(Debug)]
    pub struct FlakyAttempt {
        #[pin]
        sleep: Sleep,
        fails: bool,
    }
}

impl FlakyAttempt {
    /// An attempt answered after `latency`, failed if `fails`.
    pub(crate) fn new(latency: Duration, fails: bool) -> Self {
        Self {
            sleep: tokio::time::sleep(latency),
            fails,
        }
    }
}

impl Future for FlakyAttempt {
    type Output = Result<(), AttemptError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        std::task::ready!(this.sleep.poll(cx));
        Poll::Ready(if *this.fails {
            Err(AttemptError::Failed)
        } else {
            Ok(())
        })
    }
}
