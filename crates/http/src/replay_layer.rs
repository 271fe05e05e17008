//! [`ReplayLayer`]: records every request body, up to a limit, so a retry
//! layer inside it can send the request again.

use std::task::{Context, Poll};

use ::http::Request;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::replay::{ReplayBody, DEFAULT_REPLAY_LIMIT};

/// Wraps every request body in a [`ReplayBody`] recording up to a limit, so
/// a retry layer inside it can send the request again.
///
/// It serves any client whose request body is a stream: hyper-util's client
/// (`http::Request<B>` becomes `http::Request<ReplayBody<B>>`), tonic's
/// `Channel` (with `tower_backoff::grpc::TonicBodyLayer` inside the
/// retry layer) and, with the `reqwest` feature, `reqwest::Client` (with
/// `parts::IntoReqwestLayer` inside the retry layer).
/// The recording keeps the chunks the client sent (reference-counted
/// `Bytes`, not copies) and only until the last copy of the request is
/// dropped. A body that outgrows the limit is sent once: its call is
/// *committed* (gRFC A6) and its outcome returned as is.
///
/// Put it outside the retry layer:
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use bytes::Bytes;
/// use http_body_util::combinators::BoxBody;
/// use hyper_util::{client::legacy::Client, rt::TokioExecutor};
/// use tower::ServiceBuilder;
/// use tower_backoff::http::{HttpPolicy, ReplayBody};
/// use tower_backoff::http::parts::ReplayLayer;
/// use tower_backoff::BackoffLayer;
///
/// type Upload = BoxBody<Bytes, std::io::Error>;
/// let client = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Upload>>();
/// let svc = ServiceBuilder::new()
///     .layer(ReplayLayer::with_limit(16 * 1024))
///     .layer(BackoffLayer::builder().policy(HttpPolicy::new()).build().unwrap())
///     .service(client);
/// # drop(svc);
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
    pub(super) inner: S,
    pub(super) limit: usize,
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
