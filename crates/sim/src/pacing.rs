//! The pacing scenario: workers writing to a store that admits a fixed number
//! of writes per rolling second and throttles the rest, as DynamoDB's
//! provisioned capacity does; does the job run near the store's rate?

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::LocalSet;
use tokio::time::Instant;
use tower_service::Service;

use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::policy::{Cause, Decision, Policy};
use tower_backoff_core::Rng;

/// How the workers send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Demand {
    /// `workers` loops, each sending its next write as soon as the last one
    /// ended: a batch job.
    ClosedLoop {
        /// How many write at once.
        workers: usize,
    },
    /// Writes arriving at random (Poisson) at `per_second` on average,
    /// whether or not earlier ones are done; a write not sent within
    /// `give_up` is abandoned, as a caller with a deadline would.
    OpenLoop {
        /// Mean arrivals per second.
        per_second: f64,
        /// How long a write may wait to be sent.
        give_up: Duration,
    },
}

/// A store that admits `capacity` writes in any rolling second and answers
/// the rest [`Admission::Throttled`], and the workers that write to it through
/// your layer.
///
/// Defaults: 100 writes per second, 64 closed-loop workers all starting at
/// once, 50 ms (±20 %) per answer, throttled or not; 120 s in all, measured
/// per second; one client.
/// With several clients, workers (or arrivals) are dealt out in turn, and
/// each client is its own service: build a layer per client to model
/// independent processes.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::{Pacing, ThrottledWrites};
/// use tower_backoff::{AdaptivePacing, BackoffLayer};
///
/// let pacing = AdaptivePacing::new();
/// let layer = BackoffLayer::builder()
///     .policy(ThrottledWrites)
///     .max_attempts(10)
///     .pacing(pacing.clone())
///     .seed(1)
///     .build()?;
/// let report = Pacing::new()
///     .capacity(20)
///     .workers(8)
///     .horizon(Duration::from_secs(30))
///     .run(|_, store| tower_layer::Layer::layer(&layer, store))?;
/// assert!(report.goodput(20..30) > 15.0);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Pacing {
    capacity: u32,
    change: Option<(Duration, Option<u32>)>,
    demand: Demand,
    clients: usize,
    stagger: Duration,
    start_spread: Duration,
    latency: Duration,
    refusal_latency: Option<Duration>,
    latency_spread: f64,
    horizon: Duration,
    seed: u64,
}

impl Default for Pacing {
    fn default() -> Self {
        Self::new()
    }
}

/// A store's answer to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Admitted and stored.
    Accepted,
    /// Over the store's rate: not stored (HTTP 429).
    Throttled,
}

/// Retries [`Admission::Throttled`] as [`Cause::Throttled`]; nothing else fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThrottledWrites;

impl Policy<u64, Admission, Infallible> for ThrottledWrites {
    fn classify(&self, _: &u64, result: &Result<Admission, Infallible>) -> Decision {
        match result {
            Ok(Admission::Accepted) => Decision::Success,
            _ => Decision::retry().because(Cause::Throttled),
        }
    }

    fn clone_request(&self, request: &u64) -> Option<u64> {
        Some(*request)
    }
}

impl Pacing {
    /// The default scenario (see the type's docs).
    pub fn new() -> Self {
        Self {
            capacity: 100,
            change: None,
            demand: Demand::ClosedLoop { workers: 64 },
            clients: 1,
            stagger: Duration::ZERO,
            start_spread: Duration::ZERO,
            latency: Duration::from_millis(50),
            refusal_latency: None,
            latency_spread: 0.2,
            horizon: Duration::from_secs(120),
            seed: 1,
        }
    }

    /// Writes the store admits in any rolling second.
    pub fn capacity(mut self, per_second: u32) -> Self {
        self.capacity = per_second;
        self
    }

    /// From `at` on, the store admits `per_second` writes in any rolling
    /// second, or every write (`None`: throttling stops altogether).
    pub fn change_capacity(mut self, at: Duration, per_second: Option<u32>) -> Self {
        self.change = Some((at, per_second));
        self
    }

    /// `workers` closed-loop workers.
    pub fn workers(mut self, workers: usize) -> Self {
        self.demand = Demand::ClosedLoop { workers };
        self
    }

    /// How the workers send.
    pub fn demand(mut self, demand: Demand) -> Self {
        self.demand = demand;
        self
    }

    /// How many independent clients share the workers.
    pub fn clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// Client `i`'s closed-loop workers start `i × stagger` into the run (default
    /// zero): a newcomer meets a store the others already saturate.
    pub fn stagger(mut self, stagger: Duration) -> Self {
        self.stagger = stagger;
        self
    }

