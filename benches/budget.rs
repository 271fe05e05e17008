//! Cost of one deposit plus one withdrawal, from one thread and from two
//! threads sharing the budget, for our token bucket as its builder sets it up
//! to earn (on retries' successes, on first-try successes, on first attempts;
//! and the bucket a layer builds by default) and tower's `TpsBudget`, in the
//! same run. Then the happy path alone: a first-try success, which a bucket
//! whose capacity grows with traffic counts. Controls say what the machine
//! gives: a clock read alone (tokio's), and work that shares no memory, on
//! one thread and on two (on two free cores it takes as long on both).
//!
//! `cargo bench --bench budget -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tower::retry::budget::{Budget as _, TpsBudget};
use tower_backoff::budget::{Budget, TokenBucket};
use tower_backoff::Cause;

/// One deposit and one withdrawal, as each budget earns: a success and a
/// retry for tower's `TpsBudget`; for a token bucket, what it is set to earn
/// on, then the retry it pays.
trait Pair: Sync {
    fn pair(&self) -> bool;
}

impl Pair for TpsBudget {
    fn pair(&self) -> bool {
        self.deposit();
        self.withdraw()
    }
}

/// What a token bucket earns on in a pair.
#[derive(Clone, Copy)]
enum Earns {
    /// The retry's success, which refunds its cost (the AWS SDKs): the
    /// bucket neither fills nor drains.
    RetrySuccess,
    /// A first-try success (tower's `TpsBudget`).
    FirstTrySuccess,
    /// A first attempt, whatever its outcome (Finagle).
    FirstAttempt,
}

struct Bucket(TokenBucket, Earns);

impl Pair for Bucket {
    fn pair(&self) -> bool {
        let Bucket(bucket, earns) = self;
        match earns {
            Earns::RetrySuccess => {
                let granted = bucket.try_retry(Cause::Transient);
                bucket.on_success(Some(Cause::Transient));
                granted
            }
            Earns::FirstTrySuccess => {
                bucket.on_success(None);
                bucket.try_retry(Cause::Transient)
            }
            Earns::FirstAttempt => {
                bucket.on_first_attempt();
                bucket.try_retry(Cause::Transient)
            }
        }
    }
}

/// Arithmetic on the stack, about as long as a budget's pair: what two
/// threads sharing nothing get done.
struct SharesNothing;

impl Pair for SharesNothing {
    fn pair(&self) -> bool {
        let mut x = black_box(1u64);
        for i in 0..64 {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
        x & 1 == 0
    }
}

/// A bucket that earns one token on `earns` and pays one per retry: a
/// retry for each deposit, so a pair neither fills nor drains it.
fn one_for_one(earns: Earns) -> Box<dyn Pair> {
    let builder = TokenBucket::builder().retry_cost(1).timeout_cost(1);
    let builder = match earns {
        Earns::FirstAttempt => builder.request_deposit(1).success_refund(0),
        Earns::RetrySuccess | Earns::FirstTrySuccess => builder,
    };
    Box::new(Bucket(builder.build().unwrap(), earns))
}

/// Each budget by name, built when its bench starts: a grown capacity falls
/// back to its floor over the 10 s after it was measured.
type Make = fn() -> Box<dyn Pair>;

fn budgets() -> [(&'static str, Make); 7] {
    [
        ("tower TpsBudget", || Box::new(TpsBudget::default())),
        ("TokenBucket", || {
            Box::new(Bucket(TokenBucket::new(), Earns::RetrySuccess))
        }),
        ("TokenBucket, earning on first-try successes", || {
            one_for_one(Earns::FirstTrySuccess)
        }),
        ("TokenBucket, earning on first attempts", || {
            one_for_one(Earns::FirstAttempt)
        }),
        // The bucket a layer built with no budget option gets: at its
        // floor...
        ("TokenBucket::fleet_safe (layer default)", || {
            Box::new(Bucket(TokenBucket::fleet_safe(3), Earns::RetrySuccess))
        }),
        // ...and once the traffic it measured has grown it: a busy layer's.
        (
            "TokenBucket::fleet_safe, grown (busy layer default)",
            || {
                Box::new(Bucket(
                    grown(TokenBucket::fleet_safe(3)),
                    Earns::RetrySuccess,
                ))
            },
        ),
        ("control: shares nothing", || Box::new(SharesNothing)),
    ]
}

/// `bucket` after it measured the traffic of a busy service: first-try
/// successes for a second or more close a measurement (at a multiple of 16
/// of them), no retry needed.
fn grown(bucket: TokenBucket) -> TokenBucket {
    let floor = bucket.capacity();
    let start = Instant::now();
    while bucket.capacity() == floor {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the measurement never closed: {bucket:?}"
        );
        for _ in 0..1_000 {
            bucket.on_success(None);
        }
    }
    bucket
}

fn one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("deposit+withdraw, 1 thread");
    group.throughput(Throughput::Elements(1));
    for (name, make) in budgets() {
        let budget = make();
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(budget.pair()))
        });
    }
    // What TpsBudget pays twice a pair.
    group.bench_function(BenchmarkId::from_parameter("control: clock read"), |b| {
        b.iter(tokio::time::Instant::now)
    });
    group.finish();
}

/// Both threads run `iters` pairs on one shared budget; the time is the
/// wall time until both are done.
fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("deposit+withdraw, 2 threads");
    group.throughput(Throughput::Elements(2));
    for (name, make) in budgets() {
        let budget = make();
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let start = Barrier::new(3);
                std::thread::scope(|scope| {
                    for _ in 0..2 {
                        scope.spawn(|| {
                            start.wait();
                            for _ in 0..iters {
                                black_box(budget.pair());
                            }
                        });
                    }
                    start.wait();
                    let began = Instant::now();
                    // Leaving the scope joins both threads.
                    began
                })
                .elapsed()
            })
        });
    }
    group.finish();
}

/// The happy path alone: a first-try success into a full bucket. One that
/// grows with traffic counts it, and reads the clock at every 16th.
fn first_try_success(c: &mut Criterion) {
    let mut group = c.benchmark_group("first-try success, 1 thread");
    group.throughput(Throughput::Elements(1));
    for (name, bucket) in [
        ("TokenBucket", TokenBucket::new()),
        (
            "TokenBucket::fleet_safe (layer default)",
            TokenBucket::fleet_safe(3),
        ),
    ] {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| bucket.on_success(black_box(None)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = one_thread, two_threads, first_try_success
}
criterion_main!(benches);
