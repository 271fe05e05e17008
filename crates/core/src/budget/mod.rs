//! Retry budgets: a cap on the extra load retries may add, shared by every clone
//! of a service.
//!
//! Two ready-made budgets, both lock-free and model-checked with loom:
//! [`TokenBucket`] (the AWS SDKs' retry quota: a retry costs tokens, a success
//! refunds some) and [`RatioBudget`] (retries at most a fraction of recent
//! first attempts, as Finagle's, or of recent successes, as tower's
//! `TpsBudget`, plus a fixed reserve).
//!
//! # The default
//! A layer built with no budget option gets [`TokenBucket::fleet_safe`] for
//! its `max_attempts`, shared by every service the layer wraps and all their
//! clones. It is built for two things at once. A user who configures
//! attempts gets them: the bucket starts full with one request's retries
//! (`max_attempts - 1`), and every retry costs one whatever its cause, so the
//! first request that fails on a new or quiet client makes every attempt it
//! is allowed, a retry after a timeout included. And a fleet gets its total
//! bounded, even when every process builds its own layer: a process's
//! retries are paid by that one request's worth, by successes (one each,
//! first try or not) or by the retry's own success (its cost back), up to a
//! capacity that grows to a tenth of the layer's first-try successes of the
//! last 10 s and falls back to one request's worth over the 10 s after it
//! was measured. While nothing succeeds, nothing is earned.
//!
//! Two kinds of retry are not charged, because something else paces them: a
//! [conflict](Cause::Conflict) (the server answered promptly), and a
//! [throttled](Cause::Throttled) attempt's retry that waits the delay the
//! server named or goes through adaptive pacing (the server's signal sets
//! its pace; a budget would only refuse what the server invited back).
//! Timeouts always pay: the server may still be working on them.
//!
//! In the simulation (`crates/sim`, asserted in `tests/sim.rs` and
//! `tests/sim_pacing.rs`, tables in `docs/RESULTS.md`), a full outage of
//! 1,000 independent processes makes 1.033 attempts per request, where the
//! AWS standard bucket ([`TokenBucket::new`], 500 tokens each) makes 2.65
//! because every process spends its own reserve; clones of one layer make
//! two retries in all. A partial failure (p = 0.1 per attempt) fails 0.027
//! percentage points more requests than no budget across 1,000 independent
//! layers, and throttled or conflicting clients make the same calls as with
//! no budget. A success that finds the bucket full reads three atomics
//! (whether its traffic is being measured, the tokens, the capacity), writes
//! none and reads no clock.
//!
//! Pass [`TokenBucket::new`] (the AWS SDKs' standard mode) or a
//! [`RatioBudget`] to cap the extra load at a fixed share instead; share one
//! budget (an `Arc`, `.budget(..)`) between the layers of one process; opt
//! out with `no_budget()` when an outer layer already budgets the retries.

use std::sync::Arc;

use crate::decision::Cause;

mod ratio;
mod token_bucket;

#[cfg(all(test, tower_backoff_loom))]
mod loom;

pub use ratio::{Earn, RatioBudget, RatioBudgetBuilder};
pub use token_bucket::{TokenBucket, TokenBucketBuilder};

/// Decides whether a retry may go out, from what every clone of the service has
/// seen. Shared through an `Arc`, so it must be `Send + Sync` and should be
/// lock-free: it is consulted on every request.
///
/// The layer calls it in this order for each request: [`on_first_attempt`]
/// once; when an attempt's outcome asks for a retry, [`would_allow`] (which
/// charges nothing) so that a request the budget would refuse ends at once
/// instead of after its sleep; [`try_retry`] when the retry actually goes out,
/// after the sleep and the service's readiness; then [`on_success`] if an
/// attempt succeeded.
///
/// So the budget is **charged at send**: a request dropped during its sleep,
/// or whose retry is stopped by anything else, spends nothing, and a refusal
/// at send returns the last attempt's outcome to the caller.
///
/// [`on_first_attempt`]: Budget::on_first_attempt
/// [`would_allow`]: Budget::would_allow
/// [`try_retry`]: Budget::try_retry
/// [`on_success`]: Budget::on_success
pub trait Budget: Send + Sync {
    /// A request is about to make its first attempt.
    fn on_first_attempt(&self) {}

    /// Whether a retry for a failure of this `cause` would be allowed now,
    /// without spending anything. Asked when the retry is decided; `false`
    /// returns the outcome at once. A `true` is no promise: the retry still
    /// pays through [`try_retry`](Budget::try_retry) when it goes out. The
    /// default says `true`.
    fn would_allow(&self, cause: Cause) -> bool {
        let _ = cause;
        true
    }

    /// A retry, for a failure of this `cause`, is going out now. `true` spends
    /// what it costs; `false` refuses it.
    fn try_retry(&self, cause: Cause) -> bool;

    /// An attempt succeeded. `last_retry` is the cause of the retry that led to
    /// it, or `None` when the first attempt succeeded.
    fn on_success(&self, last_retry: Option<Cause>) {
        let _ = last_retry;
    }

    /// What the budget holds now, in its own unit, for a dashboard: the
    /// tokens of a [`TokenBucket`], the retries a [`RatioBudget`] would
    /// allow. `None` (the default) for a budget that does not say.
    fn balance(&self) -> Option<u64> {
        None
    }
}

/// A shared or borrowed budget is the budget itself: every call forwards.
macro_rules! forward_budget {
    ($($by:ty),*) => {$(
        impl<B: Budget + ?Sized> Budget for $by {
            fn on_first_attempt(&self) {
                (**self).on_first_attempt()
            }
            fn would_allow(&self, cause: Cause) -> bool {
                (**self).would_allow(cause)
            }
            fn try_retry(&self, cause: Cause) -> bool {
                (**self).try_retry(cause)
            }
            fn on_success(&self, last_retry: Option<Cause>) {
                (**self).on_success(last_retry)
            }
            fn balance(&self) -> Option<u64> {
                (**self).balance()
            }
        }
    )*};
}

forward_budget!(Arc<B>, &'static B);