    /// Each closed-loop worker starts at a uniformly random time within
    /// `spread` of its client's start (default zero: all at once), as a job's
    /// workers come up one by one.
    pub fn start_spread(mut self, spread: Duration) -> Self {
        self.start_spread = spread;
        self
    }

    /// How long the store takes to answer (an admitted write, and a throttled
    /// one unless [`refusal_latency`](Self::refusal_latency) says otherwise).
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// How long the store takes to answer a throttled write (default: the
    /// [`latency`](Self::latency)): a refusal is often cheaper than a write.
    pub fn refusal_latency(mut self, latency: Duration) -> Self {
        self.refusal_latency = Some(latency);
        self
    }

    /// Each answer takes its latency times a uniform factor in `[1 − s, 1 +
    /// s]` (default 0.2, within `[0, 1]`); zero makes every latency exact.
    pub fn latency_spread(mut self, s: f64) -> Self {
        self.latency_spread = s;
        self
    }

    /// How long the run lasts, in simulated time.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// Seeds the latencies and arrivals.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The store's rate `at` into the run; `None` when it throttles nothing.
    pub fn capacity_at(&self, at: Duration) -> Option<u32> {
        match self.change {
            Some((from, rate)) if at >= from => rate,
            _ => Some(self.capacity),
        }
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 || matches!(self.change, Some((_, Some(0)))) {
            return Err(ConfigError::new("capacity", "must be at least 1"));
        }
        match self.demand {
            Demand::ClosedLoop { workers } if !(1..=100_000).contains(&workers) => {
                return Err(ConfigError::new("workers", "must be within 1..=100000"));
            }
            Demand::OpenLoop {
                per_second,
                give_up,
            } => {
                if !(per_second.is_finite() && per_second > 0.0 && per_second <= 1e6) {
                    return Err(ConfigError::new(
                        "demand",
                        "must be within (0, 1e6] per second",
                    ));
                }
                check_duration("give_up", give_up)?;
            }
            Demand::ClosedLoop { .. } => {}
        }
        if !(1..=1000).contains(&self.clients) {
            return Err(ConfigError::new("clients", "must be within 1..=1000"));
        }
        check_duration("latency", self.latency)?;
        if let Some(refusal) = self.refusal_latency {
            check_duration("refusal_latency", refusal)?;
        }
        if !(0.0..=1.0).contains(&self.latency_spread) {
            return Err(ConfigError::new("latency_spread", "must be within [0, 1]"));
        }
        check_duration("start_spread", self.start_spread)?;
        if self.start_spread > self.horizon {
            return Err(ConfigError::new(
                "start_spread",
                "workers would start after the run ends",
            ));
        }
        check_duration("stagger", self.stagger)?;
        if self.stagger * (self.clients as u32).saturating_sub(1) > self.horizon {
            return Err(ConfigError::new(
                "stagger",
                "the last client would start after the run ends",
            ));
        }
        check_duration("horizon", self.horizon)?;
        if self.horizon < Duration::from_secs(1) || self.horizon > Duration::from_secs(86_400) {
            return Err(ConfigError::new("horizon", "must be within 1 s and a day"));
        }
        Ok(())
    }

    /// Runs the scenario; `make_client(i, store)` builds client `i` from a
    /// handle on the store. Blocks until the run ends, on a fresh
    /// single-threaded runtime with a paused clock: call it outside any
    /// runtime.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run<S, F>(&self, make_client: F) -> Result<PacingReport, ConfigError>
    where
        F: FnMut(usize, Store) -> S,
        S: Service<u64, Response = Admission> + Clone + 'static,
    {
        self.run_with_progress(make_client, |_| {})
    }

