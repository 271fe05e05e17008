//! The send step of every attempt, first or retry, in one place: the
//! sender's turn under pacing, the inner service's readiness, and the stamp
//! the attempt goes out with.

use std::task::{ready, Context, Poll};

use tower_service::Service;

use crate::adaptive::Gate;
use crate::config::Config;

/// Readiness to send an attempt, first or retry, through `inner`: the turn of
/// the clone owning `gate` under pacing, then the inner service's readiness.
pub(crate) fn poll_ready_to_send<S, Req, P, T>(
    inner: &mut S,
    gate: &mut Gate,
    config: &Config<P, T>,
    cx: &mut Context<'_>,
) -> Poll<Result<(), S::Error>>
where
    S: Service<Req>,
{
    // Pacing first: waiting for a send slot while holding whatever the
    // inner service reserved (a concurrency permit) could starve it.
    if let Some(pacing) = config.pacing() {
        ready!(pacing.poll_send(gate, cx, || config.new_rng()));
    }
    inner.poll_ready(cx)
}

/// An attempt goes out through the clone owning `gate`: the stamp its outcome
/// is reported to the pacing with (0 without pacing).
pub(crate) fn pacing_stamp<P, T>(config: &Config<P, T>, gate: &mut Gate) -> u16 {
    config.pacing().map_or(0, |pacing| pacing.sent(gate))
}
