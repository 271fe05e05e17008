//! The tail-latency scenario: an open stream of requests to a backend whose
//! latency has a long tail, and what a client stack (hedging or not) makes of
//! the tail and of the load it sends.

mod backend;
mod latency;

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::LocalSet;
use tokio::time::Instant;
use tower_service::Service;

pub use backend::{BackendModel, TailAttempt, TailBackend};
pub use latency::LatencyModel;

use super::connection::Request;
use super::report::Table;
use super::workload::check_open_load;
use tower_backoff_core::error::{check_duration, ConfigError};
use tower_backoff_core::Rng;

/// Requests arriving at random (Poisson) at a fixed rate, whatever the
/// latency: an open workload, as independent users are, so that extra
/// attempts and queueing cannot slow the arrivals down and hide themselves.
/// Each request runs in its own task through a clone of the client stack and
/// records its latency, from its arrival to its answer.
///
/// Defaults: 500 requests per second for 60 s, the first 10 s a warm-up
/// (a hedging client learns the latency distribution first) left out of the
/// latency percentiles and of the worst second; up to 10 minutes after the
/// arrivals stop for the last answers.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::{BackendModel, Tail};
///
/// let tail = Tail::new().duration(Duration::from_secs(20));
/// // No hedging: the client stack is the backend itself.
/// let report = tail.run(&BackendModel::default(), 1, |backend| backend)?;
/// assert_eq!(report.attempts, report.requests);
/// // 2 % of the attempts take a second.
/// assert_eq!(report.p99, Duration::from_secs(1));
/// assert!(report.p50 < Duration::from_millis(12));
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Tail {
    rate: f64,
    duration: Duration,
    warm_up: Duration,
    drain: Duration,
}

impl Default for Tail {
    fn default() -> Self {
        Self::new()
    }
}

impl Tail {
    /// The default scenario (see the type's docs).
    pub const fn new() -> Self {
        Self {
            rate: 500.0,
            duration: Duration::from_secs(60),
            warm_up: Duration::from_secs(10),
            drain: Duration::from_secs(600),
        }
    }

    /// Requests per second.
    pub const fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// How long requests arrive.
    pub const fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// The start of the run left out of the latency percentiles and of the
    /// worst second; shorter than the duration.
    pub const fn warm_up(mut self, warm_up: Duration) -> Self {
        self.warm_up = warm_up;
        self
    }

