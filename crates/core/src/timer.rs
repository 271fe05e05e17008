//! The timer every sleep of the crate runs on: tokio's, unless the program
//! installed a [`Timer`] of its own with [`set_timer`].
//!
//! One place, so that a caller outside a Tokio runtime learns what is
//! missing instead of tokio's "there is no reactor running", and so that
//! another executor needs one small trait, not a fork.
//!
//! Only sleeping needs a runtime: the crate reads the time with
//! `tokio::time::Instant::now`, which is `std::time::Instant::now` outside
//! a Tokio runtime whose clock is paused, so a timer needs no clock of its
//! own.
//!
//! ```
//! # extern crate tower_backoff_core as tower_backoff;
//! use std::future::Future;
//! use std::pin::Pin;
//! use std::time::Duration;
//! use tower_backoff::timer::{self, Timer};
//!
//! /// Sleeps on a thread of its own: a timer for any executor (a real one
//! /// would share one thread for every sleep).
//! struct ThreadTimer;
//!
//! impl Timer for ThreadTimer {
//!     fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
//!         // tokio's channels work on any executor.
//!         let (done, wait) = tokio::sync::oneshot::channel::<()>();
//!         std::thread::spawn(move || {
//!             std::thread::sleep(duration);
//!             let _ = done.send(());
//!         });
//!         Box::pin(async move {
//!             let _ = wait.await;
//!         })
//!     }
//! }
//!
//! // Once, at the start of the program: every layer sleeps on it.
//! timer::set_timer(ThreadTimer).expect("no timer installed yet");
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

/// Sleeps for the crate on an executor other than tokio: install one with
/// [`set_timer`].
pub trait Timer: Send + Sync + 'static {
    /// A future that completes once `duration` has passed. It may complete
    /// late, never early: a retry must not go out before its delay (or a
    /// server's `Retry-After`) is over.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>>;
}

/// The timer installed for the program, if any.
static INSTALLED: OnceLock<Box<dyn Timer>> = OnceLock::new();

/// Installs `timer` for every sleep of every layer of the program, in place
/// of tokio's: retries' delays, attempt timeouts, deadlines while waiting
/// for readiness, pacing and hedges. Once: a second call returns
/// [`TimerAlreadySet`] and changes nothing.
pub fn set_timer(timer: impl Timer) -> Result<(), TimerAlreadySet> {
    INSTALLED.set(Box::new(timer)).map_err(|_| TimerAlreadySet)
}

/// [`set_timer`] was called before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerAlreadySet;

impl fmt::Display for TimerAlreadySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a timer is installed already: set_timer works once per program")
    }
}

impl std::error::Error for TimerAlreadySet {}

/// What a caller without a Tokio runtime and without a timer of its own is
/// told.
const NO_RUNTIME: &str = "tower-backoff sleeps between retries on tokio's timer, \
    and no Tokio runtime is running: call it from inside one whose time driver \
    is enabled (`#[tokio::main]`, `#[tokio::test]`, or a runtime `Builder` with \
    `enable_time()` or `enable_all()`), or install a timer for another \
    executor with `tower_backoff::timer::set_timer`";

pin_project! {
    /// One sleep of the crate: tokio's, or the installed timer's.
    #[project = SleepProj]
    pub(crate) enum Sleep {
        Tokio { #[pin] sleep: tokio::time::Sleep },
        Installed { sleep: Pin<Box<dyn Future<Output = ()> + Send + Sync>> },
    }
}

impl Sleep {
    /// The same sleep, now ending at `deadline`.
    pub(crate) fn reset(self: Pin<&mut Self>, deadline: Instant) {
        match self.project() {
            SleepProj::Tokio { sleep } => sleep.reset(deadline),
            SleepProj::Installed { sleep } => *sleep = installed(deadline),
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project() {
            SleepProj::Tokio { sleep } => sleep.poll(cx),
            SleepProj::Installed { sleep } => sleep.as_mut().poll(cx),
        }
    }
}

/// A sleep of `delay`.
#[track_caller]
pub(crate) fn sleep(delay: Duration) -> Sleep {
    match INSTALLED.get() {
        None => {
            expect_runtime();
            Sleep::Tokio {
                sleep: tokio::time::sleep(delay),
            }
        }
        Some(timer) => Sleep::Installed {
            sleep: timer.sleep(delay),
        },
    }
}

/// A sleep until `deadline`.
#[track_caller]
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    match INSTALLED.get() {
        None => {
            expect_runtime();
            Sleep::Tokio {
                sleep: tokio::time::sleep_until(deadline),
            }
        }
        Some(_) => Sleep::Installed {
            sleep: installed(deadline),
        },
    }
}

/// The installed timer's sleep until `deadline`.
fn installed(deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
    let timer = INSTALLED.get().expect("a sleep on the installed timer");
    timer.sleep(deadline.saturating_duration_since(Instant::now()))
}

/// Panics with [`NO_RUNTIME`] outside a Tokio runtime. Inside one whose
/// time driver is off, tokio's own panic says to call `enable_time`.
#[track_caller]
fn expect_runtime() {
    if tokio::runtime::Handle::try_current().is_err() {
        panic!("{NO_RUNTIME}");
    }
}
