//! Cost of one deposit plus one withdrawal, from one thread and from two
//! threads sharing the budget, for our budgets (and the token bucket a layer
//! builds by default) and tower's `TpsBudget`, in the same run. Controls say
//! what the machine gives: a clock read alone (tokio's), and work that shares
//! no memory, on one thread and on two (on two free cores it takes as long on
//! both).
//!
//! `cargo bench --bench budget -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tower::retry::budget::{Budget as _, TpsBudget};
use tower_backoff::budget::{Budget, RatioBudget, TokenBucket};
use tower_backoff::Cause;

/// One deposit and one withdrawal, as each budget defines them: a first
/// attempt and a retry for the ratio budgets, a retry and the success that
/// refunds it for the token bucket (so it neither fills nor drains).
trait Pair: Sync {
    fn pair(&self) -> bool;
}

impl Pair for TpsBudget {
    fn pair(&self) -> bool {
        self.deposit();
        self.withdraw()
    }
}

impl Pair for RatioBudget {
    fn pair(&self) -> bool {
        self.on_first_attempt();
        self.try_retry(Cause::Transient)
    }
}

impl Pair for TokenBucket {
    fn pair(&self) -> bool {
        let granted = self.try_retry(Cause::Transient);
        self.on_success(Some(Cause::Transient));
        granted
    }
}

/// Arithmetic on the stack, about as long as a ratio budget's pair: what two
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

/// The same configuration for both ratio budgets: 20% over 10 s, 10/s floor.
fn budgets() -> Vec<(&'static str, Box<dyn Pair>)> {
    vec![
        ("tower TpsBudget", Box::new(TpsBudget::default())),
        ("RatioBudget", Box::new(RatioBudget::new())),
        ("TokenBucket", Box::new(TokenBucket::new())),
        // The bucket a layer built with no budget option gets: at its
        // floor...
        (
            "TokenBucket::fleet_safe (layer default)",
            Box::new(TokenBucket::fleet_safe(3)),
        ),
        // ...and once the traffic it measured has grown it: a busy layer's.
        (
            "TokenBucket::fleet_safe, grown (busy layer default)",
            Box::new(grown(TokenBucket::fleet_safe(3))),
        ),
        ("control: shares nothing", Box::new(SharesNothing)),
    ]
}

/// `bucket` after it measured the traffic of a busy service: a retry opens
/// the measurement, and first-try successes for a second or more close it.
fn grown(bucket: TokenBucket) -> TokenBucket {
    let floor = bucket.capacity();
    assert!(bucket.try_retry(Cause::Transient));
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
    for (name, budget) in budgets() {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(budget.pair()))
        });
    }
    // What TpsBudget and RatioBudget each pay twice a pair.
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
    for (name, budget) in budgets() {
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

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = one_thread, two_threads
}
criterion_main!(benches);
