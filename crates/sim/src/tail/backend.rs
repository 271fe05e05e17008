//! [`TailBackend`]: a backend whose every attempt draws its latency from a
//! [`LatencyModel`], optionally behind a pool of workers that notices when
//! a caller gives up.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::latency::{seconds, LatencyModel};
use crate::connection::{AttemptError, Request};
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::Rng;

/// Calls are counted per second up to this many seconds after the start;
/// later ones count in the last second, so that a late call cannot make the
/// series grow without bound.
const COUNTED_SECONDS: usize = 1_000_000;

/// The settings of a [`TailBackend`]: its [`LatencyModel`], a slowdown, and
/// how many attempts it works on at once.
///
/// Defaults: [`LatencyModel::bimodal`], no slowdown, every attempt served at
/// once (as many workers as attempts).
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::{BackendModel, LatencyModel};
///
/// // The issue's degraded backend: every latency doubled from 20 s to 40 s.
/// let model = BackendModel::new(LatencyModel::bimodal())
///     .slowdown(Duration::from_secs(20), Duration::from_secs(20), 2.0);
/// assert!(model.validate().is_ok());
/// assert!(model.workers(0).validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackendModel {
    latency: LatencyModel,
    slowdown: Option<Slowdown>,
    workers: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Slowdown {
    start: Duration,
    length: Duration,
    factor: f64,
}

impl Default for BackendModel {
    fn default() -> Self {
        Self::new(LatencyModel::bimodal())
    }
}

impl BackendModel {
    /// A backend serving every attempt at once, after a latency drawn from
    /// `latency`.
    pub const fn new(latency: LatencyModel) -> Self {
        Self {
            latency,
            slowdown: None,
            workers: None,
        }
    }

    /// Multiplies the latency of every attempt that a worker takes between
    /// `start` and `start + length` (from the backend's start) by `factor`:
    /// a degraded backend whose whole distribution shifts, as after a bad
    /// deploy or under a noisy neighbour.
    pub const fn slowdown(mut self, start: Duration, length: Duration, factor: f64) -> Self {
        self.slowdown = Some(Slowdown {
            start,
            length,
            factor,
        });
        self
    }

    /// Serves at most `workers` attempts at once; the others wait in a
    /// first-in, first-out queue, and an attempt's drawn latency is its
    /// service time once a worker takes it. Extra attempts then cost the
    /// others time, as they do on a real server.
    pub const fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// The latency distribution.
    pub const fn latency(&self) -> &LatencyModel {
        &self.latency
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.latency.validate()?;
        if let Some(slowdown) = self.slowdown {
            check_duration("slowdown start", slowdown.start)?;
            check_duration("slowdown length", slowdown.length)?;
            if !slowdown.factor.is_finite() || slowdown.factor < 0.0 {
                return Err(ConfigError::new(
                    "slowdown factor",
                    format!(
                        "must be a finite number, zero or more, got {}",
                        slowdown.factor
                    ),
                ));
            }
        }
        if let Some(workers) = self.workers {
            if !(1..=1_000_000).contains(&workers) {
                return Err(ConfigError::new(
                    "workers",
                    format!("must be within 1..=1000000, got {workers}"),
                ));
            }
        }
        Ok(())
    }

    /// What `latency` becomes for an attempt a worker takes `since` the start.
    fn slowed(&self, latency: Duration, since: Duration) -> Duration {
        match self.slowdown {
            Some(s) if since >= s.start && since - s.start < s.length => {
                seconds(latency.as_secs_f64() * s.factor)
            }
            _ => latency,
        }
    }
}

/// The backend of a [`Tail`](crate::Tail) run: a tower `Service` answering
/// each attempt after its own latency, drawn from a [`BackendModel`]'s
/// [`LatencyModel`]. A cheap handle: clones share one backend.
///
/// It counts attempts started per second of its clock, and cancellations:
/// attempts whose caller dropped the response future before the answer, as
/// a hedging client does with the loser of two copies. A cancelled attempt
/// leaves the queue, or frees its worker at once: the server sees the
/// cancellation, as an HTTP/2 server sees a stream reset.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::{BackendModel, LatencyModel, Request, TailBackend};
/// use tower_service::Service;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true)
/// #     .build().unwrap().block_on(async {
/// let fixed = LatencyModel::LogNormal { median: Duration::from_millis(10), sigma: 0.0 };
/// let mut backend = TailBackend::start(&BackendModel::new(fixed), 1)?;
/// let start = tokio::time::Instant::now();
/// backend.call(Request { id: 0 }).await.unwrap();
/// assert_eq!(start.elapsed(), Duration::from_millis(10));
/// assert_eq!(backend.calls_per_second(), [1]);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct TailBackend {
    state: Rc<RefCell<State>>,
}

#[derive(Debug)]
struct State {
    model: BackendModel,
    rng: Rng,
    started: Instant,
    calls: Vec<u64>,
    cancellations: u64,
    busy: usize,
    // Cancelled jobs stay here until they reach the front: removing one from
    // the middle would cost a scan of a queue that can hold thousands.
    queue: VecDeque<Rc<Job>>,
    queued: usize,
}

