//! [`Event`]: what happened to a request, as the retry engine saw it, told to
//! every [`Observer`] of the layer: its [`Stats`](crate::Stats), `tracing`
//! (feature `tracing`), and any of your own
//! ([`BackoffBuilder::observer`](crate::BackoffBuilder::observer)).
//!
//! Events are plain values with argument structs read through accessors, so
//! that a field can be added without breaking an observer. They carry what
//! the engine knows (attempt numbers, delays, causes, how a request ended and
//! whether its outcome was a response or an error), never the request or the
//! outcome itself, so an observer's type does not depend on the service's
//! and adding one changes no type.
//!
//! Where an event happened (a per-host copy's host, the layer's name) is
//! told beside it as its [`Origin`], not in it: the event stays a `Copy`
//! value.
//!
//! A retry is told when it goes out, never when it is decided: a retry that
//! is stopped in between (the future is dropped, the budget refuses, the time
//! limit passes) is no [`Event::Retry`].

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Cause;

pub use crate::breaker::BreakerState;
pub use crate::engine::Ending;

/// Something that happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A request was called: its first attempt goes out.
    Called,
    /// A retry goes out: committed, and paid for by the budget.
    Retry(RetryArgs),
    /// The sleep before a retry is over (whether the retry then goes out or
    /// not).
    Slept(Duration),
    /// The request ended, returning its last real outcome.
    Ended(EndArgs),
    /// The layer's [circuit breaker](crate::breaker) moved to this state: an
    /// attempt's outcome opened or closed it, or an attempt went out as the
    /// probe of a breaker whose break was over.
    Breaker(BreakerState),
    /// The open breaker did not let an attempt go out. Attempt 1 is a
    /// request rejected outright: it ends with
    /// [`Error::Open`](crate::Error::Open), no [`Event::Called`] and no
    /// [`Event::Ended`], since nothing was sent. A later one is a retry
    /// stopped: its request ends with [`Ending::BreakerOpen`] and the outcome
    /// before.
    Rejected(RejectArgs),
    /// A hedge of an attempt still pending went out, won, or was cancelled
    /// because another copy won (see [`hedge`](crate::hedge)).
    Hedge(HedgeArgs),
}

/// What happened to a hedge: [`Event::Hedge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HedgeEvent {
    /// A hedge went out, paid like a retry.
    Sent,
    /// A hedge's outcome won: the request ends with it.
    Won,
    /// A copy, the first one or a hedge, was dropped because another copy's
    /// outcome won.
    Cancelled,
}

/// A hedge or copy of an attempt: [`Event::Hedge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeArgs {
    pub(crate) attempt: u32,
    pub(crate) event: HedgeEvent,
}

impl HedgeArgs {
    /// The number of the copy among all the request's attempts, from 1: a
    /// hedge of the first attempt is attempt 2.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether it went out, won or was cancelled.
    pub fn event(&self) -> HedgeEvent {
        self.event
    }
}

/// An attempt the open breaker did not let out: [`Event::Rejected`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectArgs {
    pub(crate) attempt: u32,
}

impl RejectArgs {
    pub(crate) fn first() -> Self {
        Self { attempt: 1 }
    }

    /// The number the attempt would have had, from 1: 1 for a request
    /// rejected outright, more for a retry stopped.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// Whether an attempt's outcome was a response or an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutcomeKind {
    /// The inner service answered (the policy may still have called the
    /// answer a failure, a 503 say).
    Response,
    /// The inner service failed, or the attempt ran out of time.
    Error,
}

impl OutcomeKind {
    /// The kind of `outcome`.
    pub fn of<T, E>(outcome: &Result<T, E>) -> Self {
        match outcome {
            Ok(_) => OutcomeKind::Response,
            Err(_) => OutcomeKind::Error,
        }
    }
}

/// A retry going out: [`Event::Retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryArgs {
    pub(crate) attempt: u32,
    pub(crate) delay: Duration,
    pub(crate) cause: Cause,
    pub(crate) transparent: bool,
    pub(crate) replaced: OutcomeKind,
}

impl RetryArgs {
    /// A retry after attempt number `attempt` failed for `cause`, slept
    /// `delay`, replacing an outcome of kind `replaced`: what a front-end
    /// of its own, or a test of a policy's `prepare_retry`, hands on.
    pub fn new(attempt: u32, delay: Duration, cause: Cause, replaced: OutcomeKind) -> Self {
        Self {
            attempt,
            delay,
            cause,
            transparent: false,
            replaced,
        }
    }

