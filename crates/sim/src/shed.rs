//! The server half in the simulation: a front that admits or sheds each
//! attempt before the server does any work for it, as
//! `tower_backoff_shed::ShedLayer` does, beside a fixed limit (tower's
//! `load_shed` over `concurrency_limit`).
//!
//! The front is what the shed layer is in a real server: it runs while the
//! server's work is stalled. During a [`ServerModel`]'s outage what arrives
//! waits in the accept backlog (up to its size, the rest is lost, as Linux
//! drops a SYN); when the outage ends every waiting request goes through
//! admission, so the front sees the backlog arrive at once and sheds what it
//! cannot admit. Admitted work is never cancelled: the server finishes it
//! even when its client gave up.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::future::{poll_fn, Future};
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::LocalSet;
use tokio::time::Instant;
use tower_service::Service;

use super::connection::Request;
use super::server::{Server, ServerModel};
use super::storm::Storm;
use super::strategy::{FIRST_DELAY, MAX_DELAY};
use super::StormReport;
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::policy::{Cause, Decision, Policy};
use tower_backoff_core::schedule::Exponential;
use tower_backoff_core::{BackoffLayer, Rng};
use tower_backoff_shed::{Criticality, Limiter, Priority};

/// What stands in front of the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gate {
    /// The shed layer's limiter with its defaults (seeded): admission by
    /// latency, rejections with a spread `Retry-After` or "do not retry".
    Shed,
    /// tower's `load_shed` over `concurrency_limit(n)`: a fixed limit, and
    /// a plain 503 without a delay when it is full.
    Fixed(usize),
}

impl Gate {
    /// A short name for tables.
    pub fn name(&self) -> String {
        match self {
            Gate::Shed => "defaults + shed (the pair)".into(),
            Gate::Fixed(n) => format!("defaults + tower load_shed + concurrency_limit({n})"),
        }
    }
}

/// Why an attempt through a [`ShedFront`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedError {
    /// No answer within the attempt's timeout.
    TimedOut,
    /// Shed by the limiter: come back after the delay, or (`None`) do not.
    Rejected {
        /// The `Retry-After` it carried; `None` is `x-should-retry: false`.
        retry_after: Option<Duration>,
    },
    /// Shed by a fixed limit: a 503 with no delay.
    Shed,
    /// The server was dropped; only when a run ends.
    ServerGone,
}

impl std::fmt::Display for ShedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShedError::TimedOut => "attempt timed out",
            ShedError::Rejected { .. } => "shed with a delay to come back after",
            ShedError::Shed => "shed",
            ShedError::ServerGone => "server gone",
        })
    }
}

impl std::error::Error for ShedError {}

/// The client half's reading of the server's answers, as `HttpPolicy`'s
/// defaults read them: a timeout is retried on the schedule, a rejection
/// with a delay after that delay, a rejection that says not to retry is
/// final, and a plain 503 is retried on the schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShedSignals;

impl Policy<Request, (), ShedError> for ShedSignals {
    fn classify(&self, _: &Request, result: &Result<(), ShedError>) -> Decision {
        match result {
            Ok(()) => Decision::Success,
            Err(ShedError::TimedOut) => Decision::retry().because(Cause::Timeout),
            Err(ShedError::Rejected {
                retry_after: Some(delay),
            }) => Decision::retry_after(*delay).because(Cause::Throttled),
            Err(ShedError::Rejected { retry_after: None }) | Err(ShedError::ServerGone) => {
                Decision::Final
            }
            Err(ShedError::Shed) => Decision::retry().because(Cause::Throttled),
        }
    }

    fn clone_request(&self, request: &Request) -> Option<Request> {
        Some(*request)
    }
}

enum Admission {
    Limiter(Limiter),
    Fixed {
        limit: usize,
        in_flight: Cell<usize>,
    },
}

