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

/// How attempts are timed: [`NoTimeout`], [`WithBreaker`] or
/// [`AttemptTimeout`], each alone or [`Hedged`]. Sealed: the state machine
/// relies on exactly these.
pub trait AttemptTimer<E>: Clone + sealed::Sealed {
    /// The error of the layer's service.
    type Error;
    /// What an attempt races against; its output ends the attempt.
    type Timer: Future<Output = Self::Error>;
    /// Where a response future keeps `X`, the state of a request whose first
    /// attempt started hedging at its first poll: room for a pointer in a
    /// [`Hedged`] layer's future, none in the others'.
    type Hedging<X>: HedgeSlot<X>;

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

/// The attempt timing a layer gets when it is given a
/// [circuit breaker](crate::BackoffBuilder::circuit_breaker): the same, with
/// an error that can say the breaker rejected a request.
pub trait WithRejection: sealed::Sealed {
    /// [`NoTimeout`] becomes [`WithBreaker`]; the others stay.
    type Rejecting;

    /// The timing, with an error that can say a breaker rejected a request.
    fn rejecting(self) -> Self::Rejecting;
}

impl WithRejection for NoTimeout {
    type Rejecting = WithBreaker;
    fn rejecting(self) -> WithBreaker {
        WithBreaker
    }
}

impl WithRejection for WithBreaker {
    type Rejecting = WithBreaker;
    fn rejecting(self) -> WithBreaker {
        self
    }
}

impl WithRejection for AttemptTimeout {
    type Rejecting = AttemptTimeout;
    fn rejecting(self) -> AttemptTimeout {
        self
    }
}

/// The attempt timing a layer gets when it is given
/// [hedging](crate::BackoffBuilder::hedge): the same, in [`Hedged`].
pub trait WithHedging: sealed::Sealed {
    /// `T` becomes `Hedged<T>`; a `Hedged` one stays.
    type Hedging;

    /// The timing, with room to hedge.
    fn hedging(self) -> Self::Hedging;
}

impl<T: sealed::Base> WithHedging for T {
    type Hedging = Hedged<T>;
    fn hedging(self) -> Hedged<T> {
        Hedged(self)
    }
}

impl<T> WithHedging for Hedged<T> {
    type Hedging = Hedged<T>;
    fn hedging(self) -> Hedged<T> {
        self
    }
}

impl<T: WithRejection> WithRejection for Hedged<T> {
    type Rejecting = Hedged<T::Rejecting>;
    fn rejecting(self) -> Hedged<T::Rejecting> {
        Hedged(self.0.rejecting())
    }
}

/// The attempt timing a layer gets when it is given an
/// [attempt timeout](crate::BackoffBuilder::attempt_timeout).
pub trait WithTimeout: sealed::Sealed {
    /// [`AttemptTimeout`], or `Hedged<AttemptTimeout>` for a `Hedged` one.
    type Timed;

    /// The timing, with every attempt given at most `limit`.
    fn timed(self, limit: Duration) -> Self::Timed;
}

impl<T: sealed::Base> WithTimeout for T {
    type Timed = AttemptTimeout;
    fn timed(self, limit: Duration) -> AttemptTimeout {
        AttemptTimeout { limit }
    }
}

impl<T: WithTimeout> WithTimeout for Hedged<T> {
    type Timed = Hedged<T::Timed>;
    fn timed(self, limit: Duration) -> Hedged<T::Timed> {
        Hedged(self.0.timed(limit))
    }
}

/// The attempt timing of a layer given
/// [hedging](crate::BackoffBuilder::hedge): `T`'s, and each response future
/// has room for a pointer (8 bytes more), so that a first attempt starts
/// hedging only once it is found pending at its first poll. An attempt that
/// answers at once then costs the hedging nothing; one that is pending
/// allocates its hedging state then, and stays where it is pinned.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hedged<T = NoTimeout>(T);

impl<E, T: AttemptTimer<E>> AttemptTimer<E> for Hedged<T> {
    type Error = T::Error;
    type Timer = T::Timer;
    type Hedging<X> = Option<Pin<Box<X>>>;

    #[inline(always)]
    fn inner(error: E) -> T::Error {
        T::inner(error)
    }

    #[inline(always)]
    fn timer(&self, deadline: Option<Instant>) -> T::Timer {
        self.0.timer(deadline)
    }

    const REJECTS: bool = T::REJECTS;

