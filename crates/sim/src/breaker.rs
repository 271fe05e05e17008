//! The circuit-breaker scenario: a host that dies and comes back, and what a
//! [`CircuitBreaker`] (or client-side adaptive throttling, its continuous
//! form, or nothing) on top of the layer's defaults sends it meanwhile.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::LocalSet;
use tokio::time::Instant;
use tower_service::Service;

use super::connection::{AttemptError, Request};
use super::partial::FlakyAttempt;
use super::storm::Storm;
use super::strategy::{RetryErrors, FIRST_DELAY, MAX_DELAY};
use super::StormReport;
use tower_backoff_core::breaker::{BreakerState, CircuitBreaker};
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::events::Event;
use tower_backoff_core::policy::Cause;
use tower_backoff_core::schedule::Exponential;
use tower_backoff_core::{BackoffLayer, Rng};

/// Statistics interval of a [`BreakerReport`]: fine enough to time the
/// return of traffic to within a tenth of a second.
pub const BREAKER_INTERVAL: Duration = Duration::from_millis(100);

/// What guards the host, on top of the layer's defaults (3 attempts,
/// exponential backoff with full jitter, the default budget).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Guard {
    /// Nothing but the retry layer's defaults.
    Defaults,
    /// The defaults with a [`CircuitBreaker`] of its defaults (seeded).
    Breaker,
    /// The defaults under client-side adaptive throttling (Google SRE book,
    /// chapter 21): each request is rejected locally with probability
    /// `max(0, (requests - k × accepts) / (requests + 1))`, counted over the
    /// last two minutes.
    Throttle {
        /// The book's `K`: 2 by default.
        k: f64,
    },
}

impl Guard {
    /// A short name for tables.
    pub fn name(&self) -> String {
        match self {
            Guard::Defaults => "defaults".into(),
            Guard::Breaker => "defaults + breaker".into(),
            Guard::Throttle { k } => format!("defaults + adaptive throttling K = {k}"),
        }
    }
}

/// A host that answers every attempt after a round trip, failing it at
/// random while up and always while dead, and the clients of one process
/// (clones of one service) sending it a steady Poisson stream of requests.
///
/// Defaults: 50 requests a second through 10 clones for 60 s; a 20 ms round
/// trip; no failures while up; dead from 10 s to 40 s (every attempt fails
/// after its round trip, as a refused connection or a 503 does).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerScenario {
    rate: f64,
    clones: usize,
    rtt: Duration,
    failure_rate: f64,
    dead: Option<Range<Duration>>,
    duration: Duration,
    seed: u64,
}

impl Default for BreakerScenario {
    fn default() -> Self {
        Self::new()
    }
}

impl BreakerScenario {
    /// The default scenario (see the type's docs).
    pub fn new() -> Self {
        Self {
            rate: 50.0,
            clones: 10,
            rtt: Duration::from_millis(20),
            failure_rate: 0.0,
            dead: Some(Duration::from_secs(10)..Duration::from_secs(40)),
            duration: Duration::from_secs(60),
            seed: 1,
        }
    }

    /// Logical requests per second, all clones together.
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// The host's round trip.
    pub fn rtt(mut self, rtt: Duration) -> Self {
        self.rtt = rtt;
        self
    }

    /// The probability that an attempt fails while the host is up.
    pub fn failure_rate(mut self, p: f64) -> Self {
        self.failure_rate = p;
        self
    }

    /// When the host is dead, if ever.
    pub fn dead(mut self, window: Option<Range<Duration>>) -> Self {
        self.dead = window;
        self
    }

