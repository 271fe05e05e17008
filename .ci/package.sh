#!/usr/bin/env bash
# Tests what crates.io and docs.rs will see: packages every published crate of
# the workspace, unpacks each tarball and runs its tests there, against the
# other unpacked tarballs rather than the repository. A file a test needs but
# the package leaves out, or a doc test naming a crate that is only a
# dev-dependency by path (cargo strips those on publish), fails here.
#
# The tarballs are unpacked side by side under target/package-check/ in a
# generated workspace whose [patch.crates-io] points the tower-backoff-* names
# at them, with the repository's Cargo.lock, so every dependency resolves to
# the version the main build uses. The builds share target/ with the main
# build (same profile settings as .ci/run): only our five crates compile again.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
mkdir -p "${CARGO_TARGET_DIR:=$root/target}"
# Absolute: the tests run from the unpacked crates' directory.
CARGO_TARGET_DIR=$(cd "$CARGO_TARGET_DIR" && pwd)
export CARGO_TARGET_DIR

# The published crates: every member but the simulator (publish = false).
crates=(tower-backoff-core tower-backoff-http tower-backoff-grpc tower-backoff-poll tower-backoff-shed tower-backoff)

packages="$CARGO_TARGET_DIR/package"
work="$root/target/package-check"
rm -rf "$work" "$packages"/tower-backoff*.crate
mkdir -p "$work"

# --allow-dirty: the check is of the working tree, committed or not.
# --no-verify: cargo's own verification only builds; the tests below build too.
args=()
for crate in "${crates[@]}"; do args+=(-p "$crate"); done
cargo package "${args[@]}" --no-verify --allow-dirty --quiet

members=()
patches=()
for tarball in "$packages"/tower-backoff*.crate; do
    tar -xzf "$tarball" -C "$work"
    dir=$(basename "$tarball" .crate)
    name=${dir%-*}
    members+=("\"$dir\"")
    # Nothing depends on the facade: patching it would only warn.
    [ "$name" = tower-backoff ] || patches+=("$name = { path = \"$dir\" }")
done
[ "${#members[@]}" -eq "${#crates[@]}" ] ||
    { echo "expected ${#crates[@]} tarballs, found ${#members[@]}" >&2; exit 1; }

{
    echo '[workspace]'
    echo 'resolver = "2"'
    echo "members = [$(IFS=,; echo "${members[*]}")]"
    echo
    echo '[patch.crates-io]'
    printf '%s\n' "${patches[@]}"
} >"$work/Cargo.toml"
cp Cargo.lock "$work/Cargo.lock"

cd "$work"
for crate in "${crates[@]}"; do
    if [ "$crate" != tower-backoff ]; then
        echo "== packaged $crate: cargo test --all-features"
        cargo test -p "$crate" --all-features --quiet
        continue
    fi
    # The facade's integration tests are the repository's, already run by
    # the test command: from the tarball, what can differ is what the
    # package holds. So every test target is built (a file a test includes
    # but the package leaves out fails to compile), the doc tests run (a
    # snippet naming a path dev-dependency fails), and of the suite, the
    # modules that read the package's files or run cargo at run time.
    echo "== packaged $crate: every test built, the doc tests and the suite's file readers run"
    cargo test -p "$crate" --all-features --no-run --quiet
    cargo test -p "$crate" --all-features --doc --quiet
    readers=()
    for file in tower-backoff-[0-9]*/tests/*.rs; do
        grep -q -E 'CARGO_MANIFEST_DIR|Command::new|read_to_string' "$file" &&
            readers+=("$(basename "$file" .rs)::")
    done
    echo "   ${readers[*]}"
    cargo test -p "$crate" --all-features --quiet --test suite -- "${readers[@]}"
done
