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
//! service's error type has none to offer (hyper's and reqwest's errors
//! cannot be made from outside), so such a layer's error is [`Error<E>`]: the
//! inner error as is, or the time-out. A layer without attempt timeouts
//! keeps the inner service's error type and pays nothing for this module.
//! `tower::timeout` inside the layer still works, with a fixed timeout that
//! does not shrink as the deadline nears.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::timer::Sleep;

use crate::error::{BreakerOpen, Error, TimedOut};

/// How a layer times its attempts and what its error is: [`NoTimeout`]
/// (the inner service's error, attempts as long as they take) or
/// [`Guarded`] (the layer's [`Error`], with an attempt timeout and a circuit
/// breaker if set). Sealed: the state machine relies on exactly these two.
pub trait AttemptTimer<E>: Clone + sealed::Sealed {
    /// The error of the layer's service.
    type Error;
    /// What an attempt races against; its output ends the attempt.
    type Timer: Future<Output = Self::Error>;

    /// The layer's error for an error of the inner service.
    fn inner(error: E) -> Self::Error;

    /// The timer of one attempt that must end by `deadline`, if there is one.
    fn timer(&self, deadline: Option<Instant>) -> Self::Timer;

    /// Whether the layer's error can say that a circuit breaker rejected a
    /// request: only then can the layer have a breaker, and only then is it
    /// asked. A constant, so a layer without one compiles the check out.
    const REJECTS: bool;

    /// The layer's error for a request an open breaker rejected; `None` for
    /// [`NoTimeout`], whose error is the inner service's.
    fn rejected(open: BreakerOpen) -> Option<Self::Error>;
}

/// What a builder's timing becomes once an option needs the layer's own
/// error (an attempt timeout, a circuit breaker): [`Guarded`], whichever it
/// was.
pub trait IntoGuarded: sealed::Sealed {
    /// The timing as [`Guarded`], with what it had set.
    fn guarded(self) -> Guarded;
}

impl IntoGuarded for NoTimeout {
    fn guarded(self) -> Guarded {
        Guarded { limit: None }
    }
}

impl IntoGuarded for Guarded {
    fn guarded(self) -> Guarded {
        self
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NoTimeout {}
    impl Sealed for super::Guarded {}
}

/// Attempts run as long as the inner service takes: the default. The layer's
/// error is the inner service's.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTimeout;

impl<E> AttemptTimer<E> for NoTimeout {
    type Error = E;
    type Timer = std::future::Pending<E>;

    fn inner(error: E) -> E {
        error
    }

    fn timer(&self, _deadline: Option<Instant>) -> Self::Timer {
        std::future::pending()
    }

    const REJECTS: bool = false;

    fn rejected(_: BreakerOpen) -> Option<E> {
        None
    }
}

/// The timing of a layer whose error is [`Error`]: what an
/// [attempt timeout](crate::BackoffBuilder::attempt_timeout) or a
/// [circuit breaker](crate::BackoffBuilder::circuit_breaker) makes of a
/// layer, and what every HTTP layer has. With an attempt timeout, an attempt
/// takes at most that long, and no longer than the time left before the
/// request's deadline. One type whatever else is set, so that the service's
/// type stays the same as options are added.
#[derive(Debug, Clone, Copy, Default)]
pub struct Guarded {
    pub(crate) limit: Option<Duration>,
}

impl Guarded {
    /// The same, with every attempt given at most `limit`.
    pub(crate) fn timed(limit: Duration) -> Self {
        Self { limit: Some(limit) }
    }
}

impl<E> AttemptTimer<E> for Guarded {
    type Error = Error<E>;
    type Timer = Expiry<E>;

    fn inner(error: E) -> Error<E> {
        Error::Inner(error)
    }

    fn timer(&self, deadline: Option<Instant>) -> Expiry<E> {
        Expiry {
            timer: self.limit.map(|limit| Timer::armed(limit, deadline)),
            error: PhantomData,
        }
    }

    const REJECTS: bool = true;

    fn rejected(open: BreakerOpen) -> Option<Error<E>> {
        Some(Error::Open(open))
    }
}

/// The timer of one attempt of a [`Guarded`] layer: resolves to the
/// time-out error when the attempt's time is up; never without an attempt
/// timeout. Boxed, so that a guarded layer without one (every HTTP layer by
/// default) keeps a future one pointer larger, not a timer larger.
pub struct Expiry<E> {
    timer: Option<Pin<Box<Timer>>>,
    error: PhantomData<fn() -> E>,
}

pin_project! {
    struct Timer {
        #[pin]
        sleep: Sleep,
        after: Duration,
    }
}

impl Timer {
    /// The boxed timer of an attempt given `limit`, ending at `deadline` if
    /// that comes first. Out of the generic `timer`, so that a guarded
    /// layer without an attempt timeout builds an empty `Expiry` in place.
    fn armed(limit: Duration, deadline: Option<Instant>) -> Pin<Box<Self>> {
        let started = Instant::now();
        let own = started.checked_add(limit);
        let at = match (own, deadline) {
            (Some(own), Some(deadline)) => own.min(deadline),
            (Some(at), None) | (None, Some(at)) => at,
            // Unreachable with a validated limit; a year is as good as never.
            (None, None) => started + Duration::from_secs(365 * 24 * 60 * 60),
        };
        Box::pin(Timer {
            sleep: crate::timer::sleep_until(at),
            after: at.saturating_duration_since(started),
        })
    }
}

impl<E> Future for Expiry<E> {
    type Output = Error<E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Error<E>> {
        let Some(timer) = self.timer.as_mut() else {
            return Poll::Pending;
        };
        let timer = timer.as_mut().project();
        std::task::ready!(timer.sleep.poll(cx));
        Poll::Ready(Error::TimedOut(TimedOut::new(*timer.after)))
    }
}

impl<E> fmt::Debug for Expiry<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expiry")
            .field("after", &self.timer.as_ref().map(|t| t.after))
            .finish()
    }
}