    /// How long requests are issued.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Seeds the workload, the failures, the layer's jitter and the breaker.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Runs the scenario with `guard`. Blocks until done, on a fresh runtime
    /// with a paused clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run(&self, guard: Guard) -> Result<BreakerReport, ConfigError> {
        if !(0.0..=1.0).contains(&self.failure_rate) {
            return Err(ConfigError::new("failure_rate", "must be within [0, 1]"));
        }
        super::workload::check_open_load(self.clones, self.rate, self.duration)?;
        // The layer's observers must be `Send + Sync`.
        let transitions = Arc::new(Mutex::new(Vec::new()));
        let runtime = super::paused_runtime();
        let report = LocalSet::new().block_on(&runtime, async {
            let start = Instant::now();
            let samples = Rc::new(RefCell::new(Samples::new(start, self.duration)));
            let host = Host {
                shared: Rc::new(RefCell::new(HostState {
                    rng: Rng::stream(self.seed, 0xB4EA),
                    start,
                    samples: samples.clone(),
                })),
                rtt: self.rtt,
                failure_rate: self.failure_rate,
                dead: self.dead.clone(),
            };
            let builder = BackoffLayer::builder()
                .policy(RetryErrors::new(Cause::Transient))
                .schedule(Exponential::new(FIRST_DELAY).max_delay(MAX_DELAY))
                .seed(self.seed);
            match guard {
                Guard::Defaults => {
                    let layer = builder.build()?;
                    self.drive(start, &samples, |_| {
                        tower_layer::Layer::layer(&layer, host.clone())
                    })
                    .await;
                }
                Guard::Breaker => {
                    let seen = transitions.clone();
                    let breaker = CircuitBreaker::builder().seed(self.seed).build()?;
                    let layer = builder
                        .observer(move |event: &Event| {
                            if let Event::Breaker(state) = event {
                                let mut seen = seen.lock().expect("never poisoned: one thread");
                                seen.push((start.elapsed(), *state));
                            }
                        })
                        .circuit_breaker(breaker)
                        .build()?;
                    self.drive(start, &samples, |_| {
                        tower_layer::Layer::layer(&layer, host.clone())
                    })
                    .await;
                }
                Guard::Throttle { k } => {
                    let layer = builder.build()?;
                    let throttle = Rc::new(RefCell::new(ThrottleState::new(
                        start,
                        k,
                        Rng::stream(self.seed, 0x7407),
                    )));
                    self.drive(start, &samples, |_| Throttled {
                        inner: tower_layer::Layer::layer(&layer, host.clone()),
                        state: throttle.clone(),
                    })
                    .await;
                }
            }
            let samples = samples.borrow().series.clone();
            Ok::<_, ConfigError>(samples)
        })?;
        let transitions = std::mem::take(&mut *transitions.lock().expect("never poisoned"));
        Ok(BreakerReport {
            samples: report,
            transitions,
            dead: self.dead.clone(),
            rtt: self.rtt,
        })
    }

    async fn drive<S>(
        &self,
        start: Instant,
        samples: &Rc<RefCell<Samples>>,
        mut make: impl FnMut(usize) -> S,
    ) where
        S: Service<Request> + Clone + 'static,
    {
        let clients: Vec<S> = (0..self.clones).map(&mut make).collect();
        let mut rng = Rng::stream(self.seed, 0xC11E47);
        let stop = start + self.duration;
        let mut next = start;
        let mut id = 0;
        loop {
            let gap = -(1.0 - rng.next_f64()).ln() / self.rate;
            next += Duration::from_secs_f64(gap);
            if next >= stop {
                break;
            }
            tokio::time::sleep_until(next).await;
            let mut client = clients[(rng.next_u64() % clients.len() as u64) as usize].clone();
            samples.borrow_mut().at(next).requests += 1;
            let samples = samples.clone();
            let request = Request { id };
            id += 1;
            tokio::task::spawn_local(async move {
                let ok = match poll_fn(|cx| client.poll_ready(cx)).await {
                    Ok(()) => client.call(request).await.is_ok(),
                    Err(_) => false,
                };
                let mut samples = samples.borrow_mut();
                let sample = samples.at(Instant::now());
                if ok {
                    sample.succeeded += 1;
                }
            });
        }
        // Long enough for every request to end.
        tokio::time::sleep_until(stop + Duration::from_secs(60)).await;
    }
}

/// What happened in one [`BREAKER_INTERVAL`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BreakerSample {
    /// Logical requests issued.
    pub requests: u64,
    /// Attempts that reached the host, first attempts and retries.
    pub calls: u64,
    /// Logical requests that ended in success.
    pub succeeded: u64,
}

struct Samples {
    start: Instant,
    series: Vec<BreakerSample>,
}

