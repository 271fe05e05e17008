//! Reads response bodies ahead, up to a limit, so the retry policy can
//! classify a response on its body and retry one that breaks off.
//!
//! The details are on [`BufferBody`].

mod body;
mod collect;
mod future;
mod layer;
#[cfg(feature = "reqwest")]
mod reqwest;

use std::task::{Context, Poll};

use ::http::{Extensions, Request, Response};
use bytes::Bytes;
use http_body::Body;
use tower::BoxError;
use tower_service::Service;

use collect::ReadAhead;

pub use body::BufferedBody;
pub use future::BufferBodyFuture;
pub use layer::BufferBodyLayer;
#[cfg(feature = "reqwest")]
pub use reqwest::BufferReqwestFuture;

/// Default most bytes of a response body [`BufferBody`](crate::parts::BufferBody) reads ahead: 64 KiB,
/// as [`DEFAULT_REPLAY_LIMIT`](super::DEFAULT_REPLAY_LIMIT) for requests.
/// Error pages and the JSON of most APIs fit; downloads do not, and pass
/// through.
#[doc(hidden)]
pub const DEFAULT_BUFFER_LIMIT: usize = 64 * 1024;

/// Reads each response body of the inner service ahead, up to a limit,
/// before handing the response on, so the retry policy can classify a
/// response on its body and retry one that breaks off.
///
/// Serves `http::Request`s (hyper-util's client, any tower HTTP client) and,
/// with the `reqwest` feature, `reqwest::Request`s (`reqwest::Client`).
///
/// A retry layer decides when the response headers arrive. Two outcomes look
/// like successes then: a `200` (or `503`) whose body says the service's
/// queue is full, and a body that stops after 100 of its 1,000 bytes because
/// the connection closed. Placed *inside* the
/// [`BackoffLayer`](tower_backoff_core::BackoffLayer) (with reqwest, right around
/// `reqwest::Client`), `BufferBody` reads every response body before handing
/// the response on:
///
/// | The body | The attempt's outcome | Classified by |
/// |---|---|---|
/// | ends within the limit (default [`DEFAULT_BUFFER_LIMIT`], 64 KiB) | the response, its body in memory ([`BufferedBody`]) | status, headers, and the bytes ([`HttpPolicy::retry_on_body`](super::HttpPolicy::retry_on_body)) |
/// | fails within the limit (closed early, `content-length` not met, reset; an HTTP/2 stream reset) | the body's error, as the body gave it | the error classifier: closed early and reset are transient (an HTTP/2 reset with the `http2` feature) |
/// | is longer than the limit | the response, its body the bytes read then the rest of the stream | status and headers only |
///
/// So a request that may be repeated is retried when its body breaks off,
/// and the caller gets the response of a later attempt that came whole, or
/// the last real error when none did: never a response whose body fails
/// after the retries were over.
///
/// # What changes for the caller
/// - With `http::Request`s (hyper-util's client), the response body becomes
///   a [`BufferedBody<B>`], which serves the same bytes and trailers, and the
///   error becomes [`tower::BoxError`]: the inner service's error or the
///   body's, boxed as is (`downcast_ref::<hyper::Error>()` finds it).
/// - With `reqwest::Client` (feature `reqwest`), nothing: the response is
///   still a `reqwest::Response` (its URL, extensions and remote address
///   kept) and the error still `reqwest::Error`. A body past the limit is
///   reqwest's own stream, whose errors reach the caller wrapped once more in
///   a `reqwest::Error` (the original is its `source()`).
///
/// # What it costs
/// Nothing for services without it. With it, every response's body up to
/// the limit is held in memory before the caller sees the response, so the
/// caller sees it when the body has arrived rather than when the headers
/// have. A body read to its end gives its connection back to the pool at
/// once: the retry layer keeps an attempt's outcome while it sleeps before
/// the retry (it decides at the response and commits when the retry is sent),
/// and a buffered response kept that way holds memory, not a connection.
///
/// Reading the body is part of the attempt, so the layer's
/// [`attempt_timeout`](tower_backoff_core::BackoffBuilder::attempt_timeout) (or a
/// `tower::timeout` placed *outside* `BufferBody`) bounds a server that
/// trickles it.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower::BoxError> {
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_backoff::http::{HttpPolicy, HttpRetryLayer, RetryInfo};
/// use tower_backoff::http::parts::BufferBodyLayer;
/// use tower_backoff::{BackoffLayer, Cause};
///
/// // Stands in for an HTTP client: a full queue once, then the answer.
/// let calls = AtomicU32::new(0);
/// let client = service_fn(|_: Request<String>| {
///     let full = calls.fetch_add(1, Ordering::Relaxed) == 0;
///     let body = if full { "error: queue capacity exceeded" } else { "done" };
///     async move { Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::from(body)))) }
/// });
///
/// let policy = HttpPolicy::new().retry_on_body(|_status, _headers, body| {
///     body.windows(14).any(|w| w == b"queue capacity").then_some(Cause::Throttled)
/// });
/// let svc = ServiceBuilder::new()
///     .layer(HttpRetryLayer::from(BackoffLayer::builder().policy(policy).build()?))
///     .layer(BufferBodyLayer::new())
///     .service(client);
///
/// let response = svc.oneshot(Request::get("http://localhost/").body(String::new())?).await?;
/// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts, 2);
/// assert_eq!(response.into_body().collect().await?.to_bytes(), "done");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct BufferBody<S> {
    inner: S,
    read_ahead: ReadAhead,
}

impl<S> BufferBody<S> {
    /// Buffers bodies of up to [`DEFAULT_BUFFER_LIMIT`] bytes.
    pub const fn new(inner: S) -> Self {
        Self::with_limit(inner, DEFAULT_BUFFER_LIMIT)
    }

    /// Buffers bodies of up to `limit` bytes; see
    /// [`BufferBodyLayer::limit`] for what every value means.
    pub const fn with_limit(inner: S, limit: usize) -> Self {
        Self {
            inner,
            read_ahead: ReadAhead {
                limit,
                known_length_only: false,
            },
        }
    }

    /// Reads ahead only a body whose `content-length` is within the limit;
    /// one without a length (chunked, an event stream) or longer is handed
    /// on untouched, as it arrives.
    pub const fn known_length_only(mut self) -> Self {
        self.read_ahead.known_length_only = true;
        self
    }

    /// The most bytes buffered.
    pub const fn limit(&self) -> usize {
        self.read_ahead.limit
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for BufferBody<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = Response<BufferedBody<B>>;
    type Error = BoxError;
    type Future = BufferBodyFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        BufferBodyFuture::new(self.inner.call(request), self.read_ahead)
    }
}

/// A whole body's bytes, in its response's extensions, for
/// [`HttpPolicy`](super::HttpPolicy) to classify: the policy is generic over
/// response bodies, and reqwest's response hides its body's type.
#[derive(Clone)]
pub(crate) struct BufferedBytes(Bytes);

impl BufferedBytes {
    /// Records `body`'s bytes when it was read whole.
    fn record<B>(extensions: &mut Extensions, body: &BufferedBody<B>) {
        if let Some(bytes) = body.bytes() {
            Self::record_bytes(extensions, bytes.clone());
        }
    }

    /// Records the bytes of a body read whole.
    fn record_bytes(extensions: &mut Extensions, bytes: Bytes) {
        extensions.insert(Self(bytes));
    }

    /// Whether the response with these extensions was read whole, and so
    /// has already given its connection back: nothing left to drain.
    pub(crate) fn is_in(extensions: &Extensions) -> bool {
        extensions.get::<Self>().is_some()
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}
