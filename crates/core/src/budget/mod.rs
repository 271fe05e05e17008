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
//! A layer built with no budget option gets a [`TokenBucket`] with its
//! defaults, shared by every service the layer wraps and all their clones.
//! Chosen by measurement (the `sim` module, `examples/retry_storm`), against
//! the other semantics on the same layer:
//!
//! - **Full outage**: it spends its reserve, the 500 tokens it starts with
//!   (100 retries after errors, 50 after timeouts), then nothing while
//!   nothing succeeds: 1.003 attempts per request over 30 s at 1,000
//!   requests per second, at 10, 100 or 1,000 clones. A ratio of first
//!   attempts earns during the outage too (1.21 at 20 %).
//! - **Partial failure**: while most attempts succeed, their refunds keep it
//!   full, so it refuses nothing: with each attempt failing with p = 0.1,
//!   99.9 % of requests succeed at 1.11x the load; at p = 0.3, 97.4 % at
//!   1.39x (the two ratio budgets hold the load to 1.2x there, and fail
//!   15 % of requests instead).
//! - **Storm**: the overloaded server of the simulation recovers in every
//!   seed, at 2,000 clients, and after a 30 s outage.
//! - **Happy path**: one relaxed load (the refund finds the bucket full), no
//!   clock, no allocation. A ratio of successes (1.01 in a full outage) meets
//!   the other targets too, but reads the clock and writes a shared counter
//!   on every success.
//!
//! Change it when the extra load must stay under a fixed share however
//! many attempts fail: the bucket never limits while successes refund more
//! than retries cost (up to about p = 0.3 with three attempts), where a
//! [`RatioBudget`] caps retries at its ratio and fails more requests
//! instead. Mind the reserve when many processes each build a layer: each
//! brings its own 500 tokens, spent at the start of an outage; share one
//! budget (an `Arc`, `.budget(..)`) between the layers of one process. Opt
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

impl<B: Budget + ?Sized> Budget for Arc<B> {
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

impl<B: Budget + ?Sized> Budget for &'static B {
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

/// The budget a layer gets when it is given none: a [`TokenBucket`] with its
/// defaults (see [the module docs](self) for why). On the happy path it costs
/// one relaxed load: `on_first_attempt` is empty, and a success's refund
/// finds the bucket full.
pub(crate) fn default_budget() -> TokenBucket {
    TokenBucket::fleet_safe()
}
