//! The pacing goals, measured in the simulation on tokio's paused clock: a
//! store that admits R writes per rolling second and throttles the rest.

use std::time::Duration;

use tower_backoff::{AdaptivePacing, BackoffLayer, Cause, PacingMetrics};
use tower_backoff_sim::{
    Demand, Pacing, PacingReport, RetryErrors, ServerModel, Storm, ThrottledWrites,
};

/// Seeds of each storm setting: each run of 1,000 clients takes a few
/// seconds in a debug build.
const SEEDS: u64 = 2;

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
/// pacing's metrics at the end of each second.
fn run(scenario: &Pacing) -> (PacingReport, Vec<PacingMetrics>) {
    let pacing = AdaptivePacing::new();
    let layer = paced(&pacing, 7);
    let mut metrics = Vec::new();
    let report = scenario
        .run_with_progress(
            |_, store| tower_layer::Layer::layer(&layer, store),
            |_| metrics.push(pacing.metrics()),
        )
        .unwrap();
    (report, metrics)
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
    assert!(
        throttled <= 0.05,
        "{label}: throttled {throttled}: {picture}"
    );
    assert!(
        settled.is_some_and(|s| s <= 10),
        "{label}: settled {settled:?}: {picture}"
    );
    assert!(peak <= 1.2, "{label}: peak {peak}: {picture}");
}

/// Seeds of each closed-loop setting (the store's latencies, the layer's
/// jitter): a setting that settles in time only by luck fails on another.
const CLOSED_LOOP_SEEDS: u64 = 3;

/// `workers` closed-loop workers write to a store of `r` writes a second
/// that answers after `latency`, once per seed: each run meets the goals.
fn assert_closed_loop_steady(workers: usize, r: u32, latency: Duration) {
    for seed in 1..=CLOSED_LOOP_SEEDS {
        let layer = paced(&AdaptivePacing::new(), seed);
        let report = Pacing::new()
            .capacity(r)
            .workers(workers)
            .latency(latency)
            .seed(seed)
            .run(|_, store| tower_layer::Layer::layer(&layer, store))
            .unwrap();
        let label = format!("{workers} workers, R = {r}, {latency:?} per answer, seed {seed}");
        assert_steady(&report, f64::from(r), &label);
    }
}

#[test]
fn eight_workers_run_at_90_percent_of_a_20_per_second_store() {
    assert_closed_loop_steady(8, 20, Duration::from_millis(50));
}

#[test]
fn sixty_four_workers_run_at_90_percent_of_a_100_per_second_store() {
    assert_closed_loop_steady(64, 100, Duration::from_millis(50));
}

// A store next door, answering in 1 ms: closed-loop workers get its whole
// second admitted in a burst before the first 429 comes back, so the round
// that measures at full speed counts a fraction of its rate.

#[test]
fn eight_workers_settle_within_10_s_on_a_store_answering_in_1_ms() {
    for r in [100, 200] {
        assert_closed_loop_steady(8, r, Duration::from_millis(1));
    }
}

#[test]
fn sixty_four_workers_settle_within_10_s_on_a_store_answering_in_1_ms() {
    for r in [100, 500] {
        assert_closed_loop_steady(64, r, Duration::from_millis(1));
    }
}

#[test]
fn open_loop_demand_at_twice_the_rate_gets_90_percent_of_it() {
    let scenario = Pacing::new().capacity(50).demand(Demand::OpenLoop {
        per_second: 100.0,
        give_up: Duration::from_secs(5),
    });
    let (report, _) = run(&scenario);
    assert_steady(&report, 50.0, "open loop at 2R, R = 50");
}

#[test]
fn when_capacity_doubles_goodput_reaches_90_percent_of_it_within_30_s() {
    let scenario = Pacing::new()
        .capacity(50)
        .workers(64)
        .change_capacity(Duration::from_secs(60), Some(100));
    let (report, _) = run(&scenario);
    let settled = report.settled(0.9, 60);
    let peak = report.peak_load(10..120);
    println!(
        "capacity 50 -> 100 at 60 s: 90 % of the new rate after {settled:?} s, goodput 90..120 s {:.1}/s, peak {peak:.2}x R",
        report.goodput(90..120)
    );
    assert!(
        settled.is_some_and(|s| s <= 30),
        "settled {settled:?}: {}",
        describe(&report)
    );
    assert!(peak <= 1.2, "peak {peak}: {}", describe(&report));
}

