//! Property tests: a real `BackoffLayer` around a failing service, on tokio's
//! paused clock, with extreme configurations the builder accepts (`u32::MAX`
//! attempts, year-long caps, a custom schedule with the default cap of
//! `Duration::MAX`, proportional jitter 1.0, server delays of
//! `Duration::MAX`): no panic, the request ends with its last real error, and
//! attempts and elapsed time stay within the configured limits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_backoff::{
    classify_fn, schedule, BackoffLayer, Cause, ConfigError, Constant, Decision, Exponential,
    Jitter, Linear, Schedule, Stats, Table,
};

const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How long a case may run on the wall clock before it counts as never ending.
const WALL_CLOCK_LIMIT: Duration = Duration::from_secs(30);

/// Delays the builders accept, edges first.
fn delay() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_millis(1)),
        Just(Duration::from_secs(1)),
        Just(YEAR),
        (0..=YEAR.as_nanos() as u64).prop_map(Duration::from_nanos),
    ]
}

/// A custom schedule keeping the trait's default cap, `Duration::MAX`.
#[derive(Debug, Clone, Copy)]
struct Uncapped(Duration);

impl Schedule for Uncapped {
    fn delay(&self, _retry: u32) -> Duration {
        self.0
    }
}

#[derive(Debug, Clone)]
enum ScheduleChoice {
    Exponential {
        initial: Duration,
        factor: f64,
        max: Duration,
    },
    Linear {
        initial: Duration,
        step: Duration,
        max: Duration,
    },
    Constant(Duration),
    Table(Vec<Duration>),
    FromFn {
        max: Duration,
    },
    Uncapped(Duration),
}

type AnySchedule = Arc<dyn Schedule + Send + Sync>;

impl ScheduleChoice {
    fn build(&self) -> AnySchedule {
        match *self {
            Self::Exponential {
                initial,
                factor,
                max,
            } => Arc::new(Exponential::new(initial).factor(factor).max_delay(max)),
            Self::Linear { initial, step, max } => {
                Arc::new(Linear::new(initial, step).max_delay(max))
            }
            Self::Constant(d) => Arc::new(Constant::new(d)),
            Self::Table(ref delays) => Arc::new(Table::new(delays.clone())),
            // The closure asks for the longest delay there is; the cap holds it.
            Self::FromFn { max } => Arc::new(schedule::from_fn(max, |_| Duration::MAX)),
            Self::Uncapped(d) => Arc::new(Uncapped(d)),
        }
    }
}

/// Schedules with accepted values, `factor` left to the caller.
fn schedule_with(factor: BoxedStrategy<f64>) -> impl Strategy<Value = ScheduleChoice> {
    prop_oneof![
        (delay(), factor, delay()).prop_map(|(a, factor, b)| ScheduleChoice::Exponential {
            initial: a.min(b),
            factor,
            max: a.max(b),
        }),
        (delay(), delay(), delay()).prop_map(|(a, step, b)| ScheduleChoice::Linear {
            initial: a.min(b),
            step,
            max: a.max(b),
        }),
        delay().prop_map(ScheduleChoice::Constant),
        prop::collection::vec(delay(), 1..4).prop_map(ScheduleChoice::Table),
        delay().prop_map(|max| ScheduleChoice::FromFn { max }),
        prop_oneof![delay(), Just(Duration::MAX)].prop_map(ScheduleChoice::Uncapped),
    ]
}

fn accepted_factor() -> BoxedStrategy<f64> {
    prop_oneof![Just(1.0), Just(2.0), Just(f64::MAX), 1.0..1e6].boxed()
}

fn any_float() -> BoxedStrategy<f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(0.5),
        Just(1.0),
        Just(f64::MAX),
        any::<f64>(),
    ]
    .boxed()
}

fn jitter_with(ratio: BoxedStrategy<f64>) -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        Just(Jitter::Decorrelated),
        ratio.prop_map(Jitter::Proportional),
    ]
}

fn accepted_ratio() -> BoxedStrategy<f64> {
    prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0].boxed()
}

#[derive(Debug, Clone)]
struct Case {
    schedule: ScheduleChoice,
    jitter: Jitter,
    max_attempts: u32,
    max_elapsed: Option<Duration>,
    default_budget: bool,
    /// What the server asks for as `Retry-After`, if anything.
    server_delay: Option<Duration>,
    /// How long each attempt takes: never zero, so a time limit bounds the
    /// number of attempts even with zero delays.
    latency: Duration,
    seed: u64,
}

fn case_with(factor: BoxedStrategy<f64>, ratio: BoxedStrategy<f64>) -> impl Strategy<Value = Case> {
    (
        schedule_with(factor),
        jitter_with(ratio),
        prop_oneof![Just(1), Just(2), Just(3), Just(10), Just(u32::MAX)],
        prop::option::of(prop_oneof![
            Just(Duration::from_nanos(1)),
            Just(Duration::from_millis(1)),
            Just(Duration::from_secs(1)),
            Just(YEAR),
        ]),
        any::<bool>(),
        prop::option::of(prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::from_nanos(1)),
            Just(Duration::from_secs(1)),
            Just(Duration::MAX),
        ]),
        prop_oneof![
            Just(Duration::from_millis(1)),
            Just(Duration::from_millis(50))
        ],
        any::<u64>(),
    )
        .prop_map(
            |(
                schedule,
                jitter,
                max_attempts,
                max_elapsed,
                default_budget,
                server_delay,
                latency,
                seed,
            )| {
                // `u32::MAX` attempts end only by the time limit: keep it
                // short enough that a case makes at most a thousand attempts.
                let max_elapsed = if max_attempts > 10 {
                    Some(max_elapsed.unwrap_or(YEAR).min(Duration::from_secs(1)))
                } else {
                    max_elapsed
                };
                Case {
                    schedule,
                    jitter,
                    max_attempts,
                    max_elapsed,
                    default_budget,
                    server_delay,
                    latency,
                    seed,
                }
            },
        )
}

