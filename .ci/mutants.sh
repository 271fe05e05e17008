#!/usr/bin/env bash
# Mutation testing of the core files with cargo-mutants: every surviving
# mutant is a missing test or dead code. Slow (each mutant rebuilds the crate
# and reruns its tests), so .ci/run does not call it.
#
#   .ci/mutants.sh                                # every core file
#   .ci/mutants.sh crates/core/src/jitter.rs      # a subset
#
# Each file is mutated on its own, running only the test binaries that
# exercise it (doc tests are left out: they are examples and the slowest to
# build). Results go to target/mutants/<file>/mutants.out; the last lines
# printed per file are its caught/missed/unviable/timeout counts.
#
# It mutates the working tree in place, reusing the warm target/ instead of
# copying the tree and building every dependency again; cargo-mutants puts
# each file back after each mutant. So it insists on a clean git tree, where
# `git checkout -- crates` undoes anything an interrupted run left behind.
#
# Environment: MUTANTS_TIMEOUT (seconds per mutant's tests, default 120),
# MUTANTS_BUILD_TIMEOUT (seconds per build, default 900), MUTANTS_ARGS (extra
# arguments for cargo mutants, e.g. "--re Rng"), MUTANTS_TEST_ARGS (arguments
# for the test binaries, in the baseline too, e.g. "--skip budget::" to leave
# out tests that cannot catch the file's mutants, or tests that can fail on a
# loaded machine on their own: a failure the mutant did not cause counts it as
# caught). PROPTEST_CASES (default 256)
# trades the proptests' depth for the time a mutant takes.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if ! cargo mutants --version >/dev/null 2>&1; then
    cargo install --locked cargo-mutants
fi

if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "mutants.sh mutates files in place: commit or stash your changes first." >&2
    exit 1
fi

CORE=(
    crates/core/src/engine.rs
    crates/core/src/policy.rs
    crates/core/src/future.rs
    crates/core/src/transitions.rs
    crates/core/src/hedged.rs
    crates/core/src/send.rs
    crates/core/src/budget/
    crates/core/src/jitter.rs
    crates/core/src/schedule/
    crates/core/src/hedge/
    crates/core/src/breaker/
    crates/http/src/retry_after.rs
    crates/http/src/delay_headers.rs
    crates/http/src/policy.rs
    crates/http/src/replay.rs
    crates/grpc/src/policy.rs
)

# The tests that exercise each file: `--lib` for the crate's unit tests, then
# the modules of the integration binaries (each file of tests/ is a module of
# tests/suite or tests/repo; the words below are turned into `--test suite`,
# `--test repo` and test-name filters by `cargo_args` and `filters`).
tests_for() {
    case "$1" in
        crates/core/src/jitter.rs | crates/core/src/schedule/)
            echo "--lib schedule proptest_schedule layer proptest_layer"
            ;;
        crates/core/src/budget/ | crates/core/src/budget/*)
            # The simulation (`sim`) checks the budgets too, but costs
            # about a minute a mutant: MUTANTS_SIM=1 adds it.
            echo "--lib budget proptest_budget layer${MUTANTS_SIM:+ sim}"
            ;;
        crates/core/src/hedge/ | crates/core/src/hedge/*)
            # the cap, the latency tracker and the copies: their unit tests,
            # the hedging tests and the metrics they report.
            echo "--lib hedge metrics hedge_seams http_hedge"
            ;;
        crates/core/src/hedged.rs)
            # The hedged attempt's transitions: only a layer that hedges
            # reaches them, so the modules that build one (`.hedge(`,
            # `Hedging::`), not every test (the default case: about 110 s
            # a mutant). Not `grpc_hedge`: its calls over real sockets
            # have no time limit, so a mutant that stops or spins the hedging
            # hangs it: the mutant read as a timeout, not caught. The
            # simulation (`sim_hedge`) only with MUTANTS_SIM=1.
            echo "--lib hedge hedge_seams http_hedge metrics matrix_cells allocations http2 nameable reqwest_parity shed_pair${MUTANTS_SIM:+ sim_hedge}"
            ;;
        crates/core/src/breaker/ | crates/core/src/breaker/*)
            # The breaker and its window: their unit tests, the layer's and
            # the HTTP hosts' breaker tests, and the matrix cells it decides.
            # The simulation (`sim_breaker`) only with MUTANTS_SIM=1.
            echo "--lib breaker http_breaker_hosts host_labels matrix_cells${MUTANTS_SIM:+ sim_breaker}"
            ;;
        crates/http/src/retry_after.rs | crates/http/src/delay_headers.rs)
            echo "--lib http http_signals proptest_parsers"
            ;;
        crates/core/src/policy.rs)
            echo "--lib layer observability commit_at_send last_attempt deadline hedge"
            ;;
        crates/grpc/src/policy.rs)
            echo "--lib grpc grpc_hedge"
            ;;
        crates/http/src/policy.rs)
            echo "--lib http hyper_client reqwest http_hedge"
            ;;
        crates/http/src/replay.rs)
            echo "--lib replay http"
            ;;
        *)
            # The engine, the future and anything else: every test, the
            # simulations only with MUTANTS_SIM=1. In a debug build they
            # take about 110 s of the suite's 130, past a mutant's timeout:
            # a mutant the earlier tests missed showed as a timeout, not
            # as missed, and hid a missing test.
            echo "--lib all${MUTANTS_SIM:+ sim sim_breaker sim_hedge sim_pacing sim_shed grpc_storm}"
            ;;
    esac
}

# The binaries to build for those words: `--lib`, `--test suite`, `--test repo`.
cargo_args() {
    local suite="" repo=""
    for word in $(tests_for "$1"); do
        case "$word" in
            --lib) echo "--lib" ;;
            sim* | grpc_storm) repo=1 ;;
            *) suite=1 ;;
        esac
    done
    [ -z "$suite" ] || echo "--test suite"
    [ -z "$repo" ] || echo "--test repo"
}

# The test-name filters for those words, ORed by libtest: each module of the
# binaries, plus the mutated file's own module for the crate's unit tests
# (`budget::`, `engine::`). None for `all`: every test runs.
filters() {
    local words
    words=$(tests_for "$1")
    case " $words " in *" all "*) return ;; esac
    for word in $words; do
        [ "$word" = --lib ] || echo "$word::"
    done
    local module=${1#crates/*/src/}
    module=${module%/}
    module=${module%.rs}
    echo "${module//\//::}::"
}