    /// [`run`](Self::run), calling `progress` with the simulated time after
    /// each second.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run_with_progress<S, F, P>(
        &self,
        mut make_client: F,
        mut progress: P,
    ) -> Result<PacingReport, ConfigError>
    where
        F: FnMut(usize, Store) -> S,
        S: Service<u64, Response = Admission> + Clone + 'static,
        P: FnMut(Duration),
    {
        self.validate()?;
        let runtime = super::paused_runtime();
        let seconds = self.horizon.as_secs() as usize;
        Ok(LocalSet::new().block_on(&runtime, async {
            let started = Instant::now();
            let log = Rc::new(RefCell::new(Log {
                started,
                seconds: vec![PacingSample::default(); seconds],
                clients: vec![vec![0; seconds]; self.clients],
                gave_up: 0,
            }));
            let store = Store {
                inner: Rc::new(RefCell::new(StoreState {
                    scenario: self.clone(),
                    started,
                    admitted: VecDeque::new(),
                    rng: Rng::stream(self.seed, 0x5701E),
                    log: log.clone(),
                })),
            };
            let clients: Vec<S> = (0..self.clients)
                .map(|i| make_client(i, store.clone()))
                .collect();
            let stop = started + self.horizon;
            let mut tasks = Vec::new();
            match self.demand {
                Demand::ClosedLoop { workers } => {
                    let mut starts = Rng::stream(self.seed, 0x57A27);
                    for worker in 0..workers {
                        let index = worker % self.clients;
                        let start = started
                            + self.stagger * index as u32
                            + self.start_spread.mul_f64(starts.next_f64());
                        tasks.push(tokio::task::spawn_local(closed_loop(
                            clients[index].clone(),
                            index,
                            worker as u64,
                            start,
                            log.clone(),
                        )));
                    }
                }
                Demand::OpenLoop {
                    per_second,
                    give_up,
                } => {
                    tasks.push(tokio::task::spawn_local(open_loop(
                        clients.clone(),
                        per_second,
                        give_up,
                        stop,
                        self.seed,
                        log.clone(),
                    )));
                }
            }
            for second in 1..=seconds {
                tokio::time::sleep_until(started + Duration::from_secs(second as u64)).await;
                progress(Duration::from_secs(second as u64));
            }
            for task in tasks {
                task.abort();
            }
            let log = log.borrow();
            PacingReport {
                capacity: (0..seconds)
                    .map(|s| self.capacity_at(Duration::from_secs(s as u64)))
                    .collect(),
                seconds: log.seconds.clone(),
                clients: log.clients.clone(),
                gave_up: log.gave_up,
            }
        }))
    }
}

async fn closed_loop<S>(
    mut client: S,
    index: usize,
    worker: u64,
    start: Instant,
    log: Rc<RefCell<Log>>,
) where
    S: Service<u64, Response = Admission>,
{
    tokio::time::sleep_until(start).await;
    let mut id = worker << 32;
    loop {
        if poll_fn(|cx| client.poll_ready(cx)).await.is_err() {
            return;
        }
        let outcome = client.call(id).await;
        id += 1;
        if let Ok(Admission::Accepted) = outcome {
            log.borrow_mut().success(index);
        }
    }
}

async fn open_loop<S>(
    clients: Vec<S>,
    per_second: f64,
    give_up: Duration,
    stop: Instant,
    seed: u64,
    log: Rc<RefCell<Log>>,
) where
    S: Service<u64, Response = Admission> + Clone + 'static,
{
    let mut rng = Rng::stream(seed, 0xA441);
    let mut next = Instant::now();
    for id in 0.. {
        next += Duration::from_secs_f64(-(1.0 - rng.next_f64()).ln() / per_second);
        if next >= stop {
            return;
        }
        tokio::time::sleep_until(next).await;
        let index = id as usize % clients.len();
        let mut client = clients[index].clone();
        let log = log.clone();
        tokio::task::spawn_local(async move {
            let ready = tokio::time::timeout(give_up, poll_fn(|cx| client.poll_ready(cx))).await;
            if !matches!(ready, Ok(Ok(()))) {
                log.borrow_mut().gave_up += 1;
                return;
            }
            if let Ok(Admission::Accepted) = client.call(id).await {
                log.borrow_mut().success(index);
            }
        });
    }
}

struct Log {
    started: Instant,
    seconds: Vec<PacingSample>,
    clients: Vec<Vec<u64>>,
    gave_up: u64,
}

impl Log {
    fn second(&self) -> Option<usize> {
        let s = self.started.elapsed().as_secs() as usize;
        (s < self.seconds.len()).then_some(s)
    }

    fn success(&mut self, client: usize) {
        if let Some(s) = self.second() {
            self.clients[client][s] += 1;
        }
    }
}

/// The store, as a `Service` a client wraps: each write is admitted or
/// throttled when it arrives, and answered after the latency.
#[derive(Clone)]
pub struct Store {
    inner: Rc<RefCell<StoreState>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

struct StoreState {
    scenario: Pacing,
    started: Instant,
    /// When each write of the last second was admitted.
    admitted: VecDeque<Instant>,
    rng: Rng,
    log: Rc<RefCell<Log>>,
}

impl StoreState {
    fn write(&mut self) -> (Admission, Duration) {
        let now = Instant::now();
        let since = now.saturating_duration_since(self.started);
        while self
            .admitted
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= Duration::from_secs(1))
        {
            self.admitted.pop_front();
        }
        let answer = match self.scenario.capacity_at(since) {
            Some(rate) if self.admitted.len() >= rate as usize => Admission::Throttled,
            _ => {
                self.admitted.push_back(now);
                Admission::Accepted
            }
        };
        let mut log = self.log.borrow_mut();
        if let Some(s) = log.second() {
            let sample = &mut log.seconds[s];
            sample.attempts += 1;
            match answer {
                Admission::Accepted => sample.accepted += 1,
                Admission::Throttled => sample.throttled += 1,
            }
        }
        let base = match answer {
            Admission::Accepted => self.scenario.latency,
            Admission::Throttled => self
                .scenario
                .refusal_latency
                .unwrap_or(self.scenario.latency),
        };
        let spread = self.scenario.latency_spread;
        let latency = base.mul_f64(1.0 - spread + 2.0 * spread * self.rng.next_f64());
        (answer, latency)
    }
}

