//! Retrying HTTP requests: only what is safe to repeat, only when the outcome
//! says it is transient, after the delay the server asks for.
//!
//! [`HttpRetryLayer`] is the one layer to put around `reqwest::Client`
//! (feature `reqwest`), hyper-util's client or any
//! `Service<http::Request<B>>`: [`HttpRetryLayer::builder()`] gives the
//! [`HttpPolicy`], the default budget, replay of streaming reqwest bodies up
//! to 64 KiB, and responses returned at their headers; with a
//! [buffer limit](HttpRetryBuilder::buffer_limit), responses of known length
//! within it are read whole before they are judged, so a body cut short is
//! retried rather than failing the caller's read. It reads a caller's [`RetryLimits`](tower_backoff_core::RetryLimits)
//! from each request's extensions and records a [`RetryInfo`] in each
//! response's. With the `reqwest-middleware` feature, `BackoffMiddleware`
//! does the same for `reqwest_middleware` clients, made from the same
//! builder. [`HttpPolicy::retry_unsent`] retries requests that provably
//! never left ([`is_unsent`]), whatever their method;
//! [`HttpPolicy::retry_on_body`] classifies a response on its body. The
//! pieces the layer is made of are in [the `parts` module](crate::parts).
//!
//! Over HTTP/2, turn on the `http2` feature: a stream the server resets
//! (before the headers or mid-body) or ends with a `GOAWAY` is then read as
//! a reset HTTP/1 connection is ([`classify_error`]), and one it refused or
//! never processed as a request that never left ([`is_unsent`]). hyper does
//! not say why an HTTP/2 stream ended, only the `h2` crate's error does,
//! which any client speaking HTTP/2 builds already; without the feature
//! these errors are final.
//!
//! # What each server signal does
//! [`HttpPolicy`] reads these, each configurable:
//!
//! | Signal | Read as | Effect |
//! |---|---|---|
//! | status 408, 429, 502, 503, 504 | [`StatusSet`], configurable | retried after the schedule's delay |
//! | `x-should-retry: false` | any response | final: returned, never retried |
//! | `x-should-retry: true` | a 4xx or 5xx | retried whatever the status (a POST stays unrepeatable) |
//! | `retry-after-ms` | milliseconds, fraction allowed ([`parse_retry_after_ms`]) | the delay (first choice) |
//! | `Retry-After` | delay-seconds or HTTP-date ([`parse_retry_after`]) | the delay (second choice) |
//! | `RateLimit-Reset` | delta seconds; ≥ 10⁹ a Unix timestamp, ≥ 10¹² in ms ([`parse_rate_limit_reset`]) | the delay (third choice) |
//! | `X-RateLimit-Reset` | as `RateLimit-Reset` | the delay (last choice) |
//! | a delay > [`max_server_delay`](HttpPolicy::max_server_delay) (default 60 s) | | give up at once: the response is returned |
//! | a delay past the layer's [`max_elapsed`](tower_backoff_core::BackoffBuilder::max_elapsed) | | give up at once: the response is returned |
//! | `Retry-After: 0` | | retry now (RFC 9110), no other header read |
//! | a `*-Reset` while its `*-Remaining` is above 0 | quota left | ignored: the reset is when the quota renews |
//! | malformed, negative, zero (but `Retry-After`), past, > 64 bytes | | ignored: the schedule's delay |
//!
//! A server's delay is slept in full, never shortened to the schedule's cap,
//! plus an upward jitter ([`server_delay_jitter`](HttpPolicy::server_delay_jitter),
//! default up to 10 % and at most 1 s) so that clients told the same
//! HTTP-date do not all come back in the same millisecond. After it the
//! schedule starts over: if that retry fails without a delay of its own, the
//! next one waits the schedule's first delay (as gRPC's clients do after a
//! pushback).
//!
//! Upstream, the policy sends the attempt number in `x-retry-attempt`
//! ([`attempt_header`](HttpPolicy::attempt_header)) on every retry and hedge, so
//! a server can shed retries first. [`PerHostLayer`] gives every authority its own
//! retry layer, and so its own budget.
//!
//! # One client, many hosts
//! A [circuit breaker](HttpRetryBuilder::circuit_breaker) is per host: an
//! `HttpRetryLayer` with one gives each authority (scheme, host and port)
//! its own breaker, and with it its own budget and pacing, so a client that
//! talks to a dead host and a healthy one never has the healthy host's
//! requests rejected, while the dead host's breaker stops its calls. The
//! service type stays [`HttpRetry`]. One breaker for every host is an
//! explicit choice,
//! [`circuit_breaker_for_all_hosts`](HttpRetryBuilder::circuit_breaker_for_all_hosts).
//! Without a breaker the layer keeps one budget for every host;
//! [`build_per_host`](HttpRetryBuilder::build_per_host) gives each host its
//! own.
//!
//! # With hyper-util
//! ```no_run
//! # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use http_body_util::Full;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_backoff::http::{HttpRetryLayer, RetryInfo};
//! use tower_backoff::Exponential;
//!
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         HttpRetryLayer::builder()
//!             .schedule(Exponential::new(Duration::from_millis(100)).max_delay(Duration::from_secs(5)))
//!             .max_elapsed(Duration::from_secs(30))
//!             .build()?,
//!     )
//!     .service(client);
//!
//! let request = http::Request::get("http://127.0.0.1:8080/").body(Full::default())?;
//! let response = svc.oneshot(request).await?;
//! let info = response.extensions().get::<RetryInfo>().unwrap();
//! println!("{} after {} attempts", response.status(), info.attempts);
//! # Ok(())
//! # }
//! ```
//!
//! # Composition: what goes inside the retry layer, what outside
//! `ServiceBuilder` lists layers from the outside in. The right order:
//!
//! ```
//! # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use http::{Request, Response};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_backoff::http::HttpPolicy;
//! use tower_backoff::BackoffLayer;
//!
//! # let client = service_fn(|_: Request<String>| async {
//! #     Ok::<_, std::io::Error>(Response::new(String::new()))
//! # });
//! let svc = ServiceBuilder::new()
//!     // 1. Outside: the caller's overall deadline, sleeps included.
//!     .timeout(Duration::from_secs(10))
//!     // 2. The retries.
//!     .layer(BackoffLayer::builder().policy(HttpPolicy::new()).build()?)
//!     // 3. Inside: limits. Every attempt waits for its own permit and gives
//!     //    it back before sleeping, so a request asleep holds no capacity.
//!     .concurrency_limit(64)
//!     // 4. Innermost: the per-attempt timeout. A hung attempt turns into an
//!     //    `Elapsed` error, which the policy retries.
//!     .timeout(Duration::from_secs(2))
//!     .service(client);
//!
//! let response = svc.oneshot(Request::get("http://localhost/").body(String::new())?).await?;
//! # drop(response);
//! # Ok(())
//! # }
//! ```
//!
//! - A per-attempt timeout *outside* the layer would cut the retries short
//!   instead; one *inside* is what makes hung attempts retryable.
//! - The outer deadline returns `Elapsed`, possibly in the middle of a sleep. To
//!   get the last real response instead, use the layer's own
//!   [`max_elapsed`](tower_backoff_core::BackoffBuilder::max_elapsed), which never starts a
//!   sleep that would end past it (and gives up at once when the server's
//!   delay is longer than the time left). Both together are fine.
//! - `tower::timeout`, `tower::buffer` and others change the error type to
//!   `Box<dyn Error + Send + Sync>`; [`HttpPolicy`] reads through it (see
//!   [`AsStdError`]).
//! - `RateLimit` is not `Clone`, which the retry layer needs to re-issue a
//!   request; put a `buffer` between them:
//!   `.layer(backoff).buffer(1024).rate_limit(100, Duration::from_secs(1))`.
//!   Each retry then takes its own slot in the rate.

