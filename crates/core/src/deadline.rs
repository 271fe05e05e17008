//! Deadlines: how long each attempt may take, so that a hung attempt is cut
//! short and retried, and no attempt outlives the request's own deadline.
//!
//! A layer built with [`attempt_timeout`](crate::BackoffBuilder::attempt_timeout)
//! gives every attempt at most `min(attempt timeout, time left)`, where the
//! time left runs to the request's deadline: the layer's
//! [`max_elapsed`](crate::BackoffBuilder::max_elapsed) from the first attempt,
//! or a caller's per-request [`RetryLimits::deadline`](crate::RetryLimits),
//! whichever is sooner. No attempt starts once the deadline has passed. An
//! attempt that runs out of time ends with [`Error`] whose
//! [`is_timeout`](Error::is_timeout) is true; policies see it as a failure
//! like any other (the HTTP policy calls it [`Cause::Timeout`](crate::Cause)).
//!
//! Cutting an attempt short needs an error to end it with, and the inner
//! service's own error type has none to offer (hyper's and reqwest's errors
//! cannot be made from outside), so such a layer's error is [`Error<E>`]: the
//! inner error as is, or the time-out, with the inner error as its
//! [`source`](std::error::Error::source). A layer without attempt timeouts
//! keeps the inner service's error type and pays nothing for this module.
//!
//! Composing `tower::timeout` inside the layer still works, as before: each
//! attempt then has a fixed timeout that does not shrink as the deadline
//! nears.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

/// How attempts are timed: [`NoTimeout`] or [`AttemptTimeout`]. Sealed: the
/// state machine relies on exactly these two.
pub trait AttemptTimer<E>: Clone + sealed::Sealed {
    /// The error of the layer's service.
    type Error;
    /// What an attempt races against; its output ends the attempt.
    type Timer: Future<Output = Self::Error>;

    /// The layer's error for an error of the inner service.
    fn inner(error: E) -> Self::Error;

    /// The timer of one attempt that must end by `deadline`, if there is one.
    fn timer(&self, deadline: Option<Instant>) -> Self::Timer;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NoTimeout {}
    impl Sealed for super::AttemptTimeout {}
}

/// Attempts run as long as the inner service takes: the default. The layer's
/// error is the inner service's.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTimeout;

impl<E> AttemptTimer<E> for NoTimeout {
    type Error = E;
    type Timer = std::future::Pending<E>;

    #[inline(always)]
    fn inner(error: E) -> E {
        error
    }

    #[inline(always)]
    fn timer(&self, _deadline: Option<Instant>) -> Self::Timer {
        std::future::pending()
    }
}

/// Every attempt may take at most this long, and no longer than the time left
/// before the request's deadline. Set by
/// [`BackoffBuilder::attempt_timeout`](crate::BackoffBuilder::attempt_timeout).
#[derive(Debug, Clone, Copy)]
pub struct AttemptTimeout {
    pub(crate) limit: Duration,
}

impl AttemptTimeout {
    /// The longest an attempt may take.
    pub fn limit(&self) -> Duration {
        self.limit
    }
}

impl<E> AttemptTimer<E> for AttemptTimeout {
    type Error = Error<E>;
    type Timer = Expiry<E>;

    #[inline]
    fn inner(error: E) -> Error<E> {
        Error::Inner(error)
    }

    fn timer(&self, deadline: Option<Instant>) -> Expiry<E> {
        let started = Instant::now();
        let own = started.checked_add(self.limit);
        let at = match (own, deadline) {
            (Some(own), Some(deadline)) => own.min(deadline),
            (Some(at), None) | (None, Some(at)) => at,
            // Unreachable with a validated limit; a year is as good as never.
            (None, None) => started + Duration::from_secs(365 * 24 * 60 * 60),
        };
        Expiry {
            sleep: crate::timer::sleep_until(at),
            after: at.saturating_duration_since(started),
            error: PhantomData,
        }
    }
}

pin_project! {
    /// The timer of one attempt of a layer with [`AttemptTimeout`]: resolves
    /// to the time-out error when the attempt's time is up.
    pub struct Expiry<E> {
        #[pin]
        sleep: Sleep,
        after: Duration,
        error: PhantomData<fn() -> E>,
    }
}

impl<E> Future for Expiry<E> {
    type Output = Error<E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Error<E>> {
        let this = self.project();
        std::task::ready!(this.sleep.poll(cx));
        Poll::Ready(Error::TimedOut(TimedOut { after: *this.after }))
    }
}

impl<E> fmt::Debug for Expiry<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expiry")
            .field("after", &self.after)
            .finish()
    }
}

/// The error of a layer with [`AttemptTimeout`]: the inner service's error, or
/// an attempt that ran out of time.
#[derive(Debug)]
pub enum Error<E> {
    /// The inner service failed; this is its error, untouched.
    Inner(E),
    /// The last attempt ran out of time and was dropped.
    TimedOut(TimedOut),
}

impl<E> Error<E> {
    /// Whether the last attempt ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::TimedOut(_))
    }

    /// The inner service's error, if that is what ended the request.
    pub fn get_ref(&self) -> Option<&E> {
        match self {
            Error::Inner(error) => Some(error),
            Error::TimedOut(_) => None,
        }
    }

    /// The inner service's error, if that is what ended the request.
    pub fn into_inner(self) -> Option<E> {
        match self {
            Error::Inner(error) => Some(error),
            Error::TimedOut(_) => None,
        }
    }
}

/// The inner service's error, as is: what a service in front of the layer
/// (a request converter that fails before calling it) returns for its own
/// errors of the inner type.
impl<E> From<E> for Error<E> {
    fn from(error: E) -> Self {
        Error::Inner(error)
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Inner(error) => write!(f, "attempt failed: {error}"),
            Error::TimedOut(timed_out) => timed_out.fmt(f),
        }
    }
}

impl<E: StdError + 'static> StdError for Error<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Inner(error) => Some(error),
            Error::TimedOut(timed_out) => Some(timed_out),
        }
    }
}

/// An attempt ran out of time: its attempt timeout, or the time left before
/// the request's deadline, whichever was shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut {
    after: Duration,
}

impl TimedOut {
    /// How long the attempt was given.
    pub fn after(&self) -> Duration {
        self.after
    }
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt timed out after {:?}", self.after)
    }
}

impl StdError for TimedOut {}
