//! The errors: [`Error`], the layer's own when it has attempt timeouts or a
//! circuit breaker, and [`ConfigError`], reported when a layer, schedule or
//! budget is built, with the checks the builders share.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The error of a layer with an [attempt timeout](crate::BackoffBuilder::attempt_timeout)
/// or a [circuit breaker](crate::BackoffBuilder::circuit_breaker): the inner
/// service's error, an attempt that ran out of time, or a request an open
/// breaker did not send. Each needs an error to end with that the inner
/// service's own type cannot make (hyper's and reqwest's errors cannot be
/// made from outside); a layer with neither keeps the inner service's error.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// The inner service failed; this is its error, untouched.
    Inner(E),
    /// The last attempt ran out of time and was dropped.
    TimedOut(TimedOut),
    /// The [circuit breaker](crate::breaker) was open: the request was not
    /// sent at all. Only a first attempt ends with it; a retry the breaker
    /// stops returns the outcome of the attempt before.
    Open(BreakerOpen),
}

impl<E> Error<E> {
    /// Whether the last attempt ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::TimedOut(_))
    }

    /// Whether an open circuit breaker rejected the request: nothing was
    /// sent.
    pub fn is_breaker_open(&self) -> bool {
        matches!(self, Error::Open(_))
    }

    /// The inner service's error, if that is what ended the request.
    pub fn get_ref(&self) -> Option<&E> {
        match self {
            Error::Inner(error) => Some(error),
            Error::TimedOut(_) | Error::Open(_) => None,
        }
    }

    /// The inner service's error, or else the layer's own (a timeout, an
    /// open breaker) as an error of its own: one match for code that
    /// handles both, whatever variants the layer gains.
    pub fn inner_or_layer(&self) -> Result<&E, &(dyn StdError + Send + Sync + 'static)> {
        match self {
            Error::Inner(error) => Ok(error),
            Error::TimedOut(timed_out) => Err(timed_out),
            Error::Open(open) => Err(open),
        }
    }

    /// The inner service's error, if that is what ended the request.
    pub fn into_inner(self) -> Option<E> {
        match self {
            Error::Inner(error) => Some(error),
            Error::TimedOut(_) | Error::Open(_) => None,
        }
    }
}

impl<E: Into<Box<dyn StdError + Send + Sync>>> Error<E> {
    /// The error boxed as tower's middleware box theirs: the inner error as
    /// it converts, or the layer's own. For an inner service whose error is
    /// already a `BoxError` (behind `tower::timeout` or `tower::buffer`),
    /// for which `Error<BoxError>` cannot implement
    /// [`std::error::Error`] and so cannot be `?`-converted:
    /// `.map_err(Error::into_box_error)`.
    pub fn into_box_error(self) -> Box<dyn StdError + Send + Sync> {
        match self {
            Error::Inner(error) => error.into(),
            Error::TimedOut(timed_out) => Box::new(timed_out),
            Error::Open(open) => Box::new(open),
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

/// Says what happened once: the inner error is the [`source`](StdError::source)
/// of "the inner service failed", not printed again beside it, so that error
/// reporters walking the chain show each message once; a timeout or an open
/// breaker is the error itself, with no source.
impl<E> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Inner(_) => f.write_str("the inner service failed"),
            Error::TimedOut(timed_out) => timed_out.fmt(f),
            Error::Open(open) => open.fmt(f),
        }
    }
}

impl<E: StdError + 'static> StdError for Error<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.get_ref().map(|error| error as _)
    }
}

/// A configuration value that cannot work, found when the layer (or a schedule,
/// budget or pacing) is built rather than when the first request fails.
///
/// The message names the field, so a user reading a start-up error knows which
/// setting to fix.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{BackoffLayer, Exponential};
///
/// let err = BackoffLayer::builder()
///     .schedule(Exponential::new(Duration::from_millis(100)).factor(0.5))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "factor");
/// assert!(err.to_string().contains("factor"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    reason: String,
}

impl ConfigError {
    /// An error about `field`, explained by `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }

    /// The name of the setting that is wrong, as it appears in the builder.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why the value cannot work.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Longest delay or time limit the crate accepts: a year. Anything longer is
/// almost certainly a unit mistake (milliseconds passed as seconds), and tokio's
/// timer cannot represent much more than that anyway.
#[doc(hidden)]
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Rejects durations no timer should be asked for: longer than
/// [`MAX_DURATION`], as every builder of the crate checks them.
#[doc(hidden)]
pub fn check_duration(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value > MAX_DURATION {
        return Err(ConfigError::new(
            field,
            format!("{value:?} is longer than a year; is the unit right?"),
        ));
    }
    Ok(())
}

/// A time limit that can work: longer than zero, and passing
/// [`check_duration`].
pub(crate) fn check_limit(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(field, "must be longer than zero"));
    }
    check_duration(field, value)
}

/// The error of a request whose first attempt an open breaker rejected:
/// nothing was sent. Never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerOpen;

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit breaker open: the request was not sent")
    }
}

impl std::error::Error for BreakerOpen {}

/// An attempt ran out of time: its attempt timeout, or the time left before
/// the request's deadline, whichever was shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut {
    after: Duration,
}

impl TimedOut {
    pub(crate) fn new(after: Duration) -> Self {
        Self { after }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages an error reporter prints: the error's, then each
    /// source's.
    fn chain(error: &(dyn StdError + 'static)) -> Vec<String> {
        let mut messages = vec![error.to_string()];
        let mut next = error.source();
        while let Some(source) = next {
            messages.push(source.to_string());
            next = source.source();
        }
        messages
    }

    #[test]
    fn a_reporter_shows_each_message_once() {
        let inner = Error::Inner(std::io::Error::other("refused"));
        assert_eq!(chain(&inner), ["the inner service failed", "refused"]);
        let timed_out = Error::<std::io::Error>::TimedOut(TimedOut::new(Duration::from_secs(1)));
        assert_eq!(chain(&timed_out), ["attempt timed out after 1s"]);
        let open = Error::<std::io::Error>::Open(BreakerOpen);
        assert_eq!(
            chain(&open),
            ["circuit breaker open: the request was not sent"]
        );
    }
}
