//! The amplification scenario: a server that is down for good, and how many
//! attempts each logical request turns into.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::task::LocalSet;
use tower_service::Service;

use super::budgets::{one_layer_each, BudgetKind};
use super::connection::{Connection, Request};
use super::server::{Server, ServerModel};
use super::strategy::storm_budget;
use super::workload::{check_open_load, issue, ClientLog};
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::BackoffLayer;

/// How the clones of a client hold their retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetSharing {
    /// No budget: every request makes all its attempts.
    None,
    /// Each clone has its own budget, as when each process builds its own
    /// layer.
    PerClone,
    /// One budget for all clones, as when they are clones of one service.
    Shared,
}

impl BudgetSharing {
    /// Every way, in the order the tables show them.
    pub const ALL: [BudgetSharing; 3] = [
        BudgetSharing::None,
        BudgetSharing::PerClone,
        BudgetSharing::Shared,
    ];

    /// A short name for tables.
    pub const fn name(self) -> &'static str {
        match self {
            BudgetSharing::None => "no budget",
            BudgetSharing::PerClone => "budget per clone",
            BudgetSharing::Shared => "one shared budget",
        }
    }
}

/// A full outage: every attempt fails (the server is down with its backlog
/// full, so each attempt times out), while clones of a client keep sending
/// requests. The report counts attempts per logical request: the load an
/// outage multiplies.
///
/// The total rate is fixed (default 1,000 requests per second, for 30 s) and
/// spread evenly over the clones, so only the number of clones changes
/// between runs with different counts. Attempts time out after 1 s.
///
/// ```
/// use tower_backoff_sim::Amplification;
/// use tower_backoff::BackoffLayer;
///
/// let layer = BackoffLayer::builder().max_attempts(3).seed(1).no_budget().build()?;
/// let report = Amplification::new()
///     .clones(10)
///     .run(|connection| tower_layer::Layer::layer(&layer, connection))?;
/// // No budget: every request makes all three attempts.
/// assert_eq!(report.attempts, 3 * report.requests);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Amplification {
    clones: usize,
    rate: f64,
    duration: Duration,
    drain: Duration,
    attempt_timeout: Duration,
    healthy_for: Duration,
    seed: u64,
}

/// What one amplification run counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmplificationReport {
    /// Clones of the client.
    pub clones: usize,
    /// Logical requests issued.
    pub requests: u64,
    /// Attempts that reached the server.
    pub attempts: u64,
    /// Logical requests still retrying when the run ended: a schedule whose
    /// waits outlast the drain time. Their later attempts are not counted.
    pub unfinished: u64,
    /// Retries that reached the server from 10 s after the outage began to
    /// the end of the run (attempts then, less the requests issued then):
    /// what still goes out once the first seconds of an outage are over.
    pub late_retries: u64,
    /// How long requests were issued.
    pub duration: Duration,
}

impl AmplificationReport {
    /// Attempts per logical request: 1.0 means no retry went out.
    pub fn attempts_per_request(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.attempts as f64 / self.requests as f64
    }
}

impl Default for Amplification {
    fn default() -> Self {
        Self::new()
    }
}

impl Amplification {
    /// 100 clones, 1,000 requests per second in all for 30 s, then 60 s for
    /// the requests still retrying to finish.
    pub const fn new() -> Self {
        Self {
            clones: 100,
            rate: 1000.0,
            duration: Duration::from_secs(30),
            drain: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(1),
            healthy_for: Duration::ZERO,
            seed: 1,
        }
    }

    /// Lets the server answer every attempt at once for `healthy_for`
    /// (whole seconds) before the outage begins (default zero: down from
    /// the start), so
    /// budgets start the outage with what healthy traffic earned them. The
    /// report counts only what happens from the outage on: requests issued
    /// and attempts received after it began.
    pub const fn healthy_for(mut self, healthy_for: Duration) -> Self {
        self.healthy_for = healthy_for;
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

    /// Seeds the workload.
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.healthy_for.subsec_nanos() != 0 {
            return Err(ConfigError::new(
                "healthy_for",
                format!("must be whole seconds, got {:?}", self.healthy_for),
            ));
        }
        check_duration("healthy_for", self.healthy_for)?;
        check_open_load(self.clones, self.rate, self.duration)
    }