#[test]
fn when_throttling_stops_pacing_returns_to_zero_within_30_s() {
    let scenario = Pacing::new()
        .capacity(100)
        .workers(64)
        .change_capacity(Duration::from_secs(60), None);
    let (report, metrics) = run(&scenario);
    // `metrics[i]` is read at the end of second i + 1.
    let intervals: Vec<Duration> = metrics.iter().map(|m| m.interval).collect();
    assert!(intervals[59] > Duration::ZERO, "paced while throttled");
    let off = intervals
        .iter()
        .rposition(|i| !i.is_zero())
        .map_or(0, |i| i + 1);
    println!(
        "limit lifted at 60 s: pacing off from {off} s ({} s later); goodput 100..120 s {:.0}/s",
        off.saturating_sub(60),
        report.goodput(100..120)
    );
    assert!(off <= 90, "pacing still on at {off} s: {intervals:?}");
    assert!(report.throttled_share(60..120) == 0.0);
    // Off means no send waits any more.
    assert_eq!(metrics[off].slept, metrics[119].slept);
    assert_eq!(metrics[off].sleeps, metrics[119].sleeps);
    assert!(metrics[119].invocations > metrics[off].invocations);
    // Unpaced, 64 workers at 50 ms a write send about 1,280 a second.
    assert!(report.goodput(100..120) > 1000.0, "{}", describe(&report));
}

#[test]
fn four_independent_layers_share_the_store_fairly() {
    let pacings: Vec<AdaptivePacing> = (0..4).map(|_| AdaptivePacing::new()).collect();
    let layers: Vec<_> = pacings
        .iter()
        .enumerate()
        .map(|(i, p)| paced(p, i as u64 + 1))
        .collect();
    let report = Pacing::new()
        .capacity(100)
        .workers(64)
        .clients(4)
        .run(|i, store| tower_layer::Layer::layer(&layers[i], store))
        .unwrap();
    let goodput = report.goodput(60..120);
    let throttled = report.throttled_share(60..120);
    let fairness = report.fairness(60..120);
    println!(
        "4 independent layers, R = 100: goodput {:.1} % of R, throttled {:.2} %, Jain {fairness:.3}, shares {:?}",
        goodput,
        100.0 * throttled,
        report.client_goodput(60..120)
    );
    assert!(goodput >= 85.0, "goodput {goodput}: {}", describe(&report));
    assert!(
        throttled <= 0.10,
        "throttled {throttled}: {}",
        describe(&report)
    );
    assert!(fairness >= 0.9, "fairness {fairness}");
}

/// The storm's sensitivity settings: the default, and the three where the
/// default budget is closest to losing.
fn storms() -> Vec<(&'static str, Storm)> {
    let outage = |storm: Storm| storm.outage(Duration::from_secs(20), Duration::from_secs(10));
    vec![
        ("defaults", Storm::new()),
        ("clients 2000", Storm::new().clients(2000)),
        (
            "backlog 1024",
            outage(Storm::new().server(ServerModel::new().backlog(1024))),
        ),
        (
            "outage 30",
            Storm::new().outage(Duration::from_secs(20), Duration::from_secs(30)),
        ),
    ]
}