impl Service<u64> for Store {
    type Response = Admission;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: u64) -> Answer {
        let (write, latency) = self.inner.borrow_mut().write();
        Answer {
            write,
            sleep: Box::pin(tokio::time::sleep(latency)),
        }
    }
}

/// The store's answer, after its latency.
pub struct Answer {
    write: Admission,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("write", &self.write)
            .finish()
    }
}

impl Future for Answer {
    type Output = Result<Admission, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        std::task::ready!(self.sleep.as_mut().poll(cx));
        Poll::Ready(Ok(self.write))
    }
}

/// What the store saw in one second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacingSample {
    /// Writes that arrived, retries included.
    pub attempts: u64,
    /// Writes admitted (goodput).
    pub accepted: u64,
    /// Writes throttled.
    pub throttled: u64,
}

/// The outcome of a [`Pacing`] run, per second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacingReport {
    /// The store's rate in each second; `None` when it throttled nothing.
    pub capacity: Vec<Option<u32>>,
    /// What the store saw in each second.
    pub seconds: Vec<PacingSample>,
    /// Writes each client got accepted, per second (by the time the answer
    /// arrived).
    pub clients: Vec<Vec<u64>>,
    /// Open-loop writes abandoned before they could be sent.
    pub gave_up: u64,
}

impl PacingReport {
    fn window(&self, seconds: Range<usize>) -> &[PacingSample] {
        let end = seconds.end.min(self.seconds.len());
        &self.seconds[seconds.start.min(end)..end]
    }

    /// Mean writes accepted per second over `seconds`.
    pub fn goodput(&self, seconds: Range<usize>) -> f64 {
        let window = self.window(seconds);
        window.iter().map(|s| s.accepted).sum::<u64>() as f64 / window.len().max(1) as f64
    }

    /// Throttled writes as a share of all attempts over `seconds`.
    pub fn throttled_share(&self, seconds: Range<usize>) -> f64 {
        let window = self.window(seconds);
        let attempts: u64 = window.iter().map(|s| s.attempts).sum();
        window.iter().map(|s| s.throttled).sum::<u64>() as f64 / attempts.max(1) as f64
    }

    /// The most attempts in any one second of `seconds`, as a multiple of the
    /// store's rate in that second (seconds without a limit are skipped).
    pub fn peak_load(&self, seconds: Range<usize>) -> f64 {
        let start = seconds.start;
        self.window(seconds)
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some(s.attempts as f64 / f64::from(self.capacity[start + i]?)))
            .fold(0.0, f64::max)
    }

    /// The first second from `from` on after which the mean goodput of every
    /// window of [`RECOVERY_WINDOW`](super::RECOVERY_WINDOW) (10 s, as the
    /// storm measures recovery) stays at least `share` of the store's rate,
    /// in seconds after `from`; `None` if it never does.
    pub fn settled(&self, share: f64, from: usize) -> Option<usize> {
        let n = self.seconds.len();
        let width = super::RECOVERY_WINDOW.as_secs() as usize;
        let good = |start: usize| {
            let cap = self.capacity[start..start + width]
                .iter()
                .map(|c| c.map_or(f64::INFINITY, f64::from))
                .sum::<f64>()
                / width as f64;
            self.goodput(start..start + width) >= share * cap
        };
        let mut settled = None;
        for start in from..(n + 1).saturating_sub(width) {
            if good(start) {
                settled.get_or_insert(start - from);
            } else {
                settled = None;
            }
        }
        settled
    }

    /// Writes each client got accepted over `seconds`.
    pub fn client_goodput(&self, seconds: Range<usize>) -> Vec<u64> {
        self.clients
            .iter()
            .map(|c| {
                c[seconds.start.min(c.len())..seconds.end.min(c.len())]
                    .iter()
                    .sum()
            })
            .collect()
    }

    /// Jain's fairness index of the clients' goodput over `seconds`: 1 when
    /// all got the same, `1/n` when one got everything.
    pub fn fairness(&self, seconds: Range<usize>) -> f64 {
        let shares = self.client_goodput(seconds);
        let sum: f64 = shares.iter().map(|&x| x as f64).sum();
        let squares: f64 = shares.iter().map(|&x| (x as f64) * (x as f64)).sum();
        if squares == 0.0 {
            return 1.0;
        }
        sum * sum / (shares.len() as f64 * squares)
    }
}