    /// Runs the outage with the layer's defaults (3 attempts, 100 ms doubling,
    /// full jitter) and a [`storm_budget`](super::storm_budget) (10 % of first
    /// attempts, plus its reserve) held as `sharing` says. `seed` seeds the jitter.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_with_budget(
        &self,
        sharing: BudgetSharing,
        seed: u64,
    ) -> Result<AmplificationReport, ConfigError> {
        let layer = |budget: bool| {
            let builder = BackoffLayer::builder().seed(seed);
            match budget {
                true => builder.budget(storm_budget()?).build(),
                false => builder.no_budget().build(),
            }
        };
        match sharing {
            BudgetSharing::None => {
                let layer = layer(false)?;
                self.run(|c| tower_layer::Layer::layer(&layer, c))
            }
            BudgetSharing::Shared => {
                let layer = layer(true)?;
                self.run(|c| tower_layer::Layer::layer(&layer, c))
            }
            BudgetSharing::PerClone => {
                // Built up front: a layer per clone, each with its own budget.
                let layers = (0..self.clones)
                    .map(|_| layer(true))
                    .collect::<Result<Vec<_>, _>>()?;
                self.run(one_layer_each(&layers))
            }
        }
    }

    /// Runs the outage with the layer's defaults and `kind` of budget, one
    /// layer for all clones (so they share its budget). [`BudgetKind::Default`]
    /// is `BackoffLayer::builder().seed(seed).build()`: what a user gets.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_with(
        &self,
        kind: BudgetKind,
        seed: u64,
    ) -> Result<AmplificationReport, ConfigError> {
        let layer = kind.apply(BackoffLayer::builder().seed(seed))?.build()?;
        self.run(|c| tower_layer::Layer::layer(&layer, c))
    }

    /// Runs the outage with the layer's defaults and `kind` of budget, a
    /// layer **per clone**: independent processes, each with its own budget,
    /// as a fleet is. Clone `i` seeds its jitter with `seed + i`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_independent(
        &self,
        kind: BudgetKind,
        seed: u64,
    ) -> Result<AmplificationReport, ConfigError> {
        let layers = kind.per_process(self.clones, seed)?;
        self.run(one_layer_each(&layers))
    }

    /// Runs the outage with a client made by `make_client` for each clone,
    /// from a [`Connection`] to the server. Return services of one layer to
    /// share its budget between clones; build a layer per clone to give each
    /// its own. Blocks until done, on a fresh runtime with a paused clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run<S, F>(&self, mut make_client: F) -> Result<AmplificationReport, ConfigError>
    where
        F: FnMut(Connection) -> S,
        S: Service<Request> + Clone + 'static,
    {
        self.validate()?;
        let healthy = self.healthy_for;
        let horizon = healthy + self.duration + self.drain;
        // Down from the end of the healthy spell to past the end, with no
        // backlog: every attempt is lost and times out. Healthy, it answers
        // in about a millisecond, far below its capacity.
        let model = ServerModel::new()
            .backlog(0)
            .base_latency(Duration::from_millis(1))
            .outage(healthy, horizon * 2);
        let runtime = super::paused_runtime();
        let report = LocalSet::new().block_on(&runtime, async {
            let second = Duration::from_secs(1);
            let server = Server::start(&model, self.seed, second, horizon);
            let connection = Connection::new(server.clone(), self.attempt_timeout);
            let clients: Rc<[S]> = (0..self.clones)
                .map(|_| make_client(connection.clone()))
                .collect();
            let start = server.started();
            let log = Rc::new(RefCell::new(ClientLog::new(start, second, horizon)));
            let rate_per_clone = self.rate / self.clones as f64;
            let stop = start + healthy + self.duration;
            issue(clients, rate_per_clone, stop, self.seed, log.clone()).await;
            tokio::time::sleep_until(start + horizon).await;
            let clients = log.borrow().samples();
            // Counted by the second, from the outage on.
            let skip = healthy.as_secs() as usize;
            let outage = clients.iter().skip(skip);
            let requests: u64 = outage.clone().map(|c| c.started).sum();
            let done: u64 = outage.map(|c| c.succeeded + c.failed).sum();
            let arrivals: Vec<u64> = server.samples().iter().map(|s| s.arrivals).collect();
            let attempts = arrivals.iter().skip(skip).sum();
            let late = skip + 10;
            let late_attempts: u64 = arrivals.iter().skip(late).sum();
            let late_requests: u64 = clients.iter().skip(late).map(|c| c.started).sum();
            AmplificationReport {
                clones: self.clones,
                requests,
                attempts,
                unfinished: requests.saturating_sub(done),
                late_retries: late_attempts.saturating_sub(late_requests),
                duration: self.duration,
            }
        });
        Ok(report)
    }
}
