//! The circuit-breaker scenario's targets, measured in the simulation
//! (`tower_backoff_sim::BreakerScenario`): a dead host gets almost nothing
//! once the breaker opened, traffic is back within the break time and a round
//! trip of its recovery, 10 % random failures never open it, and what it
//! does to the retry storm with a 1024-deep backlog.

use std::time::Duration;

use tower_backoff::breaker::{CircuitBreaker, DEFAULT_BREAK_DURATION};
use tower_backoff::{BackoffLayer, Cause, Exponential, TokenBucket};
use tower_backoff_sim::{
    storm_with_breaker, BreakerScenario, Guard, RetryErrors, ServerModel, Storm, Strategy,
    FIRST_DELAY, MAX_DELAY,
};

/// The gap to the next request that becomes the probe, at 50 requests a
/// second: exceeded with probability e^-5 (0.7 %) at each reopening.
const NEXT_REQUEST: Duration = Duration::from_millis(100);

#[test]
fn once_open_a_dead_host_gets_under_5_percent_of_its_requests() {
    for seed in 1..=5 {
        let report = BreakerScenario::new()
            .seed(seed)
            .run(Guard::Breaker)
            .unwrap();
        let opened = report.first_open().expect("it opens");
        // The host dies at 10 s. Half the window's attempts fail once the
        // outage has lasted half the window (5 s): the default budget adds
        // almost no failed retries to hasten it.
        assert!(
            (Duration::from_secs(10)..Duration::from_secs(16)).contains(&opened),
            "{opened:?}"
        );
        let share = report.dead_calls_per_request().unwrap();
        assert!(share <= 0.05, "seed {seed}: {share}");
    }
}

#[test]
fn traffic_returns_within_the_break_time_and_a_round_trip_of_recovery() {
    for seed in 1..=10 {
        let report = BreakerScenario::new()
            .seed(seed)
            .run(Guard::Breaker)
            .unwrap();
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
fn at_backlog_1024_a_breaker_shared_by_the_clients_lets_the_server_recover() {
    // Without it, the backlog taken in at once sinks the server, retries or
    // not (tests/sim.rs). A breaker every client shares opens on the
    // outage's time-outs; from then on the clients' requests are rejected
    // at home instead of piling up in the server's backlog, and the probes
    // bring the traffic back once the server answers.
    for seed in 1..=3 {
        let storm = backlog_1024();
        let defaults = Strategy::Defaults.run(&storm, seed).unwrap().summary();
        let breaker = storm_with_breaker(&storm, seed).unwrap().summary();
        println!("seed {seed}\n  defaults: {defaults:?}\n  + breaker: {breaker:?}");
        assert_eq!(defaults.recovery, None, "{defaults:?}");
        let recovery = breaker.recovery.expect("recovers");
        assert!(recovery <= Duration::from_secs(10), "{breaker:?}");
        assert!(breaker.peak_in_flight < defaults.peak_in_flight / 10);
    }
}

#[test]
fn at_backlog_1024_a_breaker_per_client_never_opens_and_does_not_help() {
    // Each of the 1,000 clients sends 0.25 requests a second: 2.5 attempts
    // in a 10 s window, never the 20 a breaker needs to open. A breaker
    // needs a process's whole traffic to one host. (One budget for all, the
    // default one, as in the shared run: only the breakers differ.)
    let storm = backlog_1024();
    let budget = std::sync::Arc::new(TokenBucket::default());
    let breakers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let made = breakers.clone();
    let summary = storm
        .run(|connection| {
            let breaker = CircuitBreaker::builder().seed(1).build().unwrap();
            made.lock().unwrap().push(breaker.clone());
            let layer = BackoffLayer::builder()
                .policy(RetryErrors::new(Cause::Timeout))
                .schedule(Exponential::new(FIRST_DELAY).max_delay(MAX_DELAY))
                .seed(1)
                .budget(budget.clone())
                .circuit_breaker(breaker)
                .build()
                .unwrap();
            tower::Layer::layer(&layer, connection)
        })
        .unwrap()
        .summary();
    println!("per client: {summary:?}");
    assert_eq!(summary.recovery, None, "{summary:?}");
    let breakers = breakers.lock().unwrap();
    assert_eq!(breakers.len(), 1000);
    assert!(breakers
        .iter()
        .all(|b| b.state() == tower_backoff::breaker::BreakerState::Closed));
}

/// The table of docs/GUIDE.md, docs/RESULTS.md and the breaker's module docs:
/// `cargo test --test repo sim_breaker::breaker_table -- --ignored --nocapture`.
#[test]
#[ignore = "prints the comparison table"]
fn breaker_table() {
    let outages = [
        (
            "30 s",
            BreakerScenario::new().duration(Duration::from_secs(1_200)),
        ),
        (
            "5 min",
            BreakerScenario::new()
                .dead(Some(Duration::from_secs(10)..Duration::from_secs(310)))
                .duration(Duration::from_secs(1_200)),
        ),
    ];
    println!("| outage | guard | opened after | calls per request once open (others: from 10 s in) | calls per request, whole outage | traffic back after recovery |");
    println!("|---|---|---|---|---|---|");
    for (outage, scenario) in &outages {
        for guard in [Guard::Defaults, Guard::Breaker, Guard::Throttle { k: 2.0 }] {
            let report = scenario.run(guard).unwrap();
            let dead = if *outage == "30 s" {
                Duration::from_secs(10)..Duration::from_secs(40)
            } else {
                Duration::from_secs(10)..Duration::from_secs(310)
            };
            let opened = report.first_open().map_or("–".to_string(), |at| {
                format!("{:.1} s", (at - dead.start).as_secs_f64())
            });
            let back = report
                .traffic_back_after()
                .map_or("not within the run".to_string(), |d| {
                    format!("{:.1} s", d.as_secs_f64())
                });
            println!(
                "| {outage} | {} | {opened} | {:.3} | {:.3} | {back} |",
                guard.name(),
                report.dead_calls_per_request().unwrap(),
                report.calls_per_request(dead),
            );
        }
    }
}