#[test]
fn pacing_on_the_default_budget_recovers_within_3_s_of_it_and_never_fails_more_in_the_storm() {
    // The storm's server never says "slow down", only times out: the paced
    // layer reports its timeouts as throttles, so that the pacing reacts
    // (it slows for throttles alone); the budget pays for their retries
    // either way.
    let layer = |seed: u64, pacing: Option<AdaptivePacing>| {
        let builder = BackoffLayer::builder().seed(seed);
        match pacing {
            Some(pacing) => builder
                .policy(RetryErrors::new(Cause::Throttled))
                .pacing(pacing)
                .build()
                .unwrap(),
            None => builder
                .policy(RetryErrors::new(Cause::Timeout))
                .build()
                .unwrap(),
        }
    };
    let never = Duration::MAX;
    for (name, storm) in storms() {
        for seed in 1..=SEEDS {
            let storm = storm.clone().seed(seed);
            let alone = layer(seed, None);
            let alone = storm
                .run(|c| tower_layer::Layer::layer(&alone, c))
                .unwrap()
                .summary();
            let paced = layer(seed, Some(AdaptivePacing::new()));
            let paced = storm
                .run(|c| tower_layer::Layer::layer(&paced, c))
                .unwrap()
                .summary();
            println!(
                "{name}, seed {seed}: budget alone recovers {:?}, fails {}; with pacing {:?}, fails {}",
                alone.recovery, alone.failed, paced.recovery, paced.failed
            );
            // Within 3 s: pacing that timeouts cut during the outage climbs
            // back over the first rounds after it (measured: the default
            // storm, seed 1, recovers 2 s after the budget alone, failing
            // 1,848 requests instead of 2,417).
            let slack = Duration::from_secs(3);
            assert!(
                paced.recovery.unwrap_or(never)
                    <= alone.recovery.unwrap_or(never).saturating_add(slack),
                "{name}, seed {seed}: {paced:?} against {alone:?}"
            );
            assert!(
                paced.failed <= alone.failed,
                "{name}, seed {seed}: {paced:?} against {alone:?}"
            );
        }
    }
}

#[test]
fn four_independent_layers_started_5_s_apart_converge_on_fair_shares() {
    let layers: Vec<_> = (0..4)
        .map(|i| paced(&AdaptivePacing::new(), i as u64 + 1))
        .collect();
    let report = Pacing::new()
        .capacity(100)
        .workers(64)
        .clients(4)
        .stagger(Duration::from_secs(5))
        .run(|i, store| tower_layer::Layer::layer(&layers[i], store))
        .unwrap();
    let goodput = report.goodput(60..120);
    let fairness = report.fairness(60..120);
    println!(
        "4 independent layers started 5 s apart, R = 100: goodput {goodput:.1} % of R, throttled {:.2} %, Jain {fairness:.3}, shares {:?}",
        100.0 * report.throttled_share(60..120),
        report.client_goodput(60..120)
    );
    assert!(goodput >= 85.0, "goodput {goodput}: {}", describe(&report));
    assert!(report.throttled_share(60..120) <= 0.10);
    assert!(fairness >= 0.9, "fairness {fairness}");
}

#[test]
fn the_pacing_scenario_rejects_settings_that_cannot_work() {
    let field = |scenario: Pacing| scenario.validate().unwrap_err().field();
    assert_eq!(field(Pacing::new().capacity(0)), "capacity");
    assert_eq!(field(Pacing::new().workers(0)), "workers");
    assert_eq!(field(Pacing::new().clients(0)), "clients");
    assert_eq!(field(Pacing::new().horizon(Duration::ZERO)), "horizon");
    assert_eq!(
        field(Pacing::new().clients(4).stagger(Duration::from_secs(60))),
        "stagger"
    );
    assert_eq!(
        field(Pacing::new().demand(Demand::OpenLoop {
            per_second: f64::NAN,
            give_up: Duration::from_secs(1),
        })),
        "demand"
    );
}

// ---- Throttling is not an outage (issue 39) ----

/// Writes the store accepted over the whole run.
fn accepted(report: &PacingReport) -> u64 {
    report.seconds.iter().map(|s| s.accepted).sum()
}

