//! The server model: a service whose latency grows with the work it holds, and
//! that can stop answering for a while.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use tower_backoff_core::error::ConfigError;
use tower_backoff_core::Rng;

/// How the simulated server behaves: its latency curve, its outage and its
/// accept backlog.
///
/// Each request needs `base_latency` of work (± `work_spread`). The server
/// shares its speed between the requests it holds: with at most `capacity` in
/// flight each gets full speed, so it answers after `base_latency`; above that
/// every request slows down by `slowdown` for each `slowdown_step` requests of
/// excess, so a request that meets `n` others sees
/// `base_latency × slowdown^((n − capacity) / slowdown_step)`. Like a
/// database, it finishes what it started even when the client has given up.
///
/// From `outage_start`, for `outage`, it stops: nothing in flight progresses
/// and nothing is answered. Requests that arrive meanwhile wait in its accept
/// backlog, up to `backlog` of them, and are all taken in when it resumes;
/// beyond that they are lost and their clients time out (Linux drops a SYN
/// when the accept queue is full).
///
/// With [`retransmit`](Self::retransmit) on, what arrives during the outage
/// is neither kept in the backlog nor lost: the network holds it (as TCP
/// retransmits a SYN) and delivers it when the outage ends, every request
/// whose client still waits for it; those whose client gave up were
/// abandoned with their connection.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::ServerModel;
///
/// let model = ServerModel::new()
///     .capacity(30)
///     .outage(Duration::from_secs(20), Duration::from_secs(10));
/// assert_eq!(model.latency(30), Duration::from_millis(100));
/// assert!(model.latency(300) > Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ServerModel {
    base_latency: Duration,
    work_spread: f64,
    capacity: usize,
    slowdown: f64,
    slowdown_step: f64,
    backlog: usize,
    retransmit: bool,
    outage_start: Duration,
    outage: Duration,
}

impl std::fmt::Display for ServerModel {
    /// The latency curve and backlog, in a line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server: {:?} per request (±{:.0} %) up to {} in flight, then ×{} per {} more; {}",
            self.base_latency,
            self.work_spread * 100.0,
            self.capacity,
            self.slowdown,
            self.slowdown_step,
            if self.retransmit {
                "arrivals during the outage delivered when it ends".to_string()
            } else {
                format!("backlog {}", self.backlog)
            },
        )
    }
}

impl Default for ServerModel {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerModel {
    /// 100 ms of work per request (± 20 %), 30 requests at full speed, then
    /// 5 % slower per 15 requests more; a backlog of 512 (nginx's default
    /// `listen` backlog); no outage.
    pub const fn new() -> Self {
        Self {
            base_latency: Duration::from_millis(100),
            work_spread: 0.2,
            capacity: 30,
            slowdown: 1.05,
            slowdown_step: 15.0,
            backlog: 512,
            retransmit: false,
            outage_start: Duration::ZERO,
            outage: Duration::ZERO,
        }
    }

    /// The time one request takes when the server is not overloaded.
    pub const fn base_latency(mut self, latency: Duration) -> Self {
        self.base_latency = latency;
        self
    }

    /// Each request's work is `base_latency × uniform[1 − spread, 1 + spread]`;
    /// `spread` within `[0, 1)`.
    pub const fn work_spread(mut self, spread: f64) -> Self {
        self.work_spread = spread;
        self
    }

    /// How many requests the server works on at full speed (`C`).
    pub const fn capacity(mut self, requests: usize) -> Self {
        self.capacity = requests;
        self
    }

    /// Above capacity, latency is multiplied by `factor` for every `step`
    /// requests of excess.
    pub const fn slowdown(mut self, factor: f64, step: f64) -> Self {
        self.slowdown = factor;
        self.slowdown_step = step;
        self
    }

    /// How many requests wait in the accept backlog while the server is down.
    pub const fn backlog(mut self, requests: usize) -> Self {
        self.backlog = requests;
        self
    }

    /// Whether requests arriving during the outage are delivered when it
    /// ends (those whose client still waits) instead of going to the backlog
    /// (default `false`).
    pub const fn retransmit(mut self, on: bool) -> Self {
        self.retransmit = on;
        self
    }

    /// The server stops answering `start` after it started, for `duration`.
    pub const fn outage(mut self, start: Duration, duration: Duration) -> Self {
        self.outage_start = start;
        self.outage = duration;
        self
    }

