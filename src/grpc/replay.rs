//! Replayable request bodies for clients whose body type is not `Clone`:
//! [`ReplayLayer`] records request bodies before the retry layer, and
//! [`TonicBodyLayer`] hands the client the body type it takes after it.

use std::error::Error;
use std::task::{Context, Poll};

use ::http::Request;
use bytes::Bytes;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::http::{ReplayBody, DEFAULT_REPLAY_LIMIT};

type BoxError = Box<dyn Error + Send + Sync>;

/// Wraps every request body in a [`ReplayBody`] recording up to a limit, so
/// a retry layer inside it can send the request again.
///
/// Nothing about it is gRPC's: it serves any client whose body is a stream.
/// The recording keeps the chunks the client sent (reference-counted
/// `Bytes`, not copies) and only until the last copy of the request is
/// dropped. A body that outgrows the limit is sent once: its call is
/// *committed* (gRFC A6) and its outcome returned as is.
///
/// Put it outside the retry layer, and inside that, something that turns
/// `ReplayBody<B>` into the client's own body type ([`TonicBodyLayer`] for
/// tonic):
///
/// ```
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
#[derive(Debug, Clone, Copy)]
pub struct ReplayLayer {
    limit: usize,
}

impl ReplayLayer {
    /// Records up to [`DEFAULT_REPLAY_LIMIT`] bytes of each request body.
    pub const fn new() -> Self {
        Self::with_limit(DEFAULT_REPLAY_LIMIT)
    }

    /// Records up to `limit` bytes of each request body: gRFC A6's per-call
    /// buffer limit.
    pub const fn with_limit(limit: usize) -> Self {
        Self { limit }
    }
}

impl Default for ReplayLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for ReplayLayer {
    type Service = Replay<S>;

    fn layer(&self, inner: S) -> Replay<S> {
        Replay {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`ReplayLayer`].
#[derive(Debug, Clone)]
pub struct Replay<S> {
    inner: S,
    limit: usize,
}

impl<S> Replay<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for Replay<S>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        let limit = self.limit;
        self.inner
            .call(request.map(|body| ReplayBody::with_limit(body, limit)))
    }
}

/// Turns request bodies into `tonic::body::Body`, the body tonic's
/// `Channel` takes; the inside half of [`ReplayLayer`].
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