/// A batch job of about 200 records: 8 workers writing to a store of 20 a
/// second for 10 s, each through one layer they share, with shared pacing,
/// retrying a throttled write up to 10 attempts. The budget pays for every
/// throttled retry, and a retry that gets through gets its cost back, so
/// with the layer's default budget the job stores at least 185 of the 200
/// records and within 3 % of what it stores with none (measured: 190 to
/// 194, against 186 to 194 with none).
#[test]
fn eight_paced_writers_store_185_of_200_records_with_the_default_budget() {
    for latency in [Duration::from_millis(1), Duration::from_millis(50)] {
        for seed in 1..=CLOSED_LOOP_SEEDS {
            let scenario = Pacing::new()
                .capacity(20)
                .workers(8)
                .latency(latency)
                .horizon(Duration::from_secs(10))
                .seed(seed);
            let layer = |budget: bool| {
                let builder = BackoffLayer::builder()
                    .policy(ThrottledWrites)
                    .max_attempts(10)
                    .seed(seed)
                    .pacing(AdaptivePacing::new());
                match budget {
                    true => builder.build().unwrap(),
                    false => builder.no_budget().build().unwrap(),
                }
            };
            let run = |layer: BackoffLayer<ThrottledWrites>| {
                let report = scenario
                    .run(|_, store| tower_layer::Layer::layer(&layer, store))
                    .unwrap();
                (accepted(&report), layer.stats().map(|s| s.snapshot()))
            };
            let (defaults, _) = run(layer(true));
            let (unbudgeted, _) = run(layer(false));
            println!("{latency:?}, seed {seed}: {defaults} records with the defaults, {unbudgeted} with no budget");
            assert!(unbudgeted >= 150, "{unbudgeted}");
            assert!(defaults >= 185, "{latency:?}, seed {seed}: {defaults}");
            assert!(
                defaults as f64 >= 0.97 * unbudgeted as f64,
                "{latency:?}, seed {seed}: {defaults} against {unbudgeted}"
            );
        }
    }
}

// ---- The layer's defaults with shared pacing (the pacing regression) ----

/// The first second `s` from which every second of `s..s + 10` got at least
/// `share` of the store's rate accepted: goodput stays there for 10 s in a
/// row. Unlike [`PacingReport::settled`], which asks every later 10 s window
/// to hold on average, a single second may not fall below, and nothing after
/// those 10 s counts.
fn sustained(report: &PacingReport, share: f64) -> Option<usize> {
    let width = tower_backoff_sim::RECOVERY_WINDOW.as_secs() as usize;
    let good = |s: usize| {
        report.capacity[s].is_none_or(|r| report.seconds[s].accepted as f64 >= share * f64::from(r))
    };
    (0..(report.seconds.len() + 1).saturating_sub(width)).find(|&s| (s..s + width).all(good))
}

/// 8 closed-loop workers, each starting at a random time in the first
/// second, against a store of 20 writes a rolling second that refuses in 5 ms
/// and admits in two exact 10 ms legs, through the layer's defaults (3
/// attempts, the default budget and schedule) and one shared pacing: goodput
/// reaches 90 % of the rate within 10 s, in every seed, and stays there.
#[test]
#[ignore = "not met yet: seeds 1..=5 settle after [10, 4, 13, 4, 6] s; each cut sets 0.9 x a count at or under R, so the rounds after it run under 90 % of R"]
fn the_layers_defaults_with_pacing_settle_within_10_s_on_a_store_refusing_in_5_ms() {
    const R: u32 = 20;
    let mut settled = Vec::new();
    for seed in 1..=5 {
        let layer = BackoffLayer::builder()
            .policy(ThrottledWrites)
            .seed(seed)
            .pacing(AdaptivePacing::new())
            .build()
            .unwrap();
        let report = Pacing::new()
            .capacity(R)
            .workers(8)
            .start_spread(Duration::from_secs(1))
            .latency(Duration::from_millis(20))
            .refusal_latency(Duration::from_millis(5))
            .latency_spread(0.0)
            .horizon(Duration::from_secs(60))
            .seed(seed)
            .run(|_, store| tower_layer::Layer::layer(&layer, store))
            .unwrap();
        let from = sustained(&report, 0.9);
        println!(
            "seed {seed}: 90 % of R for 10 s in a row from {from:?} s (settled() says {:?}), goodput 30..60 s {:.1}/s, throttled {:.1} %: {}",
            report.settled(0.9, 0),
            report.goodput(30..60),
            100.0 * report.throttled_share(0..60),
            describe(&report)
        );
        settled.push((seed, from, describe(&report)));
    }
    for (seed, from, picture) in settled {
        assert!(
            from.is_some_and(|s| s <= 10),
            "seed {seed}: settled {from:?}: {picture}"
        );
    }
}