    /// How many requests wait in the accept backlog while it is down.
    pub(crate) fn backlog_size(&self) -> usize {
        self.backlog
    }

    /// When the outage starts and ends, from the server's start.
    pub fn outage_window(&self) -> std::ops::Range<Duration> {
        self.outage_start..self.outage_start.saturating_add(self.outage)
    }

    /// How long a request takes while `in_flight` requests (itself included)
    /// share the server.
    pub fn latency(&self, in_flight: usize) -> Duration {
        let secs = self.base_latency.as_secs_f64() / self.speed(in_flight);
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }

    /// The share of full speed each request gets when `in_flight` are held.
    fn speed(&self, in_flight: usize) -> f64 {
        let excess = in_flight.saturating_sub(self.capacity) as f64;
        self.slowdown.powf(-excess / self.slowdown_step)
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.base_latency.is_zero() {
            return Err(ConfigError::new("base_latency", "must be longer than zero"));
        }
        tower_backoff_core::error::check_duration("base_latency", self.base_latency)?;
        if !(0.0..1.0).contains(&self.work_spread) {
            return Err(ConfigError::new(
                "work_spread",
                format!("must be within [0, 1), got {}", self.work_spread),
            ));
        }
        if self.capacity == 0 {
            return Err(ConfigError::new("capacity", "must be at least 1"));
        }
        if !self.slowdown.is_finite() || self.slowdown < 1.0 {
            return Err(ConfigError::new(
                "slowdown",
                format!("factor must be a finite number ≥ 1, got {}", self.slowdown),
            ));
        }
        if !self.slowdown_step.is_finite() || self.slowdown_step <= 0.0 {
            return Err(ConfigError::new(
                "slowdown",
                format!("step must be a positive number, got {}", self.slowdown_step),
            ));
        }
        tower_backoff_core::error::check_duration("outage_start", self.outage_start)?;
        tower_backoff_core::error::check_duration("outage", self.outage)
    }
}

/// A running [`ServerModel`]: a cheap handle, shared by everything that calls
/// it.
///
/// It lives on one thread: start it inside a [`tokio::task::LocalSet`] (the
/// scenarios do). Time is tokio's, so the same server runs on a paused clock in
/// simulations and in real time behind a real socket.
#[derive(Clone)]
pub struct Server {
    state: Rc<RefCell<State>>,
    wake: Rc<Notify>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.borrow();
        f.debug_struct("Server")
            .field("in_flight", &state.jobs.len())
            .field("backlog", &state.backlog.len())
            .finish()
    }
}

impl Server {
    /// Starts `model` now, recording per-`interval` statistics for `horizon`.
    ///
    /// # Panics
    /// Outside a [`tokio::task::LocalSet`], if `interval` is zero, or if the
    /// horizon holds more than 10 million intervals.
    pub fn start(model: &ServerModel, seed: u64, interval: Duration, horizon: Duration) -> Self {
        assert!(!interval.is_zero(), "statistics interval must not be zero");
        let buckets = horizon.as_nanos().div_ceil(interval.as_nanos()).max(1);
        assert!(
            buckets <= 10_000_000,
            "more than 10 million statistics intervals"
        );
        let buckets = buckets as usize;
        let now = Instant::now();
        let state = Rc::new(RefCell::new(State {
            model: model.clone(),
            started: now,
            updated: now,
            progress: 0.0,
            jobs: BinaryHeap::new(),
            backlog: VecDeque::new(),
            held: Vec::new(),
            next_job: 0,
            resumed: model.outage.is_zero(),
            rng: Rng::stream(seed, 0x5E87E5),
            interval,
            series: vec![ServerSample::default(); buckets],
            noted: 0,
        }));
        let wake = Rc::new(Notify::new());
        tokio::task::spawn_local(drive(Rc::downgrade(&state), wake.clone()));
        Self { state, wake }
    }

    /// Hands the server a request. The future resolves when the server has done
    /// its work, or never if the request was lost while the server was down
    /// and its backlog full: callers need a timeout, as real clients do.
    pub fn submit(&self) -> Submission {
        let now = Instant::now();
        let (rx, new_head) = {
            let mut state = self.state.borrow_mut();
            state.settle(now);
            state.arrive(now)
        };
        if new_head {
            self.wake.notify_one();
        }
        Submission { rx }
    }

