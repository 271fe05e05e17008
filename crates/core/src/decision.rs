//! [`Decision`] and [`Cause`]: what a policy says of one attempt's outcome,
//! the words the engine, the budgets, pacing and the events all share.

use std::time::Duration;

/// What one attempt's outcome means.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower_backoff::{Cause, Decision};
///
/// // A 429 with `Retry-After: 2`:
/// let d = Decision::retry_after(Duration::from_secs(2)).because(Cause::Throttled);
/// assert!(d.is_retry());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The attempt succeeded: return its outcome.
    Success,
    /// The outcome is final: a failure another attempt will not fix (a 400,
    /// a non-idempotent request, a server that said not to retry). Return it
    /// as is, with no retry.
    Final,
    /// The attempt failed transiently: retry if the limits and budget allow.
    Retry {
        /// A delay the server asked for (`Retry-After`): never shortened,
        /// since a retry before the server asked is wasted, and raised to
        /// the schedule's delay for that retry when shorter, so that a
        /// server naming 1 ms does not make a tight loop. It decides when
        /// the retry goes, never whether: the budget pays for it as for any
        /// other. The policy decides how long a delay it
        /// accepts (the HTTP policy's `max_server_delay`) and returns
        /// [`Decision::Final`] past that. A delay that would end past the
        /// layer's time limit ends the request at once.
        after: Option<Duration>,
        /// Why it failed; budgets and adaptive pacing weigh causes differently.
        cause: Cause,
    },
}

impl Decision {
    /// Retry after the schedule's next delay.
    pub const fn retry() -> Self {
        Decision::Retry {
            after: None,
            cause: Cause::Transient,
        }
    }

    /// Retry after `delay`, as the server asked.
    pub const fn retry_after(delay: Duration) -> Self {
        Decision::Retry {
            after: Some(delay),
            cause: Cause::Transient,
        }
    }

    /// The same decision, attributed to `cause`. No effect on `Success` or `Final`.
    pub const fn because(self, cause: Cause) -> Self {
        match self {
            Decision::Retry { after, .. } => Decision::Retry { after, cause },
            other => other,
        }
    }

    /// Whether this asks for a retry.
    pub const fn is_retry(&self) -> bool {
        matches!(self, Decision::Retry { .. })
    }
}

/// Why an attempt failed, as far as the policy can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Cause {
    /// Any transient failure: a dropped connection, a 502.
    #[default]
    Transient,
    /// The attempt timed out: the server may still be working on the
    /// request. The layer's default budget charges its retry as any other;
    /// [`TokenBucket::new`](crate::TokenBucket::new) (AWS's standard mode)
    /// charges it twice a transient retry's.
    Timeout,
    /// The server said it is overloaded (429, 503). Adaptive pacing slows every
    /// request down when it sees this.
    Throttled,
    /// The attempt provably never reached the server (the connection was
    /// refused, an HTTP/2 stream was refused before the request was written).
    /// Once per request such a retry is *transparent*, as gRPC's retry design
    /// calls it: it goes out at once, does not count against the attempt
    /// limit and costs no budget, since the server saw nothing. A second one
    /// counts as an ordinary retry.
    NotSent,
    /// The server answered and the request lost a race: an optimistic write
    /// found the record changed (HTTP 409/412 with a version check, gRPC
    /// `ABORTED`). The server is up and keeping pace, so the retry costs no
    /// budget: a budget protects capacity, and a caller it refused would
    /// only re-send at once, without the backoff that spreads the racers.
    /// It counts against the attempt limit and waits its delay as usual.
    Conflict,
    /// Not a failure: a hedge, a copy of an attempt still pending, sent
    /// because the attempt is slow (see [`hedge`](crate::hedge)). Budgets
    /// charge it as a transient failure's retry; no policy returns it.
    Hedge,
}
