//! The timer every sleep of the crate runs on: tokio's. One place, so that a
//! caller outside a Tokio runtime learns what is missing instead of tokio's
//! "there is no reactor running".

use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// What a caller without a Tokio runtime is told.
const NO_RUNTIME: &str = "tower-backoff sleeps between retries on tokio's timer, \
    and no Tokio runtime is running: call it from inside one whose time driver \
    is enabled (`#[tokio::main]`, `#[tokio::test]`, or a runtime `Builder` with \
    `enable_time()` or `enable_all()`)";

/// A sleep of `delay` on tokio's timer.
#[track_caller]
pub(crate) fn sleep(delay: Duration) -> Sleep {
    expect_runtime();
    tokio::time::sleep(delay)
}

/// A sleep until `deadline` on tokio's timer.
#[track_caller]
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    expect_runtime();
    tokio::time::sleep_until(deadline)
}

/// Panics with [`NO_RUNTIME`] outside a Tokio runtime. Inside one whose
/// time driver is off, tokio's own panic says to call `enable_time`.
#[track_caller]
fn expect_runtime() {
    if tokio::runtime::Handle::try_current().is_err() {
        panic!("{NO_RUNTIME}");
    }
}
