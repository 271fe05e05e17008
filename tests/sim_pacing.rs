//! The pacing goals, measured in the simulation on tokio's paused clock: a
//! store that admits R writes per rolling second and throttles the rest.

use std::time::Duration;

use tower_backoff::sim::{Demand, Pacing, PacingReport, ThrottledWrites};
use tower_backoff::{AdaptivePacing, BackoffLayer};

/// The layer a batch job would use: the default schedule and budget, retries
/// enough to get every write through, and pacing.
fn paced(pacing: &AdaptivePacing, seed: u64) -> BackoffLayer<ThrottledWrites> {
    BackoffLayer::builder()
        .policy(ThrottledWrites)
        .max_attempts(10)
        .seed(seed)
        .pacing(pacing.clone())
        .build()
        .unwrap()
}

/// Runs `scenario` through one paced layer; returns the report and the
/// pacing interval at the end of each second.
fn run(scenario: &Pacing) -> (PacingReport, Vec<Duration>, AdaptivePacing) {
    let pacing = AdaptivePacing::new();
    let layer = paced(&pacing, 7);
    let mut intervals = Vec::new();
    let report = scenario
        .run_with_progress(
            |_, store| tower_layer::Layer::layer(&layer, store),
            |_| intervals.push(pacing.interval()),
        )
        .unwrap();
    (report, intervals, pacing)
}

fn describe(report: &PacingReport) -> String {
    let per_second: Vec<String> = report
        .seconds
        .iter()
        .map(|s| format!("{}/{}", s.accepted, s.throttled))
        .collect();
    per_second.join(" ")
}

/// The goals every steady workload must meet at rate `r`.
fn assert_steady(report: &PacingReport, r: f64, label: &str) {
    let picture = describe(report);
    let goodput = report.goodput(60..120);
    let throttled = report.throttled_share(60..120);
    let settled = report.settled(0.9, 0);
    let peak = report.peak_load(10..120);
    println!(
        "{label}: goodput {:.1} % of R over 60..120 s, throttled {:.2} %, settled after {settled:?} s, peak {peak:.2}x R",
        100.0 * goodput / r,
        100.0 * throttled
    );
    assert!(goodput >= 0.9 * r, "{label}: goodput {goodput}: {picture}");
    assert!(throttled <= 0.05, "{label}: throttled {throttled}: {picture}");
    assert!(settled.is_some_and(|s| s <= 10), "{label}: settled {settled:?}: {picture}");
    assert!(peak <= 1.2, "{label}: peak {peak}: {picture}");
}

#[test]
fn eight_workers_run_at_90_percent_of_a_20_per_second_store() {
    let (report, _, _) = run(&Pacing::new().capacity(20).workers(8));
    assert_steady(&report, 20.0, "8 workers, R = 20");
}

#[test]
fn sixty_four_workers_run_at_90_percent_of_a_100_per_second_store() {
    let (report, _, _) = run(&Pacing::new().capacity(100).workers(64));
    assert_steady(&report, 100.0, "64 workers, R = 100");
}

#[test]
fn open_loop_demand_at_twice_the_rate_gets_90_percent_of_it() {
    let scenario = Pacing::new().capacity(50).demand(Demand::OpenLoop {
        per_second: 100.0,
        give_up: Duration::from_secs(5),
    });
    let (report, _, _) = run(&scenario);
    assert_steady(&report, 50.0, "open loop at 2R, R = 50");
}
