//! Retry budgets: a cap on the extra load retries may add, shared by every clone
//! of a service.
//!
//! Two ready-made budgets, both lock-free and model-checked with loom:
//! [`TokenBucket`] (the AWS SDKs' retry quota: a retry costs tokens, a success
//! refunds some) and [`RatioBudget`] (Finagle's: retries at most a fraction of
//! recent first attempts, plus a small floor per second).

use std::sync::Arc;

use crate::policy::Cause;

mod ratio;
mod token_bucket;

#[cfg(all(test, tower_backoff_loom))]
mod loom;

pub use ratio::{RatioBudget, RatioBudgetBuilder};
pub use token_bucket::{TokenBucket, TokenBucketBuilder};

/// Decides whether a retry may go out, from what every clone of the service has
/// seen. Shared through an `Arc`, so it must be `Send + Sync` and should be
/// lock-free: it is consulted on every request.
///
/// The layer calls it in this order for each request: [`on_first_attempt`]
/// once, then [`try_retry`] before every retry (a refusal returns the last
/// outcome to the caller at once), then [`on_success`] if an attempt succeeded.
/// Nothing is withdrawn for a retry that does not happen, so dropping a request
/// midway keeps the accounting exact.
///
/// [`on_first_attempt`]: Budget::on_first_attempt
/// [`try_retry`]: Budget::try_retry
/// [`on_success`]: Budget::on_success
pub trait Budget: Send + Sync {
    /// A request is about to make its first attempt.
    fn on_first_attempt(&self) {}

    /// A retry, for a failure of this `cause`, wants to go out. `true` spends
    /// what it costs; `false` refuses it.
    fn try_retry(&self, cause: Cause) -> bool;

    /// An attempt succeeded. `last_retry` is the cause of the retry that led to
    /// it, or `None` when the first attempt succeeded.
    fn on_success(&self, last_retry: Option<Cause>) {
        let _ = last_retry;
    }
}

impl<B: Budget + ?Sized> Budget for Arc<B> {
    fn on_first_attempt(&self) {
        (**self).on_first_attempt()
    }
    fn try_retry(&self, cause: Cause) -> bool {
        (**self).try_retry(cause)
    }
    fn on_success(&self, last_retry: Option<Cause>) {
        (**self).on_success(last_retry)
    }
}

impl<B: Budget + ?Sized> Budget for &'static B {
    fn on_first_attempt(&self) {
        (**self).on_first_attempt()
    }
    fn try_retry(&self, cause: Cause) -> bool {
        (**self).try_retry(cause)
    }
    fn on_success(&self, last_retry: Option<Cause>) {
        (**self).on_success(last_retry)
    }
}
