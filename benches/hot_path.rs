//! ns per request on the happy path and the retry path, every column in one run.
//!
//! `cargo bench --bench hot_path`; instruction counts, allocations and future
//! sizes come from `benches/callgrind.sh`.

mod common;

use criterion::{criterion_group, criterion_main, Criterion};

fn compare(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for scenario in common::Scenario::ALL {
        let mut group = c.benchmark_group(scenario.name());
        for &column in common::columns(scenario) {
            group.bench_function(column, |b| {
                b.iter_custom(|iters| runtime.block_on(common::run_column(scenario, column, iters)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, compare);
criterion_main!(benches);
