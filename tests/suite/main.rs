//! The workspace's tests as one binary: one link of tokio, hyper, reqwest and
//! tonic instead of one per file (sixty-six binaries took most of the test
//! command's time and of `target/`). Each file in `tests/` stays a module of
//! its own; run one with `cargo test --all-features --test suite <file>::`.
//! The files that drive the simulator are in `tests/repo`, and the one that
//! installs a process-wide timer is a binary of its own.

// Counts allocations per thread, so the tests that count them can run beside
// the others (see `common`).
#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

#[path = "../common/mod.rs"]
mod common;
#[path = "../http_server/mod.rs"]
mod http_server;
#[path = "../reqwest_cases/mod.rs"]
mod reqwest_cases;

#[path = "../adaptive.rs"]
mod adaptive;
#[path = "../allocations.rs"]
mod allocations;
#[path = "../breaker.rs"]
mod breaker;
#[path = "../budget.rs"]
mod budget;
#[path = "../budget_fleet.rs"]
mod budget_fleet;
#[path = "../budget_refusal.rs"]
mod budget_refusal;
#[path = "../closures.rs"]
mod closures;
#[path = "../commit_at_send.rs"]
mod commit_at_send;
#[path = "../compile_errors.rs"]
mod compile_errors;
#[path = "../deadline.rs"]
mod deadline;
#[path = "../defaults.rs"]
mod defaults;
#[path = "../defaults_front_ends.rs"]
mod defaults_front_ends;
#[path = "../delays.rs"]
mod delays;
#[path = "../dependencies.rs"]
mod dependencies;
#[path = "../examples.rs"]
mod examples;
#[cfg(feature = "poll")]
#[path = "../front_ends.rs"]
mod front_ends;
#[path = "../grpc.rs"]
mod grpc;
#[path = "../grpc_hedge.rs"]
mod grpc_hedge;
#[path = "../grpc_reset.rs"]
mod grpc_reset;
#[path = "../hedge.rs"]
mod hedge;
#[path = "../hedge_seams.rs"]
mod hedge_seams;
#[path = "../host_labels.rs"]
mod host_labels;
#[path = "../http.rs"]
mod http;
#[path = "../http2.rs"]
mod http2;
#[path = "../http_body.rs"]
mod http_body;
#[path = "../http_breaker_hosts.rs"]
mod http_breaker_hosts;
#[path = "../http_hedge.rs"]
mod http_hedge;
#[path = "../http_hostile.rs"]
mod http_hostile;
#[path = "../http_per_host.rs"]
mod http_per_host;
#[path = "../http_retry_layer.rs"]
mod http_retry_layer;
#[path = "../http_signals.rs"]
mod http_signals;
#[path = "../http_unsent.rs"]
mod http_unsent;
#[path = "../hyper_client.rs"]
mod hyper_client;
#[path = "../last_attempt.rs"]
mod last_attempt;
#[path = "../layer.rs"]
mod layer;
#[path = "../matrix_cells.rs"]
mod matrix_cells;
#[path = "../metrics.rs"]
mod metrics;
#[path = "../nameable.rs"]
mod nameable;
#[path = "../observability.rs"]
mod observability;
#[path = "../on_retry.rs"]
mod on_retry;
#[cfg(feature = "poll")]
#[path = "../poll.rs"]
mod poll;
#[cfg(feature = "poll")]
#[path = "../poll_allocations.rs"]
mod poll_allocations;
#[path = "../proptest_budget.rs"]
mod proptest_budget;
#[path = "../proptest_layer.rs"]
mod proptest_layer;
#[path = "../proptest_parsers.rs"]
mod proptest_parsers;
#[path = "../proptest_schedule.rs"]
mod proptest_schedule;
#[path = "../public_api.rs"]
mod public_api;
#[path = "../readme.rs"]
mod readme;
#[path = "../replay.rs"]
mod replay;
#[path = "../reqwest.rs"]
mod reqwest;
#[path = "../reqwest_builder.rs"]
mod reqwest_builder;
#[path = "../reqwest_middleware.rs"]
mod reqwest_middleware;
#[path = "../reqwest_parity.rs"]
mod reqwest_parity;
#[path = "../retry_fn.rs"]
mod retry_fn;
#[path = "../schedule.rs"]
mod schedule;
#[path = "../shed_healthy.rs"]
mod shed_healthy;
#[path = "../shed_knee.rs"]
mod shed_knee;
#[path = "../shed_observability.rs"]
mod shed_observability;
#[path = "../shed_pair.rs"]
mod shed_pair;
#[path = "../shed_retry_after.rs"]
mod shed_retry_after;
#[path = "../shed_stream.rs"]
mod shed_stream;
#[path = "../stop_rules.rs"]
mod stop_rules;
#[path = "../tracing.rs"]
mod tracing;
