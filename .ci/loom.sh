#!/usr/bin/env bash
# Model-checks the retry budgets, the circuit breaker and the hedges' load
# cap with loom: every interleaving of a few threads
# (crates/core/src/budget/loom.rs, crates/core/src/breaker/loom.rs, the loom
# module of crates/core/src/hedge/cap.rs, and gRPC's retry throttling in
# crates/grpc/src/loom.rs). About 2 CPU-minutes from cold, most of it compiling the
# dependency tree once; the checks themselves take seconds.
#
# A crate-specific cfg, because `--cfg loom` would also switch tokio into its own
# loom mode, which does not build as a dependency. Its own target directory,
# because changing RUSTFLAGS rebuilds every dependency: sharing target/ would
# throw the normal build away each time. Cache target/loom to make reruns quick.
set -euo pipefail
cd "$(dirname "$0")/.."

RUSTFLAGS="--cfg tower_backoff_loom" \
CARGO_TARGET_DIR="${CARGO_TARGET_DIR_LOOM:-target/loom}" \
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    cargo test -p tower-backoff-core -p tower-backoff-grpc --lib loom -- --test-threads=2