#[derive(Debug)]
struct Job {
    latency: Duration,
    phase: Cell<Phase>,
    waker: RefCell<Option<Waker>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Running { until: Instant },
    Left,
}

impl TailBackend {
    /// Starts a backend of `model` now, its latencies seeded by `seed`. The
    /// slowdown and the per-second counts are timed from now.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting of `model` that cannot work.
    pub fn start(model: &BackendModel, seed: u64) -> Result<Self, ConfigError> {
        model.validate()?;
        Ok(Self {
            state: Rc::new(RefCell::new(State {
                model: *model,
                rng: Rng::stream(seed, 0x7A11),
                started: Instant::now(),
                calls: Vec::new(),
                cancellations: 0,
                busy: 0,
                queue: VecDeque::new(),
                queued: 0,
            })),
        })
    }

    /// When the backend started.
    pub fn started(&self) -> Instant {
        self.state.borrow().started
    }

    /// Attempts started in each second since the start, up to the last
    /// second with one.
    pub fn calls_per_second(&self) -> Vec<u64> {
        self.state.borrow().calls.clone()
    }

    /// Attempts started since the start.
    pub fn calls(&self) -> u64 {
        self.state.borrow().calls.iter().sum()
    }

    /// Attempts whose caller gave up on them before the answer.
    pub fn cancellations(&self) -> u64 {
        self.state.borrow().cancellations
    }

    /// Attempts a worker is serving now.
    pub fn busy(&self) -> usize {
        self.state.borrow().busy
    }

    /// Attempts waiting for a worker now.
    pub fn queued(&self) -> usize {
        self.state.borrow().queued
    }
}

impl State {
    fn arrive(&mut self, now: Instant) -> Rc<Job> {
        let second = now.saturating_duration_since(self.started).as_secs() as usize;
        let second = second.min(COUNTED_SECONDS - 1);
        if self.calls.len() <= second {
            self.calls.resize(second + 1, 0);
        }
        self.calls[second] += 1;
        let job = Rc::new(Job {
            latency: self.model.latency.sample(&mut self.rng),
            phase: Cell::new(Phase::Queued),
            waker: RefCell::new(None),
        });
        if self.model.workers.is_none_or(|n| self.busy < n) {
            self.run(&job, now);
        } else {
            self.queue.push_back(job.clone());
            self.queued += 1;
        }
        job
    }

    fn run(&mut self, job: &Job, now: Instant) {
        let since = now.saturating_duration_since(self.started);
        let latency = self.model.slowed(job.latency, since);
        job.phase.set(Phase::Running {
            until: now + latency,
        });
        self.busy += 1;
        if let Some(waker) = job.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    /// A worker is free: it takes the oldest job still waiting.
    fn release(&mut self, now: Instant) {
        self.busy -= 1;
        while let Some(job) = self.queue.pop_front() {
            if job.phase.get() == Phase::Queued {
                self.queued -= 1;
                self.run(&job, now);
                return;
            }
        }
    }

    fn cancel(&mut self, job: &Job) {
        self.cancellations += 1;
        match job.phase.replace(Phase::Left) {
            Phase::Queued => self.queued -= 1,
            Phase::Running { .. } => self.release(Instant::now()),
            Phase::Left => {}
        }
    }
}

impl Service<Request> for TailBackend {
    type Response = ();
    type Error = AttemptError;
    type Future = TailAttempt;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), AttemptError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request) -> TailAttempt {
        let job = self.state.borrow_mut().arrive(Instant::now());
        TailAttempt {
            state: self.state.clone(),
            job,
            sleep: None,
        }
    }
}

pin_project! {
    /// The future of one [`TailBackend`] attempt.
    ///
    /// # Cancellation
    /// Dropping it before it completes cancels the attempt: it leaves the
    /// queue, or frees its worker for the next one in the queue, and counts
    /// in [`TailBackend::cancellations`].
    #[derive(Debug)]
    pub struct TailAttempt {
        state: Rc<RefCell<State>>,
        job: Rc<Job>,
        // Set once a worker has taken the attempt.
        #[pin]
        sleep: Option<Sleep>,
    }

    impl PinnedDrop for TailAttempt {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.job.phase.get() != Phase::Left {
                this.state.borrow_mut().cancel(this.job);
            }
        }
    }
}

impl Future for TailAttempt {
    type Output = Result<(), AttemptError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.job.phase.get() {
            // Polled again after it completed.
            Phase::Left => return Poll::Ready(Ok(())),
            Phase::Queued => {
                *this.job.waker.borrow_mut() = Some(cx.waker().clone());
                return Poll::Pending;
            }
            Phase::Running { until } => {
                if this.sleep.is_none() {
                    this.sleep.set(Some(tokio::time::sleep_until(until)));
                }
            }
        }
        if let Some(sleep) = this.sleep.as_pin_mut() {
            std::task::ready!(sleep.poll(cx));
        }
        this.job.phase.set(Phase::Left);
        this.state.borrow_mut().release(Instant::now());
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    const MS: Duration = Duration::from_millis(1);

