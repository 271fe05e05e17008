//! Hedging against a latency tail, measured in the simulation
//! (`tower_backoff_sim::Tail`, issue 26): four backends, each run with every
//! client stack of [`stacks`] over the same seeds, printed as one table per
//! backend (`cargo test --release --test sim_hedge -- --nocapture`).
//!
//! The assertions check that the scenario reproduces what the issue measured
//! for `tower::hedge`, loosely: they are about the scenario, not a target.

use std::cell::RefCell;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::hedge::{Hedge, Policy};
use tower_backoff_sim::{
    tail_table, BackendModel, LatencyModel, Request, Tail, TailBackend, TailReport,
};
use tower_service::Service;

/// Five seeds in a release build. The CI runs the tests in a debug build
/// (`.ci/run`, the README's command), where a run takes more than ten times
/// as long: two seeds there keep this file well within a minute.
const SEEDS: &[u64] = if cfg!(debug_assertions) {
    &[1, 2]
} else {
    &[1, 2, 3, 4, 5]
};

/// `tower::hedge`'s settings in the issue: hedge at the 95th percentile of
/// the last second's latencies, once it holds 100 of them.
const PERCENTILE: f32 = 0.95;
const MIN_DATA_POINTS: u64 = 100;
const ROTATION: Duration = Duration::from_secs(1);

const MS: Duration = Duration::from_millis(1);

/// The four backends.
#[derive(Clone, Copy)]
enum Backend {
    /// 2 % of attempts take 1 s, the others about 10 ms.
    Bimodal,
    /// Median 10 ms, sigma 1.
    LogNormal,
    /// Bimodal, every latency doubled from 20 s to 40 s.
    Slowdown,
    /// Bimodal behind 20 workers: about 75 % busy at 500 requests a second
    /// (a mean service time of about 30 ms).
    Workers,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Bimodal => "(a) bimodal, 2 % take 1 s",
            Backend::LogNormal => "(b) log-normal, median 10 ms, sigma 1",
            Backend::Slowdown => "(c) bimodal, latencies doubled from 20 s to 40 s",
            Backend::Workers => "(d) bimodal, 20 workers",
        }
    }

    fn model(self) -> BackendModel {
        let bimodal = BackendModel::new(LatencyModel::bimodal());
        match self {
            Backend::Bimodal => bimodal,
            Backend::LogNormal => BackendModel::new(LatencyModel::log_normal()),
            Backend::Slowdown => {
                bimodal.slowdown(Duration::from_secs(20), Duration::from_secs(20), 2.0)
            }
            Backend::Workers => bimodal.workers(20),
        }
    }
}

/// Every run of one client stack against one backend, one per seed.
struct Runs {
    stack: &'static str,
    reports: Vec<TailReport>,
}

/// Runs `make_client`'s stack against `backend` once per seed.
fn run<S>(backend: Backend, stack: &'static str, make_client: impl Fn(TailBackend) -> S) -> Runs
where
    S: Service<Request> + Clone + 'static,
{
    let reports = SEEDS
        .iter()
        .map(|&seed| {
            Tail::new()
                .run(&backend.model(), seed, &make_client)
                .unwrap_or_else(|e| panic!("{} / {stack}: {e}", backend.name()))
        })
        .collect();
    Runs { stack, reports }
}

/// Every client stack against `backend`; our hedging goes here as one more
/// entry.
fn stacks(backend: Backend) -> Vec<Runs> {
    vec![
        run(backend, "no hedging", |b| b),
        run(backend, "tower::hedge", tower_hedge),
    ]
}

/// Measures every stack against `backend` and prints the table.
fn measure(backend: Backend) -> Vec<Runs> {
    let runs = stacks(backend);
    let table = tail_table(runs.iter().map(|r| (r.stack, &r.reports[..])));
    println!(
        "{}: mean of {} seeds, latencies after the 10 s warm-up\n{table}",
        backend.name(),
        SEEDS.len()
    );
    runs
}

fn stack<'a>(runs: &'a [Runs], name: &str) -> &'a [TailReport] {
    &runs
        .iter()
        .find(|r| r.stack == name)
        .expect("measured")
        .reports
}

/// Hedges every request: each is a plain id, cloned for free.
#[derive(Clone)]
struct HedgeAll;

impl Policy<Request> for HedgeAll {
    fn clone_request(&self, request: &Request) -> Option<Request> {
        Some(*request)
    }

    fn can_retry(&self, _: &Request) -> bool {
        true
    }
}

fn tower_hedge(backend: TailBackend) -> Shared<Hedge<TailBackend, HedgeAll>> {
    Shared(Rc::new(RefCell::new(Hedge::new::<Request>(
        backend,
        HedgeAll,
        MIN_DATA_POINTS,
        PERCENTILE,
        ROTATION,
    ))))
}