    /// How long after the last arrival the run waits for the last answers.
    /// Requests still unanswered then count as unfinished.
    pub const fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Checks every setting; each error names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_open_load(1, self.rate, self.duration)?;
        if self.warm_up >= self.duration {
            return Err(ConfigError::new(
                "warm_up",
                format!(
                    "must be shorter than the duration ({:?}), got {:?}",
                    self.duration, self.warm_up
                ),
            ));
        }
        check_duration("drain", self.drain)
    }

    /// Runs the scenario against a [`TailBackend`] of `backend`, seeded with
    /// `seed` (the arrivals and the latencies), through the client stack
    /// `make_client` builds over it. Each request calls a clone of that
    /// stack. Blocks until done, on a fresh runtime with a paused clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming a setting that cannot work.
    pub fn run<S, F>(
        &self,
        backend: &BackendModel,
        seed: u64,
        make_client: F,
    ) -> Result<TailReport, ConfigError>
    where
        F: FnOnce(TailBackend) -> S,
        S: Service<Request> + Clone + 'static,
    {
        self.validate()?;
        let runtime = super::paused_runtime();
        LocalSet::new().block_on(&runtime, async {
            let backend = TailBackend::start(backend, seed)?;
            let client = make_client(backend.clone());
            let log = self.issue(client, seed).await;
            let report = self.report(&backend, &log.borrow());
            Ok(report)
        })
    }

    /// Issues the requests, then waits for their answers, up to the drain.
    async fn issue<S>(&self, client: S, seed: u64) -> Rc<RefCell<Log>>
    where
        S: Service<Request> + Clone + 'static,
    {
        let start = Instant::now();
        let stop = start + self.duration;
        let log = Rc::new(RefCell::new(Log::default()));
        let outstanding = Rc::new(Cell::new(0_u64));
        let all_answered = Rc::new(Notify::new());
        let mut rng = Rng::stream(seed, 0xA441);
        let mut next = start;
        loop {
            // Exponential gaps: -ln(U) / rate, with U in (0, 1].
            next += Duration::from_secs_f64(-(1.0 - rng.next_f64()).ln() / self.rate);
            if next >= stop {
                break;
            }
            tokio::time::sleep_until(next).await;
            // The clock's now, not `next`: the timer fires on its next
            // millisecond, and the answer is timed by the same clock.
            let arrival = Instant::now();
            let id = {
                let mut log = log.borrow_mut();
                log.arrivals.push(arrival - start);
                log.answers.push(None);
                log.arrivals.len() - 1
            };
            outstanding.set(outstanding.get() + 1);
            let mut client = client.clone();
            let (log, outstanding, all_answered) =
                (log.clone(), outstanding.clone(), all_answered.clone());
            tokio::task::spawn_local(async move {
                let request = Request { id: id as u64 };
                let ok = match poll_fn(|cx| client.poll_ready(cx)).await {
                    Ok(()) => client.call(request).await.is_ok(),
                    Err(_) => false,
                };
                log.borrow_mut().answers[id] = Some((arrival.elapsed(), ok));
                outstanding.set(outstanding.get() - 1);
                if outstanding.get() == 0 {
                    all_answered.notify_one();
                }
            });
        }
        let deadline = stop + self.drain;
        // A permit stored by an earlier moment with nothing outstanding may
        // wake this early: hence the loop.
        while outstanding.get() > 0 {
            tokio::select! {
                () = all_answered.notified() => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        log
    }

    fn report(&self, backend: &TailBackend, log: &Log) -> TailReport {
        let calls = backend.calls_per_second();
        let whole_seconds = self.duration.as_secs() as usize;
        // The last arrival can fall on the duration itself: the timer fires
        // on the millisecond after the drawn instant.
        let last_arrival = log.arrivals.last().map_or(0, |a| a.as_secs() as usize + 1);
        let len = calls
            .len()
            .max(last_arrival)
            .max(self.duration.as_secs_f64().ceil() as usize);
        let mut seconds = vec![TailSample::default(); len];
        for arrival in &log.arrivals {
            seconds[arrival.as_secs() as usize].requests += 1;
        }
        for (sample, calls) in seconds.iter_mut().zip(&calls) {
            sample.attempts = *calls;
        }
        let first = self.warm_up.as_nanos().div_ceil(1_000_000_000) as usize;
        let max_second_extra = seconds
            .get(first..whole_seconds)
            .unwrap_or_default()
            .iter()
            .filter(|s| s.requests > 0)
            .map(|s| s.attempts as f64 / s.requests as f64 - 1.0)
            .reduce(f64::max)
            .unwrap_or(0.0);
        let mut latencies: Vec<Duration> = log
            .arrivals
            .iter()
            .zip(&log.answers)
            .filter(|(arrival, _)| **arrival >= self.warm_up)
            .map(|(_, answer)| answer.map_or(Duration::MAX, |(latency, _)| latency))
            .collect();
        latencies.sort_unstable();
        let requests = log.arrivals.len() as u64;
        let attempts = backend.calls();
        TailReport {
            requests,
            attempts,
            extra_share: if requests == 0 {
                0.0
            } else {
                attempts as f64 / requests as f64 - 1.0
            },
            max_second_extra,
            p50: quantile(&latencies, 0.5),
            p99: quantile(&latencies, 0.99),
            p999: quantile(&latencies, 0.999),
            cancellations: backend.cancellations(),
            failures: log.answers.iter().flatten().filter(|(_, ok)| !ok).count() as u64,
            unfinished: log.answers.iter().filter(|a| a.is_none()).count() as u64,
            seconds,
        }
    }
}

/// What the request tasks wrote down, by request id.
#[derive(Debug, Default)]
struct Log {
    /// From the start of the run.
    arrivals: Vec<Duration>,
    /// Latency and success, once answered.
    answers: Vec<Option<(Duration, bool)>>,
}

/// The nearest-rank `q`-quantile of `sorted`: the smallest value with at
/// least a share `q` of the values at or below it. Zero when empty.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.max(1) - 1)
        .copied()
        .unwrap_or(Duration::ZERO)
}

