//! The server half in the simulation (seeded, paused clock): the issue's
//! "Done means", asserted on measured output.
//!
//! Tables: `cargo test --release --all-features --test repo sim_shed:: -- --ignored --nocapture`.

use std::time::Duration;

use tower_backoff_sim::{metastable_storm, shed_storm, Gate, OverloadScenario, Strategy};

/// Seeds of each run: each pair of runs takes about 4 s in a debug build.
fn seeds() -> std::ops::RangeInclusive<u64> {
    if cfg!(debug_assertions) {
        1..=2
    } else {
        1..=5
    }
}

#[test]
fn metastable_the_pair_recovers_within_7_s_where_the_client_alone_never_does() {
    for seed in seeds() {
        let storm = metastable_storm(seed);
        let client_only = Strategy::Defaults.run(&storm, seed).unwrap().summary();
        let pair = shed_storm(&storm, Gate::Shed, seed).unwrap().summary();
        println!("seed {seed}\n  client only: {client_only:?}\n  pair: {pair:?}");
        assert_eq!(client_only.recovery, None, "{client_only:?}");
        let recovery = pair.recovery.expect("the pair recovers");
        assert!(recovery <= Duration::from_secs(7), "{pair:?}");
    }
}

#[test]
fn twice_capacity_for_60_s_keeps_goodput_latency_and_spread() {
    for seed in seeds() {
        let report = OverloadScenario::new().seed(seed).run(Gate::Shed).unwrap();
        let (unloaded, loaded) = report.p99_unloaded_and_loaded();
        let (unloaded, loaded) = (unloaded.unwrap(), loaded.unwrap());
        let goodput = report.goodput_share();
        let busiest = report.busiest_over_mean();
        let back = report.full_goodput_after();
        println!(
            "seed {seed}: goodput {:.1} % of capacity, p99 {unloaded:?} unloaded, {loaded:?} admitted under load, busiest 100 ms {busiest:.2}× the mean, full goodput {back:?} after",
            goodput * 100.0
        );
        assert!(goodput >= 0.95, "goodput {goodput}");
        assert!(loaded <= unloaded * 2, "{loaded:?} vs {unloaded:?}");
        assert!(busiest <= 2.0, "{busiest}");
        assert!(back.unwrap() <= Duration::from_secs(10), "{back:?}");
    }
}

#[test]
fn four_times_capacity_for_60_s_keeps_goodput() {
    // One seed in a debug build: each takes about 6 s there.
    for seed in seeds().take(if cfg!(debug_assertions) { 1 } else { 5 }) {
        let report = OverloadScenario::new()
            .overload(4.0)
            .seed(seed)
            .run(Gate::Shed)
            .unwrap();
        let goodput = report.goodput_share();
        let (unloaded, loaded) = report.p99_unloaded_and_loaded();
        println!(
            "seed {seed}, 4x: goodput {:.1} % of capacity, p99 {unloaded:?} unloaded, {loaded:?} admitted under load",
            goodput * 100.0
        );
        assert!(goodput >= 0.95, "goodput {goodput}");
    }
}

/// The tables of README.md, docs/GUIDE.md and docs/RESULTS.md.
#[test]
#[ignore = "prints the comparison tables"]
fn shed_tables() {
    println!("| seed | client only | + load_shed + concurrency_limit(30), the knee | + load_shed + concurrency_limit(300) | + shed (the pair) |");
    println!("|---|---|---|---|---|");
    let show =
        |r: Option<Duration>| r.map_or("never".to_string(), |d| format!("{} s", d.as_secs()));
    for seed in 1..=10 {
        let storm = metastable_storm(seed);
        let client = Strategy::Defaults.run(&storm, seed).unwrap().summary();
        let fixed = shed_storm(&storm, Gate::Fixed(30), seed).unwrap().summary();
        let loose = shed_storm(&storm, Gate::Fixed(300), seed)
            .unwrap()
            .summary();
        let pair = shed_storm(&storm, Gate::Shed, seed).unwrap().summary();
        println!(
            "| {seed} | {} | {} | {} | {} |",
            show(client.recovery),
            show(fixed.recovery),
            show(loose.recovery),
            show(pair.recovery)
        );
    }
    println!();
    println!("| gate | seed | goodput, % of capacity | admitted p99 unloaded | admitted p99 at 2× | busiest 100 ms / mean | full goodput after |");
    println!("|---|---|---|---|---|---|---|");
    for gate in [Gate::Shed, Gate::Fixed(30), Gate::Fixed(300)] {
        for seed in 1..=5 {
            let report = OverloadScenario::new().seed(seed).run(gate).unwrap();
            let (unloaded, loaded) = report.p99_unloaded_and_loaded();
            println!(
                "| {} | {seed} | {:.1} | {:?} | {:?} | {:.2} | {:?} |",
                gate.name(),
                report.goodput_share() * 100.0,
                unloaded.unwrap_or_default(),
                loaded.unwrap_or_default(),
                report.busiest_over_mean(),
                report.full_goodput_after(),
            );
        }
    }
}