    #[inline(always)]
    fn rejected(open: BreakerOpen) -> Option<T::Error> {
        T::rejected(open)
    }
}

/// Where a response future keeps the state of a request hedged from its
/// first attempt's first poll: [`AttemptTimer::Hedging`]. Sealed; used by
/// the response future only.
pub trait HedgeSlot<X>: sealed::Slot + Default {
    /// Whether the slot has room for a state: a constant, so that a layer
    /// whose futures have none compiles hedging from the first poll out.
    fn has_room(&self) -> bool;
    /// The state kept, if any.
    fn get(&self) -> Option<&X>;
    /// The state kept, if any, pinned.
    fn get_mut(&mut self) -> Option<Pin<&mut X>>;
    /// Keeps `state`: only a slot with room for it is ever given one.
    fn put(&mut self, state: Pin<Box<X>>);
    /// Gives the state kept up, if any.
    fn take(&mut self) -> Option<Pin<Box<X>>>;
}

/// The slot of a layer that does not hedge from the first poll: empty, and
/// no bytes.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSlot;

impl<X> HedgeSlot<X> for NoSlot {
    #[inline(always)]
    fn has_room(&self) -> bool {
        false
    }

    #[inline(always)]
    fn get(&self) -> Option<&X> {
        None
    }

    #[inline(always)]
    fn get_mut(&mut self) -> Option<Pin<&mut X>> {
        None
    }

    fn put(&mut self, _: Pin<Box<X>>) {
        unreachable!("only a hedged layer's future hedges from the first poll")
    }

    #[inline(always)]
    fn take(&mut self) -> Option<Pin<Box<X>>> {
        None
    }
}

impl<X> HedgeSlot<X> for Option<Pin<Box<X>>> {
    #[inline(always)]
    fn has_room(&self) -> bool {
        true
    }

    #[inline(always)]
    fn get(&self) -> Option<&X> {
        self.as_deref()
    }

    #[inline(always)]
    fn get_mut(&mut self) -> Option<Pin<&mut X>> {
        self.as_mut().map(Pin::as_mut)
    }

    fn put(&mut self, state: Pin<Box<X>>) {
        *self = Some(state);
    }

    #[inline(always)]
    fn take(&mut self) -> Option<Pin<Box<X>>> {
        Option::take(self)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NoTimeout {}
    impl Sealed for super::AttemptTimeout {}
    impl Sealed for super::WithBreaker {}
    impl<T> Sealed for super::Hedged<T> {}

    /// The timings [`Hedged`](super::Hedged) wraps: what `.hedge(..)` and
    /// `.attempt_timeout(..)` map the same way.
    pub trait Base: Sealed {}
    impl Base for super::NoTimeout {}
    impl Base for super::AttemptTimeout {}
    impl Base for super::WithBreaker {}

    pub trait Slot {}
    impl Slot for super::NoSlot {}
    impl<X> Slot for Option<std::pin::Pin<Box<X>>> {}
}

/// Attempts run as long as the inner service takes: the default. The layer's
/// error is the inner service's.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTimeout;

impl<E> AttemptTimer<E> for NoTimeout {
    type Error = E;
    type Timer = std::future::Pending<E>;
    type Hedging<X> = NoSlot;

    #[inline(always)]
    fn inner(error: E) -> E {
        error
    }

    #[inline(always)]
    fn timer(&self, _deadline: Option<Instant>) -> Self::Timer {
        std::future::pending()
    }

    const REJECTS: bool = false;

    #[inline(always)]
    fn rejected(_: BreakerOpen) -> Option<E> {
        None
    }
}

/// Attempts run as long as the inner service takes, as with [`NoTimeout`],
/// but the layer's error is [`Error`], so that a request a
/// [circuit breaker](crate::breaker) rejected can say so. What a layer with a
/// breaker and no attempt timeout has.
#[derive(Debug, Clone, Copy, Default)]
pub struct WithBreaker;

impl<E> AttemptTimer<E> for WithBreaker {
    type Error = Error<E>;
    type Timer = std::future::Pending<Error<E>>;
    type Hedging<X> = NoSlot;

    #[inline(always)]
    fn inner(error: E) -> Error<E> {
        Error::Inner(error)
    }

    #[inline(always)]
    fn timer(&self, _deadline: Option<Instant>) -> Self::Timer {
        std::future::pending()
    }

    const REJECTS: bool = true;

    fn rejected(open: BreakerOpen) -> Option<Error<E>> {
        Some(Error::Open(open))
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
    type Hedging<X> = NoSlot;

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

    const REJECTS: bool = true;

    fn rejected(open: BreakerOpen) -> Option<Error<E>> {
        Some(Error::Open(open))
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
        Poll::Ready(Error::TimedOut(TimedOut::new(*this.after)))
    }
}

impl<E> fmt::Debug for Expiry<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expiry")
            .field("after", &self.after)
            .finish()
    }
}