mod body;
mod buffer;
mod delay_headers;
mod drain;
mod error;
mod info;
mod method;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
mod per_host;
mod policy;
#[cfg(feature = "reqwest")]
mod recorded;
mod replay;
mod replay_layer;
#[cfg(feature = "reqwest")]
mod reqwest;
#[cfg(feature = "reqwest")]
mod reqwest_builder;
#[cfg(feature = "reqwest")]
mod reqwest_replay;
mod retry_after;
mod retry_layer;
mod status;

pub use body::CloneBody;
pub use buffer::BufferedBody;
pub use delay_headers::DelayHeaders;
pub use error::{classify_error, find_in_chain, is_unsent, AsStdError};
pub use info::RetryInfo;
pub use method::MethodSet;
#[cfg(feature = "reqwest-middleware")]
pub use middleware::{BackoffMiddleware, IntoMiddlewareError};
pub use per_host::{MakeHostLayer, PerHost, PerHostFuture, PerHostLayer, RequestAuthority};
pub use policy::HttpPolicy;
pub use replay::ReplayBody;
#[cfg(feature = "reqwest")]
pub use reqwest_builder::RequestBuilder;
pub use retry_after::parse_retry_after;
pub use retry_layer::{
    HttpResponseFuture, HttpRetry, HttpRetryBuilder, HttpRetryLayer, ResponseExtensions,
};
pub use status::StatusSet;