    /// The number of the attempt that failed, from 1: the retry going out is
    /// attempt `attempt() + 1`.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How long the request slept before this retry.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Why the attempt before failed, as the policy said.
    pub fn cause(&self) -> Cause {
        self.cause
    }

    /// Whether this is the one free retry of a request that never left
    /// ([`Cause::NotSent`]): no delay, no attempt counted, no budget spent.
    pub fn is_transparent(&self) -> bool {
        self.transparent
    }

    /// Whether the outcome this retry replaces was a response or an error.
    pub fn replaced(&self) -> OutcomeKind {
        self.replaced
    }
}

/// The outcome a retry replaces, as an
/// [`on_retry`](crate::BackoffBuilder::on_retry) hook sees it: a reference
/// to the response or the error of the attempt before, read as the
/// service's own types. The hook's type does not depend on the service's,
/// so the same closure works on every front-end; it names the type it
/// expects where it reads the outcome.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use tower_backoff::events::Outcome;
///
/// let failed: Result<u16, std::io::Error> = Err(std::io::ErrorKind::TimedOut.into());
/// let outcome = Outcome::of(&failed);
/// assert!(outcome.is_error());
/// assert_eq!(outcome.error::<std::io::Error>().map(|e| e.kind()), Some(std::io::ErrorKind::TimedOut));
/// assert_eq!(outcome.response::<u16>(), None);
/// ```
#[derive(Clone, Copy)]
pub struct Outcome<'a> {
    outcome: Result<&'a dyn Any, &'a dyn Any>,
}

impl<'a> Outcome<'a> {
    /// A view of `outcome`.
    pub fn of<R: 'static, E: 'static>(outcome: &'a Result<R, E>) -> Self {
        Self {
            outcome: match outcome {
                Ok(response) => Ok(response),
                Err(error) => Err(error),
            },
        }
    }

    /// Whether the attempt ended with an error rather than a response.
    pub fn is_error(&self) -> bool {
        self.outcome.is_err()
    }

    /// The response, if the attempt ended with one of type `R`.
    pub fn response<R: 'static>(&self) -> Option<&'a R> {
        self.outcome.ok()?.downcast_ref()
    }

    /// The error, if the attempt ended with one of type `E`, or with the
    /// layer's [`Error`](crate::Error)`<E>` around one (a layer with an
    /// attempt timeout or a breaker, every HTTP layer): over reqwest,
    /// `error::<reqwest::Error>()` is the client's error, and
    /// `error::<Error<reqwest::Error>>()` tells a timeout apart too.
    pub fn error<E: 'static>(&self) -> Option<&'a E> {
        let error = self.outcome.err()?;
        // The layer's own wrapper is the error type its users never name
        // first: reading through it is what `error::<E>()` is asked for.
        error
            .downcast_ref()
            .or_else(|| error.downcast_ref::<crate::Error<E>>()?.get_ref())
    }

    /// Whether it was a response or an error.
    pub fn kind(&self) -> OutcomeKind {
        OutcomeKind::of(&self.outcome)
    }
}

impl fmt::Debug for Outcome<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Outcome").field(&self.kind()).finish()
    }
}

/// A hook told of each retry as it goes out: what
/// [`on_retry`](crate::BackoffBuilder::on_retry) keeps.
pub(crate) type RetryHook = dyn Fn(&RetryArgs, Outcome<'_>) + Send + Sync;

/// A request that ended: [`Event::Ended`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndArgs {
    pub(crate) attempts: u32,
    pub(crate) transparent_retries: u32,
    pub(crate) hedges: u32,
    pub(crate) slept: Duration,
    pub(crate) ending: Ending,
    pub(crate) outcome: OutcomeKind,
}

impl EndArgs {
    /// Attempts sent, the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How many of the retries were transparent (free, for a request that
    /// never left): 0 or 1.
    pub fn transparent_retries(&self) -> u32 {
        self.transparent_retries
    }

    /// How many of the attempts were [hedges](crate::hedge).
    pub fn hedges(&self) -> u32 {
        self.hedges
    }

    /// Retries sent, transparent ones included: the attempts that were
    /// neither the first nor a hedge.
    pub fn retries(&self) -> u32 {
        self.attempts.saturating_sub(1).saturating_sub(self.hedges)
    }

    /// Time slept between attempts in all (backoff delays, not pacing).
    pub fn slept(&self) -> Duration {
        self.slept
    }

    /// Why no further attempt was made.
    pub fn ending(&self) -> Ending {
        self.ending
    }

    /// Whether the outcome returned is a response or an error.
    pub fn outcome(&self) -> OutcomeKind {
        self.outcome
    }
}

