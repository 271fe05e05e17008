//! What the provider tasks read: the poller's settings, fixed once built.

use std::cmp::Ordering;
use std::time::Duration;

use tower_backoff_core::budget::Budget;
use tower_backoff_core::policy::Policy;
use tower_backoff_core::schedule::AnySchedule;
use tower_backoff_core::Jitter;

pub(super) type MakeRequest<K, Req> = dyn Fn(&K) -> Req + Send + Sync;
pub(super) type Rank<V> = dyn Fn(&V, &V) -> Ordering + Send + Sync;

/// Everything the provider tasks read; fixed once built.
pub(super) struct Config<K, Req, V, E> {
    pub(super) make_request: Box<MakeRequest<K, Req>>,
    pub(super) policy: Option<Box<dyn Policy<Req, V, E> + Send + Sync>>,
    pub(super) schedule: AnySchedule,
    pub(super) jitter: Jitter,
    pub(super) interval: Duration,
    pub(super) timeout: Option<Duration>,
    pub(super) max_failures: u32,
    pub(super) reprobe_after: Option<Duration>,
    pub(super) seed: Option<u64>,
    pub(super) budget: Option<Box<dyn Budget>>,
    pub(super) rank: Option<Box<Rank<V>>>,
}