    /// Counts an attempt that reached the server's front and was answered
    /// there, without work: a request shed.
    pub(crate) fn note_arrival(&self) {
        let mut state = self.state.borrow_mut();
        let bucket = state.bucket(Instant::now());
        state.series[bucket].arrivals += 1;
    }

    /// When the server started; its outage is timed from here.
    pub fn started(&self) -> Instant {
        self.state.borrow().started
    }

    /// Requests the server holds and has not answered, its backlog included.
    pub fn outstanding(&self) -> usize {
        let state = self.state.borrow();
        state.jobs.len() + state.backlog.len()
    }

    /// Statistics per interval since the server started.
    pub fn samples(&self) -> Vec<ServerSample> {
        let mut state = self.state.borrow_mut();
        state.settle(Instant::now());
        let last = state.series.len() - 1;
        state.fill_to(last);
        state.series.clone()
    }
}

/// What the server saw during one statistics interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerSample {
    /// Requests that reached the server, lost ones included: every attempt.
    pub arrivals: u64,
    /// Requests the server finished, whether their client still waited or not.
    pub completions: u64,
    /// The most requests it held at once, backlog included.
    pub peak_outstanding: u64,
}

/// The future of [`Server::submit`]: resolves to `Ok(())` when the server has
/// answered.
#[derive(Debug)]
pub struct Submission {
    rx: Option<oneshot::Receiver<()>>,
}

/// The server was dropped before it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerGone;

impl Future for Submission {
    type Output = Result<(), ServerGone>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.rx.as_mut() {
            // A lost request: like a dropped SYN, the client hears nothing.
            None => Poll::Pending,
            Some(rx) => Pin::new(rx).poll(cx).map(|r| r.map_err(|_| ServerGone)),
        }
    }
}

struct State {
    model: ServerModel,
    started: Instant,
    /// The instant `progress` is computed for.
    updated: Instant,
    /// Work (in seconds at full speed) every held request has received since
    /// the start: all requests share the server alike, so one number serves
    /// them all and a request is done when it reaches its `finish`.
    progress: f64,
    jobs: BinaryHeap<Job>,
    backlog: VecDeque<Job>,
    /// With retransmission: what arrived during the outage, in the network.
    held: Vec<Job>,
    next_job: u64,
    resumed: bool,
    rng: Rng,
    interval: Duration,
    series: Vec<ServerSample>,
    /// The last interval whose peak already includes the current load.
    noted: usize,
}

struct Job {
    /// Work to be done, in seconds at full speed; turned into a `progress`
    /// target when the server takes the job in.
    finish: f64,
    order: u64,
    reply: oneshot::Sender<()>,
}

impl State {
    fn running(&self, at: Instant) -> bool {
        let window = self.model.outage_window();
        let since = at.saturating_duration_since(self.started);
        !window.contains(&since)
    }

    /// Receives a request at `now` (already settled). Returns the reply channel
    /// (none if lost) and whether the request is now the first to finish.
    fn arrive(&mut self, now: Instant) -> (Option<oneshot::Receiver<()>>, bool) {
        let (reply, rx) = oneshot::channel();
        let spread = self.model.work_spread;
        let work = self.model.base_latency.as_secs_f64()
            * (1.0 - spread + 2.0 * spread * self.rng.next_f64());
        let order = self.next_job;
        self.next_job += 1;
        let bucket = self.bucket(now);
        self.series[bucket].arrivals += 1;
        if !self.running(now) {
            if self.model.retransmit {
                self.held.push(Job {
                    finish: work,
                    order,
                    reply,
                });
                return (Some(rx), false);
            }
            if self.backlog.len() >= self.model.backlog {
                return (None, false);
            }
            self.backlog.push_back(Job {
                finish: work,
                order,
                reply,
            });
            self.note(now);
            return (Some(rx), false);
        }
        self.jobs.push(Job {
            finish: self.progress + work,
            order,
            reply,
        });
        self.note(now);
        let new_head = self.jobs.peek().is_some_and(|head| head.order == order);
        (Some(rx), new_head)
    }

    /// Brings the model up to `now`: progress, completions, the outage's end.
    fn settle(&mut self, now: Instant) {
        let window = self.model.outage_window();
        let down_at = self.started + window.start;
        let up_at = self.started + window.end;
        while self.updated < now {
            let until = if self.updated < down_at {
                now.min(down_at)
            } else if self.updated < up_at {
                now.min(up_at)
            } else {
                now
            };
            if self.running(self.updated) {
                self.work_until(until);
            }
            self.updated = until;
            if !self.resumed && until >= up_at {
                self.resume(up_at);
            }
        }
    }

