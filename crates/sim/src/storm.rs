//! The storm scenario: many clients, a server that goes down for a while, and
//! whether it comes back.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::task::LocalSet;
use tokio::time::Instant;
use tower_service::Service;

use super::connection::{Connection, Request};
use super::report::StormReport;
use super::server::{Server, ServerModel};
use super::workload::{issue, ClientLog};
use tower_backoff_core::error::{check_duration, ConfigError};

/// The most clients a storm accepts.
const MAX_CLIENTS: usize = 1_000_000;

/// The most logical requests a run may be expected to issue: beyond this a
/// run would take minutes, not seconds.
const MAX_REQUESTS: f64 = 100_000_000.0;

/// Many clients send requests at random to a [`ServerModel`] that goes down for
/// a while; the report shows whether it recovers.
///
/// Defaults: 1,000 clients, each sending 0.25 requests per second on average
/// (250 per second in all: 83 % of what the server handles at full speed, 30
/// requests per 100 ms); a 1 s timeout per attempt; the server goes down 20 s
/// in, for 10 s; 120 s in all, measured per second. The run is seeded
/// and deterministic: it uses tokio's paused clock on one thread.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::Storm;
/// use tower_backoff::BackoffLayer;
///
/// let layer = BackoffLayer::builder().seed(7).build()?;
/// let report = Storm::new()
///     .clients(100)
///     .outage(Duration::from_secs(5), Duration::from_secs(2))
///     .horizon(Duration::from_secs(20))
///     .run(|connection| tower_layer::Layer::layer(&layer, connection))?;
/// let summary = report.summary();
/// assert!(summary.requests > 0);
/// assert!(summary.attempts >= summary.requests);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Storm {
    clients: usize,
    rate_per_client: f64,
    model: ServerModel,
    attempt_timeout: Duration,
    horizon: Duration,
    interval: Duration,
    seed: u64,
}

impl std::fmt::Display for Storm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outage = self.model.outage_window();
        write!(
            f,
            "{} clients × {} req/s, {:?} timeout per attempt; {}; down from {:?} to {:?}; {:?} in all",
            self.clients,
            self.rate_per_client,
            self.attempt_timeout,
            self.model,
            outage.start,
            outage.end,
            self.horizon,
        )
    }
}

impl Default for Storm {
    fn default() -> Self {
        Self::new()
    }
}

impl Storm {
    /// The default scenario (see the type's docs).
    pub fn new() -> Self {
        Self {
            clients: 1000,
            rate_per_client: 0.25,
            model: ServerModel::new().outage(Duration::from_secs(20), Duration::from_secs(10)),
            attempt_timeout: Duration::from_secs(1),
            horizon: Duration::from_secs(120),
            interval: Duration::from_secs(1),
            seed: 1,
        }
    }

    /// How many clients send requests (`N`).
    pub fn clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// Requests per second each client sends, on average.
    pub fn rate_per_client(mut self, rate: f64) -> Self {
        self.rate_per_client = rate;
        self
    }

    /// The server's model, outage included.
    pub fn server(mut self, model: ServerModel) -> Self {
        self.model = model;
        self
    }

    /// The server goes down `start` into the run, for `duration`.
    pub fn outage(mut self, start: Duration, duration: Duration) -> Self {
        self.model = self.model.outage(start, duration);
        self
    }

    /// How long a client waits for each attempt.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long the run lasts, in simulated time.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// The length of each statistics interval (default 1 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Seeds the workload and the server; the same seed gives the same run.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The server's model.
    pub fn model(&self) -> &ServerModel {
        &self.model
    }

    /// How many clients send requests.
    pub fn client_count(&self) -> usize {
        self.clients
    }

