//! Retries for [tower] services that help an overloaded server recover instead
//! of knocking it down again.
//!
//! A naive retry loop turns a brief outage into a long one: every client
//! retries at once, the server's queue grows past the clients' timeouts, and
//! they retry even more (a *retry storm*). [`BackoffLayer`] retries only what a
//! [`Policy`] calls transient, after exponentially growing, [jittered](Jitter)
//! sleeps from a [`Schedule`], within a limit of attempts and time, and
//! within a retry [`Budget`], on by default, shared by every clone of the
//! client.
//!
//! The three concerns stay apart: the policy says *what* to retry, the schedule
//! *when*, the budget *how much*.
//!
//! # Four jobs, one layer or one call each
//! - any tower `Service`: [`BackoffLayer`];
//! - reqwest and hyper-util: `http::HttpRetryLayer` (features `reqwest`,
//!   `hyper`, or `http` for any other HTTP client), which also replays streaming request bodies and reads
//!   responses of known length whole before judging them;
//! - tonic: `grpc::GrpcRetryLayer` (feature `grpc`), configured by the gRPC
//!   service-config JSON;
//! - a plain async closure: [`retry`](fn@retry).
//!
//! # Runtime
//! The sleeps run on tokio's timer: a tokio runtime with the time driver
//! (`#[tokio::main]`, or `Builder::enable_time()`). Without one the first
//! retry's sleep panics with a message saying so; a request that succeeds
//! the first time needs no runtime. On another executor, install its timer
//! once with [`timer::set_timer`] before the first retry.
//!
//! # The last real outcome
//! The caller always gets the last real response or error, with the inner
//! service's own error type: the outcome of attempt *n* is returned unless
//! attempt *n + 1* actually goes out. A retry is decided when an outcome
//! arrives but committed only when it is sent, after its sleep and the
//! service's readiness; whatever stops it in between (the future is dropped,
//! the service fails to become ready, the time limit passes, the budget
//! refuses, a streaming body can no longer be replayed) returns the kept
//! outcome. The budget is charged, and the observers (`on_retry`, the
//! [`Stats`]) and the policy's `prepare_retry` hear of a retry, only when it
//! is sent.
//!
//! A layer built with no options has a retry [budget] shared by every service
//! it wraps, so that retries cannot multiply the load of an outage;
//! [`BackoffBuilder::no_budget`] opts out.
//!
//! # Quick start
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_backoff::{BackoffLayer, Exponential, Jitter};
//!
//! // A service that is busy once, then answers.
//! let calls = AtomicU32::new(0);
//! let flaky = service_fn(|name: &'static str| {
//!     let n = calls.fetch_add(1, Ordering::Relaxed);
//!     async move {
//!         if n < 1 { Err("busy, try later") } else { Ok(format!("hello, {name}")) }
//!     }
//! });
//!
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         BackoffLayer::builder()
//!             .max_attempts(4)
//!             .schedule(Exponential::new(Duration::from_millis(100)).max_delay(Duration::from_secs(5)))
//!             .jitter(Jitter::Full)
//!             .build()?,
//!     )
//!     .service(flaky);
//!
//! assert_eq!(svc.oneshot("world").await?, "hello, world");
//! assert_eq!(calls.load(Ordering::Relaxed), 2);
//! # Ok(())
//! # }
//! ```
//!
//! Shared by every clone of a service: a retry [budget] ([`TokenBucket`])
//! that caps the extra load retries add and, optionally,
//! [`AdaptivePacing`] that slows every request down while the server throttles,
//! and [`Stats`] counters; [`BackoffBuilder::on_retry`] hooks a closure on each
//! retry.
//!
//! For plain async closures outside tower, [`retry()`] offers the same
//! schedules and limits; for loops written by hand (a client that keeps a
//! connection open), [`Delays`] hands out a schedule's delays one by one.
//!
//! [tower]: https://docs.rs/tower
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// The engine and the layer: everything above is theirs, at the top level.
pub use tower_backoff_core::*;

// The siblings are `#[doc(inline)]`: their pages render here as modules of
// this crate, under the paths users write (`tower_backoff::http::..`), not as
// a bare `pub use` that sends the reader to a crate they do not depend on.

/// A poller of many providers on the same engine: per-provider backoff,
/// quarantine and eviction, and a live board of their values.
#[cfg(feature = "poll")]
#[cfg_attr(docsrs, doc(cfg(feature = "poll")))]
#[doc(inline)]
pub use tower_backoff_poll as poll;

/// HTTP retries: the HTTP policy, the server's signals (`Retry-After` and
/// friends), replayable request bodies, reqwest and reqwest-middleware.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[doc(inline)]
pub use tower_backoff_http as http;

/// gRPC retries for tonic, as gRFC A6 specifies them.
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[doc(inline)]
pub use tower_backoff_grpc as grpc;

/// The server half: a layer for hyper/axum and tonic servers that admits by
/// measured latency and sheds the rest with the signals the client honours
/// (feature `shed`).
#[cfg(feature = "shed")]
#[cfg_attr(docsrs, doc(cfg(feature = "shed")))]
#[doc(inline)]
pub use tower_backoff_shed as shed;

// Every Rust snippet in the README is compiled and run by `cargo test`, so the
// README cannot drift from the API. Not part of the public docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

// The same for the guide the README links to.
#[cfg(doctest)]
#[doc = include_str!("../docs/GUIDE.md")]
pub struct GuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/RESULTS.md")]
pub struct ResultsDoctests;