struct Front {
    server: Server,
    admission: Admission,
    outage: Range<Duration>,
    backlog: usize,
    held: Cell<usize>,
    /// Logical requests seen: a second attempt is a retry, as the client's
    /// `x-retry-attempt` header tells a real server.
    seen: RefCell<HashSet<u64>>,
    /// (admitted at, latency) of each admitted request.
    latencies: RefCell<Vec<(Duration, Duration)>>,
}

/// A client's connection to a [`Server`] behind a [`Gate`]: the `Service`
/// the client's retry layer wraps, one attempt at a time, each with its own
/// timeout.
#[derive(Clone)]
pub struct ShedFront {
    front: Rc<Front>,
    timeout: Duration,
}

impl std::fmt::Debug for ShedFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShedFront")
            .field("server", &self.front.server)
            .finish_non_exhaustive()
    }
}

impl ShedFront {
    /// A front to `server` (running `model`) behind `gate`, attempts timing
    /// out after `timeout`.
    ///
    /// # Errors
    /// A [`ConfigError`] from the limiter's settings.
    pub fn new(
        server: Server,
        model: &ServerModel,
        gate: Gate,
        timeout: Duration,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let admission = match gate {
            Gate::Shed => Admission::Limiter(Limiter::builder().seed(seed).build()?),
            Gate::Fixed(limit) => Admission::Fixed {
                limit,
                in_flight: Cell::new(0),
            },
        };
        Ok(Self {
            front: Rc::new(Front {
                server,
                admission,
                outage: model.outage_window(),
                backlog: model.backlog_size(),
                held: Cell::new(0),
                seen: RefCell::new(HashSet::new()),
                latencies: RefCell::new(Vec::new()),
            }),
            timeout,
        })
    }

    /// (admitted at, latency) of every admitted request so far, times from
    /// the server's start.
    pub fn latencies(&self) -> Vec<(Duration, Duration)> {
        self.front.latencies.borrow().clone()
    }
}

impl Front {
    async fn serve(
        self: Rc<Self>,
        request: Request,
        reply: oneshot::Sender<Result<(), ShedError>>,
    ) {
        let start = self.server.started();
        if self.outage.contains(&start.elapsed()) {
            if self.held.get() >= self.backlog {
                // Lost: the client hears nothing and times out.
                self.server.note_arrival();
                std::mem::forget(reply);
                return;
            }
            self.held.set(self.held.get() + 1);
            tokio::time::sleep_until(start + self.outage.end).await;
            self.held.set(self.held.get() - 1);
        }
        let retry = !self.seen.borrow_mut().insert(request.id);
        let admitted = Instant::now();
        let permit = match &self.admission {
            Admission::Limiter(limiter) => {
                let priority = Priority::new(Criticality::Default, retry);
                match limiter.try_acquire(priority, admitted.into_std()) {
                    Ok(permit) => Some(permit),
                    Err(rejection) => {
                        self.server.note_arrival();
                        let retry_after = rejection.retry_after();
                        let _ = reply.send(Err(ShedError::Rejected { retry_after }));
                        return;
                    }
                }
            }
            Admission::Fixed { limit, in_flight } => {
                if in_flight.get() >= *limit {
                    self.server.note_arrival();
                    let _ = reply.send(Err(ShedError::Shed));
                    return;
                }
                in_flight.set(in_flight.get() + 1);
                None
            }
        };
        let outcome = self.server.submit().await;
        let done = Instant::now();
        match permit {
            Some(permit) => permit.complete(done.into_std()),
            None => {
                if let Admission::Fixed { in_flight, .. } = &self.admission {
                    in_flight.set(in_flight.get() - 1);
                }
            }
        }
        self.latencies
            .borrow_mut()
            .push((admitted - start, done - admitted));
        let _ = reply.send(outcome.map_err(|_| ShedError::ServerGone));
    }
}

