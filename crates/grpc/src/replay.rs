//! Replayable request bodies for tonic: [`ReplayLayer`] (from
//! `tower_backoff::http`, re-exported here) records request bodies before the retry
//! layer, and [`TonicBodyLayer`] hands the channel the body type it takes
//! after it.

use std::error::Error;
use std::task::{Context, Poll};

use ::http::Request;
use bytes::Bytes;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

pub use tower_backoff_http::parts::{Replay, ReplayLayer};

type BoxError = Box<dyn Error + Send + Sync>;

/// Turns request bodies into `tonic::body::Body`, the body tonic's
/// `Channel` takes; the inside half of [`ReplayLayer`].
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower::ServiceBuilder;
/// use tower_backoff::grpc::{GrpcPolicy, ReplayLayer, TonicBodyLayer};
/// use tower_backoff::BackoffLayer;
///
/// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// let svc = ServiceBuilder::new()
///     .layer(ReplayLayer::with_limit(16 * 1024))
///     .layer(BackoffLayer::builder().policy(GrpcPolicy::new()).build()?)
///     .layer(TonicBodyLayer)
///     .service(channel);
/// let client = tonic::client::Grpc::new(svc);
/// # drop(client);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TonicBodyLayer;

impl<S> Layer<S> for TonicBodyLayer {
    type Service = TonicBody<S>;

    fn layer(&self, inner: S) -> TonicBody<S> {
        TonicBody { inner }
    }
}

/// The service of [`TonicBodyLayer`].
#[derive(Debug, Clone)]
pub struct TonicBody<S> {
    inner: S,
}

impl<S> TonicBody<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for TonicBody<S>
where
    S: Service<Request<tonic::body::Body>>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        self.inner.call(request.map(tonic::body::Body::new))
    }
}
