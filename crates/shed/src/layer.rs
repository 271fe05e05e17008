//! [`ShedLayer`] and its [`ShedBuilder`]: the limiter and the answers, set
//! once and shared by every service the layer wraps.

use std::time::Duration;

use http::StatusCode;
use tower_backoff_core::error::ConfigError;
use tower_layer::Layer;

use crate::events::ShedObserver;
use crate::limiter::{Limiter, LimiterBuilder};
use crate::Shed;

/// gRPC's `RESOURCE_EXHAUSTED`.
#[doc(hidden)]
pub const RESOURCE_EXHAUSTED: u16 = 8;
/// gRPC's `UNAVAILABLE`.
#[doc(hidden)]
pub const UNAVAILABLE: u16 = 14;

/// Wraps a server's service in [`Shed`]: every request is admitted or
/// rejected at once by one shared [`Limiter`].
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod shed { pub use tower_backoff_shed::*; } }
/// use tower_backoff::shed::ShedLayer;
///
/// let layer = ShedLayer::builder().status(http::StatusCode::TOO_MANY_REQUESTS).build()?;
/// # drop(layer);
/// # Ok::<(), tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ShedLayer {
    pub(crate) limiter: Limiter,
    pub(crate) answers: Answers,
}

/// How rejections are answered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answers {
    pub(crate) status: StatusCode,
    pub(crate) grpc_retry: u16,
    pub(crate) grpc_stop: u16,
    pub(crate) trust_criticality: bool,
}

impl ShedLayer {
    /// A builder with the defaults: the [`Limiter`]'s, 503 for HTTP,
    /// `UNAVAILABLE` with pushback for gRPC and `RESOURCE_EXHAUSTED` with a
    /// negative pushback when it should not retry.
    pub fn builder() -> ShedBuilder {
        ShedBuilder::default()
    }

    /// The layer's limiter, shared by every service it wraps.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed::new(inner, self.limiter.clone(), self.answers)
    }
}

/// Builds a [`ShedLayer`]; settings are checked at [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct ShedBuilder {
    limiter: LimiterBuilder,
    shared: Option<Limiter>,
    status: StatusCode,
    grpc_retry: u16,
    grpc_stop: u16,
    trust_criticality: bool,
}

impl Default for ShedBuilder {
    fn default() -> Self {
        Self {
            limiter: LimiterBuilder::default(),
            shared: None,
            status: StatusCode::SERVICE_UNAVAILABLE,
            grpc_retry: UNAVAILABLE,
            grpc_stop: RESOURCE_EXHAUSTED,
            trust_criticality: true,
        }
    }
}

impl ShedBuilder {
    /// The HTTP status of a rejection: 503 (default), or 429 where a 5xx
    /// would invite a proxy or a queue to redeliver. Any 4xx or 5xx.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The gRPC code of a rejection that invites a retry (default 14,
    /// `UNAVAILABLE`, which gRPC clients retry by default) and of one that
    /// says not to (default 8, `RESOURCE_EXHAUSTED`).
    pub fn grpc_codes(mut self, retry: u16, stop: u16) -> Self {
        self.grpc_retry = retry;
        self.grpc_stop = stop;
        self
    }

    /// Whether a request's `x-criticality` header ranks it (default
    /// `true`). Any client can send it: a server open to clients it does
    /// not trust should turn it off (every request is then `default`, one
    /// level lower when it is a retry), or set the header itself at a
    /// proxy it trusts.
    pub fn trust_criticality(mut self, trust: bool) -> Self {
        self.trust_criticality = trust;
        self
    }

    /// Sets the limiter's settings ([`Limiter::builder`]).
    pub fn limiter(mut self, limiter: LimiterBuilder) -> Self {
        self.limiter = limiter;
        self
    }

    /// Uses a limiter already built, shared with other layers (an HTTP and a
    /// gRPC router of one process).
    pub fn shared_limiter(mut self, limiter: Limiter) -> Self {
        self.shared = Some(limiter);
        self
    }

    /// The longest queueing time retries are invited for
    /// ([`LimiterBuilder::max_drain`]).
    pub fn max_drain(mut self, max: Duration) -> Self {
        self.limiter = self.limiter.max_drain(max);
        self
    }

    /// Tells `observer` of every admission, rejection and change of limit.
    pub fn observer(mut self, observer: impl ShedObserver) -> Self {
        self.limiter = self.limiter.observer(observer);
        self
    }

    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that cannot work.
    pub fn build(self) -> Result<ShedLayer, ConfigError> {
        if !(self.status.is_client_error() || self.status.is_server_error()) {
            return Err(ConfigError::new(
                "status",
                format!("must be a 4xx or 5xx status, got {}", self.status),
            ));
        }
        for code in [self.grpc_retry, self.grpc_stop] {
            if !(1..=16).contains(&code) {
                return Err(ConfigError::new(
                    "grpc_codes",
                    format!("must be gRPC error codes (1 to 16), got {code}"),
                ));
            }
        }
        let limiter = match self.shared {
            Some(limiter) => limiter,
            None => self.limiter.build()?,
        };
        Ok(ShedLayer {
            limiter,
            answers: Answers {
                status: self.status,
                grpc_retry: self.grpc_retry,
                grpc_stop: self.grpc_stop,
                trust_criticality: self.trust_criticality,
            },
        })
    }
}