impl Service<Request> for ShedFront {
    type Response = ();
    type Error = ShedError;
    type Future = Pin<Box<dyn Future<Output = Result<(), ShedError>>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ShedError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let (tx, rx) = oneshot::channel();
        tokio::task::spawn_local(self.front.clone().serve(request, tx));
        let timeout = self.timeout;
        Box::pin(async move {
            let answer = async move {
                match rx.await {
                    Ok(answer) => answer,
                    Err(_) => std::future::pending().await,
                }
            };
            tokio::time::timeout(timeout, answer)
                .await
                .unwrap_or(Err(ShedError::TimedOut))
        })
    }
}

/// The client of each of the clients: the retry layer's defaults
/// (exponential backoff with full jitter, 3 attempts, the default budget)
/// reading the server's signals, one layer per client as separate processes
/// have.
fn client_layer(seed: u64, client: u64) -> Result<BackoffLayer<ShedSignals>, ConfigError> {
    BackoffLayer::builder()
        .policy(ShedSignals)
        .schedule(Exponential::new(FIRST_DELAY).max_delay(MAX_DELAY))
        .seed(seed.wrapping_mul(1_000_003).wrapping_add(client))
        .build()
}

/// The metastable set-up: 1,000 clients, each sending a request every 4 s
/// on average (250 a second, 83 % of the server's full speed), 1 s timeouts,
/// a server whose 10 s stall from 20 s in leaves 1,024 requests in its
/// accept backlog: with the client half alone it never recovers.
pub fn metastable_storm(seed: u64) -> Storm {
    Storm::new()
        .server(
            ServerModel::new()
                .backlog(1024)
                .outage(Duration::from_secs(20), Duration::from_secs(10)),
        )
        .seed(seed)
}

/// Runs `storm` with every client on the retry layer's defaults (a layer
/// each) behind `gate` at the server.
///
/// # Errors
/// A [`ConfigError`] naming a setting that cannot work.
pub fn shed_storm(storm: &Storm, gate: Gate, seed: u64) -> Result<StormReport, ConfigError> {
    let mut layers = Vec::new();
    for client in 0..storm.client_count() as u64 {
        layers.push(client_layer(seed, client)?);
    }
    let mut layers = layers.into_iter().cycle();
    shed_storm_with(storm, gate, seed, move |front| {
        let layer = layers.next().expect("a cycle of at least one layer");
        tower_layer::Layer::layer(&layer, front)
    })
}

/// Runs `storm` behind `gate` with a client made by `make_client` for each
/// of the clients, from a [`ShedFront`] to the server (as
/// [`Storm::run`] does from a [`Connection`](crate::Connection)).
///
/// # Errors
/// A [`ConfigError`] naming a setting that cannot work.
pub fn shed_storm_with<S, F>(
    storm: &Storm,
    gate: Gate,
    seed: u64,
    mut make_client: F,
) -> Result<StormReport, ConfigError>
where
    F: FnMut(ShedFront) -> S,
    S: Service<Request> + Clone + 'static,
{
    storm.validate()?;
    let runtime = super::paused_runtime();
    LocalSet::new().block_on(&runtime, async {
        let server = storm.start_server();
        let front = ShedFront::new(server.clone(), storm.model(), gate, storm.timeout(), seed)?;
        let report = storm
            .drive(&server, || make_client(front.clone()), |_| {})
            .await;
        Ok(report)
    })
}

/// Statistics interval of an [`OverloadReport`].
const OVERLOAD_INTERVAL: Duration = Duration::from_millis(100);

/// 1,000 clients offering twice the server's capacity for 60 s, between
/// spells at half of it, through the retry layer's defaults (a layer each)
/// and a [`Gate`].
///
/// The server: 100 ms of work (± 20 %), 30 at full speed (its capacity:
/// 300 requests a second), each request more slowing every one by 3.3 %,
/// so throughput stays near capacity for a few requests past the knee and
/// falls beyond (a server that thrashes). Clients time out after 1 s.
#[derive(Debug, Clone, PartialEq)]
pub struct OverloadScenario {
    clients: usize,
    model: ServerModel,
    calm: f64,
    overload: f64,
    before: Duration,
    during: Duration,
    after: Duration,
    timeout: Duration,
    seed: u64,
}