/// Where an [`Event`] happened: the host of the layer's copy, when a per-host
/// stack ([`BackoffLayer::for_host`](crate::BackoffLayer::for_host)) gave
/// it one, and the layer's [name](crate::BackoffBuilder::name), when it was
/// given one. Read by [`Observer::on_event_from`]; the metrics label their
/// series with it, and `tracing` records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Origin {
    pub(crate) host: Option<Arc<str>>,
    pub(crate) layer_name: Option<Arc<str>>,
}

impl Origin {
    /// The authority (`host:port`) the layer's copy sends to, in a
    /// per-host stack.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The name the layer was built with.
    pub fn layer_name(&self) -> Option<&str> {
        self.layer_name.as_deref()
    }

    /// Whether it names neither a host nor a layer: that of a plain layer.
    pub fn is_unknown(&self) -> bool {
        self.host.is_none() && self.layer_name.is_none()
    }
}

/// Hears every [`Event`] of the requests of a layer it was given to. Shared
/// by every clone of the layer's services, so it must be `Send + Sync`, and
/// called on the request's own task, so it should be quick: count, log, or
/// hand the event on.
///
/// Any `Fn(&Event) + Send + Sync` closure is one:
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use tower_backoff::events::Event;
/// use tower_backoff::BackoffLayer;
///
/// let retries = Arc::new(AtomicU64::new(0));
/// let counted = retries.clone();
/// let layer = BackoffLayer::builder()
///     .observer(move |event: &Event| {
///         if let Event::Retry(retry) = event {
///             counted.fetch_add(1, Ordering::Relaxed);
///             eprintln!("retrying after attempt {}: {:?}", retry.attempt(), retry.cause());
///         }
///     })
///     .build()?;
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
pub trait Observer: Send + Sync {
    /// `event` happened to one of the layer's requests.
    fn on_event(&self, event: &Event);

    /// `event` happened to one of the requests of the layer, or layer copy,
    /// `origin` names. What the layer calls; by default it forgets the
    /// origin and calls [`on_event`](Self::on_event). A closure that wants
    /// the origin is wrapped in [a `WithOrigin`](crate::events::WithOrigin).
    fn on_event_from(&self, event: &Event, origin: &Origin) {
        let _ = origin;
        self.on_event(event);
    }
}

impl<F: Fn(&Event) + Send + Sync> Observer for F {
    fn on_event(&self, event: &Event) {
        self(event)
    }
}

/// An observer that hears each event with its [`Origin`]: the host of the
/// per-host layer copy it happened in, and the layer's name.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use tower_backoff::events::{Event, Origin, WithOrigin};
/// use tower_backoff::BackoffLayer;
///
/// let layer = BackoffLayer::builder()
///     .name("payments")
///     .observer(WithOrigin(|event: &Event, origin: &Origin| {
///         if let Event::Breaker(state) = event {
///             eprintln!("breaker of {:?} is {state:?}", origin.host());
///         }
///     }))
///     .build()?;
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct WithOrigin<F>(pub F);

impl<F: Fn(&Event, &Origin) + Send + Sync> Observer for WithOrigin<F> {
    fn on_event(&self, event: &Event) {
        (self.0)(event, &Origin::default())
    }

    fn on_event_from(&self, event: &Event, origin: &Origin) {
        (self.0)(event, origin)
    }
}

/// Logs each retry as a `tracing` debug event and each refusal of the budget
/// as a warning: every layer has it under the `tracing` feature.
#[cfg(feature = "tracing")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Tracing;

#[cfg(feature = "tracing")]
impl Observer for Tracing {
    fn on_event(&self, event: &Event) {
        self.on_event_from(event, &Origin::default())
    }

    fn on_event_from(&self, event: &Event, origin: &Origin) {
        let (host, layer) = (origin.host(), origin.layer_name());
        match event {
            Event::Retry(retry) => tracing::debug!(
                host,
                layer,
                attempt = retry.attempt,
                delay = ?retry.delay,
                reason = ?retry.cause,
                "retrying"
            ),
            Event::Ended(end) if end.ending == Ending::BudgetRefused => tracing::warn!(
                host,
                layer,
                attempt = end.attempts,
                "retry budget exhausted; returning the last outcome"
            ),
            Event::Breaker(state) => {
                tracing::warn!(host, layer, state = ?state, "circuit breaker")
            }
            Event::Hedge(hedge) => tracing::debug!(
                host,
                layer,
                attempt = hedge.attempt,
                event = ?hedge.event,
                "hedge"
            ),
            _ => {}
        }
    }
}