impl Samples {
    fn new(start: Instant, duration: Duration) -> Self {
        let len = (duration + Duration::from_secs(61)).as_millis() / BREAKER_INTERVAL.as_millis();
        Self {
            start,
            series: vec![BreakerSample::default(); len as usize],
        }
    }

    fn at(&mut self, at: Instant) -> &mut BreakerSample {
        let index = (at.saturating_duration_since(self.start).as_millis()
            / BREAKER_INTERVAL.as_millis()) as usize;
        let last = self.series.len() - 1;
        &mut self.series[index.min(last)]
    }
}

/// What a [`BreakerScenario`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerReport {
    /// Per [`BREAKER_INTERVAL`], from the start.
    pub samples: Vec<BreakerSample>,
    /// The breaker's state changes, when it had one, with their time.
    pub transitions: Vec<(Duration, BreakerState)>,
    dead: Option<Range<Duration>>,
    rtt: Duration,
}

impl BreakerReport {
    fn index(at: Duration) -> usize {
        (at.as_millis() / BREAKER_INTERVAL.as_millis()) as usize
    }

    /// How many times the breaker opened.
    pub fn openings(&self) -> usize {
        self.transitions
            .iter()
            .filter(|(_, state)| *state == BreakerState::Open)
            .count()
    }

    /// When the breaker first opened, if it did.
    pub fn first_open(&self) -> Option<Duration> {
        self.transitions
            .iter()
            .find(|(_, state)| *state == BreakerState::Open)
            .map(|(at, _)| *at)
    }

    /// Attempts that reached the host per logical request issued, over
    /// `window` (whole intervals).
    pub fn calls_per_request(&self, window: Range<Duration>) -> f64 {
        let range = Self::index(window.start)..Self::index(window.end).min(self.samples.len());
        let samples = &self.samples[range];
        let requests: u64 = samples.iter().map(|s| s.requests).sum();
        let calls: u64 = samples.iter().map(|s| s.calls).sum();
        if requests == 0 {
            0.0
        } else {
            calls as f64 / requests as f64
        }
    }

    /// While the host was dead: attempts that reached it per request, from
    /// when the guard took hold (the breaker opened; for the others, a 10 s
    /// window after it died) to its recovery.
    pub fn dead_calls_per_request(&self) -> Option<f64> {
        let dead = self.dead.clone()?;
        let from = self
            .first_open()
            .filter(|at| dead.contains(at))
            .unwrap_or(dead.start + Duration::from_secs(10));
        Some(self.calls_per_request(from..dead.end))
    }

    /// Time from the host's recovery until traffic is back: the first second
    /// in which at least 90 % of the requests issued reach the host, and
    /// every second after it.
    pub fn traffic_back_after(&self) -> Option<Duration> {
        let dead = self.dead.clone()?;
        let per_second =
            (Duration::from_secs(1).as_millis() / BREAKER_INTERVAL.as_millis()) as usize;
        let first = Self::index(dead.end);
        let end = self.samples.len() - per_second;
        let back = |i: usize| {
            let window = &self.samples[i..i + per_second];
            let requests: u64 = window.iter().map(|s| s.requests).sum();
            let calls: u64 = window.iter().map(|s| s.calls).sum();
            requests == 0 || calls as f64 >= 0.9 * requests as f64
        };
        // Only up to the end of the workload: then requests stop.
        let last = end.min(Self::index(self.horizon()));
        let mut candidate = None;
        for i in first..last {
            match (back(i), candidate) {
                (true, None) => candidate = Some(i),
                (false, Some(_)) => candidate = None,
                _ => {}
            }
        }
        candidate.map(|i| BREAKER_INTERVAL * (i - first) as u32)
    }

    /// When the breaker closed after the host recovered, from the recovery.
    pub fn closed_after_recovery(&self) -> Option<Duration> {
        let dead = self.dead.clone()?;
        self.transitions
            .iter()
            .find(|(at, state)| *at >= dead.end && *state == BreakerState::Closed)
            .map(|(at, _)| *at - dead.end)
    }

    /// The host's round trip.
    pub fn rtt(&self) -> Duration {
        self.rtt
    }