impl Default for OverloadScenario {
    fn default() -> Self {
        Self::new()
    }
}

impl OverloadScenario {
    /// The scenario above: 10 s at half capacity, 60 s at twice, 20 s at half.
    pub fn new() -> Self {
        Self {
            clients: 1000,
            model: ServerModel::new().slowdown(1.0333, 1.0),
            calm: 0.5,
            overload: 2.0,
            before: Duration::from_secs(10),
            during: Duration::from_secs(60),
            after: Duration::from_secs(20),
            timeout: Duration::from_secs(1),
            seed: 1,
        }
    }

    /// Seeds the workload, the server, the limiter and the clients.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The overload, as a multiple of the capacity (default 2).
    pub fn overload(mut self, share: f64) -> Self {
        self.overload = share;
        self
    }

    /// How long the overload lasts (default 60 s).
    pub fn overload_for(mut self, during: Duration) -> Self {
        self.during = during;
        self
    }

    /// The server's capacity: requests a second at full speed.
    pub fn capacity(&self) -> f64 {
        // Capacity requests, each base_latency long, at once.
        30.0 / self.model.latency(30).as_secs_f64()
    }

    /// Runs it behind `gate`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run(&self, gate: Gate) -> Result<OverloadReport, ConfigError> {
        self.model.validate()?;
        let horizon = self.before + self.during + self.after;
        let layers: Vec<_> = (0..self.clients as u64)
            .map(|i| client_layer(self.seed, i))
            .collect::<Result<_, _>>()?;
        let runtime = super::paused_runtime();
        LocalSet::new().block_on(&runtime, async {
            let server = Server::start(&self.model, self.seed, OVERLOAD_INTERVAL, horizon);
            let front = ShedFront::new(server.clone(), &self.model, gate, self.timeout, self.seed)?;
            let clients: Vec<_> = layers
                .iter()
                .map(|l| tower_layer::Layer::layer(l, front.clone()))
                .collect();
            let start = server.started();
            let buckets = (horizon + Duration::from_secs(10)).as_millis() / 100;
            let samples = Rc::new(RefCell::new(vec![
                OverloadSample::default();
                buckets as usize
            ]));
            let at = move |t: Instant| {
                (t.saturating_duration_since(start).as_millis() / 100).min(buckets - 1) as usize
            };
            let mut rng = Rng::stream(self.seed, 0x0E71);
            let mut next = start;
            let mut id = 0;
            let capacity = self.capacity();
            loop {
                let since = next - start;
                let share = if since >= self.before && since < self.before + self.during {
                    self.overload
                } else {
                    self.calm
                };
                let gap = -(1.0 - rng.next_f64()).ln() / (share * capacity);
                next += Duration::from_secs_f64(gap);
                if next >= start + horizon {
                    break;
                }
                tokio::time::sleep_until(next).await;
                let mut client = clients[(rng.next_u64() % clients.len() as u64) as usize].clone();
                samples.borrow_mut()[at(next)].started += 1;
                let samples = samples.clone();
                let request = Request { id };
                let issued = at(next);
                id += 1;
                tokio::task::spawn_local(async move {
                    let ok = match poll_fn(|cx| client.poll_ready(cx)).await {
                        Ok(()) => client.call(request).await.is_ok(),
                        Err(_) => false,
                    };
                    let mut samples = samples.borrow_mut();
                    let sample = &mut samples[at(Instant::now())];
                    if ok {
                        sample.succeeded += 1;
                        samples[issued].served += 1;
                    } else {
                        sample.failed += 1;
                    }
                });
            }
            tokio::time::sleep_until(start + horizon + Duration::from_secs(5)).await;
            let arrivals = server.samples();
            let mut samples = samples.borrow().clone();
            for (sample, server) in samples.iter_mut().zip(arrivals) {
                sample.arrivals = server.arrivals;
            }
            Ok(OverloadReport {
                samples,
                latencies: front.latencies(),
                overload: self.before..self.before + self.during,
                capacity,
            })
        })
    }
}

