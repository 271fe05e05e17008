//! The retry engine and the tower layer of
//! [`tower-backoff`](https://docs.rs/tower-backoff), which re-exports all of
//! this crate at its top level: depend on `tower-backoff`, not on this crate.
//!
//! What is here: the [`BackoffRetry`] service and its [`BackoffLayer`], the
//! [`Policy`] that says what to retry, the [`Schedule`] and [`Jitter`] that
//! say when, the [`Budget`] that says how much, [`AdaptivePacing`], and the
//! other front-ends of the same engine: [`retry()`] for async closures and
//! [`Delays`] for loops written by hand. The core knows nothing of HTTP or
//! gRPC; the sibling crates build on its public API.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod adaptive;
pub mod breaker;
pub mod budget;
mod clone_for_retries;
mod config;
// The attempt timer, read by the sibling crates: not part of the documented
// API but for `Guarded`, re-exported below.
#[doc(hidden)]
pub mod deadline;
mod decision;
mod delays;
// The retry session the sibling crates' front-ends drive: not part of the
// documented API.
#[doc(hidden)]
pub mod engine;
pub mod error;
pub mod events;
pub mod future;
pub mod hedge;
mod hedged;
mod jitter;
mod layer;
mod limits;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod policy;
pub mod retry;
pub mod schedule;
mod send;
mod service;
mod span;
mod stats;
#[doc(hidden)]
pub mod sync;
pub mod timer;
mod transitions;

pub use adaptive::{AdaptivePacing, AdaptivePacingBuilder, PacingMetrics};
pub use budget::{Budget, TokenBucket};
pub use clone_for_retries::CloneForRetries;
pub use deadline::Guarded;
pub use delays::Delays;
pub use error::{ConfigError, Error};
pub use future::ResponseFuture;
pub use hedge::Hedging;
pub use jitter::{Jitter, Rng};
pub use layer::{BackoffBuilder, BackoffLayer, DEFAULT_MAX_ATTEMPTS};
pub use policy::{
    classify_fn, retry_if, Cause, ClassifyFn, Decision, Policy, PrepareRetry, RetryIf, RetryLimits,
    RetryOnError,
};
pub use retry::{retry, RetryCall};
pub use schedule::{AnySchedule, Constant, Exponential, Linear, Schedule, Table};
pub use service::BackoffRetry;
pub use stats::{Stats, StatsSnapshot};