    /// Shares the server's speed between the held jobs from `updated` to
    /// `until`, answering each job as it finishes.
    fn work_until(&mut self, until: Instant) {
        let mut at = self.updated;
        loop {
            let speed = self.model.speed(self.jobs.len());
            let left = (until - at).as_secs_f64();
            let Some(head) = self.jobs.peek() else { break };
            let needed = (head.finish - self.progress).max(0.0) / speed;
            // Within a nanosecond counts as done: float rounding must not
            // leave a job a hair short of its target forever.
            let done = needed <= left + 1e-9;
            if !done {
                self.progress += left * speed;
                return;
            }
            let Some(job) = self.jobs.pop() else { break };
            self.progress = self.progress.max(job.finish);
            at = (at + Duration::from_secs_f64(needed.min(left))).min(until);
            let bucket = self.bucket(at);
            self.series[bucket].completions += 1;
            let _ = job.reply.send(());
        }
        // No job left: nothing to advance; `progress` only orders held jobs.
    }

    /// The outage is over: the backlog is taken in at once.
    fn resume(&mut self, at: Instant) {
        self.resumed = true;
        while let Some(mut job) = self.backlog.pop_front() {
            job.finish += self.progress;
            self.jobs.push(job);
        }
        // A client that gave up closed its connection: no more retransmits.
        for mut job in std::mem::take(&mut self.held) {
            if !job.reply.is_closed() {
                job.finish += self.progress;
                self.jobs.push(job);
            }
        }
        self.note(at);
    }

    /// When the next thing happens without a new arrival: a job finishing or
    /// the outage starting or ending.
    fn next_event(&self) -> Option<Instant> {
        let window = self.model.outage_window();
        let since = self.updated.saturating_duration_since(self.started);
        let boundary = if since < window.start {
            Some(self.started + window.start)
        } else if since < window.end {
            Some(self.started + window.end)
        } else {
            None
        };
        let finish = self
            .jobs
            .peek()
            .filter(|_| self.running(self.updated))
            .and_then(|head| {
                let speed = self.model.speed(self.jobs.len());
                let secs = (head.finish - self.progress).max(0.0) / speed;
                // A server this slow answers nothing within any horizon.
                Duration::try_from_secs_f64(secs)
                    .ok()
                    .filter(|d| *d < Duration::from_secs(1 << 32))
                    .map(|d| self.updated + d)
            });
        match (boundary, finish) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn bucket(&self, at: Instant) -> usize {
        let since = at.saturating_duration_since(self.started);
        let index = since.as_nanos() / self.interval.as_nanos();
        (index as usize).min(self.series.len() - 1)
    }

    /// Records the current load in the peak of every interval up to `now`.
    fn note(&mut self, now: Instant) {
        let bucket = self.bucket(now);
        self.fill_to(bucket);
        let outstanding = (self.jobs.len() + self.backlog.len()) as u64;
        let sample = &mut self.series[bucket];
        sample.peak_outstanding = sample.peak_outstanding.max(outstanding);
    }

    /// Intervals without events still held whatever load was there.
    fn fill_to(&mut self, bucket: usize) {
        let outstanding = (self.jobs.len() + self.backlog.len()) as u64;
        while self.noted < bucket {
            let sample = &mut self.series[self.noted];
            sample.peak_outstanding = sample.peak_outstanding.max(outstanding);
            self.noted += 1;
        }
        let sample = &mut self.series[self.noted];
        sample.peak_outstanding = sample.peak_outstanding.max(outstanding);
    }
}

/// Completes jobs on time. It holds the state weakly so that it ends by
/// itself once every handle is gone.
async fn drive(state: std::rc::Weak<RefCell<State>>, wake: Rc<Notify>) {
    loop {
        let next = {
            let Some(state) = state.upgrade() else { return };
            let mut state = state.borrow_mut();
            let now = Instant::now();
            state.settle(now);
            state.note(now);
            state.next_event()
        };
        let notified = wake.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = notified => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }
}

impl PartialEq for Job {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Job {}

impl PartialOrd for Job {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Job {
    /// Reversed, so the max-heap yields the job that finishes first; ties go
    /// to the earlier arrival, keeping runs reproducible.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .finish
            .total_cmp(&self.finish)
            .then(other.order.cmp(&self.order))
    }
}
