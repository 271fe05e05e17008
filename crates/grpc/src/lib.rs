//! Retrying gRPC calls made with tonic, as gRPC's own retry design (gRFC A6)
//! specifies.
//!
//! - [`GrpcPolicy`] classifies gRPC outcomes: retryable status codes
//!   (`UNAVAILABLE` by default), trailers-only responses at once, calls
//!   committed once response headers arrive, `grpc-retry-pushback-ms`,
//!   `grpc-previous-rpc-attempts`, and the transparent retry of calls that
//!   never left the client.
//! - [`ReplayLayer`] makes tonic's streaming request bodies replayable up to
//!   a per-call limit; past it a call is committed. [`TonicBodyLayer`] hands
//!   the channel its own body type back.
//! - [`ServiceConfig`] parses a service config's `methodConfig[].retryPolicy`,
//!   `methodConfig[].hedgingPolicy` and `retryThrottling`, with A6's
//!   validation; [`GrpcRetryLayer`] applies it to a channel, each method with
//!   its own settings.
//! - [`RetryThrottle`] is A6's retry throttling, as a [`Budget`](tower_backoff_core::Budget)
//!   any layer can use.
//!
//! # A tonic client configured by a service config
//! ```no_run
//! # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tonic::transport::Channel;
//! use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
//! use tower_backoff::grpc::{GrpcRetryLayer, ServiceConfig};
//!
//! let config = ServiceConfig::from_json(r#"{
//!   "methodConfig": [{
//!     "name": [{ "service": "grpc.health.v1.Health" }],
//!     "retryPolicy": {
//!       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
//!     }
//!   }],
//!   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
//! }"#)?;
//!
//! let channel = Channel::from_static("http://127.0.0.1:50051").connect().await?;
//! let channel = tower::ServiceBuilder::new()
//!     .layer(GrpcRetryLayer::new(&config)?)
//!     .service(channel);
//! let mut client = HealthClient::new(channel);
//! let reply = client.check(HealthCheckRequest { service: String::new() }).await?;
//! println!("{:?}", reply.into_inner().status());
//! # Ok(())
//! # }
//! ```
//!
//! # Where this differs from gRPC's own clients
//! - A6's throttling is exact when the policy counts it
//!   ([`GrpcPolicy::throttle`], which [`GrpcRetryLayer`] uses). A
//!   [`RetryThrottle`] given to any layer as its budget counts only the
//!   failures the layer asks it about, those that could still be retried: a
//!   retryable failure of a call's last allowed attempt, and a pushback that
//!   says not to retry, are not counted there (A6 counts both; grpcio, the
//!   C core, counts a pushback not to retry only on a retryable code).
//! - A committed call (headers received, so never retried) is counted for
//!   A6's `retryThrottling` by its trailers ([`GrpcBody`]): `OK` adds
//!   `tokenRatio`, a retryable status takes a token, as A6 counts every
//!   failed call. Only a [`GrpcPolicy::throttle`] behind a plain layer,
//!   which never sees trailers, counts it a success as its headers arrive;
//!   so does any other budget (the default one, or one given with
//!   [`GrpcRetryBuilder::budget`]), whatever status the trailers bring.
//! - The call's deadline is its `grpc-timeout` ([`parse_grpc_timeout`]),
//!   read once as the call starts: no retry or hedge starts whose backoff
//!   would end past it, and each carries the time left. A call whose next
//!   retry would end past its deadline ends at once with the last real
//!   status, where gRPC's own clients wait until the deadline and say
//!   `DEADLINE_EXCEEDED`: the crate never returns an outcome it made up,
//!   and a caller told "unavailable" early can act on it. An attempt still
//!   running at the deadline is cut there by tonic's channel (whose status
//!   for that is `CANCELLED`), and nothing is retried once the deadline has
//!   passed. A malformed `grpc-timeout` is ignored and passed on as is.
//! - Hedging ([`HedgingConfig`]) is capped in extra load: in any second, a
//!   hedged method sends at most a share of its calls of that second as
//!   hedges (10 % by default, [`GrpcRetryBuilder::hedge_load_cap`]), each
//!   call counting itself: at 1.0 an isolated call gets one hedge, never its
//!   third copy, even after a non-fatal failure of its second while the
//!   first is pending; at 0.1 it gets none. A6 has no such cap; it keeps
//!   hedging from doubling the load on a server that is slow for everyone.
//! - A valid pushback on a hedge stops the further hedges of the copies
//!   still pending, where A6 sends the next one after the pushback: one copy
//!   fewer, never more. An invalid pushback ends the call with that copy's
//!   status at once, cancelling the copies still pending.
//! - There is a per-call replay limit, no per-channel one.
//!
//! `tests/grpc_interop.rs` makes 48 scenarios' calls through this layer and
//! through grpcio's retrying channel against one scripted server, and
//! checks that each difference is one listed above (docs/RESULTS.md has
//! the table).

mod code;
mod committed;
mod duration;
mod error;
mod hedging_config;
#[cfg(all(test, tower_backoff_loom))]
mod loom;
mod policy;
mod pushback;
mod replay;
mod retry;
mod retry_config;
mod service_config;
mod throttle;
mod timeout;

pub use code::CodeSet;
pub use committed::GrpcBody;
pub use error::{classify_transport_error, TransportFailure};
pub use hedging_config::HedgingConfig;
pub use policy::GrpcPolicy;
pub use pushback::{parse_pushback, Pushback};
pub use replay::{Replay, ReplayLayer, TonicBody, TonicBodyLayer};
pub use retry::{GrpcResponseFuture, GrpcRetry, GrpcRetryBuilder, GrpcRetryLayer};
pub use retry_config::RetryConfig;
pub use service_config::{RetryThrottling, ServiceConfig};
pub use throttle::RetryThrottle;
pub use timeout::parse_grpc_timeout;

// Defaults, limits and header names the docs state where they apply; out of
// the public docs, kept for tests and power users.
#[doc(hidden)]
pub use policy::{DEFAULT_MAX_PUSHBACK, PREVIOUS_RPC_ATTEMPTS};
#[doc(hidden)]
pub use pushback::RETRY_PUSHBACK_MS;
#[doc(hidden)]
pub use timeout::GRPC_TIMEOUT;
// Named by `GrpcResponseFuture`, never by a user.
#[doc(hidden)]
pub use committed::Committed;
#[doc(hidden)]
pub use retry_config::{MAX_ATTEMPTS_LIMIT, RETRY_CONFIG_JITTER};
