//! A `tracing` span per retry (feature `tracing`): the attempt's number,
//! `http.request.resend_count` as OpenTelemetry's HTTP conventions name it
//! (they set it on resends only), the delay, the cause, and the outcome once
//! it is in, and the layer's [`Origin`] (`host`, `layer`) when it has one.
//! Created where the retry is sent, so it nests in whatever span
//! polls the response future, the caller's. The first attempt runs in the
//! caller's own span, with no span added: its future stays in place, and the
//! happy path's future stays the size of `tower::retry`'s. Without the
//! feature a retry is its bare future.

use crate::engine::Retry;
use crate::events::{Origin, OutcomeKind};

/// An attempt's future, in its span under the `tracing` feature.
#[cfg(feature = "tracing")]
pub(crate) type Traced<F> = tracing::instrument::Instrumented<F>;
/// An attempt's future, in its span under the `tracing` feature.
#[cfg(not(feature = "tracing"))]
pub(crate) type Traced<F> = F;

/// `$future`, attempt number `$attempt` of the layer copy `$origin` names,
/// in its span, with the fields `$extra` between the origin and the outcome.
#[cfg(feature = "tracing")]
macro_rules! in_span {
    ($future:expr, $attempt:expr, $origin:expr, $($extra:tt)*) => {{
        use tracing::Instrument;
        let attempt: u32 = $attempt;
        $future.instrument(tracing::debug_span!(
            "attempt",
            attempt,
            http.request.resend_count = attempt - 1,
            host = $origin.host(),
            layer = $origin.layer_name(),
            $($extra)*
            outcome = tracing::field::Empty,
        ))
    }};
}

/// Attempt number `attempt`'s future (2 for the first retry), sent as
/// `retry` by the layer copy `origin` names, in its span.
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn retry<F>(future: F, attempt: u32, retry: &Retry, origin: &Origin) -> Traced<F> {
    #[cfg(feature = "tracing")]
    return in_span!(future, attempt, origin, delay = ?retry.delay, cause = ?retry.cause,);
    #[cfg(not(feature = "tracing"))]
    future
}

/// Attempt number `attempt`'s future, sent as a hedge by the layer copy
/// `origin` names, in its span.
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
pub(crate) fn hedge<F>(future: F, attempt: u32, origin: &Origin) -> Traced<F> {
    #[cfg(feature = "tracing")]
    return in_span!(future, attempt, origin, hedge = true,);
    #[cfg(not(feature = "tracing"))]
    future
}

/// The first attempt's future where a retry's is kept: in no span of its
/// own (a disabled one, which records nothing and allocates nothing).
pub(crate) fn untraced<F>(future: F) -> Traced<F> {
    #[cfg(feature = "tracing")]
    {
        use tracing::Instrument;
        future.instrument(tracing::Span::none())
    }
    #[cfg(not(feature = "tracing"))]
    future
}

/// Records on an attempt's span whether its outcome was a response or an
/// error.
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
