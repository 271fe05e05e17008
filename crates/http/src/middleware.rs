//! [`BackoffMiddleware`]: a [`BackoffLayer`]'s retries as a
//! `reqwest_middleware::Middleware`, for clients built with
//! `reqwest_middleware::ClientBuilder`.

use std::error::Error;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use ::http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tower_layer::Layer;
use tower_service::Service;

use super::buffer::BufferBody;
use super::error::AsStdError;
use super::per_host::{HostLayers, RequestAuthority};
use super::policy::HttpPolicy;
use super::recorded::RecordedRequest;
use super::replay::DEFAULT_REPLAY_LIMIT;
use super::retry_layer::{HttpResponseFuture, HttpRetryLayer, DEFAULT_RESPONSE_BUFFER_LIMIT};
use tower_backoff_core::deadline::{AttemptTimer, Guarded, NoTimeout};
use tower_backoff_core::policy::{Policy, RetryLimits};
use tower_backoff_core::BackoffLayer;

/// Retries requests sent through a `reqwest_middleware::ClientWithMiddleware`
/// with everything a [`BackoffLayer`] has: its policy, schedule and jitter,
/// its attempt and time limits, its budget and pacing. Built from the layer,
/// so it is configured the same way, and shares that layer's budget and
/// pacing (with every clone of it, and every other service it wraps): one
/// budget for every request the client sends. Made from an
/// [`HttpRetryLayer`](super::HttpRetryLayer) that keeps its
/// [circuit breaker per host](super::HttpRetryLayer::breaker_per_host), it
/// keeps it per host too, in the same table of hosts: each request goes
/// through its URL's host's layer (scheme, host and port), with that host's
/// breaker, budget and pacing, so a dead host's breaker never rejects a
/// request to a healthy one.
///
/// It does what an [`HttpRetryLayer`](super::HttpRetryLayer) does, and is
/// made from one with `BackoffMiddleware::from(layer)`: request bodies are
/// recorded (up to [`DEFAULT_REPLAY_LIMIT`] for a stream; a body already in
/// memory whatever its size), so a streaming upload is retried while it
/// fits, and a response whose `content-length` is within the buffer limit
/// is read whole before it is judged, so a body cut short is retried. The
/// limit is the layer's when made from an `HttpRetryLayer` (which reads
/// nothing ahead unless asked, see
/// [`HttpRetryBuilder::buffer_limit`](super::HttpRetryBuilder::buffer_limit)),
/// and [`DEFAULT_RESPONSE_BUFFER_LIMIT`] with [`new`](Self::new).
/// A [`RetryLimits`] given to the request with reqwest-middleware's
/// `with_extension` overrides the layer's limits for that request. The
/// middlewares added after this one run once per attempt; those added before
/// it, once per request. Every attempt, a hedge included, sees the request's
/// extensions as the caller gave them plus what the attempts that ended
/// before it wrote; the caller gets back those of the attempt whose outcome
/// it gets, and keeps its own when none ended.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::Duration;
/// use reqwest_middleware::ClientBuilder;
/// use tower_backoff::http::{BackoffMiddleware, HttpRetryLayer};
/// use tower_backoff::Exponential;
///
/// let layer = HttpRetryLayer::builder()
///     .schedule(Exponential::new(Duration::from_millis(100)))
///     .max_attempts(4)
///     .on_retry(|retry, _| eprintln!("retrying after attempt {}", retry.attempt()))
///     .build()
///     .unwrap();
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(BackoffMiddleware::from(layer))
///     .build();
/// // client.get(url).send().await, as before.
/// # drop(client);
/// ```
#[derive(Clone)]
pub struct BackoffMiddleware<P = HttpPolicy, T = NoTimeout> {
    layer: BackoffLayer<P, T>,
    /// Each host's layer, shared with the `HttpRetryLayer` it was made
    /// from, when that keeps its breaker per host.
    hosts: Option<Arc<HostLayers<BackoffLayer<P, T>>>>,
    replay_limit: usize,
    buffer_limit: usize,
    record_info: bool,
}