    fn horizon(&self) -> Duration {
        let issued = self
            .samples
            .iter()
            .rposition(|s| s.requests > 0)
            .unwrap_or(0);
        BREAKER_INTERVAL * issued as u32
    }
}

/// The host of a [`BreakerScenario`].
#[derive(Clone)]
struct Host {
    shared: Rc<RefCell<HostState>>,
    rtt: Duration,
    failure_rate: f64,
    dead: Option<Range<Duration>>,
}

struct HostState {
    rng: Rng,
    start: Instant,
    samples: Rc<RefCell<Samples>>,
}

impl Service<Request> for Host {
    type Response = ();
    type Error = AttemptError;
    type Future = FlakyAttempt;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), AttemptError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request) -> FlakyAttempt {
        let now = Instant::now();
        let mut state = self.shared.borrow_mut();
        state.samples.borrow_mut().at(now).calls += 1;
        let since = now.saturating_duration_since(state.start);
        let dead = self.dead.as_ref().is_some_and(|d| d.contains(&since));
        let fails = dead || state.rng.next_f64() < self.failure_rate;
        FlakyAttempt::new(self.rtt, fails)
    }
}

/// Client-side adaptive throttling over a client: requests and accepts per
/// second over the last two minutes.
#[derive(Clone)]
struct Throttled<S> {
    inner: S,
    state: Rc<RefCell<ThrottleState>>,
}

const THROTTLE_SECONDS: usize = 120;

struct ThrottleState {
    start: Instant,
    k: f64,
    rng: Rng,
    // Per second, in a ring: (second, requests, accepts).
    ring: Vec<(u64, u64, u64)>,
}

impl ThrottleState {
    fn new(start: Instant, k: f64, rng: Rng) -> Self {
        Self {
            start,
            k,
            rng,
            ring: vec![(u64::MAX, 0, 0); THROTTLE_SECONDS],
        }
    }

    fn slot(&mut self) -> &mut (u64, u64, u64) {
        let second = Instant::now()
            .saturating_duration_since(self.start)
            .as_secs();
        let slot = &mut self.ring[(second % THROTTLE_SECONDS as u64) as usize];
        if slot.0 != second {
            *slot = (second, 0, 0);
        }
        slot
    }

    /// Counts a request; whether it may go out.
    fn admit(&mut self) -> bool {
        let second = Instant::now()
            .saturating_duration_since(self.start)
            .as_secs();
        let (requests, accepts) = self
            .ring
            .iter()
            .filter(|(s, _, _)| *s != u64::MAX && second - s < THROTTLE_SECONDS as u64)
            .fold((0, 0), |(r, a), (_, sr, sa)| (r + sr, a + sa));
        self.slot().1 += 1;
        let p = ((requests as f64 - self.k * accepts as f64) / (requests as f64 + 1.0)).max(0.0);
        self.rng.next_f64() >= p
    }
}

impl<S> Service<Request> for Throttled<S>
where
    S: Service<Request> + Clone + 'static,
{
    type Response = S::Response;
    type Error = Option<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Option<S::Error>>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Some)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if !self.state.borrow_mut().admit() {
            return Box::pin(async { Err(None) });
        }
        let future = self.inner.call(request);
        let state = self.state.clone();
        Box::pin(async move {
            let outcome = future.await;
            if outcome.is_ok() {
                state.borrow_mut().slot().2 += 1;
            }
            outcome.map_err(Some)
        })
    }
}

/// Runs `storm` with the layer's defaults and a [`CircuitBreaker`] of its
/// defaults shared by every client (one process's view), seeded with `seed`:
/// the storm table's "defaults" with the breaker.
///
/// # Errors
/// A [`ConfigError`] naming a setting of `storm` that cannot work.
pub fn storm_with_breaker(storm: &Storm, seed: u64) -> Result<StormReport, ConfigError> {
    let layer = BackoffLayer::builder()
        .policy(RetryErrors::new(Cause::Timeout))
        .schedule(Exponential::new(FIRST_DELAY).max_delay(MAX_DELAY))
        .seed(seed)
        .circuit_breaker(CircuitBreaker::builder().seed(seed).build()?)
        .build()?;
    storm.run(|c| tower_layer::Layer::layer(&layer, c))
}