/// What one request through the layer gave.
#[derive(Debug)]
struct Run {
    result: Result<(), u32>,
    calls: u32,
    elapsed: Duration,
    /// Attempts and retries the layer's stats counted.
    attempts: u64,
    retries: u64,
}

/// Builds the layer of `case`, counting into `stats`, or the error the
/// builder gave.
fn build(
    case: &Case,
    stats: Stats,
) -> Result<BackoffLayer<impl tower_backoff::Policy<u32, (), u32> + Clone>, ConfigError> {
    let server_delay = case.server_delay;
    let policy = classify_fn(move |_: &u32, _: &Result<(), u32>| match server_delay {
        Some(d) => Decision::retry_after(d).because(Cause::Throttled),
        None => Decision::retry(),
    });
    let builder = BackoffLayer::builder()
        .policy(policy)
        .schedule(case.schedule.build())
        .jitter(case.jitter)
        .max_attempts(case.max_attempts)
        .stats(stats)
        .seed(case.seed);
    let builder = match case.max_elapsed {
        Some(limit) => builder.max_elapsed(limit),
        None => builder,
    };
    let builder = if case.default_budget {
        builder
    } else {
        builder.no_budget()
    };
    builder.build()
}

/// Sends one request through the layer of `case` to a service that always
/// fails with `Err(call number)`, on a paused clock, in a thread of its own so
/// a request that never ends fails the test instead of hanging it.
fn run(case: &Case) -> Result<Run, TestCaseError> {
    let stats = Stats::new();
    let layer = build(case, stats.clone())
        .map_err(|e| TestCaseError::fail(format!("accepted configuration rejected: {e}")))?;
    let latency = case.latency;
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let service = ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |_: u32| {
                let n = counted.fetch_add(1, Ordering::Relaxed) + 1;
                async move {
                    tokio::time::sleep(latency).await;
                    Err::<(), u32>(n)
                }
            }));
        let (result, elapsed) = runtime.block_on(async {
            let start = Instant::now();
            let result = service.oneshot(0).await;
            (result, start.elapsed())
        });
        let _ = sender.send((result, calls.load(Ordering::Relaxed), elapsed));
    });
    let (result, calls, elapsed) = receiver.recv_timeout(WALL_CLOCK_LIMIT).map_err(|e| {
        TestCaseError::fail(match e {
            mpsc::RecvTimeoutError::Timeout => "the request never ended",
            mpsc::RecvTimeoutError::Disconnected => "the request panicked",
        })
    })?;
    Ok(Run {
        result,
        calls,
        elapsed,
        attempts: stats.snapshot().attempts,
        retries: stats.snapshot().retries,
    })
}

/// The limits every run must keep.
fn check_limits(case: &Case, run: &Run) -> Result<(), TestCaseError> {
    prop_assert!(run.calls >= 1);
    prop_assert_eq!(run.result, Err(run.calls), "not the last real error");
    prop_assert!(run.calls <= case.max_attempts, "{} attempts", run.calls);
    prop_assert_eq!(run.attempts, u64::from(run.calls));
    prop_assert_eq!(run.retries, u64::from(run.calls - 1));
    if let Some(limit) = case.max_elapsed {
        // The last attempt may start at the limit and take its latency; a
        // sleep may end up to one timer tick (1 ms) late, then nothing is sent.
        let bound = limit + case.latency + Duration::from_millis(1);
        prop_assert!(run.elapsed <= bound, "{:?} past {:?}", run.elapsed, bound);
    } else if !case.default_budget {
        // Nothing but the attempt limit stops it.
        prop_assert_eq!(run.calls, case.max_attempts);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn accepted_extreme_configurations_end_within_their_limits(
        case in case_with(accepted_factor(), accepted_ratio()),
    ) {
        let run = run(&case)?;
        check_limits(&case, &run)?;
    }

    #[test]
    fn a_configuration_is_rejected_by_name_or_runs_without_panic(
        case in case_with(any_float(), any_float()),
    ) {
        let bad_factor = match case.schedule {
            ScheduleChoice::Exponential { factor, .. } => !(factor.is_finite() && factor >= 1.0),
            _ => false,
        };
        let bad_ratio = matches!(case.jitter, Jitter::Proportional(r) if !(0.0..=1.0).contains(&r));
        match build(&case, Stats::new()) {
            Err(error) => {
                let field = error.field();
                prop_assert!((field == "factor" && bad_factor) || (field == "jitter" && bad_ratio), "{error}");
            }
            Ok(_) => {
                prop_assert!(!bad_factor && !bad_ratio, "accepted {case:?}");
                let run = run(&case)?;
                check_limits(&case, &run)?;
            }
        }
    }
}

/// The reproduction: a custom schedule keeping the default cap
/// (`Duration::MAX`) and proportional jitter 1.0 used to panic at the second
/// retry, in `mul_f64` and in the sum of the delays slept.
#[test]
fn uncapped_custom_schedule_with_full_proportional_jitter_runs_every_attempt() {
    let case = Case {
        schedule: ScheduleChoice::Uncapped(Duration::MAX),
        jitter: Jitter::Proportional(1.0),
        max_attempts: 4,
        max_elapsed: None,
        default_budget: false,
        server_delay: None,
        latency: Duration::from_millis(1),
        seed: 7,
    };
    let run = run(&case).unwrap();
    assert_eq!(run.result, Err(4));
    assert_eq!(run.retries, 3);
    // Sleeps are long (tokio caps a sleep at about 30 years), not skipped.
    assert!(run.elapsed > YEAR, "{:?}", run.elapsed);
}