/// Requests and attempts of one second of a [`Tail`] run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TailSample {
    /// Requests that arrived in this second.
    pub requests: u64,
    /// Attempts the backend saw start in this second, whichever request
    /// they belong to.
    pub attempts: u64,
}

/// What one [`Tail`] run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TailReport {
    /// Requests issued over the whole run.
    pub requests: u64,
    /// Attempts the backend saw over the whole run: first attempts, hedges
    /// and retries.
    pub attempts: u64,
    /// `attempts / requests - 1` over the whole run, warm-up included: the
    /// load added on top of one attempt per request.
    pub extra_share: f64,
    /// The worst second after the warm-up: the largest
    /// `attempts / requests - 1` of a [`TailSample`], over the whole seconds
    /// `[s, s + 1)` with `warm_up <= s` and `s + 1 <= duration` (seconds
    /// from the start). A hedge sent in the second after its request's
    /// arrival counts in that later second.
    pub max_second_extra: f64,
    /// The median latency, from arrival to answer, of the requests that
    /// arrived after the warm-up. Unfinished requests count as
    /// [`Duration::MAX`], slower than any answer.
    pub p50: Duration,
    /// The 99th percentile of the same latencies (nearest rank).
    pub p99: Duration,
    /// The 99.9th percentile of the same latencies (nearest rank).
    pub p999: Duration,
    /// Attempts whose caller gave up on them before the answer (the losers
    /// of hedged pairs).
    pub cancellations: u64,
    /// Requests answered with an error.
    pub failures: u64,
    /// Requests still unanswered when the drain ended.
    pub unfinished: u64,
    /// Per second from the start: every second of the arrivals, and on to
    /// the last second with an attempt.
    pub seconds: Vec<TailSample>,
}

