//! The server half of [`tower-backoff`](https://docs.rs/tower-backoff): a
//! tower layer for hyper/axum and tonic servers that admits work by measured
//! latency and rejects the rest at once, with the signals tower-backoff's
//! clients honour. Use it through `tower-backoff`'s `shed` feature, as
//! `tower_backoff::shed`.
//!
//! A per-process client cannot see a fleet-wide overload it is not failing
//! at; the server, which sees every client, can. [`ShedLayer`]:
//! - **admits by latency**: an adaptive concurrency [`Limiter`], gradient
//!   style: it shrinks only while the limit is reached and latency grows
//!   past what the server does at low concurrency (its baseline, re-measured
//!   by a short probe at half the limit), so a server that is merely slow
//!   (variable work, a slower dependency, fast failures, few slow requests)
//!   has none of its traffic shed; and a bound on queueing time
//!   (`max_drain`). What it cannot admit it rejects at once, before the
//!   inner service is called. A response holds its place until its body
//!   ends ([`ShedBody`]), where its latency is measured; failures are not;
//! - **answers with the client's signals**: HTTP 503 (or 429) with
//!   `Retry-After` and `retry-after-ms` spread at random between 1 and 3 s
//!   (longer when the backlog needs longer; `Retry-After` in whole seconds,
//!   so 1 or 2) and the RateLimit fields; gRPC
//!   `UNAVAILABLE` with `grpc-retry-pushback-ms`; and "do not retry"
//!   (`x-should-retry: false`, a negative pushback with
//!   `RESOURCE_EXHAUSTED`) when the rejected demand could not drain within
//!   `max_drain`;
//! - **sheds retries and low-priority work first**: a request's
//!   [`Criticality`] (header `x-criticality`, which any client can send:
//!   turn it off with [`ShedBuilder::trust_criticality`] where clients are
//!   not trusted), one level lower when it is a retry or a hedge
//!   (`x-retry-attempt`, which tower-backoff's `HttpPolicy` sends,
//!   `grpc-previous-rpc-attempts`, `x-envoy-attempt-count`);
//! - **tells**: every admission, rejection and change of limit is a
//!   [`ShedEvent`]; metrics under `tower_backoff.shed.*` (feature `metrics`).
//!
//! ```
//! # mod tower_backoff { pub use tower_backoff_core::*; pub mod shed { pub use tower_backoff_shed::*; } }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//! use tower_backoff::shed::{Limiter, ShedLayer};
//!
//! let layer = ShedLayer::builder()
//!     .limiter(Limiter::builder().initial_limit(1).min_limit(1))
//!     .status(StatusCode::TOO_MANY_REQUESTS)
//!     .max_drain(Duration::from_secs(5))
//!     .build()?;
//! let handler = service_fn(|_req: Request<Full<Bytes>>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
//! });
//! let server = ServiceBuilder::new().layer(layer.clone()).service(handler);
//!
//! // One request holds the only place; the next is answered at once.
//! let mut holder = server.clone();
//! let held = holder.ready().await?.call(Request::new(Full::new(Bytes::new())));
//! let shed = server.clone().oneshot(Request::new(Full::new(Bytes::new()))).await?;
//! assert_eq!(shed.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(shed.headers().contains_key("retry-after-ms"));
//! assert_eq!(held.await?.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod body;
mod config;
pub mod criticality;
pub mod events;
mod future;
mod layer;
pub mod limiter;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod rejection;
mod service;
mod window;

pub use body::ShedBody;
pub use criticality::{Criticality, Priority};
#[cfg(feature = "tracing")]
pub use events::ShedTracing;
pub use events::{LimitArgs, ShedEvent, ShedObserver};
pub use future::ResponseFuture;
pub use layer::{ShedBuilder, ShedLayer};
// gRPC status codes the rejections use; out of the public docs.
#[doc(hidden)]
pub use layer::{RESOURCE_EXHAUSTED, UNAVAILABLE};
pub use limiter::{Limiter, LimiterBuilder, Permit};
pub use rejection::{Reason, Rejection};
pub use service::Shed;