impl<P, T> BackoffMiddleware<P, T> {
    /// Retries as `layer` does, sharing its budget and pacing.
    pub fn new(layer: BackoffLayer<P, T>) -> Self {
        Self {
            layer,
            hosts: None,
            replay_limit: DEFAULT_REPLAY_LIMIT,
            buffer_limit: DEFAULT_RESPONSE_BUFFER_LIMIT,
            record_info: true,
        }
    }

    /// Reads whole a response body whose `content-length` is at most
    /// `bytes` (default [`DEFAULT_RESPONSE_BUFFER_LIMIT`]); others stream
    /// through.
    pub fn buffer_limit(mut self, bytes: usize) -> Self {
        self.buffer_limit = bytes;
        self
    }

    /// Stops adding [`RetryInfo`](super::RetryInfo) to responses (see
    /// [`HttpRetryLayer::without_retry_info`](super::HttpRetryLayer::without_retry_info)).
    pub fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// Records up to `limit` bytes of a streaming body (default
    /// [`DEFAULT_REPLAY_LIMIT`]); a larger one is sent once and its outcome
    /// returned as is.
    pub fn replay_limit(mut self, limit: usize) -> Self {
        self.replay_limit = limit;
        self
    }

    /// The layer whose settings it applies. With the breaker kept per
    /// host, that of the first host called; every other host has a
    /// [fresh](BackoffLayer::fresh) copy.
    pub fn layer(&self) -> &BackoffLayer<P, T> {
        &self.layer
    }
}

impl<P, T> From<BackoffLayer<P, T>> for BackoffMiddleware<P, T> {
    fn from(layer: BackoffLayer<P, T>) -> Self {
        Self::new(layer)
    }
}

/// The same retries, limits and settings as the layer, as a middleware; its
/// breaker, if kept per host, kept in the layer's own table of hosts.
impl From<HttpRetryLayer> for BackoffMiddleware<HttpPolicy, Guarded> {
    fn from(layer: HttpRetryLayer) -> Self {
        let buffer_limit = layer.read_ahead_limit();
        Self {
            layer: layer.layer,
            hosts: layer.hosts,
            replay_limit: layer.replay_limit,
            buffer_limit,
            record_info: layer.record_info,
        }
    }
}

impl<P, T: fmt::Debug> fmt::Debug for BackoffMiddleware<P, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffMiddleware")
            .field("layer", &self.layer)
            .field("breaker_per_host", &self.hosts.is_some())
            .field("replay_limit", &self.replay_limit)
            .field("buffer_limit", &self.buffer_limit)
            .field("record_info", &self.record_info)
            .finish()
    }
}

#[async_trait::async_trait]
impl<P, T> Middleware for BackoffMiddleware<P, T>
where
    P: Policy<RecordedRequest, reqwest::Response, T::Error> + Clone + Send + Sync + 'static,
    T: AttemptTimer<reqwest_middleware::Error> + Send + Sync + 'static,
    T::Timer: Send,
    T::Error: IntoMiddlewareError + Send,
    // The compiler cannot see through `T` that the future is `Send` when
    // the request's attempts are, so it is asked of each timing where used.
    for<'a> HttpResponseFuture<BufferBody<NextService<'a>>, RecordedRequest, T, P>: Send,
{
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let host;
        let layer = match &self.hosts {
            Some(hosts) => {
                host = hosts.get(
                    request.authority(),
                    BackoffLayer::with_host,
                    BackoffLayer::for_host,
                );
                &host
            }
            None => &self.layer,
        };
        let request = RecordedRequest::record(request, self.replay_limit);
        let limits = extensions.get::<RetryLimits>().copied();
        let ended = Mutex::new(None);
        let result = {
            let next = NextService {
                next,
                caller: extensions,
                ended: &ended,
            };
            let mut svc =
                layer.layer(BufferBody::with_limit(next, self.buffer_limit).known_length_only());
            match poll_fn(|cx| svc.poll_ready(cx)).await {
                Ok(()) => {
                    let call = match limits {
                        Some(limits) => svc.call_with_limits(request, limits),
                        None => svc.call(request),
                    };
                    HttpResponseFuture::new(call, self.record_info).await
                }
                Err(error) => Err(error),
            }
        };
        if let Some(ended) = ended.into_inner().unwrap_or_else(PoisonError::into_inner) {
            *extensions = ended;
        }
        result.map_err(IntoMiddlewareError::into_middleware_error)
    }
}

