//! Behaviour of the retry-storm simulator: the server model, the scenarios'
//! determinism, and the results the README and docs/GUIDE.md quote, asserted on the
//! simulation's own output.

use std::time::Duration;

use tokio::task::LocalSet;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_backoff::{BackoffLayer, Jitter};
use tower_backoff_sim::{
    Amplification, AttemptError, BudgetSharing, ClientSample, Connection, Contention, Request,
    Server, ServerModel, ServerSample, Storm, StormReport, Strategy,
};

/// A model whose requests all need exactly the base latency.
fn exact() -> ServerModel {
    ServerModel::new().work_spread(0.0)
}

fn start(model: &ServerModel) -> Server {
    Server::start(model, 1, Duration::from_secs(1), Duration::from_secs(60))
}

#[tokio::test(start_paused = true)]
async fn answers_after_base_latency_up_to_capacity() {
    LocalSet::new()
        .run_until(async {
            let server = start(&exact().capacity(30));
            let begin = Instant::now();
            let all = futures::future::join_all((0..30).map(|_| server.submit())).await;
            assert!(all.iter().all(Result::is_ok));
            assert_eq!(begin.elapsed(), Duration::from_millis(100));
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn latency_grows_with_the_excess_over_capacity() {
    LocalSet::new()
        .run_until(async {
            let model = exact().capacity(30).slowdown(1.05, 15.0);
            let server = start(&model);
            let begin = Instant::now();
            futures::future::join_all((0..60).map(|_| server.submit())).await;
            // 30 over capacity: 100 ms × 1.05^(30/15) = 110.25 ms, and the
            // timer wakes on the next whole millisecond.
            assert_eq!(model.latency(60), Duration::from_micros(110_250));
            assert_eq!(begin.elapsed(), Duration::from_millis(111));
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn requests_arriving_during_an_outage_are_served_when_it_ends() {
    LocalSet::new()
        .run_until(async {
            let model = exact()
                .backlog(10)
                .outage(Duration::ZERO, Duration::from_secs(5));
            let server = start(&model);
            let begin = Instant::now();
            tokio::time::sleep(Duration::from_secs(1)).await;
            futures::future::join_all((0..5).map(|_| server.submit())).await;
            assert_eq!(begin.elapsed(), Duration::from_millis(5_100));
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn requests_beyond_the_backlog_are_lost() {
    LocalSet::new()
        .run_until(async {
            let model = exact()
                .backlog(2)
                .outage(Duration::ZERO, Duration::from_secs(5));
            let server = start(&model);
            let kept = [server.submit(), server.submit()];
            let lost = server.submit();
            assert_eq!(server.outstanding(), 2);
            let kept = futures::future::join_all(kept).await;
            assert!(kept.iter().all(Result::is_ok));
            let waited = tokio::time::timeout(Duration::from_secs(30), lost).await;
            assert!(waited.is_err(), "a lost request is never answered");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn finishes_the_work_of_requests_whose_client_gave_up() {
    LocalSet::new()
        .run_until(async {
            let server = start(&exact());
            let connection = Connection::new(server.clone(), Duration::from_millis(50));
            let outcome = connection.oneshot(Request { id: 0 }).await;
            assert_eq!(outcome, Err(AttemptError::TimedOut));
            assert_eq!(server.outstanding(), 1, "still working after the timeout");
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert_eq!(server.outstanding(), 0);
            let done: u64 = server.samples().iter().map(|s| s.completions).sum();
            assert_eq!(done, 1);
        })
        .await;
}

/// A small storm, quick even in a debug build.
fn small_storm(seed: u64) -> Storm {
    Storm::new()
        .clients(300)
        .outage(Duration::from_secs(10), Duration::from_secs(5))
        .horizon(Duration::from_secs(40))
        .seed(seed)
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    let first = Strategy::ExponentialJitter.run(&small_storm(9), 9).unwrap();
    let second = Strategy::ExponentialJitter.run(&small_storm(9), 9).unwrap();
    assert_eq!(first, second);
    // Not equal because nothing happened: the run did real work.
    assert!(first.summary().requests > 1000);
    assert!(first.summary().attempts > first.summary().requests);
}

#[test]
fn another_seed_gives_other_numbers() {
    let first = Strategy::ExponentialJitter.run(&small_storm(9), 9).unwrap();
    let other = Strategy::ExponentialJitter
        .run(&small_storm(10), 10)
        .unwrap();
    assert_ne!(first.clients, other.clients);
}

#[test]
fn storm_settings_are_checked_by_name() {
    let err = Storm::new().clients(0).run(|c| c).unwrap_err();
    assert_eq!(err.field(), "clients");
    let err = Storm::new()
        .rate_per_client(f64::NAN)
        .run(|c| c)
        .unwrap_err();
    assert_eq!(err.field(), "rate_per_client");
    let err = Storm::new()
        .server(ServerModel::new().slowdown(0.5, 15.0))
        .run(|c| c)
        .unwrap_err();
    assert_eq!(err.field(), "slowdown");
}

#[test]
fn sizes_that_would_never_finish_are_refused_before_running() {
    let err = Storm::new().clients(usize::MAX).run(|c| c).unwrap_err();
    assert_eq!(err.field(), "clients");
    let err = Storm::new().rate_per_client(1e9).run(|c| c).unwrap_err();
    assert_eq!(err.field(), "rate_per_client");
    let err = Contention::new()
        .clients(1_000_000)
        .run(Jitter::None)
        .unwrap_err();
    assert_eq!(err.field(), "clients");
    let err = Amplification::new()
        .rate(f64::INFINITY)
        .run(|c| c)
        .unwrap_err();
    assert_eq!(err.field(), "rate");
}

/// A report with `before` successes per interval until the outage (10..20 s),
/// none during it, then what `after` says for each interval from 20 s.
fn report_with_goodput(before: u64, after: &[u64]) -> StormReport {
    let mut clients = vec![ClientSample::default(); 20 + after.len()];
    for (i, sample) in clients.iter_mut().enumerate() {
        sample.succeeded = match i {
            0..10 => before,
            10..20 => 0,
            _ => after[i - 20],
        };
        sample.started = before;
    }
    StormReport {
        interval: Duration::from_secs(1),
        outage: Duration::from_secs(10)..Duration::from_secs(20),
        server: vec![ServerSample::default(); clients.len()],
        clients,
    }
}

#[test]
fn recovery_is_when_goodput_is_back_for_good() {
    // Back at 100 from 23 s, then a two-second dip at 30 s: every 10 s
    // window holding the dip is below 90 %, so it counts from 31 s.
    let mut after = vec![0, 0, 0];
    after.extend([100; 7]);
    after.extend([0, 0]);
    after.extend([100; 20]);
    let report = report_with_goodput(100, &after);
    assert_eq!(report.summary().recovery, Some(Duration::from_secs(11)));
}

#[test]
fn recovery_is_never_when_goodput_stays_low() {
    let report = report_with_goodput(100, &[85; 30]);
    assert_eq!(report.summary().recovery, None);
    let report = report_with_goodput(100, &[95; 30]);
    assert_eq!(report.summary().recovery, Some(Duration::ZERO));
}

#[test]
fn fixed_interval_never_recovers_where_jitter_with_a_budget_does_in_the_default_storm() {
    let storm = Storm::new();
    let fixed = Strategy::FixedInterval.run(&storm, 1).unwrap().summary();
    let budgeted = Strategy::Budgeted.run(&storm, 1).unwrap().summary();

    assert_eq!(fixed.recovery, None, "fixed interval: {fixed:?}");
    assert!(
        fixed.goodput_after < 0.1 * fixed.goodput_before,
        "{fixed:?}"
    );
    assert!(budgeted.recovery.is_some(), "budgeted: {budgeted:?}");
    assert!(
        budgeted.goodput_after >= 0.9 * budgeted.goodput_before,
        "{budgeted:?}"
    );
    // The same workload: only the retries differ.
    assert_eq!(fixed.requests, budgeted.requests);
}

#[test]
fn a_shared_10_percent_budget_keeps_amplification_at_1_1x_plus_the_floor_at_1000_clones() {
    let scenario = Amplification::new().clones(1000);
    let report = scenario.run_with_budget(BudgetSharing::Shared, 1).unwrap();
    assert!(report.requests > 20_000);
    assert_eq!(report.unfinished, 0);
    // The floor: 10 retries per second, over the run and one 10 s window.
    let floor = 10 * (report.duration.as_secs() + 10);
    let ten_percent = report.requests / 10;
    assert!(
        report.attempts <= report.requests + ten_percent + floor,
        "{report:?}: {:.3} attempts per request",
        report.attempts_per_request()
    );
    // It did retry, up to what it allows.
    assert!(report.attempts > report.requests + ten_percent);
}

#[test]
fn budgets_per_clone_do_not_cap_1000_clones_that_each_send_little() {
    let scenario = Amplification::new().clones(1000);
    let per_clone = scenario
        .run_with_budget(BudgetSharing::PerClone, 1)
        .unwrap();
    let shared = scenario.run_with_budget(BudgetSharing::Shared, 1).unwrap();
    // Each clone sends about one request a second: its own floor of 10
    // retries a second lets every retry through.
    assert_eq!(per_clone.attempts, 3 * per_clone.requests);
    assert!(shared.attempts_per_request() < 1.2);
}

#[test]
fn full_jitter_makes_fewer_write_calls_than_no_jitter_at_100_clients() {
    let none = Contention::new().clients(100).run(Jitter::None).unwrap();
    let full = Contention::new().clients(100).run(Jitter::Full).unwrap();
    assert_eq!(none.succeeded, 100);
    assert_eq!(full.succeeded, 100);
    assert!(
        full.write_calls < none.write_calls,
        "full jitter: {} calls, no jitter: {}",
        full.write_calls,
        none.write_calls
    );
}

#[test]
fn without_a_budget_every_request_makes_every_attempt_in_a_full_outage() {
    let layer = BackoffLayer::builder()
        .max_attempts(3)
        .seed(1)
        .no_budget()
        .build()
        .unwrap();
    let report = Amplification::new()
        .clones(1000)
        .run(|c| tower_layer::Layer::layer(&layer, c))
        .unwrap();
    assert!(report.requests > 20_000);
    assert_eq!(report.unfinished, 0);
    assert_eq!(report.attempts, 3 * report.requests);
}

#[test]
fn a_timeout_shorter_than_the_latency_fails_every_attempt() {
    let report = Storm::new()
        .clients(50)
        .attempt_timeout(Duration::from_millis(50))
        .outage(Duration::from_secs(5), Duration::from_secs(1))
        .horizon(Duration::from_secs(20))
        .run(|c| c)
        .unwrap();
    let summary = report.summary();
    assert_eq!(summary.failed + summary.unfinished, summary.requests);
    assert_eq!(summary.goodput_before, 0.0);
}

// ---- The default budget, against every target of issue 11 ----
//
// One seed of each scenario runs by default; the ten-seed sweeps behind the
// "10/10" of docs/GUIDE.md's tables are `#[ignore]`d (about a minute in a debug build):
// `cargo test --all-features --test repo sim:: -- --ignored`.

use tower_backoff::{classify_fn, Cause, Decision, Exponential};
use tower_backoff_sim::{
    BudgetKind, Conflict, ContentionReport, PartialFailure, Write, CONTENTION_FIRST_DELAY,
    CONTENTION_MAX_DELAY,
};

/// What the default budget starts with: one request's retries (two, for
/// the default three attempts), and no more.
const DEFAULT_START: u64 = 2;

#[test]
fn defaults_keep_a_full_outage_at_1_0001_attempts_per_request_at_10_100_and_1000_clones() {
    for clones in [10, 100, 1000] {
        let report = Amplification::new()
            .clones(clones)
            .run_with(BudgetKind::Default, 1)
            .unwrap();
        assert!(report.requests > 25_000, "{report:?}");
        assert_eq!(report.unfinished, 0);
        // The documented bound: the retries it starts with, then nothing
        // while nothing succeeds.
        assert!(
            report.attempts <= report.requests + DEFAULT_START,
            "{clones} clones: {report:?}"
        );
        assert!(report.attempts_per_request() <= 1.0001, "{report:?}");
    }
}

#[test]
fn a_share_of_requests_cannot_hold_a_full_outage_to_1_02() {
    // Why it is not the default: it earns while nothing succeeds.
    let report = Amplification::new()
        .clones(100)
        .run_with(BudgetKind::ShareOfRequests, 1)
        .unwrap();
    assert!(report.attempts_per_request() > 1.15, "{report:?}");
}

#[test]
fn defaults_succeed_for_99_5_percent_at_1_12x_load_when_a_tenth_of_attempts_fail() {
    let report = PartialFailure::new()
        .failure_rate(0.1)
        .run_with(BudgetKind::Default, 1)
        .unwrap();
    assert!(report.requests > 50_000, "{report:?}");
    assert!(report.success_share() >= 0.995, "{report:?}");
    assert!(report.attempts_per_request() <= 1.12, "{report:?}");
}

#[test]
fn defaults_retry_nearly_every_failure_when_three_tenths_of_attempts_fail() {
    // Each first-try success earns a retry: the bucket refuses only in the
    // first second, before it has measured the traffic its capacity grows
    // to.
    let p = PartialFailure::new().failure_rate(0.3);
    let defaults = p.run_with(BudgetKind::Default, 1).unwrap();
    let unbudgeted = p.run_with(BudgetKind::None, 1).unwrap();
    let lost = unbudgeted.success_share() - defaults.success_share();
    assert!(lost <= 0.002, "{defaults:?} {unbudgeted:?}");
    assert!(defaults.attempts_per_request() < 1.40, "{defaults:?}");
}

// ---- A fleet: one layer per process (issue 25) ----

/// 1,000 processes, each with its own layer, sending 1 request a second
/// each, for 60 s of outage.
fn fleet_outage() -> Amplification {
    Amplification::new()
        .clones(1000)
        .duration(Duration::from_secs(60))
}

#[test]
fn defaults_keep_an_outage_of_1000_independent_processes_at_1_035_attempts_per_request() {
    let report = fleet_outage()
        .run_independent(BudgetKind::Default, 1)
        .unwrap();
    println!("1,000 processes, cold: {report:?}");
    assert!(report.requests > 55_000, "{report:?}");
    // One request's retries each, at most: what each bucket starts with.
    assert!(
        report.attempts <= report.requests + 1000 * DEFAULT_START,
        "{report:?}"
    );
    assert!(report.attempts_per_request() <= 1.035, "{report:?}");
    // After the first 10 s nothing is left to spend: at most 1 % of the
    // 1,000 requests a second offered.
    let late_seconds = 60 - 10;
    assert!(report.late_retries <= 10 * late_seconds, "{report:?}");
    // The AWS reserve of 500 tokens each spends 100 retries per process.
    let aws = fleet_outage()
        .run_independent(BudgetKind::TokenBucket, 1)
        .unwrap();
    assert!(aws.attempts_per_request() > 2.5, "{aws:?}");
}

#[test]
fn defaults_keep_an_outage_after_30_s_of_healthy_traffic_at_1_05_attempts_per_request() {
    let warm = fleet_outage().healthy_for(Duration::from_secs(30));
    let report = warm.run_independent(BudgetKind::Default, 1).unwrap();
    println!("1,000 processes, warm: {report:?}");
    assert!(report.requests > 55_000, "{report:?}");
    // The capacity each earned back: two retries (and a few requests in
    // flight as the outage began retry too).
    assert!(report.attempts <= report.requests + 2000 + 10, "{report:?}");
    assert!(report.attempts_per_request() <= 1.05, "{report:?}");
    // One layer shared by all, 1,000 requests a second when healthy: a tenth
    // of its last 10 s of successes, spent once as the outage begins (and
    // the few in flight as it began).
    let shared = warm.run_with(BudgetKind::Default, 1).unwrap();
    println!("one layer for all, warm: {shared:?}");
    assert!(shared.attempts <= shared.requests + 1000 + 10, "{shared:?}");
}

/// 100 independent processes (each alone in an outage, so the ratio is the
/// same at any count): 2 s at 1,000 requests a second with a tenth of
/// attempts failing, which grows each default budget's capacity to about
/// 900 retries; then `quiet` at 1 request a second with no failure; then a
/// 60 s outage at 1 request a second.
fn after_a_busy_spell(quiet: Duration) -> tower_backoff_sim::SpellReport {
    use tower_backoff_sim::{Fleet, Spell};
    let secs = Duration::from_secs;
    let mut fleet = Fleet::new(100).spell(Spell::new(secs(2), 1000.0, 0.1));
    if !quiet.is_zero() {
        fleet = fleet.spell(Spell::new(quiet, 1.0, 0.0));
    }
    let fleet = fleet.spell(Spell::outage(secs(60), 1.0, secs(1)));
    let report = fleet.run_independent(BudgetKind::Default, 1).unwrap();
    *report.spells.last().unwrap()
}

#[test]
fn defaults_keep_an_outage_after_a_busy_spell_and_10_quiet_minutes_at_1_05_attempts_per_request() {
    // Right after the busy spell, the outage meets the capacity it grew:
    // what the process's own traffic earned, falling over 10 s.
    let right_after = after_a_busy_spell(Duration::ZERO);
    println!("busy spell, then the outage: {right_after:?}");
    assert!(
        right_after.attempts_per_request() > 1.2,
        "the busy spell grew the capacity: {right_after:?}"
    );
    // Ten quiet minutes later it has fallen back to one request's retries.
    let later = after_a_busy_spell(Duration::from_secs(600));
    println!("busy spell, 10 quiet minutes, then the outage: {later:?}");
    assert!(later.requests > 5_500, "{later:?}");
    assert!(
        later.attempts <= later.requests + 100 * DEFAULT_START,
        "{later:?}"
    );
    assert!(later.attempts_per_request() <= 1.05, "{later:?}");
    assert!(later.late_retries <= 50, "{later:?}");
}

/// Failed requests with the default budget and without one, summed over
/// `seeds`, each seed a run of 60,000 requests with a tenth of attempts
/// failing.
fn failed_at_a_tenth(independent: bool, seeds: std::ops::Range<u64>) -> (u64, u64, u64) {
    let mut totals = (0, 0, 0);
    for seed in seeds {
        let p = PartialFailure::new().clones(1000).seed(seed);
        let run = |kind| match independent {
            true => p.run_independent(kind, seed).unwrap(),
            false => p.run_with(kind, seed).unwrap(),
        };
        let (defaults, none) = (run(BudgetKind::Default), run(BudgetKind::None));
        totals.0 += defaults.requests;
        totals.1 += defaults.requests - defaults.succeeded;
        totals.2 += none.requests - none.succeeded;
    }
    totals
}

#[test]
fn one_shared_layer_succeeds_within_0_01_points_of_no_budget_when_a_tenth_of_attempts_fail() {
    let (requests, with_budget, without) = failed_at_a_tenth(false, 1..3);
    let gap = (with_budget as f64 - without as f64) / requests as f64;
    println!(
        "one shared layer: {with_budget} vs {without} failed of {requests}: {:.4} points",
        100.0 * gap
    );
    assert!(
        gap <= 0.0001,
        "{with_budget} vs {without} failed of {requests}"
    );
}

#[test]
fn independent_layers_succeed_within_0_03_points_of_no_budget_when_a_tenth_of_attempts_fail() {
    // Each attempt's fate is drawn from its request and its number, so the
    // runs differ only by the retries the budgets refused. Measured 0.018 to
    // 0.037 points per seed over seeds 1 to 10, 0.024 in all (release
    // build). What each process loses: the retries a bucket of one
    // request's retries cannot pay right after a request spent them all,
    // before a success earns one back.
    let (requests, with_budget, without) = failed_at_a_tenth(true, 1..6);
    let gap = (with_budget as f64 - without as f64) / requests as f64;
    println!(
        "independent layers: {with_budget} vs {without} failed of {requests}: {:.4} points",
        100.0 * gap
    );
    assert!(
        gap <= 0.0003,
        "{with_budget} vs {without} failed of {requests}"
    );
}

fn recovers(strategy: Strategy, storm: &Storm, seeds: std::ops::Range<u64>) -> u64 {
    seeds
        .map(|seed| {
            let report = strategy.run(&storm.clone().seed(seed), seed).unwrap();
            u64::from(report.summary().recovery.is_some())
        })
        .sum()
}

/// The storm and the three sensitivity settings the issue names.
fn storms() -> [(&'static str, Storm); 4] {
    let outage_start = Duration::from_secs(20);
    [
        ("defaults", Storm::new()),
        ("--clients 2000", Storm::new().clients(2000)),
        (
            "--backlog 1024",
            Storm::new().server(
                ServerModel::new()
                    .backlog(1024)
                    .outage(outage_start, Duration::from_secs(10)),
            ),
        ),
        (
            "--outage 30",
            Storm::new().outage(outage_start, Duration::from_secs(30)),
        ),
    ]
}

#[test]
fn defaults_recover_from_the_storm_where_unbudgeted_retries_do_not() {
    let storm = Storm::new();
    let defaults = Strategy::Defaults.run(&storm, 1).unwrap().summary();
    assert_eq!(defaults.recovery, Some(Duration::ZERO), "{defaults:?}");
    // The clients share one layer, busy before the outage: it holds a tenth
    // of 10 s of its first-try successes, and the first retry weighed a
    // second into the outage drops it (measured: 1.03).
    assert!(defaults.amplification_during <= 1.05, "{defaults:?}");
    // The same layer without its budget collapses: see
    // `fixed_interval_never_recovers_where_jitter_with_a_budget_does_in_the_default_storm`
    // and the budget comparison sweep below.
}

#[test]
fn defaults_recover_at_2000_clients_and_from_a_30_s_outage() {
    for (name, storm) in storms() {
        if name == "--backlog 1024" || name == "defaults" {
            continue;
        }
        let summary = Strategy::Defaults.run(&storm, 1).unwrap().summary();
        assert!(summary.recovery.is_some(), "{name}: {summary:?}");
    }
}

#[test]
fn defaults_recover_from_a_retransmitted_outage_at_250_requests_per_second() {
    let storm = Storm::new().server(
        ServerModel::new()
            .retransmit(true)
            .outage(Duration::from_secs(20), Duration::from_secs(10)),
    );
    let summary = Strategy::Defaults.run(&storm, 1).unwrap().summary();
    assert!(summary.recovery.is_some(), "{summary:?}");
}

#[test]
fn defaults_recover_from_a_retransmitted_outage_within_3_s_of_a_client_that_never_retries() {
    // The metastable case: what arrived during the outage lands at once
    // when it ends, and the server stays overloaded for a while with no
    // retries at all. Retries must not make that longer.
    let storm = Storm::new().server(
        ServerModel::new()
            .retransmit(true)
            .outage(Duration::from_secs(20), Duration::from_secs(10)),
    );
    let none = Strategy::NoRetries.run(&storm, 1).unwrap().summary();
    let defaults = Strategy::Defaults.run(&storm, 1).unwrap().summary();
    println!(
        "recovery: no retries {:?}, defaults {:?}",
        none.recovery, defaults.recovery
    );
    let (Some(none_at), Some(defaults_at)) = (none.recovery, defaults.recovery) else {
        panic!("both recover: {none:?} {defaults:?}");
    };
    assert!(
        defaults_at <= none_at + Duration::from_secs(3),
        "{defaults:?} {none:?}"
    );
}

/// The default storm, cut at 45 s (the outage ends at 30 s; recovery is
/// judged over 10 s): the unbudgeted until-success runs pile up hundreds of
/// thousands of attempts, which takes a while in a debug build.
fn until_success_storm() -> Storm {
    Storm::new().horizon(Duration::from_secs(45))
}

#[test]
fn seed_003_neither_schedule_recovers_retrying_until_success_without_a_budget() {
    // The article's claim, that exponential backoff lets the server recover
    // where a fixed interval does not, does not hold here: both collapse.
    let storm = until_success_storm();
    let fixed = Strategy::FixedUntilSuccess { budget: false }
        .run(&storm, 1)
        .unwrap()
        .summary();
    let exponential = Strategy::ExponentialUntilSuccess { budget: false }
        .run(&storm, 1)
        .unwrap()
        .summary();
    assert_eq!(fixed.recovery, None, "{fixed:?}");
    assert_eq!(exponential.recovery, None, "{exponential:?}");
    // Exponential backoff does send fewer attempts; not few enough.
    assert!(
        exponential.attempts < fixed.attempts,
        "{exponential:?} {fixed:?}"
    );
}

#[test]
fn seed_003_both_schedules_recover_retrying_until_success_within_the_default_budget() {
    let storm = until_success_storm();
    for strategy in [
        Strategy::FixedUntilSuccess { budget: true },
        Strategy::ExponentialUntilSuccess { budget: true },
    ] {
        let summary = strategy.run(&storm, 1).unwrap().summary();
        assert_eq!(
            summary.recovery,
            Some(Duration::ZERO),
            "{strategy}: {summary:?}"
        );
    }
}

#[test]
#[ignore = "ten seeds of three settings: a minute or more in a debug build"]
fn defaults_recover_in_10_of_10_seeds_at_the_defaults_2000_clients_and_a_30_s_outage() {
    for (name, storm) in storms() {
        if name == "--backlog 1024" {
            continue;
        }
        let recovered = recovers(Strategy::Defaults, &storm, 1..11);
        assert_eq!(recovered, 10, "{name}");
    }
}

#[test]
#[ignore = "two collapsing storms: slow in a debug build"]
fn at_backlog_1024_defaults_add_no_load_to_no_retries_and_neither_recovers() {
    // A target no retry budget can meet: the backlog alone, taken in at
    // once, sinks the server even with no retries at all. The default budget
    // adds nothing to that (it has spent its reserve during the outage and
    // nothing succeeds), so it fails exactly as no retries do.
    let (_, storm) = storms().into_iter().nth(2).unwrap();
    let none = Strategy::NoRetries.run(&storm, 1).unwrap().summary();
    let defaults = Strategy::Defaults.run(&storm, 1).unwrap().summary();
    assert_eq!(none.recovery, None, "{none:?}");
    assert_eq!(defaults.recovery, None, "{defaults:?}");
    assert!(
        defaults.attempts <= none.attempts + 100,
        "{defaults:?} {none:?}"
    );
}

// ---- Conflicts are not overload (issue 25) ----

/// The contention race through `layer`, each client re-sending at once
/// whatever the layer gives up on, until it wins: a caller that must get
/// its write through.
fn race_until_won<P>(layer: &BackoffLayer<P>) -> ContentionReport
where
    P: tower_backoff::Policy<Write, (), Conflict> + Clone + 'static,
{
    Contention::new()
        .run_with(|record| {
            let svc = tower_layer::Layer::layer(layer, record);
            tower::service_fn(move |write: Write| {
                let svc = svc.clone();
                async move {
                    loop {
                        if svc.clone().oneshot(write).await.is_ok() {
                            return Ok::<(), Conflict>(());
                        }
                    }
                }
            })
        })
        .unwrap()
}

fn racing_layer<P>(policy: P, budget: bool) -> BackoffLayer<P> {
    let builder = BackoffLayer::builder()
        .policy(policy)
        .schedule(Exponential::new(CONTENTION_FIRST_DELAY).max_delay(CONTENTION_MAX_DELAY))
        .unlimited_attempts()
        .max_elapsed(Duration::from_secs(60))
        .seed(1);
    match budget {
        true => builder.build().unwrap(),
        false => builder.no_budget().build().unwrap(),
    }
}

#[test]
fn the_default_budget_makes_an_optimistic_write_race_no_worse_than_no_budget() {
    let conflicts = classify_fn(|_: &Write, result: &Result<(), Conflict>| match result {
        Ok(()) => Decision::Success,
        Err(Conflict) => Decision::retry().because(Cause::Conflict),
    });
    let unbudgeted = race_until_won(&racing_layer(conflicts, false));
    let defaults = race_until_won(&racing_layer(conflicts, true));
    println!("no budget {unbudgeted:?}\ndefaults {defaults:?}");
    assert_eq!(defaults.succeeded, defaults.clients);
    let calls = defaults.write_calls as f64 / unbudgeted.write_calls as f64;
    let time = defaults.last_success.as_secs_f64() / unbudgeted.last_success.as_secs_f64();
    assert!(
        (0.95..=1.05).contains(&calls),
        "{defaults:?} {unbudgeted:?}"
    );
    assert!((0.95..=1.05).contains(&time), "{defaults:?} {unbudgeted:?}");
    // Charged as overload instead, the budget is spent in the first round
    // and every refused caller re-sends at once, without backoff.
    let transient = classify_fn(|_: &Write, result: &Result<(), Conflict>| match result {
        Ok(()) => Decision::Success,
        Err(Conflict) => Decision::retry(),
    });
    let charged = race_until_won(&racing_layer(transient, true));
    println!("charged {charged:?}");
    assert!(
        charged.write_calls > 2 * unbudgeted.write_calls,
        "{charged:?} {unbudgeted:?}"
    );
}