// The defaults, header names and parsers the builders' docs name and the
// sibling crates and tests use; out of the public docs, where the builder
// methods state each default.
#[doc(hidden)]
pub use buffer::DEFAULT_BUFFER_LIMIT;
#[doc(hidden)]
pub use delay_headers::{
    parse_rate_limit_reset, parse_retry_after_ms, RATELIMIT_REMAINING, RATELIMIT_RESET,
    RETRY_AFTER_MS, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
#[doc(hidden)]
pub use drain::{DEFAULT_DRAIN_LIMIT, DEFAULT_DRAIN_TIMEOUT};
#[doc(hidden)]
pub use per_host::DEFAULT_MAX_HOSTS;
#[doc(hidden)]
pub use policy::{
    DEFAULT_MAX_SERVER_DELAY, DEFAULT_SERVER_JITTER_MAX, DEFAULT_SERVER_JITTER_PERCENT,
    IDEMPOTENCY_KEY, X_RETRY_ATTEMPT, X_SHOULD_RETRY,
};
#[doc(hidden)]
pub use replay::DEFAULT_REPLAY_LIMIT;
#[doc(hidden)]
pub use retry_layer::DEFAULT_RESPONSE_BUFFER_LIMIT;

/// The pieces [`HttpRetryLayer`] is made of, for power users who compose
/// them by hand (a `BackoffLayer` with the [`HttpPolicy`] in a stack of their
/// own, the gRPC layer): recording request bodies for replay, reading
/// response bodies ahead, turning recorded requests back into reqwest's.
/// Their order matters and the compiler does not check it:
/// `ReplayLayer` → `BackoffLayer` → `IntoReqwestLayer` (reqwest only) →
/// `BufferBodyLayer` → the client.
///
/// Hidden from the documentation: [`HttpRetryLayer`] is the one way in, and
/// these stay public for the gRPC crate and for stacks already composed by
/// hand; each page's docs are still read with `cargo doc --document-hidden-items`.
#[doc(hidden)]
pub mod parts {
    pub use super::body::{copy_request, unless_spent};
    #[cfg(feature = "reqwest")]
    pub use super::buffer::BufferReqwestFuture;
    pub use super::buffer::{BufferBody, BufferBodyFuture, BufferBodyLayer};
    #[cfg(feature = "reqwest")]
    pub use super::recorded::RecordedRequest;
    pub use super::replay_layer::{Replay, ReplayLayer};
    #[cfg(feature = "reqwest")]
    pub use super::reqwest_replay::{IntoReqwest, IntoReqwestLayer, ReqwestFuture};
}