/// The rest of the middleware chain, and then the client, as the service
/// the retry layer wraps: each attempt runs it once.
///
/// Each attempt runs with a copy of the request's extensions as the last
/// attempt to end left them (the caller's, before any has): a hedge runs
/// beside the copy it hedges, so the two cannot share one. An attempt that
/// ends, with a response or an error, leaves its copy for the next attempt
/// and for the caller; one cancelled (a hedge that lost, an attempt timed
/// out) leaves nothing. The engine returns the outcome of the last attempt
/// to end (or an error of its own, a timeout or an open breaker, which ends
/// no attempt), so the caller gets the extensions of the attempt whose
/// outcome it gets.
#[derive(Clone)]
struct NextService<'a> {
    next: Next<'a>,
    caller: &'a Extensions,
    ended: &'a Mutex<Option<Extensions>>,
}

impl NextService<'_> {
    /// A copy of the extensions as the last attempt to end left them.
    fn extensions(&self) -> Extensions {
        let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        ended.as_ref().unwrap_or(self.caller).clone()
    }
}

impl<'a> Service<reqwest::Request> for NextService<'a> {
    type Response = reqwest::Response;
    type Error = reqwest_middleware::Error;
    type Future = Pin<Box<dyn Future<Output = Result<reqwest::Response, Self::Error>> + Send + 'a>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: reqwest::Request) -> Self::Future {
        let next = self.next.clone();
        let ended = self.ended;
        let mut extensions = self.extensions();
        Box::pin(async move {
            let result = next.run(request, &mut extensions).await;
            *ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(extensions);
            result
        })
    }
}

/// The policy reads the error reqwest-middleware wraps: reqwest's own, or the
/// one a middleware returned.
impl AsStdError for reqwest_middleware::Error {
    fn as_std_error(&self) -> &(dyn Error + 'static) {
        match self {
            reqwest_middleware::Error::Reqwest(error) => error,
            reqwest_middleware::Error::Middleware(error) => error.as_ref(),
        }
    }
}

/// The error a [`BackoffMiddleware`] returns to the chain: the layer's error
/// as a `reqwest_middleware::Error`. Implemented for the error of a layer
/// without attempt timeouts (the middleware's own) and with them or a circuit
/// breaker, where a timed-out last attempt or a rejected request becomes a
/// middleware error.
pub trait IntoMiddlewareError {
    /// This error as the chain returns it.
    fn into_middleware_error(self) -> reqwest_middleware::Error;
}

impl IntoMiddlewareError for reqwest_middleware::Error {
    fn into_middleware_error(self) -> reqwest_middleware::Error {
        self
    }
}

impl IntoMiddlewareError for tower_backoff_core::Error<reqwest_middleware::Error> {
    fn into_middleware_error(self) -> reqwest_middleware::Error {
        match self {
            tower_backoff_core::Error::Inner(error) => error,
            // The layer's own errors, as themselves, so that a caller can
            // downcast to `TimedOut` or `BreakerOpen`.
            tower_backoff_core::Error::TimedOut(timed_out) => {
                reqwest_middleware::Error::middleware(timed_out)
            }
            tower_backoff_core::Error::Open(open) => reqwest_middleware::Error::middleware(open),
            other => reqwest_middleware::Error::middleware(other),
        }
    }
}
