//! The contention scenario: many clients race to write one record with
//! optimistic concurrency, and jitter decides how much work that takes.

use std::cell::Cell;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::task::LocalSet;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::schedule::Exponential;
use tower_backoff_core::BackoffLayer;
use tower_backoff_core::Jitter;

/// The first wait of the contention scenario's clients; it doubles after each
/// conflict.
pub const CONTENTION_FIRST_DELAY: Duration = Duration::from_millis(5);

/// The longest wait of the contention scenario's clients.
pub const CONTENTION_MAX_DELAY: Duration = Duration::from_secs(2);

/// `N` clients start together, and each must write one record once with
/// optimistic concurrency: read its version, then write conditionally on it.
/// A write fails if another client wrote in between, and the client retries.
///
/// This is the experiment of AWS's "Exponential Backoff And Jitter": how many
/// write calls, and how long, until every client has succeeded, for each kind
/// of jitter. Clients back off from 5 ms, doubling up to 2 s; a read and its
/// conditional write are one round trip apart (default 1 ms), so two clients
/// conflict when their attempts start within a round trip of each other.
///
/// ```
/// use tower_backoff_sim::Contention;
/// use tower_backoff::Jitter;
///
/// let none = Contention::new().clients(20).run(Jitter::None)?;
/// // Without jitter the clients stay in lock-step: one wins per round.
/// assert_eq!(none.write_calls, 20 * 21 / 2);
/// assert_eq!(none.succeeded, 20);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contention {
    clients: usize,
    round_trip: Duration,
    horizon: Duration,
    seed: u64,
}

/// What one contention run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentionReport {
    /// Clients that took part.
    pub clients: usize,
    /// Clients whose write succeeded within the horizon.
    pub succeeded: usize,
    /// Write attempts of all clients together.
    pub write_calls: u64,
    /// When the last successful write landed, from the start.
    pub last_success: Duration,
}

impl Default for Contention {
    fn default() -> Self {
        Self::new()
    }
}

impl Contention {
    /// 100 clients, 1 ms round trips, at most an hour of simulated time.
    pub const fn new() -> Self {
        Self {
            clients: 100,
            round_trip: Duration::from_millis(1),
            horizon: Duration::from_secs(3600),
            seed: 1,
        }
    }

    /// How many clients race (`N`).
    pub const fn clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// The time from reading the version to the conditional write landing.
    pub const fn round_trip(mut self, round_trip: Duration) -> Self {
        self.round_trip = round_trip;
        self
    }

    /// Clients still retrying after this much simulated time are left out.
    pub const fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// Seeds the clients' jitter.
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.clients == 0 {
            return Err(ConfigError::new("clients", "must be at least 1"));
        }
        // Without jitter the calls grow as N²: keep a run to seconds.
        if self.clients > 10_000 {
            return Err(ConfigError::new(
                "clients",
                format!("at most 10000, got {}", self.clients),
            ));
        }
        if self.round_trip.is_zero() {
            return Err(ConfigError::new("round_trip", "must be longer than zero"));
        }
        check_duration("round_trip", self.round_trip)?;
        check_duration("horizon", self.horizon)
    }

    /// Runs the race with clients backing off from 5 ms, doubling up to 2 s,
    /// randomized by `jitter`, with no limit on attempts but the horizon.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run(&self, jitter: Jitter) -> Result<ContentionReport, ConfigError> {
        let layer = BackoffLayer::builder()
            .schedule(Exponential::new(CONTENTION_FIRST_DELAY).max_delay(CONTENTION_MAX_DELAY))
            .jitter(jitter)
            .unlimited_attempts()
            .max_elapsed(self.horizon)
            .seed(self.seed)
            .no_budget()
            .build()?;
        self.run_with(|record| tower_layer::Layer::layer(&layer, record))
    }

    /// Runs the race with a client made by `make_client` for each of the `N`
    /// clients, from a handle to the record: your own layer against the same
    /// contention.
    ///
    /// Blocks the calling thread until every client succeeded or the horizon
    /// passed, on a fresh single-threaded runtime with a paused clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_with<S, F>(&self, mut make_client: F) -> Result<ContentionReport, ConfigError>
    where
        F: FnMut(Record) -> S,
        S: Service<Write> + 'static,
    {
        self.validate()?;
        let runtime = super::paused_runtime();
        let report = LocalSet::new().block_on(&runtime, async {
            let start = Instant::now();
            let record = Record {
                shared: Rc::new(Shared::default()),
                round_trip: self.round_trip,
            };
            let last_success = Rc::new(Cell::new(start));
            let succeeded = Rc::new(Cell::new(0));
            let mut tasks = Vec::with_capacity(self.clients);
            for _ in 0..self.clients {
                let mut client = make_client(record.clone());
                let (last_success, succeeded) = (last_success.clone(), succeeded.clone());
                tasks.push(tokio::task::spawn_local(async move {
                    if poll_fn(|cx| client.poll_ready(cx)).await.is_err() {
                        return;
                    }
                    if client.call(Write).await.is_ok() {
                        last_success.set(Instant::now());
                        succeeded.set(succeeded.get() + 1);
                    }
                }));
            }
            let all = async {
                for task in tasks {
                    let _ = task.await;
                }
            };
            let _ = tokio::time::timeout(self.horizon, all).await;
            ContentionReport {
                clients: self.clients,
                succeeded: succeeded.get(),
                write_calls: record.shared.calls.get(),
                last_success: last_success.get() - start,
            }
        });
        Ok(report)
    }
}

/// The one write each client of the contention scenario must get through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write;

/// Another client wrote the record between this attempt's read and its
/// conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict;

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("version changed since it was read")
    }
}

impl std::error::Error for Conflict {}

/// The contended record, as a tower `Service`: each call reads the version and,
/// one round trip later, writes if the version is still the same.
#[derive(Debug, Clone)]
pub struct Record {
    shared: Rc<Shared>,
    round_trip: Duration,
}

#[derive(Debug, Default)]
struct Shared {
    version: Cell<u64>,
    calls: Cell<u64>,
}

impl Service<Write> for Record {
    type Response = ();
    type Error = Conflict;
    type Future = WriteAttempt;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Conflict>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Write) -> WriteAttempt {
        self.shared.calls.set(self.shared.calls.get() + 1);
        WriteAttempt {
            shared: self.shared.clone(),
            read: self.shared.version.get(),
            sleep: tokio::time::sleep(self.round_trip),
        }
    }
}

pin_project! {
    /// One read-then-conditional-write of the [`Record`].
    #[derive(Debug)]
    pub struct WriteAttempt {
        shared: Rc<Shared>,
        read: u64,
        #[pin]
        sleep: Sleep,
    }
}

impl Future for WriteAttempt {
    type Output = Result<(), Conflict>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        std::task::ready!(this.sleep.poll(cx));
        let version = &this.shared.version;
        if version.get() != *this.read {
            return Poll::Ready(Err(Conflict));
        }
        version.set(*this.read + 1);
        Poll::Ready(Ok(()))
    }
}