files=("$@")
[ ${#files[@]} -gt 0 ] || files=("${CORE[@]}")

for file in "${files[@]}"; do
    # A directory is every .rs file under it.
    glob="$file"
    [ -d "$file" ] && glob="${file%/}/**/*.rs"
    out="target/mutants/$(echo "${file%/}" | tr / _)"
    mkdir -p "$out"
    # As --cargo-arg, not after `--`: so the build step (`cargo test --no-run`)
    # builds only these test binaries too, not every one.
    targets=()
    for arg in $(cargo_args "$file"); do targets+=("--cargo-arg=$arg"); done
    mapfile -t names < <(filters "$file")
    echo "== cargo mutants: $file (${targets[*]})"
    # shellcheck disable=SC2086  # MUTANTS_ARGS is split into arguments on purpose
    # After cargo-mutants' `--` come cargo test's arguments; after the second,
    # the test binaries'. A test binary's argument given to cargo test fails
    # every run, and every mutant reads as caught.
    # The integration tests live in the root package, the unit tests beside
    # the code: test the file's crate and the root package (not the whole
    # workspace: with --workspace, `--lib` would rebuild and rerun the unit
    # tests of every crate that links the mutated one, for every mutant).
    # cargo-mutants mutates only the package named: the crate the file is in.
    crate=${file#crates/}
    package="tower-backoff-${crate%%/*}"
    # cargo-mutants skips its own baseline (it would build in a copy): a test
    # that already fails would count every mutant as caught, so check first.
    # shellcheck disable=SC2046  # the test options are split on purpose
    if ! cargo test --all-features --package "$package" --package tower-backoff \
        $(cargo_args "$file") -- "${names[@]}" ${MUTANTS_TEST_ARGS:-} >"$out/baseline.log" 2>&1; then
        echo "the tests of $file fail before any mutation: see $out/baseline.log" >&2
        exit 1
    fi
    # Not mutated: files compiled only under `--cfg tower_backoff_loom`
    # (loom.rs: model checks, run by .ci/loom.sh, never by these tests: every
    # mutant there would survive), and the test modules behind
    # `#[cfg(all(test, not(tower_backoff_loom)))]`, which cargo-mutants does
    # not recognise as tests the way it does a plain `#[cfg(test)]`.
    cargo mutants --all-features --in-place --baseline skip \
        --package "$package" --test-package "$package" --test-package tower-backoff \
        --timeout "${MUTANTS_TIMEOUT:-120}" --build-timeout "${MUTANTS_BUILD_TIMEOUT:-900}" \
        --file "$glob" --exclude '**/loom.rs' --exclude-re '\btests::' \
        --output "$out" "${targets[@]}" ${MUTANTS_ARGS:-} -- -- "${names[@]}" ${MUTANTS_TEST_ARGS:-} ||
        true # a missed mutant is a finding to report, not a script failure
    for outcome in caught missed unviable timeout; do
        printf '%-9s %s\n' "$outcome" "$(wc -l <"$out/mutants.out/$outcome.txt" 2>/dev/null || echo 0)"
    done
    if [ -s "$out/mutants.out/missed.txt" ]; then
        echo "-- missed:"
        cat "$out/mutants.out/missed.txt"
    fi
done
