//! A `tracing` span per attempt (feature `tracing`): the attempt's number,
//! `http.request.resend_count` as OpenTelemetry's HTTP conventions name it,
//! for a retry its delay and cause, and the outcome once it is in. Created
//! where the attempt is sent, so the first attempt's span nests in the
//! caller's span, and a retry's in whatever span polls the response future.
//! Without the feature an attempt is its bare future: nothing is added.

#[cfg(feature = "tracing")]
use crate::engine::Retry;
use crate::events::OutcomeKind;

/// An attempt's future, in its span under the `tracing` feature.
#[cfg(feature = "tracing")]
pub(crate) type Traced<F> = tracing::instrument::Instrumented<F>;
/// An attempt's future, in its span under the `tracing` feature.
#[cfg(not(feature = "tracing"))]
pub(crate) type Traced<F> = F;

/// The first attempt's future, in its span.
#[inline(always)]
pub(crate) fn first<F>(future: F) -> Traced<F> {
    #[cfg(feature = "tracing")]
    {
        use tracing::Instrument;
        let span = tracing::debug_span!(
            "attempt",
            attempt = 1u32,
            http.request.resend_count = 0u32,
            outcome = tracing::field::Empty,
        );
        future.instrument(span)
    }
    #[cfg(not(feature = "tracing"))]
    future
}

/// Attempt number `attempt`'s future (2 for the first retry), sent as
/// `retry`, in its span.
#[inline(always)]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn retry<F>(future: F, attempt: u32, retry: &crate::engine::Retry) -> Traced<F> {
    #[cfg(feature = "tracing")]
    {
        use tracing::Instrument;
        let Retry { delay, cause, .. } = *retry;
        let span = tracing::debug_span!(
            "attempt",
            attempt,
            http.request.resend_count = attempt - 1,
            delay = ?delay,
            cause = ?cause,
            outcome = tracing::field::Empty,
        );
        future.instrument(span)
    }
    #[cfg(not(feature = "tracing"))]
    future
}

/// Records on an attempt's span whether its outcome was a response or an
/// error.
#[inline(always)]
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn outcome<F>(attempt: &Traced<F>, kind: OutcomeKind) {
    #[cfg(feature = "tracing")]
    {
        let kind = match kind {
            OutcomeKind::Response => "response",
            OutcomeKind::Error => "error",
        };
        attempt.span().record("outcome", kind);
    }
}