    /// Every attempt takes exactly 10 ms.
    fn fixed() -> BackendModel {
        BackendModel::new(LatencyModel::LogNormal {
            median: 10 * MS,
            sigma: 0.0,
        })
    }

    fn request() -> Request {
        Request { id: 0 }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_running_attempt_frees_its_worker_at_once() {
        let mut backend = TailBackend::start(&fixed().workers(1), 1).unwrap();
        let start = Instant::now();
        let first = backend.call(request());
        let second = backend.call(request());
        assert_eq!((backend.busy(), backend.queued()), (1, 1));
        tokio::time::sleep(2 * MS).await;
        drop(first);
        assert_eq!((backend.busy(), backend.queued()), (1, 0));
        second.await.unwrap();
        assert_eq!(start.elapsed(), 12 * MS);
        assert_eq!(backend.cancellations(), 1);
        assert_eq!(backend.busy(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_queued_attempt_leaves_the_queue() {
        let mut backend = TailBackend::start(&fixed().workers(1), 1).unwrap();
        let start = Instant::now();
        let first = backend.call(request());
        let second = backend.call(request());
        let third = backend.call(request());
        drop(second);
        assert_eq!((backend.busy(), backend.queued()), (1, 1));
        first.await.unwrap();
        assert_eq!(start.elapsed(), 10 * MS);
        third.await.unwrap();
        assert_eq!(start.elapsed(), 20 * MS);
        assert_eq!(backend.cancellations(), 1);
        assert_eq!((backend.busy(), backend.queued()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_attempt_polled_early_wakes_when_a_worker_takes_it() {
        let mut backend = TailBackend::start(&fixed().workers(1), 1).unwrap();
        let start = Instant::now();
        let first = backend.call(request());
        let mut second = std::pin::pin!(backend.call(request()));
        // Registers its waker while queued.
        assert!(poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx).is_pending())).await);
        tokio::join!(first, second).0.unwrap();
        assert_eq!(start.elapsed(), 20 * MS);
        assert_eq!(backend.cancellations(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_workers_every_attempt_runs_at_once_and_completions_are_no_cancellations() {
        let mut backend = TailBackend::start(&fixed(), 1).unwrap();
        let start = Instant::now();
        let all: Vec<_> = (0..100).map(|_| backend.call(request())).collect();
        assert_eq!((backend.busy(), backend.queued()), (100, 0));
        for attempt in all {
            attempt.await.unwrap();
        }
        assert_eq!(start.elapsed(), 10 * MS);
        assert_eq!(backend.cancellations(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_counted_in_the_second_they_start() {
        let mut backend = TailBackend::start(&fixed(), 1).unwrap();
        for _ in 0..3 {
            backend.call(request()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let pending = backend.call(request());
        drop(backend.call(request()));
        drop(pending);
        tokio::time::sleep(Duration::from_secs(2)).await;
        backend.call(request()).await.unwrap();
        assert_eq!(backend.calls_per_second(), [3, 2, 0, 1]);
        assert_eq!(backend.calls(), 6);
        assert_eq!(backend.cancellations(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slowdown_scales_the_latency_of_attempts_taken_within_it() {
        let model = fixed().slowdown(Duration::from_secs(1), Duration::from_secs(1), 2.5);
        let mut backend = TailBackend::start(&model, 1).unwrap();
        let mut took = Vec::new();
        for at in [0, 999, 1_000, 1_500, 1_999, 2_000] {
            tokio::time::sleep_until(backend.started() + at * MS).await;
            let begin = Instant::now();
            backend.call(request()).await.unwrap();
            took.push(begin.elapsed().as_millis());
        }
        assert_eq!(took, [10, 10, 25, 25, 25, 10]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_draws_the_same_latencies() {
        let latencies = |seed| async move {
            let mut backend = TailBackend::start(&BackendModel::default(), seed).unwrap();
            let mut all = Vec::new();
            for _ in 0..200 {
                let begin = Instant::now();
                backend.call(request()).await.unwrap();
                all.push(begin.elapsed());
            }
            all
        };
        assert_eq!(latencies(4).await, latencies(4).await);
        assert_ne!(latencies(4).await, latencies(5).await);
    }

    #[test]
    fn invalid_settings_are_named() {
        let error = |model: BackendModel| model.validate().unwrap_err().field();
        assert_eq!(error(fixed().workers(0)), "workers");
        assert_eq!(error(fixed().slowdown(MS, MS, -1.0)), "slowdown factor");
        assert_eq!(
            error(fixed().slowdown(Duration::MAX, MS, 2.0)),
            "slowdown start"
        );
        assert!(TailBackend::start(&fixed().workers(0), 1).is_err());
    }
}