    /// How long a client waits for each attempt.
    pub fn timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// How long the run lasts.
    pub fn length(&self) -> Duration {
        self.horizon
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        if !(1..=MAX_CLIENTS).contains(&self.clients) {
            return Err(ConfigError::new(
                "clients",
                format!("must be within 1..={MAX_CLIENTS}, got {}", self.clients),
            ));
        }
        if !self.rate_per_client.is_finite() || self.rate_per_client <= 0.0 {
            return Err(ConfigError::new(
                "rate_per_client",
                format!("must be a positive number, got {}", self.rate_per_client),
            ));
        }
        let expected = self.clients as f64 * self.rate_per_client * self.horizon.as_secs_f64();
        if expected > MAX_REQUESTS {
            return Err(ConfigError::new(
                "rate_per_client",
                format!(
                    "the run would issue about {expected:.0} requests; at most {MAX_REQUESTS:.0}"
                ),
            ));
        }
        for (field, value) in [
            ("attempt_timeout", self.attempt_timeout),
            ("horizon", self.horizon),
            ("interval", self.interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(field, "must be longer than zero"));
            }
            check_duration(field, value)?;
        }
        if self.interval > self.horizon {
            return Err(ConfigError::new(
                "interval",
                "must not be longer than the horizon",
            ));
        }
        // A run keeps per-interval statistics: refuse sizes that would eat
        // the memory rather than fail midway.
        if self.horizon.as_nanos().div_ceil(self.interval.as_nanos()) > 10_000_000 {
            return Err(ConfigError::new(
                "interval",
                "more than 10 million intervals",
            ));
        }
        Ok(())
    }

    /// Runs the scenario with a client made by `make_client` for each of the
    /// `N` clients, from a [`Connection`] to the server. Return the same
    /// layer's service each time to share its budget, or build a layer per
    /// client to give each its own. Seed the layer to make the run
    /// reproducible.
    ///
    /// Blocks the calling thread until the run ends: a fresh single-threaded
    /// runtime with a paused clock runs it, so call it outside any runtime.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run<S, F>(&self, make_client: F) -> Result<StormReport, ConfigError>
    where
        F: FnMut(Connection) -> S,
        S: Service<Request> + Clone + 'static,
    {
        self.run_with_progress(make_client, |_| {})
    }

    /// [`run`](Self::run), calling `progress` with the simulated time after
    /// each interval.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_with_progress<S, F, P>(
        &self,
        mut make_client: F,
        progress: P,
    ) -> Result<StormReport, ConfigError>
    where
        F: FnMut(Connection) -> S,
        S: Service<Request> + Clone + 'static,
        P: FnMut(Duration),
    {
        self.validate()?;
        let runtime = super::paused_runtime();
        Ok(LocalSet::new().block_on(&runtime, async {
            let server = self.start_server();
            let connection = Connection::new(server.clone(), self.attempt_timeout);
            self.drive(&server, || make_client(connection.clone()), progress)
                .await
        }))
    }

    /// Starts this scenario's server on the current [`LocalSet`], with its
    /// clock (paused or not) starting now: the start of [`drive`](Self::drive).
    pub fn start_server(&self) -> Server {
        Server::start(&self.model, self.seed, self.interval, self.horizon)
    }

    /// Runs the workload through `N` clients made by `make_client` against
    /// `server` (from [`start_server`](Self::start_server)) until the horizon,
    /// on whatever clock tokio runs: the paused one in simulations, the real
    /// one when the clients talk to the server over a socket.
    ///
    /// Must run inside a [`LocalSet`]. Settings are not checked here: call
    /// [`validate`](Self::validate) first.
    pub async fn drive<S, F, P>(
        &self,
        server: &Server,
        make_client: F,
        mut progress: P,
    ) -> StormReport
    where
        F: FnMut() -> S,
        S: Service<Request> + Clone + 'static,
        P: FnMut(Duration),
    {
        let clients: Rc<[S]> = std::iter::repeat_with(make_client)
            .take(self.clients)
            .collect();
        let start: Instant = server.started();
        let log = Rc::new(RefCell::new(ClientLog::new(
            start,
            self.interval,
            self.horizon,
        )));
        let workload = tokio::task::spawn_local(issue(
            clients,
            self.rate_per_client,
            start + self.horizon,
            self.seed,
            log.clone(),
        ));
        let mut elapsed = Duration::ZERO;
        while elapsed < self.horizon {
            elapsed = (elapsed + self.interval).min(self.horizon);
            tokio::time::sleep_until(start + elapsed).await;
            progress(elapsed);
        }
        workload.abort();
        let clients = log.borrow().samples();
        StormReport {
            interval: self.interval,
            outage: self.model.outage_window(),
            server: server.samples(),
            clients,
        }
    }
}
