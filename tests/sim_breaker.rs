//! The circuit-breaker scenario's targets, measured in the simulation
//! (`tower_backoff_sim::BreakerScenario`): a dead host gets almost nothing
//! once the breaker opened, traffic is back within the break time and a round
//! trip of its recovery, 10 % random failures never open it, and what it
//! does to the retry storm with a 1024-deep backlog.

use std::time::Duration;

use tower_backoff::breaker::DEFAULT_BREAK_DURATION;
use tower_backoff_sim::{
    storm_with_breaker, BreakerScenario, Guard, ServerModel, Storm, Strategy,
};

/// The gap to the next request that becomes the probe, at 50 requests a
/// second: exceeded with probability e^-5 (0.7 %) at each reopening.
const NEXT_REQUEST: Duration = Duration::from_millis(100);

#[test]
fn once_open_a_dead_host_gets_under_5_percent_of_its_requests() {
    for seed in 1..=5 {
        let report = BreakerScenario::new().seed(seed).run(Guard::Breaker).unwrap();
        let opened = report.first_open().expect("it opens");
        assert!(
            (Duration::from_secs(10)..Duration::from_secs(15)).contains(&opened),
            "{opened:?}"
        );
        let share = report.dead_calls_per_request().unwrap();
        assert!(share <= 0.05, "seed {seed}: {share}");
    }
}

#[test]
fn traffic_returns_within_the_break_time_and_a_round_trip_of_recovery() {
    for seed in 1..=10 {
        let report = BreakerScenario::new().seed(seed).run(Guard::Breaker).unwrap();
        let closed = report.closed_after_recovery().expect("it closes");
        assert!(
            closed <= DEFAULT_BREAK_DURATION + report.rtt() + NEXT_REQUEST,
            "seed {seed}: {closed:?}"
        );
        let back = report.traffic_back_after().expect("traffic comes back");
        // Measured in whole 100 ms intervals, over a second.
        assert!(
            back <= DEFAULT_BREAK_DURATION + Duration::from_secs(1),
            "seed {seed}: {back:?}"
        );
    }
}

#[test]
fn ten_percent_random_failures_never_open_it_in_ten_minutes() {
    for rate in [5.0, 50.0] {
        let report = BreakerScenario::new()
            .dead(None)
            .failure_rate(0.1)
            .rate(rate)
            .duration(Duration::from_secs(600))
            .run(Guard::Breaker)
            .unwrap();
        assert_eq!(report.openings(), 0, "at {rate} requests a second");
    }
}

#[test]
fn adaptive_throttling_keeps_sending_to_a_dead_host_and_comes_back_slowly() {
    // The continuous form the breaker's module docs compare: over the
    // default 30 s outage, with the book's K = 2, the two-minute memory of
    // successes before the outage keeps most requests going out.
    let scenario = BreakerScenario::new();
    let throttle = scenario.run(Guard::Throttle { k: 2.0 }).unwrap();
    let breaker = scenario.run(Guard::Breaker).unwrap();
    let throttled = throttle.dead_calls_per_request().unwrap();
    assert!(throttled > 0.5, "{throttled}");
    assert!(breaker.dead_calls_per_request().unwrap() < throttled / 10.0);
}

/// The retry-storm demo's `--backlog 1024` setting (tests/sim.rs `storms()`).
fn backlog_1024() -> Storm {
    Storm::new().server(
        ServerModel::new()
            .backlog(1024)
            .outage(Duration::from_secs(20), Duration::from_secs(10)),
    )
}

#[test]
#[ignore = "three collapsing storms: slow in a debug build"]
fn at_backlog_1024_the_breaker_does_not_let_the_server_recover() {
    let storm = backlog_1024();
    let none = Strategy::NoRetries.run(&storm, 1).unwrap().summary();
    let defaults = Strategy::Defaults.run(&storm, 1).unwrap().summary();
    let breaker = storm_with_breaker(&storm, 1).unwrap().summary();
    println!("no retries: {none:?}\ndefaults: {defaults:?}\nbreaker: {breaker:?}");
}
