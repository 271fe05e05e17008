#!/usr/bin/env bash
# Checks that the minimum versions the manifests declare are true: resolves
# every direct dependency of every crate to the oldest version its requirement
# allows (nightly cargo's `-Z direct-minimal-versions`; indirect ones get the
# newest their dependents allow, as users get them), then checks the library
# of every crate with every feature, on the toolchain `rust-version` names.
# The libraries only: a user builds them and nothing else, and the dev-
# dependencies (criterion, plotters, tonic-health, ...) and the test and
# example code doubled the step's time for versions no user ever resolves.
#
# Works in a copy of the tree under target/minimal/, with its own target
# directory there, so the committed Cargo.lock is untouched and the main
# build's artifacts are not thrown away. Cache target/minimal to make reruns
# quick.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
mkdir -p "${CARGO_TARGET_DIR_MINIMAL:=target/minimal}"
# Absolute: the check runs from the copy of the tree.
CARGO_TARGET_DIR=$(cd "$CARGO_TARGET_DIR_MINIMAL" && pwd)
export CARGO_TARGET_DIR

# The toolchain the manifests promise: "1.95" is rustup's "1.95.0".
rust_version=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
case "$rust_version" in
    *.*.*) toolchain=$rust_version ;;
    *.*) toolchain=$rust_version.0 ;;
    *) echo "no workspace rust-version in Cargo.toml" >&2; exit 1 ;;
esac

tree="$CARGO_TARGET_DIR/tree"
rm -rf "$tree"
mkdir -p "$tree"
# tar keeps the files' times, so an unchanged crate is not rebuilt next time.
tar -c --exclude=./target --exclude=./.git . | tar -x -C "$tree"
cd "$tree"

cargo +nightly update -Z direct-minimal-versions --quiet
echo "== minimal versions: cargo +$toolchain check --workspace --all-features --lib"
cargo "+$toolchain" check --workspace --all-features --lib --quiet
