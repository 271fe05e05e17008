//! Retry budgets: a cap on the extra load retries may add, shared by every clone
//! of a service.
//!
//! One ready-made budget, lock-free and model-checked with loom:
//! [`TokenBucket`], the AWS SDKs' retry quota (a retry costs tokens, a
//! success refunds some), whose builder also gives a capacity that grows
//! with traffic, a refill over time, a deposit per request (Finagle's
//! budget of a share of requests) and a floor restored after quiet.
//!
//! # The default
//! A layer built with no budget option gets [`TokenBucket::fleet_safe`] for
//! its `max_attempts`, shared by every service the layer wraps and all their
//! clones. It is built for two things at once.
//!
//! **A fleet gets its total bounded**, even when every process builds its
//! own layer. Every retry costs one token, whoever named its delay: a
//! server's `Retry-After` or gRPC pushback decides *when* a retry goes,
//! never *whether*, since a header sent to every client cannot know how
//! many it invites back (the AWS SDKs and gRPC's retry throttling charge
//! these retries too). Only the transparent retry of a request that never
//! left and a [conflict](Cause::Conflict)'s retry (the server answered
//! promptly) are free. A process's retries are paid by one request's worth
//! (`max_attempts - 1` tokens, what the bucket starts with), by successes
//! (one each, first try or not) or by the retry's own success (its cost
//! back), up to a capacity that follows traffic: a tenth of 10 s of the
//! layer's first-try successes at the rate measured over the last second or
//! more, measured as they come, and falling back to one request's worth
//! within a second or two of an outage's first failures. While nothing
//! succeeds, nothing is earned.
//!
//! **A user who configures attempts gets them.** The first request that
//! fails on a new client makes every attempt it is allowed, a retry after a
//! timeout included; a busy layer holds a tenth of its recent successes as
//! retries, so a short blip is ridden out; and after 10 minutes with no retry
//! asked for, a process holds one request's retries again, so a client
//! whose last request failed for good is not stranded. An outage never
//! looks quiet: each failing request asks for a retry.
//!
//! A retry the budget refuses returns the last attempt's real outcome at
//! once, or, when the server is up and asked for later (a throttle, a delay
//! it named), once the retry's delay has passed and the budget still says
//! no: a caller that sends again as soon as a request ends is never turned
//! into a tight loop. Tables and the commands that measure them:
//! `docs/RESULTS.md`.
//!
//! Pass [`TokenBucket::new`] (the AWS SDKs' standard mode) or a bucket of your
//! own to cap the extra load at a fixed share instead; share one budget (an
//! `Arc`, `.budget(..)`) between the layers of one process; opt out with
//! `no_budget()` when an outer layer already budgets the retries.

use std::sync::Arc;

use crate::decision::Cause;

mod token_bucket;

#[cfg(all(test, tower_backoff_loom))]
mod loom;

pub use token_bucket::{TokenBucket, TokenBucketBuilder};

/// Decides whether a retry may go out, from what every clone of the service has
/// seen. Shared through an `Arc`, so it must be `Send + Sync` and should be
/// lock-free: it is consulted on every request.
///
/// The layer calls it in this order for each request: [`on_first_attempt`]
/// once; when an attempt's outcome asks for a retry, [`would_allow`] (which
/// charges nothing) so that a request the budget would refuse ends at once
/// instead of after its sleep (unless the server throttled or named a
/// delay: that retry waits it out first); [`try_retry`] when the retry actually goes out,
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
    /// tokens of a [`TokenBucket`]. `None` (the default) for a budget that does not say.
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