/// What happened in 100 ms of an [`OverloadScenario`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverloadSample {
    /// Logical requests issued.
    pub started: u64,
    /// Logical requests that ended in success.
    pub succeeded: u64,
    /// Logical requests that ended in failure.
    pub failed: u64,
    /// Of the logical requests issued in these 100 ms, those that succeeded.
    pub served: u64,
    /// Attempts that reached the server's front, shed or not.
    pub arrivals: u64,
}

/// What an [`OverloadScenario`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct OverloadReport {
    /// Per 100 ms from the start.
    pub samples: Vec<OverloadSample>,
    /// (admitted at, latency) of every admitted request.
    pub latencies: Vec<(Duration, Duration)>,
    /// When the overload lasted.
    pub overload: Range<Duration>,
    /// The server's capacity, requests a second.
    pub capacity: f64,
}

impl OverloadReport {
    fn range(&self, window: Range<Duration>) -> &[OverloadSample] {
        let i = |d: Duration| ((d.as_millis() / 100) as usize).min(self.samples.len());
        &self.samples[i(window.start)..i(window.end)]
    }

    /// Goodput during the overload (its first 5 s left out, the limit's
    /// ramp), as a share of capacity.
    pub fn goodput_share(&self) -> f64 {
        let window = self.overload.start + Duration::from_secs(5)..self.overload.end;
        let secs = (window.end - window.start).as_secs_f64();
        let succeeded: u64 = self.range(window).iter().map(|s| s.succeeded).sum();
        succeeded as f64 / secs / self.capacity
    }

    /// The 99th percentile latency of the requests admitted in `window`.
    pub fn p99(&self, window: Range<Duration>) -> Option<Duration> {
        let mut latencies: Vec<Duration> = self
            .latencies
            .iter()
            .filter(|(at, _)| window.contains(at))
            .map(|(_, latency)| *latency)
            .collect();
        if latencies.is_empty() {
            return None;
        }
        latencies.sort_unstable();
        Some(latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)])
    }

    /// p99 of admitted requests before the overload (its first second left
    /// out) and during it.
    pub fn p99_unloaded_and_loaded(&self) -> (Option<Duration>, Option<Duration>) {
        (
            self.p99(Duration::from_secs(1)..self.overload.start),
            self.p99(self.overload.clone()),
        )
    }

    /// Attempts reaching the server in the busiest 100 ms of the overload,
    /// over the mean per 100 ms.
    pub fn busiest_over_mean(&self) -> f64 {
        let window = self.range(self.overload.clone());
        let max = window.iter().map(|s| s.arrivals).max().unwrap_or(0);
        let mean = window.iter().map(|s| s.arrivals).sum::<u64>() as f64 / window.len() as f64;
        if mean == 0.0 {
            0.0
        } else {
            max as f64 / mean
        }
    }

    /// Time from the overload's end until, for every later second, at least
    /// 95 % of the requests issued in it succeed (to 3 s before the end).
    pub fn full_goodput_after(&self) -> Option<Duration> {
        let first = (self.overload.end.as_millis() / 100) as usize;
        let issued = self.samples.iter().rposition(|s| s.started > 0)?;
        let last = issued.saturating_sub(30);
        let ok = |i: usize| {
            let w = &self.samples[i..i + 10];
            let started: u64 = w.iter().map(|s| s.started).sum();
            let served: u64 = w.iter().map(|s| s.served).sum();
            served as f64 >= 0.95 * started as f64
        };
        let mut candidate = None;
        for i in first..last {
            match (ok(i), candidate) {
                (true, None) => candidate = Some(i),
                (false, Some(_)) => candidate = None,
                _ => {}
            }
        }
        candidate.map(|i| OVERLOAD_INTERVAL * (i - first) as u32)
    }
}
