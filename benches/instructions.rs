//! Runs one column of one scenario for a number of requests, so that
//! `benches/callgrind.sh` can count its instructions; with `--table`, prints
//! heap allocations per request and response-future size for every column.
//!
//! Not a criterion bench: `cargo bench --bench instructions -- --table`.

mod common;

use common::{allocations, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The default budget's cost: the layer built with no option (so with the
/// default budget) against the same layer with `.no_budget()`, on the happy
/// path, where the budget must cost a few instructions at most.
const BUDGET_COLUMNS: [&str; 2] = ["ours, default budget", "ours, .no_budget()"];

fn budget_layer(column: &str) -> tower_backoff::BackoffLayer {
    let builder = tower_backoff::BackoffLayer::builder();
    match column {
        "ours, .no_budget()" => builder.no_budget().build().unwrap(),
        _ => builder.build().unwrap(),
    }
}

async fn run_budget_column(column: &str, iters: u64) {
    let mut svc = tower::Layer::layer(&budget_layer(column), common::Backend::healthy());
    common::drive(&mut svc, &common::request(), iters).await;
}

/// A closed circuit breaker's cost: the defaults with a breaker, against the
/// defaults alone (`ours, default budget`), on the happy path, where a
/// closed breaker must cost a few instructions.
const BREAKER_COLUMN: &str = "ours, closed breaker";

fn breaker_layer(
) -> tower_backoff::BackoffLayer<tower_backoff::RetryOnError, tower_backoff::deadline::Guarded> {
    tower_backoff::BackoffLayer::builder()
        .circuit_breaker(tower_backoff::breaker::CircuitBreaker::new())
        .build()
        .unwrap()
}

async fn run_breaker_column(iters: u64) {
    let mut svc = tower::Layer::layer(&breaker_layer(), common::Backend::healthy());
    common::drive(&mut svc, &common::request(), iters).await;
}

/// Hedging's cost when no hedge is needed: the defaults with hedging after a
/// delay the healthy backend never reaches, against the defaults alone
/// (`ours, default budget`), on the happy path. Issue 29's goal: 30
/// instructions at most.
const HEDGE_COLUMN: &str = "ours, hedging configured";

fn hedge_layer() -> tower_backoff::BackoffLayer<tower_backoff::RetryOnError> {
    tower_backoff::BackoffLayer::builder()
        .hedge(tower_backoff::Hedging::after(
            std::time::Duration::from_secs(1),
        ))
        .build()
        .unwrap()
}

async fn run_hedge_column(iters: u64) {
    let mut svc = tower::Layer::layer(&hedge_layer(), common::Backend::healthy());
    common::drive(&mut svc, &common::request(), iters).await;
}

/// What hedging costs a call that is pending at its first poll, as one over
/// a network is, and answers before the hedge delay: the defaults and the
/// defaults with hedging, around a backend whose every call is pending until
/// the runtime turned once (`common::PendingOnce`) and then answers. Such a call arms the hedge delay's
/// timer, which a call answered at its first poll never does.
///
/// Beside them, `tower::hedge` around the same backends, its delay the 95th
/// percentile of a histogram filled with 1 s latencies that does not rotate
/// during the run (so, as ours, it never needs a hedge), and each backend
/// alone.
const PENDING_COLUMNS: [&str; 5] = [
    "bare, pending once",
    "tower::hedge",
    "tower::hedge, pending once",
    "ours, pending once",
    "ours, hedging configured, pending once",
];

/// Every call may be hedged.
#[derive(Clone)]
struct HedgeAll;

impl tower::hedge::Policy<common::Req> for HedgeAll {
    fn clone_request(&self, request: &common::Req) -> Option<common::Req> {
        Some(request.clone())
    }

    fn can_retry(&self, _: &common::Req) -> bool {
        true
    }
}

fn tower_hedge<S>(backend: S) -> tower::hedge::Hedge<S, HedgeAll>
where
    S: tower::Service<common::Req> + Clone,
    S::Error: Into<tower::BoxError>,
{
    tower::hedge::Hedge::new_with_mock_latencies(
        backend,
        HedgeAll,
        1,
        0.95,
        std::time::Duration::from_secs(3_600),
        &[1_000; 100],
    )
}

async fn run_pending_column(column: &str, iters: u64) {
    let turns = tokio::spawn(common::turns());
    drive_pending_column(column, iters).await;
    turns.abort();
}

async fn drive_pending_column(column: &str, iters: u64) {
    let template = common::request();
    let pending = common::PendingOnce(common::Backend::healthy());
    match column {
        "bare, pending once" => common::drive(&mut pending.clone(), &template, iters).await,
        "tower::hedge" => {
            common::drive(
                &mut tower_hedge(common::Backend::healthy()),
                &template,
                iters,
            )
            .await
        }
        "tower::hedge, pending once" => {
            common::drive(&mut tower_hedge(pending), &template, iters).await
        }
        "ours, pending once" => {
            let layer = tower_backoff::BackoffLayer::new();
            common::drive(&mut tower::Layer::layer(&layer, pending), &template, iters).await
        }
        "ours, hedging configured, pending once" => {
            let mut svc = tower::Layer::layer(&hedge_layer(), pending);
            common::drive(&mut svc, &template, iters).await
        }
        other => panic!("unknown column {other:?}"),
    }
}

/// The size of one response future of a pending column, as a caller would
/// store it.
fn pending_future_size(column: &str) -> usize {
    fn call<S: tower::Service<common::Req>>(mut svc: S) -> usize {
        size_of_val(&svc.call(common::request()))
    }
    let pending = common::PendingOnce(common::Backend::healthy());
    match column {
        "bare, pending once" => call(pending),
        "tower::hedge" => call(tower_hedge(common::Backend::healthy())),
        "tower::hedge, pending once" => call(tower_hedge(pending)),
        "ours, pending once" => call(tower::Layer::layer(
            &tower_backoff::BackoffLayer::new(),
            pending,
        )),
        "ours, hedging configured, pending once" => {
            call(tower::Layer::layer(&hedge_layer(), pending))
        }
        other => panic!("unknown column {other:?}"),
    }
}

/// Allocations per request of `run`, which sends the number of requests it
/// is given: those of 1,000 more requests, so that set-up and warm-up
/// cancel out.
fn allocations_per_request<F: std::future::Future>(
    runtime: &tokio::runtime::Runtime,
    run: impl Fn(u64) -> F,
) -> f64 {
    let count = |iters| {
        let before = allocations();
        runtime.block_on(run(iters));
        allocations() - before
    };
    (count(1_100) as f64 - count(100) as f64) / 1_000.0
}

/// The size of one response future of `layer` around the healthy backend.
fn future_size<L>(layer: &L) -> usize
where
    L: tower::Layer<common::Backend>,
    L::Service: tower::Service<common::Req>,
{
    size_of_val(&tower::Service::call(
        &mut layer.layer(common::Backend::healthy()),
        common::request(),
    ))
}

/// The budget columns' rows of `--table`.
fn budget_table(runtime: &tokio::runtime::Runtime) {
    for column in BUDGET_COLUMNS {
        let per_request =
            allocations_per_request(runtime, |iters| run_budget_column(column, iters));
        let size = future_size(&budget_layer(column));
        println!("happy_path\t{column}\t{per_request:.2}\t{size}");
    }
    let per_request = allocations_per_request(runtime, run_breaker_column);
    let size = future_size(&breaker_layer());
    println!("happy_path\t{BREAKER_COLUMN}\t{per_request:.2}\t{size}");
    let per_request = allocations_per_request(runtime, run_hedge_column);
    let size = future_size(&hedge_layer());
    println!("happy_path\t{HEDGE_COLUMN}\t{per_request:.2}\t{size}");
    // `tower::hedge` makes its delay's timer at the call: its size is
    // measured in the runtime.
    let _entered = runtime.enter();
    for column in PENDING_COLUMNS {
        let per_request =
            allocations_per_request(runtime, |iters| run_pending_column(column, iters));
        let size = pending_future_size(column);
        println!("happy_path\t{column}\t{per_request:.2}\t{size}");
    }
}

/// The number of requests to run of `column`, which runs only the happy
/// path.
fn happy_path_requests(scenario: &str, column: &str, iters: &str) -> u64 {
    assert_eq!(
        scenario, "happy_path",
        "the column {column:?} runs the happy path"
    );
    iters.parse().expect("a number of requests")
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    match args.as_slice() {
        [flag] if flag == "--table" => {
            println!("scenario\tcolumn\tallocations/request\tfuture bytes");
            for scenario in common::Scenario::ALL {
                for &column in common::columns(scenario) {
                    let per_request = allocations_per_request(&runtime, |iters| {
                        common::run_column(scenario, column, iters)
                    });
                    println!(
                        "{}\t{column}\t{per_request:.2}\t{}",
                        scenario.name(),
                        common::future_size(column)
                    );
                }
            }
            budget_table(&runtime);
        }
        [flag] if flag == "--budget-table" => {
            println!("scenario\tcolumn\tallocations/request\tfuture bytes");
            budget_table(&runtime);
        }
        [scenario, column, iters] if column == HEDGE_COLUMN => {
            let iters = happy_path_requests(scenario, column, iters);
            runtime.block_on(run_hedge_column(iters));
        }
        [scenario, column, iters] if PENDING_COLUMNS.contains(&column.as_str()) => {
            let iters = happy_path_requests(scenario, column, iters);
            runtime.block_on(run_pending_column(column, iters));
        }
        [scenario, column, iters] if column == BREAKER_COLUMN => {
            let iters = happy_path_requests(scenario, column, iters);
            runtime.block_on(run_breaker_column(iters));
        }
        [scenario, column, iters] if BUDGET_COLUMNS.contains(&column.as_str()) => {
            let iters = happy_path_requests(scenario, column, iters);
            runtime.block_on(run_budget_column(column, iters));
        }
        [scenario, column, iters] => {
            let scenario = common::Scenario::parse(scenario).expect("happy_path or retry_path");
            let iters = iters.parse().expect("a number of requests");
            runtime.block_on(common::run_column(scenario, column, iters));
        }
        // `cargo bench` runs every bench target with no arguments: nothing to do.
        [] => {}
        _ => eprintln!(
            "usage: instructions --table | --budget-table | <scenario> <column> <requests>"
        ),
    }
}