/// One `Hedge` shared by every request: it is not `Clone`, and its latency
/// histogram must see every request, as in one process. Sharing it is safe
/// because it is always ready (the backend is, and its hedge delay reports
/// ready), so no request waits on readiness another one consumes.
struct Shared<S>(Rc<RefCell<S>>);

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Service<Request>> Service<Request> for Shared<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.borrow_mut().poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> S::Future {
        self.0.borrow_mut().call(request)
    }
}

/// The baseline every scenario shares: one attempt per request, no
/// cancellation, no failure.
fn assert_no_hedging_sends_one_attempt_each(runs: &[Runs]) {
    for (seed, r) in SEEDS.iter().zip(stack(runs, "no hedging")) {
        assert_eq!(r.attempts, r.requests, "seed {seed}");
        assert_eq!(r.max_second_extra, 0.0, "seed {seed}");
        assert_eq!((r.cancellations, r.failures, r.unfinished), (0, 0, 0));
    }
}

#[test]
fn bimodal_tower_hedge_cuts_the_p99_from_a_second_to_30_ms_with_8_percent_extra() {
    let runs = measure(Backend::Bimodal);
    assert_no_hedging_sends_one_attempt_each(&runs);
    for (seed, r) in SEEDS.iter().zip(stack(&runs, "no hedging")) {
        assert_eq!(r.p99, Duration::from_secs(1), "seed {seed}");
    }
    for (seed, r) in SEEDS.iter().zip(stack(&runs, "tower::hedge")) {
        assert!(r.p99 <= 30 * MS, "seed {seed}: {:?}", r.p99);
        assert!(r.extra_share <= 0.08, "seed {seed}: {}", r.extra_share);
        assert!(r.extra_share > 0.0, "seed {seed}: it hedges");
    }
}

#[test]
fn log_normal_is_measured_for_every_stack() {
    let runs = measure(Backend::LogNormal);
    assert_no_hedging_sends_one_attempt_each(&runs);
    for (seed, r) in SEEDS.iter().zip(stack(&runs, "no hedging")) {
        // e^2.326 × 10 ms: the log-normal's 99th percentile, to a millisecond
        // tick and a sample of 25,000.
        assert!(
            (90 * MS..=115 * MS).contains(&r.p99),
            "seed {seed}: {:?}",
            r.p99
        );
    }
}

#[test]
fn slowdown_makes_tower_hedge_hedge_most_requests_for_a_second() {
    let runs = measure(Backend::Slowdown);
    assert_no_hedging_sends_one_attempt_each(&runs);
    for (seed, r) in SEEDS.iter().zip(stack(&runs, "tower::hedge")) {
        // The issue saw about 90 %: the last second's 95th percentile is
        // below nearly every doubled latency.
        assert!(
            r.max_second_extra > 0.5,
            "seed {seed}: {}",
            r.max_second_extra
        );
    }
}

#[test]
fn with_workers_no_hedging_keeps_its_median_and_tower_hedge_ends_every_request() {
    let runs = measure(Backend::Workers);
    assert_no_hedging_sends_one_attempt_each(&runs);
    for (seed, r) in SEEDS.iter().zip(stack(&runs, "no hedging")) {
        assert!(r.p50 <= 15 * MS, "seed {seed}: {:?}", r.p50);
    }
    for (seed, r) in SEEDS.iter().zip(stack(&runs, "tower::hedge")) {
        assert_eq!((r.failures, r.unfinished), (0, 0), "seed {seed}");
    }
}

/// Not reproduced. The issue measured `tower::hedge`'s median at 10.6 s
/// against 10 ms without hedging here. In this backend a hedge that wins
/// cancels its 1 s twin and frees that worker at once, so hedging lowers
/// the load instead of raising it, and the median stays at 11 ms. Even a
/// backend that keeps serving cancelled attempts to their end (tried by
/// hand, not kept) gives 11 ms: about 15 % extra attempts leave 20 workers
/// short of saturation.
#[test]
#[ignore = "the issue's collapse under tower::hedge is not reproduced: see the doc comment"]
fn with_workers_tower_hedge_makes_the_median_far_worse() {
    let runs = measure(Backend::Workers);
    let none = stack(&runs, "no hedging");
    let hedged = stack(&runs, "tower::hedge");
    for ((seed, none), hedged) in SEEDS.iter().zip(none).zip(hedged) {
        assert!(hedged.p50 >= 10 * none.p50, "seed {seed}: {:?}", hedged.p50);
    }
}