/// The tail table: one row per client stack, each cell the mean over the
/// stack's runs (one run per seed, say). A percentile any run left at
/// [`Duration::MAX`] (an unfinished request) shows as `unfinished`.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff_sim::{tail_table, BackendModel, Tail};
///
/// let tail = Tail::new().duration(Duration::from_secs(15));
/// let runs: Vec<_> = (1..=2)
///     .map(|seed| tail.run(&BackendModel::default(), seed, |b| b))
///     .collect::<Result<_, _>>()?;
/// let table = tail_table([("no hedging", &runs[..])]).to_string();
/// assert!(table.contains("| no hedging |"));
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
pub fn tail_table<'a>(rows: impl IntoIterator<Item = (&'a str, &'a [TailReport])>) -> Table {
    let mut table = Table::new([
        "stack",
        "p50 (ms)",
        "p99 (ms)",
        "p99.9 (ms)",
        "extra attempts",
        "worst second",
        "cancelled",
        "failed",
        "unfinished",
    ]);
    for (name, runs) in rows {
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&TailReport) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let millis = |f: fn(&TailReport) -> Duration| {
            if runs.iter().any(|r| f(r) == Duration::MAX) {
                "unfinished".to_string()
            } else {
                format!(
                    "{:.1}",
                    runs.iter().map(|r| f(r).as_secs_f64()).sum::<f64>() * 1e3 / n
                )
            }
        };
        let percent = |f: fn(&TailReport) -> f64| format!("{:.1} %", mean(f) * 100.0);
        table.row([
            name.to_string(),
            millis(|r| r.p50),
            millis(|r| r.p99),
            millis(|r| r.p999),
            percent(|r| r.extra_share),
            percent(|r| r.max_second_extra),
            format!("{:.0}", mean(|r| r.cancellations as f64)),
            format!("{:.0}", mean(|r| r.failures as f64)),
            format!("{:.0}", mean(|r| r.unfinished as f64)),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short() -> Tail {
        Tail::new()
            .duration(Duration::from_secs(12))
            .warm_up(Duration::from_secs(2))
    }

    #[test]
    fn without_hedging_each_request_is_one_attempt_in_its_own_second() {
        let report = short().run(&BackendModel::default(), 3, |b| b).unwrap();
        assert!(
            (5_700..6_300).contains(&report.requests),
            "{}",
            report.requests
        );
        assert_eq!(report.attempts, report.requests);
        assert_eq!(report.extra_share, 0.0);
        assert_eq!(report.max_second_extra, 0.0);
        assert!(report.seconds.iter().all(|s| s.attempts == s.requests));
        assert_eq!(report.seconds.len(), 12);
        assert_eq!(
            (report.cancellations, report.failures, report.unfinished),
            (0, 0, 0)
        );
        assert!(report.p50 >= Duration::from_millis(9) && report.p50 <= Duration::from_millis(12));
        assert_eq!(report.p99, Duration::from_secs(1));
    }

    #[test]
    fn a_run_is_a_function_of_its_seed() {
        let run = |seed| short().run(&BackendModel::default(), seed, |b| b).unwrap();
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn requests_a_drain_cannot_wait_for_are_unfinished_and_slowest() {
        let stalled = BackendModel::new(LatencyModel::LogNormal {
            median: Duration::from_secs(3600),
            sigma: 0.0,
        });
        let report = short()
            .drain(Duration::from_secs(1))
            .run(&stalled, 1, |b| b)
            .unwrap();
        assert_eq!(report.unfinished, report.requests);
        assert_eq!(report.p50, Duration::MAX);
        assert!(tail_table([("stalled", std::slice::from_ref(&report))])
            .to_string()
            .contains("unfinished"));
    }

    #[test]
    fn the_worst_second_counts_attempts_against_arrivals_after_the_warm_up() {
        // Every request of second 5 sends two attempts.
        #[derive(Clone)]
        struct Twice(TailBackend);
        impl Service<Request> for Twice {
            type Response = ();
            type Error = crate::AttemptError;
            type Future =
                std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Self::Error>>>>;
            fn poll_ready(
                &mut self,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                std::task::Poll::Ready(Ok(()))
            }
            fn call(&mut self, request: Request) -> Self::Future {
                let second = self.0.started().elapsed().as_secs();
                let first = self.0.call(request);
                let extra = (second == 5).then(|| self.0.call(request));
                Box::pin(async move {
                    drop(extra);
                    first.await
                })
            }
        }
        let report = short().run(&BackendModel::default(), 1, Twice).unwrap();
        assert_eq!(report.max_second_extra, 1.0);
        let fifth = report.seconds[5];
        assert_eq!(fifth.attempts, 2 * fifth.requests);
        assert_eq!(report.cancellations, fifth.requests);
        let extra = fifth.requests as f64 / report.requests as f64;
        assert!((report.extra_share - extra).abs() < 1e-12);
    }

    #[test]
    fn a_stack_that_never_calls_the_backend_fails_every_request() {
        #[derive(Clone)]
        struct Refuse;
        impl Service<Request> for Refuse {
            type Response = ();
            type Error = crate::AttemptError;
            type Future = std::future::Ready<Result<(), Self::Error>>;
            fn poll_ready(
                &mut self,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                std::task::Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: Request) -> Self::Future {
                std::future::ready(Err(crate::AttemptError::Failed))
            }
        }
        let report = short()
            .run(&BackendModel::default(), 1, |_| Refuse)
            .unwrap();
        assert_eq!(report.failures, report.requests);
        assert_eq!(report.attempts, 0);
        assert_eq!((report.extra_share, report.max_second_extra), (-1.0, -1.0));
        assert_eq!(report.p99, Duration::ZERO);
    }

    #[test]
    fn invalid_settings_are_named() {
        let error = |tail: Tail| tail.validate().unwrap_err().field();
        assert_eq!(error(Tail::new().rate(0.0)), "rate");
        assert_eq!(error(Tail::new().duration(Duration::ZERO)), "duration");
        assert_eq!(
            error(Tail::new().warm_up(Duration::from_secs(60))),
            "warm_up"
        );
        let backend = BackendModel::default().workers(0);
        assert_eq!(
            Tail::new().run(&backend, 1, |b| b).unwrap_err().field(),
            "workers"
        );
    }
}
